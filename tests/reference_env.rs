//! The real binary configured as the reference server is: only its environment variables, a
//! `RUNTIME_ROOT` tree, a real redis-server. Started so, floodgate counts with fixed windows
//! and its answers are the reference's (limit_remaining = limit − count in the current
//! window), its limits files are every file the reference reads, and its switches
//! (`SHADOW_MODE`, `QUOTA_MODE`, `MERGE_DOMAIN_CONFIG`, `RESPONSE_DYNAMIC_METADATA`) answer
//! as the reference's do.
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

/// Reference variables alone configure limits, ports, Redis and logs; with no algorithm
/// given the default is fixed windows and the answers are the reference's for nested,
/// wildcard, shadow, replaces, unlimited, hits_addend and overrides; the no-effect variables
/// are listed in one start-up warning.
#[tokio::test]
async fn reference_environment_gets_reference_answers() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("srv/runtime_data/current");
    runtime_tree(&root);
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let server = Floodgate::start_with_env(
        &[],
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
    assert!(warnings[0].contains("USE_PROMETHEUS"), "{}", warnings[0]);
    assert!(log.contains("ratelimit/config"), "{log}");
    // The start-up log says which default algorithm is in force, and why.
    let starting = log
        .lines()
        .find(|l| l.contains("floodgate starting"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        starting.contains("default_algorithm=fixed_window") && starting.contains("reference mode"),
        "{starting}"
    );
}

// ---- The reference's example deployment ----

/// The reference's example limits (its `examples/ratelimit/config/example.yaml`), rewritten:
/// nested keys, a banned value (0 per minute), a shadow-mode value, an unlimited key, and two
/// quota-mode services with `metadata`.
const EXAMPLE: &str = r#"
domain: rl
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0, name: banned_limit}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: qux
    rate_limit: {unlimited: true}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: service_2}
"#;

/// The reference's other example file (`config.yaml`), rewritten; 500 per second is a rate
/// the reference loads under every setting.
const MONGO: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 4000000}
"#;

/// A third file of domain `rl`, as a ConfigMap key without an extension in a nested
/// directory: loaded (the reference loads every file) and merged (MERGE_DOMAIN_CONFIG). Its
/// `loose` limit has `shadow_mode` misplaced inside `rate_limit`, which the reference loads
/// and ignores.
const EXTRA: &str = r#"
domain: rl
descriptors:
  - key: extra
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {team: payments}
  - key: loose
    rate_limit: {unit: day, requests_per_unit: 1, shadow_mode: true}
"#;

/// Fixed windows of a minute: a test asserting counts waits, if need be, until the current
/// minute has more than five seconds left, so that its requests share one window. This
/// waits on the wall clock, not on the server.
async fn away_from_minute_edge() {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        if now.as_secs() % 60 < 55 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The environment of the reference's docker-compose example (limits under
/// `/data/ratelimit/config`, `RUNTIME_WATCH_ROOT=false`), on ephemeral ports, plus `extra`.
fn example_env<'a>(root: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("LOG_LEVEL", "info"),
    ];
    env.extend_from_slice(extra);
    env
}

/// The example's files under `<root>/ratelimit/config`, `extra` in a nested directory.
fn example_tree(root: &Path) {
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(config.join("team")).unwrap();
    std::fs::write(config.join("example.yaml"), EXAMPLE).unwrap();
    std::fs::write(config.join("config.yaml"), MONGO).unwrap();
    std::fs::write(config.join("team/extra"), EXTRA).unwrap();
}

/// A field of a `Struct`, by path.
fn field<'a>(s: &'a prost_types::Struct, path: &[&str]) -> Option<&'a prost_types::Value> {
    use prost_types::value::Kind;
    let (first, rest) = path.split_first()?;
    let value = s.fields.get(*first)?;
    match (rest.is_empty(), &value.kind) {
        (true, _) => Some(value),
        (false, Some(Kind::StructValue(inner))) => field(inner, rest),
        _ => None,
    }
}

