//! Shaping: a token bucket with `max_wait` holds a request until its tokens arrive and
//! answers it OK, instead of refusing it — on the memory store and on a real Redis, both on
//! real time (the waits are real sleeps of the server).
//!
//! The pacing tolerance, derived: with burst B and one token every I, the store reserves the
//! k-th request past the burst the moment `e₁ + k·I`, where `e₁` is when the store first
//! evaluated the burst (GCRA: its theoretical arrival time, exact in µs). The server sleeps
//! until then and answers, so the client receives that answer
//! - never before `s₀ + k·I`, `s₀` being when the client sent the burst (`s₀ ≤ e₁`, and a
//!   sleep never ends early): this bound is exact, no tolerance;
//! - after `e₁ + k·I` by the timer's resolution (1 ms), one loopback trip and scheduling. We
//!   allow half a token interval (I/2): within it each answer still comes before the next
//!   token exists, which is what "paced at the rate" means. `e₁` is bounded by when the
//!   client received the first immediate answer (`a₀ ≥ e₁`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::clock::SystemClock;
use floodgate::metrics::Metrics;
use floodgate::proto::rls::RateLimitResponse;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::redis::RedisStore;
use floodgate::store::{MemoryStore, Store};
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
        .store(store, Metrics::shared())
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

/// One token every 100 ms, a burst of 5, held up to 2 s.
const PACED: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 10, burst: 5, max_wait: 2s}
";
const INTERVAL: Duration = Duration::from_millis(100);
const BURST: usize = 5;

/// A burst of 3× the bucket: every request answered OK, the first B at once and each later
/// one when its token arrives, one interval apart.
async fn a_burst_of_three_buckets_is_paced_not_refused(backend: Backend) {
    let (server, _redis) = start(PACED, backend).await;
    let client = server.client().await;
    let sent = Instant::now();
    let answers = futures_util::future::join_all((0..3 * BURST).map(|_| {
        let mut client = client.clone();
        async move {
            let response = client
                .should_rate_limit(simple("s", "k", "v"))
                .await
                .unwrap()
                .into_inner();
            (Instant::now(), response)
        }
    }))
    .await;
    for (_, response) in &answers {
        assert_eq!(response.overall_code, Code::Ok as i32, "{response:?}");
    }
    let mut at: Vec<(Instant, Option<u64>)> = answers
        .iter()
        .map(|(at, response)| (*at, delayed_ms(response)))
        .collect();
    at.sort_by_key(|(at, _)| *at);
    let immediate = at.iter().filter(|(_, delayed)| delayed.is_none()).count();
    assert_eq!(immediate, BURST, "{at:?}");
    // The immediate answers come first; the first of them bounds e₁ from above.
    assert!(
        at[..BURST].iter().all(|(_, delayed)| delayed.is_none()),
        "{at:?}"
    );
    let first = at[0].0;
    for (k, (answered, delayed)) in at[BURST..].iter().enumerate() {
        let k = u32::try_from(k + 1).unwrap();
        let earliest = sent + INTERVAL * k;
        let latest = first + INTERVAL * k + INTERVAL / 2;
        assert!(
            *answered >= earliest,
            "answer {k} past the burst came {:?} too early",
            earliest - *answered
        );
        assert!(
            *answered <= latest,
            "answer {k} past the burst came {:?} late",
            *answered - latest
        );
        // The header says how long it was held (rounded up to the ms): k intervals less
        // however much later than e₁ the store evaluated it, plus the timer's slack.
        let delayed = Duration::from_millis(delayed.unwrap());
        assert!(
            delayed <= INTERVAL * k + INTERVAL / 2,
            "{delayed:?} for {k}"
        );
        assert!(
            delayed + INTERVAL / 2 >= INTERVAL * k,
            "{delayed:?} for {k}"
        );
    }
    assert_eq!(
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="served"}"#),
        2 * BURST as u64
    );
    assert_eq!(
        server.metric("floodgate_shaped_delay_seconds_count"),
        2 * BURST as u64
    );
    server.stop().await;
}

/// One token every 100 ms, a burst of 2, held up to 250 ms.
const SHORT_WAIT: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 10, burst: 2, max_wait: 250ms}
";

