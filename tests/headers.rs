//! Response headers, dynamic metadata and the near-limit counter, with exact values for a
//! scripted sequence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::plan::{HeaderOptions, PlanOptions};
use floodgate::proto::rls::RateLimitResponse;
use floodgate::proto::rls::rate_limit_response::Code;
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

const STATED: &str = r#"
domain: agree
descriptors:
  - key: burst
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 50, name: edge}
  - key: fixed
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: sliding_window}
  - key: tokens
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3}
"#;

/// The `x-ratelimit-*` headers Envoy 1.40 builds from a response
/// (`XRateLimitHeaderUtils::populateHeaders` in its HTTP rate-limit filter): the status with
/// the lowest `limit_remaining` among those with a `current_limit` (the first on ties) gives
/// the limit, remaining and reset (its whole seconds); every such status adds
/// `, <requests_per_unit>;w=<its unit in seconds>[;name="<name>"]` to the limit.
/// Returns (limit, remaining, reset, that status's window in seconds).
fn envoy_x_ratelimit(response: &RateLimitResponse) -> (String, u32, i64, u64) {
    let window = |unit: i32| match unit {
        1 => 1,
        2 => 60,
        3 => 3_600,
        4 => 86_400,
        5 => 30 * 86_400,
        6 => 365 * 86_400,
        7 => 7 * 86_400,
        _ => 0,
    };
    let limited: Vec<_> = response
        .statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .collect();
    let mut min = limited[0];
    for status in &limited {
        if status.limit_remaining < min.limit_remaining {
            min = status;
        }
    }
    let current = min.current_limit.as_ref().unwrap();
    let mut limit = current.requests_per_unit.to_string();
    for status in &limited {
        let l = status.current_limit.as_ref().unwrap();
        let w = window(l.unit);
        if w != 0 {
            limit.push_str(&format!(", {};w={w}", l.requests_per_unit));
            if !l.name.is_empty() {
                limit.push_str(&format!(";name=\"{}\"", l.name));
            }
        }
    }
    let reset = min.duration_until_reset.unwrap_or_default().seconds;
    (limit, min.limit_remaining, reset, window(current.unit))
}

/// What floodgate's IETF fields say: (q, w) of `RateLimit-Policy`, (r, t) of `RateLimit`.
fn ietf(response: &RateLimitResponse) -> (String, String) {
    let value = |key: &str| {
        let v = &response
            .response_headers_to_add
            .iter()
            .find(|h| h.key == key)
            .unwrap_or_else(|| panic!("no {key}"))
            .value;
        v.split_once(';').unwrap().1.to_string()
    };
    (value("RateLimit-Policy"), value("RateLimit"))
}

/// Envoy's `x-ratelimit-*` headers agree with each other and with floodgate's own for a burst
/// above the rate and for `unit_multiplier` under every algorithm: remaining never above the
/// limit, reset within the window, and a client that spends what they say is never refused.
#[tokio::test]
async fn burst_and_multiplier_headers_agree() {
    let options = PlanOptions {
        headers: Some(HeaderOptions {
            ietf: true,
            ..HeaderOptions::default()
        }),
        ..options()
    };
    let server = TestServer::with(STATED).options(options).start().await;
    let ask = |key: &'static str, hits: u64| {
        server.ask(request(
            "agree",
            vec![with_hits(descriptor(&[(key, "c")]), hits)],
        ))
    };
    let agree = |response: &RateLimitResponse| {
        let (limit, remaining, reset, w) = envoy_x_ratelimit(response);
        let quota: u32 = limit.split(',').next().unwrap().parse().unwrap();
        assert!(remaining <= quota, "{limit} with remaining {remaining}");
        assert!(reset as u64 <= w, "{limit} with reset {reset}");
        assert_eq!(
            ietf(response),
            (
                format!("q={quota};w={w}"),
                format!("r={remaining};t={reset}")
            ),
            "{limit}"
        );
        (limit, remaining, reset)
    };
    // 10/minute with burst 50: 49 tokens left states 10 remaining, ten already there.
    let first = ask("burst", 1).await;
    assert_eq!(
        agree(&first),
        ("10, 10;w=60;name=\"edge\"".to_string(), 10, 0)
    );
    // 4 tokens left: 4 remaining, 10 again in 36 s (6 s a token).
    let low = ask("burst", 45).await;
    let (_, remaining, reset) = agree(&low);
    assert_eq!((remaining, reset), (4, 36));
    for _ in 0..4 {
        assert_eq!(ask("burst", 1).await.overall_code, Code::Ok as i32);
    }
    let (_, remaining, reset) = agree(&ask("burst", 0).await);
    assert_eq!((remaining, reset), (0, 60));
    // After the stated reset, the stated quota passes at once.
    server.advance_ms(60_000);
    for _ in 0..10 {
        assert_eq!(ask("burst", 1).await.overall_code, Code::Ok as i32);
    }
    // 3 per 5 minutes, 135 s before the end of a window: stated per hour, the shortest unit
    // holding the period, under every algorithm.
    server.advance_ms(165_000 - 60_000);
    for (key, reset) in [("fixed", 135), ("sliding", 435), ("tokens", 100)] {
        let response = ask(key, 1).await;
        assert_eq!(
            agree(&response),
            ("3, 3;w=3600".to_string(), 2, reset),
            "{key}"
        );
        for _ in 0..2 {
            assert_eq!(ask(key, 1).await.overall_code, Code::Ok as i32, "{key}");
        }
    }
    // Envoy's policy list states every limited status its own way.
    let both = server
        .ask(request(
            "agree",
            vec![descriptor(&[("burst", "d")]), descriptor(&[("fixed", "d")])],
        ))
        .await;
    assert_eq!(
        envoy_x_ratelimit(&both).0,
        "3, 10;w=60;name=\"edge\", 3;w=3600"
    );
    server.stop().await;
}
