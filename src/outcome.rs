//! What a rate-limit request decided: the response and, per evaluated limit, the verdict that
//! metrics and stats count.
//!
//! Produced by [`crate::plan`] (`Plan::respond`), read by [`crate::telemetry::metrics`] and the service.
//! A module of its own so that metrics, which every store reports to, need not import the
//! planner (which imports the configuration, which reports to metrics).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::proto::rls::RateLimitResponse;

/// The slot of a rule's series handles, held beside the compiled rule
/// ([`crate::config::Rule`]) and filled when the rule's limits load
/// ([`crate::telemetry::metrics::Metrics::resolve_rules`]), so that counting a request's
/// tallies is atomic adds only.
///
/// Looking a series up in its family takes the family's lock and hashes both labels, and a
/// tally needs two to four series (plus the reference's statsd counters when those are on):
/// with four descriptors that was a dozen lock acquisitions per request, on locks every
/// request thread shares. Cloning shares the handles (a clone of a rule is the same rule); a
/// cache, not part of the rule's value, so every two compare equal.
///
/// The slot is filled and read by [`crate::telemetry::metrics`] alone; it is typed `Any` here
/// so that this module, below telemetry on the module map, does not name telemetry's types.
#[derive(Clone, Default)]
pub struct RuleSeries(Arc<OnceLock<Box<dyn Any + Send + Sync>>>);

impl RuleSeries {
    /// The slot [`crate::telemetry::metrics`] keeps the rule's handles in.
    pub fn slot(&self) -> &OnceLock<Box<dyn Any + Send + Sync>> {
        &self.0
    }
}

impl fmt::Debug for RuleSeries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RuleSeries")
    }
}

impl PartialEq for RuleSeries {
    fn eq(&self, _: &RuleSeries) -> bool {
        true
    }
}

impl Eq for RuleSeries {}

/// A configured rule, as [`RuleSet::each_rule`] shows it to telemetry.
#[derive(Clone, Copy, Debug)]
pub struct ConfiguredRule<'a> {
    /// The domain's metric label ([`Outcome::domain`] of its requests).
    pub domain: &'a Arc<str>,
    /// The rule's metric path (`domain.key_value.key`).
    pub path: &'a Arc<str>,
    /// `detailed_metric`: every tally of the rule holds request values, so its configured
    /// path is never counted.
    pub detailed: bool,
    /// Where the rule's handles go.
    pub series: &'a RuleSeries,
}

/// The configured rules of a compiled configuration: what a limits source hands telemetry
/// to resolve ([`crate::telemetry::metrics::Metrics::resolve_rules`]) before swapping the
/// configuration in. A trait here, not the configuration's type, so that telemetry sits
/// below the configuration on the module map.
pub trait RuleSet {
    /// Calls `visit` once per configured rule.
    fn each_rule(&self, visit: &mut dyn FnMut(ConfiguredRule<'_>));
}

/// How one limit of one descriptor fared, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    /// The rule's metric path (`domain.key_value.key`), shared with the configuration.
    pub rule: Arc<str>,
    /// `rule` holds request values (`detailed_metric`, `value_to_metric`), so it is not one
    /// of the configuration's bounded set of paths.
    pub detailed: bool,
    /// Hits the descriptor asked for (0 for check-only and refunds).
    pub hits: u64,
    /// The verdict for this limit.
    pub verdict: Verdict,
    /// Of `hits`, how many were admitted above the near-limit threshold.
    pub near_limit: u64,
    /// The verdict came from the local over-limit cache, without a store call.
    pub local_cache: bool,
    /// The configured rule's series handles (`None` where `rule` holds request values).
    pub series: Option<RuleSeries>,
}

/// A limit's verdict, as metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The limit admitted the hits.
    WithinLimit,
    /// The limit denied the hits.
    OverLimit,
    /// The limit would have denied, but it is in shadow mode.
    ShadowOverLimit,
}

/// The response and what metrics should count.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The answer for Envoy.
    pub response: RateLimitResponse,
    /// Whether the answer is OVER_LIMIT (`response.overall_code`), as decided: what metrics
    /// count and whether a `max_wait` limit may hold the request.
    pub over: bool,
    /// The request's domain as a metric label; `None` when no domain is configured by that
    /// name (then there are no tallies).
    pub domain: Option<Arc<str>>,
    /// One tally per evaluated limit.
    pub tallies: Vec<Tally>,
    /// The request would have been denied but for global shadow mode.
    pub shadowed: bool,
}
