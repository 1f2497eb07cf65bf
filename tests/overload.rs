//! Overload and floods: bounded requests in flight (refused at once, never queued), limits
//! that keep limiting under policy `local` while Redis is overloaded, the gRPC
//! message cap, the request caps, and random-key floods that keep the memory store and the
//! local over-limit cache within their bounds (read from `/metrics`, as an operator would).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use floodgate::clock::ManualClock;
use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use floodgate::telemetry::metrics::Metrics;
use support::held::HeldStore;
use support::http::{metric, post_json};
use support::load::{ms, report};
use support::process::Floodgate;
use support::redis::RedisServer;
use support::*;

const LIMITS: &str = support::limits::D_K_100_PER_MINUTE;

/// With two requests held in the store and --max-in-flight 2, a third (gRPC or /json) is
/// refused at once with RESOURCE_EXHAUSTED / 503 and counted; once released, requests succeed.
#[tokio::test]
async fn beyond_max_in_flight_is_refused_at_once() {
    let store = HeldStore::every_call(Arc::new(ManualClock::new(START_US)));
    let metrics = Arc::new(Metrics::new());
    let server = TestServer::with(LIMITS)
        .store(store.clone(), metrics.clone())
        .tuning(Tuning {
            max_in_flight: Some(2),
            ..Tuning::default()
        })
        .start()
        .await;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let addr = server.grpc_addr;
            tokio::spawn(async move {
                let mut client =
                    floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::connect(
                        format!("http://{addr}"),
                    )
                    .await
                    .unwrap();
                client.should_rate_limit(simple("d", "k", &i.to_string())).await
            })
        })
        .collect();
    store.arrived().await;
    store.arrived().await;

    let refused = server.ask_err(simple("d", "k", "third")).await;
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("--max-in-flight"), "{refused:?}");
    let body = r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "j"}]}]}"#;
    let json = post_json(server.http_addr, body).await;
    assert_eq!(json.status, 503, "{}", json.body);
    assert!(json.body.contains("overloaded"), "{}", json.body);
    assert!(
        metrics
            .encode()
            .contains(r#"floodgate_requests_total{result="overloaded"} 2"#),
        "{}",
        metrics.encode()
    );

    store.release_all();
    for request in held {
        let response = request.await.unwrap().expect("held request answered");
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    assert_eq!(
        server.ask(simple("d", "k", "after")).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(post_json(server.http_addr, body).await.status, 200);
    server.stop().await;
}

/// A request above --grpc-max-message-bytes is refused with the status tonic gives
/// (OUT_OF_RANGE), and the server keeps serving, on the same connection too.
#[tokio::test]
async fn oversized_grpc_request_is_refused() {
    let metrics = Arc::new(Metrics::new());
    let store = HeldStore::every_call(Arc::new(ManualClock::new(START_US)));
    store.release_all();
    let server = TestServer::with(LIMITS)
        .store(store, metrics)
        .tuning(Tuning {
            grpc_max_message_bytes: Some(1024),
            ..Tuning::default()
        })
        .start()
        .await;
    let mut client = server.client().await;
    let huge = "x".repeat(2048);
    let refused = client
        .should_rate_limit(simple("d", "k", &huge))
        .await
        .expect_err("an oversized request is refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let small = client
        .should_rate_limit(simple("d", "k", "v"))
        .await
        .unwrap();
    assert_eq!(small.into_inner().overall_code, Code::Ok as i32);
    assert_eq!(
        server.ask(simple("d", "k", "w")).await.overall_code,
        Code::Ok as i32
    );
    server.stop().await;
}

/// Requests waiting for the store keep their bytes charged to --max-in-flight-bytes (their
/// entries are slices of the request's buffer): with two 50 KiB requests held and a budget of
/// 128 KiB, a 40 KiB request is refused with RESOURCE_EXHAUSTED, counted as overloaded; once
/// they are answered it is answered too.
#[tokio::test]
async fn requests_held_by_the_store_keep_their_bytes_charged() {
    let store = HeldStore::every_call(Arc::new(ManualClock::new(START_US)));
    let metrics = Arc::new(Metrics::new());
    let server = TestServer::with(LIMITS)
        .store(store.clone(), metrics.clone())
        .tuning(Tuning {
            max_in_flight_bytes: Some(128 * 1024),
            ..Tuning::default()
        })
        .start()
        .await;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let addr = server.grpc_addr;
            let value = format!("{i}{}", "v".repeat(50 * 1024));
            tokio::spawn(async move {
                let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
                    .await
                    .unwrap();
                client.should_rate_limit(simple("d", "k", &value)).await
            })
        })
        .collect();
    store.arrived().await;
    store.arrived().await;
    let medium = simple("d", "k", &"m".repeat(40 * 1024));
    let refused = server.ask_err(medium.clone()).await;
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("--max-in-flight-bytes"),
        "{refused:?}"
    );
    assert!(
        metrics
            .encode()
            .contains(r#"floodgate_requests_total{result="overloaded"} 1"#),
        "{}",
        metrics.encode()
    );
    store.release_all();
    for request in held {
        let response = request.await.unwrap().expect("held request answered");
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    assert_eq!(server.ask(medium).await.overall_code, Code::Ok as i32);
    server.stop().await;
}

/// Limits of the spawned-binary tests: `k` is generous, `once` admits one hit per hour.
const FLOOD_LIMITS: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n  - key: once\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// `floodgate serve` on [`FLOOD_LIMITS`] with `args`; the limits directory lives as long as
/// the returned guard.
fn serve(args: &[&str]) -> (Floodgate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), FLOOD_LIMITS).unwrap();
    let mut all = vec!["--config", dir.path().to_str().unwrap()];
    all.extend_from_slice(args);
    (Floodgate::start(&all), dir)
}

