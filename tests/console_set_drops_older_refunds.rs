//! A set (or reset) of a bucket is a line refunds do not cross: a request held by `max_wait`
//! whose client gives up after the set gives back nothing, since the set already decided
//! what the bucket holds — on the memory store and on a real Redis, on real time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use floodgate::bucket::{BucketKey, BucketOp, KeyValue};
use floodgate::clock::SystemClock;
use floodgate::limiter::{Algorithm, LimitParams};
use floodgate::proto::rls::RateLimitResponse;
use floodgate::store::redis::RedisStore;
use floodgate::store::{MemoryStore, Store};
use floodgate::telemetry::metrics::Metrics;
use support::redis::RedisServer;
use support::*;

/// One token a minute, a burst of 1, held up to a minute: one request can be held at a time.
const SLOW: &str = "
domain: s
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1, max_wait: 60s}
";

/// A store on real time, and the Redis behind it (kept alive with it).
fn real_time_store(backend: Backend) -> (Arc<dyn Store>, Option<RedisServer>) {
    match backend {
        Backend::Memory => (Arc::new(MemoryStore::new(Arc::new(SystemClock))), None),
        _ => {
            let redis = RedisServer::start();
            let store = RedisStore::new(&redis_settings(&redis.url())).unwrap();
            (Arc::new(store), Some(redis))
        }
    }
}

/// Seconds until `k=v`'s bucket is full again, by a check-only request (debits nothing).
async fn seconds_until_full(server: &TestServer) -> i64 {
    let check = request("s", vec![with_hits(descriptor(&[("k", "v")]), 0)]);
    let response = server.ask(check).await;
    response.statuses[0]
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds)
}

/// The operator's set of `k=v`'s bucket to 0 remaining, as the console sends it.
fn set_to_zero() -> BucketOp {
    let params = LimitParams {
        algorithm: Algorithm::TokenBucket,
        requests_per_period: 1,
        period_us: 60_000_000,
        burst: 1,
        overdraft: false,
        max_wait_us: 0,
    };
    BucketOp {
        key: BucketKey::new(
            "s",
            [(&b"k"[..], KeyValue::Value(b"v"))],
            Algorithm::TokenBucket,
            params.period_us,
        ),
        params,
        cost: 1,
        enforce: false,
        reference: None,
        debited_in: None,
        debited_at: None,
    }
}

/// A request held for its token (the bucket two minutes from full) whose client gives up
/// after the bucket was set to 0: its refund is dropped, so the bucket stays a minute from
/// full (where a credited refund would leave it full, and the next request admitted at once).
async fn a_refund_older_than_a_set_is_dropped(backend: Backend) {
    let (store, _redis) = real_time_store(backend);
    let server = TestServer::with(SLOW)
        .store(store.clone(), Arc::new(Metrics::new()))
        .start()
        .await;
    assert_eq!(server.ask(simple("s", "k", "v")).await.overall_code, 1);
    let mut client = server.client().await;
    let held = tokio::spawn(async move {
        let answer: Result<tonic::Response<RateLimitResponse>, tonic::Status> =
            client.should_rate_limit(simple("s", "k", "v")).await;
        answer
    });
    eventually("the second request committed and held", || async {
        held.is_finished() || seconds_until_full(&server).await > 90
    })
    .await;
    assert!(!held.is_finished(), "answered at once: {:?}", held.await);

    let set = store.set(&[set_to_zero()]).await.unwrap();
    assert_eq!(set.buckets[0].view.remaining, 0);
    let after_set = seconds_until_full(&server).await;
    assert!(
        (30..=60).contains(&after_set),
        "{after_set} s after the set"
    );

    // The client gives up: the held request's debit, made before the set, is refunded.
    held.abort();
    eventually("the cancelled request is refunded", || async {
        server.metric(r#"floodgate_shaped_requests_total{domain="s",result="cancelled"}"#) == 1
    })
    .await;
    let after_refund = seconds_until_full(&server).await;
    assert!(
        after_refund >= 30,
        "the refund crossed the set: the bucket is {after_refund} s from full"
    );
    server.stop().await;
}

/// On the memory store.
#[tokio::test]
async fn a_refund_older_than_a_set_is_dropped_on_memory() {
    a_refund_older_than_a_set_is_dropped(Backend::Memory).await;
}

/// On a real redis-server.
#[tokio::test]
async fn a_refund_older_than_a_set_is_dropped_on_redis() {
    a_refund_older_than_a_set_is_dropped(Backend::Redis).await;
}
