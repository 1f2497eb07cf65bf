//! The real binary configured as the reference server is: only its environment variables, a
//! `RUNTIME_ROOT` tree, a real redis-server. Started so, floodgate counts with fixed windows
//! and its answers are the reference's (limit_remaining = limit − count in the current
//! window), its limits files are every file the reference reads, and its switches
//! (`SHADOW_MODE`, `QUOTA_MODE`, `MERGE_DOMAIN_CONFIG`, `RESPONSE_DYNAMIC_METADATA`) answer
//! as the reference's do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use floodgate::proto::envoy::r#type::v3::RateLimitUnit;
use floodgate::proto::rls::rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit};
use floodgate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
};
use support::http::{call, metric};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::{descriptor, eventually, request, simple, with_hits, with_override};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The per-request Redis deadline of the tests that use Redis: on a loaded 2-core test machine
/// opening a pooled connection can take longer than the 10 ms production default, which
/// would fail a first request with UNAVAILABLE. Not a reference variable: the deadline is
/// floodgate's own (REDIS_TIMEOUT never lengthens it).
const LOADED_MACHINE_DEADLINE_MS: &str = "250";

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

impl support::scenarios::Ask for Client {
    async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        Client::ask(self, request).await
    }
}

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
/// wildcard, shadow, replaces, unlimited, hits_addend and overrides; every variable set is
/// applied (none reported without effect).
#[tokio::test]
async fn reference_environment_gets_reference_answers() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("srv/runtime_data/current");
    runtime_tree(&root);
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let server = Floodgate::start_with_env(
        &["--redis-timeout-ms", LOADED_MACHINE_DEADLINE_MS],
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
            // The answers are under test, not the 10 ms deadline (tests/faults.rs): a busy
            // test machine must not turn them into deadline misses.
            ("FLOODGATE_REDIS_TIMEOUT_MS", "1000"),
            ("REDIS_TYPE", "SINGLE"),
            ("REDIS_POOL_SIZE", "2"),
            ("CACHE_KEY_PREFIX", "refenv_"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("LOG_LEVEL", "info"),
            ("LOG_FORMAT", "text"),
        ],
    );
    // As a readiness probe would: no traffic before Redis has answered.
    eventually("health SERVING", || {
        health_is(server.grpc, server.http, true)
    })
    .await;
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
    // A descriptor's own hits_addend wins: a charge of 2 more does not fit → OVER_LIMIT.
    let too_many = request(
        "api",
        vec![with_hits(
            descriptor(&[("tenant", "t1"), ("plan", "gold")]),
            2,
        )],
    );
    assert_eq!(client.one(too_many).await.0, OVER);

    // replaces: premium, matched in the same request, drops basic's limit (the scenario
    // tests/rls.rs runs in process too).
    support::scenarios::replaced_limit_is_dropped(&mut client, "api", 2).await;

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
    // Every variable set is applied (USE_PROMETHEUS too: the reference's series are served).
    assert!(warnings.is_empty(), "{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("applied") && l.contains("USE_PROMETHEUS")),
        "{log}"
    );
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
async fn reference_example_files_and_answers() {
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
                // Answers under test, not the deadline (as above).
                ("FLOODGATE_REDIS_TIMEOUT_MS", "1000"),
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
    let deadline = std::time::Instant::now() + support::EVENTUALLY;
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

/// The reference layout's walk reads nested directories, and a change deep in one is
/// reloaded like a change beside the others.
#[tokio::test]
async fn nested_runtime_directories_are_watched() {
    let tmp = tempfile::tempdir().unwrap();
    let nested = tmp.path().join("ratelimit/config/team/a");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(nested.join("mongo.yaml"), MONGO).unwrap();
    let root = tmp.path().to_str().unwrap();
    let env = [
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
    ];
    let server = Floodgate::start_with_env(&[], &env);
    let mut client = Client(
        RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap(),
    );
    let users = client.ask(simple("mongo_cps", "database", "users")).await;
    assert_eq!(users.statuses[0].limit_remaining, 499);

    // Written in place, two directories below the watched one.
    std::fs::write(nested.join("mongo.yaml"), MONGO.replace("500", "700")).unwrap();
    eventually("the nested file's edit is loaded", || {
        let mut client = Client(client.0.clone());
        async move {
            let users = client.ask(simple("mongo_cps", "database", "users")).await;
            users.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit
                == 700
        }
    })
    .await;
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

// ---- The reference's own example deployment ----

/// The reference's example limits (`examples/ratelimit/config/`), rewritten from its
/// documented format: a per-second domain for a database...
const EXAMPLE_MONGO_CPS: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
"#;

/// ...and one with nesting, `replaces`, a zero limit, a per-second limit, shadow mode and
/// unlimited. The example's minutes are hours here, so that a test never straddles a window
/// boundary in practice, whichever algorithm is the default.
const EXAMPLE_RL: &str = r#"
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      unit: hour
      requests_per_unit: 4
      replaces: [{name: bkthomps}]
  - key: foo
    rate_limit: {unit: hour, requests_per_unit: 2}
    descriptors:
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: hour, requests_per_unit: 1}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: hour, requests_per_unit: 0}
      - key: baz
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: bay
        rate_limit: {unlimited: true}
