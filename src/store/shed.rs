//! Early shedding in front of Redis: when a queue stands in front of Redis, the calls that
//! could not be answered in time are answered at once instead of after the deadline.
//!
//! Envoy's fleet is an open loop: requests keep arriving whether or not floodgate answers the
//! earlier ones. When they arrive faster than Redis can run the script, the calls queue in
//! front of Redis, every call waits longer, and soon every call runs out of the command
//! deadline (`--redis-timeout-ms`) — after Redis did its work for nothing, since the answer
//! comes too late. Shedding answers the excess immediately, by the failure policy, so the
//! rest are answered in time and Redis only works on calls whose answers are used.
//!
//! The signal is the one CoDel uses for network queues: a *standing* queue, seen as the
//! shortest latency of the calls completed in an interval ([`INTERVAL`]) staying above a
//! target (half the deadline). A burst that drains within the interval does not trigger it;
//! neither does one slow call. While shedding, at most `throughput × target` calls are in
//! flight (Little's law: that many calls complete within the target at the throughput Redis
//! just showed), recomputed every interval; a call beyond that is shed. Shedding ends after
//! an interval in which nothing was shed and the shortest latency was back under the target.
//!
//! Everything is a handful of atomics on the request path: one increment and one decrement
//! of the in-flight count, a `fetch_min` and an increment per completion; once per interval
//! one completion recomputes the bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the shortest latency must stay above the target before shedding starts, and how
/// often the bound is recomputed: long enough that a burst drains within it, short enough
/// that a standing queue is cut within a few deadlines.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// The bound never goes below this many calls in flight: a store that completes a few calls
/// per interval (Redis nearly down) still gets calls, so it is noticed when it recovers.
const MIN_BOUND: u64 = 4;

/// No bound: not shedding.
const UNBOUNDED: u64 = u64::MAX;

/// The standing-queue detector and the in-flight bound of one store.
#[derive(Debug)]
pub struct Shedder {
    /// The latency a call may reach without counting as queued: half the deadline.
    target_ns: u64,
    /// Where the nanosecond clock below starts.
    epoch: Instant,
    /// Calls sent and not yet answered.
    in_flight: AtomicU64,
    /// Calls allowed in flight ([`UNBOUNDED`] while not shedding).
    bound: AtomicU64,
    /// Start of the current interval, ns since `epoch`.
    interval_start_ns: AtomicU64,
    /// Shortest latency completed in the current interval, ns.
    min_latency_ns: AtomicU64,
    /// Calls completed in the current interval.
    completed: AtomicU64,
    /// Calls shed in the current interval.
    shed: AtomicU64,
}

/// A call let through, counted in flight until it is dropped: when the store answered, failed
/// or timed out, or when the request was cancelled — the latency is what the caller waited.
#[derive(Debug)]
#[must_use = "dropping the call ends it at once"]
pub struct Admitted<'a> {
    shedder: &'a Shedder,
    sent: Instant,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        self.shedder.record(now.duration_since(self.sent), now);
    }
}

impl Shedder {
    /// A shedder for a store whose calls have `deadline` to complete.
    pub fn new(deadline: Duration) -> Shedder {
        let target = deadline / 2;
        Shedder {
            target_ns: u64::try_from(target.as_nanos()).unwrap_or(u64::MAX).max(1),
            epoch: Instant::now(),
            in_flight: AtomicU64::new(0),
            bound: AtomicU64::new(UNBOUNDED),
            interval_start_ns: AtomicU64::new(0),
            min_latency_ns: AtomicU64::new(u64::MAX),
            completed: AtomicU64::new(0),
            shed: AtomicU64::new(0),
        }
    }

