//! The Redis store in production shape (real `TIME`, circuit breaker, failure policy, local
//! over-limit cache) against a real redis-server per test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::clock::SystemClock;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::redis::{RedisSettings, RedisStore};
use floodgate::store::{
    FailurePolicy, MemoryStore, Resilience, ResilientStore, Store, StoreMetrics,
};
use floodgate::telemetry::metrics::Metrics;
use support::http::call;
use support::process::Floodgate;
use support::redis::RedisServer;
use support::*;
use tonic_health::pb::health_check_response::ServingStatus;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str = r#"
domain: r
descriptors:
  - key: many
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window}
"#;

struct Setup {
    redis: RedisServer,
    server: TestServer,
}

/// A server over `ResilientStore(Redis)` with `policy`, a local cache of `cache` entries and
/// `timeout` per Redis call.
async fn setup_with(policy: FailurePolicy, cache: u64, timeout: Duration) -> Setup {
    let redis = RedisServer::start();
    let server = serve(&redis.url(), policy, cache, timeout).await;
    Setup { redis, server }
}

async fn serve(url: &str, policy: FailurePolicy, cache: u64, timeout: Duration) -> TestServer {
    let store = RedisStore::new(&RedisSettings {
        command_timeout: timeout,
        ..redis_settings(url)
    })
    .unwrap();
    let fallback =
        (policy == FailurePolicy::Local).then(|| Arc::new(MemoryStore::new(Arc::new(SystemClock))));
    let metrics = Arc::new(Metrics::new());
    let resilient = Arc::new(ResilientStore::new(
        Arc::new(store),
        Resilience {
            policy,
            cache_capacity: cache,
            failure_threshold: 3,
            // Unloaded tests: a short quiet period lets an outage open the breaker at once.
            quiet_period: Duration::from_millis(50),
            shed_deadline: None,
        },
        fallback,
        StoreMetrics::register(&metrics),
    ));
    resilient.spawn_probe(Duration::from_millis(50));
    let health = (policy == FailurePolicy::Error).then(|| resilient.availability());
    let store: Arc<dyn Store> = resilient;
    TestServer::with(LIMITS)
        .store(store, metrics)
        .store_health(health)
        .start()
        .await
}

async fn setup() -> Setup {
    setup_with(FailurePolicy::Error, 0, Duration::from_secs(2)).await
}

async fn keys(redis: &RedisServer) -> Vec<String> {
    let mut conn = redis.connection().await;
    let mut keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    // The breaker probe's own short-lived key is not a bucket.
    keys.retain(|key| key != "fg:probe");
    keys.sort();
    keys
}

fn many(n: usize) -> floodgate::proto::rls::RateLimitRequest {
    request(
        "r",
        (0..n)
            .map(|i| descriptor(&[("many", &format!("v{i}"))]))
            .collect(),
    )
}

/// What Redis receives from clients (not from inside scripts) while `work` runs, as seen by
/// `MONITOR`: one line per command, script-internal ones marked `[.. lua]` and left out, and
/// so are the breaker's probes (the script with no key: `"EVALSHA" "<sha>" "0" "" ""`), which
/// run whenever no call succeeded for the (test's 50 ms) quiet period and are no request's.
async fn client_commands<F: Future<Output = ()>>(redis: &RedisServer, work: F) -> Vec<String> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli not found: run scripts/install-test-tools.sh");
    let mut lines = BufReader::new(monitor.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "OK");
    work.await;
    // A marker from another client tells us every earlier command has been printed.
    let mut conn = redis.connection().await;
    let _: String = ::redis::cmd("ECHO")
        .arg("end-of-work")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if line.contains("\"end-of-work\"") {
            break;
        }
        // The breaker's probe: the script with no bucket, then a write of its own key.
        let probe = line.contains("\" \"0\" \"\"") && line.to_lowercase().contains("\"evalsha\"")
            || line.contains("\"SET\" \"fg:probe\"");
        if !line.contains(" lua]") && !probe {
            seen.push(line);
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    seen
}

