//! Per-rule metrics: each rule's hits and verdicts (`floodgate_rule_*`), counted from a
//! request's [`Outcome`], with the reference's statsd stats of the rule beside them, and the
//! cap on series that carry request values.
//!
//! A configured rule's handles are resolved once per limits load
//! ([`Metrics::resolve_rules`], which the limits publisher calls after compiling and before
//! swapping the configuration in) into a [`RuleHandles`], indexed by each rule's index in its
//! configuration and swapped in beside it, so counting a tally is one atomic add per
//! counter: no lock, no hash. Looking a series up in its family takes the family's lock and
//! hashes both labels; a tally needs two to four series, plus the reference's statsd
//! counters (a lock and a hash of their own) when those are on. A reload resolves new
//! handles from the same families, so the counts carry on.
//!
//! Tallies whose rule path holds request values (`detailed_metric`, `value_to_metric`) have
//! no handles: their labels are known only per request, so each looks its series up, at most
//! `--metrics-max-detailed-series` of them ([`DEFAULT_MAX_DETAILED_SERIES`]); later paths
//! count under [`OVERFLOW_RULE`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::labels::{DomainLabels, LabelText, RequestResult, RuleLabels};
use super::striped::StripedCounter;
use crate::outcome::{Outcome, Tally, Verdict};
use crate::telemetry::statsd::{RuleCounters, StatName};

/// The `domain` label of requests for a domain no configuration has: clients choose those
/// names, so they never become label values of their own.
pub const UNKNOWN_DOMAIN: &str = "_unknown";

/// [`UNKNOWN_DOMAIN`] as the label value, made once.
fn unknown_domain() -> &'static Arc<str> {
    static UNKNOWN: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| Arc::from(UNKNOWN_DOMAIN));
    &UNKNOWN
}

/// The `rule` label of the series that `detailed_metric` / `value_to_metric` paths share once
/// [`Metrics::set_max_detailed_series`] distinct ones exist.
pub const OVERFLOW_RULE: &str = "_overflow";

/// Default of [`Metrics::set_max_detailed_series`].
pub const DEFAULT_MAX_DETAILED_SERIES: usize = 10_000;

/// The per-rule families and the cap on detailed series.
#[derive(Debug)]
pub(super) struct RuleMetrics {
    hits: Family<RuleLabels, StripedCounter>,
    within_limit: Family<RuleLabels, StripedCounter>,
    over_limit: Family<RuleLabels, StripedCounter>,
    shadow_mode: Family<RuleLabels, StripedCounter>,
    over_limit_local_cache: Family<RuleLabels, StripedCounter>,
    near_limit: Family<RuleLabels, StripedCounter>,
    errors: Family<RuleLabels, StripedCounter>,
    /// Tallies counted under the overflow series because the cap was reached.
    detailed_overflow: Counter,
    /// Distinct detailed rule paths with their own series.
    detailed_series: AtomicUsize,
    /// The cap on `detailed_series`.
    max_detailed_series: AtomicUsize,
}

impl RuleMetrics {
    /// The per-rule families, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> RuleMetrics {
        let rules = RuleMetrics {
            hits: Family::default(),
            within_limit: Family::default(),
            over_limit: Family::default(),
            shadow_mode: Family::default(),
            over_limit_local_cache: Family::default(),
            near_limit: Family::default(),
            errors: Family::default(),
            detailed_overflow: Counter::default(),
            detailed_series: AtomicUsize::new(0),
            max_detailed_series: AtomicUsize::new(DEFAULT_MAX_DETAILED_SERIES),
        };
        registry.register(
            "floodgate_rule_hits",
            "Hits evaluated against a rule",
            rules.hits.clone(),
        );
        registry.register(
            "floodgate_rule_within_limit",
            "Hits a rule admitted",
            rules.within_limit.clone(),
        );
        registry.register(
            "floodgate_rule_over_limit",
            "Hits over a rule's limit (a shadow-mode rule's included)",
            rules.over_limit.clone(),
        );
        registry.register(
            "floodgate_rule_shadow_mode",
            "Hits a shadow-mode rule would have denied",
            rules.shadow_mode.clone(),
        );
        registry.register(
            "floodgate_rule_over_limit_local_cache",
            "Over-limit hits denied by the local over-limit cache, without a Redis call",
            rules.over_limit_local_cache.clone(),
        );
        registry.register(
            "floodgate_rule_near_limit",
            "Admitted hits above the near-limit ratio of a rule's capacity",
            rules.near_limit.clone(),
        );
        registry.register(
            "floodgate_rule_errors",
            "Hits of requests that failed with a store error",
            rules.errors.clone(),
        );
        rules
    }

    /// `floodgate_rule_series_overflow_total`, registered in `registry`.
    pub(super) fn register_overflow(&self, registry: &mut Registry) {
        let rules = self;
        registry.register(
            "floodgate_rule_series_overflow",
            "Rule tallies with request values counted under the _overflow rule label \
             because the cap on such series was reached",
            rules.detailed_overflow.clone(),
        );
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

/// A configured rule, as the limits publisher shows it to [`Metrics::resolve_rules`].
#[derive(Clone, Copy, Debug)]
pub struct ConfiguredRule<'a> {
    /// The rule's index in its configuration ([`Tally::rule_index`] of its tallies).
    pub index: usize,
    /// The domain's metric label ([`Outcome::domain`] of its requests).
    pub domain: &'a Arc<str>,
    /// The rule's metric path (`domain.key_value.key`).
    pub path: &'a Arc<str>,
    /// `detailed_metric`: every tally of the rule holds request values, so its configured
    /// path is never counted.
    pub detailed: bool,
}