    /// Lets a call through, or `None` to shed it: the store is shedding and the bound of
    /// calls in flight is reached.
    pub fn admit(&self) -> Option<Admitted<'_>> {
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if before >= self.bound.load(Ordering::Relaxed) {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.shed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Admitted {
            shedder: self,
            sent: Instant::now(),
        })
    }

    /// Records the end of a call that took `latency`, at `now`.
    fn record(&self, latency: Duration, now: Instant) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.min_latency_ns
            .fetch_min(nanos(latency), Ordering::Relaxed);
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.maybe_end_interval(nanos(now.duration_since(self.epoch)));
    }

    /// True while calls beyond a bound are shed.
    pub fn is_shedding(&self) -> bool {
        self.bound.load(Ordering::Relaxed) != UNBOUNDED
    }

    /// The bound of calls in flight, `None` while not shedding.
    pub fn bound(&self) -> Option<u64> {
        Some(self.bound.load(Ordering::Relaxed)).filter(|&b| b != UNBOUNDED)
    }

    /// At the end of an interval, one completion (the one that wins the start's
    /// compare-and-swap) decides from the interval's figures whether to shed in the next.
    fn maybe_end_interval(&self, now_ns: u64) {
        let start = self.interval_start_ns.load(Ordering::Relaxed);
        let interval_ns = nanos(INTERVAL);
        let elapsed = now_ns.saturating_sub(start);
        if elapsed < interval_ns
            || self
                .interval_start_ns
                .compare_exchange(start, now_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let min_latency = self.min_latency_ns.swap(u64::MAX, Ordering::Relaxed);
        let completed = self.completed.swap(0, Ordering::Relaxed);
        let shed = self.shed.swap(0, Ordering::Relaxed);
        let queued = min_latency > self.target_ns;
        let shedding = if self.is_shedding() {
            queued || shed > 0
        } else {
            queued
        };
        let bound = if shedding {
            // Little's law: calls that complete within the target at this throughput.
            let per_target =
                u128::from(completed) * u128::from(self.target_ns) / u128::from(elapsed);
            u64::try_from(per_target)
                .unwrap_or(UNBOUNDED - 1)
                .max(MIN_BOUND)
        } else {
            UNBOUNDED
        };
        self.bound.store(bound, Ordering::Relaxed);
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Admits a call and completes it `at` after the shedder's start, having taken `latency`.
    fn complete(shedder: &Shedder, latency: Duration, at: Duration) {
        std::mem::forget(shedder.admit().expect("admitted"));
        shedder.record(latency, shedder.epoch + at);
    }

    const DEADLINE: Duration = Duration::from_millis(10);

    #[test]
    fn fast_calls_never_shed() {
        let shedder = Shedder::new(DEADLINE);
        for i in 1..=1000u32 {
            complete(&shedder, Duration::from_millis(4), INTERVAL / 100 * i);
        }
        assert!(!shedder.is_shedding());
        let calls: Vec<_> = (0..10_000).map(|_| shedder.admit()).collect();
        assert!(calls.iter().all(Option::is_some), "not shedding: no bound");
    }

    #[test]
    fn one_slow_call_in_an_interval_does_not_start_shedding() {
        let shedder = Shedder::new(DEADLINE);
        complete(&shedder, Duration::from_millis(50), INTERVAL / 2);
        complete(&shedder, Duration::from_millis(1), INTERVAL / 2);
        complete(&shedder, Duration::from_millis(1), INTERVAL + INTERVAL / 10);
        assert!(!shedder.is_shedding());
    }

    #[test]
    fn a_standing_queue_bounds_calls_in_flight_by_littles_law() {
        let shedder = Shedder::new(DEADLINE);
        // 1000 completions in the first interval, none faster than 6 ms (> the 5 ms target):
        // 10,000 calls per second, so 50 complete within the target.
        for i in 1..=1000u32 {
            complete(&shedder, Duration::from_millis(6), INTERVAL / 1000 * i);
        }
        assert_eq!(shedder.bound(), Some(50));
        let calls: Vec<_> = (0..60).map(|_| shedder.admit()).collect();
        assert_eq!(calls.iter().filter(|c| c.is_some()).count(), 50);
    }

    #[test]
    fn shedding_ends_after_a_quiet_interval_under_the_target() {
        let shedder = Shedder::new(DEADLINE);
        for i in 1..=100u32 {
            complete(&shedder, Duration::from_millis(8), INTERVAL / 100 * i);
        }
        assert!(shedder.is_shedding());
        // Next interval: fast, but calls were still shed in it: keeps shedding.
        let held: Vec<_> = std::iter::from_fn(|| shedder.admit()).take(1000).collect();
        assert!(held.len() < 1000 && shedder.admit().is_none());
        drop(held);
        for i in 1..=100u32 {
            complete(
                &shedder,
                Duration::from_millis(1),
                INTERVAL + INTERVAL / 100 * i,
            );
        }
        assert!(
            shedder.is_shedding(),
            "shed in that interval: still shedding"
        );
        for i in 1..=100u32 {
            complete(
                &shedder,
                Duration::from_millis(1),
                INTERVAL * 2 + INTERVAL / 100 * i,
            );
        }
        assert!(
            !shedder.is_shedding(),
            "nothing shed, latency under target: stops"
        );
    }

    #[test]
    fn the_bound_never_goes_below_the_minimum() {
        let shedder = Shedder::new(DEADLINE);
        complete(&shedder, Duration::from_secs(1), INTERVAL * 3);
        assert_eq!(shedder.bound(), Some(MIN_BOUND));
    }
}
