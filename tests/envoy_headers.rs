//! The x-ratelimit headers the real Envoy builds from floodgate's answers agree with each
//! other: what remains never exceeds the quota the limit header states, and the reset never
//! lies past the window it states (two windows for a sliding window, whose estimate weighs a
//! hit for up to two periods).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, Response, ratelimit_filter};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: plan
    value: burst
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 50}
  - key: plan
    value: five-minutes
    rate_limit: {unit: minute, requests_per_unit: 3, unit_multiplier: 5}
  - key: plan
    value: sliding
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
"#;

const RATE_LIMITS: &str = "
- actions: [{request_headers: {header_name: x-plan, descriptor_key: plan}}]
";

/// The quota, the windows (seconds) and the reset of a response's x-ratelimit headers
/// (draft 03: `x-ratelimit-limit: 10, 10;w=60`).
fn stated(response: &Response) -> (u64, Vec<u64>, u64, u64) {
    let header = |name: &str| {
        response
            .header(name)
            .unwrap_or_else(|| panic!("no {name}: {response:?}"))
            .to_string()
    };
    let limit = header("x-ratelimit-limit");
    let quota = limit.split(',').next().unwrap().trim().parse().unwrap();
    let windows = limit
        .split(';')
        .filter_map(|part| part.trim().strip_prefix("w="))
        .map(|w| w.split(',').next().unwrap().trim().parse().unwrap())
        .collect();
    let remaining = header("x-ratelimit-remaining").parse().unwrap();
    let reset = header("x-ratelimit-reset").parse().unwrap();
    (quota, windows, remaining, reset)
}

/// For a token bucket of 10/min with burst 50, and for 3 per 5 minutes (`unit_multiplier:
/// 5`), every response Envoy sends, admitted or refused, states a remaining count no larger
/// than its quota and a reset no later than its window.
#[tokio::test]
async fn remaining_and_reset_agree_with_the_stated_limit() {
    agree(&[("burst", 3), ("five-minutes", 4)], 1).await;
}

/// For a sliding window of 5 a minute, the remaining count stays within the quota and the
/// reset within two windows: its estimate weighs a hit for up to two periods, so a shorter
/// reset would tell a client its quota is back before it is (docs/algorithms.md).
#[tokio::test]
async fn a_sliding_windows_reset_stays_within_two_windows() {
    agree(&[("sliding", 2)], 2).await;
}

/// Sends `requests` requests of each plan through Envoy and checks each response's headers
/// agree with each other: remaining within the quota, reset within `periods` of the stated
/// window.
async fn agree(plans: &[(&str, u32)], periods: u64) {
    let server = TestServer::start(LIMITS).await;
    let envoy = Envoy::start(&Bootstrap::rls(
        &[server.grpc_addr],
        ratelimit_filter("edge"),
        RATE_LIMITS,
    ))
    .await;
    for &(plan, requests) in plans {
        for n in 1..=requests {
            let response = envoy.get("/", &[("x-plan", plan)]).await;
            let (quota, windows, remaining, reset) = stated(&response);
            let what = format!("{plan} request {n}: {:?}", response.headers);
            assert!(remaining <= quota, "remaining above the quota: {what}");
            assert!(!windows.is_empty(), "no window: {what}");
            let window = windows.iter().max().unwrap();
            assert!(reset <= periods * window, "reset too far: {what}");
        }
    }
    drop(envoy);
    server.stop().await;
}

/// For a plain limit of 5 a minute (burst = rate), every algorithm's headers through Envoy
/// state the limit and its minute and the remaining count after each request, with a reset
/// to come (its bounds: `remaining_and_reset_agree_with_the_stated_limit` and
/// `a_sliding_windows_reset_stays_within_two_windows`).
#[tokio::test]
async fn headers_per_algorithm() {
    let limits = r#"
domain: edge
descriptors:
  - key: algorithm
    value: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}
  - key: algorithm
    value: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: algorithm
    value: sliding_window
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
"#;
    let server = TestServer::start(limits).await;
    let envoy = Envoy::start(&Bootstrap::rls(
        &[server.grpc_addr],
        ratelimit_filter("edge"),
        "- actions: [{request_headers: {header_name: x-algorithm, descriptor_key: algorithm}}]",
    ))
    .await;
    for algorithm in ["token_bucket", "fixed_window", "sliding_window"] {
        for remaining in [4, 3, 2] {
            let response = envoy.get("/", &[("x-algorithm", algorithm)]).await;
            let what = format!("{algorithm}: {:?}", response.headers);
            assert_eq!(response.status, 200, "{what}");
            assert_eq!(
                response.header("x-ratelimit-limit"),
                Some("5, 5;w=60"),
                "{what}"
            );
            let (_, _, left, reset) = stated(&response);
            assert_eq!(left, remaining, "{what}");
            assert!(reset >= 1, "{what}");
        }
    }
    drop(envoy);
    server.stop().await;
}
