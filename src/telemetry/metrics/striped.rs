//! A counter that serving threads add to without writing a cache line another thread writes,
//! for the series every request counts.
//!
//! A prometheus-client `Counter` is one atomic: every serving thread adds to the same line in
//! turn, and each add first takes that line from the core that wrote it last, more often the
//! more threads serve. [`StripedCounter`] is the same `Counter`, with [`Striped`] as its
//! store: one atomic until [`Striped::spread`] gives it stripes (one per CPU, threads given
//! them in turn as [`super::DurationHistogram`]'s are), after which an add is one relaxed
//! atomic add on a line its thread alone writes (while the threads are no more than the
//! stripes), and a read adds the stripes up. Its exposition is the `Counter`'s own, byte for
//! byte.
//!
//! Only series that every request counts are spread, when their handle is resolved
//! (`floodgate_requests_total`, a configured domain's and a configured rule's hit and verdict
//! series): a spread counter takes a cache line pair per stripe, one stripe per CPU up to
//! eight (1 KiB at most), so the series that request values create (`detailed_metric`), up to
//! `--metrics-max-detailed-series` of them, stay one atomic each.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::{Atomic, Counter};

use super::duration::{STRIPES, stripe_index};

/// A `Counter` whose adds can be spread over per-thread stripes (see the module).
pub(super) type StripedCounter = Counter<u64, Striped>;

/// One thread's share of a spread counter, on lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// The store of a [`StripedCounter`]: what was added before it was spread, and the stripes
/// once it is.
#[derive(Default)]
pub(super) struct Striped {
    base: AtomicU64,
    stripes: OnceLock<Box<[Stripe]>>,
}

impl Striped {
    /// From now on, adds go to the adding thread's stripe. Idempotent; the count carries on.
    pub(super) fn spread(&self) {
        self.stripes
            .get_or_init(|| (0..stripe_count()).map(|_| Stripe::default()).collect());
    }

    /// Whether [`Striped::spread`] was called.
    #[cfg(test)]
    pub(super) fn is_spread(&self) -> bool {
        self.stripes.get().is_some()
    }
}

impl std::fmt::Debug for Striped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Striped({})", Atomic::get(self))
    }
}

impl Atomic<u64> for Striped {
    fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    /// Adds `v`. Returns the previous value of the part it added to (the stripe's, once
    /// spread), not the counter's: nothing in floodgate reads it, and a whole previous
    /// value would take reading every stripe.
    fn inc_by(&self, v: u64) -> u64 {
        match self.stripes.get() {
            // The count is a power of two: the mask is the thread's stripe modulo it.
            Some(stripes) => stripes[stripe_index() & (stripes.len() - 1)]
                .0
                .fetch_add(v, Ordering::Relaxed),
            None => self.base.fetch_add(v, Ordering::Relaxed),
        }
    }

    /// The sum of every part. Each part only grows, and a later read of a part never sees
    /// less than an earlier one did, so the sum never goes backwards either.
    fn get(&self) -> u64 {
        let spread = self.stripes.get().map_or(0, |stripes| {
            stripes.iter().fold(0u64, |sum, stripe| {
                sum.wrapping_add(stripe.0.load(Ordering::Relaxed))
            })
        });
        self.base.load(Ordering::Relaxed).wrapping_add(spread)
    }
}

/// Stripes per spread counter: the host's CPUs rounded up to a power of two, at most
/// [`STRIPES`] (two on a two-core pod: 256 bytes, not 1 KiB).
fn stripe_count() -> usize {
    static COUNT: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
        std::thread::available_parallelism()
            .map_or(STRIPES, |n| n.get().next_power_of_two())
            .min(STRIPES)
    });
    *COUNT
}

#[cfg(test)]
mod tests;
