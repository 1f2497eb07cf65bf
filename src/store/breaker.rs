//! A circuit breaker in front of the Redis store.
//!
//! Closed: requests go to Redis; `threshold` consecutive transient failures open it, provided
//! no call has succeeded for a quiet period — under overload, calls time out in bursts while
//! others still succeed, and opening then would turn a slow Redis into an outage; a dead or
//! frozen Redis gives no successes at all. Open:
//! requests do not touch Redis at all (the failure policy answers at once, so an outage costs
//! no timeout per request) while a background probe ([`crate::store::resilient`]) checks
//! Redis; the first successful probe or request closes it again.
//!
//! Every transition is logged once, after it is in effect, and published on a `watch` channel
//! (true = usable), which drives the health service and the `floodgate_store_available`
//! gauge. Until the first success the store is not known to be usable, so it is published as
//! not usable (requests still go to it): health starts NOT_SERVING and turns SERVING once
//! Redis has answered, as the reference's does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The breaker's state, shared by every request.
///
/// Every Redis call asks whether the circuit is closed and records its success, from every
/// serving thread, so those two read or write only what the steady state leaves unchanged:
/// `open` and `steady` are read, and the time of the last success is written at most once a
/// millisecond. Transitions (a failure, the success after one, opening, closing) take the
/// lock, which keeps them one at a time and logs each once.
#[derive(Debug)]
pub struct CircuitBreaker {
    /// Consecutive failures, or `None` while open. Written under the lock only.
    failures: Mutex<Option<u32>>,
    /// `failures` is `None`: mirrored for the request path, which reads it without the lock.
    open: AtomicBool,
    /// Closed, no failure since the last success, and a call has succeeded: a success then
    /// changes nothing but the time of the last success.
    steady: AtomicBool,
    /// When a call last succeeded, in whole milliseconds after `epoch`, plus 1 (0: never).
    /// Kept to the millisecond (a success within the same millisecond as the one recorded
    /// writes nothing), so a quiet period can seem to have begun at most 1 ms earlier.
    last_success_ms: AtomicU64,
    /// The origin of `last_success_ms`.
    epoch: Instant,
    /// Consecutive transient failures that open the circuit.
    threshold: u32,
    /// How long without any success before failures may open the circuit.
    quiet: Duration,
    /// Publishes availability on every transition; false until the first success.
    available: watch::Sender<bool>,
}

impl CircuitBreaker {
    /// A closed breaker that opens after `threshold` consecutive failures (at least 1) once no
    /// call has succeeded for `quiet`.
    pub fn new(threshold: u32, quiet: Duration) -> CircuitBreaker {
        CircuitBreaker {
            failures: Mutex::new(Some(0)),
            open: AtomicBool::new(false),
            steady: AtomicBool::new(false),
            last_success_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            threshold: threshold.max(1),
            quiet,
            available: watch::Sender::new(false),
        }
    }

    /// True while requests may go to the store.
    pub fn is_closed(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    /// True when no call has succeeded for the quiet period (or ever): worth probing even
    /// while closed, so an idle replica learns of an outage without traffic.
    pub fn is_idle(&self) -> bool {
        self.quiet_now()
    }

    /// No call has succeeded for the quiet period, or none ever has.
    fn quiet_now(&self) -> bool {
        match self.last_success_ms.load(Ordering::Acquire) {
            0 => true,
            ms => {
                self.epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1))
                    >= self.quiet
            }
        }
    }

    /// Availability updates: true while closed, once a call has succeeded.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.available.subscribe()
    }

    /// Records a successful call or probe; closes the circuit if it was open.
    pub fn record_success(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        // A read of a line written at most once a millisecond, and a write only when the
        // millisecond changed.
        if self.last_success_ms.load(Ordering::Relaxed) < ms {
            self.last_success_ms.fetch_max(ms, Ordering::AcqRel);
        }
        if self.steady.load(Ordering::Acquire) {
            return;
        }
        let mut failures = self.lock();
        let was_open = failures.is_none();
        let was_usable = *self.available.borrow();
        *failures = Some(0);
        self.open.store(false, Ordering::Release);
        // Published before `steady`: a success that finds `steady` set returns at once, and
        // whoever its request answered must find the store usable (health, the console).
        if !was_usable {
            self.available.send_replace(true);
        }
        self.steady.store(true, Ordering::Release);
        // Logged once in effect: whoever reads the line (an operator, a test waiting on it)
        // and sends a request then finds the circuit closed.
        if was_open {
            tracing::info!("Redis is reachable again: circuit closed, requests go to Redis");
        } else if !was_usable {
            tracing::info!("Redis answered: the store is usable");
        }
    }

    /// Records a transient failure; opens the circuit at the threshold if nothing succeeded
    /// for the quiet period. `error` is logged on that transition only, not per request.
    pub fn record_failure(&self, error: &dyn std::fmt::Display) {
        let mut failures = self.lock();
        let Some(count) = *failures else { return };
        self.steady.store(false, Ordering::Release);
        let count = count.saturating_add(1);
        if count >= self.threshold && self.quiet_now() {
            *failures = None;
            // Unusable before open: whoever finds the circuit open (the console) finds the
            // store unusable too.
            self.available.send_replace(false);
            self.open.store(true, Ordering::Release);
            // Logged once in effect, as the closing is.
            tracing::warn!(
                error = %error,
                consecutive_failures = count,
                "Redis unavailable: circuit open, answering by the failure policy until it is back"
            );
        } else {
            *failures = Some(count);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<u32>> {
        // The guarded value is a counter: a panic elsewhere cannot corrupt it.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
