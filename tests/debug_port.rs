//! The reference's debug port from the real binary: `DEBUG_HOST`/`DEBUG_PORT` open it,
//! `/` lists its endpoints as the reference's does, `/rlconfig` answers the reference's text format byte for byte, `/stats` the current
//! values of the reference's stats.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::http::call;
use support::process::Floodgate;
use support::simple;

const LIMITS: &str = r#"
domain: test
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unlimited: true}
"#;

/// With DEBUG_HOST/DEBUG_PORT set, the debug port serves its index at /, /rlconfig in the
/// reference's `Dump` format (exact bytes) and /stats with the reference stats' current values.
#[tokio::test]
async fn debug_port_serves_rlconfig_and_stats() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("test.yaml"), LIMITS).unwrap();
    let root = tmp.path().to_str().unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "info"),
        ],
    );
    let debug = server.logged_addr("serving the debug port");

    // The index lists the endpoints as the reference's does: `path: help`, sorted by path;
    // like the reference's catch-all `/`, any other path answers it too.
    let index = call(debug, "GET", "/", None).await;
    assert_eq!(index.status, 200);
    assert_eq!(
        index.body,
        "/rlconfig: print out the currently loaded configuration for debugging\n\
         /stats: print out stats\n"
    );
    assert_eq!(
        call(debug, "GET", "/nothing-here", None).await.body,
        index.body
    );

    let rlconfig = call(debug, "GET", "/rlconfig", None).await;
    assert_eq!(rlconfig.status, 200);
    assert_eq!(
        rlconfig.body,
        "test.a.b: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
         test.key1_value1: unit=DAY requests_per_unit=1, shadow_mode: false, quota_mode: false\n\
         test.shadow: unit=MINUTE requests_per_unit=20, shadow_mode: true, quota_mode: false\n"
    );

    let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    for _ in 0..2 {
        rls.should_rate_limit(simple("test", "key1", "value1"))
            .await
            .unwrap();
    }
    let stats = call(debug, "GET", "/stats", None).await;
    assert_eq!(stats.status, 200);
    for expected in [
        "ratelimit.service.config_load_success: 1\n",
        "ratelimit.service.rate_limit.test.key1_value1.over_limit: 1\n",
        "ratelimit.service.rate_limit.test.key1_value1.total_hits: 2\n",
        "ratelimit_server.ShouldRateLimit.total_requests: 2\n",
    ] {
        assert!(stats.body.contains(expected), "{expected}: {}", stats.body);
    }
    // Sorted by name, one `name: value` per line.
    let names: Vec<&str> = stats
        .body
        .lines()
        .map(|l| l.split_once(": ").unwrap().0)
        .collect();
    assert!(names.is_sorted(), "{names:?}");
    server.stop().await;
}
