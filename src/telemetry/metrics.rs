//! The metric registry and the counting of a request's outcome; and, as one reference, every
//! metric floodgate exports.
//!
//! Each capability registers and owns its families (linkerd2-proxy's way): [`Metrics`] is the
//! registry, and [`Metrics::register`] hands it to the owner's constructor, which registers
//! its families once at composition and keeps the handles it counts with. Telemetry itself
//! owns the per-rule series and the request counters (`floodgate_rule_*`,
//! `floodgate_requests_*`, `floodgate_domain_requests_total`, …: `metrics/rules.rs`,
//! `metrics/requests.rs`) and `floodgate_statsd_dropped_lines_total`. The others live with
//! their owner: the store's (`floodgate_store_*`, `floodgate_memory_*`, `floodgate_local_*`,
//! refunds, `floodgate_redis_calls_*`, `floodgate_host_delay_seconds`, `floodgate_lease_*`)
//! in [`crate::store::metrics`], the transport's (`floodgate_connections_*`,
//! `floodgate_accept_errors_total`, `floodgate_tls_*`) in [`crate::transport::metrics`], the
//! limits sources' (`floodgate_config_*`) in `sources/metrics.rs` ([`crate::sources::SourceMetrics`]),
//! RLQS's (`floodgate_rlqs_*`, listed in docs/rlqs.md) in [`crate::rlqs::RlqsMetrics`].
//! `tests/layering.rs` holds each family to its owner's metrics file.
//!
//! Exposed in Prometheus text format on `GET /metrics`. Cardinality is bounded by the
//! configuration: per-rule series are labelled with the domain and the rule's path from the
//! limits file (`domain.key_value.key`); request values appear only for rules that opt in with
//! `detailed_metric` or `value_to_metric`: then one series per distinct value, at most
//! `--metrics-max-detailed-series` of them (later values count under the rule label
//! `_overflow`), every label value escaped as the text format requires. Like the reference
//! server, rule counters add hits, not requests (a request with `hits_addend: 5` adds 5).
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `floodgate_rule_hits_total` | domain, rule | hits evaluated against the rule |
//! | `floodgate_rule_within_limit_total` | domain, rule | hits the rule admitted |
//! | `floodgate_rule_over_limit_total` | domain, rule | hits over the rule's limit (a shadow-mode rule's included, as in the reference) |
//! | `floodgate_rule_shadow_mode_total` | domain, rule | of those, hits a shadow-mode rule would have denied |
//! | `floodgate_rule_over_limit_local_cache_total` | domain, rule | of the over-limit hits, those denied by the local over-limit cache without a Redis call |
//! | `floodgate_rule_near_limit_total` | domain, rule | admitted hits above `--near-limit-ratio` × capacity (the reference's near-limit accounting) |
//! | `floodgate_rule_errors_total` | domain, rule | hits of requests that failed with a store error (counted on the error path only) |
//! | `floodgate_requests_total` | result | ShouldRateLimit calls by result (`ok`, `over_limit`, `invalid`, `store_error`, `overloaded`) |
//! | `floodgate_request_duration_seconds` | result | ShouldRateLimit calls (gRPC and `/json`) from the decoded request to the answer, by result (as `floodgate_requests_total`), histogram |
//! | `floodgate_domain_requests_total` | domain, result | answered calls by configured domain (`_unknown` for any other: clients never choose a label value) and result (`ok`, `over_limit`) |
//! | `floodgate_store_duration_seconds` | store | time spent in the store per request |
//! | `floodgate_config_loads_total` | result | limits loads (start-up and reloads) by result (`success`, `error`) |
//! | `floodgate_config_last_reload_success` | — | 1 if the last limits load succeeded, 0 if it failed (the previous limits stay in force) |
//! | `floodgate_memory_buckets` | — | buckets held by the memory store |
//! | `floodgate_memory_evictions_total` | — | buckets the memory store evicted to stay within `--memory-max-buckets` |
//! | `floodgate_store_errors_total` | kind | failed store calls of requests (`unavailable`: outage; `failed`: defect) |
//! | `floodgate_store_degraded_total` | policy | requests answered by the failure policy |
//! | `floodgate_local_decisions_total` | reason | requests decided by this replica's in-memory buckets (`--on-store-error local`) because Redis could not answer: `shed` (the call to Redis was shed), `circuit_open`, `store_error` (the call failed or timed out) |
//! | `floodgate_store_available` | — | 1 while Redis is usable (circuit closed), else 0 |
//! | `floodgate_local_cache_over_limit_total` | — | requests denied by the local over-limit cache, no Redis call |
//! | `floodgate_oversized_values_total` | — | descriptor keys and values over `--max-value-bytes`, matched in full and known by their digest (limited, never refused) |
//! | `floodgate_ignored_overrides_total` | — | descriptor `limit` overrides whose unit is none: ignored, the configured rules apply |
//! | `floodgate_global_shadow_mode_total` | — | requests answered OK only because of global shadow mode (the reference's `global_shadow_mode`) |
//! | `floodgate_tls_loads_total` | result | gRPC TLS certificate loads (start-up and reloads) by result (`success`, `error`) |
//! | `floodgate_tls_last_reload_success` | — | 1 if the last TLS load succeeded, 0 if it failed (the previous certificate stays in force) |
//! | `floodgate_tls_handshake_failures_total` | reason | gRPC TLS handshakes that failed (`error`: refused, e.g. plaintext or an untrusted client certificate; `timeout`) |
//! | `floodgate_cluster_refunds_total` | result | Redis Cluster: refunds of a slot group's debits after another group denied or failed (`ok`, `failed`: the debit stays until the bucket refills) |
//! | `floodgate_per_second_refunds_total` | result | `--redis-per-second-*`: refunds of one Redis's debits after the other denied or failed (`ok`, `failed`: the debit stays until the bucket refills) |
//! | `floodgate_lease_acquired_total` | — | leases taken on hot Redis buckets (docs/leases.md) |
//! | `floodgate_lease_tokens_total` | — | tokens debited in Redis as leases |
//! | `floodgate_lease_tokens_returned_total` | — | unspent lease tokens sent back to their bucket |
//! | `floodgate_lease_return_failures_total` | — | returns of unspent lease tokens that failed (those tokens stay debited until the bucket refills or the window ends) |
//! | `floodgate_lease_local_answers_total` | — | requests answered from this replica's leases alone, no Redis call |
//! | `floodgate_local_cache_entries` | — | buckets the local over-limit cache holds (at most `--local-cache-size`) |
//! | `floodgate_local_cache_evictions_total` | — | entries the local over-limit cache dropped to stay within `--local-cache-size` |
//! | `floodgate_redis_calls_bound` | — | calls to Redis the adaptive bound (`--redis-shedding`) allows in flight now; 0 without Redis or with shedding off |
//! | `floodgate_redis_calls_waiting` | — | calls waiting in front of Redis for a place under that bound |
//! | `floodgate_host_delay_seconds` | — | how long a ready task waits for its runtime thread (the host's scheduling delay, smoothed), on the thread where it is longest (0 while no thread calls Redis: the probes are parked): rising while Redis's latency does not, the host's CPU is the bottleneck |
//! | `floodgate_requests_in_flight` | — | ShouldRateLimit calls being answered now, and gRPC streams waiting for their body (at most `--max-in-flight`) |
//! | `floodgate_connections_open` | port | connections open now (`grpc`, `http`, and `prometheus` / `debug` when the reference's ports are on) |
//! | `floodgate_connections_refused_total` | port | connections closed at once because the port's bound was reached and every connection had a call in flight |
//! | `floodgate_connections_evicted_total` | port | idle connections closed to admit a new one because the port's bound was reached |
//! | `floodgate_connections_handshake_timeouts_total` | port | connections closed because they had not sent their opening (HTTP/2 preface, TLS handshake included; HTTP/1 request line) within the handshake timeout |
//! | `floodgate_connections_idle_closed_total` | port | connections closed because nothing was read from them for the idle timeout |
//! | `floodgate_accept_errors_total` | port | failed accepts (e.g. out of file descriptors) |
//! | `floodgate_rule_series_overflow_total` | — | rule tallies counted under `rule="_overflow"` because `--metrics-max-detailed-series` was reached |
//! | `floodgate_statsd_dropped_lines_total` | — | statsd lines not sent (host unreachable, timer queue full, stat-name cap reached) |
//!
//! When statsd or the reference's Prometheus series are on ([`Metrics::attach_reference_stats`]), the same recording calls also count the
//! reference's statsd stats ([`crate::telemetry::statsd`]); `docs/observability.md` lists both.
//!
//! Gauges whose source is a store (`floodgate_memory_buckets`, `floodgate_local_cache_entries`,
//! `floodgate_store_available`, `floodgate_redis_calls_*`, `floodgate_host_delay_seconds`)
//! and `floodgate_requests_in_flight` are read from it at every exposition by samplers their
//! owner adds ([`Samplers`]), so a scrape is exact, not the value of some earlier tick.
//!
//! Over limit from the local cache stays one store-level counter rather than a per-rule one:
//! the cache answers per bucket, below the planner, and those answers are also counted per
//! rule in `floodgate_rule_over_limit_total` like any other denial.
//!
//! Telemetry's files: `metrics/rules.rs` (per-rule series, their handles resolved once per
//! limits load into the [`RuleHandles`] swapped beside the configuration), `requests.rs`;
//! `labels.rs` holds their label sets; `duration.rs` and `striped.rs` the histograms and the
//! counters that serving threads write without writing one another's cache lines (the
//! duration histograms; `floodgate_requests_total`, and a configured domain's and rule's hit
//! and verdict series once their handles are resolved).
//!
//! The exposition lists telemetry's families first, then each owner's in the order the
//! composition root registers them (store, leases, limits loads, transport), RLQS's last.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use crate::telemetry::statsd::{Mapper, Sample, StatName, Stats, StatsdConfig};

