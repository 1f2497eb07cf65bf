//! Faults under concurrent load, against the real `floodgate` binary and a real redis-server:
//! Redis killed and restarted, Redis made slow, SIGTERM, and limits churn.
//!
//! Each test runs worker tasks that loop ShouldRateLimit (tests/support/load.rs), records
//! every outcome with when it was sent, and judges each request by the phase it was sent in.
//! Waits poll for what a client can observe (health, `/metrics`, answers) with a deadline;
//! nothing sleeps to synchronise and no assertion is about wall-clock time. Latencies and
//! recovery times are printed as one `RELIABILITY {json}` line per scenario, which
//! scripts/reliability.sh turns into the table of docs/reliability.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use support::configmap::{invalid, limits, replace};
use support::http::metric;
use support::load::{Load, Outcome, latency_ms, ms, report, within};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::volume::Volume;
use support::*;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const OK: i32 = 1;
const OVER: i32 = 2;

/// Concurrent workers per test: enough to keep requests in flight through every transition.
const WORKERS: usize = 8;

/// How long a transition may take to show before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);

const LIMITS: &str = r#"
domain: f
descriptors:
  - key: load
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: kept
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: five
    rate_limit: {unit: hour, requests_per_unit: 5}
"#;

/// The limits directory every fault test serves.
fn limits_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    dir
}

/// Worker `w`'s `i`-th request: one of four keys per worker, never over its limit.
fn load_request(w: usize, i: u64) -> RateLimitRequest {
    simple("f", "load", &format!("w{w}-{}", i % 4))
}

