//! Unit tests of the decider's own control: the `--max-in-flight` bound.

use std::sync::Arc;

use super::{Decider, RequestError};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::plan::PlanOptions;
use crate::sources::Snapshot;
use crate::store::memory::MemoryStore;
use crate::telemetry::metrics::Metrics;

/// The value of `floodgate_requests_in_flight` in an exposition of `metrics`.
fn in_flight_gauge(metrics: &Metrics) -> Option<String> {
    metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("floodgate_requests_in_flight "))
        .map(str::to_owned)
}

/// The decider holds the in-flight bound: entering stops at the bound, a dropped place frees
/// its slot, and metrics only mirrors the count in `floodgate_requests_in_flight`.
#[test]
fn decider_bounds_requests_in_flight_and_metrics_mirror_it() {
    let metrics = Arc::new(Metrics::new());
    let decider = Decider::new(
        Snapshot::from(Config::empty()).swappable(),
        Arc::new(MemoryStore::new(Arc::new(SystemClock))),
        PlanOptions::default(),
        Arc::clone(&metrics),
    )
    .with_max_in_flight(2);
    let first = decider.admit();
    let second = decider.admit();
    assert!(first.is_ok() && second.is_ok());
    assert!(matches!(
        decider.admit(),
        Err(RequestError::Overloaded { max_in_flight: 2 })
    ));
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("2"));
    drop(first);
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("1"));
    let third = decider.admit();
    assert!(third.is_ok());
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("2"));
    assert!(
        metrics
            .encode()
            .contains("floodgate_requests_total{result=\"overloaded\"} 1"),
        "the refusal is counted"
    );
}