/// The series handles of every configured rule of one configuration in one [`Metrics`],
/// indexed by the rule's index: what the limits publisher swaps in beside the configuration.
/// Empty ([`RuleHandles::default`]) for a configuration no registry resolved: its tallies
/// look their series up.
#[derive(Default)]
pub struct RuleHandles {
    /// The [`Metrics`] they belong to ([`Metrics::id`]): another registry (tests make many)
    /// looks its series up.
    metrics: Option<u64>,
    /// By rule index; `None` for a rule counted only under request values.
    rules: Box<[Option<RuleHandle>]>,
}

impl std::fmt::Debug for RuleHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resolved = self.rules.iter().flatten().count();
        write!(f, "RuleHandles({resolved} rules)")
    }
}

impl RuleHandles {
    /// The handles of the rule at `index`, if they are the series of `domain`/`rule` in the
    /// registry `metrics`.
    fn get(
        &self,
        metrics: u64,
        index: usize,
        domain: &Arc<str>,
        rule: &Arc<str>,
    ) -> Option<&RuleHandle> {
        if self.metrics != Some(metrics) {
            return None;
        }
        let handle = self.rules.get(index)?.as_ref()?;
        handle.serves(domain, rule).then_some(handle)
    }

    /// The handles of the rule at `index`, if resolved.
    #[cfg(test)]
    pub(super) fn rule(&self, index: usize) -> Option<&RuleHandle> {
        self.rules.get(index)?.as_ref()
    }
}

/// The handles of one rule's series in one [`Metrics`], resolved when the rule's limits
/// load.
pub(super) struct RuleHandle {
    /// The labels they were resolved for: a tally whose labels differ (a rule counted under
    /// another domain's label) looks its series up.
    domain: Arc<str>,
    rule: Arc<str>,
    /// Each series, taken from its family when it first counts.
    hits: OnceLock<StripedCounter>,
    within_limit: OnceLock<StripedCounter>,
    over_limit: OnceLock<StripedCounter>,
    shadow_mode: OnceLock<StripedCounter>,
    over_limit_local_cache: OnceLock<StripedCounter>,
    near_limit: OnceLock<StripedCounter>,
    errors: OnceLock<StripedCounter>,
    /// The reference's statsd counters of the rule path: resolved with the handles when the
    /// stats are on (and the name cap admits the path), else on the first tally that finds
    /// them on.
    statsd: OnceLock<Arc<RuleCounters>>,
    /// `floodgate_domain_requests_total` of the rule's domain, by [`RequestResult::index`]:
    /// a request with a tally reaches its domain's series through the tally's rule.
    domain_requests: [OnceLock<StripedCounter>; 5],
}

impl RuleHandle {
    /// The handles of `rule` in `domain`, in `metrics`.
    fn new(metrics: &Metrics, domain: &Arc<str>, rule: &Arc<str>) -> RuleHandle {
        let statsd = OnceLock::new();
        if let Some(counters) = metrics.statsd.get().and_then(|stats| stats.rule(rule)) {
            let _ = statsd.set(counters);
        }
        RuleHandle {
            domain: Arc::clone(domain),
            rule: Arc::clone(rule),
            hits: OnceLock::new(),
            within_limit: OnceLock::new(),
            over_limit: OnceLock::new(),
            shadow_mode: OnceLock::new(),
            over_limit_local_cache: OnceLock::new(),
            near_limit: OnceLock::new(),
            errors: OnceLock::new(),
            statsd,
            domain_requests: Default::default(),
        }
    }

    /// The reference's statsd counters these handles hold, if resolved.
    #[cfg(test)]
    pub(super) fn statsd(&self) -> Option<&Arc<RuleCounters>> {
        self.statsd.get()
    }

    /// What the error counter these handles hold has counted, if it was taken.
    #[cfg(test)]
    pub(super) fn errors_counted(&self) -> Option<u64> {
        self.errors.get().map(StripedCounter::get)
    }

