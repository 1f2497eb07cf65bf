//! Hot reload of the limits: edits, new and deleted files, Kubernetes ConfigMap swaps, bad
//! edits, a single watched file. (No failed request while reloads happen under load, with the
//! last valid limits in force after every change: tests/faults.rs.)
//!
//! Every wait polls (every 20 ms, up to 10 s) for what a client can observe — the limit in a
//! ShouldRateLimit answer, or a load counted in the metrics — never sleeps a fixed time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::configmap::{invalid, limits, replace};
use support::process::Floodgate;
use support::volume::Volume;
use support::*;
use tonic::transport::Channel;

/// How long a reload may take to show before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);
/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

/// A check-only request (debits nothing) for `k=v` in `domain`.
fn probe(domain: &str) -> RateLimitRequest {
    request(domain, vec![with_hits(descriptor(&[("k", "v")]), 0)])
}

/// The limit a server answers with for `k=v` in `domain`; `None` for a bare OK (no rule).
async fn limit_of(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
) -> Result<Option<u32>, tonic::Status> {
    let response = client.should_rate_limit(probe(domain)).await?.into_inner();
    assert_eq!(response.overall_code, 1, "{response:?}");
    Ok(response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit))
}

/// Polls until `domain`'s limit is `expected`.
async fn until_limit(server: &TestServer, domain: &str, expected: Option<u32>) {
    let mut client = server.client().await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let got = limit_of(&mut client, domain).await.unwrap();
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{domain}: limit {got:?}, expected {expected:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `floodgate_config_loads_total{result=…}` (`success` or `error`).
fn loads(server: &TestServer, result: &str) -> u64 {
    server.metric(&format!(
        "floodgate_config_loads_total{{result=\"{result}\"}}"
    ))
}

/// Polls until `floodgate_config_loads_total{result}` exceeds `before`.
async fn until_loads_above(server: &TestServer, result: &str, before: u64) {
    let deadline = Instant::now() + DEADLINE;
    while loads(server, result) <= before {
        assert!(Instant::now() < deadline, "no {result} load after {before}");
        tokio::time::sleep(POLL).await;
    }
}

/// Editing a file in a watched directory puts its new limit in force, and runs the hook.
#[tokio::test]
async fn edited_file_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.yaml");
    fs::write(&file, limits("d", 10)).unwrap();
    let server = TestServer::watching(dir.path()).start().await;
    until_limit(&server, "d", Some(10)).await;

    // In place, as `echo > file` or a simple editor does.
    fs::write(&file, limits("d", 20)).unwrap();
    until_limit(&server, "d", Some(20)).await;
    // Counted after the swap that put the limits in force.
    eventually("the reload counted", || async {
        server.reloads.load(Ordering::SeqCst) >= 1
    })
    .await;
    // /rlconfig lists the limits in force.
    let listing = support::http::call(server.http_addr, "GET", "/rlconfig", None).await;
    assert!(listing.body.contains("d.k: 20/minute"), "{}", listing.body);
    server.stop().await;
}

/// A new file's domain is served after a reload; a deleted file's domain becomes unknown.
#[tokio::test]
async fn added_and_deleted_files_are_followed() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), limits("a", 1)).unwrap();
    let server = TestServer::watching(dir.path()).start().await;
    until_limit(&server, "b", None).await;

    fs::write(dir.path().join("b.yaml"), limits("b", 2)).unwrap();
    until_limit(&server, "b", Some(2)).await;

    fs::remove_file(dir.path().join("a.yaml")).unwrap();
    until_limit(&server, "a", None).await;
    until_limit(&server, "b", Some(2)).await;
    server.stop().await;
}

/// A Kubernetes ConfigMap update (new `..2026_02`, `..data` swapped by rename) is reloaded.
#[tokio::test]
async fn configmap_swap_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = Volume::new(dir.path(), &[("limits.yaml", &limits("d", 10))]);
    let server = TestServer::watching(dir.path()).start().await;
    until_limit(&server, "d", Some(10)).await;

    map.update(&[("limits.yaml", &limits("d", 30))]);
    until_limit(&server, "d", Some(30)).await;
    server.stop().await;
}

