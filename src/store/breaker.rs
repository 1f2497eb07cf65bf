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
//! Every transition is logged once and published on a `watch` channel (true = usable), which
//! drives the health service and the `floodgate_store_available` gauge. Until the first
//! success the store is not known to be usable, so it is published as not usable (requests
//! still go to it): health starts NOT_SERVING and turns SERVING once Redis has answered, as
//! the reference's does.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

#[derive(Debug)]
struct State {
    /// Consecutive failures, or `None` while open.
    failures: Option<u32>,
    /// When a call last succeeded (`None`: never).
    last_success: Option<Instant>,
}

/// The breaker's state, shared by every request.
#[derive(Debug)]
pub struct CircuitBreaker {
    state: Mutex<State>,
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
            state: Mutex::new(State {
                failures: Some(0),
                last_success: None,
            }),
            threshold: threshold.max(1),
            quiet,
            available: watch::Sender::new(false),
        }
    }

    /// True while requests may go to the store.
    pub fn is_closed(&self) -> bool {
        self.lock().failures.is_some()
    }

    /// True when no call has succeeded for the quiet period (or ever): worth probing even
    /// while closed, so an idle replica learns of an outage without traffic.
    pub fn is_idle(&self) -> bool {
        self.lock()
            .last_success
            .is_none_or(|at| at.elapsed() >= self.quiet)
    }

    /// Availability updates: true while closed, once a call has succeeded.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.available.subscribe()
    }

    /// Records a successful call or probe; closes the circuit if it was open.
    pub fn record_success(&self) {
        let mut state = self.lock();
        if state.failures.is_none() {
            tracing::info!("Redis is reachable again: circuit closed, requests go to Redis");
            self.available.send_replace(true);
        } else if state.last_success.is_none() {
            tracing::info!("Redis answered: the store is usable");
            self.available.send_replace(true);
        }
        state.failures = Some(0);
        state.last_success = Some(Instant::now());
    }

    /// Records a transient failure; opens the circuit at the threshold if nothing succeeded
    /// for the quiet period. `error` is logged on that transition only, not per request.
    pub fn record_failure(&self, error: &dyn std::fmt::Display) {
        let mut state = self.lock();
        let Some(count) = state.failures else { return };
        let count = count.saturating_add(1);
        let quiet = state
            .last_success
            .is_none_or(|at| at.elapsed() >= self.quiet);
        if count >= self.threshold && quiet {
            tracing::warn!(
                error = %error,
                consecutive_failures = count,
                "Redis unavailable: circuit open, answering by the failure policy until it is back"
            );
            state.failures = None;
            self.available.send_replace(false);
        } else {
            state.failures = Some(count);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The guarded values are a counter and a time: a panic elsewhere cannot corrupt them.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