/// Exactly one Redis command (EVALSHA) per request with 1, 3 and 10 descriptors.
#[tokio::test]
async fn one_redis_command_per_request() {
    let Setup { redis, server } = setup().await;
    for n in [1, 3, 10] {
        // Warm up: the script is loaded on first use (NOSCRIPT → SCRIPT LOAD).
        server.ask(many(n)).await;
        let commands = client_commands(&redis, async {
            for _ in 0..5 {
                assert_eq!(server.ask(many(n)).await.overall_code, OK);
            }
        })
        .await;
        assert_eq!(commands.len(), 5, "{n} descriptors: {commands:#?}");
        assert!(
            commands
                .iter()
                .all(|c| c.contains("\"EVALSHA\"") || c.contains("\"evalsha\"")),
            "{commands:#?}"
        );
    }
    server.stop().await;
}

/// A denied request writes nothing: the other bucket is never created, the denying one unchanged.
#[tokio::test]
async fn denied_request_changes_no_key() {
    let Setup { redis, server } = setup().await;
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OK);
    let before = keys(&redis).await;
    let conn = redis.connection().await;
    let dump = |key: String| {
        let mut conn = conn.clone();
        async move {
            let value: Vec<u8> = ::redis::cmd("DUMP")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            value
        }
    };
    let one_before = dump(before[0].clone()).await;
    let both = request(
        "r",
        vec![descriptor(&[("many", "m")]), descriptor(&[("one", "x")])],
    );
    assert_eq!(server.ask(both).await.overall_code, OVER);
    assert_eq!(keys(&redis).await, before, "no key created");
    assert_eq!(dump(before[0].clone()).await, one_before, "no key changed");
    server.stop().await;
}

/// Every key floodgate writes, for every algorithm, has a TTL.
#[tokio::test]
async fn every_key_has_a_ttl() {
    let Setup { redis, server } = setup().await;
    // Each key's TTL is its time to become full again, so every write here leaves one of
    // 30 s or more (two hits of 500 of `many`'s 1000 a minute, not two of one): the check
    // below reads them long before they expire, however loaded the machine is.
    for (key, hits) in [("many", 500), ("one", 1), ("fw", 1), ("sw", 1)] {
        for _ in 0..2 {
            let mut request = simple("r", key, "x");
            request.hits_addend = hits;
            server.ask(request).await;
        }
    }
    let keys = keys(&redis).await;
    assert_eq!(keys.len(), 4, "{keys:?}");
    let mut conn = redis.connection().await;
    for key in keys {
        let ttl: i64 = ::redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has PTTL {ttl}");
    }
    server.stop().await;
}

/// After SCRIPT FLUSH the script is reloaded transparently and requests keep being answered.
#[tokio::test]
async fn survives_script_flush() {
    let Setup { redis, server } = setup().await;
    // `one` (1 a minute): Redis runs on real time, and `many` refills a token every 60 ms,
    // which a loaded machine can spend between two requests.
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OK);
    let mut conn = redis.connection().await;
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Answered by the script (an error otherwise), on the state kept: the bucket is empty.
    let response = server.ask(simple("r", "one", "x")).await;
    assert_eq!(response.overall_code, OVER, "state kept across the flush");
    assert_eq!(response.statuses[0].limit_remaining, 0);
    server.stop().await;
}

