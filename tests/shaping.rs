//! Shaping: a token bucket with `max_wait` holds a request until its tokens arrive and
//! answers it OK, instead of refusing it — on the memory store and on a real Redis. The
//! waits are real sleeps of the server.
//!
//! What is asserted holds on any machine, however loaded: the pacing and max_wait scenarios
//! run the store on the test's manual clock, which stands still, so every request is
//! evaluated at the same moment and the k-th past the burst is reserved exactly k token
//! intervals later (GCRA, exact in µs); the server then sleeps that long, and a sleep never
//! ends early. So its answer reaches the client no earlier than `s₀ + k·I` (`s₀`: when the
//! client sent the burst) and its `x-ratelimit-delayed-ms` header says at least `k·I`. How
//! late a loaded machine answers is not asserted (on real time, a 50 ms tolerance failed on
//! a loaded machine; benchmarks measure speed). The scenarios that hold a request for a
//! minute run on real time, waiting on what the store shows, never on a fixed time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::clock::SystemClock;
use floodgate::proto::rls::RateLimitResponse;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::redis::RedisStore;
use floodgate::store::{MemoryStore, Store};
use floodgate::telemetry::metrics::Metrics;
use support::redis::RedisServer;
use support::*;

/// A store on real time, and the Redis behind it (kept alive with it).
fn real_time_store(backend: Backend) -> (Arc<dyn Store>, Option<RedisServer>) {
    match backend {
        Backend::Memory => (Arc::new(MemoryStore::new(Arc::new(SystemClock))), None),
        Backend::Redis => {
            let redis = RedisServer::start();
            let store = RedisStore::new(&redis_settings(&redis.url())).unwrap();
            (Arc::new(store), Some(redis))
        }
        other => panic!("no real-time store for {other:?} here"),
    }
}

/// A server with `yaml` on a real-time store of `backend`.
async fn start(yaml: &str, backend: Backend) -> (TestServer, Option<RedisServer>) {
    let (store, redis) = real_time_store(backend);
    let server = TestServer::with(yaml)
        .store(store, Arc::new(Metrics::new()))
        .start()
        .await;
    (server, redis)
}

/// The `x-ratelimit-delayed-ms` header's value, if the response has it.
fn delayed_ms(response: &RateLimitResponse) -> Option<u64> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "x-ratelimit-delayed-ms")
        .map(|h| h.value.parse().unwrap())
}

/// One token every 250 ms, a burst of 5, held up to 3 s (within the test server's request
/// timeout, 5 s). On Redis, the first key written expires 250 ms of real time later: the
/// burst's requests, sent together, are evaluated long before unless the machine stalls.
const PACED: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4, burst: 5, max_wait: 3s}
";
const INTERVAL: Duration = Duration::from_millis(250);
const BURST: usize = 5;

/// A burst of 3× the bucket: every request answered OK, B at once and each later one held
/// for its token, one interval apart.
async fn a_burst_of_three_buckets_is_paced_not_refused(backend: Backend) {
    // The store's clock stands still (see the module doc): every request is evaluated at the
    // same moment, so the k-th past the burst is held exactly k intervals.
    let server = TestServer::with(PACED).on(backend).start().await;
    let client = server.client().await;
    let served = r#"floodgate_shaped_requests_total{domain="s",result="served"}"#;
    let delays = "floodgate_shaped_delay_seconds_count";
    // On Redis the bucket's key expires in real time while the store's clock stands still:
    // one interval after the first request (the bucket is full again then), and only ever
    // refilling it. Such a refill answers a request at once, so a run in which a request not
    // held was answered an interval or more after the burst was sent (a stalled machine)
    // runs again on a fresh bucket; every other run is asserted, however slow.
    let mut attempt = 0;
    let (sent, answers, counted) = loop {
        let value = format!("v{attempt}");
        let counted = (server.metric(served), server.metric(delays));
        let sent = Instant::now();
        let answers = futures_util::future::join_all((0..3 * BURST).map(|_| {
            let mut client = client.clone();
            let request = simple("s", "k", &value);
            async move {
                let response = client.should_rate_limit(request).await.unwrap();
                (Instant::now(), response.into_inner())
            }
        }))
        .await;
        let stalled = answers
            .iter()
            .any(|(at, response)| delayed_ms(response).is_none() && *at >= sent + INTERVAL);
        attempt += 1;
        if !stalled || attempt == 20 {
            break (sent, answers, counted);
        }
    };
    for (_, response) in &answers {
        assert_eq!(response.overall_code, Code::Ok as i32, "{response:?}");
    }
    let immediate = answers
        .iter()
        .filter(|(_, response)| delayed_ms(response).is_none())
        .count();
    assert_eq!(immediate, BURST, "{answers:?}");
    // The held ones: the k-th to arrive came no earlier than k intervals after the burst was
    // sent, and the k-th shortest hold (the header) lasted at least k intervals (a sleep never
    // ends early). Both are exact on any machine; how late a loaded one answers is not
    // asserted (benchmarks measure speed).
    let mut arrivals: Vec<Instant> = answers
        .iter()
        .filter(|(_, response)| delayed_ms(response).is_some())
        .map(|(at, _)| *at)
        .collect();
    arrivals.sort();
    let mut holds: Vec<u64> = answers
        .iter()
        .filter_map(|(_, response)| delayed_ms(response))
        .collect();
    holds.sort_unstable();
    for (k, (answered, held)) in arrivals.iter().zip(&holds).enumerate() {
        let k = u32::try_from(k + 1).unwrap();
        let earliest = sent + INTERVAL * k;
        assert!(
            *answered >= earliest,
            "answer {k} past the burst came {:?} too early",
            earliest - *answered
        );
        let held = Duration::from_millis(*held);
        assert!(held >= INTERVAL * k, "{held:?} for {k}: {holds:?}");
    }
    assert_eq!(server.metric(served) - counted.0, 2 * BURST as u64);
    assert_eq!(server.metric(delays) - counted.1, 2 * BURST as u64);
    server.stop().await;
}

