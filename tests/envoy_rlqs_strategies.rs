//! Envoy's RLQS filter enforcing floodgate's assignments: a limit of 0 is DENY_ALL, an
//! unlimited rule ALLOW_ALL, a limit a token bucket whose size Envoy admits exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::envoy::{Bootstrap, Envoy, Response, yaml};
use support::http::metric;
use support::process::Floodgate;
use support::{eventually, eventually_within};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: tenant
    value: free
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: vip
    rate_limit: {unlimited: true}
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: shared
    rate_limit: {unit: second, requests_per_unit: 10}
"#;

/// The RLQS filter for domain `edge`: every request with an `x-tenant` header goes into the
/// bucket `{tenant: <header>}`; before floodgate's first assignment, `before` decides.
fn rlqs_filter(before: &str) -> Value {
    let mut filter = yaml(
        r#"
"@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
rlqs_server: {envoy_grpc: {cluster_name: ratelimit}}
domain: edge
bucket_matchers:
  matcher_list:
    matchers:
      - predicate:
          single_predicate:
            input:
              name: x-tenant
              typed_config:
                "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                header_name: x-tenant
            value_match: {safe_regex: {google_re2: {}, regex: ".+"}}
        on_match:
          action:
            name: rate_limit_quota_bucket
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
              bucket_id_builder:
                bucket_id_builder:
                  tenant:
                    custom_value:
                      name: tenant
                      typed_config:
                        "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                        header_name: x-tenant
              reporting_interval: 5s
"#,
    );
    filter["bucket_matchers"]["matcher_list"]["matchers"][0]["on_match"]["action"]["typed_config"]
        ["no_assignment_behavior"] = json!({"fallback_rate_limit": {"blanket_rule": before}});
    filter
}

/// floodgate on `LIMITS` and an Envoy whose RLQS filter applies `before` until floodgate's
/// first assignment.
async fn start(before: &str) -> (Floodgate, Envoy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    let server = Floodgate::start(&["--config", path.to_str().unwrap()]);
    let envoy = envoy_on(&server, before).await;
    (server, envoy, dir)
}

/// An Envoy in front of `server` whose RLQS filter applies `before` until the first
/// assignment.
async fn envoy_on(server: &Floodgate, before: &str) -> Envoy {
    let mut bootstrap = Bootstrap::new(&[server.grpc]);
    bootstrap.http_filter("envoy.filters.http.rate_limit_quota", rlqs_filter(before));
    Envoy::start(&bootstrap).await
}

async fn tenant(envoy: &Envoy, name: &str) -> Response {
    envoy.get("/", &[("x-tenant", name)]).await
}

/// A limit of 0 is assigned as DENY_ALL: once it arrives (requests pass until then), Envoy
/// refuses every request of the bucket.
#[tokio::test]
async fn a_zero_limit_denies_all() {
    let (server, envoy, _dir) = start("ALLOW_ALL").await;
    eventually("Envoy applies DENY_ALL", || async {
        tenant(&envoy, "free").await.status == 429
    })
    .await;
    for _ in 0..5 {
        assert_eq!(tenant(&envoy, "free").await.status, 429);
    }
    drop(envoy);
    server.stop().await;
}

/// An unlimited rule is assigned as ALLOW_ALL: once it arrives (requests are refused until
/// then), Envoy admits every request of the bucket.
#[tokio::test]
async fn an_unlimited_rule_allows_all() {
    let (server, envoy, _dir) = start("DENY_ALL").await;
    eventually("Envoy applies ALLOW_ALL", || async {
        tenant(&envoy, "vip").await.status == 200
    })
    .await;
    for _ in 0..50 {
        assert_eq!(tenant(&envoy, "vip").await.status, 200);
    }
    drop(envoy);
    server.stop().await;
}

/// A limit of 5 a minute is assigned as a token bucket of 5 to the one Envoy reporting on it:
/// from the first request it admits (the assignment's arrival), Envoy admits exactly 5 and
/// refuses the rest.
#[tokio::test]
async fn a_limit_is_a_token_bucket_envoy_enforces() {
    let (server, envoy, _dir) = start("DENY_ALL").await;
    eventually("Envoy applies the token bucket", || async {
        tenant(&envoy, "acme").await.status == 200
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(tenant(&envoy, "acme").await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429, 429, 429]);
    drop(envoy);
    server.stop().await;
}

/// Admitted requests of a client sending 20 a second to `envoy` for `run`.
async fn admitted_at_20_a_second(envoy: &Envoy, run: Duration) -> u64 {
    let started = tokio::time::Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(50));
    let mut admitted = 0;
    while started.elapsed() < run {
        pace.tick().await;
        if tenant(envoy, "shared").await.status == 200 {
            admitted += 1;
        }
    }
    admitted
}

/// Two Envoys on one bucket of 10 a second, each asked for twice that, share it: together
/// they admit about the limit over 10 s (never more than the limit plus one full bucket
/// each, as assignments start), and neither is starved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_one_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    let server = Floodgate::start(&["--config", path.to_str().unwrap()]);
    let first = envoy_on(&server, "DENY_ALL").await;
    let second = envoy_on(&server, "DENY_ALL").await;
    let run = Duration::from_secs(10);
    let (a, b) = tokio::join!(
        admitted_at_20_a_second(&first, run),
        admitted_at_20_a_second(&second, run)
    );
    let seconds = run.as_secs();
    eprintln!("admitted {a} + {b} in {seconds} s");
    assert!(a + b <= 10 * seconds + 2 * 10, "{a} + {b} past the limit");
    assert!(
        a + b >= 10 * seconds / 2,
        "{a} + {b}: the bucket went unused"
    );
    assert!(a >= 10 && b >= 10, "{a} + {b}: one Envoy starved");
    drop((first, second));
    server.stop().await;
}

/// floodgate restarted under Envoy's RLQS stream (SIGTERM, then a new process on the same
/// address): Envoy opens a stream to the new one, reports, and enforces its assignment again
/// (DENY_ALL for a limit of 0, after the expired assignment's fallback let requests through).
#[tokio::test]
async fn a_restarted_server_is_reported_to_and_enforced_again() {
    let (server, envoy, dir) = start("ALLOW_ALL").await;
    eventually("Envoy applies DENY_ALL", || async {
        tenant(&envoy, "free").await.status == 429
    })
    .await;
    let address = server.grpc.to_string();
    server.stop().await;
    let limits = dir.path().join("limits.yaml");
    let restarted = Floodgate::start_with_env(
        &[
            "--config",
            limits.to_str().unwrap(),
            "--grpc-addr",
            &address,
            "--http-addr",
            "127.0.0.1:0",
        ],
        &[("RUST_LOG", "info")],
    );
    eventually_within(
        "the restarted server assigns DENY_ALL again",
        Duration::from_secs(60),
        || async {
            metric(
                restarted.http,
                r#"floodgate_rlqs_assignments_total{strategy="deny_all"}"#,
            )
            .await
            .unwrap_or(0.0)
                > 0.0
        },
    )
    .await;
    eventually("Envoy enforces DENY_ALL again", || async {
        tenant(&envoy, "free").await.status == 429
    })
    .await;
    drop(envoy);
    restarted.stop().await;
}
