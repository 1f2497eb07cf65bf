//! Counters shared with reference pods while a Deployment rolls: the real binary, started
//! from the reference's environment (or asked with `--reference-counters`), keeps its fixed
//! windows under the reference's Redis key names as the reference's plain integers, in a
//! real redis-server (or Redis Cluster). A counter a reference pod wrote is honoured, floodgate's
//! debits are what a reference pod reads, and a denied request still debits nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
};
use redis::AsyncCommands;
use support::process::Floodgate;
use support::redis::{RedisCluster, RedisServer};
use support::{descriptor, request, simple};
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Day windows, so a test never straddles a window boundary in practice (and waits if it
/// would); one rule per key, as the reference writes them.
const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
"#;

const DAY: u64 = 86_400;

/// The jitter the tests configure (`EXPIRATION_JITTER_MAX_SECONDS`).
const JITTER: u64 = 30;

/// The Redis deadline on a loaded 2-core test machine (floodgate's own setting).
const DEADLINE_MS: &str = "2000";

/// The reference's layout, `<root>/ratelimit/config/edge.yaml`; returns the root.
fn runtime_tree(dir: &Path) -> String {
    let config = dir.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), EDGE).unwrap();
    dir.to_str().unwrap().to_string()
}

/// The reference Deployment's environment for `redis_url`, plus `extra`.
fn reference_env<'a>(
    root: &'a str,
    redis_url: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_url),
        ("CACHE_KEY_PREFIX", "rl_"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "30"),
        ("LOG_LEVEL", "info"),
    ];
    env.extend_from_slice(extra);
    env
}

