//! Graceful shutdown: the drain period (health NOT_SERVING, every call still answered, a
//! second signal ends it), then in-flight requests finish, new connections are refused,
//! requests held by `max_wait` are never admitted early, clean exit. (The binary under load
//! on Redis, SIGTERM included: tests/faults.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::clock::ManualClock;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::telemetry::metrics::Metrics;
use support::held::HeldStore;
use support::*;

const LIMITS: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// A request in flight when shutdown begins is answered; new connections are refused meanwhile.
#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let store = HeldStore::every_call(Arc::new(ManualClock::new(START_US)));
    let mut server = TestServer::with(LIMITS)
        .store(store.clone(), Arc::new(Metrics::new()))
        .start()
        .await;
    let grpc_addr = server.grpc_addr;
    let mut client = server.client().await;
    let in_flight =
        tokio::spawn(async move { client.should_rate_limit(simple("d", "k", "v")).await });
    store.arrived().await;

    server.begin_stop();
    // The listener closes while the request is still held inside the store.
    let deadline = Instant::now() + support::EVENTUALLY;
    while tokio::net::TcpStream::connect(grpc_addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting connections");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !in_flight.is_finished(),
        "the held request cannot have finished"
    );

    store.release(1);
    let response = in_flight
        .await
        .unwrap()
        .expect("in-flight request answered");
    assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    server.join().await;
}

/// A limit every test here can ask: 1000 a second, far from reached.
const PLAIN: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";

/// `yaml` written as the only limits file of a temporary directory.
fn limits_dir(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), yaml).unwrap();
    dir
}

/// A gRPC channel to `grpc`, connected now (a new connection).
async fn connect(grpc: std::net::SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// `grpc.health.v1` for the server (`""`) and the rate-limit service on `channel`.
async fn health_on(channel: &tonic::transport::Channel) -> [i32; 2] {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut client = HealthClient::new(channel.clone());
    let mut statuses = [0; 2];
    for (status, service) in statuses
        .iter_mut()
        .zip(["", "envoy.service.ratelimit.v3.RateLimitService"])
    {
        *status = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
    }
    statuses
}

/// ShouldRateLimit's overall code for `d`/`k=v` on `channel`; panics on an RPC error.
async fn ask_on(channel: &tonic::transport::Channel) -> i32 {
    use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
    RateLimitServiceClient::new(channel.clone())
        .should_rate_limit(simple("d", "k", "v"))
        .await
        .expect("answered during the drain")
        .into_inner()
        .overall_code
}

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// After SIGTERM, health reports NOT_SERVING (gRPC and `/healthcheck`) while every call is
/// still answered, on a connection from before and on one opened after; a second signal
/// ends the drain early and the process exits 0.
#[tokio::test]
async fn sigterm_reports_not_serving_while_every_call_is_answered() {
    let dir = limits_dir(PLAIN);
    // Far longer than the test: only the second signal can end it.
    let server = process::Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--drain-period",
        "600",
    ]);
    let (grpc, http) = (server.grpc, server.http);
    let old = connect(grpc).await;
    assert_eq!(health_on(&old).await, [SERVING, SERVING]);
    assert_eq!(ask_on(&old).await, Code::Ok as i32);

    server.sigterm();
    eventually("health reports NOT_SERVING", || async {
        health_on(&old).await == [NOT_SERVING, NOT_SERVING]
    })
    .await;
    assert_eq!(ask_on(&old).await, Code::Ok as i32);
    let new = connect(grpc).await;
    assert_eq!(health_on(&new).await, [NOT_SERVING, NOT_SERVING]);
    assert_eq!(ask_on(&new).await, Code::Ok as i32);
    assert_eq!(
        support::http::call(http, "GET", "/healthcheck", None)
            .await
            .status,
        503
    );
    assert_eq!(ask_on(&old).await, Code::Ok as i32);

    server.signal("INT");
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("drain period cut short"), "{log}");
    assert!(std::net::TcpStream::connect(grpc).is_err());
}

/// Once the drain period is over the port closes and the process exits 0, not before.
#[tokio::test]
async fn the_drain_period_ends_with_the_port_closed_and_exit_zero() {
    let dir = limits_dir(PLAIN);
    let server = process::Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--drain-period",
        "1",
    ]);
    let grpc = server.grpc;
    let channel = connect(grpc).await;
    assert_eq!(ask_on(&channel).await, Code::Ok as i32);
    let signalled = Instant::now();
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    let lasted = signalled.elapsed();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("drain period over"), "{log}");
    // A lower bound only: the drain is waited out, however fast the machine.
    assert!(
        lasted >= Duration::from_secs(1),
        "exited {lasted:?} after SIGTERM"
    );
    assert!(std::net::TcpStream::connect(grpc).is_err());
}

/// 10 a second with a burst of 1, a request held up to 4.5 s for its token.
const SHAPED: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, burst: 1, max_wait: 4500ms}\n";

/// Requests a `max_wait` limit holds at SIGTERM are never admitted before their turn: those
/// whose turn comes before the connections are cut are served then, the others are given
/// back and refused (OVER_LIMIT); every one is answered, and the process exits 0.
#[tokio::test]
async fn held_requests_at_sigterm_are_never_admitted_early() {
    const SENT: usize = 45;
    let dir = limits_dir(SHAPED);
    let server = process::Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--drain-period",
        "0.2",
        "--shutdown-grace",
        "0.5",
    ]);
    let (grpc, http) = (server.grpc, server.http);
    let channel = connect(grpc).await;
    let started = Instant::now();
    let calls: Vec<_> = (0..SENT)
        .map(|_| {
            let channel = channel.clone();
            tokio::spawn(async move {
                use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
                let answer = RateLimitServiceClient::new(channel)
                    .should_rate_limit(simple("d", "k", "v"))
                    .await;
                (started.elapsed(), answer)
            })
        })
        .collect();
    // Every request but the first is held for its token (one each 100 ms): SIGTERM once all
    // have arrived (held, or admitted already: a slow scrape may come after a few turns).
    // Admitted read first: a request admitted between the two reads is then counted in
    // neither, never in both.
    eventually("the requests are held", || async {
        let admitted = support::http::metric(http, r#"floodgate_requests_total{result="ok"}"#);
        let admitted = admitted.await.unwrap_or(0.0);
        let held = support::http::metric(http, "floodgate_requests_in_flight").await;
        held.unwrap_or(0.0) + admitted >= SENT as f64
    })
    .await;
    server.sigterm();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for call in calls {
        let (at, answer) = call.await.unwrap();
        let answer = answer.expect("every held request is answered").into_inner();
        match Code::try_from(answer.overall_code) {
            Ok(Code::Ok) => admitted.push(at),
            Ok(Code::OverLimit) => refused += 1,
            other => panic!("{other:?}: {answer:?}"),
        }
    }
    admitted.sort();
    // The n-th admission needs the n-th token: 100 ms each after the first, counted from
    // before the first request was sent (a lower bound; 20 ms for timer rounding).
    for (n, at) in admitted.iter().enumerate() {
        let turn = Duration::from_millis(100) * n as u32;
        assert!(
            *at + Duration::from_millis(20) >= turn,
            "admission {n} at {at:?}, before its token at {turn:?}: {admitted:?}"
        );
    }
    assert!(
        refused > 0,
        "the last turns come after the cut: {admitted:?}"
    );
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}