/// `floodgate serve` on `limits` with Redis at `redis` and `args`.
fn floodgate(limits: &Path, redis: &RedisServer, args: &[&str]) -> Floodgate {
    let url = redis.url();
    let mut all = vec!["--config", limits.to_str().unwrap(), "--redis-url", &url];
    all.extend_from_slice(args);
    Floodgate::start(&all)
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// SIGTERM, exit 0, and a log free of panics; returns the log.
async fn stop(server: Floodgate) -> String {
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    log
}

/// Log lines announcing the breaker opening and closing.
const OPENED: &str = "circuit open";
const CLOSED: &str = "circuit closed";

/// Waits until Redis is in use: the breaker closed. (At start-up, before any call succeeded,
/// the first slow pool connections can open it for a probe interval.) Also until the log
/// says so, if it opened: a test counts the transition lines from here, and a closing line
/// still on its way through the log reader would be taken for the next one.
async fn until_redis_in_use(server: &Floodgate) {
    eventually("Redis in use", || async {
        metric(server.http, "floodgate_store_available").await == Some(1.0)
            && server.log_count(OPENED) == server.log_count(CLOSED)
    })
    .await;
}

/// Waits for one more `transition` log line than `before`; returns when it was seen.
async fn logged(server: &Floodgate, transition: &str, before: usize) -> Instant {
    eventually(transition, || async {
        server.log_count(transition) > before
    })
    .await;
    Instant::now()
}

/// Counts outcomes by result, for failure messages and reports.
fn tally<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for o in outcomes {
        let key = match o.result {
            Ok(OK) => "OK".to_string(),
            Ok(OVER) => "OVER_LIMIT".to_string(),
            Ok(code) => format!("code {code}"),
            Err(code) => format!("{code:?}"),
        };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// `remaining` of a check-only request (debits nothing) on `key=v`.
async fn remaining(client: &mut RateLimitServiceClient<Channel>, key: &str) -> u32 {
    let check = request("f", vec![with_hits(descriptor(&[(key, "v")]), 0)]);
    let response = client.should_rate_limit(check).await.unwrap().into_inner();
    response.statuses[0].limit_remaining
}

/// redis-server is SIGKILLed under load and restarted on the same port, with policy `error`:
/// every request sent during the outage gets UNAVAILABLE, health goes NOT_SERVING and back,
/// answers are normal again after the restart, and a bucket Redis had persisted (appendonly,
/// fsync always) keeps exactly its remaining count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_policy_error() {
    let data = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        data.path().to_str().unwrap(),
    ]);
    let dir = limits_dir();
    // A generous deadline: on a loaded test machine, a 10 ms one (or even 1 s) would fail
    // requests before the crash too; a killed Redis refuses connections at once, so the
    // deadline does not slow the outage down (the slow-Redis tests run a short one).
    // No leases: this test counts what Redis itself persisted, and a lease holds tokens
    // debited in Redis but not yet spent (a check-only request sees them as taken).
    let server = floodgate(
        dir.path(),
        &redis,
        &[
            "--on-store-error",
            "error",
            "--redis-timeout-ms",
            "5000",
            // After the restart each thread's pool opens its connection while the load
            // runs: more than the 250 ms default on a loaded machine would fail a request.
            "--redis-connect-timeout-ms",
            "2000",
            "--lease-fraction",
            "0",
        ],
    );
    let mut probe = client(server.grpc).await;
    for _ in 0..10 {
        let response = probe.should_rate_limit(simple("f", "kept", "v")).await;
        assert_eq!(response.unwrap().into_inner().overall_code, OK);
    }
    let kept = remaining(&mut probe, "kept").await;
    assert_eq!(kept, 990);

    let load = Load::start(server.grpc, WORKERS, load_request).await;
    load.until_answered(200).await;
    until_redis_in_use(&server).await;
    let (opens, closes) = (server.log_count(OPENED), server.log_count(CLOSED));
    let killing = Instant::now();
    redis.stop();
    let killed = Instant::now();
    let opened = logged(&server, OPENED, opens).await;
    eventually("health NOT_SERVING", || async {
        health(server.grpc).await == ServingStatus::NotServing as i32
    })
    .await;
    load.until_answered(200).await;
    let restarting = Instant::now();
    redis.restart();
    let ready = Instant::now();
    logged(&server, CLOSED, closes).await;
    eventually("health SERVING after the restart", || async {
        health(server.grpc).await == ServingStatus::Serving as i32
    })
    .await;
    let serving = Instant::now();
    load.until_answered(200).await;
    let outcomes = load.finish().await;

    let before = within(&outcomes, outcomes[0].started, killing);
    assert!(before.iter().all(|o| o.is_ok()), "{:?}", tally(before));
    let outage = within(&outcomes, killed, restarting);
    assert!(!outage.is_empty());
    assert!(
        outage
            .iter()
            .all(|o| o.result == Err(tonic::Code::Unavailable)),
        "during the outage: {:?}",
        tally(outage.iter().copied())
    );
    let after = within(&outcomes, serving, Instant::now());
    assert!(!after.is_empty());
    assert!(after.iter().all(|o| o.is_ok()), "{:?}", tally(after));
    // Nothing but the policy's answer, ever.
    let foreign: Vec<_> = outcomes
        .iter()
        .filter(|o| !o.is_ok() && o.result != Err(tonic::Code::Unavailable))
        .collect();
    assert!(foreign.is_empty(), "{:?}", tally(foreign));
    let recovered = outcomes
        .iter()
        .find(|o| o.started >= ready && o.is_ok())
        .expect("an answer after the restart");
    assert_eq!(
        remaining(&mut probe, "kept").await,
        kept,
        "the persisted bucket"
    );

    stop(server).await;
    let (p99, max) = latency_ms(outage.iter().copied());
    report(json!({
        "scenario": "redis SIGKILL + restart (AOF fsync always), policy error",
        "normal_p99_ms": latency_ms(before.iter().copied()).0,
        "requests": outcomes.len(),
        "degraded": outage.len(),
        "failures": 0,
        "answer": "UNAVAILABLE while down; health NOT_SERVING",
        "degraded_p99_ms": p99,
        "degraded_max_ms": max,
        "breaker_open_ms": ms(killed, opened),
        "recovery_ms": ms(ready, recovered.ended()),
        "note": format!("persisted bucket kept remaining {kept}; health SERVING {} ms after restart", ms(ready, serving)),
    }));
}