"#;

/// Every name health is reported under: the server's, the reference's, the service's.
const HEALTH_NAMES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// The gRPC health status of `service` over `channel`.
async fn health_of(channel: Channel, service: &str) -> i32 {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// A channel to a TCP gRPC address.
async fn tcp_channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Whether every health name and `/healthcheck` say `serving`.
async fn health_is(grpc: SocketAddr, http: SocketAddr, serving: bool) -> bool {
    let want = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    } as i32;
    let channel = tcp_channel(grpc).await;
    for name in HEALTH_NAMES {
        if health_of(channel.clone(), name).await != want {
            return false;
        }
    }
    let status = call(http, "GET", "/healthcheck", None).await.status;
    status == if serving { 200 } else { 503 }
}

/// How many key lookups `redis` has served (`keyspace_hits` + `keyspace_misses`): a
/// request's script reads its buckets' keys, the store's health probe reads none. (Keys
/// themselves may already have expired: a full token bucket is an absent key.)
async fn lookups(redis: &RedisServer) -> u64 {
    let mut connection = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, value) = line.trim().split_once(':')?;
            matches!(name, "keyspace_hits" | "keyspace_misses")
                .then(|| value.parse::<u64>().unwrap())
        })
        .sum()
}

/// Opens a bare HTTP/2 connection to `addr`, answers the server's SETTINGS and PINGs, and
/// returns how long the server took to send GOAWAY on it.
async fn time_to_goaway(addr: SocketAddr) -> Duration {
    // Timed from before the connect: the server's age starts when it accepts, so a GOAWAY at
    // that age comes later than this however slow the machine is.
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    loop {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.unwrap();
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; length];
        stream.read_exact(&mut payload).await.unwrap();
        let (kind, ack) = (header[3], header[4] & 1 == 1);
        match kind {
            7 => return started.elapsed(),
            // SETTINGS: acknowledge.
            4 if !ack => stream
                .write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0])
                .await
                .unwrap(),
            // PING: answer with the same payload.
            6 if !ack => {
                let mut pong = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                pong.extend_from_slice(&payload);
                stream.write_all(&pong).await.unwrap();
            }
            _ => {}
        }
    }
}

