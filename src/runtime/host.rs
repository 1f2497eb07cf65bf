//! The host's scheduling-delay probe, one task on each runtime thread: how long a task that
//! is ready waits before its thread polls it, published for the bound on calls to Redis
//! ([`crate::store::shed::host`] says why that bound takes it out of a call's latency, and
//! holds the cells the probe publishes to).
//!
//! How: [`probe`] runs on each runtime thread (spawned by [`crate::runtime`]). Every
//! [`host::PERIOD`] it sleeps until a due time and measures how late it woke (less the timer's
//! granularity), then yields once and measures how long the thread took to come back to it (one
//! round of its run queue): the larger is the sample. [`host::Delay`] smooths the samples; the
//! result sits in a thread-local cell that [`host::current`] reads. An answer waits at least two
//! such rounds (the connection's task reads it, then the call's task takes it), so a call is
//! credited twice the delay. The request path pays one thread-local read per call and completion;
//! no lock, no syscall. A thread without a probe (a test's runtime) reads 0: no delay is taken out.
//!
//! Each probe also publishes its smoothed delay in a cell of its own, registered once when it
//! starts; [`host::largest`] reads them all (for `floodgate_host_delay_seconds`, at every scrape),
//! so an operator sees when the host, not Redis, is what slows the answers. The probe pays one
//! relaxed store per sample for it.
//!
//! **Idle, it sleeps.** The delay is only read by calls to Redis on the probe's thread, so a probe
//! whose thread began no such call ([`host::call_started`], from
//! [`crate::store::shed::Shedder::admit`]) for [`host::IDLE_SAMPLES`] samples in a row (100 ms)
//! parks: its delay reads 0, and it takes no timer and no wake-up until the thread's next call
//! wakes it (one thread-local read and write per call). An idle server's threads then sleep instead
//! of waking 200 times a second each; under load a thread never goes 100 ms without a call, and the
//! first calls after a pause see no delay until the probe's first samples (5 ms later, rising
//! half-way per sample).

use std::time::Duration;

use crate::store::shed::host::{self, Delay, IDLE_SAMPLES, PERIOD};

/// tokio's timers fire on whole milliseconds: a wake up to this late is the timer's rounding,
/// not the host's delay.
const GRANULARITY: Duration = Duration::from_millis(1);

/// Samples the calling thread's scheduling delay every [`PERIOD`] while the thread makes
/// calls to Redis, parked meanwhile (see the module doc), for ever: spawn it once on each
/// single-threaded runtime whose calls go through a [`crate::store::shed::Shedder`].
pub async fn probe() {
    let mut delay = Delay::default();
    let published = host::register();
    let mut seen = host::calls_started();
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
        host::publish(&published, smoothed);
        let calls = host::calls_started();
        if calls == seen {
            idle += 1;
        } else {
            (seen, idle) = (calls, 0);
        }
        if idle >= IDLE_SAMPLES {
            // Nobody on this thread reads the delay: forget it, sleep until a call.
            delay = Delay::default();
            host::forget(&published);
            host::parked(seen).await;
            (seen, idle) = (host::calls_started(), 0);
        }
    }
}

/// A duration in whole nanoseconds, saturated.
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
