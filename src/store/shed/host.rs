//! The host's scheduling delay, as the runtime thread that answers a call sees it: how long a
//! task that is ready waits before its thread polls it. [`super::Controller`] takes it out of
//! a call's latency, so that a busy host is not read as a congested Redis.
//!
//! Why: floodgate runs one single-threaded runtime per core ([`crate::runtime`]). Once the
//! host's CPU saturates, a Redis reply that arrived waits in its thread's run queue behind
//! every other ready task before its call sees it, and that wait grows with the load, not with
//! the calls sent to Redis. Fewer calls in flight do not shorten it (a shed answer costs the
//! host about what an answer from Redis costs), so a bound cut for it only sheds calls Redis
//! could have answered, down to its floor.
//!
//! How: a probe task on each runtime thread (`runtime::host`, spawned by [`crate::runtime`])
//! samples how long a ready task waits for its thread every [`PERIOD`] and publishes the
//! smoothed sample ([`Delay`]) here: in a thread-local cell that [`current`] reads, and in a
//! cell of its own that [`largest`] reads (for `floodgate_host_delay_seconds`, at every
//! scrape). An answer waits at least two such rounds (the connection's task reads it, then
//! the call's task takes it), so a call is credited twice the delay. The request path pays
//! one thread-local read per call and completion; no lock, no syscall. A thread without a
//! probe (a test's runtime) reads 0: no delay is taken out.
//!
//! The probe runs only while its thread makes calls to Redis ([`call_started`], from
//! [`super::Shedder::admit`], wakes a parked one). This file holds what the calls and the
//! probe share; the probe's task is `runtime::host`'s, as the runtime threads are.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

/// How often the probe samples: often enough that the delay is known within a round trip or
/// two of the host saturating, rarely enough that a thread barely wakes for it (an idle one
/// not at all: the probe parks, see the module doc).
pub const PERIOD: Duration = Duration::from_millis(5);

/// A probe whose thread began no call to Redis for this many samples in a row (100 ms) parks
/// until the next one.
pub const IDLE_SAMPLES: u32 = 20;

thread_local! {
    /// This thread's smoothed scheduling delay (ns), written by its probe.
    static DELAY_NS: Cell<u64> = const { Cell::new(0) };
    /// Calls to Redis this thread began ([`call_started`]): the probe runs while it moves.
    static CALLS: Cell<u64> = const { Cell::new(0) };
    /// The parked probe of this thread, woken by the next call.
    static PARKED: Cell<Option<Waker>> = const { Cell::new(None) };
    /// Samples this thread's probe took, and whether it is parked now (for the tests).
    static SAMPLES: Cell<u64> = const { Cell::new(0) };
    static IS_PARKED: Cell<bool> = const { Cell::new(false) };
}

/// A call to Redis begins on this thread: the probe must run (woken if parked).
pub fn call_started() {
    CALLS.with(|calls| calls.set(calls.get().wrapping_add(1)));
    if let Some(probe) = PARKED.with(Cell::take) {
        probe.wake();
    }
}

/// Waits until this thread begins a call to Redis after `seen` calls: a parked probe.
pub async fn parked(seen: u64) {
    std::future::poll_fn(|cx| {
        let woken = CALLS.with(Cell::get) != seen;
        IS_PARKED.with(|parked| parked.set(!woken));
        if woken {
            return Poll::Ready(());
        }
        PARKED.with(|parked| parked.set(Some(cx.waker().clone())));
        Poll::Pending
    })
    .await;
}

/// Every running probe's smoothed delay (ns), one cell per probe: a probe that ended (its
/// runtime shut down) leaves a dead reference, dropped at the next read.
static PROBES: Mutex<Vec<Weak<AtomicU64>>> = Mutex::new(Vec::new());

/// The largest smoothed scheduling delay of the runtime threads running a probe now (0 when
/// none runs): the thread that delays its calls most.
pub fn largest() -> Duration {
    let mut probes = PROBES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut largest = 0;
    probes.retain(|probe| match probe.upgrade() {
        Some(delay) => {
            largest = largest.max(delay.load(Ordering::Relaxed));
            true
        }
        None => false,
    });
    Duration::from_nanos(largest)
}

/// How many times a call's answer waits for its thread at least: the Redis connection's task
/// is polled to read the reply, then the call's own task to take it (the request's way out
/// through the connection's task is not counted).
pub const ROUNDS_PER_ANSWER: u64 = 2;

/// The delay the calling thread's runtime adds to a call's answer now (ns; 0 without a
/// probe): twice its smoothed scheduling delay (`ROUNDS_PER_ANSWER`).
pub fn current() -> u64 {
    DELAY_NS.with(Cell::get).saturating_mul(ROUNDS_PER_ANSWER)
}

/// The smoothed scheduling delay: a moving average that rises half-way to a larger sample
/// (a host that saturates is known within a sample or two, before the calls it delays cut
/// the bound) and falls an eighth of the way to a smaller one (a short lull while the host
/// stays busy does not lose it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Delay {
    average_ns: u64,
}

impl Delay {
    /// Adds a sample (ns) and returns the smoothed delay.
    pub fn observe(&mut self, sample_ns: u64) -> u64 {
        let average = self.average_ns;
        self.average_ns = if sample_ns >= average {
            average + (sample_ns - average) / 2
        } else {
            average - (average - sample_ns) / 8
        };
        self.average_ns
    }

    /// The smoothed delay (ns).
    pub fn get(&self) -> u64 {
        self.average_ns
    }
}

/// Calls to Redis this thread began so far ([`call_started`]).
pub fn calls_started() -> u64 {
    CALLS.with(Cell::get)
}

/// A probe starts on this thread: its cell among those [`largest`] reads.
pub fn register() -> Arc<AtomicU64> {
    let published = Arc::new(AtomicU64::new(0));
    PROBES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Arc::downgrade(&published));
    published
}

/// The probe of this thread took a sample: its smoothed delay (ns) is now `smoothed`, for
/// the calls of this thread ([`current`]) and for [`largest`] (through `published`).
pub fn publish(published: &AtomicU64, smoothed: u64) {
    DELAY_NS.with(|cell| cell.set(smoothed));
    published.store(smoothed, Ordering::Relaxed);
    SAMPLES.with(|samples| samples.set(samples.get() + 1));
}

/// The probe of this thread parks: nobody on it reads the delay, which reads 0 until it
/// samples again.
pub fn forget(published: &AtomicU64) {
    DELAY_NS.with(|cell| cell.set(0));
    published.store(0, Ordering::Relaxed);
}

/// Samples this thread's probe took, and whether it is parked now.
#[cfg(test)]
pub fn probe_state() -> (u64, bool) {
    (SAMPLES.with(Cell::get), IS_PARKED.with(Cell::get))
}

#[cfg(test)]
mod tests;
