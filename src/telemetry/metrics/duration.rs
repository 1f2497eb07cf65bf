//! A histogram of durations that serving threads record into without a lock and without
//! writing a cache line another thread writes.
//!
//! prometheus-client's `Histogram` takes a write lock per observation and keeps its sum, count
//! and buckets behind it: every request's time lands on the same lock and the same lines,
//! written by every serving thread in turn. This one keeps a stripe per thread (threads are
//! given stripes in turn, so up to [`STRIPES`] threads each write their own), each stripe
//! its own cache lines: an observation is two relaxed atomic adds on lines its thread alone
//! writes. The sum is kept in whole nanoseconds, exact; an exposition adds the stripes up and
//! shows seconds, as the `Histogram` did, with the same buckets.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Stripes per histogram: more than the serving threads of a typical pod, few enough that a
/// histogram stays a few KiB.
pub(super) const STRIPES: usize = 8;

/// The most finite buckets a histogram may have.
const MAX_BUCKETS: usize = 20;

/// One thread's share: its sum and its counts (the last one past every bound, `+Inf`).
#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    sum_ns: AtomicU64,
    counts: [AtomicU64; MAX_BUCKETS + 1],
}

struct Inner {
    /// The buckets' upper bounds in seconds, as exposed.
    bounds: Box<[f64]>,
    /// The same in whole nanoseconds: an observation of `n` ns falls in the first bucket
    /// whose bound is at least `n`.
    bounds_ns: Box<[u64]>,
    stripes: Box<[Stripe]>,
}

/// A duration histogram, exposed in seconds (see the module).
#[derive(Clone)]
pub struct DurationHistogram(Arc<Inner>);

impl std::fmt::Debug for DurationHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (sum, count, _) = self.snapshot();
        write!(f, "DurationHistogram(count {count}, sum {sum} s)")
    }
}

impl DurationHistogram {
    /// A histogram of `buckets` upper bounds in seconds (ascending; at most twenty
    /// of them are kept), plus `+Inf`.
    pub fn new(buckets: impl IntoIterator<Item = f64>) -> DurationHistogram {
        let bounds: Box<[f64]> = buckets.into_iter().take(MAX_BUCKETS).collect();
        // Saturating float-to-int conversion: a bound past u64's ns (584 years) is +Inf.
        let bounds_ns = bounds.iter().map(|s| (s * 1e9).round() as u64).collect();
        DurationHistogram(Arc::new(Inner {
            bounds,
            bounds_ns,
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }))
    }

    /// Records one duration.
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.0;
        let bucket = inner
            .bounds_ns
            .iter()
            .position(|&bound| ns <= bound)
            .unwrap_or(inner.bounds_ns.len());
        let stripe = &inner.stripes[stripe_index()];
        stripe.sum_ns.fetch_add(ns, Ordering::Relaxed);
        stripe.counts[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The sum in seconds, the count, and each bucket's own count (not cumulative), `+Inf`
    /// last as `f64::MAX`, as prometheus-client's encoder takes them.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.0;
        let mut sum_ns: u64 = 0;
        let mut buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .map(|bound| (bound, 0))
            .collect();
        for stripe in inner.stripes.iter() {
            sum_ns = sum_ns.wrapping_add(stripe.sum_ns.load(Ordering::Relaxed));
            for (bucket, count) in buckets.iter_mut().zip(&stripe.counts) {
                bucket.1 += count.load(Ordering::Relaxed);
            }
        }
        let count = buckets.iter().map(|(_, n)| n).sum();
        (sum_ns as f64 / 1e9, count, buckets)
    }

    /// Observations so far.
    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.snapshot().1
    }
}

/// This thread's stripe, given out in turn the first time a thread observes anything.
pub(super) fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| {
        let mut index = stripe.get();
        if index == usize::MAX {
            index = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
            stripe.set(index);
        }
        index
    })
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests;
