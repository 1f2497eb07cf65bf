//! A descriptor value past floodgate's size cap, sent by the real Envoy, is still limited:
//! Envoy never sees an RLS error it would fail open on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};

/// The shipped edge limits in small: 3 a minute per client IP, and a per-API-key limit.
const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// deploy/envoy/envoy.yaml's per-client and per-API-key descriptors.
const RATE_LIMITS: &str = "
- actions: [{remote_address: {}}]
- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
";

/// A client that used up its 3/min per-IP limit and then sends a 5,000-byte `x-api-key`
/// (past the 4096-byte value cap) five times gets 429 each time, with `failure_mode_deny`
/// false: Envoy counts no RLS error and fails nothing open.
#[tokio::test]
async fn a_long_header_value_is_still_limited() {
    let server = TestServer::start(LIMITS).await;
    let filter = ratelimit_filter("edge");
    assert_eq!(filter["failure_mode_deny"], false);
    let envoy = Envoy::start(&Bootstrap::rls(&[server.grpc_addr], filter, RATE_LIMITS)).await;
    for _ in 0..3 {
        assert_eq!(envoy.get("/", &[]).await.status, 200);
    }
    assert_eq!(envoy.get("/", &[]).await.status, 429);
    let long = "k".repeat(5000);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(envoy.get("/", &[("x-api-key", &long)]).await.status);
    }
    assert_eq!(
        statuses, [429; 5],
        "a long x-api-key escaped the per-IP limit"
    );
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    assert_eq!(envoy.ratelimit_stat("failure_mode_allowed").await, 0);
    assert_eq!(envoy.ratelimit_stat("over_limit").await, 6);
    drop(envoy);
    server.stop().await;
}
