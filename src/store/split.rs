//! Per-second buckets in a Redis of their own (the reference's `REDIS_PERSECOND`).
//!
//! [`SplitStore`] routes each bucket operation of a request by its period: exactly one second
//! to the per-second store, anything else to the main one. A request touching only one of
//! them costs that store's call alone; one touching both sends the two calls at once and makes
//! them all-or-nothing together with [`super::fanout`]: if one side denies, what the other
//! committed is refunded (`floodgate_per_second_refunds_total` counts those refunds). Each
//! side may be any remote store — standalone, Sentinel or Cluster — so a cluster side refunds
//! across its own slots too.
//!
//! Both sides sit behind one [`super::ResilientStore`]: one circuit breaker, one failure
//! policy, one health; the probe checks both, since a request may need either.

use std::sync::Arc;

use async_trait::async_trait;

use super::fanout::{apply_groups, set_groups};
use super::{RemoteStore, Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp};
use crate::store::metrics::StoreMetrics;

/// The period routed to the per-second store: one second, in microseconds.
const ONE_SECOND_US: u64 = 1_000_000;

/// Two remote stores, one for per-second buckets and one for the rest.
pub struct SplitStore {
    /// Every bucket whose period is not one second.
    main: Arc<dyn RemoteStore>,
    /// Buckets of a one-second period.
    per_second: Arc<dyn RemoteStore>,
    /// Where refunds are counted.
    metrics: StoreMetrics,
}

impl SplitStore {
    /// Per-second buckets to `per_second`, the others to `main`.
    pub fn new(
        main: Arc<dyn RemoteStore>,
        per_second: Arc<dyn RemoteStore>,
        metrics: StoreMetrics,
    ) -> SplitStore {
        SplitStore {
            main,
            per_second,
            metrics,
        }
    }

    /// The side of `g` (0: main, 1: per second).
    fn side(&self, g: usize) -> &dyn RemoteStore {
        if g == 0 {
            self.main.as_ref()
        } else {
            self.per_second.as_ref()
        }
    }
}

/// Whether `op` belongs in the per-second store: the reference sends limits whose unit is
/// the second there, which for floodgate is a period of exactly one second.
pub fn is_per_second(op: &BucketOp) -> bool {
    op.params.period_us == ONE_SECOND_US
}

#[async_trait]
impl Store for SplitStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let (per_second, main): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| is_per_second(&ops[i]));
        // One side only (most requests): that store's own call, nothing to coordinate.
        if per_second.is_empty() {
            return self.main.apply(ops).await;
        }
        if main.is_empty() {
            return self.per_second.apply(ops).await;
        }
        apply_groups(
            ops,
            &[main, per_second],
            |g, group| async move { self.side(g).apply(&group).await },
            |ok| self.metrics.record_per_second_refund(ok),
        )
        .await
    }

    /// Each side's buckets set by that side's script ([`set_groups`]: nothing is refunded;
    /// a side that fails fails the call).
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let (per_second, main): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| is_per_second(&ops[i]));
        set_groups(ops, &[main, per_second], |g, group| async move {
            if group.is_empty() {
                return Ok(Applied::nothing());
            }
            self.side(g).set(&group).await
        })
        .await
    }

    /// The key in the store that holds it (both sides share the prefix, as the reference's
    /// two Redis do).
    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        self.main.stored_key(key)
    }

    fn name(&self) -> &'static str {
        "redis_split"
    }
}

#[async_trait]
impl RemoteStore for SplitStore {
    /// Both stores must be usable: a request may need either.
    async fn probe(&self) -> Result<(), StoreError> {
        let (main, per_second) = tokio::join!(self.main.probe(), self.per_second.probe());
        main.and(per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Algorithm, LimitParams};
    use crate::store::MemoryStore;
    use std::sync::atomic::{AtomicBool, Ordering};

    const NOW: i64 = 1_749_945_600_000_000;

    /// A memory store standing in for a Redis; `down` makes it fail like an outage.
    struct Fake {
        memory: MemoryStore,
        down: AtomicBool,
    }

    #[async_trait]
    impl Store for Fake {
        async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.memory.apply(ops).await
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
}