/// Beyond max_wait a request is refused, and debits nothing: the next request gets the
/// tokens the refused one would have taken.
async fn beyond_max_wait_refused_and_nothing_debited(backend: Backend) {
    let (server, _redis) = start(SHORT_WAIT, backend).await;
    let mut client = server.client().await;
    for _ in 0..2 {
        let response = server.ask(simple("s", "k", "v")).await;
        assert_eq!(delayed_ms(&response), None, "{response:?}");
    }
    // Its token is 100 ms away: held. Sent concurrently with what follows.
    let mut held = client.clone();
    let held = tokio::spawn(async move {
        held.should_rate_limit(simple("s", "k", "v"))
            .await
            .unwrap()
            .into_inner()
    });
    eventually("the third request is held", || async {
        server.metric("floodgate_requests_in_flight") == 1
    })
    .await;
    // Three more tokens would be 400 ms away: beyond 250 ms, refused, with when to retry.
    let heavy = request("s", vec![with_hits(descriptor(&[("k", "v")]), 3)]);
    let refused = client.should_rate_limit(heavy).await.unwrap().into_inner();
    assert_eq!(refused.overall_code, Code::OverLimit as i32, "{refused:?}");
    assert_eq!(delayed_ms(&refused), None);
    // Had it debited, the next token would be 500 ms away and this refused too: it is 200 ms.
    let next = client
        .should_rate_limit(simple("s", "k", "v"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next.overall_code, Code::Ok as i32, "{next:?}");
    let delayed = delayed_ms(&next).expect("held");
    assert!((1..=250).contains(&delayed), "{delayed}");
    let held = held.await.unwrap();
    assert_eq!(held.overall_code, Code::Ok as i32);
    assert!(delayed_ms(&held).is_some());
    assert_eq!(
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="served"}"#),
        2
    );
    server.stop().await;
}

/// One token a minute, a burst of 1, held up to a minute: a held request waits ~60 s.
const SLOW: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1, max_wait: 60s}
";

/// A client that gives up while its request is held gets its token given back: the next
/// request takes it.
async fn a_cancelled_wait_gives_its_tokens_back(backend: Backend) {
    let (server, _redis) = start(SLOW, backend).await;
    let first = server.ask(simple("s", "k", "v")).await;
    assert_eq!(delayed_ms(&first), None);
    // Held ~60 s; the client's deadline ends it long before.
    let mut client = server.client().await;
    let mut impatient = tonic::Request::new(simple("s", "k", "v"));
    impatient.set_timeout(Duration::from_millis(200));
    let status = client.should_rate_limit(impatient).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    eventually("the cancelled request is refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="cancelled"}"#) == 1
    })
    .await;
    // Its token is the one after the first again: held about a minute, not two (which would
    // exceed max_wait and be refused).
    let mut next = tonic::Request::new(simple("s", "k", "v"));
    next.set_timeout(Duration::from_millis(200));
    let status = client.should_rate_limit(next).await.unwrap_err();
    assert_eq!(
        status.code(),
        tonic::Code::Cancelled,
        "held, not refused: {status:?}"
    );
    eventually("the second cancelled request is refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="cancelled"}"#) == 2
    })
    .await;
    server.stop().await;
}

/// Shutdown answers a held request at once, OK (its token is already debited), and the
/// server then stops without waiting out the delay.
async fn shutdown_answers_held_requests_at_once(backend: Backend) {
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
    assert_eq!(response.overall_code, Code::Ok as i32, "{response:?}");
    // Released, not served: it did not wait its minute.
    assert!(waited < Duration::from_secs(50), "{waited:?}");
    let delayed = delayed_ms(&response).expect("held");
    assert!(delayed < 50_000, "{delayed}");
    assert_eq!(
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="released"}"#),
        1
    );
    server.join().await;
}

/// A fixed window of 5 a second beside a token bucket that holds: one token every 20 s,
/// a burst of 1, held up to a minute.
const WINDOW_AND_HOLD: &str = "
domain: w
descriptors:
  - key: u
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window}
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
    // Late in second W: one passes, three are held (20, 40 and 60 s), all four counted in W.
    server.advance_ms(900);
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
    shutdown_answers_held_requests_at_once,
    a_cancelled_wait_refunds_its_own_window_only,
);
