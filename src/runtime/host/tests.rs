//! Unit tests of the probe: it publishes its thread's delay, [`host::largest`] covers it, and
//! an idle probe parks until the next call.

use std::time::Duration;

use super::probe;
use crate::store::shed::host;

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
        while host::current() == 0 && rounds < 1_000 {
            // The thread makes calls to Redis: its probe runs.
            host::call_started();
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
    assert_eq!(host::current(), 0);
    with_a_busy_probed_thread(|| {
        assert!(host::current() > 0, "the busy thread's delay was published");
    });
    let other = std::thread::spawn(host::current).join().unwrap();
    assert_eq!(other, 0);
}

/// A running probe's delay is among those [`host::largest`] reads, the gauge's source (other
/// tests' probes may publish too: the largest is at least this one's).
#[test]
fn the_largest_delay_covers_every_probing_thread() {
    with_a_busy_probed_thread(|| {
        assert!(host::current() > 0, "the probe published a delay");
        assert!(
            host::largest() >= Duration::from_nanos(host::current() / host::ROUNDS_PER_ANSWER),
            "the largest delay covers this thread's"
        );
    });
}

/// A probe whose thread makes no call to Redis parks after exactly [`host::IDLE_SAMPLES`]
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
        let parked = || host::probe_state().1;
        let samples = || host::probe_state().0;
        for _ in 0..2_000 {
            if parked() {
                break;
            }
            tokio::time::sleep(host::PERIOD).await;
        }
        assert!(parked(), "the idle probe parked");
        assert_eq!(
            samples(),
            u64::from(host::IDLE_SAMPLES),
            "samples before it parked"
        );
        assert_eq!(host::current(), 0, "a parked probe's thread reads no delay");
        tokio::time::sleep(host::PERIOD * 4).await;
        assert_eq!(
            samples(),
            u64::from(host::IDLE_SAMPLES),
            "no sample while parked"
        );
        host::call_started();
        for _ in 0..2_000 {
            if samples() > u64::from(host::IDLE_SAMPLES) {
                break;
            }
            tokio::time::sleep(host::PERIOD).await;
        }
        assert!(
            samples() > u64::from(host::IDLE_SAMPLES),
            "a call woke the probe"
        );
        assert!(!parked());
        probe.abort();
    });
}
