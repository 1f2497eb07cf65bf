//! Unit tests of the bound on calls in flight.

use std::sync::Arc;

use super::{InFlight, Overloaded};
use crate::telemetry::metrics::Metrics;

/// The value of `floodgate_requests_in_flight` in an exposition of `metrics`.
fn in_flight_gauge(metrics: &Metrics) -> Option<String> {
    metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix("floodgate_requests_in_flight "))
        .map(str::to_owned)
}

/// Admission holds the in-flight bound: entering stops at the bound, a dropped place frees
/// its slot, and metrics only mirrors the count in `floodgate_requests_in_flight`.
#[test]
fn admission_bounds_requests_in_flight_and_metrics_mirror_it() {
    let metrics = Arc::new(Metrics::new());
    let in_flight = InFlight::new(usize::MAX, Arc::clone(&metrics)).with_max(2);
    let first = in_flight.take();
    let second = in_flight.take();
    assert!(first.is_ok() && second.is_ok());
    assert!(matches!(
        in_flight.take(),
        Err(Overloaded { max_in_flight: 2 })
    ));
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("2"));
    drop(first);
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("1"));
    let third = in_flight.take();
    assert!(third.is_ok());
    assert_eq!(in_flight_gauge(&metrics).as_deref(), Some("2"));
    assert!(
        metrics
            .encode()
            .contains("floodgate_requests_total{result=\"overloaded\"} 1"),
        "the refusal is counted"
    );
}
