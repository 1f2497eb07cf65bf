//! floodgate behind the real Envoy (HTTP rate-limit filter): Envoy admits exactly what the
//! limit allows, on the memory store and with two replicas on Redis, and its filter counts
//! every answer as ok or over_limit, none as an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};
use support::http::metric;
use support::process::Floodgate;
use support::redis::RedisServer;

const PER_IP: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

/// On the memory store a per-IP limit of 3/min admits exactly 3 of 5 requests through
/// Envoy, which answers the other 2 with 429 and counts 3 ok, 2 over_limit, 0 errors.
#[tokio::test]
async fn memory_store_admits_exactly_the_limit() {
    let server = TestServer::start(PER_IP).await;
    let bootstrap = Bootstrap::rls(
        &[server.grpc_addr],
        ratelimit_filter("edge"),
        "- actions: [{remote_address: {}}]",
    );
    let envoy = Envoy::start(&bootstrap).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(envoy.get("/", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(envoy.ratelimit_stat("ok").await, 3);
    assert_eq!(envoy.ratelimit_stat("over_limit").await, 2);
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    drop(envoy);
    server.stop().await;
}

/// Two replicas on one Redis behind one Envoy (round robin) count as one: 5 an hour per IP
/// admits exactly 5 of 8 requests, with both replicas answering and no RLS error.
#[tokio::test]
async fn two_replicas_on_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(
        &limits,
        "domain: edge\ndescriptors:\n  - key: remote_address\n    \
         rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .unwrap();
    let redis_url = redis.url();
    let args = [
        "--config",
        limits.to_str().unwrap(),
        "--redis-url",
        &redis_url,
        // Counts under test, not the 10 ms Redis deadline or the 250 ms connect timeout on a
        // loaded test machine.
        "--redis-timeout-ms",
        "1000",
        "--redis-connect-timeout-ms",
        "2000",
    ];
    let replicas = [Floodgate::start(&args), Floodgate::start(&args)];
    let bootstrap = Bootstrap::rls(
        &[replicas[0].grpc, replicas[1].grpc],
        ratelimit_filter("edge"),
        "- actions: [{remote_address: {}}]",
    );
    let envoy = Envoy::start(&bootstrap).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(envoy.get("/", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    for replica in &replicas {
        let answered = metric(replica.http, r#"floodgate_requests_total{result="ok"}"#).await;
        assert!(answered.unwrap_or(0.0) > 0.0, "a replica got no request");
    }
    drop(envoy);
    for replica in replicas {
        replica.stop().await;
    }
}
