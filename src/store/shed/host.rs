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
//! How: [`probe`] runs on each runtime thread (spawned by [`crate::runtime`]). Every
//! [`PERIOD`] it sleeps until a due time and measures how late it woke (less the timer's
//! granularity), then yields once and measures how long the thread took to come back to it
//! (one round of its run queue): the larger is the sample. [`Delay`] smooths the samples; the
//! result sits in a thread-local cell that [`current`] reads. An answer waits at least two
//! such rounds (the connection's task reads it, then the call's task takes it), so a call is
//! credited twice the delay. The request path pays one
//! thread-local read per call and completion; no lock, no syscall. A thread without a probe
//! (a test's runtime) reads 0: no delay is taken out.
//!
//! Each probe also publishes its smoothed delay in a cell of its own, registered once when it
//! starts; [`largest`] reads them all (for `floodgate_host_delay_seconds`, at every scrape),
//! so an operator sees when the host, not Redis, is what slows the answers. The probe pays
//! one relaxed store per sample for it.
//!
//! **Idle, it sleeps.** The delay is only read by calls to Redis on the probe's thread, so a
//! probe whose thread began no such call ([`call_started`], from [`super::Shedder::admit`])
//! for [`IDLE_SAMPLES`] samples in a row (100 ms) parks: its delay reads 0, and it takes no
//! timer and no wake-up until the thread's next call wakes it (one thread-local read and
//! write per call). An idle server's threads then sleep instead of waking 200 times a
//! second each; under load a thread never goes 100 ms without a call, and the first calls
//! after a pause see no delay until the probe's first samples (5 ms later, rising half-way
//! per sample).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use super::controller::nanos;

/// How often the probe samples: often enough that the delay is known within a round trip or
/// two of the host saturating, rarely enough that a thread barely wakes for it (an idle one
/// not at all: the probe parks, see the module doc).
pub const PERIOD: Duration = Duration::from_millis(5);

/// tokio's timers fire on whole milliseconds: a wake up to this late is the timer's rounding,
/// not the host's delay.
const GRANULARITY: Duration = Duration::from_millis(1);

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

/// Waits until this thread begins a call to Redis after `seen` calls.
async fn parked(seen: u64) {
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
const ROUNDS_PER_ANSWER: u64 = 2;

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

/// Samples the calling thread's scheduling delay every [`PERIOD`] while the thread makes
/// calls to Redis, parked meanwhile (see the module doc), for ever: spawn it once on each
/// single-threaded runtime whose calls go through a [`super::Shedder`].
pub async fn probe() {
    let mut delay = Delay::default();
    let published = Arc::new(AtomicU64::new(0));
    PROBES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Arc::downgrade(&published));
    let mut seen = CALLS.with(Cell::get);
    let mut idle = 0;
    loop {
        let due = tokio::time::Instant::now() + PERIOD;
        tokio::time::sleep_until(due).await;
        let woke = tokio::time::Instant::now();
        let late = woke
            .saturating_duration_since(due)
            .saturating_sub(GRANULARITY);
        // Back of the run queue: polled again once the tasks ready now have run.
        tokio::task::yield_now().await;
        let round = woke.elapsed();
        let smoothed = delay.observe(nanos(late.max(round)));
        DELAY_NS.with(|cell| cell.set(smoothed));
        published.store(smoothed, Ordering::Relaxed);
        SAMPLES.with(|samples| samples.set(samples.get() + 1));
        let calls = CALLS.with(Cell::get);
        if calls == seen {
            idle += 1;
        } else {
            (seen, idle) = (calls, 0);
        }
        if idle >= IDLE_SAMPLES {
            // Nobody on this thread reads the delay: forget it, sleep until a call.
            delay = Delay::default();
            DELAY_NS.with(|cell| cell.set(0));
            published.store(0, Ordering::Relaxed);
            parked(seen).await;
            (seen, idle) = (CALLS.with(Cell::get), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smoothed delay rises half-way to a larger sample and falls an eighth of the way to
    /// a smaller one.
    #[test]
    fn the_delay_rises_fast_and_falls_slowly() {
        let mut delay = Delay::default();
        assert_eq!(delay.observe(8_000), 4_000);
        assert_eq!(delay.observe(8_000), 6_000);
        assert_eq!(delay.observe(0), 5_250);
        assert_eq!(delay.get(), 5_250);
    }

    /// Runs the probe on a current-thread runtime of this thread, keeps the thread busy 20 ms
    /// at a time (the probe waits behind it) until the probe has published a delay (at most
    /// 1,000 rounds), then runs `check` while the probe still runs.
    fn with_a_busy_probed_thread(check: impl FnOnce()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let probe = tokio::spawn(probe());
            let mut rounds = 0;
            while current() == 0 && rounds < 1_000 {
                // The thread makes calls to Redis: its probe runs.
                call_started();
                std::thread::sleep(Duration::from_millis(20));
                tokio::task::yield_now().await;
                rounds += 1;
            }
            check();
            probe.abort();
        });
    }

    /// On a thread whose runtime runs the probe, the delay is published to that thread; a
    /// thread without one reads 0.
    #[test]
    fn the_probe_publishes_its_threads_delay() {
        assert_eq!(current(), 0);
        with_a_busy_probed_thread(|| {
            assert!(current() > 0, "the busy thread's delay was published");
        });
        let other = std::thread::spawn(current).join().unwrap();
        assert_eq!(other, 0);
    }

    /// A running probe's delay is among those [`largest`] reads, the gauge's source (other
    /// tests' probes may publish too: the largest is at least this one's).
    #[test]
    fn the_largest_delay_covers_every_probing_thread() {
        with_a_busy_probed_thread(|| {
            assert!(current() > 0, "the probe published a delay");
            assert!(
                largest() >= Duration::from_nanos(current() / ROUNDS_PER_ANSWER),
                "the largest delay covers this thread's"
            );
        });
    }

    /// A probe whose thread makes no call to Redis parks after exactly [`IDLE_SAMPLES`]
    /// samples and takes none while parked (an idle server's threads sleep); the thread's
    /// next call wakes it and it samples again.
    #[test]
    fn an_idle_probe_parks_until_the_next_call() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let probe = tokio::spawn(probe());
            let parked = || IS_PARKED.with(Cell::get);
            let samples = || SAMPLES.with(Cell::get);
            for _ in 0..2_000 {
                if parked() {
                    break;
                }
                tokio::time::sleep(PERIOD).await;
            }
            assert!(parked(), "the idle probe parked");
            assert_eq!(
                samples(),
                u64::from(IDLE_SAMPLES),
                "samples before it parked"
            );
            assert_eq!(current(), 0, "a parked probe's thread reads no delay");
            tokio::time::sleep(PERIOD * 4).await;
            assert_eq!(samples(), u64::from(IDLE_SAMPLES), "no sample while parked");
            call_started();
            for _ in 0..2_000 {
                if samples() > u64::from(IDLE_SAMPLES) {
                    break;
                }
                tokio::time::sleep(PERIOD).await;
            }
            assert!(samples() > u64::from(IDLE_SAMPLES), "a call woke the probe");
            assert!(!parked());
            probe.abort();
        });
    }
}
