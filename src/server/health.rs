//! What health reports: gRPC `grpc.health.v1` and `/healthcheck` alike.
//!
//! SERVING only while every component is healthy, as in the reference:
//! - the store: under failure policy `error`, NOT_SERVING from start-up until Redis has
//!   answered once, and again while the circuit breaker is open (the other policies answer
//!   without Redis, and the memory store cannot fail, so they do not take part);
//! - the limits, with `--health-requires-limits`: NOT_SERVING while no domain is loaded;
//! - shutdown: NOT_SERVING for good once it has begun.
//!
//! The status is published under the server-wide name `""`, the rate-limit service's full
//! name, and `ratelimit`, the name the reference registers, so a probe written for either
//! server gets the same answer.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::http::{NotReady, Readiness};

/// The names under which health is reported.
pub const SERVICE_NAMES: [&str; 3] = [
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
    // The reference server's health checker name.
    "ratelimit",
];

/// One component's health, followed on a watch channel.
struct Component {
    /// `None` once the sender is gone: the last value then stands.
    updates: Option<watch::Receiver<bool>>,
    /// The last value seen.
    healthy: bool,
}

impl Component {
    fn new(updates: Option<watch::Receiver<bool>>) -> Component {
        Component {
            healthy: updates.as_ref().is_none_or(|rx| *rx.borrow()),
            updates,
        }
    }

    /// Reads the latest value, marking it seen.
    fn refresh(&mut self) {
        if let Some(rx) = &mut self.updates {
            self.healthy = *rx.borrow_and_update();
        }
    }

    /// Waits for the next change; pending forever once the sender is gone.
    async fn changed(&mut self) {
        match &mut self.updates {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    self.updates = None;
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Publishes `state` under every name and to `/healthcheck` (which also says why not).
pub async fn publish(health: &HealthReporter, http: &Readiness, state: Result<(), NotReady>) {
    let status = if state.is_ok() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    http.set(state);
    for name in SERVICE_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// Whether the components say SERVING now, or why not (shutdown aside).
pub fn initially_serving(
    store: Option<&watch::Receiver<bool>>,
    limits: Option<&watch::Receiver<bool>>,
) -> Result<(), NotReady> {
    readiness(
        store.is_none_or(|rx| *rx.borrow()),
        limits.is_none_or(|rx| *rx.borrow()),
    )
}

/// Ready when both are healthy; else the first reason (the store's, then the limits').
fn readiness(store: bool, limits: bool) -> Result<(), NotReady> {
    match (store, limits) {
        (false, _) => Err(NotReady::Store),
        (true, false) => Err(NotReady::Limits),
        (true, true) => Ok(()),
    }
}

/// Mirrors the store's and the limits' health (either may be absent: always healthy) into
/// gRPC health and `/healthcheck`, until aborted at shutdown.
pub async fn mirror(
    store: Option<watch::Receiver<bool>>,
    limits: Option<watch::Receiver<bool>>,
    health: HealthReporter,
    http: Arc<Readiness>,
) {
    let mut store = Component::new(store);
    let mut limits = Component::new(limits);
    loop {
        store.refresh();
        limits.refresh();
        publish(&health, &http, readiness(store.healthy, limits.healthy)).await;
        tokio::select! {
            () = store.changed() => {}
            () = limits.changed() => {}
        }
    }
}

/// Health as the server reports it while serving: the gRPC health reporter, `/healthcheck`'s
/// readiness, and the task mirroring the components into both (when one is followed).
pub(super) struct Reporting {
    reporter: HealthReporter,
    /// What `/healthcheck` answers.
    pub(super) serving: Arc<Readiness>,
    mirror: Option<JoinHandle<()>>,
}

impl Reporting {
    /// Publishes the components' health now and follows it from then on; the gRPC health
    /// service that reports it.
    pub(super) async fn start(
        store: Option<watch::Receiver<bool>>,
        limits: Option<watch::Receiver<bool>>,
    ) -> (Reporting, HealthServer<impl Health>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let initially = initially_serving(store.as_ref(), limits.as_ref());
        let serving = Arc::new(Readiness::new(initially));
        publish(&reporter, &serving, initially).await;
        let mirror = (store.is_some() || limits.is_some())
            .then(|| tokio::spawn(mirror(store, limits, reporter.clone(), serving.clone())));
        let reporting = Reporting {
            reporter,
            serving,
            mirror,
        };
        (reporting, service)
    }

    /// NOT_SERVING for good: shutdown has begun.
    pub(super) async fn shutting_down(self) {
        if let Some(mirror) = self.mirror {
            // Stop mirroring first, or a late store update could report SERVING again.
            mirror.abort();
            let _ = mirror.await;
        }
        publish(&self.reporter, &self.serving, Err(NotReady::ShuttingDown)).await;
    }
}

#[cfg(test)]
mod tests;