/// redis-server is SIGKILLed under load with policy `local`: no request fails, limits are
/// enforced in memory meanwhile, and Redis is the store again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_policy_local() {
    let mut redis = RedisServer::start();
    let dir = limits_dir();
    let server = floodgate(
        dir.path(),
        &redis,
        &["--on-store-error", "local", "--redis-timeout-ms", "1000"],
    );
    let http = server.http;
    let mut probe = client(server.grpc).await;
    let load = Load::start(server.grpc, WORKERS, load_request).await;
    load.until_answered(200).await;
    until_redis_in_use(&server).await;
    let (opens, closes) = (server.log_count(OPENED), server.log_count(CLOSED));
    redis.stop();
    let killed = Instant::now();
    let opened = logged(&server, OPENED, opens).await;
    // Enforced from memory: 5 per hour.
    for n in 0..6 {
        let response = probe.should_rate_limit(simple("f", "five", "v")).await;
        let expected = if n < 5 { OK } else { OVER };
        assert_eq!(response.unwrap().into_inner().overall_code, expected, "{n}");
    }
    load.until_answered(200).await;
    let restarting = Instant::now();
    redis.restart();
    let ready = Instant::now();
    let closed = logged(&server, CLOSED, closes).await;
    // Redis (restarted empty) answers again, not the memory bucket that is spent.
    let response = probe.should_rate_limit(simple("f", "five", "v")).await;
    let response = response.unwrap().into_inner();
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 4);
    load.until_answered(200).await;
    let degraded = metric(http, r#"floodgate_store_degraded_total{policy="local"}"#).await;
    let outcomes = load.finish().await;

    assert!(degraded.unwrap_or(0.0) > 0.0);
    let failed: Vec<_> = outcomes.iter().filter(|o| !o.is_ok()).collect();
    assert!(failed.is_empty(), "{:?}", tally(failed));
    let outage = within(&outcomes, killed, restarting);
    assert!(!outage.is_empty());
    stop(server).await;
    let (p99, max) = latency_ms(outage.iter().copied());
    report(json!({
        "scenario": "redis SIGKILL + restart, policy local",
        "normal_p99_ms": latency_ms(within(&outcomes, outcomes[0].started, killed)).0,
        "requests": outcomes.len(),
        "degraded": outage.len(),
        "failures": 0,
        "answer": "OK / OVER_LIMIT from in-memory buckets (5/hour enforced while down)",
        "degraded_p99_ms": p99,
        "degraded_max_ms": max,
        "breaker_open_ms": ms(killed, opened),
        "recovery_ms": ms(ready, closed),
        "note": "recovery = restart to the breaker closing (log line, polled every 10 ms)",
    }));
}

