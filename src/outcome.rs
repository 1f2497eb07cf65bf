//! What a rate-limit request decided: the response and, per evaluated limit, the verdict that
//! metrics and stats count.
//!
//! Produced by [`crate::plan`] (`Plan::respond`), read by [`crate::telemetry::metrics`] and the service.
//! A module of its own so that telemetry, below the planner and the configuration on the
//! module map, counts an outcome without importing either: a tally names its rule by path and
//! by index, plain data.

use std::borrow::Cow;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::proto::rls::RateLimitResponse;

/// A request's tallies ([`Outcome::tallies`]): no allocation for up to two.
pub type Tallies<'c> = SmallVec<[Tally<'c>; 2]>;

/// How one limit of one descriptor fared, for metrics.
///
/// The labels it names are the configuration's, borrowed (`'c`): a reference count of the
/// configuration's is written by every serving thread, a cache line that would cross between
/// cores on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally<'c> {
    /// The rule's metric path (`domain.key_value.key`): the configuration's, or built for this
    /// request where it holds request values (`detailed`).
    pub rule: Cow<'c, Arc<str>>,
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
    /// The configured rule's index in its configuration ([`crate::config::Rule::index`]),
    /// where telemetry finds the rule's series handles; `None` where `rule` holds request
    /// values.
    pub rule_index: Option<usize>,
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
pub struct Outcome<'c> {
    /// The answer for Envoy.
    pub response: RateLimitResponse,
    /// Whether the answer is OVER_LIMIT (`response.overall_code`), as decided: what metrics
    /// count and whether a `max_wait` limit may hold the request.
    pub over: bool,
    /// The request's domain as a metric label; `None` when no domain is configured by that
    /// name (then there are no tallies).
    pub domain: Option<&'c Arc<str>>,
    /// One tally per evaluated limit; on the stack up to two (the metrics count them as the
    /// request ends).
    pub tallies: Tallies<'c>,
    /// The request would have been denied but for global shadow mode.
    pub shadowed: bool,
}