/// The value of `series` on `/metrics` (0 when absent).
async fn count(http: SocketAddr, series: &str) -> u64 {
    metric(http, series).await.unwrap_or(0.0) as u64
}

/// Sends `requests(w, i)` for `i` in `0..per_worker` from each of `workers` concurrent
/// connections; returns every overall code with the request index `i`.
async fn flood(
    grpc: SocketAddr,
    workers: usize,
    per_worker: u64,
    requests: impl Fn(usize, u64) -> RateLimitRequest + Send + Sync + Copy + 'static,
) -> Vec<(u64, i32)> {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        tasks.spawn(async move {
            let mut codes = Vec::new();
            for i in 0..per_worker {
                let response = client.should_rate_limit(requests(w, i)).await.unwrap();
                codes.push((i, response.into_inner().overall_code));
            }
            codes
        });
    }
    tasks.join_all().await.concat()
}

/// A request of `--max-descriptors` (64) descriptors with distinct values on `key`.
fn distinct(key: &str, tag: String) -> RateLimitRequest {
    request(
        "d",
        (0..64)
            .map(|n| descriptor(&[(key, &format!("{tag}-{n}"))]))
            .collect(),
    )
}

/// Past each cap on what Envoy's configuration decides (descriptors, entries, domain) the
/// binary answers INVALID_ARGUMENT naming the flag to raise; at the caps it answers; a key or
/// value past `--max-value-bytes` (what a client decides) is answered, and counted.
#[tokio::test]
async fn request_caps_are_flags_and_name_themselves() {
    let (server, _dir) = serve(&[
        "--max-descriptors",
        "2",
        "--max-entries",
        "2",
        "--max-value-bytes",
        "8",
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let at_caps = request(
        "d",
        vec![
            descriptor(&[("k", "12345678"), ("x", "y")]),
            descriptor(&[("k", "v")]),
        ],
    );
    let response = client.should_rate_limit(at_caps).await.unwrap();
    assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    let beyond = [
        (
            request("d", vec![descriptor(&[("k", "v")]); 3]),
            "--max-descriptors",
        ),
        (
            request("d", vec![descriptor(&[("k", "v"), ("a", "b"), ("c", "d")])]),
            "--max-entries",
        ),
        (simple("domain-9b", "k", "v"), "--max-value-bytes"),
    ];
    for long in [simple("d", "k", "123456789"), simple("d", "key-of-9b", "v")] {
        let response = client.should_rate_limit(long).await.unwrap();
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    for (message, flag) in beyond {
        let refused = client.should_rate_limit(message).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(flag), "{flag}: {refused:?}");
    }
    assert_eq!(
        count(server.http, r#"floodgate_requests_total{result="invalid"}"#).await,
        3
    );
    assert_eq!(
        count(server.http, "floodgate_oversized_values_total").await,
        2
    );
    // Told to the operator at a bounded rate: one line for both, never the value.
    let told = "over --max-value-bytes";
    support::eventually("the oversized value logged", || async {
        server.log_count(told) > 0
    })
    .await;
    assert_eq!(server.log_count(told), 1);
    assert_eq!(server.log_count("123456789"), 0);
    let (exit, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
}

/// The build the figures come from.
fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Distinct values per flood: 2^18 by default (seconds in a debug build);
/// `FLOOD_VALUES=1048576` for the figures of docs/reliability.md.
fn flood_values() -> u64 {
    std::env::var("FLOOD_VALUES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 18)
}

/// A flood of distinct descriptor values (64 per request; 2^18 by default, see
/// [`flood_values`]) through the binary keeps the memory store within --memory-max-buckets:
/// every request answered, and every bucket beyond the bound evicted and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_key_flood_keeps_memory_store_bounded() {
    const WORKERS: u64 = 8;
    let (server, _dir) = serve(&["--memory-max-buckets", "1024"]);
    let started = Instant::now();
    // `once` buckets live an hour: none expires during the flood, each one must be evicted.
    let codes = flood(
        server.grpc,
        WORKERS as usize,
        flood_values() / 64 / WORKERS,
        |w, i| distinct("once", format!("{w}-{i}")),
    )
    .await;
    let elapsed = ms(started, Instant::now());
    let values = codes.len() as u64 * 64;
    assert!(codes.iter().all(|(_, code)| *code == Code::Ok as i32));
    let buckets = count(server.http, "floodgate_memory_buckets").await;
    let evictions = count(server.http, "floodgate_memory_evictions_total").await;
    assert!(buckets <= 1024, "{buckets} buckets");
    assert_eq!(buckets + evictions, values);
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .map(|v| {
            v.trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .unwrap()
        });
    let (exit, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    report(serde_json::json!({
        "scenario": "random-key flood, memory store, --memory-max-buckets 1024",
        "requests": codes.len(),
        "failures": 0,
        "answer": format!("{values} distinct values all answered OK; {buckets} buckets held, {evictions} evicted"),
        "note": format!("{elapsed} ms in a {} build; RSS after {} MiB (not asserted)", build(), rss_kib.unwrap_or(0) / 1024),
    }));
}

/// A flood of distinct values (a quarter of [`flood_values`]) each driven over its limit
/// through Redis keeps the local over-limit cache within --local-cache-size, evictions
/// counted, answers unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_key_flood_keeps_local_cache_bounded() {
    const WORKERS: u64 = 8;
    let redis = RedisServer::start();
    let url = redis.url();
    let (server, _dir) = serve(&[
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
        "--local-cache-size",
        "1000",
    ]);
    let started = Instant::now();
    // Request 2n admits 64 new values; request 2n + 1 repeats them: all denied, all cached.
    let per_worker = flood_values() / 4 / 64 / WORKERS * 2;
    let codes = flood(server.grpc, WORKERS as usize, per_worker, |w, i| {
        distinct("once", format!("{w}-{}", i / 2))
    })
    .await;
    let elapsed = ms(started, Instant::now());
    for (i, code) in &codes {
        let expected = if i % 2 == 0 {
            Code::Ok
        } else {
            Code::OverLimit
        };
        assert_eq!(*code, expected as i32, "request {i}");
    }
    let values = codes.len() as u64 / 2 * 64;
    let entries = count(server.http, "floodgate_local_cache_entries").await;
    let evictions = count(server.http, "floodgate_local_cache_evictions_total").await;
    assert!(entries <= 1000, "{entries} entries");
    assert_eq!(entries + evictions, values);
    let (exit, _) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    report(serde_json::json!({
        "scenario": "random-key flood over limit, Redis, --local-cache-size 1000",
        "requests": codes.len(),
        "failures": 0,
        "answer": format!("{values} distinct values admitted then denied as Redis says; cache {entries} entries, {evictions} evicted"),
        "note": format!("{elapsed} ms in a {} build", build()),
    }));
}

/// Requests decided by the local buckets because their Redis call was shed.
const SHED: &str = r#"floodgate_local_decisions_total{reason="shed"}"#;

/// Limits of the overload tests: `k` admits 100 per second, in bursts of at most 10.
const HUNDRED_PER_SECOND: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 10}\n";

/// With `--on-store-error local`, a 100/s limit offered ten times its rate (and bursts) while
/// Redis keeps stalling (calls shed, timed out, answered by Redis in turn) admits at most its rate
/// over the run plus one burst from Redis's bucket and one from the local one; the requests
/// decided locally are counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_keeps_limiting_while_redis_is_overloaded() {
    const RATE: u64 = 100;
    const BURST: u64 = 10;
    let redis = RedisServer::start();
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), HUNDRED_PER_SECOND).unwrap();
    let server = Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--redis-url",
        &url,
        "--on-store-error",
        "local",
        // The local over-limit cache would answer most denials alone; off, every request
        // goes to Redis or to the local buckets.
        "--local-cache-size",
        "0",
        // Calls sent to a frozen Redis hold their places for 200 ms (not 10), so the burst
        // finds the bound full, and the calls queued behind it (no deadline of their own)
        // wait those 200 ms and are shed.
        "--redis-timeout-ms",
        "200",
        // The breaker stays closed: timed-out calls to the frozen Redis would otherwise open
        // it, and requests answered because the circuit is open never reach the bound.
        "--redis-failure-threshold",
        "1000000000",
    ]);
    let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut requests = tokio::task::JoinSet::new();
    let mut ticker = tokio::time::interval(std::time::Duration::from_millis(1));
    // Ten times the rate for three seconds, and a burst of 200 at once as Redis stalls for
    // 150 of every 300 requests: more calls than the bound and its queue hold, so some are
    // shed.
    let send = |requests: &mut tokio::task::JoinSet<()>| {
        let (mut client, ok) = (client.clone(), ok.clone());
        requests.spawn(async move {
            let request = request("d", vec![descriptor(&[("k", "v")])]);
            if let Ok(response) = client.should_rate_limit(request).await
                && response.into_inner().overall_code == Code::Ok as i32
            {
                ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
    };
    for i in 0..3_000u32 {
        ticker.tick().await;
        if i % 300 == 0 {
            redis.freeze();
            for _ in 0..200 {
                send(&mut requests);
            }
            if i == 0 {
                // The first stall lasts until calls were shed, however slowly a loaded host
                // delivers the burst: more requests join it until the bound overflows.
                let give_up = Instant::now() + support::EVENTUALLY;
                while count(server.http, SHED).await == 0 {
                    assert!(
                        Instant::now() < give_up,
                        "no call was shed in the first stall"
                    );
                    for _ in 0..50 {
                        send(&mut requests);
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        } else if i % 300 == 150 {
            redis.thaw();
        }
        send(&mut requests);
    }
    redis.thaw();
    requests.join_all().await;
    let elapsed = started.elapsed();
    let ok = ok.load(std::sync::atomic::Ordering::Relaxed);
    let bound = RATE * elapsed.as_millis() as u64 / 1_000 + 2 * BURST;
    let shed = count(server.http, SHED).await;
    let failed = count(
        server.http,
        r#"floodgate_local_decisions_total{reason="store_error"}"#,
    )
    .await;
    let metrics = format!("shed locally {shed}, failed over locally {failed}");
    eprintln!("{ok} admitted in {elapsed:?} (bound {bound}); {metrics}");
    assert!(shed > 0, "calls were shed and decided locally: {metrics}");
    assert!(
        ok <= bound,
        "{ok} admitted in {elapsed:?}: more than {bound} ({RATE}/s + 2 × {BURST}); {metrics}"
    );
    assert!(ok > 0);
    server.stop().await;
}

/// A flood of console bucket reads (64 clients at once) while gRPC requests keep coming:
/// the reads beyond the console's few places are refused at once (503, "console busy"),
/// every gRPC request is answered by Redis, and Redis's circuit breaker never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_flood_neither_starves_grpc_nor_opens_the_breaker() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let redis = RedisServer::start();
    let url = redis.url();
    // A deadline a loaded test host always meets: this is about places, not speed.
    // The pool's checkout waits at most the connect timeout (250 ms by default), which a
    // loaded host misses while the pool's connections are being opened: 5 s.
    let (server, _dir) = serve(&[
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
        "--redis-connect-timeout-ms",
        "5000",
    ]);
    let http = server.http;
    let stop = Arc::new(AtomicBool::new(false));
    // Reads answered and refused so far, over all flooding clients.
    let (read, busy) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (stop, read, busy) = (stop.clone(), read.clone(), busy.clone());
        flood.spawn(async move {
            let body = r#"{"domain":"d","entries":[{"key":"k","value":"v"}]}"#;
            while !stop.load(Ordering::Relaxed) {
                let response = support::http::call(http, "POST", "/buckets/get", Some(body)).await;
                match response.status {
                    200 => read.fetch_add(1, Ordering::Relaxed),
                    503 if response.body.contains("console busy") => {
                        busy.fetch_add(1, Ordering::Relaxed)
                    }
                    // The store's own answer on a loaded test host, not the console's bound.
                    503 if response.body.contains("store unavailable") => 0,
                    other => panic!("{other}: {}", response.body),
                };
            }
        });
    }
    // The flood under way before the probes: reads answered, and reads beyond the console's
    // places refused (waited for: how many fit in a fixed stretch depends on the machine).
    eventually(
        "console reads answered, and some refused as busy",
        || async { read.load(Ordering::Relaxed) > 0 && busy.load(Ordering::Relaxed) > 0 },
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    for i in 0..200 {
        let probe = request("d", vec![descriptor(&[("k", &format!("probe-{i}"))])]);
        let response = client
            .should_rate_limit(probe)
            .await
            .expect("probe answered");
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    stop.store(true, Ordering::Relaxed);
    flood.join_all().await;
    assert_eq!(server.log_count("circuit open"), 0, "the breaker opened");
    assert_eq!(count(http, "floodgate_store_available").await, 1);
    assert_eq!(
        count(http, r#"floodgate_requests_total{result="store_error"}"#).await,
        0
    );
    server.stop().await;
}

/// The adaptive bound on calls to Redis is on `/metrics`: with shedding on (the default) it
/// is within its range, with nobody waiting on an idle server; with
/// `--redis-shedding false` there is no bound and it reads 0.
#[tokio::test]
async fn the_bound_on_calls_to_redis_is_on_metrics() {
    use floodgate::store::shed::{MAX_LIMIT, MIN_LIMIT};
    let redis = RedisServer::start();
    let url = redis.url();
    let (server, _dir) = serve(&["--redis-url", &url, "--redis-timeout-ms", "2000"]);
    let http = server.http;
    let bound = metric(http, "floodgate_redis_calls_bound")
        .await
        .expect("floodgate_redis_calls_bound is served") as u64;
    assert!((MIN_LIMIT..=MAX_LIMIT).contains(&bound), "{bound}");
    assert_eq!(
        metric(http, "floodgate_redis_calls_waiting").await,
        Some(0.0)
    );
    server.stop().await;

    let (off, _dir) = serve(&["--redis-url", &url, "--redis-shedding", "false"]);
    assert_eq!(
        metric(off.http, "floodgate_redis_calls_bound").await,
        Some(0.0)
    );
    off.stop().await;
}

/// The host's scheduling delay is on `/metrics`: the runtime threads' probes publish it, it
/// is read at every scrape, and it is a delay in seconds (positive once a probe has sampled
/// for calls to Redis, under a second on a server that is not even busy).
#[tokio::test]
async fn the_hosts_delay_is_on_metrics() {
    let redis = RedisServer::start();
    // A call must not fail for the 10 ms default deadline on a loaded machine: this is about
    // the probe's metric.
    let (server, _dir) = serve(&[
        "--redis-url",
        &redis.url(),
        "--grpc-threads",
        "2",
        "--redis-timeout-ms",
        "1000",
    ]);
    let http = server.http;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    let delay = loop {
        // A probe samples while its thread makes calls to Redis (idle, it parks): one call
        // wakes the probe of the thread serving this connection.
        client
            .should_rate_limit(simple("d", "k", "v"))
            .await
            .unwrap();
        let delay = metric(http, "floodgate_host_delay_seconds")
            .await
            .expect("floodgate_host_delay_seconds is served");
        // Each probe samples every 5 ms; the first samples may not be in yet.
        if delay > 0.0 || Instant::now() > deadline {
            break delay;
        }
        tokio::task::yield_now().await;
    };
    assert!(delay > 0.0, "a probe's delay was published: {delay}");
    assert!(
        delay < 1.0,
        "an idle server's delay is well under a second: {delay}"
    );
    server.stop().await;
}