/// One token every 15 s, a burst of 2, held up to 40 s.
const SHORT_WAIT: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 4, burst: 2, max_wait: 40s}
";

/// Beyond max_wait a request is refused, and debits nothing: the next request gets the
/// tokens the refused one would have taken.
async fn beyond_max_wait_refused_and_nothing_debited(backend: Backend) {
    // The store's clock stands still: the waits below are exact whatever the machine's load,
    // and no Redis key (30 s of TTL and more) expires meanwhile.
    let mut server = TestServer::with(SHORT_WAIT).on(backend).start().await;
    let mut client = server.client().await;
    for _ in 0..2 {
        let response = server.ask(simple("s", "k", "v")).await;
        assert_eq!(delayed_ms(&response), None, "{response:?}");
    }
    // Its token is 15 s away: held. Sent concurrently with what follows.
    let mut third = client.clone();
    let held = tokio::spawn(async move {
        third
            .should_rate_limit(simple("s", "k", "v"))
            .await
            .unwrap()
            .into_inner()
    });
    eventually("the third request is held", || async {
        server.metric("floodgate_requests_in_flight") == 1
    })
    .await;
    // Three more tokens would be 60 s away (45 s without the third's): beyond 40 s, refused,
    // with when to retry.
    let mut heavy = simple("s", "k", "v");
    heavy.hits_addend = 3;
    let refused = client.should_rate_limit(heavy).await.unwrap().into_inner();
    assert_eq!(refused.overall_code, Code::OverLimit as i32, "{refused:?}");
    assert_eq!(delayed_ms(&refused), None);
    // Had it debited, the next token would be 75 s away and this refused too: it is 30 s
    // away, so it is held (until shutdown, below, refuses it: its turn is past the cut).
    let mut after = client.clone();
    let next = tokio::spawn(async move {
        after
            .should_rate_limit(simple("s", "k", "v"))
            .await
            .unwrap()
            .into_inner()
    });
    eventually("the next request is held too, or answered", || async {
        next.is_finished() || server.metric("floodgate_requests_in_flight") == 2
    })
    .await;
    server.begin_stop();
    // Both were held (a request refused on arrival is no shaped request), and shutdown,
    // which cuts the connections off 5 s later, refuses both rather than admit them early.
    for (which, task) in [("next", next), ("third", held)] {
        let response = task.await.unwrap();
        assert_eq!(
            response.overall_code,
            Code::OverLimit as i32,
            "{which}: {response:?}"
        );
    }
    assert_eq!(
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="refused"}"#),
        2
    );
    server.join().await;
}

/// One token a minute, a burst of 1, held up to a minute: a held request waits ~60 s.
const SLOW: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1, max_wait: 60s}
";

/// Seconds until `k=v`'s bucket is full again, by a check-only request (debits nothing).
async fn seconds_until_full(server: &TestServer) -> i64 {
    let check = request("s", vec![with_hits(descriptor(&[("k", "v")]), 0)]);
    let response = server.ask(check).await;
    response.statuses[0]
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds)
}

/// Sends `k=v` on a task and waits until the store has committed it (its debit shows in the
/// bucket: full again in about two minutes, not one), so that it is held from then on; a
/// request refused instead ends the wait, and fails the test.
async fn send_and_hold(
    server: &TestServer,
) -> tokio::task::JoinHandle<Result<tonic::Response<RateLimitResponse>, tonic::Status>> {
    let mut client = server.client().await;
    let task = tokio::spawn(async move { client.should_rate_limit(simple("s", "k", "v")).await });
    eventually("the request committed and held", || async {
        task.is_finished() || seconds_until_full(server).await > 90
    })
    .await;
    assert!(!task.is_finished(), "answered at once: {:?}", task.await);
    task
}

