//! Response headers, dynamic metadata and the near-limit counter, with exact values for a
//! scripted sequence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::plan::{HeaderOptions, PlanOptions};
use floodgate::proto::rls::RateLimitResponse;
use support::*;

const LIMITS: &str = r#"
domain: web
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: tokens
    rate_limit: {unit: second, requests_per_unit: 4}
"#;

fn headers_on() -> PlanOptions {
    PlanOptions {
        headers: Some(HeaderOptions::default()),
        ..options()
    }
}

fn headers(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `hits` implicit hits (request-level `hits_addend`), all or nothing.
fn client(hits: u32) -> floodgate::proto::rls::RateLimitRequest {
    let mut request = request("web", vec![descriptor(&[("client", "a")])]);
    request.hits_addend = hits;
    request
}

fn metric(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing `{line}` in:\n{text}"
    );
}

/// A fixed-window sequence gives the reference's header values, Retry-After when denied,
/// and its near-limit accounting with hits_addend > 1 (only hits above ⌊10 × 0.8⌋ count).
#[tokio::test]
async fn fixed_window_headers_and_counters() {
    let server = TestServer::with(LIMITS).options(headers_on()).start().await;
    server.advance_ms(20_000); // 40 s left in the minute window.
    // 0 → 7: nothing near. 7 → 9: one hit above 8. 9 → 10: one more. 10 + 3: denied.
    let first = server.ask(client(7)).await;
    assert_eq!(
        headers(&first),
        expect(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "40"),
        ])
    );
    server.ask(client(2)).await;
    let last = server.ask(client(1)).await;
    assert_eq!(
        headers(&last)[1],
        ("RateLimit-Remaining".into(), "0".into())
    );
    server.advance_ms(500);
    let denied = server.ask(client(3)).await;
    assert_eq!(
        headers(&denied),
        expect(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "40"),
            ("Retry-After", "40"),
        ])
    );
    let text = server.metrics.encode();
    for line in [
        r#"floodgate_rule_hits_total{domain="web",rule="web.client"} 13"#,
        r#"floodgate_rule_within_limit_total{domain="web",rule="web.client"} 10"#,
        r#"floodgate_rule_over_limit_total{domain="web",rule="web.client"} 3"#,
        r#"floodgate_rule_near_limit_total{domain="web",rule="web.client"} 2"#,
        r#"floodgate_requests_total{result="ok"} 3"#,
        r#"floodgate_requests_total{result="over_limit"} 1"#,
    ] {
        metric(&text, line);
    }
    server.stop().await;
}

/// A token bucket's Retry-After is the exact time until the next token, rounded up, and
/// the configured names replace the reference's.
#[tokio::test]
async fn token_bucket_retry_after_and_custom_names() {
    let options = PlanOptions {
        headers: Some(HeaderOptions {
            limit: "X-Limit".into(),
            remaining: "X-Remaining".into(),
            reset: "X-Reset".into(),
            ietf: false,
        }),
        ..options()
    };
    let server = TestServer::with(LIMITS).options(options).start().await;
    let tokens = || {
        let mut request = request("web", vec![descriptor(&[("tokens", "t")])]);
        request.hits_addend = 4;
        request
    };
    let full = server.ask(tokens()).await;
    assert_eq!(
        headers(&full),
        expect(&[("X-Limit", "4"), ("X-Remaining", "0"), ("X-Reset", "1")])
    );
    server.advance_ms(100);
    // One token per 250 ms: a single hit could pass in 150 ms, so Retry-After says 1 s.
    let one = request("web", vec![descriptor(&[("tokens", "t")])]);
    let denied = server.ask(one).await;
    assert_eq!(
        headers(&denied),
        expect(&[
            ("X-Limit", "4"),
            ("X-Remaining", "0"),
            ("X-Reset", "1"),
            ("Retry-After", "1"),
        ])
    );
    server.stop().await;
}

/// Without the flag, responses carry no headers and no metadata (the reference's default).
#[tokio::test]
async fn off_by_default() {
    let server = TestServer::start(LIMITS).await;
    let response = server.ask(client(1)).await;
    assert!(response.response_headers_to_add.is_empty());
    assert!(response.dynamic_metadata.is_none());
    server.stop().await;
}
