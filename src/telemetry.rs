//! What floodgate tells its operators about itself: metrics, the reference's stats, traces.
//!
//! - [`metrics`]: the Prometheus registry (`GET /metrics`) that every capability registers
//!   its own families into ([`metrics::Metrics::register`]), and the counting of a request's
//!   outcome: the per-rule series and the request counters. A rule's series are resolved once
//!   per limits load ([`metrics::Metrics::resolve_rules`], called by the limits publisher
//!   before it swaps a configuration in) into [`metrics::RuleHandles`], indexed by each rule's
//!   index and swapped in beside the configuration, so counting a request is atomic adds on
//!   handles: no lock, no hash.
//! - [`statsd`]: the reference's statsd stats, counted by the same recording calls, sent from
//!   a background task, and exposed as the reference's Prometheus series (its default mapping
//!   or a statsd_exporter mapping file) and the debug port's `/stats`.
//! - [`otel`]: OpenTelemetry traces (off by default): a server span per request, joined to
//!   the caller's `traceparent` / B3 trace, a child span per store call, exported over OTLP.
//!
//! Place in the flow: below every layer that reports (server, listeners, service, store,
//! limits sources) and above [`crate::outcome`], the decision it counts. It controls nothing:
//! the bounds it reports on (`--max-in-flight`, the connection bounds) are held by the
//! layers that enforce them.

pub mod metrics;
pub mod otel;
pub mod statsd;