/// A client that gives up while its request is held gets its token given back: the next
/// request takes it.
async fn a_cancelled_wait_gives_its_tokens_back(backend: Backend) {
    let (server, _redis) = start(SLOW, backend).await;
    let first = server.ask(simple("s", "k", "v")).await;
    assert_eq!(delayed_ms(&first), None);
    // Held ~60 s; the client gives up (its call dropped, as a client deadline does) once the
    // request is held, not after a fixed time that a loaded machine may not reach the hold in.
    send_and_hold(&server).await.abort();
    eventually("the cancelled request is refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="cancelled"}"#) == 1
    })
    .await;
    // Its token is the one after the first again: held about a minute, not two (which would
    // exceed max_wait and be refused: send_and_hold fails on an answer at once).
    send_and_hold(&server).await.abort();
    eventually("the second cancelled request is refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="cancelled"}"#) == 2
    })
    .await;
    server.stop().await;
}

/// Shutdown refuses a held request whose turn comes after the connections are cut (here a
/// minute away, the cut 5 s away) at once, OVER_LIMIT, with its token given back: never
/// admitted before its turn.
async fn shutdown_refuses_held_requests_whose_turn_is_past_the_cut(backend: Backend) {
    let (mut server, _redis) = start(SLOW, backend).await;
    server.ask(simple("s", "k", "v")).await;
    let mut client = server.client().await;
    let held = tokio::spawn(async move {
        let started = Instant::now();
        let response = client
            .should_rate_limit(simple("s", "k", "v"))
            .await
            .unwrap()
            .into_inner();
        (started.elapsed(), response)
    });
    eventually("the second request is held", || async {
        server.metric("floodgate_requests_in_flight") == 1
    })
    .await;
    server.begin_stop();
    let (waited, response) = held.await.unwrap();
    assert_eq!(
        response.overall_code,
        Code::OverLimit as i32,
        "{response:?}"
    );
    // Refused at once, not at its turn a minute later.
    assert!(waited < Duration::from_secs(50), "{waited:?}");
    assert_eq!(delayed_ms(&response), None);
    // Given back: the bucket is full again within the first request's minute, not two.
    let reset = response.statuses[0].duration_until_reset.unwrap().seconds;
    assert!(reset <= 60, "{reset} s: the held token was not given back");
    assert_eq!(
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="refused"}"#),
        1
    );
    server.join().await;
}

/// A fixed window of 5 a minute beside a token bucket that holds: one token every 20 s,
/// a burst of 1, held up to a minute. (A window of a minute: on Redis a window's key
/// expires in real time at its end on the test's clock, and the test needs the next window
/// to last while it asks, whatever the machine's load.)
const WINDOW_AND_HOLD: &str = "
domain: w
descriptors:
  - key: u
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: s
    rate_limit: {unit: minute, requests_per_unit: 3, burst: 1, max_wait: 60s}
";

/// A held request cancelled after its fixed window has ended gives nothing back to the
/// window that is current then: that window never counted it, so it still admits only its
/// limit (the refund goes to the debit's own window, which is gone).
async fn a_cancelled_wait_refunds_its_own_window_only(backend: Backend) {
    let server = TestServer::with(WINDOW_AND_HOLD).on(backend).start().await;
    let both = || {
        request(
            "w",
            vec![descriptor(&[("u", "A")]), descriptor(&[("s", "A")])],
        )
    };
    // Late in minute W: one passes, three are held (20, 40 and 60 s), all four counted in W.
    server.advance_ms(59_900);
    assert_eq!(server.ask(both()).await.overall_code, Code::Ok as i32);
    let client = server.client().await;
    let held: Vec<_> = (0..3)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.should_rate_limit(both()).await })
        })
        .collect();
    eventually("three requests are held", || async {
        server.metric("floodgate_requests_in_flight") == 3
    })
    .await;
    // Early in W + 1: a fresh window admits its 5.
    server.advance_ms(200);
    let only_u = || request("w", vec![descriptor(&[("u", "A")])]);
    let mut ok = 0;
    for _ in 0..6 {
        ok += usize::from(server.ask(only_u()).await.overall_code == Code::Ok as i32);
    }
    assert_eq!(ok, 5);
    // The held clients leave: their debits of W are not W + 1's to give back.
    for task in &held {
        task.abort();
    }
    eventually("the held requests are cancelled and refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="w",result="cancelled"}"#) == 3
    })
    .await;
    for _ in 0..4 {
        let response = server.ask(only_u()).await;
        assert_eq!(
            response.overall_code,
            Code::OverLimit as i32,
            "W + 1 already admitted 5: {response:?}"
        );
    }
    server.stop().await;
}

/// Instantiates every scenario above once per store (as tests/rls.rs's `behaviour_suite!`).
macro_rules! on_both_stores {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on the memory store.")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Memory).await
                }
            )*
        }
        mod redis {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on a real redis-server.")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Redis).await
                }
            )*
        }
    };
}

on_both_stores!(
    a_burst_of_three_buckets_is_paced_not_refused,
    beyond_max_wait_refused_and_nothing_debited,
    a_cancelled_wait_gives_its_tokens_back,
    shutdown_refuses_held_requests_whose_turn_is_past_the_cut,
    a_cancelled_wait_refunds_its_own_window_only,
);
