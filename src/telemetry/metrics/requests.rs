//! Request metrics: ShouldRateLimit calls by result and their time, answers per configured
//! domain, requests held by `max_wait` limits, requests in flight (a mirror of the bound's
//! count, which `admission::InFlight` holds), and the reference's call and
//! domain-not-found stats.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::duration::DurationHistogram;
use super::striped::StripedCounter;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::labels::{
    DomainLabels, LabelText, RequestResult, ResultLabels, ShapedEnd, result_labels,
};
use crate::telemetry::statsd::StatName;

/// The request families and handles.
#[derive(Debug)]
pub(super) struct RequestMetrics {
    /// `floodgate_requests_total` and `floodgate_request_duration_seconds` by result, resolved
    /// once: every request records both, so none looks its series up. Spread
    /// ([`super::striped`]): every serving thread counts them.
    total: [StripedCounter; 5],
    duration: [DurationHistogram; 5],
    /// `floodgate_domain_requests_total`; a request with a tally reaches its domain's series
    /// through the tally's rule handles ([`super::rules`]).
    pub(super) domain: Family<DomainLabels, StripedCounter>,
    /// The `_unknown` domain's series of `domain`, by [`RequestResult::index`], each taken
    /// from the family (and spread) when first counted.
    pub(super) unknown_domain: [OnceLock<StripedCounter>; 5],
    pub(super) global_shadow_mode: Counter,
    shaped: Family<DomainLabels, Counter>,
    shaped_delay: Histogram,
    in_flight: Gauge,
    /// `floodgate_oversized_values_total`.
    oversized_values: Counter,
    /// `floodgate_ignored_overrides_total`.
    ignored_overrides: Counter,
}

impl RequestMetrics {
    /// The request counters and times and the domain answers, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> RequestMetrics {
        let requests = Family::<ResultLabels, StripedCounter>::default();
        // 50 µs … ~1.6 s: an answer from memory at the bottom, Envoy's 20 ms timeout in the
        // middle, a Redis outage's timeouts near the top.
        let request_duration = Family::<ResultLabels, DurationHistogram>::new_with_constructor(
            (|| DurationHistogram::new(exponential_buckets(0.000_05, 2.0, 16)))
                as fn() -> DurationHistogram,
        );
        let ours = RequestMetrics {
            total: RequestResult::ALL.map(|r| {
                let total = requests.get_or_create(&result_labels(r)).clone();
                total.inner().spread();
                total
            }),
            duration: RequestResult::ALL
                .map(|r| request_duration.get_or_create(&result_labels(r)).clone()),
            domain: Family::default(),
            unknown_domain: Default::default(),
            global_shadow_mode: Counter::default(),
            shaped: Family::default(),
            // 100 µs … ~52 s: a shaped request waits at most max_wait, at most 60 s.
            shaped_delay: Histogram::new(exponential_buckets(0.000_1, 2.0, 20)),
            in_flight: Gauge::default(),
            oversized_values: Counter::default(),
            ignored_overrides: Counter::default(),
        };
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
            ours.domain.clone(),
        );
        registry.register(
            "floodgate_oversized_values",
            "Descriptor keys and values longer than --max-value-bytes: matched in full, then \
             known by a digest in bucket keys and metric paths (limited, never refused)",
            ours.oversized_values.clone(),
        );
        registry.register(
            "floodgate_ignored_overrides",
            "Descriptor limit overrides whose unit is none: ignored, the descriptor matched \
             against the configured rules",
            ours.ignored_overrides.clone(),
        );
        ours
    }

    /// `floodgate_global_shadow_mode_total`, registered in `registry`.
    pub(super) fn register_shadow(&self, registry: &mut Registry) {
        let requests = self;
        registry.register(
            "floodgate_global_shadow_mode",
            "Requests answered OK only because of global shadow mode",
            requests.global_shadow_mode.clone(),
        );
    }

    /// The held requests' count and delay, registered in `registry`.
    pub(super) fn register_shaped(&self, registry: &mut Registry) {
        let requests = self;
        registry.register(
            "floodgate_shaped_requests",
            "Requests a max_wait limit held for their tokens instead of refusing, by domain and \
             how the wait ended (served: answered OK when the tokens arrived; refused: shutdown \
             cuts the connections before their turn, the tokens were refunded; cancelled: the \
             client left, the tokens were refunded)",
            requests.shaped.clone(),
        );
        registry.register(
            "floodgate_shaped_delay_seconds",
            "How long shaped requests were held before their answer (or their cancellation)",
            requests.shaped_delay.clone(),
        );
    }

    /// `floodgate_requests_in_flight`, registered in `registry`.
    pub(super) fn register_in_flight(&self, registry: &mut Registry) {
        let requests = self;
        registry.register(
            "floodgate_requests_in_flight",
            "gRPC calls (from their first frame) and /json requests being answered now",
            requests.in_flight.clone(),
        );
    }
}