fn text(value: Option<&prost_types::Value>) -> Option<&str> {
    match value?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The reference's example deployment, swapped to floodgate: every file loads (an
/// extension-less one in a subdirectory, merged into its domain), `metadata:` comes back in
/// `dynamic_metadata` for the descriptors answered OK, quota mode and shadow rules answer as
/// the reference's, a shadow rule over its limit counts in over_limit and shadow_mode, an
/// empty descriptor is OK with no limit, and 4000000 per second loads.
#[tokio::test]
async fn reference_example_deployment() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    example_tree(tmp.path());
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let root = tmp.path().to_str().unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &example_env(
            root,
            &[
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", &redis_url),
                ("RESPONSE_DYNAMIC_METADATA", "true"),
                ("MERGE_DOMAIN_CONFIG", "true"),
            ],
        ),
    );
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );
    away_from_minute_edge().await;

    // Fixed windows: 2 per minute, then OVER_LIMIT; a banned value (0 per minute) at once.
    let foo = || simple("rl", "foo", "x");
    assert_eq!(client.one(foo()).await, (OK, 1));
    assert_eq!(client.one(foo()).await, (OK, 0));
    assert_eq!(client.one(foo()).await.0, OVER);
    let banned = request("rl", vec![descriptor(&[("foo", "x"), ("bar", "banned")])]);
    assert_eq!(client.one(banned).await.0, OVER);

    // A shadow rule over its limit: OK, remaining 0, as the reference answers.
    let shady = || request("rl", vec![descriptor(&[("foo", "y"), ("baz", "shady")])]);
    for expected in [2, 1, 0, 0] {
        assert_eq!(client.one(shady()).await, (OK, expected));
    }

    // Quota mode: the metadata of the descriptors answered OK, the first value winning.
    let services = || {
        request(
            "rl",
            vec![
                descriptor(&[("service", "service_1")]),
                descriptor(&[("service", "service_2")]),
            ],
        )
    };
    let first = client.ask(services()).await;
    assert_eq!(first.overall_code, OK);
    let metadata = first.dynamic_metadata.as_ref().unwrap();
    assert_eq!(text(field(metadata, &["domain"])), Some("rl"));
    assert_eq!(
        text(field(metadata, &["metadata", "service_with_quota", "name"])),
        Some("service_1")
    );
    // service_1 is over: its status says so, the request stays OK (service_2 has room), and
    // only service_2's metadata is reported.
    let second = client.ask(services()).await;
    assert_eq!(second.overall_code, OK);
    let codes: Vec<i32> = second.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, [OVER, OK]);
    assert_eq!(
        text(field(
            second.dynamic_metadata.as_ref().unwrap(),
            &["metadata", "service_with_quota", "name"]
        )),
        Some("service_2")
    );
    // Every quota-mode descriptor over: the request is denied, and no metadata is reported.
    let third = client.ask(services()).await;
    assert_eq!(third.overall_code, OVER);
    assert!(field(third.dynamic_metadata.as_ref().unwrap(), &["metadata"]).is_none());

    // The extension-less file in a subdirectory is loaded and merged into `rl`.
    let extra = client.ask(simple("rl", "extra", "e")).await;
    assert_eq!(
        (extra.overall_code, extra.statuses[0].limit_remaining),
        (OK, 0)
    );
    assert_eq!(
        text(field(
            extra.dynamic_metadata.as_ref().unwrap(),
            &["metadata", "team"]
        )),
        Some("payments")
    );

    // The misplaced `shadow_mode` is ignored, as by the reference: the limit denies.
    assert_eq!(client.one(simple("rl", "loose", "l")).await, (OK, 0));
    assert_eq!(client.one(simple("rl", "loose", "l")).await.0, OVER);

    // An empty descriptor is OK with no limit; the other file's domain and its 4000000 per
    // second limit are live.
    let mixed = client
        .ask(request(
            "mongo_cps",
            vec![descriptor(&[]), descriptor(&[("database", "default")])],
        ))
        .await;
    assert_eq!(mixed.overall_code, OK);
    assert_eq!(
        mixed.statuses[0],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );
    assert_eq!(mixed.statuses[1].limit_remaining, 3_999_999);

    // The shadow rule's one over-limit hit counts as over the limit and in shadow mode.
    let labels = r#"{domain="rl",rule="rl.foo.baz_shady"}"#;
    for family in [
        "floodgate_rule_over_limit_total",
        "floodgate_rule_shadow_mode_total",
    ] {
        let series = format!("{family}{labels}");
        assert_eq!(
            support::http::metric(server.http, &series).await,
            Some(1.0),
            "{series}"
        );
    }
    let log = server.stop().await;
    // Two domains: `rl` (two files, merged) and `mongo_cps`; the ignored key is named.
    assert!(log.contains("domains=2"), "{log}");
    assert!(
        log.contains("descriptors[1].rate_limit.shadow_mode: ignored"),
        "{log}"
    );
}

