//! Shadow mode through the real Envoy: a shadow-mode rule over its limit never makes Envoy
//! refuse a request, and floodgate counts what it would have refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// A shadow-mode rule of 2 an hour: Envoy admits all 5 requests and counts them ok, while
/// floodgate counts the 3 it would have refused.
#[tokio::test]
async fn a_shadow_rule_never_makes_envoy_refuse() {
    let server = TestServer::start(LIMITS).await;
    let envoy = Envoy::start(&Bootstrap::rls(
        &[server.grpc_addr],
        ratelimit_filter("edge"),
        "- actions: [{remote_address: {}}]",
    ))
    .await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(envoy.get("/", &[]).await.status);
    }
    assert_eq!(statuses, [200; 5]);
    assert_eq!(envoy.ratelimit_stat("ok").await, 5);
    assert_eq!(envoy.ratelimit_stat("over_limit").await, 0);
    assert_eq!(
        server.metric(
            r#"floodgate_rule_shadow_mode_total{domain="edge",rule="edge.remote_address"}"#
        ),
        3
    );
    drop(envoy);
    server.stop().await;
}
