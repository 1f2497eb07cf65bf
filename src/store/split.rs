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
    fn side(&self, g: usize) -> &Arc<dyn RemoteStore> {
        if g == 0 { &self.main } else { &self.per_second }
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
        // The runners own what they use: a refund outlives a caller that goes away (fanout).
        let metrics = self.metrics.clone();
        apply_groups(
            ops,
            &[main, per_second],
            |g, group| {
                let side = Arc::clone(self.side(g));
                async move { side.apply(&group).await }
            },
            move |ok| metrics.record_per_second_refund(ok),
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
mod tests;