mod duration;
mod labels;
mod requests;
mod rules;
mod striped;

pub use duration::DurationHistogram;
pub use labels::{RequestResult, ShapedEnd};
pub use rules::{
    ConfiguredRule, DEFAULT_MAX_DETAILED_SERIES, OVERFLOW_RULE, RuleCounts, RuleHandles,
    UNKNOWN_DOMAIN,
};

/// The text exposition of a registry that holds `metric` alone, as `name`: for unit tests
/// that hold a metric type of floodgate's to what prometheus-client's own writes.
#[cfg(test)]
fn exposition_of(name: &str, metric: impl prometheus_client::registry::Metric) -> String {
    let mut registry = Registry::default();
    registry.register(name, "help", metric);
    let mut out = String::new();
    encode(&mut out, &registry).expect("a registry encodes");
    out
}

/// Numbers the registries, for a rule's handles.
static NEXT_METRICS_ID: AtomicU64 = AtomicU64::new(0);

/// Reads a gauge's value from its source just before an exposition.
type Sampler = Box<dyn Fn() + Send + Sync>;

/// The samplers run before every exposition: a registry's, shared with the owners that add
/// theirs ([`Metrics::samplers`]).
#[derive(Clone, Default)]
pub struct Samplers(Arc<Mutex<Vec<Sampler>>>);

