//! Time for the in-process store: integer microseconds since the Unix epoch.
//!
//! The Redis store never uses this (Redis `TIME` decides, so replicas agree); the memory store
//! takes a [`Clock`] so tests can move time by hand instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time in µs since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in µs since the Unix epoch.
    fn now_us(&self) -> i64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            // A clock before 1970 is a broken host; the limiter clamps elapsed time anyway.
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    /// A clock reading `now_us`.
    pub fn new(now_us: i64) -> ManualClock {
        ManualClock(AtomicI64::new(now_us))
    }

    /// Moves the clock forward (or back, with a negative value) by `delta_us`.
    pub fn advance(&self, delta_us: i64) {
        self.0.fetch_add(delta_us, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, now_us: i64) {
        self.0.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
