//! The real binary configured as the reference server is: only its environment variables, a
//! `RUNTIME_ROOT` tree, a real redis-server. With `--default-algorithm fixed_window` the
//! answers are the reference's (limit_remaining = limit − count in the current window).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use floodgate::proto::envoy::r#type::v3::RateLimitUnit;
use floodgate::proto::rls::rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit};
use floodgate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::{descriptor, request, simple, with_hits, with_override};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Day windows: a test never straddles a window boundary in practice.
const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    value: "/api/*"
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: client
    value: batch
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
"#;

const API: &str = r#"
domain: api
descriptors:
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: day, requests_per_unit: 5}
      - key: plan
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: plan
    value: basic
    rate_limit: {unit: day, requests_per_unit: 1, name: basic}
  - key: plan
    value: premium
    rate_limit: {unit: day, requests_per_unit: 10, name: premium, replaces: [{name: basic}]}
"#;

/// The reference's layout: `<RUNTIME_ROOT>/<RUNTIME_SUBDIRECTORY>/config/*.yaml`.
fn runtime_tree(root: &Path) {
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), EDGE).unwrap();
    std::fs::write(config.join("api.yaml"), API).unwrap();
}

struct Client(RateLimitServiceClient<tonic::transport::Channel>);

impl Client {
    async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.0
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
    }

    /// The single status of a one-descriptor request: (code, remaining).
    async fn one(&mut self, request: RateLimitRequest) -> (i32, u32) {
        let response = self.ask(request).await;
        assert_eq!(response.statuses.len(), 1, "{response:?}");
        (response.overall_code, response.statuses[0].limit_remaining)
    }
}

/// Reference variables alone configure limits, ports, Redis and logs; the answers are the
/// reference's for nested, wildcard, shadow, replaces, unlimited, hits_addend and overrides;
/// the no-effect variables are listed in one start-up warning.
#[tokio::test]
async fn reference_environment_gets_reference_answers() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("srv/runtime_data/current");
    runtime_tree(&root);
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let server = Floodgate::start_with_env(
        &["--default-algorithm", "fixed_window"],
        &[
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("REDIS_TYPE", "SINGLE"),
            ("REDIS_POOL_SIZE", "2"),
            ("CACHE_KEY_PREFIX", "refenv_"),
            ("USE_PROMETHEUS", "true"),
            ("LOG_LEVEL", "info"),
            ("LOG_FORMAT", "text"),
        ],
    );
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );

    // Top-level key, any value: 3 per day, remaining = 3 − count; the 4th is denied.
    for expected in [2, 1, 0] {
        let ip = simple("edge", "remote_address", "10.0.0.1");
        assert_eq!(client.one(ip).await, (OK, expected));
    }
    let denied = client
        .ask(simple("edge", "remote_address", "10.0.0.1"))
        .await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(denied.statuses[0].limit_remaining, 0);
    // Another value is another counter.
    let other = simple("edge", "remote_address", "10.0.0.2");
    assert_eq!(client.one(other).await, (OK, 2));

    // Wildcard value: "/api/*" matches; one counter per request value.
    let api = |path: &str| simple("edge", "path", path);
    assert_eq!(client.one(api("/api/a")).await, (OK, 1));
    assert_eq!(client.one(api("/api/a")).await, (OK, 0));
    assert_eq!(client.one(api("/api/a")).await.0, OVER);
    assert_eq!(client.one(api("/api/b")).await, (OK, 1));
    // No match: a bare OK.
    let unmatched = client.ask(api("/static/x")).await;
    assert_eq!(
        unmatched.statuses[0],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );

    // Shadow mode: counted, never denied.
    let batch = || simple("edge", "client", "batch");
    assert_eq!(client.one(batch()).await, (OK, 0));
    assert_eq!(client.one(batch()).await, (OK, 0));

    // Unlimited: OK with no limit, remaining u32::MAX.
    let health = client.ask(simple("edge", "health", "x")).await;
    assert_eq!(health.overall_code, OK);
    assert!(health.statuses[0].current_limit.is_none());
    assert_eq!(health.statuses[0].limit_remaining, u32::MAX);

    // Nested descriptors: tenant + plan; an exact value beats the any-value entry.
    let nested = |plan: &str| request("api", vec![descriptor(&[("tenant", "t1"), ("plan", plan)])]);
    assert_eq!(client.one(nested("gold")).await, (OK, 4));
    assert_eq!(client.one(nested("silver")).await, (OK, 1));
    // tenant alone has no limit of its own.
    let bare = client.ask(simple("api", "tenant", "t1")).await;
    assert_eq!(
        bare.statuses[0],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );

    // hits_addend: the request's applies to every descriptor; 3 more of gold's 5 leaves 1.
    let mut heavy = nested("gold");
    heavy.hits_addend = 3;
    assert_eq!(client.one(heavy).await, (OK, 1));
    // A descriptor's own hits_addend wins: 2 more would exceed → denied.
    let too_many = request(
        "api",
        vec![with_hits(
            descriptor(&[("tenant", "t1"), ("plan", "gold")]),
            2,
        )],
    );
    assert_eq!(client.one(too_many).await.0, OVER);

    // replaces: premium, matched in the same request, drops basic's limit.
    let both = || {
        request(
            "api",
            vec![
                descriptor(&[("plan", "basic")]),
                descriptor(&[("plan", "premium")]),
            ],
        )
    };
    for _ in 0..2 {
        let response = client.ask(both()).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(
            response.statuses[0],
            DescriptorStatus {
                code: OK,
                ..Default::default()
            }
        );
        assert_eq!(
            response.statuses[1].current_limit.as_ref().unwrap().name,
            "premium"
        );
    }
    assert_eq!(client.one(simple("api", "plan", "basic")).await, (OK, 0));
    assert_eq!(client.one(simple("api", "plan", "basic")).await.0, OVER);

    // Override: the request's limit (1 per hour) replaces the configured one.
    let overridden = || {
        request(
            "api",
            vec![with_override(
                descriptor(&[("tenant", "t2"), ("plan", "gold")]),
                1,
                RateLimitUnit::Hour as i32,
            )],
        )
    };
    let first = client.ask(overridden()).await;
    let limit = first.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    assert_eq!(first.statuses[0].limit_remaining, 0);
    assert_eq!(client.ask(overridden()).await.overall_code, OVER);

    // The counters are in the Redis of REDIS_URL, under CACHE_KEY_PREFIX.
    let mut connection = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("refenv_*")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!keys.is_empty());

    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("accepted without effect"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    for name in [
        "USE_PROMETHEUS",
        "RUNTIME_WATCH_ROOT",
        "RUNTIME_IGNOREDOTFILES",
    ] {
        assert!(warnings[0].contains(name), "{name}: {}", warnings[0]);
    }
    assert!(log.contains("ratelimit/config"), "{log}");
}
