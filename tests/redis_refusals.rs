//! Redis states that answer some commands but refuse what every request needs, against the
//! real binary and a real `redis-server`: `maxmemory` under `noeviction`, an ACL user without
//! access to the key prefix, and `EVALSHA` renamed away. Each is an outage: the failure policy
//! answers, the breaker stays open (the probe writes, as requests do), health tells the truth,
//! and the log says so in a few lines that carry no request data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::http::{call, metric};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::*;
use tonic::transport::Channel;

const LIMITS: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// A request value that must never appear in a log line.
const SECRET: &str = "secret-user-value-4711";

fn start(url: &str, policy: &str) -> (Floodgate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--redis-url",
        url,
        "--on-store-error",
        policy,
        "--redis-timeout-ms",
        "200",
    ]);
    (server, dir)
}

async fn client(grpc: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap()
}

async fn ask(client: &mut RateLimitServiceClient<Channel>) -> Result<i32, tonic::Code> {
    client
        .should_rate_limit(simple("d", "user", SECRET))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|status| status.code())
}

async fn health(http: SocketAddr) -> u16 {
    call(http, "GET", "/healthcheck", None).await.status
}

/// Health stays `expected` over `checks` looks 100 ms apart (no flapping).
async fn health_stays(http: SocketAddr, expected: u16, checks: usize) {
    for i in 0..checks {
        assert_eq!(health(http).await, expected, "check {i}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGTERM, exit 0; the log.
async fn stop(server: Floodgate) -> String {
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    log
}

/// Warning lines, and none carries the request value.
fn warnings(log: &str) -> usize {
    assert!(!log.contains(SECRET), "request data in the log:\n{log}");
    log.lines().filter(|l| l.contains("WARN")).count()
}

/// Redis at `maxmemory` under `noeviction`: requests are UNAVAILABLE, the breaker opens and
/// stays open (the probe's write is refused too), `/healthcheck` says 503 throughout; memory
/// freed, everything recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_is_an_outage_health_reports() {
    let redis = RedisServer::start();
    let (server, _dir) = start(&redis.url(), "error");
    let mut client = client(server.grpc).await;
    eventually("Redis in use", || async {
        ask(&mut client.clone()).await == Ok(Code::Ok as i32)
    })
    .await;
    redis
        .command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await;
    redis.command(&["CONFIG", "SET", "maxmemory", "1"]).await;
    for _ in 0..50 {
        assert_eq!(ask(&mut client).await, Err(tonic::Code::Unavailable));
    }
    eventually("health 503", || async { health(server.http).await == 503 }).await;
    health_stays(server.http, 503, 20).await;
    assert_eq!(
        metric(server.http, "floodgate_store_available").await,
        Some(0.0)
    );
    redis.command(&["CONFIG", "SET", "maxmemory", "0"]).await;
    eventually("health 200 again", || async {
        health(server.http).await == 200
    })
    .await;
    assert_eq!(ask(&mut client).await, Ok(Code::Ok as i32));
    let log = stop(server).await;
    assert!(warnings(&log) <= 3, "{log}");
}

/// An ACL user that may not touch the key prefix (NOPERM) is an outage, not a request
/// defect: under `allow` requests are answered OK by the policy and health stays 200 (it is
/// serving); under `error` they are UNAVAILABLE and health turns 503 and stays there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_refusal_is_an_outage_under_every_policy() {
    let redis = RedisServer::start();
    redis
        .command(&["ACL", "SETUSER", "fg", "on", ">pw", "~other:*", "+@all"])
        .await;
    let url = redis.url().replacen("redis://", "redis://fg:pw@", 1);

    let (allow, _dir) = start(&url, "allow");
    let mut to_allow = client(allow.grpc).await;
    for _ in 0..20 {
        assert_eq!(ask(&mut to_allow).await, Ok(Code::Ok as i32));
    }
    eventually("breaker open", || async {
        metric(allow.http, "floodgate_store_available").await == Some(0.0)
    })
    .await;
    assert!(
        metric(
            allow.http,
            "floodgate_store_degraded_total{policy=\"allow\"}"
        )
        .await
        .unwrap_or(0.0)
            >= 1.0
    );
    health_stays(allow.http, 200, 5).await;

    let (error, _dir) = start(&url, "error");
    let mut to_error = client(error.grpc).await;
    for _ in 0..20 {
        assert_eq!(ask(&mut to_error).await, Err(tonic::Code::Unavailable));
    }
    eventually("health 503", || async { health(error.http).await == 503 }).await;
    health_stays(error.http, 503, 10).await;
    for server in [allow, error] {
        let log = stop(server).await;
        assert!(warnings(&log) <= 3, "{log}");
    }
}

/// `EVALSHA` renamed away: every request is UNAVAILABLE, health turns 503, and 300 failed
/// requests cost at most a few warning lines, none of them with a bucket key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_evalsha_is_an_outage_logged_without_request_data() {
    let redis = RedisServer::start_args(&["--rename-command", "EVALSHA", ""]);
    let (server, _dir) = start(&redis.url(), "error");
    let mut client = client(server.grpc).await;
    for _ in 0..300 {
        assert_eq!(ask(&mut client).await, Err(tonic::Code::Unavailable));
    }
    eventually("health 503", || async { health(server.http).await == 503 }).await;
    health_stays(server.http, 503, 10).await;
    let log = stop(server).await;
    assert!(warnings(&log) <= 3, "{log}");
}

/// A Redis password holding URL syntax (`/`, `?`, `#`) never reaches the exit-64 error line
/// or the log.
#[test]
fn password_with_url_syntax_is_redacted_in_the_exit_line() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    for (url, secret) in [
        ("redis://:pa/ss?wd@127.0.0.1:1", "ss?wd"),
        ("redis://u:p?w/x@127.0.0.1:1/0", "p?w/x"),
        ("redis://:se#cret@127.0.0.1:1", "se#cret"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(["serve", "--config", limits.to_str().unwrap()])
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--redis-url", url])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(64), "{url}");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(all.contains("***"), "{all}");
        assert!(!all.contains(secret), "{url}: {all}");
    }
}