/// A bad edit is counted as an error and the previous limits stay in force; a good edit
/// after it is loaded.
#[tokio::test]
async fn bad_edit_keeps_previous_limits() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.yaml");
    fs::write(&file, limits("d", 10)).unwrap();
    let server = TestServer::watching(dir.path()).start().await;

    for bad in [invalid("d"), "domain: d\ndescriptors: [\n".to_string()] {
        let errors = loads(&server, "error");
        fs::write(&file, bad).unwrap();
        until_loads_above(&server, "error", errors).await;
        let mut client = server.client().await;
        assert_eq!(limit_of(&mut client, "d").await.unwrap(), Some(10));
        assert!(
            server
                .metrics
                .encode()
                .contains("floodgate_config_last_reload_success 0")
        );
    }

    fs::write(&file, limits("d", 40)).unwrap();
    until_limit(&server, "d", Some(40)).await;
    // Recorded after the swap that put the limits in force.
    eventually("floodgate_config_last_reload_success 1", || async {
        server
            .metrics
            .encode()
            .contains("floodgate_config_last_reload_success 1")
    })
    .await;
    server.stop().await;
}

/// A single watched file replaced by rename (as editors and tools do) is reloaded; siblings
/// are not its concern.
#[tokio::test]
async fn single_file_replaced_by_rename_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.yaml");
    fs::write(&file, limits("d", 10)).unwrap();
    // A sibling that is not part of the configuration, even when broken.
    fs::write(dir.path().join("other.yaml"), "not: [valid").unwrap();
    let server = TestServer::watching(&file).start().await;

    replace(&file, &limits("d", 50));
    until_limit(&server, "d", Some(50)).await;
    // Then edited in place.
    fs::write(&file, limits("d", 60)).unwrap();
    until_limit(&server, "d", Some(60)).await;
    assert_eq!(loads(&server, "error"), 0);
    server.stop().await;
}

/// A single file inside a ConfigMap volume (`limits.yaml -> ..data/limits.yaml`) follows the
/// `..data` swap.
#[tokio::test]
async fn single_file_in_configmap_follows_the_swap() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = Volume::new(dir.path(), &[("limits.yaml", &limits("d", 10))]);
    let server = TestServer::watching(&dir.path().join("limits.yaml"))
        .start()
        .await;

    map.update(&[("limits.yaml", &limits("d", 70))]);
    until_limit(&server, "d", Some(70)).await;
    server.stop().await;
}

/// A deleted limits directory leaves the previous limits in force; when it is created again
/// it is loaded.
#[tokio::test]
async fn deleted_directory_keeps_limits_until_it_returns() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("limits");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("d.yaml"), limits("d", 10)).unwrap();
    let server = TestServer::watching(&dir).start().await;

    let errors = loads(&server, "error");
    fs::remove_dir_all(&dir).unwrap();
    until_loads_above(&server, "error", errors).await;
    until_limit(&server, "d", Some(10)).await;

    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("d.yaml"), limits("d", 80)).unwrap();
    until_limit(&server, "d", Some(80)).await;
    // Watched again: a later edit is seen too.
    fs::write(dir.join("d.yaml"), limits("d", 90)).unwrap();
    until_limit(&server, "d", Some(90)).await;
    server.stop().await;
}

