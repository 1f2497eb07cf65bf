//! Usage-based limits as Envoy Gateway configures them (BackendTrafficPolicy `cost.request`
//! and `cost.response`, which Envoy AI Gateway uses for LLM token budgets): per-route
//! `RateLimitPerRoute.rate_limits`, a request-time rule with `hits_addend: {number: 0}` and an
//! `apply_on_stream_done` rule whose hits come from the response. Through the real Envoy, with
//! floodgate in the reference mode Envoy Gateway runs it in, the budget holds as in the
//! reference.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter, yaml};
use support::eventually;
use support::http::call;
use support::process::Floodgate;
use support::redis::RedisServer;

/// 100 tokens a minute for the route's rule, as Envoy Gateway writes it for the rate-limit
/// service (fixed windows: the reference's counting, reference mode's default).
const LIMITS: &str = r#"
domain: llm
descriptors:
  - key: rule
    value: tokens
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// Envoy Gateway's per-route rules for a cost taken from the response: check with 0 hits on
/// the request, charge the response's `x-tokens` when the stream is done.
const PER_ROUTE: &str = r#"
"@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
rate_limits:
  - actions: [{generic_key: {descriptor_key: rule, descriptor_value: tokens}}]
    hits_addend: {number: 0}
  - actions: [{generic_key: {descriptor_key: rule, descriptor_value: tokens}}]
    hits_addend: {format: "%RESP(x-tokens)%"}
    apply_on_stream_done: true
"#;

/// Calls floodgate has answered so far, whatever their result.
async fn answered(http: SocketAddr) -> u64 {
    call(http, "GET", "/metrics", None)
        .await
        .body
        .lines()
        .filter(|line| line.starts_with("floodgate_requests_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits until the wall clock is at least 10 s from the next minute, so that the test's few
/// requests fall in one fixed window.
async fn away_from_minute_edge() {
    eventually("the wall clock is away from a minute's edge", || async {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_secs() % 60 < 50
    })
    .await;
}

/// 100 tokens a minute at 37 tokens a response: exactly 3 of 8 requests are admitted (37,
/// 74, 111 > 100), as the reference admits, and every later check is refused.
#[tokio::test]
async fn a_token_budget_holds_as_in_the_reference() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("llm.yaml"), LIMITS).unwrap();
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", tmp.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_PORT", "0"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            // The budget is under test, not the Redis deadline: a loaded test machine must
            // not turn an answer into an error.
            ("FLOODGATE_REDIS_TIMEOUT_MS", "1000"),
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "info"),
        ],
    );
    let mut bootstrap = Bootstrap::new(&[server.grpc]);
    bootstrap.http_filter("envoy.filters.http.ratelimit", ratelimit_filter("llm"));
    bootstrap.front_route()["typed_per_filter_config"] =
        serde_json::json!({"envoy.filters.http.ratelimit": yaml(PER_ROUTE)});
    bootstrap.backend_virtual_host()["response_headers_to_add"] =
        yaml("[{header: {key: x-tokens, value: '37'}}]");
    let envoy = Envoy::start(&bootstrap).await;
    away_from_minute_edge().await;
    let mut statuses = Vec::new();
    let mut calls = answered(server.http).await;
    for _ in 0..8 {
        let status = envoy.get("/", &[]).await.status;
        statuses.push(status);
        // An admitted request's charge goes out after its response: wait until floodgate has
        // answered it (and the check) before the next request checks the budget.
        let expected = calls + if status == 200 { 2 } else { 1 };
        eventually("floodgate answers the check and the charge", || async {
            answered(server.http).await >= expected
        })
        .await;
        calls = answered(server.http).await;
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 429],
        "100 tokens at 37 a response"
    );
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    drop(envoy);
    server.stop().await;
}

/// The same rules against floodgate's own mode (token buckets, the memory store): a charge
/// that arrives after the response never escapes without bound. Whatever rule decides the
/// charge that does not fit, 100 tokens at 37 a response admit 2 to 4 of 8 requests, never
/// all of them.
#[tokio::test]
async fn a_token_budget_holds_in_floodgates_own_mode() {
    let server = TestServer::start(LIMITS).await;
    let mut bootstrap = Bootstrap::new(&[server.grpc_addr]);
    bootstrap.http_filter("envoy.filters.http.ratelimit", ratelimit_filter("llm"));
    bootstrap.front_route()["typed_per_filter_config"] =
        serde_json::json!({"envoy.filters.http.ratelimit": yaml(PER_ROUTE)});
    bootstrap.backend_virtual_host()["response_headers_to_add"] =
        yaml("[{header: {key: x-tokens, value: '37'}}]");
    let envoy = Envoy::start(&bootstrap).await;
    let answered = || {
        server
            .metrics
            .encode()
            .lines()
            .filter(|line| line.starts_with("floodgate_requests_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let mut admitted = 0;
    let mut calls = answered();
    for _ in 0..8 {
        let status = envoy.get("/", &[]).await.status;
        let expected = calls + if status == 200 { 2 } else { 1 };
        if status == 200 {
            admitted += 1;
        }
        eventually("floodgate answers the check and the charge", || async {
            answered() >= expected
        })
        .await;
        calls = answered();
    }
    assert!((2..=4).contains(&admitted), "{admitted} of 8 admitted");
    assert_eq!(envoy.ratelimit_stat("error").await, 0);
    drop(envoy);
    server.stop().await;
}