    /// Whether the hit series these handles hold, if taken, is spread over stripes.
    #[cfg(test)]
    pub(super) fn hits_spread(&self) -> Option<bool> {
        self.hits.get().map(|series| series.inner().is_spread())
    }

    /// Whether these handles are the series of `domain`/`rule`.
    fn serves(&self, domain: &Arc<str>, rule: &Arc<str>) -> bool {
        let same = |a: &Arc<str>, b: &Arc<str>| Arc::ptr_eq(a, b) || **a == **b;
        same(&self.domain, domain) && same(&self.rule, rule)
    }
}

impl Metrics {
    /// Resolves the handles of every configured rule of `rules` in this registry, so that
    /// requests count them with atomic adds alone. The limits publisher calls it on a freshly
    /// compiled configuration and swaps the handles in beside it.
    pub fn resolve_rules<'a>(
        &self,
        rules: impl IntoIterator<Item = ConfiguredRule<'a>>,
    ) -> RuleHandles {
        let mut resolved: Vec<Option<RuleHandle>> = Vec::new();
        for rule in rules {
            // A rule counted only under request values never counts its configured path.
            if rule.detailed {
                continue;
            }
            if resolved.len() <= rule.index {
                resolved.resize_with(rule.index + 1, || None);
            }
            resolved[rule.index] = Some(RuleHandle::new(self, rule.domain, rule.path));
        }
        RuleHandles {
            metrics: Some(self.id),
            rules: resolved.into_boxed_slice(),
        }
    }

    /// The handles of `tally`'s rule in `rules`; `None` for a tally that must look its
    /// series up (its path holds request values, or see [`RuleHandles::get`]).
    fn handles<'h>(
        &self,
        domain: &Arc<str>,
        tally: &Tally,
        rules: &'h RuleHandles,
    ) -> Option<&'h RuleHandle> {
        match tally.rule_index {
            Some(index) if !tally.detailed => rules.get(self.id, index, domain, &tally.rule),
            _ => None,
        }
    }

    /// Counts a planned request's per-rule verdicts and its result, through the handles
    /// `rules` resolved for the configuration that planned it.
    pub fn record_outcome(&self, outcome: &Outcome, rules: &RuleHandles, result: RequestResult) {
        // Tallies exist only for a configured domain.
        let mut rule = None;
        if let Some(domain) = &outcome.domain {
            for tally in &outcome.tallies {
                rule = self.record_tally(domain, tally, rules).or(rule);
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
        let cell = match (rule, &outcome.domain) {
            // The domain's series, reached through one of its rules' handles.
            (Some(rule), _) => Some(&rule.domain_requests[result.index()]),
            // Every unknown domain is one series: a flood of made-up domains takes no lock.
            (None, None) => Some(&self.requests.unknown_domain[result.index()]),
            (None, Some(_)) => None,
        };
        match cell {
            Some(cell) => cell
                .get_or_init(|| {
                    let series = self.requests.domain.get_or_create_owned(&labels());
                    series.inner().spread();
                    series
                })
                .inc(),
            None => self.requests.domain.get_or_create(&labels()).inc(),
        };
        if outcome.shadowed {
            self.requests.global_shadow_mode.inc();
            self.stat(StatName::GlobalShadowMode, 1);
        }
        self.record_request(result);
    }

    /// Counts one tally: with its rule's handles in `rules` when it has them, else by
    /// looking each series up. Returns the handles used.
    ///
    /// With handles, each counter is one atomic add (its series is taken from its family
    /// the first time it counts, so the exposition shows what a lookup would create).
    pub(super) fn record_tally<'h>(
        &self,
        domain: &Arc<str>,
        tally: &Tally,
        rules: &'h RuleHandles,
    ) -> Option<&'h RuleHandle> {
        let Some(resolved) = self.handles(domain, tally, rules) else {
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
        // `spread`: the hit and verdict series, which every request of the rule counts, get
        // per-thread stripes ([`super::striped`]); the rarer ones stay one atomic.
        let add = |cell: &OnceLock<StripedCounter>,
                   family: &Family<RuleLabels, StripedCounter>,
                   spread: bool,
                   n: u64| {
            cell.get_or_init(|| {
                let series = family.get_or_create_owned(&labels());
                if spread {
                    series.inner().spread();
                }
                series
            })
            .inc_by(n);
        };
        add(&resolved.hits, &self.rules.hits, true, tally.hits);
        match tally.verdict {
            Verdict::WithinLimit => add(
                &resolved.within_limit,
                &self.rules.within_limit,
                true,
                tally.hits,
            ),
            Verdict::OverLimit | Verdict::ShadowOverLimit => add(
                &resolved.over_limit,
                &self.rules.over_limit,
                true,
                tally.hits,
            ),
        }
        if tally.verdict == Verdict::ShadowOverLimit {
            add(
                &resolved.shadow_mode,
                &self.rules.shadow_mode,
                false,
                tally.hits,
            );
        }
        if tally.local_cache && tally.verdict != Verdict::WithinLimit {
            add(
                &resolved.over_limit_local_cache,
                &self.rules.over_limit_local_cache,
                false,
                tally.hits,
            );
        }
        if tally.near_limit > 0 {
            add(
                &resolved.near_limit,
                &self.rules.near_limit,
                false,
                tally.near_limit,
            );
        }
        Some(resolved)
    }

    /// [`Metrics::record_tally`] for a tally without handles (a path with request
    /// values, or a rule resolved in another registry): each series looked up in its family.
    fn look_up_tally(&self, domain: &Arc<str>, tally: &Tally) {
        if let Some(counters) = self.statsd.get().and_then(|stats| stats.rule(&tally.rule)) {
            record_stat_tally(&counters, tally);
        }
        let labels = self.rule_labels(domain, &tally.rule, tally.detailed);
        self.rules.hits.get_or_create(&labels).inc_by(tally.hits);
        let family = match tally.verdict {
            Verdict::WithinLimit => &self.rules.within_limit,
            Verdict::OverLimit | Verdict::ShadowOverLimit => &self.rules.over_limit,
        };
        family.get_or_create(&labels).inc_by(tally.hits);
        if tally.verdict == Verdict::ShadowOverLimit {
            self.rules
                .shadow_mode
                .get_or_create(&labels)
                .inc_by(tally.hits);
        }
        if tally.local_cache && tally.verdict != Verdict::WithinLimit {
            self.rules
                .over_limit_local_cache
                .get_or_create(&labels)
                .inc_by(tally.hits);
        }
        if tally.near_limit > 0 {
            self.rules
                .near_limit
                .get_or_create(&labels)
                .inc_by(tally.near_limit);
        }
    }

    fn rule_labels(&self, domain: &Arc<str>, rule: &Arc<str>, detailed: bool) -> RuleLabels {
        let mut labels = RuleLabels {
            domain: LabelText(Arc::clone(domain)),
            rule: LabelText(Arc::clone(rule)),
        };
        if detailed && self.rules.hits.get(&labels).is_none() && !self.rules.admit_detailed_series()
        {
            labels.rule = LabelText(Arc::from(OVERFLOW_RULE));
        }
        labels
    }

    /// Counts, per rule, the hits of a request that failed with a store error (`rules`:
    /// each matched rule's path, whether it holds request values, its hits, and the
    /// configured rule's index where the path is the configured one; `handles`: those
    /// resolved for the configuration that planned it). Only the error path calls it, but
    /// during a store outage that is every request: configured rules count through their
    /// handles, as tallies do.
    pub fn record_rule_errors<'a>(
        &self,
        domain: &Arc<str>,
        rules: impl IntoIterator<Item = (&'a Arc<str>, bool, u64, Option<usize>)>,
        handles: &RuleHandles,
    ) {
        for (rule, detailed, hits, index) in rules {
            let handles = index
                .filter(|_| !detailed)
                .and_then(|index| handles.get(self.id, index, domain, rule));
            match handles {
                Some(handles) => handles
                    .errors
                    .get_or_init(|| {
                        self.rules.errors.get_or_create_owned(&RuleLabels {
                            domain: LabelText(Arc::clone(domain)),
                            rule: LabelText(Arc::clone(rule)),
                        })
                    })
                    .inc_by(hits),
                None => {
                    let labels = self.rule_labels(domain, rule, detailed);
                    self.rules.errors.get_or_create(&labels).inc_by(hits)
                }
            };
        }
    }

    /// The counters of `rule` in `domain` (zero for a series never recorded). Read per
    /// configured rule when the console asks, so the request path does no extra work.
    pub fn rule_counts(&self, domain: &Arc<str>, rule: &Arc<str>) -> RuleCounts {
        let labels = RuleLabels {
            domain: LabelText(Arc::clone(domain)),
            rule: LabelText(Arc::clone(rule)),
        };
        let read = |family: &Family<RuleLabels, StripedCounter>| {
            family.get(&labels).map_or(0, |c| c.get())
        };
        RuleCounts {
            hits: read(&self.rules.hits),
            within_limit: read(&self.rules.within_limit),
            over_limit: read(&self.rules.over_limit),
            shadow_mode: read(&self.rules.shadow_mode),
            errors: read(&self.rules.errors),
        }
    }

    /// Caps the distinct rule series that carry request values (`detailed_metric`,
    /// `value_to_metric`); past it, such tallies count under the rule label
    /// [`OVERFLOW_RULE`] and in `floodgate_rule_series_overflow_total`.
    pub fn set_max_detailed_series(&self, max: usize) {
        self.rules.max_detailed_series.store(max, Ordering::Relaxed);
    }
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
