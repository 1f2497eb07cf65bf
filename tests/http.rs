//! The admin HTTP endpoints: /healthcheck, /json (and the cross-site guard on writes),
//! /metrics, /rlconfig.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use serde_json::{Value, json};
use support::http::{call, call_with, post_json};
use support::*;

const LIMITS: &str = r#"
domain: web
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quiet
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn body(key: &str, value: &str) -> String {
    json!({"domain": "web", "descriptors": [{"entries": [{"key": key, "value": value}]}]})
        .to_string()
}

/// /healthcheck answers 200 OK while serving.
#[tokio::test]
async fn healthcheck_ok() {
    let server = TestServer::start(LIMITS).await;
    let response = call(server.http_addr, "GET", "/healthcheck", None).await;
    assert_eq!((response.status, response.body.as_str()), (200, "OK\n"));
    server.stop().await;
}

/// POST /json answers 200 within the limit and 429 over it, with protobuf-JSON bodies.
#[tokio::test]
async fn json_ok_then_429() {
    let server = TestServer::start(LIMITS).await;
    let first = post_json(server.http_addr, &body("client", "a")).await;
    assert_eq!(first.status, 200);
    let parsed: Value = serde_json::from_str(&first.body).unwrap();
    assert_eq!(
        parsed,
        json!({"overallCode": "OK", "statuses": [{
            "code": "OK",
            "currentLimit": {"requestsPerUnit": 2, "unit": "MINUTE"},
            "limitRemaining": 1,
            "durationUntilReset": "30s"
        }]})
    );
    post_json(server.http_addr, &body("client", "a")).await;
    let over = post_json(server.http_addr, &body("client", "a")).await;
    assert_eq!(over.status, 429);
    let parsed: Value = serde_json::from_str(&over.body).unwrap();
    assert_eq!(parsed["overallCode"], "OVER_LIMIT");
    server.stop().await;
}

/// camelCase field names and string-encoded 64-bit numbers are accepted, as protobuf JSON allows.
#[tokio::test]
async fn json_accepts_protobuf_json_spellings() {
    let server = TestServer::start(LIMITS).await;
    let request = json!({"domain": "web", "hitsAddend": 1, "descriptors": [
        {"entries": [{"key": "client", "value": "b"}], "hitsAddend": "2"}
    ]});
    let response = post_json(server.http_addr, &request.to_string()).await;
    assert_eq!(response.status, 200, "{}", response.body);
    let parsed: Value = serde_json::from_str(&response.body).unwrap();
    // Two hits of two: nothing left, so limitRemaining is omitted as protobuf JSON does.
    assert!(
        parsed["statuses"][0].get("limitRemaining").is_none(),
        "{parsed}"
    );
    server.stop().await;
}