/// The environment of the reference's example deployment (its docker-compose example's
/// `ratelimit` service, plus its README's two-Redis set-up and health and keepalive
/// variables), with loopback ports and the test's Redis servers.
fn example_environment(
    root: &Path,
    redis: &RedisServer,
    per_second: &RedisServer,
) -> Vec<(String, String)> {
    [
        ("USE_STATSD", "true"),
        ("STATSD_HOST", "statsd"),
        ("STATSD_PORT", "9125"),
        ("LOG_LEVEL", "debug"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis.address()),
        ("RUNTIME_ROOT", root.to_str().unwrap()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("CONFIG_TYPE", "FILE"),
        ("CONFIG_GRPC_XDS_NODE_ID", "test-node-id"),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            "ratelimit-xds-config-server:18000",
        ),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
        ("REDIS_PERSECOND_URL", &per_second.address()),
        ("REDIS_PERSECOND_POOL_SIZE", "2"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("GRPC_MAX_CONNECTION_AGE", "1s"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"),
        ("REDIS_TIMEOUT", "10s"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The binary started with only the reference example's environment: healthy once Redis
/// answered, the example limits answered as the reference documents them, per-second
/// counters in the per-second Redis and the rest in the main one, connections closed at
/// GRPC_MAX_CONNECTION_AGE, and every variable without effect named in the start-up warning.
#[tokio::test]
async fn reference_example_environment() {
    let redis = RedisServer::start();
    let per_second = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("data");
    let config = root.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.yaml"), EXAMPLE_MONGO_CPS).unwrap();
    std::fs::write(config.join("example.yaml"), EXAMPLE_RL).unwrap();
    let env = example_environment(&root, &redis, &per_second);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let server =
        Floodgate::start_with_env(&["--redis-timeout-ms", LOADED_MACHINE_DEADLINE_MS], &env);
    eventually("health SERVING once Redis answered", || {
        health_is(server.grpc, server.http, true)
    })
    .await;
    let mut client = Client(RateLimitServiceClient::new(tcp_channel(server.grpc).await));

    // Per second: 500 per second, one used, counted in the per-second Redis only
    // (REDIS_PERSECOND).
    let before = (lookups(&redis).await, lookups(&per_second).await);
    let users = client.ask(simple("mongo_cps", "database", "users")).await;
    assert_eq!(
        lookups(&redis).await,
        before.0,
        "per-second bucket read in the main Redis"
    );
    assert_eq!(lookups(&per_second).await, before.1 + 1);
    assert_eq!(users.overall_code, OK);
    let limit = users.statuses[0].current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (500, Unit::Second as i32)
    );
    assert_eq!(users.statuses[0].limit_remaining, 499);

    // Per hour: 4, one used, counted in the main Redis only.
    let account = || simple("rl", "category", "account");
    let before = (lookups(&redis).await, lookups(&per_second).await);
    assert_eq!(client.one(account()).await, (OK, 3));
    assert_eq!(lookups(&redis).await, before.0 + 1);
    assert_eq!(
        lookups(&per_second).await,
        before.1,
        "minute bucket read in the per-second Redis"
    );
    // Nested: foo + bar=bkthomps, 1 per minute: the second is over the limit.
    let bkthomps =
        |foo: &str| request("rl", vec![descriptor(&[("foo", foo), ("bar", "bkthomps")])]);
    assert_eq!(client.one(bkthomps("f1")).await, (OK, 0));
    assert_eq!(client.one(bkthomps("f1")).await.0, OVER);
    // replaces: with category=account in the same request, bkthomps's limit is dropped.
    let both = request(
        "rl",
        vec![
            descriptor(&[("category", "account")]),
            descriptor(&[("foo", "f2"), ("bar", "bkthomps")]),
        ],
    );
    let replaced = client.ask(both).await;
    assert_eq!(replaced.overall_code, OK);
    assert_eq!(
        replaced.statuses[1],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );
    // A zero limit denies at once; shadow mode never does; unlimited has no limit.
    let banned = request("rl", vec![descriptor(&[("foo", "f3"), ("bar", "banned")])]);
    assert_eq!(client.one(banned).await.0, OVER);
    for _ in 0..4 {
        let shady = request("rl", vec![descriptor(&[("foo", "f4"), ("baz", "shady")])]);
        assert_eq!(client.ask(shady).await.overall_code, OK);
    }
    let unlimited = client
        .ask(request(
            "rl",
            vec![descriptor(&[("foo", "f5"), ("bay", "x")])],
        ))
        .await;
    assert_eq!(unlimited.overall_code, OK);
    assert!(unlimited.statuses[0].current_limit.is_none());
    assert_eq!(unlimited.statuses[0].limit_remaining, u32::MAX);

    // A request with a per-second and a per-hour limit goes to both Redis, once each...
    // `baz_hits` implicit hits on the per-second limit: its descriptor that many times (one
    // bucket, debited once with the summed cost), all or nothing.
    let mixed = |baz_hits: usize| {
        let mut descriptors = vec![descriptor(&[("category", "account")])];
        descriptors.extend(std::iter::repeat_n(
            descriptor(&[("foo", "f6"), ("baz", "any")]),
            baz_hits,
        ));
        request("rl", descriptors)
    };
    let before = (lookups(&redis).await, lookups(&per_second).await);
    let both = client.ask(mixed(1)).await;
    assert_eq!(both.overall_code, OK);
    assert_eq!(both.statuses[0].limit_remaining, 1, "account: 4 − 3");
    assert_eq!(lookups(&redis).await, before.0 + 1);
    assert_eq!(lookups(&per_second).await, before.1 + 1);
    // ...and is all or nothing across them: denied by the per-second limit (2 hits where one
    // fits), it leaves account's debit refunded in the main Redis.
    let denied = client.ask(mixed(2)).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(denied.statuses[0].code, OK);
    assert_eq!(denied.statuses[0].limit_remaining, 1, "refunded");
    assert_eq!(client.one(account()).await, (OK, 0));
    assert_eq!(
        metric(
            server.http,
            "floodgate_per_second_refunds_total{result=\"ok\"}"
        )
        .await,
        Some(1.0)
    );

    // GRPC_MAX_CONNECTION_AGE=1s (±10%): an idle connection is sent GOAWAY after about 1 s.
    let age = tokio::time::timeout(Duration::from_secs(30), time_to_goaway(server.grpc))
        .await
        .expect("no GOAWAY within 30 s");
    assert!(age >= Duration::from_millis(850), "{age:?}");

    let log = server.stop().await;
    let warning = log
        .lines()
        .find(|l| l.contains("accepted without effect"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    for name in ["CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_SERVER_URL"] {
        assert!(warning.contains(name), "{name}: {warning}");
    }
    let applied = log
        .lines()
        .find(|l| l.contains("reference environment variables") && l.contains("applied"))
        .unwrap();
    for name in [
        "REDIS_PERSECOND_URL",
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "CONFIG_TYPE",
        "REDIS_TIMEOUT",
        "RUNTIME_WATCH_ROOT",
        // statsd to the example's `statsd` host (which does not resolve here: dropped).
        "USE_STATSD",
        "STATSD_HOST",
        "STATSD_PORT",
    ] {
        assert!(applied.contains(name), "{name}: {applied}");
    }
}

/// Health is NOT_SERVING under every name until Redis has answered once, then SERVING.
#[tokio::test]
async fn health_waits_for_redis() {
    let mut redis = RedisServer::start();
    redis.stop();
    let tmp = tempfile::tempdir().unwrap();
    runtime_tree(tmp.path());
    let address = redis.address();
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", tmp.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &address),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
        ],
    );
    assert!(health_is(server.grpc, server.http, false).await);
    redis.restart();
    eventually("health SERVING after Redis answered", || {
        health_is(server.grpc, server.http, true)
    })
    .await;
    server.stop().await;
}

/// With HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, no domain loaded is NOT_SERVING; a limits
/// file appearing makes it SERVING, and its removal NOT_SERVING again.
#[tokio::test]
async fn health_requires_a_domain_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", tmp.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
        ],
    );
    assert!(health_is(server.grpc, server.http, false).await);
    std::fs::write(config.join("edge.yaml"), EDGE).unwrap();
    eventually("SERVING once a domain is loaded", || {
        health_is(server.grpc, server.http, true)
    })
    .await;
    std::fs::remove_file(config.join("edge.yaml")).unwrap();
    eventually("NOT_SERVING once no domain is left", || {
        health_is(server.grpc, server.http, false)
    })
    .await;
    server.stop().await;
}

/// GRPC_UDS: gRPC (rate limits and health) is served on the unix socket, and the socket file
/// is removed at exit.
#[tokio::test]
async fn grpc_on_a_unix_socket() {
    let tmp = tempfile::tempdir().unwrap();
    runtime_tree(tmp.path());
    let socket = tmp.path().join("ratelimit.sock");
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", tmp.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_UDS", socket.to_str().unwrap()),
            ("GRPC_PORT", "8081"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
        ],
    );
    let path = socket.clone();
    let channel = Endpoint::try_from("http://[::]:1")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    for name in HEALTH_NAMES {
        assert_eq!(
            health_of(channel.clone(), name).await,
            ServingStatus::Serving as i32
        );
    }
    let mut client = Client(RateLimitServiceClient::new(channel));
    let first = client
        .ask(simple("edge", "remote_address", "10.0.0.9"))
        .await;
    assert_eq!(first.overall_code, OK);
    assert!(first.statuses[0].current_limit.is_some());
    let log = server.stop().await;
    assert!(!socket.exists(), "socket file left behind");
    assert!(
        log.contains("GRPC_PORT (gRPC is served on the GRPC_UDS socket)"),
        "{log}"
    );
}

/// What floodgate cannot honour stops start-up with exit code 64, naming the variable,
/// before any port is bound.
#[test]
fn unsupported_reference_variables_exit_64() {
    let tmp = tempfile::tempdir().unwrap();
    runtime_tree(tmp.path());
    for (name, value) in [
        ("BACKEND_TYPE", "memcache"),
        ("MEMCACHE_HOST_PORT", "memcached:11211"),
        ("REDIS_PERSECOND", "true"),
        ("GRPC_MAX_CONNECTION_AGE", "forever"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .arg("serve")
            .env_clear()
            .env("RUNTIME_ROOT", tmp.path())
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("GRPC_PORT", "0")
            .env("PORT", "0")
            .env(name, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{name}: {stderr}");
        assert!(stderr.contains(name), "{name}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("listening"),
            "{name}"
        );
    }
}
