//! Envoy's RLQS filter (`envoy.filters.http.rate_limit_quota`) against floodgate, configured
//! as docs/rlqs.md documents it: its filter config and its limits, floodgate's default
//! assignment TTL. Envoy 1.40 reports every 5 s whatever `reporting_interval` says; the
//! assignments must outlive that.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::envoy::{Bootstrap, Envoy, documented_yaml};
use support::http::metric;
use support::process::Floodgate;

/// How long the steady client runs: more than two of Envoy's 5 s report periods.
const RUN: Duration = Duration::from_secs(13);

/// docs/rlqs.md's Envoy example and limits file.
fn documented() -> (Value, String) {
    let blocks = documented_yaml("docs/rlqs.md");
    let bootstrap = blocks
        .iter()
        .find(|(_, text)| text.contains("static_resources"))
        .expect("docs/rlqs.md shows no Envoy bootstrap");
    let limits = blocks
        .iter()
        .find(|(_, text)| text.starts_with("domain:"))
        .expect("docs/rlqs.md shows no limits file");
    let bootstrap: Value = serde_yaml_ng::from_str(&bootstrap.1).unwrap();
    let filter = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.rate_limit_quota")
        .expect("no RLQS filter in docs/rlqs.md's example")["typed_config"]
        .clone();
    (filter, limits.1.clone())
}

/// A client well within its quota (4 requests a second of the documented 100/s), steady
/// for 13 s behind Envoy's RLQS filter configured as docs/rlqs.md shows, is never refused:
/// the assignment never lapses into the fallback (set to DENY_ALL here, so that a lapse
/// shows as a refusal).
#[tokio::test]
async fn documented_settings_never_lapse_into_the_fallback() {
    let (mut filter, limits) = documented();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, &limits).unwrap();
    let server = Floodgate::start(&["--config", path.to_str().unwrap()]);

    filter["rlqs_server"] = json!({"envoy_grpc": {"cluster_name": "ratelimit"}});
    let settings = &mut filter["bucket_matchers"]["matcher_list"]["matchers"][0]["on_match"]["action"]
        ["typed_config"];
    settings["expired_assignment_behavior"]["fallback_rate_limit"] =
        json!({"blanket_rule": "DENY_ALL"});
    let mut bootstrap = Bootstrap::new(&[server.grpc]);
    bootstrap.http_filter("envoy.filters.http.rate_limit_quota", filter);
    let envoy = Envoy::start(&bootstrap).await;

    let mut refused = Vec::new();
    let started = tokio::time::Instant::now();
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    while started.elapsed() < RUN {
        pace.tick().await;
        let status = envoy.get("/", &[("x-tenant", "acme")]).await.status;
        if status != 200 {
            refused.push((started.elapsed(), status));
        }
    }
    let assigned = metric(
        server.http,
        r#"floodgate_rlqs_assignments_total{strategy="token_bucket"}"#,
    )
    .await
    .unwrap_or(0.0);
    assert!(assigned > 0.0, "floodgate assigned no token bucket");
    assert!(
        refused.is_empty(),
        "refused within the quota (a lapse into the fallback): {refused:?}"
    );
    drop(envoy);
    server.stop().await;
}
