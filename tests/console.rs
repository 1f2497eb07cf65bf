//! The operator console's API over real HTTP against the real binary: inspection debits
//! nothing, reset and set-remaining change what ShouldRateLimit answers next, the token
//! rules, and the `floodgate bucket` CLI — on the memory store and on a real Redis.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;

use floodgate::console::client::{self, Call};
use floodgate::console::{BucketEntry, BucketRequest, Inspection};
use support::http;
use support::process::Floodgate;
use support::redis::RedisServer;

const LIMITS: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 4, algorithm: sliding_window}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 3}
      - {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
";

const TOKEN: &str = "s3cret-token";

/// A server on `store_args` with the limits above and the admin token in a file.
fn start(dir: &Path, store_args: &[&str], extra: &[&str]) -> Floodgate {
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let mut args = vec![
        "--config",
        limits.to_str().unwrap(),
        "--admin-token-file",
        token.to_str().unwrap(),
    ];
    args.extend_from_slice(store_args);
    args.extend_from_slice(extra);
    Floodgate::start(&args)
}

fn request(key: &str, value: &str) -> BucketRequest {
    BucketRequest {
        domain: "shop".into(),
        entries: vec![BucketEntry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

/// One ShouldRateLimit over `POST /json`; returns its HTTP status (200 OK, 429 over).
async fn hit(addr: SocketAddr, key: &str, value: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    );
    http::post_json(addr, &body).await.status
}

/// `GET /console/state` (`query`: `?after=…` and the like) with the admin token.
async fn dashboard_state(addr: SocketAddr, query: &str) -> http::HttpResponse {
    let bearer = format!("Bearer {TOKEN}");
    let path = format!("/console/state{query}");
    http::call_with(addr, "GET", &path, &[("Authorization", &bearer)], None).await
}

async fn console(addr: SocketAddr, call: Call, request: &BucketRequest) -> Inspection {
    let (status, body) = client::send(&format!("http://{addr}"), call, request, Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn remaining(addr: SocketAddr, key: &str, value: &str) -> u64 {
    let inspection = console(addr, Call::Get, &request(key, value)).await;
    assert_eq!(inspection.buckets.len(), 1, "{inspection:?}");
    inspection.buckets[0].remaining
}

/// The behaviour every store must show: inspect, reset, set-remaining, for each algorithm.
async fn console_behaviour(server: &Floodgate, key_prefix: &str) {
    let addr = server.http;
    // Inspection shows what 3 requests left, and debits nothing however often it is asked.
    for _ in 0..3 {
        assert_eq!(hit(addr, "user", "alice").await, 200);
    }
    let inspection = console(addr, Call::Get, &request("user", "alice")).await;
    assert_eq!(inspection.matched, "limited");
    let bucket = &inspection.buckets[0];
    assert_eq!(
        (bucket.remaining, bucket.capacity, bucket.algorithm.as_str()),
        (2, 5, "token_bucket")
    );
    assert!(bucket.key.starts_with(key_prefix), "{}", bucket.key);
    assert!(bucket.reset_us > 0);
    for _ in 0..5 {
        assert_eq!(remaining(addr, "user", "alice").await, 2);
    }
    assert_eq!(hit(addr, "user", "alice").await, 200);
    assert_eq!(hit(addr, "user", "alice").await, 200);
    assert_eq!(hit(addr, "user", "alice").await, 429);
    assert_eq!(remaining(addr, "user", "alice").await, 0);

    // Reset gives the bucket its full capacity back: ShouldRateLimit is OK again.
    let after = console(addr, Call::Reset, &request("user", "alice")).await;
    assert_eq!(after.buckets[0].remaining, 5);
    assert_eq!(hit(addr, "user", "alice").await, 200);
    assert_eq!(remaining(addr, "user", "alice").await, 4);

    // Set-remaining, on every algorithm: exactly that many requests pass next.
    for key in ["user", "fw", "sw"] {
        let mut set = request(key, "bob");
        set.remaining = Some(1);
        let after = console(addr, Call::Set, &set).await;
        assert_eq!(after.buckets[0].remaining, 1, "{key}: {after:?}");
        assert_eq!(hit(addr, key, "bob").await, 200, "{key}");
        assert_eq!(hit(addr, key, "bob").await, 429, "{key}");
        assert_eq!(remaining(addr, key, "bob").await, 0, "{key}");
    }
    // More than the capacity is refused.
    let mut too_many = request("user", "bob");
    too_many.remaining = Some(6);
    let (status, body) = client::send(&format!("http://{addr}"), Call::Set, &too_many, Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");

    // Two limits on one descriptor (in a cluster, likely two slots; split, two Redis): both
    // are inspected and both reset. A minute's refill cannot give a per-second bucket back
    // its 2 tokens within the test, so 1 and 8 left means nothing refilled unnoticed.
    assert_eq!(hit(addr, "multi", "m").await, 200);
    assert_eq!(hit(addr, "multi", "m").await, 200);
    let both = console(addr, Call::Get, &request("multi", "m")).await;
    let left = |inspection: &Inspection| -> Vec<(u64, u64)> {
        inspection
            .buckets
            .iter()
            .map(|b| (b.period_seconds, b.remaining))
            .collect()
    };
    let got = left(&both);
    assert_eq!(got.len(), 2);
    assert!(got[0].1 <= 3 && got[1] == (3600, 8), "{got:?}");
    let reset = console(addr, Call::Reset, &request("multi", "m")).await;
    assert_eq!(left(&reset), vec![(1, 3), (3600, 10)]);

    // A shadow-mode rule is flagged; an unknown descriptor matches nothing.
    let shadow = console(addr, Call::Get, &request("shadow", "x")).await;
    assert!(shadow.buckets[0].shadow);
    let none = console(addr, Call::Get, &request("nope", "x")).await;
    assert_eq!((none.matched.as_str(), none.buckets.len()), ("none", 0));

    // Every mutation is logged with the peer and what it did.
    assert!(server.log_count("console: buckets reset") >= 1);
    assert!(server.log_count("console: buckets set") >= 3);
    assert!(server.log_count("peer=127.0.0.1:") >= 4);
}

/// On the memory store: inspect debits nothing, reset restores capacity, set-remaining sets
/// every algorithm's bucket.
#[tokio::test]
async fn console_works_on_the_memory_store() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    console_behaviour(&server, "shop:user=alice").await;
    server.stop().await;
}

/// Waits until health says SERVING (a Redis store has answered its first probe).
async fn serving(server: &Floodgate) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while http::call(server.http, "GET", "/healthcheck", None)
        .await
        .status
        != 200
    {
        assert!(std::time::Instant::now() < deadline, "never serving");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// In a Redis Cluster: the same, a reset of buckets in different slots included.
#[tokio::test]
async fn console_works_on_redis_cluster() {
    let cluster = support::redis::RedisCluster::start(3, 0);
    let dir = tempfile::tempdir().unwrap();
    let seeds = cluster.seeds().join(",");
    let server = start(
        dir.path(),
        &["--redis-cluster", &seeds, "--redis-timeout-ms", "1000"],
        &[],
    );
    serving(&server).await;
    console_behaviour(&server, "fg:shop:user=alice").await;
    server.stop().await;
}

/// Through Redis Sentinel: the same, on the master the sentinels name.
#[tokio::test]
async fn console_works_through_sentinel() {
    use support::redis::sentinel::{MASTER_NAME, SentinelSetup};
    let setup = SentinelSetup::start_steady(1).await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = setup.node_urls().join(",");
    let server = start(
        dir.path(),
        &[
            "--redis-sentinel",
            MASTER_NAME,
            "--redis-sentinel-nodes",
            &nodes,
            "--redis-timeout-ms",
            "2000",
            "--redis-connect-timeout-ms",
            "2000",
        ],
        &[],
    );
    serving(&server).await;
    console_behaviour(&server, "fg:shop:user=alice").await;
    let exists: i64 = setup
        .master
        .query(redis::cmd("EXISTS").arg("fg:shop:user=alice|tb60"))
        .unwrap();
    assert_eq!(exists, 1);
    server.stop().await;
}

/// With per-second buckets in a Redis of their own: the same; a reset reaches both.
#[tokio::test]
async fn console_works_on_split_redis() {
    let main = RedisServer::start();
    let per_second = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (main_url, per_second_url) = (main.url(), per_second.url());
    let server = start(
        dir.path(),
        &[
            "--redis-url",
            &main_url,
            "--redis-per-second-url",
            &per_second_url,
            "--redis-timeout-ms",
            "1000",
        ],
        &[],
    );
    serving(&server).await;
    console_behaviour(&server, "fg:shop:user=alice").await;
    assert_eq!(hit(server.http, "multi", "n").await, 200);
    let keys = console(server.http, Call::Get, &request("multi", "n")).await;
    let (second, hour) = (&keys.buckets[0].key, &keys.buckets[1].key);
    let exists = |redis: &RedisServer, key: &str| -> i64 {
        redis.query(redis::cmd("EXISTS").arg(key)).unwrap()
    };
    assert_eq!((exists(&per_second, second), exists(&main, hour)), (1, 1));
    console(server.http, Call::Reset, &request("multi", "n")).await;
    assert_eq!((exists(&per_second, second), exists(&main, hour)), (0, 0));
    server.stop().await;
}

/// On a real Redis: the same, and the reported key is the Redis key (with the prefix);
/// a reset deletes it.
#[tokio::test]
async fn console_works_on_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let server = start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            "--redis-key-prefix",
            "fgtest:",
            // A loaded test machine must not turn a slow answer into a store error.
            "--redis-timeout-ms",
            "1000",
        ],
        &[],
    );
    // Serving once Redis has answered a probe.
    let deadline = std::time::Instant::now() + support::EVENTUALLY;
    while http::call(server.http, "GET", "/healthcheck", None)
        .await
        .status
        != 200
    {
        assert!(std::time::Instant::now() < deadline, "Redis never usable");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    console_behaviour(&server, "fgtest:shop:user=alice").await;
    let key = console(server.http, Call::Get, &request("user", "carol"))
        .await
        .buckets[0]
        .key
        .clone();
    assert_eq!(hit(server.http, "user", "carol").await, 200);
    let exists: i64 = redis.query(redis::cmd("EXISTS").arg(&key)).unwrap();
    assert_eq!(exists, 1);
    console(server.http, Call::Reset, &request("user", "carol")).await;
    let exists: i64 = redis.query(redis::cmd("EXISTS").arg(&key)).unwrap();
    assert_eq!(exists, 0);
    server.stop().await;
}

/// Mutations need the bearer token: 401 without one, 403 with a wrong one, and nothing is
/// changed; reads (their bucket keys hold request values) need it whenever a token is
/// configured, and without one are open unless `--admin-read-requires-token`.
#[tokio::test]
async fn mutations_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    let url = format!("http://{}", server.http);
    assert_eq!(hit(server.http, "user", "eve").await, 200);
    let mut set = request("user", "eve");
    set.remaining = Some(5);
    for call in [Call::Reset, Call::Set] {
        let (status, body) = client::send(&url, call, &set, None).await.unwrap();
        assert_eq!(status, 401, "{body}");
        let (status, body) = client::send(&url, call, &set, Some("wrong")).await.unwrap();
        assert_eq!(status, 403, "{body}");
    }
    assert_eq!(remaining(server.http, "user", "eve").await, 4);
    // With a token configured, reads need it too: the dashboard's data and inspection.
    let (status, _) = client::send(&url, Call::Get, &set, None).await.unwrap();
    assert_eq!(status, 401);
    let (status, _) = client::send(&url, Call::Get, &set, Some("wrong"))
        .await
        .unwrap();
    assert_eq!(status, 403);
    assert_eq!(
        http::call(server.http, "GET", "/console/state", None)
            .await
            .status,
        401
    );
    assert_eq!(dashboard_state(server.http, "").await.status, 200);
    server.stop().await;

    // No token file: nobody may change a bucket; reads are open, unless closed by
    // --admin-read-requires-token (which then refuses them all).
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let server = Floodgate::start(&["--config", limits.to_str().unwrap()]);
    let url = format!("http://{}", server.http);
    let (status, _) = client::send(&url, Call::Reset, &set, Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 403);
    let (status, _) = client::send(&url, Call::Get, &set, None).await.unwrap();
    assert_eq!(status, 200);
    server.stop().await;
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--admin-read-requires-token=true",
    ]);
    let url = format!("http://{}", server.http);
    let (status, _) = client::send(&url, Call::Get, &set, None).await.unwrap();
    assert_eq!(status, 401);
    server.stop().await;
}

/// A web page cannot change a bucket through the console, even with the token in hand (a
/// browser's stored credentials, DNS rebinding): a body not declared `application/json` is
/// 415, a foreign `Origin` 403, and the bucket is unchanged; the page's own origin works.
#[tokio::test]
async fn console_writes_refuse_cross_site_requests() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    let addr = server.http;
    for _ in 0..3 {
        assert_eq!(hit(addr, "user", "ann").await, 200);
    }
    let bearer = format!("Bearer {TOKEN}");
    let reset = serde_json::to_string(&request("user", "ann")).unwrap();
    let own = format!("http://{addr}");
    for (path, content_type, origin, status) in [
        ("/buckets/reset", "text/plain", None, 415),
        (
            "/buckets/reset",
            "text/plain",
            Some("http://evil.example"),
            415,
        ),
        ("/buckets/set", "multipart/form-data; boundary=b", None, 415),
        (
            "/buckets/reset",
            "application/json",
            Some("http://evil.example"),
            403,
        ),
        ("/buckets/reset", "application/json", Some("null"), 403),
        ("/buckets/get", "text/plain", None, 415),
    ] {
        let mut headers = vec![("Content-Type", content_type), ("Authorization", &bearer)];
        headers.extend(origin.map(|o| ("Origin", o)));
        let response = http::call_with(addr, "POST", path, &headers, Some(&reset)).await;
        assert_eq!(
            response.status, status,
            "{path} {headers:?}: {}",
            response.body
        );
    }
    assert_eq!(remaining(addr, "user", "ann").await, 2, "nothing was reset");
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
        ("Origin", own.as_str()),
    ];
    let response = http::call_with(addr, "POST", "/buckets/reset", &headers, Some(&reset)).await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(remaining(addr, "user", "ann").await, 5);
    server.stop().await;
}