/// Bad bodies and invalid requests are 400 with a message saying what is wrong.
#[tokio::test]
async fn json_bad_requests_are_400() {
    let server = TestServer::start(LIMITS).await;
    let garbage = post_json(server.http_addr, "{not json").await;
    assert_eq!(garbage.status, 400);
    assert!(
        garbage.body.contains("invalid JSON body"),
        "{}",
        garbage.body
    );
    let unknown_field = post_json(server.http_addr, r#"{"domain":"web","bogus":1}"#).await;
    assert_eq!(unknown_field.status, 400);
    assert!(
        unknown_field.body.contains("bogus"),
        "{}",
        unknown_field.body
    );
    let empty = post_json(server.http_addr, r#"{"domain":"","descriptors":[]}"#).await;
    assert_eq!(empty.status, 400);
    assert!(
        empty.body.contains("rate limit domain must not be empty"),
        "{}",
        empty.body
    );
    server.stop().await;
}

/// /metrics counts hits per rule: within, over and shadow (a shadow rule over its limit in
/// both, as the reference), adding hits not requests.
#[tokio::test]
async fn metrics_count_hits_per_rule() {
    let server = TestServer::start(LIMITS).await;
    for _ in 0..3 {
        post_json(server.http_addr, &body("client", "a")).await;
    }
    for _ in 0..2 {
        post_json(server.http_addr, &body("quiet", "a")).await;
    }
    let metrics = call(server.http_addr, "GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    let text = metrics.body;
    for line in [
        r#"floodgate_rule_hits_total{domain="web",rule="web.client"} 3"#,
        r#"floodgate_rule_within_limit_total{domain="web",rule="web.client"} 2"#,
        r#"floodgate_rule_over_limit_total{domain="web",rule="web.client"} 1"#,
        r#"floodgate_rule_hits_total{domain="web",rule="web.quiet"} 2"#,
        r#"floodgate_rule_shadow_mode_total{domain="web",rule="web.quiet"} 1"#,
        r#"floodgate_rule_over_limit_total{domain="web",rule="web.quiet"} 1"#,
        r#"floodgate_requests_total{result="ok"} 4"#,
        r#"floodgate_requests_total{result="over_limit"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in:\n{text}"
        );
    }
    server.stop().await;
}

/// /rlconfig lists the loaded limits.
#[tokio::test]
async fn rlconfig_lists_limits() {
    let server = TestServer::start(LIMITS).await;
    let response = call(server.http_addr, "GET", "/rlconfig", None).await;
    assert_eq!(response.status, 200);
    assert!(response.body.contains("web.client"), "{}", response.body);
    assert!(response.body.contains("web.quiet"), "{}", response.body);
    server.stop().await;
}

/// detailed_metric labels a rule's series with the request's values; other rules stay bounded.
#[tokio::test]
async fn detailed_metric_uses_request_values() {
    let limits = r#"
domain: web
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;
    let server = TestServer::start(limits).await;
    post_json(server.http_addr, &body("user", "alice")).await;
    let text = call(server.http_addr, "GET", "/metrics", None).await.body;
    let line = r#"floodgate_rule_hits_total{domain="web",rule="web.user_alice"} 1"#;
    assert!(
        text.lines().any(|l| l == line),
        "missing `{line}` in:\n{text}"
    );
    server.stop().await;
}

/// A web page cannot write through /json: a browser's body (one with `Origin`) not declared
/// `application/json` is 415 and a foreign `Origin` is 403, and neither drains the bucket; the
/// same request from the admin port's own origin, or from a client that sends no Origin, is
/// answered.
#[tokio::test]
async fn json_refuses_cross_site_writes() {
    let server = TestServer::start(LIMITS).await;
    let addr = server.http_addr;
    let drain = json!({"domain": "web", "hitsAddend": 2,
                       "descriptors": [{"entries": [{"key": "client", "value": "x"}]}]})
    .to_string();
    let evil = ("Origin", "http://evil.example");
    let own_origin = format!("http://{addr}");
    for (headers, status, says) in [
        (
            vec![("Content-Type", "text/plain"), evil],
            415,
            "application/json",
        ),
        (vec![evil], 415, "application/json"),
        (
            vec![("Content-Type", "application/x-www-form-urlencoded"), evil],
            415,
            "application/json",
        ),
        (
            vec![
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Origin", own_origin.as_str()),
            ],
            415,
            "application/json",
        ),
        (
            vec![("Content-Type", "application/json"), evil],
            403,
            "http://evil.example",
        ),
        (
            vec![("Content-Type", "application/json"), ("Origin", "null")],
            403,
            "null",
        ),
    ] {
        let response = call_with(addr, "POST", "/json", &headers, Some(&drain)).await;
        assert_eq!(response.status, status, "{headers:?}: {}", response.body);
        assert!(response.body.contains(says), "{}", response.body);
    }
    // Nothing was debited: the bucket still holds both requests.
    let check = json!({"domain": "web", "descriptors": [{"entries": [{"key": "client",
                       "value": "x"}], "hitsAddend": 0}]})
    .to_string();
    let left = |response: support::http::HttpResponse| {
        let parsed: Value = serde_json::from_str(&response.body).unwrap();
        // Protobuf JSON leaves a 0 out.
        parsed["statuses"][0]["limitRemaining"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(left(post_json(addr, &check).await), 2);
    // The console page's own origin (Origin = Host), and a client without Origin, write.
    let same_site = [
        ("Content-Type", "application/json"),
        ("Origin", own_origin.as_str()),
    ];
    let response = call_with(
        addr,
        "POST",
        "/json",
        &same_site,
        Some(&body("client", "x")),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(post_json(addr, &body("client", "x")).await.status, 200);
    assert_eq!(left(post_json(addr, &check).await), 0);
    server.stop().await;
}

/// A client that sends no Origin is served whatever its Content-Type, or none, as the
/// reference serves /json (its `TestJsonHandler` posts without one and expects 400, 200 and
/// 429; `curl -d` declares a form).
#[tokio::test]
async fn json_serves_any_body_without_origin() {
    let server = TestServer::start(LIMITS).await;
    let addr = server.http_addr;
    let post = |headers: &'static [(&'static str, &'static str)], body: String| async move {
        call_with(addr, "POST", "/json", headers, Some(&body)).await
    };
    let bad = post(&[], "{not json".to_string()).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let none = post(&[], body("client", "ref")).await;
    assert_eq!(none.status, 200, "{}", none.body);
    let form = post(
        &[("Content-Type", "application/x-www-form-urlencoded")],
        body("client", "ref"),
    )
    .await;
    assert_eq!(form.status, 200, "{}", form.body);
    let over = post(&[("Content-Type", "text/plain")], body("client", "ref")).await;
    assert_eq!(over.status, 429, "{}", over.body);
    let parsed: Value = serde_json::from_str(&over.body).unwrap();
    assert_eq!(parsed["overallCode"], "OVER_LIMIT");
    server.stop().await;
}

/// A hitsAddend that is not an unsigned 64-bit integer is a 400, never a guessed value.
#[tokio::test]
async fn json_bad_hits_addend_is_400() {
    let server = TestServer::start(LIMITS).await;
    let request = json!({"domain": "web", "descriptors": [
        {"entries": [{"key": "client", "value": "c"}], "hitsAddend": "lots", "isNegativeHits": true}
    ]});
    let response = post_json(server.http_addr, &request.to_string()).await;
    assert_eq!(response.status, 400, "{}", response.body);
    server.stop().await;
}

/// A server on the memory store with the admin settings of `tuning`.
async fn start_tuned(tuning: Tuning) -> TestServer {
    let store = std::sync::Arc::new(floodgate::store::MemoryStore::new(std::sync::Arc::new(
        floodgate::clock::ManualClock::new(START_US),
    )));
    TestServer::with(LIMITS)
        .store(
            store,
            std::sync::Arc::new(floodgate::telemetry::metrics::Metrics::new()),
        )
        .tuning(tuning)
        .start()
        .await
}

/// --json-endpoint=false: POST /json answers 404; the other admin endpoints and gRPC stay.
#[tokio::test]
async fn json_endpoint_can_be_disabled() {
    let server = start_tuned(Tuning {
        no_json_endpoint: true,
        ..Tuning::default()
    })
    .await;
    assert_eq!(
        post_json(server.http_addr, &body("client", "a"))
            .await
            .status,
        404
    );
    let health = call(server.http_addr, "GET", "/healthcheck", None).await;
    assert_eq!(health.status, 200);
    assert_eq!(
        call(server.http_addr, "GET", "/metrics", None).await.status,
        200
    );
    let grpc = server.ask(simple("web", "client", "a")).await;
    assert_eq!(
        grpc.overall_code,
        floodgate::proto::rls::rate_limit_response::Code::Ok as i32
    );
    server.stop().await;
}

/// --no-http: nothing listens for admin HTTP, gRPC serves, and shutdown is clean.
#[tokio::test]
async fn admin_http_can_be_turned_off() {
    let server = start_tuned(Tuning {
        no_http: true,
        ..Tuning::default()
    })
    .await;
    let grpc = server.ask(simple("web", "client", "a")).await;
    assert_eq!(
        grpc.overall_code,
        floodgate::proto::rls::rate_limit_response::Code::Ok as i32
    );
    assert!(
        tokio::net::TcpStream::connect(server.http_addr)
            .await
            .is_err(),
        "nothing may listen on the admin address"
    );
    server.stop().await;
}

/// Every answered call, gRPC and /json alike, is timed in
/// `floodgate_request_duration_seconds` by result, and counted per configured domain, with
/// every domain no configuration has under the one label `_unknown`.
#[tokio::test]
async fn request_duration_and_domain_counters() {
    let server = TestServer::start(LIMITS).await;
    for _ in 0..3 {
        post_json(server.http_addr, &body("client", "a")).await;
    }
    server.ask(simple("web", "client", "b")).await;
    for domain in ["nope-1", "nope-2"] {
        server.ask(simple(domain, "k", "v")).await;
    }
    assert!(server.ask_err(request("web", vec![])).await.code() == tonic::Code::InvalidArgument);
    let count = |result: &str| {
        server.metric(&format!(
            "floodgate_request_duration_seconds_count{{result=\"{result}\"}}"
        ))
    };
    assert_eq!(
        (count("ok"), count("over_limit"), count("invalid")),
        (5, 1, 1)
    );
    let domain = |domain: &str, result: &str| {
        server.metric(&format!(
            "floodgate_domain_requests_total{{domain=\"{domain}\",result=\"{result}\"}}"
        ))
    };
    assert_eq!(domain("web", "ok"), 3);
    assert_eq!(domain("web", "over_limit"), 1);
    assert_eq!(domain("_unknown", "ok"), 2);
    assert!(
        !server.metrics.encode().contains("nope-"),
        "a client's domain became a label value"
    );
    server.stop().await;
}