/// `floodgate serve` reloads by default, and a reload clears the Redis over-limit cache: a
/// bucket denied under the old limit is admitted at once under a raised one.
#[tokio::test]
async fn serve_reloads_and_clears_the_over_limit_cache() {
    let redis = support::redis::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.yaml");
    let fixed = |rpu: u32| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {rpu}, algorithm: fixed_window}}\n"
        )
    };
    fs::write(&file, fixed(1)).unwrap();
    let url = redis.url();
    let process = Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", process.grpc))
        .await
        .unwrap();
    let mut ask = async move || {
        client
            .should_rate_limit(simple("d", "k", "v"))
            .await
            .unwrap()
            .into_inner()
            .overall_code
    };
    assert_eq!(ask().await, 1);
    assert_eq!(ask().await, 2);
    // Denied again, now by the local cache without asking Redis.
    assert_eq!(ask().await, 2);
    let metrics = support::http::call(process.http, "GET", "/metrics", None).await;
    assert!(
        metrics
            .body
            .contains("floodgate_local_cache_over_limit_total 1"),
        "{}",
        metrics.body
    );

    fs::write(&file, fixed(1000)).unwrap();
    // Left in the cache, the denial would last until the end of the day.
    let deadline = Instant::now() + DEADLINE;
    while ask().await != 1 {
        assert!(Instant::now() < deadline, "still denied after the reload");
        tokio::time::sleep(POLL).await;
    }
    let listing = support::http::call(process.http, "GET", "/rlconfig", None).await;
    assert!(listing.body.contains("d.k: 1000/day"), "{}", listing.body);

    let (exit, log) = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    assert!(log.contains("watching limits for changes"), "{log}");
    assert!(log.contains("limits reloaded"), "{log}");
}

/// `--watch-config=false` starts no watcher (and says so).
#[tokio::test]
async fn watch_config_false_turns_reload_off() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("d.yaml"), limits("d", 10)).unwrap();
    let process = Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--watch-config=false",
    ]);
    let (exit, log) = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    assert!(log.contains("limits hot reload off"), "{log}");
    assert!(!log.contains("watching limits"), "{log}");
}

/// A `max_wait` that `--grpc-request-timeout` would cut (floodgate cancels the held call first)
/// is warned of at start-up and again when a reload brings one; shorter ones are not, and the
/// limits are served either way.
#[tokio::test]
async fn waits_beyond_the_request_timeout_are_warned_of() {
    const WARNING: &str = "max_wait is not shorter than --grpc-request-timeout";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.yaml");
    let shaped = |key: &str, wait: &str| {
        format!(
            "  - key: {key}\n    rate_limit: {{unit: second, requests_per_unit: 10, max_wait: {wait}}}\n"
        )
    };
    let start = format!(
        "domain: d\ndescriptors:\n{}{}",
        shaped("long", "1s"),
        shaped("short", "500ms")
    );
    fs::write(&file, start).unwrap();
    let process = Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--grpc-request-timeout",
        "1",
        "--max-wait-for-overrides",
        "2s",
    ]);
    let line = process.log_line(WARNING).expect("no warning at start-up");
    assert!(
        line.contains("d.long") && line.contains("max_wait=1s"),
        "{line}"
    );
    assert!(line.contains("grpc_request_timeout=1s"), "{line}");
    assert_eq!(process.log_count(WARNING), 1);
    let overrides = process
        .log_line("--max-wait-for-overrides is not shorter than --grpc-request-timeout")
        .expect("no warning for --max-wait-for-overrides");
    assert!(overrides.contains("max_wait=2s"), "{overrides}");
    let mut client = RateLimitServiceClient::connect(format!("http://{}", process.grpc))
        .await
        .unwrap();
    let answer = client.should_rate_limit(simple("d", "long", "v")).await;
    assert_eq!(answer.unwrap().into_inner().overall_code, 1);

    // A reload warns of what the new limits hold: one more line, for the new rule.
    let reloaded = format!(
        "domain: d\ndescriptors:\n{}{}",
        shaped("short", "500ms"),
        shaped("longer", "3s")
    );
    fs::write(&file, reloaded).unwrap();
    let deadline = Instant::now() + DEADLINE;
    while process.log_count(WARNING) < 2 {
        assert!(Instant::now() < deadline, "no warning after the reload");
        tokio::time::sleep(POLL).await;
    }
    let (exit, log) = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    let warned: Vec<&str> = log.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(warned.len(), 2, "{log}");
    assert!(
        warned[1].contains("d.longer") && warned[1].contains("max_wait=3s"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains(WARNING) && l.contains("d.short")),
        "{log}"
    );
}
