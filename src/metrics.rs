//! Every metric floodgate exports, with its name and help text, and how it is recorded.
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
//! reference's statsd stats ([`crate::statsd`]); `docs/observability.md` lists both.
//!
//! Gauges whose source is a store (`floodgate_memory_buckets`, `floodgate_local_cache_entries`,
//! `floodgate_store_available`) are read from it at every exposition ([`Metrics::sample_before_encode`]), so a scrape is
//! exact, not the value of some earlier tick.
//!
//! Over limit from the local cache stays one store-level counter rather than a per-rule one:
//! the cache answers per bucket, below the planner, and those answers are also counted per
//! rule in `floodgate_rule_over_limit_total` like any other denial.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::outcome::{Outcome, Tally, Verdict};

pub mod history;

use crate::statsd::{Mapper, RuleCounters, Sample, StatName, Stats, StatsdConfig};
pub use history::{LoadHistory, LoadRecord};

/// Shared strings from the configuration: building the labels of a request's tally copies
/// no bytes (a label set is needed to look a series up, not only to create it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: LabelText,
    rule: LabelText,
}

/// A label value that may hold request bytes (`detailed_metric`, `value_to_metric`),
/// escaped as the Prometheus and OpenMetrics text formats require: a raw `"` or newline
/// would end the value early and make the whole exposition unparseable (or forge series).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct LabelText(Arc<str>);

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        use fmt::Write as _;
        let text: &str = &self.0;
        let mut rest = text;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    port: &'static str,
}

/// The listening port a connection metric is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port (rate-limit service, health, reflection).
    Grpc,
    /// The admin HTTP port.
    Http,
    /// The reference's Prometheus series' port (`--reference-prometheus-addr`).
    Prometheus,
    /// The reference's debug port (`--debug-addr`).
    Debug,
}

impl Port {
    /// The `port` label value.
    pub fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
            Port::Prometheus => "prometheus",
            Port::Debug => "debug",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// A configured domain (or [`UNKNOWN_DOMAIN`]) and how its request ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: LabelText,
    result: &'static str,
}

/// The `domain` label of requests for a domain no configuration has: clients choose those
/// names, so they never become label values of their own.
pub const UNKNOWN_DOMAIN: &str = "_unknown";

/// [`UNKNOWN_DOMAIN`] as the label value, made once.
fn unknown_domain() -> &'static Arc<str> {
    static UNKNOWN: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| Arc::from(UNKNOWN_DOMAIN));
    &UNKNOWN
}

pub use crate::outcome::RuleSeries;

/// The handles of one rule's series in one [`Metrics`], each taken from its family when the
/// rule is first counted in it.
struct ResolvedSeries {
    /// The [`Metrics`] they belong to ([`Metrics::id`]): another registry (tests make many)
    /// looks its series up.
    metrics: u64,
    /// The labels they were resolved for: a tally whose labels differ (a rule shared by two
    /// configurations' domains) looks its series up.
    domain: Arc<str>,
    rule: Arc<str>,
    hits: OnceLock<Counter>,
    within_limit: OnceLock<Counter>,
    over_limit: OnceLock<Counter>,
    shadow_mode: OnceLock<Counter>,
    over_limit_local_cache: OnceLock<Counter>,
    near_limit: OnceLock<Counter>,
    /// The reference's statsd counters of the rule path (only once the name cap admitted it).
    statsd: OnceLock<Arc<RuleCounters>>,
    /// `floodgate_domain_requests_total` of the rule's domain, by [`RequestResult::index`]:
    /// a request with a tally reaches its domain's series through the tally's rule.
    domain_requests: [OnceLock<Counter>; 5],
}

impl ResolvedSeries {
    /// Whether these handles are the series of `domain`/`rule` in the registry `metrics`.
    fn serves(&self, metrics: u64, domain: &Arc<str>, rule: &Arc<str>) -> bool {
        let same = |a: &Arc<str>, b: &Arc<str>| Arc::ptr_eq(a, b) || **a == **b;
        self.metrics == metrics && same(&self.domain, domain) && same(&self.rule, rule)
    }
}

/// Numbers the registries, for [`ResolvedSeries::metrics`].
static NEXT_METRICS_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why a TLS handshake on the gRPC port failed, for `floodgate_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The handshake was refused (not TLS, no or an untrusted client certificate, …).
    Error,
    /// The client did not complete it in time.
    Timeout,
}

/// How a ShouldRateLimit call ended, for `floodgate_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestResult {
    /// Answered OK.
    Ok,
    /// Answered OVER_LIMIT.
    OverLimit,
    /// Rejected as malformed.
    Invalid,
    /// The store failed.
    StoreError,
    /// Refused at once: `--max-in-flight` requests were already being answered.
    Overloaded,
}

impl RequestResult {
    /// Every result, in the order of [`RequestResult::index`].
    const ALL: [RequestResult; 5] = [
        RequestResult::Ok,
        RequestResult::OverLimit,
        RequestResult::Invalid,
        RequestResult::StoreError,
        RequestResult::Overloaded,
    ];

    /// The result's place in [`RequestResult::ALL`].
    fn index(self) -> usize {
        self as usize
    }

    /// The `result` label value (also a trace span's `ratelimit.result`).
    pub fn label(self) -> &'static str {
        match self {
            RequestResult::Ok => "ok",
            RequestResult::OverLimit => "over_limit",
            RequestResult::Invalid => "invalid",
            RequestResult::StoreError => "store_error",
            RequestResult::Overloaded => "overloaded",
        }
    }
}

/// How the wait of a request held by a `max_wait` limit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapedEnd {
    /// Its tokens arrived; it was answered OK.
    Served,
    /// Shutdown began; it was answered OK at once (its tokens were already debited).
    Released,
    /// The client went away (cancelled, timed out); its tokens were given back.
    Cancelled,
}

impl ShapedEnd {
    /// The `result` label value.
    pub fn label(self) -> &'static str {
        match self {
            ShapedEnd::Served => "served",
            ShapedEnd::Released => "released",
            ShapedEnd::Cancelled => "cancelled",
        }
    }
}