/// Redis frozen by `DEBUG SLEEP 3` under load with policy `allow` and a 100 ms deadline (the
/// default 10 ms is too tight for a debug build on a loaded test machine): every request is answered OK (the policy's answer instead of a hang), the
/// breaker opens while Redis sleeps and closes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_by_debug_sleep_policy_allow() {
    let redis = RedisServer::start_args(&["--enable-debug-command", "local"]);
    let dir = limits_dir();
    let server = floodgate(
        dir.path(),
        &redis,
        &["--on-store-error", "allow", "--redis-timeout-ms", "100"],
    );
    let http = server.http;
    let load = Load::start(server.grpc, WORKERS, load_request).await;
    load.until_answered(200).await;
    until_redis_in_use(&server).await;
    let port = redis.port().to_string();
    let opens = server.log_count(OPENED);
    let frozen = Instant::now();
    // redis-cli waits as long as the sleep (a redis-rs connection would time out at 500 ms).
    let sleeper = tokio::task::spawn_blocking(move || {
        let status = std::process::Command::new("redis-cli")
            .args(["-p", &port, "DEBUG", "SLEEP", "3"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli not found: run scripts/install-test-tools.sh");
        assert!(status.success());
        Instant::now()
    });
    let opened = logged(&server, OPENED, opens).await;
    // Redis sleeps for seconds more: any close from now on follows the open just seen.
    let closes = server.log_count(CLOSED);
    let thawed = sleeper.await.unwrap();
    let closed = logged(&server, CLOSED, closes).await;
    load.until_answered(200).await;
    let degraded = metric(http, r#"floodgate_store_degraded_total{policy="allow"}"#).await;
    let outcomes = load.finish().await;

    let failed: Vec<_> = outcomes.iter().filter(|o| !o.is_ok()).collect();
    assert!(failed.is_empty(), "{:?}", tally(failed));
    assert!(degraded.unwrap_or(0.0) > 0.0);
    let slow = within(&outcomes, frozen, thawed);
    stop(server).await;
    let (p99, max) = latency_ms(slow.iter().copied());
    report(json!({
        "scenario": "redis frozen (DEBUG SLEEP 3), policy allow, 100 ms deadline",
        "normal_p99_ms": latency_ms(within(&outcomes, outcomes[0].started, frozen)).0,
        "requests": outcomes.len(),
        "degraded": slow.len(),
        "failures": 0,
        "answer": "OK (policy allow) after the deadline, then at once once the breaker is open",
        "degraded_p99_ms": p99,
        "degraded_max_ms": max,
        "breaker_open_ms": ms(frozen, opened),
        "recovery_ms": ms(thawed, closed),
        "note": "recovery = end of the sleep to the breaker closing",
    }));
}

/// Redis with writes paused (`CLIENT PAUSE … WRITE`, as during `FAILOVER`: `PING` still
/// answers, scripts wait) under load with policy `deny`: no request fails, requests get
/// OVER_LIMIT while the breaker is open (it opens, since the probe runs the script), and
/// answers are normal once writes resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_writes_paused_policy_deny() {
    let redis = RedisServer::start();
    let dir = limits_dir();
    let server = floodgate(
        dir.path(),
        &redis,
        &["--on-store-error", "deny", "--redis-timeout-ms", "100"],
    );
    let load = Load::start(server.grpc, WORKERS, load_request).await;
    load.until_answered(200).await;
    until_redis_in_use(&server).await;
    let opens = server.log_count(OPENED);
    let paused = Instant::now();
    redis.command(&["CLIENT", "PAUSE", "30000", "WRITE"]).await;
    let opened = logged(&server, OPENED, opens).await;
    let closes = server.log_count(CLOSED);
    load.until_answered(200).await;
    let unpausing = Instant::now();
    redis.command(&["CLIENT", "UNPAUSE"]).await;
    let closed = logged(&server, CLOSED, closes).await;
    load.until_answered(200).await;
    let outcomes = load.finish().await;

    let failed: Vec<_> = outcomes.iter().filter(|o| o.result.is_err()).collect();
    assert!(failed.is_empty(), "{:?}", tally(failed));
    let open = within(&outcomes, opened, unpausing);
    assert!(!open.is_empty());
    assert!(
        open.iter().all(|o| o.result == Ok(OVER)),
        "{:?}",
        tally(open.iter().copied())
    );
    let after = within(&outcomes, closed, Instant::now());
    assert!(after.iter().any(|o| o.is_ok()), "{:?}", tally(after));
    stop(server).await;
    let slow = within(&outcomes, paused, unpausing);
    let (p99, max) = latency_ms(slow.iter().copied());
    report(json!({
        "scenario": "redis writes paused (CLIENT PAUSE WRITE), policy deny, 100 ms deadline",
        "normal_p99_ms": latency_ms(within(&outcomes, outcomes[0].started, paused)).0,
        "requests": outcomes.len(),
        "degraded": slow.len(),
        "failures": 0,
        "answer": "OVER_LIMIT (policy deny) after the deadline, then at once once the breaker is open",
        "degraded_p99_ms": p99,
        "degraded_max_ms": max,
        "breaker_open_ms": ms(paused, opened),
        "recovery_ms": ms(unpausing, closed),
        "note": "the probe runs the script: PING answers during a write pause",
    }));
}

/// SIGTERM with a request in flight on every worker's connection (held in Redis by a write
/// pause; the workers hold back for a moment so that every next request is sent after it):
/// new connections are refused at once, every in-flight request completes OK once Redis
/// resumes, requests sent after are refused cleanly, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drains_in_flight_requests() {
    let redis = RedisServer::start();
    let dir = limits_dir();
    let server = floodgate(dir.path(), &redis, &["--redis-timeout-ms", "10000"]);
    let (grpc, http) = (server.grpc, server.http);
    let load = Load::start(grpc, WORKERS, load_request).await;
    load.until_answered(200).await;
    // Every worker's next request is sent after writes are paused, so it is held in Redis.
    load.hold().await;
    redis.command(&["CLIENT", "PAUSE", "30000", "WRITE"]).await;
    let paused = Instant::now();
    load.resume();
    eventually("a request held in flight on every connection", || async {
        load.all_pending_since(paused)
            && metric(http, "floodgate_requests_in_flight").await == Some(WORKERS as f64)
    })
    .await;
    let answered = load.answered();
    let terminating = Instant::now();
    server.sigterm();
    eventually("new connections refused", || async {
        tokio::net::TcpStream::connect(grpc).await.is_err()
    })
    .await;
    assert_eq!(load.answered(), answered, "held requests cannot have ended");
    redis.command(&["CLIENT", "UNPAUSE"]).await;
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    let exited = Instant::now();
    let outcomes = load.finish().await;

    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(!log.contains("grace period over"), "{log}");
    let in_flight: Vec<_> = outcomes
        .iter()
        .filter(|o| o.started < terminating)
        .collect();
    let held = in_flight.iter().filter(|o| o.ended() > terminating).count();
    assert_eq!(held, WORKERS);
    assert!(
        in_flight.iter().all(|o| o.is_ok()),
        "{:?}",
        tally(in_flight.iter().copied())
    );
    let later: Vec<_> = outcomes
        .iter()
        .filter(|o| o.started >= terminating)
        .collect();
    // Refused, never answered: UNAVAILABLE (GOAWAY, or no connection), or CANCELLED for a
    // request whose stream the closing connection reset as the process exited (a rare race,
    // seen in CI); Envoy treats both as a failed call (failure_mode_deny decides).
    assert!(
        later.iter().all(|o| matches!(
            o.result,
            Err(tonic::Code::Unavailable | tonic::Code::Cancelled)
        )),
        "{:?}",
        tally(later.iter().copied())
    );
    let (p99, max) = latency_ms(
        in_flight
            .iter()
            .filter(|o| o.ended() > terminating)
            .copied(),
    );
    report(json!({
        "scenario": "SIGTERM under load, a request in flight on each of 8 connections",
        "normal_p99_ms": null,
        "requests": outcomes.len(),
        "degraded": held,
        "failures": 0,
        "answer": "in-flight requests OK; new connections refused; later requests UNAVAILABLE; exit 0",
        "degraded_p99_ms": p99,
        "degraded_max_ms": max,
        "breaker_open_ms": null,
        "recovery_ms": null,
        "note": format!("{} requests refused after SIGTERM; exit {} ms after SIGTERM (held in Redis until unpaused)", later.len(), ms(terminating, exited)),
    }));
}

