//! floodgate behind the real Envoy (HTTP rate-limit filter): Envoy admits exactly what the
//! limit allows, and its filter counts every answer as ok or over_limit, none as an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};

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