impl Metrics {
    /// Records one `ShouldRateLimit` gRPC call and its time (the reference counts these in
    /// its gRPC interceptor only: `/json` is not among them). statsd only: floodgate's own
    /// request counter is `floodgate_requests_total`.
    pub fn record_grpc_call(&self, elapsed: Duration) {
        if let Some(stats) = self.statsd.get() {
            stats.record_call(elapsed);
        }
    }

    /// Whether [`Metrics::record_grpc_call`] counts anything (statsd or the reference's
    /// series are on): the caller reads the clock for a call's time only then, as two clock
    /// reads are a visible share of a request that does nothing else.
    pub fn times_grpc_calls(&self) -> bool {
        self.statsd.get().is_some()
    }

    /// Counts the descriptors of a request for a domain no configuration has (the
    /// reference's `domain_not_found`, counted per descriptor as it looks each one up).
    pub fn record_domain_not_found(&self, domain: &str, descriptors: usize) {
        if let Some(stats) = self.statsd.get() {
            stats.domain_not_found(domain, descriptors as u64);
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
        self.requests.total[result.index()].inc();
    }

    /// Counts a request's keys and values over `--max-value-bytes` (`oversized`) and its
    /// ignored `limit` overrides (`ignored_overrides`): what the planner stood in for.
    pub fn record_request_fixups(&self, oversized: usize, ignored_overrides: usize) {
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.requests.oversized_values.inc_by(count(oversized));
        self.requests
            .ignored_overrides
            .inc_by(count(ignored_overrides));
    }

    /// Records one ShouldRateLimit call's time, from its decoded request to its answer.
    pub fn record_request_duration(&self, result: RequestResult, elapsed: Duration) {
        self.requests.duration[result.index()].observe(elapsed);
    }

    /// ShouldRateLimit calls so far by result (`ok`, `over_limit`, `invalid`, `store_error`,
    /// `overloaded`), for the console.
    pub fn request_counts(&self) -> Vec<(&'static str, u64)> {
        RequestResult::ALL
            .into_iter()
            .map(|result| (result.label(), self.requests.total[result.index()].get()))
            .collect()
    }

    /// Counts one request a `max_wait` limit held for `held`, by how its wait ended.
    pub fn record_shaped(&self, domain: &Arc<str>, end: ShapedEnd, held: Duration) {
        self.requests
            .shaped
            .get_or_create(&DomainLabels {
                domain: LabelText(Arc::clone(domain)),
                result: end.label(),
            })
            .inc();
        self.requests.shaped_delay.observe(held.as_secs_f64());
    }

    /// Reads `floodgate_requests_in_flight` from `count` at every exposition: admission
    /// (`admission::InFlight`) holds the `--max-in-flight` bound and its count; metrics only
    /// shows it, so the request path updates one atomic, not two.
    pub fn mirror_requests_in_flight(&self, count: impl Fn() -> usize + Send + Sync + 'static) {
        let gauge = self.requests.in_flight.clone();
        self.samplers.add(move || {
            gauge.set(i64::try_from(count()).unwrap_or(i64::MAX));
        });
    }
}