/// One churn step.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Replace the plain file `d.yaml` by rename, limit `rpu`.
    Edit(u32),
    /// Replace `d.yaml` by an invalid one.
    Break,
    /// Swap the ConfigMap holding `e.yaml` (the kubelet's `..data` rename), limit `rpu`.
    Swap(u32),
    /// Swap the ConfigMap to an invalid `e.yaml`.
    BreakSwap,
}

/// The limit `domain` answers with on `k=v` (a check-only request), through `client`.
async fn limit_of(client: &mut RateLimitServiceClient<Channel>, domain: &str) -> Option<u32> {
    let check = request(domain, vec![with_hits(descriptor(&[("k", "v")]), 0)]);
    let response = client.should_rate_limit(check).await.unwrap().into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// The limits directory is churned under load — edits, invalid edits, ConfigMap swaps and
/// invalid swaps — on the Redis store: no request fails, every answer carries a limit that
/// was valid, no client ever sees an older limit after a newer one, and after every change
/// the last valid limits are in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_churn_under_load() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.yaml");
    fs::write(&file, limits("d", 100)).unwrap();
    let mut map = Volume::new(dir.path(), &[("e.yaml", &limits("e", 200))]);
    // No request may fail: a deadline no loaded machine reaches (this is about limits, not
    // Redis).
    let server = floodgate(dir.path(), &redis, &["--redis-timeout-ms", "5000"]);
    let http = server.http;
    let mut probe = client(server.grpc).await;

    // A broken file is repaired by the next step (a directory with an invalid file never
    // loads, whatever else changes).
    let steps: Vec<Step> = (1..=24)
        .map(|i| match i % 6 {
            2 if i < 20 => Step::Break,
            4 if i < 20 => Step::BreakSwap,
            5 => Step::Swap(200 + i),
            _ => Step::Edit(100 + i),
        })
        .collect();
    let load = Load::start(server.grpc, WORKERS, |w, i| {
        let domain = if (w as u64 + i).is_multiple_of(2) {
            "d"
        } else {
            "e"
        };
        request(domain, vec![with_hits(descriptor(&[("k", "v")]), 0)])
    })
    .await;
    let loads = || async move {
        let success = metric(http, r#"floodgate_config_loads_total{result="success"}"#).await;
        let error = metric(http, r#"floodgate_config_loads_total{result="error"}"#).await;
        (success.unwrap_or(0.0), error.unwrap_or(0.0))
    };
    let (mut d, mut e) = (100, 200);
    for step in &steps {
        let (_, errors) = loads().await;
        match *step {
            Step::Edit(rpu) => {
                replace(&file, &limits("d", rpu));
                d = rpu;
            }
            Step::Break => replace(&file, &invalid("d")),
            Step::Swap(rpu) => {
                map.update(&[("e.yaml", &limits("e", rpu))]);
                e = rpu;
            }
            Step::BreakSwap => map.update(&[("e.yaml", &invalid("e"))]),
        }
        if matches!(step, Step::Break | Step::BreakSwap) {
            eventually("the invalid limits counted", || async {
                loads().await.1 > errors
            })
            .await;
        }
        // The last valid limits are in force: at once after a failed load, eventually after
        // a good one.
        let mut in_force = (None, None);
        let deadline = Instant::now() + DEADLINE;
        while in_force != (Some(d), Some(e)) {
            assert!(
                Instant::now() < deadline,
                "{step:?}: {in_force:?}, expected ({d}, {e})"
            );
            in_force = (
                limit_of(&mut probe, "d").await,
                limit_of(&mut probe, "e").await,
            );
            if matches!(step, Step::Break | Step::BreakSwap) {
                assert_eq!(in_force, (Some(d), Some(e)), "after {step:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        load.until_answered(20).await;
    }
    let (successes, errors) = loads().await;
    let outcomes = load.finish().await;

    let failed: Vec<_> = outcomes.iter().filter(|o| !o.is_ok()).collect();
    assert!(failed.is_empty(), "{:?}", tally(failed));
    let valid = |limit: u32| (100..=124).contains(&limit) || (200..=224).contains(&limit);
    for worker in 0..WORKERS {
        // Per domain, a worker's limits never go back to an older configuration.
        let mut last: BTreeMap<bool, u32> = BTreeMap::new();
        for o in outcomes.iter().filter(|o| o.worker == worker) {
            let limit = o.limit.expect("every answer carries its limit");
            assert!(valid(limit), "limit {limit} was never valid");
            let previous = last.entry(limit >= 200).or_insert(limit);
            assert!(
                limit >= *previous,
                "worker {worker}: {limit} after {previous}"
            );
            *previous = limit;
        }
    }
    stop(server).await;
    report(json!({
        "scenario": format!("limits churn: {} edits, invalid edits, ConfigMap swaps and invalid swaps", steps.len()),
        "normal_p99_ms": latency_ms(&outcomes).0,
        "requests": outcomes.len(),
        "degraded": errors as u64,
        "failures": 0,
        "answer": "every answer from the last valid limits; invalid loads counted, previous limits kept",
        "degraded_p99_ms": null,
        "degraded_max_ms": null,
        "breaker_open_ms": null,
        "recovery_ms": null,
        "note": format!("{successes} successful and {errors} failed loads (start-up included)"),
    }));
}