fn result_labels(result: RequestResult) -> ResultLabels {
    ResultLabels {
        result: result.label(),
    }
}

/// Reads a gauge's value from its source just before an exposition.
type Sampler = Box<dyn Fn(&Metrics) + Send + Sync>;

/// The registered samplers (a newtype only to be `Debug`).
#[derive(Default)]
struct Samplers(Mutex<Vec<Sampler>>);

impl fmt::Debug for Samplers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Samplers({count})")
    }
}

/// One metric family attached after construction: its name, help and handle.
type AttachedFamily = (
    &'static str,
    &'static str,
    Box<dyn prometheus_client::encoding::EncodeMetric + Send + Sync>,
);

/// Metric families owned by a module above this one (which this module cannot name), encoded
/// with the registry at every exposition: see [`Metrics::attach`].
#[derive(Clone, Default)]
struct Attached(Arc<Mutex<Vec<AttachedFamily>>>);

impl fmt::Debug for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        write!(f, "Attached({count})")
    }
}

impl prometheus_client::collector::Collector for Attached {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), fmt::Error> {
        for (name, help, metric) in self.0.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family)?;
        }
        Ok(())
    }
}

/// The metric registry and handles to every metric.
#[derive(Debug)]
pub struct Metrics {
    /// Tells this registry's [`RuleSeries`] handles from another's.
    id: u64,
    registry: Registry,
    rule_hits: Family<RuleLabels, Counter>,
    rule_within_limit: Family<RuleLabels, Counter>,
    rule_over_limit: Family<RuleLabels, Counter>,
    rule_shadow_mode: Family<RuleLabels, Counter>,
    rule_near_limit: Family<RuleLabels, Counter>,
    rule_errors: Family<RuleLabels, Counter>,
    rule_over_limit_local_cache: Family<RuleLabels, Counter>,
    /// `floodgate_requests_total` and `floodgate_request_duration_seconds` by result, resolved
    /// once: every request records both, so none looks its series up.
    requests: [Counter; 5],
    request_duration: [Histogram; 5],
    domain_requests: Family<DomainLabels, Counter>,
    store_duration: Family<StoreLabels, Histogram>,
    /// The `store_duration` series of the first store recorded: a process has one store,
    /// so its requests record without looking the series up.
    store_duration_first: OnceLock<(&'static str, Histogram)>,
    config_loads: Family<ResultLabels, Counter>,
    config_last_load_ok: Gauge,
    memory_buckets: Gauge,
    memory_evictions: Counter,
    store_errors: Family<KindLabels, Counter>,
    store_degraded: Family<PolicyLabels, Counter>,
    local_decisions: Family<ReasonLabels, Counter>,
    store_available: Gauge,
    local_cache_over_limit: Counter,
    global_shadow_mode: Counter,
    tls_loads: Family<ResultLabels, Counter>,
    tls_last_load_ok: Gauge,
    tls_handshake_failures: Family<ReasonLabels, Counter>,
    cluster_refunds: Family<ResultLabels, Counter>,
    per_second_refunds: Family<ResultLabels, Counter>,
    shaped_requests: Family<DomainLabels, Counter>,
    shaped_delay: Histogram,
    local_cache_entries: Gauge,
    local_cache_evictions: Counter,
    requests_in_flight: Gauge,
    /// Connection bounds and label caps (`floodgate_connections_*`, the rule series cap).
    abuse: Abuse,
    /// The lease layer's counters ([`LeaseMetrics`]).
    leases: LeaseMetrics,
    /// Run before every exposition.
    samplers: Samplers,
    /// Families registered after construction by the modules that own them.
    attached: Attached,
    /// The reference's statsd stats, when they are sent or exposed.
    statsd: OnceLock<Arc<Stats>>,
    /// statsd lines not sent.
    statsd_dropped: Counter,
    /// The last limits loads, for the operator console.
    loads: LoadHistory,
}

/// A rule's counters, read by the operator console (which derives rates from them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RuleCounts {
    /// Hits evaluated (`floodgate_rule_hits_total`).
    pub hits: u64,
    /// Hits admitted.
    pub within_limit: u64,
    /// Hits over the limit (a shadow-mode rule's included).
    pub over_limit: u64,
    /// Hits a shadow-mode rule would have denied.
    pub shadow_mode: u64,
    /// Hits of requests that failed with a store error.
    pub errors: u64,
}

