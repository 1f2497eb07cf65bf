//! Shaping (`max_wait`) behind the real Envoy: a request held within Envoy's rate-limit
//! timeout is admitted when its token arrives; one held past that timeout is Envoy's to
//! decide (an RLS error, failing open), and floodgate refunds it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};

/// One token a second, a bucket of one, held up to 3 s. The test server's clock stands
/// still, so the n-th request in a row is held n − 1 seconds (real time) for its token.
const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1, burst: 1, max_wait: 3s}
"#;

/// An Envoy in front of `server` whose rate-limit filter gives up after `timeout`.
async fn envoy(server: &TestServer, timeout: &str) -> Envoy {
    let mut filter = ratelimit_filter("edge");
    filter["timeout"] = timeout.into();
    Envoy::start(&Bootstrap::rls(
        &[server.grpc_addr],
        filter,
        "- actions: [{remote_address: {}}]",
    ))
    .await
}

/// Within a 5 s timeout, the requests held 0, 1, 2 and 3 s are admitted (each response says
/// how long it was held) and the next, 4 s away, is refused at once.
#[tokio::test]
async fn held_requests_within_the_timeout_are_admitted() {
    let server = TestServer::start(LIMITS).await;
    let envoy = envoy(&server, "5s").await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        let response = envoy.get("/", &[]).await;
        let held = response
            .header("x-ratelimit-delayed-ms")
            .map(|ms| ms.parse::<u64>().unwrap() / 1000);
        seen.push((response.status, held));
    }
    assert_eq!(
        seen,
        [
            (200, None),
            (200, Some(1)),
            (200, Some(2)),
            (200, Some(3)),
            (429, None)
        ]
    );
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    drop(envoy);
    server.stop().await;
}

/// With a 1.8 s timeout, requests that would be held 2 s are given up by Envoy (RLS errors,
/// let through as `failure_mode_deny` is false) and floodgate refunds them: a request through
/// a patient Envoy afterwards is held 2 s, not the 4 s it would be had they kept their
/// tokens (past `max_wait`: refused).
#[tokio::test]
async fn held_past_the_timeout_is_envoys_to_decide() {
    let server = TestServer::start(LIMITS).await;
    // 0.8 s of slack for the request held 1 s (a slow machine's), while a 2 s hold cannot
    // answer before it.
    let hasty = envoy(&server, "1.8s").await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(hasty.get("/", &[]).await.status);
    }
    assert_eq!(statuses, [200; 4]);
    assert_eq!(hasty.ratelimit_stat("ok").await, 2);
    assert_eq!(hasty.ratelimit_stat("error").await, 2);
    assert_eq!(hasty.ratelimit_stat("failure_mode_allowed").await, 2);
    drop(hasty);
    let patient = envoy(&server, "5s").await;
    let response = patient.get("/", &[]).await;
    let held = response
        .header("x-ratelimit-delayed-ms")
        .map(|ms| ms.parse::<u64>().unwrap() / 1000);
    assert_eq!((response.status, held), (200, Some(2)), "{response:?}");
    drop(patient);
    server.stop().await;
}