/// A page that reaches the admin port by DNS rebinding (its own name re-pointed at the port,
/// so `Origin` and `Host` agree) writes nothing, through the console or `/json`, even with
/// the token; a name listed with `--admin-allowed-host` and a client without `Origin` under
/// any name still write.
#[tokio::test]
async fn writes_refuse_dns_rebinding() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &["--admin-allowed-host", "Admin.Internal"]);
    let addr = server.http;
    for _ in 0..3 {
        assert_eq!(hit(addr, "user", "ann").await, 200);
    }
    let bearer = format!("Bearer {TOKEN}");
    let reset = serde_json::to_string(&request("user", "ann")).unwrap();
    let port = addr.port();
    let rebound = format!("evil.example:{port}");
    let rebound_origin = format!("http://{rebound}");
    let refund = r#"{"domain": "shop", "descriptors": [{"entries": [{"key": "user",
        "value": "ann"}], "hits_addend": 3, "is_negative_hits": true}]}"#;
    let browser = [
        ("Host", rebound.as_str()),
        ("Origin", rebound_origin.as_str()),
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ];
    for (path, body) in [("/buckets/reset", reset.as_str()), ("/json", refund)] {
        let response = http::call_with(addr, "POST", path, &browser, Some(body)).await;
        assert_eq!(response.status, 403, "{path}: {}", response.body);
        assert!(
            response.body.contains("--admin-allowed-host"),
            "{}",
            response.body
        );
    }
    assert_eq!(
        remaining(addr, "user", "ann").await,
        2,
        "nothing was given back"
    );
    // curl under the same name (no Origin): not a browser, not refused.
    let curl = [
        ("Host", rebound.as_str()),
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ];
    let response = http::call_with(addr, "POST", "/json", &curl, Some(refund)).await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(
        remaining(addr, "user", "ann").await,
        5,
        "the refund was taken"
    );
    for _ in 0..2 {
        assert_eq!(hit(addr, "user", "ann").await, 200);
    }
    // The listed name, from a browser.
    let listed = format!("admin.internal:{port}");
    let listed_origin = format!("http://{listed}");
    let browser = [
        ("Host", listed.as_str()),
        ("Origin", listed_origin.as_str()),
        ("Content-Type", "application/json"),
        ("Authorization", bearer.as_str()),
    ];
    let response = http::call_with(addr, "POST", "/buckets/reset", &browser, Some(&reset)).await;
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(remaining(addr, "user", "ann").await, 5);
    server.stop().await;
}

