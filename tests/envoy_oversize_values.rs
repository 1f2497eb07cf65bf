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

/// Per-IP, per-key and per-IP-and-key descriptors: the key's value goes into two of them.
const KEY_TWICE: &str = "
- actions: [{remote_address: {}}]
- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
- actions:
    - remote_address: {}
    - request_headers: {header_name: x-api-key, descriptor_key: api_key}
";

/// The same client once over its per-IP limit stays over it whatever its `x-api-key` holds:
/// bytes that are not UTF-8 (Envoy passes header bytes as they come), or 40,000 bytes, which
/// Envoy's default header limit (60 KiB) lets through and which, sent in two descriptors,
/// make a request larger than floodgate's default gRPC message cap (64 KiB). Each gets 429
/// and Envoy counts no RLS error.
#[tokio::test]
async fn any_header_value_is_still_limited() {
    let server = TestServer::start(LIMITS).await;
    let bootstrap = Bootstrap::rls(&[server.grpc_addr], ratelimit_filter("edge"), KEY_TWICE);
    let envoy = Envoy::start(&bootstrap).await;
    for _ in 0..3 {
        assert_eq!(envoy.get("/", &[]).await.status, 200);
    }
    let long = "k".repeat(40_000);
    let not_utf8: &[u8] = b"caf\xe9-\xff";
    let mut seen = Vec::new();
    for (what, value) in [("not UTF-8", not_utf8), ("40,000 bytes", long.as_bytes())] {
        let response = envoy.get_bytes("/", &[("x-api-key", value)]).await;
        seen.push((what, response.status));
    }
    assert_eq!(seen, [("not UTF-8", 429), ("40,000 bytes", 429)]);
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    drop(envoy);
    server.stop().await;
}
