use std::sync::atomic::AtomicUsize;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Algorithm, LimitParams};
use crate::store::{MemoryStore, StoreMetrics};

/// The memory store standing in for Redis (same semantics: one shared test suite holds
/// them equal), counting the calls made to it; while `hold` is set, a call waits for
/// `release` (a Redis that stopped answering), counted in `stuck`.
struct Remote {
    memory: MemoryStore,
    calls: AtomicUsize,
    hold: std::sync::atomic::AtomicBool,
    stuck: AtomicUsize,
    release: tokio::sync::Notify,
}

#[async_trait]
impl Store for Remote {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.hold.load(Ordering::SeqCst) {
            let released = self.release.notified();
            self.stuck.fetch_add(1, Ordering::SeqCst);
            released.await;
        }
        self.memory.apply(ops).await
    }

    fn name(&self) -> &'static str {
        "test"
    }
}

#[async_trait]
impl RemoteStore for Remote {
    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn op(name: &[u8], limit: u64, cost: i64) -> BucketOp {
    let params = LimitParams::of(Algorithm::TokenBucket, limit, 3_600, limit);
    BucketOp::debit("d", "k", name, params, cost)
}

/// Leases over a memory "Redis" whose clock stands still (no refill), with a lifetime
/// long enough that nothing expires unless the test says so.
fn setup() -> (Arc<Remote>, LeaseStore) {
    let remote = Arc::new(Remote {
        memory: MemoryStore::new(Arc::new(ManualClock::new(1_700_000_000_000_000))),
        calls: AtomicUsize::new(0),
        hold: std::sync::atomic::AtomicBool::new(false),
        stuck: AtomicUsize::new(0),
        release: tokio::sync::Notify::new(),
    });
    let leases = LeaseStore::with_lifetime(
        remote.clone(),
        0.1,
        Duration::from_secs(3600),
        LeaseMetrics::default(),
    );
    (remote, leases)
}

/// Tokens the bucket has left in the stand-in Redis (a check-only call).
async fn left_in_redis(remote: &Remote, name: &[u8], limit: u64) -> u64 {
    let applied = remote.memory.apply(&[op(name, limit, 0)]).await.unwrap();
    applied.buckets[0].view.remaining
}

/// A hot bucket gets a lease and is then answered without Redis calls; every token is
/// accounted for — Redis's remaining + admitted + held = capacity — and returning the
/// leases gives back exactly what was not spent.
#[tokio::test]
async fn a_hot_bucket_is_answered_from_its_lease_and_every_token_is_accounted_for() {
    let (remote, leases) = setup();
    let mut admitted = 0;
    for _ in 0..60 {
        let applied = leases.apply(&[op(b"hot", 1000, 1)]).await.unwrap();
        assert!(applied.committed);
        admitted += 1;
    }
    let (held, left) = leases.held();
    assert_eq!(held, 1, "a lease is held");
    assert!(
        remote.calls.load(Ordering::Relaxed) < 60,
        "some requests were answered locally"
    );
    assert_eq!(
        left_in_redis(&remote, b"hot", 1000).await + admitted + left,
        1000
    );
    leases.return_all().await;
    assert_eq!(leases.held(), (0, 0));
    assert_eq!(left_in_redis(&remote, b"hot", 1000).await, 1000 - admitted);
}

/// A lease held while another replica sets the bucket to 0 goes back for nothing: its tokens
/// were debited before the set, which decided what the bucket holds, so the return is
/// dropped and the bucket stays empty (a credited return would refill it by the lease).
#[tokio::test]
async fn a_lease_returned_after_a_set_gives_nothing_back() {
    let (remote, leases) = setup();
    for _ in 0..60 {
        leases.apply(&[op(b"hot", 1000, 1)]).await.unwrap();
    }
    let (held, left) = leases.held();
    assert!(held == 1 && left > 0, "a lease is held");
    // Another replica's operator sets the bucket to 0 (the console's set: cost = capacity).
    let set = BucketOp {
        enforce: false,
        ..op(b"hot", 1000, 1000)
    };
    let answer = remote.memory.set(&[set]).await.unwrap();
    assert_eq!(answer.buckets[0].view.remaining, 0);
    leases.return_all().await;
    assert_eq!(leases.held(), (0, 0));
    assert_eq!(
        left_in_redis(&remote, b"hot", 1000).await,
        0,
        "the lease's {left} tokens came back after the set"
    );
}

/// A request whose leased bucket admits locally but whose other bucket Redis denies
/// debits neither: the lease gets its tokens back.
#[tokio::test]
async fn a_denial_elsewhere_gives_the_tokens_back_to_the_lease() {
    let (remote, leases) = setup();
    for _ in 0..30 {
        leases.apply(&[op(b"hot", 1000, 1)]).await.unwrap();
    }
    let (_, before) = leases.held();
    assert!(before > 1, "a lease is held");
    let in_redis = left_in_redis(&remote, b"hot", 1000).await;
    // `small` is too small to lease (limit 5) and cannot take 6.
    let applied = leases
        .apply(&[op(b"hot", 1000, 1), op(b"small", 5, 6)])
        .await
        .unwrap();
    assert!(!applied.committed);
    assert!(applied.buckets[0].admitted, "the hot bucket alone admitted");
    assert_eq!(leases.held().1, before, "the lease has its token back");
    assert_eq!(left_in_redis(&remote, b"hot", 1000).await, in_redis);
    assert_eq!(left_in_redis(&remote, b"small", 5).await, 5);
    // Both fit: the leased token is spent, the other bucket debited in Redis.
    let applied = leases
        .apply(&[op(b"hot", 1000, 1), op(b"small", 5, 2)])
        .await
        .unwrap();
    assert!(applied.committed);
    assert_eq!(leases.held().1, before - 1);
    assert_eq!(left_in_redis(&remote, b"small", 5).await, 3);
}

/// Asking for a lease never turns an admission into a denial: when Redis has room for
/// the request but not for the lease asked beside it, the request is sent again without
/// the ask and admitted, and every token stays accounted for.
#[tokio::test]
async fn an_ask_that_does_not_fit_is_dropped_not_the_request() {
    let (remote, leases) = setup();
    let mut admitted = 0;
    while leases.held().0 == 0 {
        assert!(
            leases
                .apply(&[op(b"hot", 1000, 1)])
                .await
                .unwrap()
                .committed
        );
        admitted += 1;
    }
    // Another replica takes all but 3 tokens: the renewal's ask cannot fit.
    let taken = left_in_redis(&remote, b"hot", 1000).await - 3;
    let other = remote.memory.apply(&[op(b"hot", 1000, taken as i64)]).await;
    assert!(other.unwrap().committed);
    // Spend the lease down to its renewal and beyond: every request is admitted.
    for _ in 0..leases.held().1 + 2 {
        assert!(
            leases
                .apply(&[op(b"hot", 1000, 1)])
                .await
                .unwrap()
                .committed
        );
        admitted += 1;
    }
    let (_, held) = leases.held();
    assert_eq!(
        left_in_redis(&remote, b"hot", 1000).await + admitted + held + taken,
        1000
    );
}

/// Small buckets never get a lease: every request is a Redis call, as without leases.
#[tokio::test]
async fn small_buckets_always_go_to_redis() {
    let (remote, leases) = setup();
    for _ in 0..50 {
        leases.apply(&[op(b"small", 50, 1)]).await.unwrap();
    }
    assert_eq!(leases.held(), (0, 0));
    assert_eq!(remote.calls.load(Ordering::Relaxed), 50);
}

/// A lease past its lifetime is not spent; the sweep returns its rest to Redis.
#[tokio::test]
async fn expired_leases_are_swept_back() {
    let (remote, leases) = setup();
    for _ in 0..30 {
        leases.apply(&[op(b"hot", 1000, 1)]).await.unwrap();
    }
    let (_, left) = leases.held();
    assert!(left > 0);
    let in_redis = left_in_redis(&remote, b"hot", 1000).await;
    let returns = leases.sweep(Instant::now() + Duration::from_secs(3601));
    leases.send_returns(returns).await;
    assert_eq!(leases.held(), (0, 0));
    assert_eq!(left_in_redis(&remote, b"hot", 1000).await, in_redis + left);
}

/// A request that the leases answer alone is answered even while every place among the
/// calls to Redis is taken by calls Redis does not answer: it makes no call, so it neither
/// waits for a place nor is shed for want of one.
#[tokio::test]
async fn a_leased_answer_needs_no_place_among_the_calls_to_redis() {
    use crate::store::shed::INITIAL_LIMIT;
    use crate::store::{FailurePolicy, Resilience, ResilientStore};

    let (remote, leases) = setup();
    let store = Arc::new(ResilientStore::new(
        Arc::new(leases),
        Resilience {
            policy: FailurePolicy::Error,
            cache_capacity: 0,
            failure_threshold: u32::MAX,
            quiet_period: Duration::from_secs(3600),
            shed_deadline: Some(Duration::from_millis(100)),
        },
        None,
        StoreMetrics::register(&crate::telemetry::metrics::Metrics::new()),
    ));
    for _ in 0..30 {
        assert!(store.apply(&[op(b"hot", 1000, 1)]).await.unwrap().committed);
    }
    // Redis stops answering; calls on small (never leased) buckets take every place.
    remote.hold.store(true, Ordering::SeqCst);
    let calls: Vec<_> = (0..INITIAL_LIMIT)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .apply(&[op(format!("small{i}").as_bytes(), 50, 1)])
                    .await
            })
        })
        .collect();
    for _ in 0..100_000 {
        if remote.stuck.load(Ordering::SeqCst) as u64 == INITIAL_LIMIT {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(remote.stuck.load(Ordering::SeqCst) as u64, INITIAL_LIMIT);
    let before = remote.calls.load(Ordering::SeqCst);
    let applied = store.apply(&[op(b"hot", 1000, 1)]).await;
    assert!(
        applied.as_ref().is_ok_and(|applied| applied.committed),
        "answered from the lease, not shed: {applied:?}"
    );
    assert_eq!(remote.calls.load(Ordering::SeqCst), before, "no call");
    remote.hold.store(false, Ordering::SeqCst);
    remote.release.notify_waiters();
    for call in calls {
        assert!(call.await.unwrap().is_ok());
    }
}

/// Requests answered from leases alone ([`RemoteStore::answer_locally`], tried first as the
/// resilient store tries it) mixed with requests that then go through [`Store::apply`] (two
/// leased buckets; a cost the lease cannot cover beside a bucket it can) spend no token
/// twice and lose none: once the leases are returned, each bucket in Redis has its capacity
/// less exactly what was admitted. (A request never holds one bucket twice: the planner
/// folds a repeated bucket into one op.)
#[tokio::test]
async fn local_answers_spend_every_token_once() {
    let (remote, leases) = setup();
    let mut admitted = [0u64; 2];
    let mut local = 0;
    for i in 0..600u64 {
        let (a, b) = (op(b"a", 1000, 1), op(b"b", 1000, 1 + (i % 7) as i64));
        let ops = match i % 4 {
            0 | 1 => vec![a.clone()],
            2 => vec![a.clone(), b.clone()],
            // More than the lease holds, beside a bucket it can cover: taken from neither
            // lease (the other's tokens go back to it), and sent to Redis.
            _ => vec![b.clone(), op(b"a", 1000, 90)],
        };
        let applied = match leases.answer_locally(&ops) {
            Some(applied) => {
                local += 1;
                applied
            }
            None => leases.apply(&ops).await.unwrap(),
        };
        if applied.committed {
            for op in &ops {
                admitted[usize::from(op.key != a.key)] += op.cost.unsigned_abs();
            }
        }
    }
    assert!(local > 0, "some requests were answered locally");
    leases.return_all().await;
    assert_eq!(leases.held(), (0, 0));
    for (name, admitted) in [(b"a", admitted[0]), (b"b", admitted[1])] {
        let left = left_in_redis(&remote, name, 1000).await;
        assert_eq!(left + admitted, 1000, "{left} left and {admitted} admitted");
    }
}