/// A new token written to the file is in force without a restart, and the old one is not.
#[tokio::test]
async fn the_token_file_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    let url = format!("http://{}", server.http);
    std::fs::write(dir.path().join("token"), "rotated\n").unwrap();
    let reset = request("user", "dan");
    let deadline = std::time::Instant::now() + support::EVENTUALLY;
    // Polled: the reload follows a file-system event, settled by the watcher.
    while client::send(&url, Call::Reset, &reset, Some("rotated"))
        .await
        .unwrap()
        .0
        != 200
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the new token never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, _) = client::send(&url, Call::Reset, &reset, Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 403);
    server.stop().await;
}

/// `floodgate bucket get|set|reset` round trip against a running server.
#[tokio::test]
async fn cli_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    let admin = format!("http://{}", server.http);
    let token = dir.path().join("token");
    let bucket = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .arg("bucket")
            .args(args)
            .args(["--admin", &admin, "--domain", "shop", "--entry", "user=zoe"])
            .args(["--token-file", token.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), stdout)
    };
    assert_eq!(hit(server.http, "user", "zoe").await, 200);
    let (code, out) = bucket(&["get"]);
    assert_eq!(code, Some(0), "{out}");
    let got: Inspection = serde_json::from_str(&out).unwrap();
    assert_eq!(got.buckets[0].remaining, 4);
    let (code, out) = bucket(&["set", "--remaining", "2"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(remaining(server.http, "user", "zoe").await, 2);
    let (code, out) = bucket(&["reset"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(remaining(server.http, "user", "zoe").await, 5);
    // A refused call exits non-zero.
    std::fs::write(dir.path().join("wrong"), "nope").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["bucket", "reset", "--admin", &admin, "--domain", "shop"])
        .args(["--token-file", dir.path().join("wrong").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    server.stop().await;
}

/// The dashboard is one self-contained page, and its data carries the limits tree, the
/// rule counters that move with traffic, the store and the load history.
#[tokio::test]
async fn dashboard_state_moves_with_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[], &[]);
    let page = http::call(server.http, "GET", "/", None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<script>"));
    // No external resource of any kind.
    for external in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!page.body.contains(external), "{external}");
    }
    let hits =
        |state: &serde_json::Value| state["domains"][0]["rules"][4]["counts"]["hits"].as_u64();
    let read = || async {
        serde_json::from_str::<serde_json::Value>(&dashboard_state(server.http, "").await.body)
            .unwrap()
    };
    let before = read().await;
    assert_eq!(before["domains"][0]["name"], "shop");
    assert_eq!(before["domains"][0]["rules"][4]["path"], "shop.user");
    assert_eq!(
        before["domains"][0]["rules"][4]["limits"][0]["algorithm"],
        "token_bucket"
    );
    assert_eq!(before["store"]["name"], "memory");
    assert_eq!(before["loads"][0]["ok"], true);
    assert_eq!(hits(&before), Some(0));
    for _ in 0..3 {
        hit(server.http, "user", "x").await;
    }
    assert_eq!(hits(&read().await), Some(3));
    server.stop().await;
}

/// With Redis down, the dashboard's data shows the rule's and the domain's errors moving,
/// the store unavailable and the circuit breaker open.
#[tokio::test]
async fn dashboard_shows_store_errors_and_the_breaker() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let server = start(
        dir.path(),
        &["--redis-url", &url, "--redis-timeout-ms", "1000"],
        &[],
    );
    let read = || async {
        serde_json::from_str::<serde_json::Value>(&dashboard_state(server.http, "").await.body)
            .unwrap()
    };
    let deadline = std::time::Instant::now() + support::EVENTUALLY;
    while read().await["store"]["breaker"] != "closed" || hit(server.http, "user", "a").await != 200
    {
        assert!(std::time::Instant::now() < deadline, "Redis never usable");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let state = read().await;
    assert_eq!(
        (&state["store"]["name"], &state["store"]["available"]),
        (&"redis".into(), &true.into())
    );
    redis.stop();
    // Until the breaker opens, requests fail with a store error, counted per rule.
    let deadline = std::time::Instant::now() + support::EVENTUALLY;
    loop {
        assert_eq!(hit(server.http, "user", "a").await, 503);
        let state = read().await;
        let user = &state["domains"][0]["rules"][4];
        assert_eq!(user["path"], "shop.user");
        if user["counts"]["errors"].as_u64() > Some(0) && state["store"]["breaker"] == "open" {
            assert!(state["domains"][0]["counts"]["errors"].as_u64() > Some(0));
            assert_eq!(state["store"]["available"], false);
            // An inspection says Redis is down rather than showing the failure policy's
            // numbers.
            let (status, body) = client::send(
                &format!("http://{}", server.http),
                Call::Get,
                &request("user", "a"),
                Some(TOKEN),
            )
            .await
            .unwrap();
            assert_eq!(status, 503, "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{state}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// `/console/state` is bounded whatever the number of domains: one page of at most 50
/// domains and 500 rules, with the total and where the next page starts; following
/// `next_after` visits every domain once, `filter` narrows by name, a domain with more rules
/// than a page holds shows 500 of them with its total, and a bad `limit` is a 400.
#[tokio::test]
async fn dashboard_state_is_paged() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits");
    std::fs::create_dir(&limits).unwrap();
    let rule = "{unit: minute, requests_per_unit: 5}";
    for i in 0..1_200 {
        let yaml = format!("domain: d{i:04}\ndescriptors:\n  - {{key: ip, rate_limit: {rule}}}\n");
        std::fs::write(limits.join(format!("d{i:04}.yaml")), yaml).unwrap();
    }
    let mut huge = "domain: huge\ndescriptors:\n".to_owned();
    for i in 0..600 {
        huge.push_str(&format!(
            "  - {{key: k, value: v{i}, rate_limit: {rule}}}\n"
        ));
    }
    std::fs::write(limits.join("huge.yaml"), huge).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--admin-token-file",
        token.to_str().unwrap(),
    ]);
    let read = |query: String| async move {
        let response = dashboard_state(server.http, &query).await;
        assert_eq!(response.status, 200, "{}", response.body);
        // One poll stays small however many domains there are.
        assert!(
            response.body.len() < 200_000,
            "{} bytes",
            response.body.len()
        );
        serde_json::from_str::<serde_json::Value>(&response.body).unwrap()
    };
    let first = read(String::new()).await;
    assert_eq!(first["domains"].as_array().unwrap().len(), 50);
    assert_eq!(first["page"]["domains_total"], 1_201);
    assert_eq!(first["page"]["domains_before"], 0);
    assert_eq!(first["page"]["next_after"], "d0049");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = after
            .as_ref()
            .map_or_else(String::new, |a| format!("?after={a}"));
        let page = read(query).await;
        assert_eq!(page["page"]["domains_before"], seen.len());
        for d in page["domains"].as_array().unwrap() {
            seen.push(d["name"].as_str().unwrap().to_owned());
        }
        match page["page"]["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 1_201);
    assert!(seen.is_sorted(), "every domain once, in name order");
    let huge = read("?filter=huge".into()).await;
    assert_eq!(huge["page"]["domains_total"], 1);
    assert_eq!(huge["domains"][0]["rules_total"], 600);
    assert_eq!(huge["domains"][0]["rules"].as_array().unwrap().len(), 500);
    let small = read("?filter=d01&limit=3".into()).await;
    assert_eq!(small["page"]["domains_total"], 100);
    assert_eq!(small["domains"].as_array().unwrap().len(), 3);
    assert_eq!(small["page"]["next_after"], "d0102");
    for bad in ["?limit=0", "?limit=51", "?limit=x", "?page=2"] {
        let response = dashboard_state(server.http, bad).await;
        assert_eq!(response.status, 400, "{bad}: {}", response.body);
    }
    server.stop().await;
}
