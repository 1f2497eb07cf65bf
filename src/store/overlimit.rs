//! The local over-limit cache: answer OVER_LIMIT without a Redis call for a bucket that Redis
//! recently said cannot pass. Overdraft buckets are never cached: their debits always apply.
//!
//! When Redis denies cost `c` on a bucket with "retry after d", then until `sent + d` (measured
//! from when the request was *sent*, so never later than Redis's own answer) any cost `>= c`
//! on that bucket must be denied too: a bucket only gains room with time, and every algorithm's
//! retry time is exact for that cost. Remembering the pair (until, smallest denied cost) is
//! therefore never stricter than Redis, except for one case documented in README: a refund
//! (`is_negative_hits`) sent to *another* replica, or a limit raised by a reload elsewhere,
//! is not seen until the entry expires. Refunds through this replica and reloads clear entries.
//!
//! Bounded by entry count (moka evicts the least useful entries past it, counted in
//! `floodgate_local_cache_evictions_total`); each entry expires at its own `until`. Its size is
//! published as `floodgate_local_cache_entries` at every metrics exposition.
//!
//! Most of the time nothing is over limit, and every request would still look each of its
//! buckets up: the cache also keeps the latest `until` of any entry it ever held, and while
//! that has passed it answers "unknown" without a lookup (exact: no entry can deny then).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::notification::RemovalCause;
use moka::sync::Cache;

use crate::bucket::{Applied, BucketKey, BucketOp, BucketResult};
use crate::limiter::View;
use crate::store::metrics::StoreMetrics;

/// What is known about one bucket.
#[derive(Clone, Copy, Debug)]
struct KnownEmpty {
    /// Until when the bucket cannot admit `min_cost`.
    until: Instant,
    /// The smallest cost Redis denied on it.
    min_cost: i64,
    /// When Redis said the bucket would be full again (its `duration_until_reset`).
    full_at: Instant,
}

struct UntilExpiry;

impl Expiry<BucketKey, KnownEmpty> for UntilExpiry {
    fn expire_after_create(
        &self,
        _key: &BucketKey,
        value: &KnownEmpty,
        created_at: Instant,
    ) -> Option<Duration> {
        Some(value.until.saturating_duration_since(created_at))
    }

    fn expire_after_update(
        &self,
        _key: &BucketKey,
        value: &KnownEmpty,
        updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.until.saturating_duration_since(updated_at))
    }
}

/// Buckets known to deny, for a while.
pub struct OverLimitCache {
    entries: Cache<BucketKey, KnownEmpty>,
    /// When the cache was made: [`OverLimitCache::latest`] counts from it.
    epoch: Instant,
    /// The latest `until` of any entry ever inserted, in ns since `epoch` (only grows): once
    /// it has passed, no entry can deny, and [`OverLimitCache::answer`] needs no lookup.
    latest: AtomicU64,
}

impl OverLimitCache {
    /// A cache holding at most `capacity` buckets, counting evictions in `metrics` (if any).
    pub fn new(capacity: u64, metrics: Option<StoreMetrics>) -> OverLimitCache {
        let mut builder = Cache::builder()
            .max_capacity(capacity)
            .expire_after(UntilExpiry);
        if let Some(metrics) = metrics {
            builder = builder.eviction_listener(move |_key, _value, cause| {
                // Expiry and invalidation are the entry's natural end; only `Size` is the
                // bound at work (moka also reports a new entry it declined to admit so).
                if cause == RemovalCause::Size {
                    metrics.record_local_cache_evictions(1);
                }
            });
        }
        OverLimitCache {
            entries: builder.build(),
            epoch: Instant::now(),
            latest: AtomicU64::new(0),
        }
    }

    /// `at` in ns since the cache was made (0 before it; saturating far in the future).
    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// How many buckets it holds, once pending evictions have run (moka applies its bound
    /// in batches, so the raw count may briefly exceed the capacity).
    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }

    /// True when it holds no bucket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When every op of the request is known to deny at `now`, the answer Redis would give
    /// (nothing debited; each bucket's retry and reset as Redis last reported them), with no
    /// store call. A request with any other bucket goes to Redis: its status would otherwise
    /// carry numbers nobody measured.
    pub fn answer(&self, ops: &[BucketOp], now: Instant) -> Option<Applied> {
        // Every entry's `until` has passed (or none was ever held): none can deny.
        if self.since_epoch(now) >= self.latest.load(Ordering::Relaxed) {
            return None;
        }
        let buckets = ops
            .iter()
            .map(|op| {
                let known = self.denies(op, now)?;
                let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                Some(BucketResult {
                    admitted: false,
                    view: View {
                        remaining: 0,
                        reset_us: us(known.full_at.saturating_duration_since(now)),
                    },
                    retry_after_us: Some(us(known.until - now)),
                    window: None,
                    at_us: None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        (!buckets.is_empty()).then_some(Applied {
            committed: false,
            buckets,
            from_local_cache: true,
            delay_us: 0,
        })
    }

    fn denies(&self, op: &BucketOp, now: Instant) -> Option<KnownEmpty> {
        // An overdraft debit is always applied: it must reach the store.
        if !op.enforce || op.cost <= 0 || op.params.overdraft {
            return None;
        }
        self.entries
            .get(&op.key)
            .filter(|k| now < k.until && op.cost >= k.min_cost)
    }

    /// Learns from the store's answer to `ops`, sent at `sent`.
    pub fn learn(&self, ops: &[BucketOp], applied: &Applied, sent: Instant) {
        for (op, result) in ops.iter().zip(&applied.buckets) {
            if op.cost < 0 && applied.committed {
                // A refund through us: whatever we knew is stale.
                self.entries.invalidate(&op.key);
                continue;
            }
            if !op.enforce || op.cost <= 0 || op.params.overdraft || result.admitted {
                continue;
            }
            let Some(wait_us) = result.retry_after_us.filter(|&w| w > 0) else {
                // None: this cost can never pass, which says nothing about smaller costs.
                continue;
            };
            let until = sent + Duration::from_micros(wait_us);
            let full_at = sent + Duration::from_micros(result.view.reset_us);
            let min_cost = self
                .entries
                .get(&op.key)
                .filter(|k| k.until >= until)
                .map_or(op.cost, |k| k.min_cost.min(op.cost));
            // Relaxed: a lookup on another thread that does not see it yet goes to Redis,
            // which answers what the entry would have (the cache only ever saves a call).
            self.latest
                .fetch_max(self.since_epoch(until), Ordering::Relaxed);
            self.entries.insert(
                op.key.clone(),
                KnownEmpty {
                    until,
                    min_cost,
                    full_at,
                },
            );
        }
    }

    /// Forgets what it knows of the buckets of `ops` (they were reset).
    pub fn forget(&self, ops: &[BucketOp]) {
        for op in ops {
            self.entries.invalidate(&op.key);
        }
    }

    /// Forgets everything (the limits changed).
    pub fn clear(&self) {
        self.entries.invalidate_all();
    }
}

#[cfg(test)]
mod tests;
