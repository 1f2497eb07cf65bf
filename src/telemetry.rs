//! What floodgate tells its operators about itself: metrics, the reference's stats, traces.
//!
//! - [`metrics`]: every Prometheus metric floodgate exports (`GET /metrics`), one file per
//!   concern, and how each is recorded. A rule's series are resolved once per limits load
//!   ([`metrics::Metrics::resolve_rules`], called by each limits source before it swaps a
//!   configuration in), so counting a request is atomic adds on handles the compiled rule
//!   carries ([`crate::outcome::RuleSeries`]): no lock, no hash.
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
