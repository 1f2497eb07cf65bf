//! A rolling restart behind the real Envoy: two floodgate replicas on one Redis, Envoy's
//! `ratelimit` cluster health-checked as deploy/envoy/envoy.yaml ships it; one replica gets
//! SIGTERM under load and is replaced. Envoy records no RLS error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use support::envoy::{Bootstrap, Envoy, ratelimit_filter};
use support::http::{call, call_with};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::{eventually, eventually_within};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
"#;

/// The most requests the load sends, whatever happens: at its pace (one each 5 ms, a new
/// connection each) the sockets it leaves in TIME_WAIT stay well below the ephemeral ports.
const MAX_REQUESTS: u64 = 20_000;

/// How long a replica may take to drain and exit, and Envoy to see its replacement healthy
/// (the shipped health check runs every 5 s).
const RESTART: Duration = Duration::from_secs(90);

/// The default of `--drain-period` as `floodgate serve --help` states it, if the binary has
/// one: the test harness starts its servers with no drain unless told, and a rolling
/// restart is under test as floodgate ships.
fn default_drain_period() -> Option<String> {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let after = &help[help.find("FLOODGATE_DRAIN_PERIOD")?..];
    let default = &after[after.find("[default: ")? + "[default: ".len()..];
    Some(default[..default.find(']')?].to_string())
}

/// A replica on `grpc` (an address, or port 0) sharing `redis`, with floodgate's default
/// drain period.
fn replica(limits: &str, redis: &RedisServer, grpc: &str) -> Floodgate {
    let redis_url = redis.url();
    let drain = default_drain_period();
    let mut env = vec![("RUST_LOG", "info")];
    if let Some(drain) = &drain {
        env.push(("FLOODGATE_DRAIN_PERIOD", drain.as_str()));
    }
    Floodgate::start_with_env(
        &[
            "--config",
            limits,
            "--redis-url",
            &redis_url,
            // Answers under test, not the 10 ms Redis deadline on a loaded test machine.
            "--redis-timeout-ms",
            "1000",
            "--grpc-addr",
            grpc,
            "--http-addr",
            "127.0.0.1:0",
        ],
        &env,
    )
}

/// Calls a replica has answered, whatever their result.
async fn answered(http: SocketAddr) -> u64 {
    call(http, "GET", "/metrics", None)
        .await
        .body
        .lines()
        .filter(|line| line.starts_with("floodgate_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Restarting one of two replicas (SIGTERM, exit, a new one on its address) while requests
/// run through Envoy costs no RLS error: Envoy's `ratelimit.error` and
/// `failure_mode_allowed` stay 0 and every request is answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_a_replica_costs_no_rls_error() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let limits = limits.to_str().unwrap().to_string();
    let leaving = replica(&limits, &redis, "127.0.0.1:0");
    let staying = replica(&limits, &redis, "127.0.0.1:0");

    let shipped: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy/envoy.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let health_checks = shipped["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "floodgate")
        .unwrap()["health_checks"]
        .clone();
    assert!(
        health_checks.is_array(),
        "no health check in the shipped bootstrap"
    );
    let mut bootstrap = Bootstrap::rls(
        &[leaving.grpc, staying.grpc],
        ratelimit_filter("edge"),
        "- actions: [{remote_address: {}}]",
    );
    bootstrap.cluster("ratelimit")["health_checks"] = health_checks;
    let envoy = Arc::new(Envoy::start(&bootstrap).await);
    eventually("Envoy sees both replicas healthy", || async {
        envoy.stat("cluster.ratelimit.membership_healthy").await == 2
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let front = envoy.front;
    let load = tokio::spawn({
        let (stop, sent) = (stop.clone(), sent.clone());
        async move {
            let mut refused = Vec::new();
            let mut pace = tokio::time::interval(Duration::from_millis(5));
            while !stop.load(Ordering::SeqCst) && sent.load(Ordering::SeqCst) < MAX_REQUESTS {
                pace.tick().await;
                let status = call_with(front, "GET", "/", &[], None).await.status;
                if status != 200 {
                    refused.push(status);
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
            refused
        }
    });
    let sent_by = |n: u64| {
        let sent = sent.clone();
        move || {
            let sent = sent.load(Ordering::SeqCst);
            async move { sent >= n }
        }
    };
    eventually("the load is running", sent_by(50)).await;

    let address = leaving.grpc.to_string();
    leaving.sigterm();
    let (exit, log) =
        tokio::time::timeout(RESTART, tokio::task::spawn_blocking(move || leaving.wait()))
            .await
            .expect("the replica did not exit")
            .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    let replacement = replica(&limits, &redis, &address);
    eventually_within("Envoy sends to the replacement", RESTART, || async {
        envoy.stat("cluster.ratelimit.membership_healthy").await == 2
            && answered(replacement.http).await > 0
    })
    .await;
    let now = sent.load(Ordering::SeqCst);
    eventually("the load runs on after the restart", sent_by(now + 50)).await;
    stop.store(true, Ordering::SeqCst);
    let refused = load.await.unwrap();

    let total = sent.load(Ordering::SeqCst);
    let error = envoy.ratelimit_stat("error").await;
    let allowed = envoy.ratelimit_stat("failure_mode_allowed").await;
    assert_eq!(
        (error, allowed),
        (0, 0),
        "RLS errors over a restart ({total} requests)"
    );
    assert!(refused.is_empty(), "refused: {refused:?}");
    drop(envoy);
    staying.stop().await;
    replacement.stop().await;
}
