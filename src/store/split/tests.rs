use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Algorithm, LimitParams};
use crate::store::MemoryStore;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

const NOW: i64 = 1_749_945_600_000_000;

/// A memory store standing in for a Redis; `down` makes it fail like an outage. Its
/// `held`-th call to `apply` (0-based; none by default) says it has `entered`, waits for
/// `release`, and says when it has been `applied`.
struct Fake {
    memory: MemoryStore,
    down: AtomicBool,
    calls: AtomicUsize,
    held: AtomicUsize,
    entered: Notify,
    release: Notify,
    applied: Notify,
}

#[async_trait]
impl Store for Fake {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("down".into()));
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) != self.held.load(Ordering::SeqCst) {
            return self.memory.apply(ops).await;
        }
        self.entered.notify_one();
        self.release.notified().await;
        let applied = self.memory.apply(ops).await;
        self.applied.notify_one();
        applied
    }
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("down".into()));
        }
        self.memory.set(ops).await
    }
    fn name(&self) -> &'static str {
        "fake"
    }
}

#[async_trait]
impl RemoteStore for Fake {
    async fn probe(&self) -> Result<(), StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::Unavailable("down".into())),
            false => Ok(()),
        }
    }
}

fn fake() -> Arc<Fake> {
    Arc::new(Fake {
        memory: MemoryStore::new(Arc::new(ManualClock::new(NOW))),
        down: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
        held: AtomicUsize::new(usize::MAX),
        entered: Notify::new(),
        release: Notify::new(),
        applied: Notify::new(),
    })
}

/// A fixed-window op on bucket `value` of `rate` per `period_s` seconds.
fn op(value: &str, period_s: u64, rate: u64) -> BucketOp {
    let params = LimitParams::of(Algorithm::FixedWindow, rate, period_s, rate);
    BucketOp::debit("d", "k", value.as_bytes(), params, 1)
}

fn split(main: &Arc<Fake>, per_second: &Arc<Fake>) -> SplitStore {
    SplitStore::new(
        main.clone(),
        per_second.clone(),
        StoreMetrics::register(&crate::telemetry::metrics::Metrics::new()),
    )
}

/// One-second buckets go to the per-second store, the others to the main one.
#[tokio::test]
async fn buckets_are_routed_by_period() {
    let (main, per_second) = (fake(), fake());
    let store = split(&main, &per_second);
    let applied = store
        .apply(&[op("a", 1, 5), op("b", 60, 5), op("c", 1, 5)])
        .await
        .unwrap();
    assert!(applied.committed);
    assert_eq!(per_second.memory.len(), 2);
    assert_eq!(main.memory.len(), 1);
    // Results come back in request order, each from its own store.
    assert!(
        applied
            .buckets
            .iter()
            .all(|b| b.admitted && b.view.remaining == 4)
    );
    // A request touching one side only is that side's call alone.
    store.apply(&[op("d", 60, 5)]).await.unwrap();
    assert_eq!((main.memory.len(), per_second.memory.len()), (2, 2));
}

/// A denial on either side refunds what the other side debited: nothing stays debited.
#[tokio::test]
async fn a_denial_on_one_side_refunds_the_other() {
    let (main, per_second) = (fake(), fake());
    let store = split(&main, &per_second);
    // The per-second bucket allows one request; the second request is denied there.
    let request = [op("minute", 60, 10), op("second", 1, 1)];
    assert!(store.apply(&request).await.unwrap().committed);
    let denied = store.apply(&request).await.unwrap();
    assert!(!denied.committed);
    assert!(denied.buckets[0].admitted && !denied.buckets[1].admitted);
    // The main side's debit was refunded: its view is as before the denied request.
    assert_eq!(denied.buckets[0].view.remaining, 9);
    let check = store.apply(&[op("minute", 60, 10)]).await.unwrap();
    assert_eq!(check.buckets[0].view.remaining, 8, "one debit, not two");
    // And the other way round: the main side denies, the per-second side is refunded.
    let request = [op("tight", 60, 1), op("loose", 1, 10)];
    assert!(store.apply(&request).await.unwrap().committed);
    let denied = store.apply(&request).await.unwrap();
    assert!(!denied.committed && denied.buckets[1].admitted);
    assert_eq!(denied.buckets[1].view.remaining, 9);
}

/// A refund outlives its caller: the request denied on the per-second side goes away (its
/// client cancelled) while the main side's refund is on its way, and the refund still lands.
#[tokio::test]
async fn a_refund_lands_when_the_caller_goes_away() {
    let (main, per_second) = (fake(), fake());
    let store = Arc::new(split(&main, &per_second));
    let request = [op("minute", 60, 10), op("second", 1, 1)];
    assert!(store.apply(&request).await.unwrap().committed);
    // The main side's calls: 0 the first request, 1 the second's debit, 2 its refund.
    main.held.store(2, Ordering::SeqCst);
    let denied = tokio::spawn({
        let (store, request) = (Arc::clone(&store), request.clone());
        async move { store.apply(&request).await }
    });
    main.entered.notified().await;
    denied.abort();
    assert!(denied.await.unwrap_err().is_cancelled());
    main.release.notify_one();
    tokio::time::timeout(Duration::from_secs(30), main.applied.notified())
        .await
        .expect("the refund was dropped with the request that made it");
    let check = store.apply(&[op("minute", 60, 10)]).await.unwrap();
    assert_eq!(check.buckets[0].view.remaining, 8, "one debit, not two");
}

/// A failed side fails the request, and the other side's debit is refunded.
#[tokio::test]
async fn a_failed_side_fails_the_request_and_refunds_the_other() {
    let (main, per_second) = (fake(), fake());
    let store = split(&main, &per_second);
    per_second.down.store(true, Ordering::SeqCst);
    let error = store
        .apply(&[op("minute", 60, 10), op("second", 1, 10)])
        .await
        .unwrap_err();
    assert!(error.is_transient());
    per_second.down.store(false, Ordering::SeqCst);
    let check = store.apply(&[op("minute", 60, 10)]).await.unwrap();
    assert_eq!(
        check.buckets[0].view.remaining, 9,
        "the failed request left no debit"
    );
    // The probe needs both sides.
    assert!(store.probe().await.is_ok());
    main.down.store(true, Ordering::SeqCst);
    assert!(store.probe().await.is_err());
}

/// A set whose other side fails fails the call, and the side that ran keeps its set:
/// nothing is sent to undo it (a set's cost negated would fill the bucket).
#[tokio::test]
async fn a_failed_side_fails_a_set_and_the_other_keeps_it() {
    let (main, per_second) = (fake(), fake());
    let store = split(&main, &per_second);
    main.down.store(true, Ordering::SeqCst);
    // Set to 0 remaining: a cost of the whole capacity on each side's bucket.
    let set = [op("a", 1, 5), op("b", 60, 5)].map(|op| BucketOp { cost: 5, ..op });
    assert!(store.set(&set).await.is_err());
    let check = BucketOp {
        cost: 0,
        ..op("a", 1, 5)
    };
    let after = per_second.memory.apply(&[check]).await.unwrap();
    assert_eq!(after.buckets[0].view.remaining, 0);
}