impl Samplers {
    /// Runs `sampler` before every exposition, to set a gauge read from its source (a
    /// store's size). It must be cheap and must not encode the registry.
    pub fn add(&self, sampler: impl Fn() + Send + Sync + 'static) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(sampler));
    }

    /// Runs every sampler.
    fn run(&self) {
        for sampler in self.0.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            sampler();
        }
    }
}

impl fmt::Debug for Samplers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Samplers({count})")
    }
}

/// The metric registry every capability registers its families in, and handles to the
/// families telemetry owns (per-rule series, requests).
#[derive(Debug)]
pub struct Metrics {
    /// Tells this registry's [`RuleHandles`] from another's.
    id: u64,
    /// Every family, telemetry's and those its owners register ([`Metrics::register`]).
    registry: Mutex<Registry>,
    /// `floodgate_rule_*` ([`rules`]).
    rules: rules::RuleMetrics,
    /// ShouldRateLimit calls, per domain, held, in flight ([`requests`]).
    requests: requests::RequestMetrics,
    /// Run before every exposition.
    samplers: Samplers,
    /// The reference's statsd stats, when they are sent or exposed.
    statsd: OnceLock<Arc<Stats>>,
    /// statsd lines not sent.
    statsd_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with telemetry's own families registered at zero; each capability adds its
    /// own through [`Metrics::register`].
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let rules = rules::RuleMetrics::register(&mut registry);
        let requests = requests::RequestMetrics::register(&mut registry);
        requests.register_shadow(&mut registry);
        requests.register_shaped(&mut registry);
        requests.register_in_flight(&mut registry);
        rules.register_overflow(&mut registry);
        let statsd_dropped = Counter::default();
        registry.register(
            "floodgate_statsd_dropped_lines",
            "statsd lines not sent (host unreachable, timer queue full, stat-name cap reached)",
            statsd_dropped.clone(),
        );
        Metrics {
            id: NEXT_METRICS_ID.fetch_add(1, Ordering::Relaxed),
            registry: Mutex::new(registry),
            rules,
            requests,
            samplers: Samplers::default(),
            statsd: OnceLock::new(),
            statsd_dropped,
        }
    }

    /// Also counts the reference's statsd stats from now on, and starts sending them to
    /// `statsd` if given (a background task: call inside a Tokio runtime); without it they
    /// are only counted, for the reference's Prometheus series ([`Metrics::reference_stats`]),
    /// which `mapper` maps when given (`PROMETHEUS_MAPPER_YAML`). Only the first call has an
    /// effect.
    pub fn attach_reference_stats(
        &self,
        statsd: Option<StatsdConfig>,
        mapper: Option<Arc<Mapper>>,
    ) {
        let mut stats = Stats::new(statsd, self.statsd_dropped.clone());
        if let Some(mapper) = mapper {
            stats = stats.with_mapper(mapper);
        }
        let stats = Arc::new(stats);
        if self.statsd.set(Arc::clone(&stats)).is_ok() {
            stats.start();
        }
    }

    /// The reference's stats, when they are counted.
    pub fn reference_stats(&self) -> Option<&Arc<Stats>> {
        self.statsd.get()
    }

    /// When statsd is on, sends `name` at every flush with the value `read` returns then
    /// (a source outside the request path: the Redis pool's connection counts).
    pub fn statsd_sample(
        &self,
        name: &str,
        kind: Sample,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        if let Some(stats) = self.statsd.get() {
            stats.sample(name, kind, read);
        }
    }

    /// Counts one of the reference's statsd stats by name, when they are counted: the
    /// typed counter through which an owner's event (a limits load) reaches them.
    pub fn count_reference_stat(&self, name: StatName) {
        self.stat(name, 1);
    }

    fn stat(&self, name: StatName, n: u64) {
        if let Some(stats) = self.statsd.get() {
            stats.count(name, n);
        }
    }

    /// Hands the registry to `register`, the constructor of a module's own metric families
    /// (the store's, the transport's, the limits sources', RLQS's): it registers them, at
    /// zero, and keeps their handles to count with, so every exposition from now on
    /// includes them. Owners register once each, at composition, like linkerd2-proxy's
    /// layers; telemetry never names their families.
    pub fn register<T>(&self, register: impl FnOnce(&mut Registry) -> T) -> T {
        register(&mut self.registry.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The samplers run before every exposition, for an owner to add the gauges it reads
    /// from their source.
    pub fn samplers(&self) -> Samplers {
        self.samplers.clone()
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.samplers.run();
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

#[cfg(test)]
mod tests;
