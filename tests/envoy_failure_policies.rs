//! What a client behind the real Envoy sees while Redis is down, for each of floodgate's
//! failure policies (`--on-store-error`) and each Envoy `failure_mode_deny`: the table of
//! docs/envoy.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::envoy::{Bootstrap, Envoy, ratelimit_filter};
use support::process::Floodgate;

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// Statuses of three requests of one client (limit 1 an hour) while Redis is unreachable,
/// per policy: (`failure_mode_deny: false`, `failure_mode_deny: true`).
const TABLE: [(&str, [u16; 3], [u16; 3]); 4] = [
    // UNAVAILABLE: Envoy decides, open (200) or closed (500).
    ("error", [200, 200, 200], [500, 500, 500]),
    ("allow", [200, 200, 200], [200, 200, 200]),
    ("deny", [429, 429, 429], [429, 429, 429]),
    // The replica's in-memory buckets limit as Redis would have.
    ("local", [200, 429, 429], [200, 429, 429]),
];

/// Each failure policy × `failure_mode_deny` gives the client the statuses of the
/// documented table while Redis cannot be reached.
#[tokio::test]
async fn each_policy_and_failure_mode_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    // An address nothing listens on: bound, then released.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let redis_url = format!("redis://{unreachable}");
    let mut seen = Vec::new();
    for (policy, open, closed) in TABLE {
        let server = Floodgate::start(&[
            "--config",
            limits.to_str().unwrap(),
            "--redis-url",
            &redis_url,
            "--on-store-error",
            policy,
        ]);
        for (deny, expected) in [(false, open), (true, closed)] {
            let mut filter = ratelimit_filter("edge");
            filter["failure_mode_deny"] = deny.into();
            let envoy = Envoy::start(&Bootstrap::rls(
                &[server.grpc],
                filter,
                "- actions: [{request_headers: {header_name: x-client, descriptor_key: client}}]",
            ))
            .await;
            // One client per row, so that local buckets start full in each.
            let client = format!("{policy}-{deny}");
            let mut statuses = [0; 3];
            for status in &mut statuses {
                *status = envoy.get("/", &[("x-client", &client)]).await.status;
            }
            seen.push((policy, deny, statuses, expected));
        }
        server.stop().await;
    }
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(_, _, got, want)| got != want)
        .collect();
    assert!(
        wrong.is_empty(),
        "(policy, failure_mode_deny, got, documented): {wrong:?}"
    );
}