/// A connection Redis closed (`CLIENT KILL`) is never lent again, although calls reuse their
/// thread's connection without a pool checkout: at most one call fails, the next ones are
/// answered on a new connection.
#[tokio::test]
async fn a_killed_connection_is_replaced_at_once() {
    let redis = RedisServer::start();
    // One connection: each connection the kill closed costs one failed call to find.
    let store = RedisStore::new(&RedisSettings {
        pool_size: 1,
        ..redis_settings(&redis.url())
    })
    .unwrap();
    for _ in 0..3 {
        store.apply(&[]).await.unwrap();
    }
    let killed: i64 = redis
        .query(::redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"))
        .unwrap();
    assert!(killed >= 1, "the store's connection was open");
    // The first call may still meet the dead connection: that is how it is found broken.
    let _ = store.apply(&[]).await;
    for i in 0..5 {
        store
            .apply(&[])
            .await
            .unwrap_or_else(|e| panic!("call {i} after the kill: {e}"));
    }
}

/// The URL's password and database reach Redis: with `requirepass`, requests through
/// `redis://:<password>@…/3` are answered and their buckets land in database 3 (none in 0);
/// a wrong password is an outage (UNAVAILABLE), not an answer.
#[tokio::test]
async fn the_urls_password_and_database_are_used() {
    let redis = RedisServer::start_args(&["--requirepass", "s3cret"]);
    let url = |password: &str, db: u8| format!("redis://:{password}@{}/{db}", redis.address());
    let server = serve(
        &url("s3cret", 3),
        FailurePolicy::Error,
        0,
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(server.ask(simple("r", "many", "x")).await.overall_code, OK);
    server.stop().await;
    let buckets = |db: u8| -> Vec<String> {
        let mut conn = ::redis::Client::open(url("s3cret", db))
            .unwrap()
            .get_connection()
            .unwrap();
        let mut keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        keys.retain(|key| key != "fg:probe");
        keys
    };
    assert_eq!(buckets(3).len(), 1, "{:?}", buckets(3));
    assert_eq!(buckets(0), Vec::<String>::new());

    let wrong = serve(
        &url("wrong", 3),
        FailurePolicy::Error,
        0,
        Duration::from_secs(2),
    )
    .await;
    let status = wrong.ask_err(simple("r", "many", "x")).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    wrong.stop().await;
}

/// A connection's setup says what Redis refused, as an outage, without the password: a
/// wrong password, an ACL user's wrong password, a database Redis does not have; the right
/// user and password are answered.
#[tokio::test]
async fn setup_refusals_say_what_redis_refused() {
    let redis = RedisServer::start_args(&["--requirepass", "s3cret"]);
    let at = redis.address();
    let mut admin = ::redis::Client::open(format!("redis://:s3cret@{at}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    ::redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">app-s3cret", "~*", "+@all"])
        .query::<()>(&mut admin)
        .unwrap();
    let store = |url: String| {
        RedisStore::new(&RedisSettings {
            url,
            sentinel: None,
            tls: Default::default(),
            key_prefix: "fg:".into(),
            pool_size: 1,
            connect_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(10),
        })
        .unwrap()
    };
    for (url, says) in [
        (
            format!("redis://:hunter2@{at}/"),
            "password authentication failed",
        ),
        (
            format!("redis://app:hunter2@{at}/"),
            "password authentication failed",
        ),
        (
            format!("redis://:s3cret@{at}/99"),
            "refused to switch database",
        ),
    ] {
        let error = store(url.clone()).apply(&[]).await.unwrap_err();
        let text = error.to_string();
        assert!(error.is_transient(), "{url}: {text}");
        assert!(text.to_lowercase().contains(says), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{url}: {text}");
    }
    let error = store(format!("redis://:s3cret@{at}/99"))
        .apply(&[])
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("DB index is out of range"),
        "{error}"
    );
    for url in [
        format!("redis://app:app-s3cret@{at}/2"),
        format!("redis://:s3cret@{at}/"),
    ] {
        store(url.clone())
            .apply(&[])
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

/// A Redis that stops answering fails the call at its deadline, as an outage naming the
/// deadline, and retires the connection it was on: once Redis answers again, the next calls
/// are answered (on a new connection, although the old one is still open).
#[tokio::test]
async fn a_stalled_call_fails_at_its_deadline_and_retires_its_connection() {
    let redis = RedisServer::start();
    // One connection: the next call's is the stalled one unless that was retired.
    let store = RedisStore::new(&RedisSettings {
        command_timeout: Duration::from_millis(200),
        pool_size: 1,
        ..redis_settings(&redis.url())
    })
    .unwrap();
    store.apply(&[]).await.unwrap();
    redis.freeze();
    let error = store.apply(&[]).await.unwrap_err();
    redis.thaw();
    assert!(error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("Redis did not answer within 200ms"),
        "{error}"
    );
    let opened = store
        .pool_counts()
        .opened
        .load(std::sync::atomic::Ordering::Relaxed);
    store.apply(&[]).await.unwrap();
    assert!(
        store
            .pool_counts()
            .opened
            .load(std::sync::atomic::Ordering::Relaxed)
            > opened,
        "the stalled connection was lent again"
    );
}

/// With Redis down: UNAVAILABLE at once (no hang), health NOT_SERVING; after a restart,
/// health SERVING and normal answers again, without restarting floodgate.
#[tokio::test]
async fn outage_then_recovery_under_policy_error() {
    // A command timeout far beyond the bound asserted below: a call that waits for it (a
    // hang) fails the test, one that fails fast passes however loaded the machine is.
    let Setup { mut redis, server } =
        setup_with(FailurePolicy::Error, 0, Duration::from_secs(60)).await;
    assert_eq!(server.ask(simple("r", "many", "x")).await.overall_code, OK);
    // SERVING once Redis has answered (the health task follows the store asynchronously).
    eventually("health SERVING", || async {
        health(server.grpc_addr).await == ServingStatus::Serving as i32
    })
    .await;
    redis.stop();
    // Traffic keeps failing fast; once nothing has succeeded for the quiet period the breaker
    // opens and health turns NOT_SERVING.
    eventually("breaker open, health NOT_SERVING", || async {
        let started = Instant::now();
        let status = server.ask_err(simple("r", "many", "x")).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        // Generous: proves no hang on a dead Redis, not a latency figure (see bench/).
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        health(server.grpc_addr).await == ServingStatus::NotServing as i32
    })
    .await;
    assert_eq!(
        health(server.grpc_addr).await,
        ServingStatus::NotServing as i32
    );
    let healthcheck = call(server.http_addr, "GET", "/healthcheck", None).await;
    assert_eq!(healthcheck.status, 503);
    let metrics = call(server.http_addr, "GET", "/metrics", None).await.body;
    assert!(metrics.contains("floodgate_store_available 0"), "{metrics}");

    redis.restart();
    eventually("health SERVING after Redis restart", || async {
        health(server.grpc_addr).await == ServingStatus::Serving as i32
    })
    .await;
    assert_eq!(server.ask(simple("r", "many", "x")).await.overall_code, OK);
    server.stop().await;
}

/// A Redis that accepts connections but never answers costs at most the command timeout per
/// request until the breaker opens; after that Redis is not called at all.
#[tokio::test]
async fn hung_redis_is_bounded_by_timeout_and_breaker() {
    // A listener that accepts and never replies: a frozen Redis.
    let blackhole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", blackhole.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = blackhole.accept().await {
            open.push(socket);
        }
    });
    let server = serve(&url, FailurePolicy::Error, 0, Duration::from_millis(50)).await;
    // Each call ends (the bound only guards against a hang); that the breaker, not the
    // timeout, answered all but the first few is counted below, not timed.
    let calls = async {
        for _ in 0..20 {
            let status = server.ask_err(simple("r", "many", "x")).await;
            assert_eq!(status.code(), tonic::Code::Unavailable);
        }
    };
    tokio::time::timeout(EVENTUALLY, calls)
        .await
        .expect("calls to a hung Redis never ended");
    let metrics = call(server.http_addr, "GET", "/metrics", None).await.body;
    // At most the threshold (3) of request calls reached the frozen Redis before the breaker
    // opened (the idle probe's failures count toward it too); every request was answered.
    let errors: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"floodgate_store_errors_total{kind="unavailable"} "#))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        (1..=3).contains(&errors),
        "{errors} calls reached Redis:\n{metrics}"
    );
    assert!(
        metrics.contains(r#"floodgate_store_degraded_total{policy="error"} 20"#),
        "{metrics}"
    );
    server.stop().await;
    held.abort();
}

/// A Redis that stalls while more requests arrive than the bound lets through: the calls
/// queued behind the bound wait their turn only as long as they could still be answered in
/// time (clients without a deadline: the Redis deadline) and are then shed — answered by the
/// failure policy, and counted — and when Redis answers again, shedding ends and every
/// request is answered by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_queue_is_shed_early_and_shedding_ends_with_it() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let redis = RedisServer::start();
    // Far beyond what a loaded machine adds to a call of a local Redis (a 50 ms deadline
    // failed its very first call, and shed calls after Redis recovered, on a loaded one):
    // what is shed here is the stall's queue, not the machine's slowness.
    let deadline = Duration::from_secs(5);
    let store = RedisStore::new(&RedisSettings {
        command_timeout: deadline,
        ..redis_settings(&redis.url())
    })
    .unwrap();
    let metrics = Arc::new(Metrics::new());
    let resilient = Arc::new(ResilientStore::new(
        Arc::new(store),
        Resilience {
            policy: FailurePolicy::Deny,
            cache_capacity: 0,
            // The breaker never opens: this is about a queue, not an outage.
            failure_threshold: u32::MAX,
            quiet_period: Duration::from_secs(3600),
            shed_deadline: Some(deadline),
        },
        None,
        StoreMetrics::register(&metrics),
    ));
    let server = Arc::new(
        TestServer::with(LIMITS)
            .store(resilient, metrics)
            .start()
            .await,
    );
    assert_eq!(server.ask(simple("r", "many", "x")).await.overall_code, OK);

    // 256 clients, each sending its next request as soon as the last is answered (four times
    // the bound's first value, so that the stall holds every place and the rest queue); the
    // 224 beyond the first 32 stop once Redis is back, so what follows is the steady load of
    // 32 clients that the bound must serve without shedding. Every answer OK extends the
    // streak of consecutive OKs, any other answer resets it.
    let stop = Arc::new(AtomicBool::new(false));
    let burst_stop = Arc::new(AtomicBool::new(false));
    let streak = Arc::new(AtomicU64::new(0));
    let (mut clients, mut burst) = (Vec::new(), Vec::new());
    for i in 0..256 {
        let stop = if i < 32 {
            stop.clone()
        } else {
            burst_stop.clone()
        };
        let (server, streak) = (server.clone(), streak.clone());
        let client = tokio::spawn(async move {
            let mut client = server.client().await;
            while !stop.load(Ordering::Relaxed) {
                let request = simple("r", "many", &format!("c{i}"));
                let ok = client
                    .should_rate_limit(request)
                    .await
                    .is_ok_and(|r| r.into_inner().overall_code == OK);
                if ok {
                    streak.fetch_add(1, Ordering::Relaxed);
                } else {
                    streak.store(0, Ordering::Relaxed);
                }
            }
        });
        if i < 32 {
            clients.push(client);
        } else {
            burst.push(client);
        }
    }
    let shed = || server.metric(r#"floodgate_store_errors_total{kind="shed"}"#);
    redis.freeze();
    eventually("calls are shed while Redis stalls", || async { shed() > 0 }).await;
    redis.thaw();
    // The burst's clients end once their last call is answered (or shed: a queued call
    // waits at most the Redis deadline).
    burst_stop.store(true, Ordering::Relaxed);
    for client in burst {
        client.await.unwrap();
    }
    // Shedding ends: a streak of answers from Redis, with nothing shed meanwhile.
    eventually(
        "1000 answers in a row from Redis after it recovers",
        || async { streak.load(Ordering::Relaxed) >= 1000 },
    )
    .await;
    let after = shed();
    let streak_then = streak.load(Ordering::Relaxed);
    eventually("another 500 answers from Redis", || async {
        streak.load(Ordering::Relaxed) >= streak_then + 500
    })
    .await;
    assert_eq!(shed(), after, "nothing shed once Redis keeps up");
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
}

/// Policy `allow` answers OK (full limit remaining) while Redis is down.
#[tokio::test]
async fn policy_allow_answers_ok() {
    let Setup { mut redis, server } =
        setup_with(FailurePolicy::Allow, 0, Duration::from_secs(2)).await;
    redis.stop();
    for _ in 0..3 {
        let response = server.ask(simple("r", "one", "x")).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(response.statuses[0].limit_remaining, 1);
    }
    assert_eq!(
        health(server.grpc_addr).await,
        ServingStatus::Serving as i32
    );
    server.stop().await;
}

/// Policy `deny` answers OVER_LIMIT while Redis is down.
#[tokio::test]
async fn policy_deny_answers_over_limit() {
    let Setup { mut redis, server } =
        setup_with(FailurePolicy::Deny, 0, Duration::from_secs(2)).await;
    redis.stop();
    for _ in 0..3 {
        assert_eq!(
            server.ask(simple("r", "many", "x")).await.overall_code,
            OVER
        );
    }
    server.stop().await;
}

/// Policy `local` keeps enforcing limits in memory while Redis is down.
#[tokio::test]
async fn policy_local_enforces_in_memory() {
    let Setup { mut redis, server } =
        setup_with(FailurePolicy::Local, 0, Duration::from_secs(2)).await;
    redis.stop();
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OK);
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OVER);
    assert_eq!(server.ask(simple("r", "one", "y")).await.overall_code, OK);
    server.stop().await;
}

/// A bucket Redis said is empty is answered OVER_LIMIT locally, with no Redis command.
#[tokio::test]
async fn local_cache_skips_redis_for_empty_bucket() {
    let Setup { redis, server } =
        setup_with(FailurePolicy::Error, 1000, Duration::from_secs(2)).await;
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OK);
    assert_eq!(server.ask(simple("r", "one", "x")).await.overall_code, OVER);
    let commands = client_commands(&redis, async {
        for _ in 0..10 {
            let response = server.ask(simple("r", "one", "x")).await;
            assert_eq!(response.overall_code, OVER);
            assert!(response.statuses[0].duration_until_reset.unwrap().seconds > 0);
        }
    })
    .await;
    assert_eq!(commands, Vec::<String>::new());
    // Another bucket still goes to Redis.
    let commands = client_commands(&redis, async {
        assert_eq!(server.ask(simple("r", "one", "y")).await.overall_code, OK);
    })
    .await;
    assert_eq!(commands.len(), 1, "{commands:#?}");
    let metrics = call(server.http_addr, "GET", "/metrics", None).await.body;
    assert!(
        metrics.contains("floodgate_local_cache_over_limit_total 10"),
        "{metrics}"
    );
    // Per rule too: the 10 cached denials, not the one Redis denied itself.
    assert!(
        metrics
            .contains(r#"floodgate_rule_over_limit_local_cache_total{domain="r",rule="r.one"} 10"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"floodgate_rule_over_limit_total{domain="r",rule="r.one"} 11"#),
        "{metrics}"
    );
    server.stop().await;
}

/// Two floodgate processes sharing one Redis enforce one limit together.
#[tokio::test]
async fn two_processes_share_one_limit() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: shared\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .unwrap();
    let config = dir.path().to_str().unwrap();
    let url = redis.url();
    let args = [
        "--config",
        config,
        "--redis-url",
        &url,
        "--redis-timeout-ms",
        "2000",
        // Each process's first requests open its pools' connections at once, which a loaded
        // machine can take longer than the 250 ms default to do.
        "--redis-connect-timeout-ms",
        "2000",
    ];
    let a = Floodgate::start(&args);
    let b = Floodgate::start(&args);
    let mut clients = Vec::new();
    for addr in [a.grpc, b.grpc] {
        clients.push(
            floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::connect(
                format!("http://{addr}"),
            )
            .await
            .unwrap(),
        );
    }
    // All 30 at once, spread over both processes: atomicity across replicas, not turn-taking.
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..30 {
        let mut client = clients[i % 2].clone();
        requests.spawn(async move {
            client
                .should_rate_limit(simple("shared", "k", "v"))
                .await
                .unwrap()
                .into_inner()
                .overall_code
                == OK
        });
    }
    let admitted = requests
        .join_all()
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    assert_eq!(admitted, 10);
    for process in [a, b] {
        let (exit, _) = tokio::task::spawn_blocking(move || process.terminate())
            .await
            .unwrap();
        assert_eq!(exit.code(), Some(0));
    }
}