/// Counts one request in `floodgate_requests_in_flight` while it lives.
#[derive(Debug)]
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let rule_hits = Family::<RuleLabels, Counter>::default();
        let rule_within_limit = Family::<RuleLabels, Counter>::default();
        let rule_over_limit = Family::<RuleLabels, Counter>::default();
        let rule_shadow_mode = Family::<RuleLabels, Counter>::default();
        let rule_near_limit = Family::<RuleLabels, Counter>::default();
        let rule_errors = Family::<RuleLabels, Counter>::default();
        let rule_over_limit_local_cache = Family::<RuleLabels, Counter>::default();
        let requests = Family::<ResultLabels, Counter>::default();
        // 50 µs … ~1.6 s: an answer from memory at the bottom, Envoy's 20 ms timeout in the
        // middle, a Redis outage's timeouts near the top.
        let request_duration = Family::<ResultLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 16))) as fn() -> Histogram,
        );
        let domain_requests = Family::<DomainLabels, Counter>::default();
        // 50 µs … ~0.8 s: the memory store sits at the bottom, a Redis round trip in the middle.
        let store_duration = Family::<StoreLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 15))) as fn() -> Histogram,
        );
        let config_loads = Family::<ResultLabels, Counter>::default();
        let config_last_load_ok = Gauge::default();
        let memory_buckets = Gauge::default();
        let memory_evictions = Counter::default();
        let store_errors = Family::<KindLabels, Counter>::default();
        let store_degraded = Family::<PolicyLabels, Counter>::default();
        let local_decisions = Family::<ReasonLabels, Counter>::default();
        let store_available = Gauge::default();
        let local_cache_over_limit = Counter::default();
        let global_shadow_mode = Counter::default();
        let tls_loads = Family::<ResultLabels, Counter>::default();
        let tls_last_load_ok = Gauge::default();
        let tls_handshake_failures = Family::<ReasonLabels, Counter>::default();
        let cluster_refunds = Family::<ResultLabels, Counter>::default();
        let per_second_refunds = Family::<ResultLabels, Counter>::default();
        let shaped_requests = Family::<DomainLabels, Counter>::default();
        // 100 µs … ~52 s: a shaped request waits at most max_wait, at most 60 s.
        let shaped_delay = Histogram::new(exponential_buckets(0.000_1, 2.0, 20));
        let local_cache_entries = Gauge::default();
        let local_cache_evictions = Counter::default();
        let requests_in_flight = Gauge::default();
        registry.register(
            "floodgate_rule_hits",
            "Hits evaluated against a rule",
            rule_hits.clone(),
        );
        registry.register(
            "floodgate_rule_within_limit",
            "Hits a rule admitted",
            rule_within_limit.clone(),
        );
        registry.register(
            "floodgate_rule_over_limit",
            "Hits over a rule's limit (a shadow-mode rule's included)",
            rule_over_limit.clone(),
        );
        registry.register(
            "floodgate_rule_shadow_mode",
            "Hits a shadow-mode rule would have denied",
            rule_shadow_mode.clone(),
        );
        registry.register(
            "floodgate_rule_over_limit_local_cache",
            "Over-limit hits denied by the local over-limit cache, without a Redis call",
            rule_over_limit_local_cache.clone(),
        );
        registry.register(
            "floodgate_rule_near_limit",
            "Admitted hits above the near-limit ratio of a rule's capacity",
            rule_near_limit.clone(),
        );
        registry.register(
            "floodgate_rule_errors",
            "Hits of requests that failed with a store error",
            rule_errors.clone(),
        );
        registry.register(
            "floodgate_requests",
            "ShouldRateLimit calls by result",
            requests.clone(),
        );
        registry.register(
            "floodgate_request_duration_seconds",
            "ShouldRateLimit calls (gRPC and /json) from the decoded request to the answer, \
             by result",
            request_duration.clone(),
        );
        registry.register(
            "floodgate_domain_requests",
            "Answered ShouldRateLimit calls by configured domain (_unknown for any other) \
             and result",
            domain_requests.clone(),
        );
        registry.register(
            "floodgate_store_duration_seconds",
            "Time spent in the store per request",
            store_duration.clone(),
        );
        registry.register(
            "floodgate_config_loads",
            "Limits configuration loads by result",
            config_loads.clone(),
        );
        registry.register(
            "floodgate_config_last_reload_success",
            "1 if the last limits load (start-up or reload) succeeded, 0 if it failed",
            config_last_load_ok.clone(),
        );
        registry.register(
            "floodgate_memory_buckets",
            "Buckets held by the memory store",
            memory_buckets.clone(),
        );
        registry.register(
            "floodgate_memory_evictions",
            "Buckets the memory store evicted to stay within its bound",
            memory_evictions.clone(),
        );
        registry.register(
            "floodgate_store_errors",
            "Store failures by kind (unavailable: outage; failed: defect)",
            store_errors.clone(),
        );
        registry.register(
            "floodgate_store_degraded",
            "Requests answered by the failure policy because the store was unusable",
            store_degraded.clone(),
        );
        registry.register(
            "floodgate_local_decisions",
            "Requests decided by this replica's in-memory buckets (policy local) because Redis \
             could not answer, by reason (shed, circuit_open, store_error)",
            local_decisions.clone(),
        );
        registry.register(
            "floodgate_store_available",
            "1 while the store is usable (circuit closed), else 0",
            store_available.clone(),
        );
        registry.register(
            "floodgate_local_cache_over_limit",
            "Requests denied by the local over-limit cache without a store call",
            local_cache_over_limit.clone(),
        );
        registry.register(
            "floodgate_global_shadow_mode",
            "Requests answered OK only because of global shadow mode",
            global_shadow_mode.clone(),
        );
        registry.register(
            "floodgate_tls_loads",
            "gRPC TLS certificate loads (start-up and reloads) by result",
            tls_loads.clone(),
        );
        registry.register(
            "floodgate_tls_last_reload_success",
            "1 if the last gRPC TLS certificate load succeeded, 0 if it failed",
            tls_last_load_ok.clone(),
        );
        registry.register(
            "floodgate_tls_handshake_failures",
            "gRPC TLS handshakes that failed, by reason (error, timeout)",
            tls_handshake_failures.clone(),
        );
        registry.register(
            "floodgate_cluster_refunds",
            "Redis Cluster refunds of a slot group's debits after another group denied or failed, \
             by result (failed: the debit stays until the bucket refills)",
            cluster_refunds.clone(),
        );
        registry.register(
            "floodgate_per_second_refunds",
            "Refunds of one Redis's debits after the other (per-second or main) denied or \
             failed, by result (failed: the debit stays until the bucket refills)",
            per_second_refunds.clone(),
        );
        registry.register(
            "floodgate_shaped_requests",
            "Requests a max_wait limit held for their tokens instead of refusing, by domain and \
             how the wait ended (served: answered OK when the tokens arrived; released: answered \
             OK early by shutdown; cancelled: the client left, the tokens were refunded)",
            shaped_requests.clone(),
        );
        registry.register(
            "floodgate_shaped_delay_seconds",
            "How long shaped requests were held before their answer (or their cancellation)",
            shaped_delay.clone(),
        );
        registry.register(
            "floodgate_local_cache_entries",
            "Buckets the local over-limit cache holds",
            local_cache_entries.clone(),
        );
        registry.register(
            "floodgate_local_cache_evictions",
            "Entries the local over-limit cache dropped to stay within its bound",
            local_cache_evictions.clone(),
        );
        registry.register(
            "floodgate_requests_in_flight",
            "gRPC calls (from their first frame) and /json requests being answered now",
            requests_in_flight.clone(),
        );
        let abuse = Abuse::register(&mut registry);
        let leases = LeaseMetrics::register(&mut registry);
        let attached = Attached::default();
        registry.register_collector(Box::new(attached.clone()));
        let statsd_dropped = Counter::default();
        registry.register(
            "floodgate_statsd_dropped_lines",
            "statsd lines not sent (host unreachable, timer queue full, stat-name cap reached)",
            statsd_dropped.clone(),
        );
        Metrics {
            id: NEXT_METRICS_ID.fetch_add(1, Ordering::Relaxed),
            registry,
            rule_hits,
            rule_within_limit,
            rule_over_limit,
            rule_shadow_mode,
            rule_near_limit,
            rule_errors,
            rule_over_limit_local_cache,
            requests: RequestResult::ALL.map(|r| requests.get_or_create(&result_labels(r)).clone()),
            request_duration: RequestResult::ALL
                .map(|r| request_duration.get_or_create(&result_labels(r)).clone()),
            domain_requests,
            store_duration,
            store_duration_first: OnceLock::new(),
            config_loads,
            config_last_load_ok,
            memory_buckets,
            memory_evictions,
            store_errors,
            store_degraded,
            local_decisions,
            store_available,
            local_cache_over_limit,
            global_shadow_mode,
            tls_loads,
            tls_last_load_ok,
            tls_handshake_failures,
            cluster_refunds,
            per_second_refunds,
            shaped_requests,
            shaped_delay,
            local_cache_entries,
            local_cache_evictions,
            requests_in_flight,
            abuse,
            leases,
            samplers: Samplers::default(),
            attached,
            statsd: OnceLock::new(),
            statsd_dropped,
            loads: LoadHistory::default(),
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

    fn stat(&self, name: StatName, n: u64) {
        if let Some(stats) = self.statsd.get() {
            stats.count(name, n);
        }
    }

    /// Records one `ShouldRateLimit` gRPC call and its time (the reference counts these in
    /// its gRPC interceptor only: `/json` is not among them). statsd only: floodgate's own
    /// request counter is `floodgate_requests_total`.
    pub fn record_grpc_call(&self, elapsed: Duration) {
        if let Some(stats) = self.statsd.get() {
            stats.should_rate_limit(elapsed);
        }
    }

    /// Counts the descriptors of a request for a domain no configuration has (the
    /// reference's `domain_not_found`, counted per descriptor as it looks each one up).
    pub fn record_domain_not_found(&self, domain: &str, descriptors: usize) {
        if let Some(stats) = self.statsd.get() {
            stats.domain_not_found(domain, descriptors as u64);
        }
    }

    /// A shareable registry.
    pub fn shared() -> Arc<Metrics> {
        Arc::new(Metrics::new())
    }

    /// Counts a planned request's per-rule verdicts and its result.
    pub fn record_outcome(&self, outcome: &Outcome, result: RequestResult) {
        // Tallies exist only for a configured domain.
        let mut rule = None;
        if let Some(domain) = &outcome.domain {
            for tally in &outcome.tallies {
                rule = self.record_tally(domain, tally).or(rule);
            }
        }
        let labels = || DomainLabels {
            domain: LabelText(match &outcome.domain {
                Some(domain) => Arc::clone(domain),
                // Shared, not allocated per request: every unknown domain is this one label.
                None => Arc::clone(unknown_domain()),
            }),
            result: result.label(),
        };
        match rule {
            // The domain's series, reached through one of its rules' handles.
            Some(rule) => rule.domain_requests[result.index()]
                .get_or_init(|| self.domain_requests.get_or_create_owned(&labels()))
                .inc(),
            None => self.domain_requests.get_or_create(&labels()).inc(),
        };
        if outcome.shadowed {
            self.global_shadow_mode.inc();
            self.stat(StatName::GlobalShadowMode, 1);
        }
        self.record_request(result);
    }

    /// The handles of `tally`'s rule in this registry, resolved now if this is its first
    /// tally; `None` for a tally that must look its series up (see [`ResolvedSeries`]).
    fn resolved<'t>(&self, domain: &Arc<str>, tally: &'t Tally) -> Option<&'t ResolvedSeries> {
        match &tally.series {
            Some(series) if !tally.detailed => {
                let resolved = series.slot().get_or_init(|| {
                    Box::new(ResolvedSeries {
                        metrics: self.id,
                        domain: Arc::clone(domain),
                        rule: Arc::clone(&tally.rule),
                        hits: OnceLock::new(),
                        within_limit: OnceLock::new(),
                        over_limit: OnceLock::new(),
                        shadow_mode: OnceLock::new(),
                        over_limit_local_cache: OnceLock::new(),
                        near_limit: OnceLock::new(),
                        statsd: OnceLock::new(),
                        domain_requests: Default::default(),
                    })
                });
                // Only this module fills the slot, always with a `ResolvedSeries`.
                let resolved = resolved.downcast_ref::<ResolvedSeries>()?;
                resolved
                    .serves(self.id, domain, &tally.rule)
                    .then_some(resolved)
            }
            _ => None,
        }
    }

    /// Counts one tally: with its rule's handles when it has them ([`RuleSeries`]), else
    /// by looking each series up. Returns the handles used.
    fn record_tally<'t>(&self, domain: &Arc<str>, tally: &'t Tally) -> Option<&'t ResolvedSeries> {
        let Some(resolved) = self.resolved(domain, tally) else {
            self.look_up_tally(domain, tally);
            return None;
        };
        if let Some(stats) = self.statsd.get() {
            let counters = match resolved.statsd.get() {
                Some(counters) => Some(counters),
                // Past the name cap nothing is kept: each tally asks (and counts its drop).
                None => stats
                    .rule(&tally.rule)
                    .map(|counters| resolved.statsd.get_or_init(|| counters)),
            };
            if let Some(counters) = counters {
                record_stat_tally(counters, tally);
            }
        }
        let labels = || RuleLabels {
            domain: LabelText(Arc::clone(domain)),
            rule: LabelText(Arc::clone(&tally.rule)),
        };
        let add = |cell: &OnceLock<Counter>, family: &Family<RuleLabels, Counter>, n: u64| {
            cell.get_or_init(|| family.get_or_create_owned(&labels()))
                .inc_by(n);
        };
        add(&resolved.hits, &self.rule_hits, tally.hits);
        match tally.verdict {
            Verdict::WithinLimit => {
                add(&resolved.within_limit, &self.rule_within_limit, tally.hits)
            }
            Verdict::OverLimit | Verdict::ShadowOverLimit => {
                add(&resolved.over_limit, &self.rule_over_limit, tally.hits)
            }
        }
        if tally.verdict == Verdict::ShadowOverLimit {
            add(&resolved.shadow_mode, &self.rule_shadow_mode, tally.hits);
        }
        if tally.local_cache && tally.verdict != Verdict::WithinLimit {
            add(
                &resolved.over_limit_local_cache,
                &self.rule_over_limit_local_cache,
                tally.hits,
            );
        }
        if tally.near_limit > 0 {
            add(
                &resolved.near_limit,
                &self.rule_near_limit,
                tally.near_limit,
            );
        }
        Some(resolved)
    }

    /// [`Metrics::record_tally`] for a tally without resolved handles (a path with request
    /// values, or a rule resolved in another registry): each series looked up in its family.
    fn look_up_tally(&self, domain: &Arc<str>, tally: &Tally) {
        if let Some(counters) = self.statsd.get().and_then(|stats| stats.rule(&tally.rule)) {
            record_stat_tally(&counters, tally);
        }
        let labels = self.rule_labels(domain, &tally.rule, tally.detailed);
        self.rule_hits.get_or_create(&labels).inc_by(tally.hits);
        let family = match tally.verdict {
            Verdict::WithinLimit => &self.rule_within_limit,
            Verdict::OverLimit | Verdict::ShadowOverLimit => &self.rule_over_limit,
        };
        family.get_or_create(&labels).inc_by(tally.hits);
        if tally.verdict == Verdict::ShadowOverLimit {
            self.rule_shadow_mode
                .get_or_create(&labels)
                .inc_by(tally.hits);
        }
        if tally.local_cache && tally.verdict != Verdict::WithinLimit {
            self.rule_over_limit_local_cache
                .get_or_create(&labels)
                .inc_by(tally.hits);
        }
        if tally.near_limit > 0 {
            self.rule_near_limit
                .get_or_create(&labels)
                .inc_by(tally.near_limit);
        }
    }

    fn rule_labels(&self, domain: &Arc<str>, rule: &Arc<str>, detailed: bool) -> RuleLabels {
        let mut labels = RuleLabels {
            domain: LabelText(Arc::clone(domain)),
            rule: LabelText(Arc::clone(rule)),
        };
        if detailed && self.rule_hits.get(&labels).is_none() && !self.abuse.admit_detailed_series()
        {
            labels.rule = LabelText(Arc::from(OVERFLOW_RULE));
        }
        labels
    }

    /// Counts, per rule, the hits of a request that failed with a store error (`rules`:
    /// each matched rule's path, whether it holds request values, and its hits). Only the
    /// error path calls it.
    pub fn record_rule_errors<'a>(
        &self,
        domain: &Arc<str>,
        rules: impl IntoIterator<Item = (&'a Arc<str>, bool, u64)>,
    ) {
        for (rule, detailed, hits) in rules {
            let labels = self.rule_labels(domain, rule, detailed);
            self.rule_errors.get_or_create(&labels).inc_by(hits);
        }
    }

    /// Counts a ShouldRateLimit call by result.
    pub fn record_request(&self, result: RequestResult) {
        // The reference's two error counters: a Redis failure, and every other error its
        // service raises (an empty descriptor list, …). Overload has no twin there.
        match result {
            RequestResult::StoreError => self.stat(StatName::RedisError, 1),
            RequestResult::Invalid => self.stat(StatName::ServiceError, 1),
            _ => {}
        }
        self.requests[result.index()].inc();
    }

    /// Records one ShouldRateLimit call's time, from its decoded request to its answer.
    pub fn record_request_duration(&self, result: RequestResult, elapsed: Duration) {
        self.request_duration[result.index()].observe(elapsed.as_secs_f64());
    }

    /// Records the time one request spent in the store.
    pub fn record_store_duration(&self, store: &'static str, elapsed: Duration) {
        let (first, histogram) = self.store_duration_first.get_or_init(|| {
            (
                store,
                self.store_duration
                    .get_or_create_owned(&StoreLabels { store }),
            )
        });
        if *first == store {
            histogram.observe(elapsed.as_secs_f64());
        } else {
            self.store_duration
                .get_or_create(&StoreLabels { store })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// The counters of `rule` in `domain` (zero for a series never recorded). Read per
    /// configured rule when the console asks, so the request path does no extra work.
    pub fn rule_counts(&self, domain: &Arc<str>, rule: &Arc<str>) -> RuleCounts {
        let labels = RuleLabels {
            domain: LabelText(Arc::clone(domain)),
            rule: LabelText(Arc::clone(rule)),
        };
        let read =
            |family: &Family<RuleLabels, Counter>| family.get(&labels).map_or(0, |c| c.get());
        RuleCounts {
            hits: read(&self.rule_hits),
            within_limit: read(&self.rule_within_limit),
            over_limit: read(&self.rule_over_limit),
            shadow_mode: read(&self.rule_shadow_mode),
            errors: read(&self.rule_errors),
        }
    }

    /// ShouldRateLimit calls so far by result (`ok`, `over_limit`, `invalid`, `store_error`,
    /// `overloaded`), for the console.
    pub fn request_counts(&self) -> Vec<(&'static str, u64)> {
        RequestResult::ALL
            .into_iter()
            .map(|result| (result.label(), self.requests[result.index()].get()))
            .collect()
    }

    /// The last limits loads, newest first.
    pub fn loads(&self) -> &LoadHistory {
        &self.loads
    }

    /// Counts a limits load like [`Metrics::record_config_load`] and remembers it with
    /// `detail` (what was loaded, or why it failed) in [`Metrics::loads`].
    pub fn record_config_load_with(&self, ok: bool, detail: &str) {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.loads.record(at_unix_ms, ok, detail);
        self.record_config_load(ok);
    }

    /// Counts a limits configuration load (start-up or reload) and remembers whether the
    /// last one succeeded.
    pub fn record_config_load(&self, ok: bool) {
        self.stat(
            if ok {
                StatName::ConfigLoadSuccess
            } else {
                StatName::ConfigLoadError
            },
            1,
        );
        record_load(&self.config_loads, &self.config_last_load_ok, ok);
    }

    /// Counts a gRPC TLS certificate load (start-up or reload) and remembers whether the last
    /// one succeeded.
    pub fn record_tls_load(&self, ok: bool) {
        record_load(&self.tls_loads, &self.tls_last_load_ok, ok);
    }

    /// Counts a failed TLS handshake.
    pub fn record_tls_handshake_failure(&self, failure: HandshakeFailure) {
        let reason = match failure {
            HandshakeFailure::Error => "error",
            HandshakeFailure::Timeout => "timeout",
        };
        self.tls_handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sets the number of buckets held by the memory store.
    pub fn set_memory_buckets(&self, buckets: usize) {
        self.memory_buckets
            .set(i64::try_from(buckets).unwrap_or(i64::MAX));
    }

    /// Counts buckets the memory store evicted to stay within its bound.
    pub fn record_memory_evictions(&self, evicted: u64) {
        self.memory_evictions.inc_by(evicted);
    }

    /// Counts a store failure by kind (`StoreError::kind`).
    pub fn record_store_error(&self, kind: &'static str) {
        self.store_errors.get_or_create(&KindLabels { kind }).inc();
    }

    /// Counts a request answered by the failure policy.
    pub fn record_degraded(&self, policy: &'static str) {
        self.store_degraded
            .get_or_create(&PolicyLabels { policy })
            .inc();
    }

    /// Counts a request decided by the local buckets of policy `local`, and why Redis did not
    /// decide it (`shed`, `circuit_open`, `store_error`).
    pub fn record_local_decision(&self, reason: &'static str) {
        self.local_decisions
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sets whether the store is usable.
    pub fn set_store_available(&self, available: bool) {
        self.store_available.set(i64::from(available));
    }

    /// The lease layer's counters, for [`crate::store::lease`] to keep a handle to.
    pub fn leases(&self) -> &LeaseMetrics {
        &self.leases
    }

    /// Counts a request denied by the local over-limit cache.
    pub fn record_local_cache_hit(&self) {
        self.local_cache_over_limit.inc();
    }

    /// Counts a Redis Cluster refund call (one slot group's debits undone), by whether it
    /// succeeded.
    pub fn record_cluster_refund(&self, ok: bool) {
        self.cluster_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Counts one request a `max_wait` limit held for `held`, by how its wait ended.
    pub fn record_shaped(&self, domain: &Arc<str>, end: ShapedEnd, held: Duration) {
        self.shaped_requests
            .get_or_create(&DomainLabels {
                domain: LabelText(Arc::clone(domain)),
                result: end.label(),
            })
            .inc();
        self.shaped_delay.observe(held.as_secs_f64());
    }

    /// Counts one refund across the per-second split (`ok` or `failed`).
    pub fn record_per_second_refund(&self, ok: bool) {
        self.per_second_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Counts a request as in flight until the returned guard is dropped, unless `max` are
    /// already: then `None` and nothing counted. The gauge is the bound itself (one atomic
    /// shared by every serving thread), so it never reads above `max`.
    pub fn try_enter_request(&self, max: i64) -> Option<InFlight> {
        self.requests_in_flight
            .inner()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(InFlight(self.requests_in_flight.clone()))
    }

    /// Sets the number of buckets the local over-limit cache holds.
    pub fn set_local_cache_entries(&self, entries: u64) {
        self.local_cache_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Counts entries the local over-limit cache dropped to stay within its bound.
    pub fn record_local_cache_evictions(&self, evicted: u64) {
        self.local_cache_evictions.inc_by(evicted);
    }

    /// Runs `sampler` before every exposition, to set gauges read from their source (a
    /// store's size). It must be cheap and must not call [`Metrics::encode`].
    pub fn sample_before_encode(&self, sampler: impl Fn(&Metrics) + Send + Sync + 'static) {
        self.samplers
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(sampler));
    }

    /// Adds a metric family to every exposition from now on: a module above this one (such
    /// as `rlqs`) owns its metrics and registers them here once, as the families of this
    /// module are registered (a counter's name gets `_total` appended; `help` is written as
    /// given, so it ends with a period like the registry's).
    pub fn attach(
        &self,
        name: &'static str,
        help: &'static str,
        metric: impl prometheus_client::encoding::EncodeMetric + Send + Sync + 'static,
    ) {
        self.attached
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name, help, Box::new(metric)));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        for sampler in self
            .samplers
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            sampler(self);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Counts a tally in the rule's statsd counters, as the reference's base limiter does: every
/// hit in `total_hits`; admitted ones in `within_limit` (and `near_limit`); denied ones in
/// `over_limit` (and `over_limit_with_local_cache`), a shadow-mode rule's also in
/// `shadow_mode`. The same rules as the Prometheus rule counters.
fn record_stat_tally(counters: &RuleCounters, tally: &Tally) {
    let add = |counter: &AtomicU64, n: u64| {
        if n != 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    };
    add(&counters.total_hits, tally.hits);
    match tally.verdict {
        Verdict::WithinLimit => add(&counters.within_limit, tally.hits),
        Verdict::OverLimit | Verdict::ShadowOverLimit => add(&counters.over_limit, tally.hits),
    }
    if tally.verdict == Verdict::ShadowOverLimit {
        add(&counters.shadow_mode, tally.hits);
    }
    if tally.local_cache && tally.verdict != Verdict::WithinLimit {
        add(&counters.over_limit_with_local_cache, tally.hits);
    }
    add(&counters.near_limit, tally.near_limit);
}

/// Counts a load in `loads` by result and sets `last_ok` to whether it succeeded.
fn record_load(loads: &Family<ResultLabels, Counter>, last_ok: &Gauge, ok: bool) {
    loads
        .get_or_create(&ResultLabels {
            result: if ok { "success" } else { "error" },
        })
        .inc();
    last_ok.set(i64::from(ok));
}

/// The `rule` label of the series that `detailed_metric` / `value_to_metric` paths share once
/// [`Metrics::set_max_detailed_series`] distinct ones exist.
pub const OVERFLOW_RULE: &str = "_overflow";

/// Default of [`Metrics::set_max_detailed_series`].
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;

/// The counters of the lease layer ([`crate::store::lease`]): cheap clones of the registered
/// handles, so the layer records without going through [`Metrics`].
#[derive(Clone, Debug, Default)]
pub struct LeaseMetrics {
    acquired: Counter,
    tokens_leased: Counter,
    tokens_returned: Counter,
    return_failures: Counter,
    local_answers: Counter,
}

impl LeaseMetrics {
    fn register(registry: &mut Registry) -> LeaseMetrics {
        let leases = LeaseMetrics::default();
        registry.register(
            "floodgate_lease_acquired",
            "Leases taken on hot Redis buckets (one script call debits a slice of a bucket)",
            leases.acquired.clone(),
        );
        registry.register(
            "floodgate_lease_tokens",
            "Tokens debited in Redis as leases",
            leases.tokens_leased.clone(),
        );
        registry.register(
            "floodgate_lease_tokens_returned",
            "Unspent lease tokens sent back to their bucket (expiry, a changed limit, shutdown)",
            leases.tokens_returned.clone(),
        );
        registry.register(
            "floodgate_lease_return_failures",
            "Returns of unspent lease tokens that failed: those tokens stay debited until \
             their bucket refills or their window ends",
            leases.return_failures.clone(),
        );
        registry.register(
            "floodgate_lease_local_answers",
            "Requests answered from this replica's leases alone, without a Redis call",
            leases.local_answers.clone(),
        );
        leases
    }

    /// A lease of `tokens` was debited in Redis.
    pub fn record_acquired(&self, tokens: u64) {
        self.acquired.inc();
        self.tokens_leased.inc_by(tokens);
    }

    /// A return of `tokens` unspent tokens ended: sent (`ok`) or failed.
    pub fn record_returned(&self, tokens: u64, ok: bool) {
        if ok {
            self.tokens_returned.inc_by(tokens);
        } else {
            self.return_failures.inc();
        }
    }

    /// A request was answered from leases alone.
    pub fn record_local_answer(&self) {
        self.local_answers.inc();
    }
}

/// Metrics of the bounds that keep one client from exhausting the server: connections per
/// port, and the cap on rule series that carry request values.
#[derive(Debug)]
struct Abuse {
    connections_open: Family<PortLabels, Gauge>,
    connections_refused: Family<PortLabels, Counter>,
    connections_evicted: Family<PortLabels, Counter>,
    connections_handshake_timeouts: Family<PortLabels, Counter>,
    connections_idle_closed: Family<PortLabels, Counter>,
    accept_errors: Family<PortLabels, Counter>,
    /// Tallies counted under the overflow series because the cap was reached.
    detailed_overflow: Counter,
    /// Distinct detailed rule paths with their own series.
    detailed_series: AtomicUsize,
    /// The cap on `detailed_series`.
    max_detailed_series: AtomicUsize,
}

impl Abuse {
    fn register(registry: &mut Registry) -> Abuse {
        let abuse = Abuse {
            connections_open: Family::default(),
            connections_refused: Family::default(),
            connections_evicted: Family::default(),
            connections_handshake_timeouts: Family::default(),
            connections_idle_closed: Family::default(),
            accept_errors: Family::default(),
            detailed_overflow: Counter::default(),
            detailed_series: AtomicUsize::new(0),
            max_detailed_series: AtomicUsize::new(DEFAULT_MAX_DETAILED_SERIES),
        };
        registry.register(
            "floodgate_connections_open",
            "Connections open now, by port (grpc, http)",
            abuse.connections_open.clone(),
        );
        registry.register(
            "floodgate_connections_refused",
            "Connections closed at once because the port's connection limit was reached \
             and every connection had a call in flight",
            abuse.connections_refused.clone(),
        );
        registry.register(
            "floodgate_connections_evicted",
            "Idle connections closed to admit a new one because the port's connection limit \
             was reached",
            abuse.connections_evicted.clone(),
        );
        registry.register(
            "floodgate_connections_handshake_timeouts",
            "Connections closed because they had not sent their HTTP/2 preface (TLS handshake \
             included) or HTTP/1 request line within the handshake timeout",
            abuse.connections_handshake_timeouts.clone(),
        );
        registry.register(
            "floodgate_connections_idle_closed",
            "Connections closed because nothing was read from them for the idle timeout",
            abuse.connections_idle_closed.clone(),
        );
        registry.register(
            "floodgate_accept_errors",
            "Failed accepts (e.g. out of file descriptors), by port",
            abuse.accept_errors.clone(),
        );
        registry.register(
            "floodgate_rule_series_overflow",
            "Rule tallies with request values counted under the _overflow rule label \
             because the cap on such series was reached",
            abuse.detailed_overflow.clone(),
        );
        abuse
    }

    /// Whether one more detailed series may be created; counts an overflow if not.
    fn admit_detailed_series(&self) -> bool {
        let max = self.max_detailed_series.load(Ordering::Relaxed);
        let admitted = self
            .detailed_series
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.detailed_overflow.inc();
        }
        admitted
    }
}

impl Metrics {
    /// Caps the distinct rule series that carry request values (`detailed_metric`,
    /// `value_to_metric`); past it, such tallies count under the rule label
    /// [`OVERFLOW_RULE`] and in `floodgate_rule_series_overflow_total`.
    pub fn set_max_detailed_series(&self, max: usize) {
        self.abuse.max_detailed_series.store(max, Ordering::Relaxed);
    }

    /// The `floodgate_connections_open` gauge of `port` (connections count themselves).
    pub fn connections_open(&self, port: Port) -> Gauge {
        self.abuse
            .connections_open
            .get_or_create_owned(&PortLabels { port: port.label() })
    }

    /// Counts a connection refused because the port's limit was reached.
    pub fn record_connection_refused(&self, port: Port) {
        self.abuse
            .connections_refused
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts an idle connection closed to admit a new one at the port's limit.
    pub fn record_connection_evicted(&self, port: Port) {
        self.abuse
            .connections_evicted
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a connection closed for not sending its opening within the handshake timeout.
    pub fn record_handshake_timeout(&self, port: Port) {
        self.abuse
            .connections_handshake_timeouts
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a connection closed for being silent too long.
    pub fn record_idle_close(&self, port: Port) {
        self.abuse
            .connections_idle_closed
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a failed accept.
    pub fn record_accept_error(&self, port: Port) {
        self.abuse
            .accept_errors
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(rule: &str, detailed: bool) -> Tally {
        Tally {
            rule: rule.into(),
            detailed,
            hits: 1,
            verdict: Verdict::WithinLimit,
            near_limit: 0,
            local_cache: false,
            series: None,
        }
    }

    /// Request bytes in a label value are escaped; past the cap, paths with request values
    /// share the overflow series (counted), while configured paths are never capped.
    /// The in-flight gauge is the bound: entering stops at `max`, and a dropped guard frees
    /// its place.
    #[test]
    fn in_flight_gauge_bounds_entries() {
        let metrics = Metrics::new();
        let first = metrics.try_enter_request(2);
        let second = metrics.try_enter_request(2);
        assert!(first.is_some() && second.is_some());
        assert!(metrics.try_enter_request(2).is_none());
        assert_eq!(metrics.requests_in_flight.get(), 2);
        drop(first);
        assert_eq!(metrics.requests_in_flight.get(), 1);
        assert!(metrics.try_enter_request(2).is_some());
        assert_eq!(metrics.requests_in_flight.get(), 1);
    }

    #[test]
    fn detailed_labels_are_escaped_and_capped() {
        let metrics = Metrics::new();
        metrics.set_max_detailed_series(2);
        let domain: Arc<str> = "d".into();
        for rule in ["d.user_a\"b", "d.user_x\ny", "d.user_back\\", "d.user_more"] {
            metrics.record_tally(&domain, &tally(rule, true));
        }
        // Seen before the cap: still its own series.
        metrics.record_tally(&domain, &tally("d.user_a\"b", true));
        metrics.record_tally(&domain, &tally("d.k", false));
        let text = metrics.encode();
        assert!(text.contains(r#"rule="d.user_a\"b"} 2"#), "{text}");
        assert!(text.contains(r#"rule="d.user_x\ny""#), "{text}");
        assert!(text.contains(r#"rule="_overflow"} 2"#), "{text}");
        assert!(text.contains(r#"rule="d.k""#), "{text}");
        assert!(!text.contains("d.user_back"), "{text}");
        assert!(
            text.contains("floodgate_rule_series_overflow_total 2"),
            "{text}"
        );
    }

    /// The exposition's lines, sorted: a family's series come in its hash map's order, which
    /// differs between registries.
    fn lines(metrics: &Metrics) -> Vec<String> {
        let mut lines: Vec<String> = metrics.encode().lines().map(str::to_owned).collect();
        lines.sort();
        lines
    }

    /// Counting through a rule's handles exports byte for byte what looking each series up
    /// exports (a series appears when first counted, not when the rule is resolved), and a
    /// rule resolved in one registry or for one domain label still counts the right series
    /// in another.
    #[test]
    fn rule_handles_export_what_lookups_export() {
        let series = RuleSeries::default();
        let domain: Arc<str> = "d".into();
        let tallies = [
            (Verdict::WithinLimit, 0, false),
            (Verdict::WithinLimit, 1, false),
            (Verdict::OverLimit, 0, true),
            (Verdict::ShadowOverLimit, 0, false),
        ];
        let (handles, lookups) = (Metrics::new(), Metrics::new());
        for (i, (verdict, near_limit, local_cache)) in tallies.into_iter().enumerate() {
            let tally = |series: Option<RuleSeries>| Tally {
                verdict,
                near_limit,
                local_cache,
                hits: 2,
                series,
                ..tally("d.k", false)
            };
            handles.record_tally(&domain, &tally(Some(series.clone())));
            lookups.record_tally(&domain, &tally(None));
            assert_eq!(lines(&handles), lines(&lookups), "after tally {i}");
        }
        let outcome = |series: Option<RuleSeries>| Outcome {
            response: Default::default(),
            over: false,
            domain: Some(Arc::clone(&domain)),
            tallies: vec![Tally {
                series,
                ..tally("d.k", false)
            }],
            shadowed: false,
        };
        for result in [
            RequestResult::Ok,
            RequestResult::OverLimit,
            RequestResult::Ok,
        ] {
            handles.record_outcome(&outcome(Some(series.clone())), result);
            lookups.record_outcome(&outcome(None), result);
        }
        assert_eq!(lines(&handles), lines(&lookups));
        // The same rule counted in another registry, and under another domain label.
        let other = Metrics::new();
        other.record_tally(
            &domain,
            &Tally {
                series: Some(series.clone()),
                ..tally("d.k", false)
            },
        );
        handles.record_tally(
            &"e".into(),
            &Tally {
                series: Some(series.clone()),
                ..tally("d.k", false)
            },
        );
        let text = other.encode();
        assert!(
            text.contains(r#"floodgate_rule_hits_total{domain="d",rule="d.k"} 1"#),
            "{text}"
        );
        let text = handles.encode();
        assert!(
            text.contains(r#"floodgate_rule_hits_total{domain="d",rule="d.k"} 11"#),
            "{text}"
        );
        assert!(
            text.contains(r#"floodgate_rule_hits_total{domain="e",rule="d.k"} 1"#),
            "{text}"
        );
    }
}