/// Unix seconds now.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Waits (on the wall clock) until the current day has more than a minute left, so that a
/// test's requests and the key names it computes share one day window.
async fn away_from_day_edge() {
    while now_secs() % DAY > DAY - 60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The reference's name for `rest` (its `_`-joined domain and entries) in today's window.
fn today(rest: &str) -> String {
    format!("rl_{rest}_{}", now_secs() / DAY * DAY)
}

/// A client once the server answers (Redis reached): polls a request that debits nothing.
async fn connect(server: &Floodgate) -> RateLimitServiceClient<Channel> {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let deadline = Instant::now() + support::EVENTUALLY;
    // A domain without limits: answered without a store call; then health says Redis is up.
    while support::health(server.grpc).await != 1 {
        assert!(Instant::now() < deadline, "never SERVING");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let probe = simple("unknown-domain", "k", "v");
    client.should_rate_limit(probe).await.unwrap();
    client
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(r).await.unwrap().into_inner()
}

/// A reference pod's counter at the limit makes floodgate answer OVER_LIMIT (and debit
/// nothing); floodgate's debits are the reference's integer under the reference's name, with
/// a TTL of the unit plus at most the jitter; a request denied by one descriptor leaves the
/// other descriptor's counter unchanged; a `share_threshold` rule's counter is named by its
/// pattern, as the reference names it.
#[tokio::test]
async fn counters_are_shared_with_reference_pods() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = runtime_tree(tmp.path());
    let url = redis.address();
    let server = Floodgate::start_with_env(
        &["--redis-timeout-ms", DEADLINE_MS],
        &reference_env(&root, &url, &[]),
    );
    let mut client = connect(&server).await;
    let mut conn = redis.connection().await;
    away_from_day_edge().await;

    // Seeded exactly as a reference pod leaves it: 3 of 3 used today.
    let seeded = today("edge_remote_address_10.0.0.1");
    let () = conn.set(&seeded, "3").await.unwrap();
    let answer = ask(&mut client, simple("edge", "remote_address", "10.0.0.1")).await;
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    let held: String = conn.get(&seeded).await.unwrap();
    assert_eq!(held, "3", "a denied request debited the shared counter");

    // Seeded at 1: floodgate's debits continue the reference's count.
    let counted = today("edge_remote_address_10.0.0.3");
    let () = conn.set(&counted, "1").await.unwrap();
    let answer = ask(&mut client, simple("edge", "remote_address", "10.0.0.3")).await;
    assert_eq!(
        (answer.overall_code, answer.statuses[0].limit_remaining),
        (OK, 1)
    );
    let held: String = conn.get(&counted).await.unwrap();
    assert_eq!(held, "2");

    // A fresh counter: written as the reference writes it, INCRBY + EXPIRE unit + jitter.
    let fresh = today("edge_remote_address_10.0.0.2");
    let answer = ask(&mut client, simple("edge", "remote_address", "10.0.0.2")).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2);
    let held: String = conn.get(&fresh).await.unwrap();
    assert_eq!(held, "1");
    let ttl: i64 = conn.ttl(&fresh).await.unwrap();
    let (unit, jitter) = (i64::try_from(DAY).unwrap(), i64::try_from(JITTER).unwrap());
    assert!(
        (unit - 5..=unit + jitter).contains(&ttl),
        "TTL {ttl} outside [{unit}, {unit} + {jitter}]"
    );

    // All or nothing: the seeded counter is full, so the fresh one is not debited either.
    let both = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.2")]),
            descriptor(&[("remote_address", "10.0.0.1")]),
        ],
    );
    let answer = ask(&mut client, both).await;
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(
        (answer.statuses[0].code, answer.statuses[1].code),
        (OK, OVER)
    );
    let held: String = conn.get(&fresh).await.unwrap();
    assert_eq!(
        held, "1",
        "a denied request debited its admitted descriptor"
    );

    // share_threshold: every /api/* value debits the counter named by the pattern.
    for path in ["/api/a", "/api/b"] {
        let answer = ask(&mut client, simple("edge", "path", path)).await;
        assert_eq!(answer.overall_code, OK);
    }
    let shared = today("edge_path_/api/*");
    let held: String = conn.get(&shared).await.unwrap();
    assert_eq!(held, "2");
    let answer = ask(&mut client, simple("edge", "path", "/api/c")).await;
    assert_eq!(answer.overall_code, OVER);

    // Only reference names were written (no floodgate-encoded key beside them).
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        keys.iter()
            .all(|k| k.starts_with("rl_edge_") || k.ends_with("probe")),
        "{keys:?}"
    );

    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    let starting = log
        .lines()
        .find(|l| l.contains("floodgate starting"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(starting.contains("reference_counters=true"), "{starting}");
    assert!(!log.contains("EXPIRATION_JITTER_MAX_SECONDS ("), "{log}");
}

/// Switched off (`FLOODGATE_REFERENCE_COUNTERS=false`) in reference mode, and by default with
/// floodgate's own `--config`, buckets keep floodgate's own unambiguous keys (the jitter then
/// has no effect, and says so); `--reference-counters` asks for the reference's names under
/// floodgate's own settings too.
#[tokio::test]
async fn switch_off_keeps_floodgate_keys() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = runtime_tree(tmp.path());
    let url = redis.address();
    let mut conn = redis.connection().await;
    away_from_day_edge().await;

    let off = Floodgate::start_with_env(
        &["--redis-timeout-ms", DEADLINE_MS],
        &reference_env(&root, &url, &[("FLOODGATE_REFERENCE_COUNTERS", "false")]),
    );
    let mut client = connect(&off).await;
    ask(&mut client, simple("edge", "remote_address", "10.0.0.1")).await;
    let own: bool = conn
        .exists("rl_edge:remote_address=10.0.0.1|fw86400")
        .await
        .unwrap();
    assert!(own, "floodgate's own key is missing");
    let reference: Option<String> = conn
        .get(today("edge_remote_address_10.0.0.1"))
        .await
        .unwrap();
    assert_eq!(reference, None);
    let (_, log) = tokio::task::spawn_blocking(move || off.terminate())
        .await
        .unwrap();
    assert!(log.contains("reference_counters=false"), "{log}");
    assert!(
        log.contains("EXPIRATION_JITTER_MAX_SECONDS (reference counters are off"),
        "{log}"
    );

    // floodgate's own settings: off unless asked.
    let limits = tmp.path().join("limits.yaml");
    std::fs::write(&limits, EDGE.replace("day", "hour")).unwrap();
    let own_args = |extra: &[&'static str]| {
        let mut args = vec![
            "--config".to_string(),
            limits.to_str().unwrap().to_string(),
            "--default-algorithm".into(),
            "fixed_window".into(),
            "--redis-url".into(),
            redis.url(),
            "--redis-timeout-ms".into(),
            DEADLINE_MS.into(),
            "--reference-key-prefix".into(),
            "own_".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let hour = |value: &str| {
        format!(
            "own_edge_remote_address_{value}_{}",
            now_secs() / 3600 * 3600
        )
    };
    for (extra, shared) in [(&[][..], false), (&["--reference-counters"][..], true)] {
        let args = own_args(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Floodgate::start(&args);
        let mut client = connect(&server).await;
        let value = if shared { "10.0.0.8" } else { "10.0.0.9" };
        ask(&mut client, simple("edge", "remote_address", value)).await;
        let reference: Option<String> = conn.get(hour(value)).await.unwrap();
        assert_eq!(reference.is_some(), shared, "{extra:?}");
        let own: bool = conn
            .exists(format!("fg:edge:remote_address={value}|fw3600"))
            .await
            .unwrap();
        assert_eq!(own, !shared, "{extra:?}");
        drop(server);
    }
}

/// On Redis Cluster the reference's names pick their slots (as for reference pods): a
/// request whose counters live in different slots is still all-or-nothing (the slot that
/// debited is refunded when another denies), and the counters are the reference's integers.
#[tokio::test]
async fn cluster_counters_are_shared_and_refunded() {
    let cluster = RedisCluster::start(3, 0);
    let tmp = tempfile::tempdir().unwrap();
    let root = runtime_tree(tmp.path());
    let addresses: Vec<String> = cluster.nodes.iter().map(|n| n.address()).collect();
    let seeds = addresses.join(",");
    let server = Floodgate::start_with_env(
        &["--redis-timeout-ms", DEADLINE_MS],
        &reference_env(&root, &seeds, &[("REDIS_TYPE", "cluster")]),
    );
    let mut client = connect(&server).await;
    away_from_day_edge().await;

    // Two addresses whose counters live in different slots.
    let values: Vec<String> = (0..50).map(|i| format!("10.1.0.{i}")).collect();
    let name = |v: &str| today(&format!("edge_remote_address_{v}"));
    let a = &values[0];
    let b = values
        .iter()
        .find(|v| cluster.slot(name(v).as_bytes()) != cluster.slot(name(a).as_bytes()))
        .unwrap();
    let get = |key: String| -> Option<String> {
        cluster
            .owner(key.as_bytes())
            .query(redis::cmd("GET").arg(&key))
            .unwrap()
    };
    let answer = ask(&mut client, simple("edge", "remote_address", a)).await;
    assert_eq!(answer.overall_code, OK);
    assert_eq!(get(name(a)).as_deref(), Some("1"));

    // b is full (a reference pod counted 3): the request is denied and a's debit refunded.
    let () = cluster
        .owner(name(b).as_bytes())
        .query(redis::cmd("SET").arg(name(b)).arg("3"))
        .unwrap();
    let both = request(
        "edge",
        vec![
            descriptor(&[("remote_address", a)]),
            descriptor(&[("remote_address", b)]),
        ],
    );
    let answer = ask(&mut client, both).await;
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(get(name(a)).as_deref(), Some("1"));
    assert_eq!(get(name(b)).as_deref(), Some("3"));
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}

/// The operator console sees and changes the shared counter itself: inspection reports the
/// reference's name and count (a reference pod's debits included), reset deletes it, and
/// set-remaining leaves the reference's integer for that many requests.
#[tokio::test]
async fn console_works_on_shared_counters() {
    use floodgate::console::client::{self, Call};
    use floodgate::console::{BucketEntry, BucketRequest, Inspection};
    const TOKEN: &str = "s3cret-token";
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let limits = tmp.path().join("limits.yaml");
    std::fs::write(&limits, EDGE).unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let url = redis.url();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--default-algorithm",
        "fixed_window",
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        DEADLINE_MS,
        "--reference-counters",
        "--reference-key-prefix",
        "rl_",
        "--admin-token-file",
        token.to_str().unwrap(),
    ]);
    connect(&server).await;
    let mut conn = redis.connection().await;
    away_from_day_edge().await;
    let name = today("edge_remote_address_10.0.0.1");
    let () = conn.set(&name, "2").await.unwrap();
    let bucket = BucketRequest {
        domain: "edge".into(),
        entries: vec![BucketEntry {
            key: "remote_address".into(),
            value: "10.0.0.1".into(),
        }],
        ..Default::default()
    };
    let console = |call: Call, request: BucketRequest| {
        let addr = server.http;
        async move {
            let (status, body) =
                client::send(&format!("http://{addr}"), call, &request, Some(TOKEN))
                    .await
                    .unwrap();
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<Inspection>(&body).unwrap()
        }
    };
    let seen = console(Call::Get, bucket.clone()).await;
    assert_eq!(seen.buckets.len(), 1, "{seen:?}");
    assert_eq!(seen.buckets[0].key, name);
    assert_eq!(seen.buckets[0].remaining, 1);

    let reset = console(Call::Reset, bucket.clone()).await;
    assert_eq!(reset.buckets[0].remaining, 3);
    let exists: bool = conn.exists(&name).await.unwrap();
    assert!(!exists, "reset left the shared counter");

    let mut set = bucket.clone();
    set.remaining = Some(1);
    let after = console(Call::Set, set).await;
    assert_eq!(after.buckets[0].remaining, 1);
    let held: String = conn.get(&name).await.unwrap();
    assert_eq!(held, "2");
}

/// Two limits of 100,000 a day: `shared` is a counter reference pods count too; `own`, with a
/// `unit_multiplier` the reference has no counter for, keeps floodgate's own key.
const HOT: &str = r#"
domain: hot
descriptors:
  - key: shared
    rate_limit: {unit: day, requests_per_unit: 100000}
  - key: own
    rate_limit: {unit: day, requests_per_unit: 100000, unit_multiplier: 2}
"#;

/// `calls` requests on `key`, 16 at a time, all answered OK.
async fn hammer(client: &RateLimitServiceClient<Channel>, key: &'static str, calls: usize) {
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                for _ in 0..calls / 16 {
                    let answer = ask(&mut client, simple("hot", key, "v")).await;
                    assert_eq!(answer.overall_code, OK);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// In reference mode leases stay on (the default fraction), but a counter shared with
/// reference pods is never leased: hammered hot, it holds exactly the requests admitted, with
/// no lease taken; a limit the reference has no counter for is leased as anywhere else.
#[tokio::test]
async fn a_shared_counter_is_never_leased() {
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("hot.yaml"), HOT).unwrap();
    let root = tmp.path().to_str().unwrap().to_string();
    let url = redis.address();
    let server = Floodgate::start_with_env(
        &["--redis-timeout-ms", DEADLINE_MS],
        &reference_env(&root, &url, &[]),
    );
    let client = connect(&server).await;
    let mut conn = redis.connection().await;
    away_from_day_edge().await;

    hammer(&client, "shared", 800).await;
    let held: String = conn.get(today("hot_shared_v")).await.unwrap();
    assert_eq!(
        held, "800",
        "the shared counter holds more than was admitted"
    );
    let acquired = support::http::metric(server.http, "floodgate_lease_acquired_total").await;
    assert_eq!(acquired.unwrap_or(0.0), 0.0, "a shared counter was leased");

    hammer(&client, "own", 800).await;
    let acquired = support::http::metric(server.http, "floodgate_lease_acquired_total").await;
    assert!(
        acquired.unwrap_or(0.0) > 0.0,
        "a hot limit of floodgate's own was not leased"
    );
}

/// Envoy Gateway's usage-based limit against the binary started as Envoy Gateway starts it
/// (the reference's environment: fixed windows, the reference's counters in Redis): 100 tokens
/// a minute, each request a `hits_addend: 0` check then a `hits_addend: 37` charge; exactly
/// the first 3 checks pass, and the reference's counter holds every charge (111).
#[tokio::test]
async fn usage_charges_hold_as_the_reference_counts_them() {
    const TOKENS: &str = r#"
domain: envoy-gateway
descriptors:
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let redis = RedisServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let root = runtime_tree(tmp.path());
    std::fs::write(tmp.path().join("ratelimit/config/eg.yaml"), TOKENS).unwrap();
    let url = redis.address();
    let server = Floodgate::start_with_env(
        &["--redis-timeout-ms", DEADLINE_MS],
        &reference_env(&root, &url, &[]),
    );
    let mut client = connect(&server).await;
    let mut conn = redis.connection().await;
    // The eight requests and the counter's name share one minute window.
    support::eventually("a minute with 10 s left", || async { now_secs() % 60 < 50 }).await;
    let minute = now_secs() / 60 * 60;
    let usage = |hits| {
        let mut check = descriptor(&[("tokens", "client")]);
        check.hits_addend = Some(hits);
        request("envoy-gateway", vec![check])
    };
    let mut admitted = Vec::new();
    for _ in 0..8 {
        let check = ask(&mut client, usage(0)).await;
        admitted.push(check.overall_code == OK);
        if check.overall_code == OK {
            // Envoy ignores the answer to the charge it sends when the stream is done.
            ask(&mut client, usage(37)).await;
        }
    }
    assert_eq!(
        admitted,
        [true, true, true, false, false, false, false, false]
    );
    let held: String = conn
        .get(format!("rl_envoy-gateway_tokens_client_{minute}"))
        .await
        .unwrap();
    assert_eq!(held, "111");
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}