/// `SHADOW_MODE=true`: the request is always OK, while a descriptor over its limit still
/// says OVER_LIMIT (the reference's global shadow mode), and each such request is counted.
#[tokio::test]
async fn global_shadow_mode_keeps_descriptor_codes() {
    let tmp = tempfile::tempdir().unwrap();
    example_tree(tmp.path());
    let root = tmp.path().to_str().unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &example_env(
            root,
            &[("SHADOW_MODE", "true"), ("MERGE_DOMAIN_CONFIG", "true")],
        ),
    );
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );
    away_from_minute_edge().await;
    let foo = || simple("rl", "foo", "z");
    let mut codes = Vec::new();
    for _ in 0..3 {
        let response = client.ask(foo()).await;
        assert_eq!(response.overall_code, OK);
        codes.push(response.statuses[0].code);
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // Counted, as the reference's `global_shadow_mode` stat.
    assert_eq!(
        support::http::metric(server.http, "floodgate_global_shadow_mode_total").await,
        Some(1.0)
    );
    server.stop().await;
}

/// `QUOTA_MODE=true`: every descriptor is a quota-mode one, so one over its limit says
/// OVER_LIMIT while the request stays OK as long as another descriptor passes.
#[tokio::test]
async fn global_quota_mode() {
    let tmp = tempfile::tempdir().unwrap();
    example_tree(tmp.path());
    let root = tmp.path().to_str().unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &example_env(
            root,
            &[("QUOTA_MODE", "true"), ("MERGE_DOMAIN_CONFIG", "true")],
        ),
    );
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );
    away_from_minute_edge().await;
    let pair = || {
        request(
            "rl",
            vec![
                descriptor(&[("foo", "q")]),
                descriptor(&[("unmatched", "u")]),
            ],
        )
    };
    for _ in 0..2 {
        assert_eq!(client.ask(pair()).await.overall_code, OK);
    }
    let over = client.ask(pair()).await;
    assert_eq!(over.overall_code, OK);
    assert_eq!(over.statuses[0].code, OVER);
    // Alone, the over descriptor is every quota-mode descriptor: denied.
    assert_eq!(client.one(simple("rl", "foo", "q")).await.0, OVER);
    server.stop().await;
}

/// A ConfigMap mounted at `<root>/ratelimit/config` with the reference's default
/// `RUNTIME_WATCH_ROOT` and an extension-less key: without `RUNTIME_IGNOREDOTFILES=true` the
/// volume's `..` copy is read too and the domain is defined twice, so floodgate refuses to
/// start (exit 64) and says which variable fixes it; with it, the key is loaded, and a
/// ConfigMap update is reloaded.
#[tokio::test]
async fn configmap_volume_needs_ignoredotfiles_as_in_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let mut volume = support::volume::Volume::new(&config, &[("config", MONGO)]);
    let root = tmp.path().to_str().unwrap();
    let base = [
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
    ];
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .arg("serve")
        .env_clear()
        .envs(base.iter().copied())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("duplicate domain 'mongo_cps'")
            && stderr.contains("RUNTIME_IGNOREDOTFILES=true"),
        "{stderr}"
    );

    let mut env = base.to_vec();
    env.push(("RUNTIME_IGNOREDOTFILES", "true"));
    let server = Floodgate::start_with_env(&[], &env);
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );
    let users = client.ask(simple("mongo_cps", "database", "users")).await;
    assert_eq!(users.statuses[0].limit_remaining, 499);

    // The kubelet's update (a new `..` generation, `..data` swapped) is reloaded.
    volume.update(&[("config", &MONGO.replace("500", "700"))]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let users = client.ask(simple("mongo_cps", "database", "users")).await;
        let limit = users.statuses[0].current_limit.as_ref().unwrap();
        if limit.requests_per_unit == 700 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the update was never loaded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    server.stop().await;
}

/// floodgate's own `--config DIR` keeps its rules (only `*.yaml` / `*.yml`), but names each
/// file it skips and warns when no domain is loaded.
#[tokio::test]
async fn own_config_names_skipped_files_and_warns_on_zero_domains() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config"), MONGO).unwrap();
    let server = Floodgate::start(&["--config", tmp.path().to_str().unwrap()]);
    let log = server.stop().await;
    let skipped = log
        .lines()
        .find(|l| l.contains("not loaded as a limits file"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(skipped.contains("/config"), "{skipped}");
    assert!(log.contains("no domain loaded"), "{log}");
}
