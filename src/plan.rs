//! Pure request planning: `(request, config) → bucket operations`, then
//! `(plan, store answer) → response`. No I/O, no clock; everything here is unit-tested.
//!
//! [`Plan::build`] validates the request, matches each descriptor against its domain's rules
//! (or takes its `limit` override), drops limits named in another matched limit's `replaces`,
//! works out each descriptor's cost, and folds the result into one [`BucketOp`] per distinct
//! bucket (the same bucket reached twice is debited once, with the summed cost).
//! [`Plan::respond`] turns the store's [`Applied`] into Envoy's response: one status per
//! descriptor in request order, never `UNKNOWN`.
//!
//! Here the plan's types and what it tells about itself; `validate` (a request's bounds),
//! `build` (matching, costs, one operation per bucket) and `respond` (statuses, refunds,
//! tallies) each hold one step; `stated` says what a status states of a limit (quota, unit,
//! remaining, reset) so that the headers built from it agree; [`headers`] writes what a
//! response carries besides its statuses (rate-limit headers, dynamic metadata).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use prost_types::Duration;

use crate::bucket::{Applied, BucketKey, BucketOp, KeyValue, ReferenceCounter, ReferenceKey, Undo};
use crate::config::{Config, Limit, Metadata, Step, Unit};
use crate::limiter::{Algorithm, Cost, LimitParams};
pub use crate::outcome::{Outcome, Tallies, Tally, Verdict};
use crate::proto::rls::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, RateLimit},
};

mod build;
pub mod headers;
mod respond;
mod stated;
mod validate;

pub use headers::HeaderOptions;
use headers::Reported;
use validate::validate;

/// Bounds on what one request may carry: beyond the counts, and for a domain beyond
/// `max_value_len`, the request is rejected as invalid (Envoy's configuration decides them);
/// a key or value beyond `max_value_len` (a client decides those) is still limited, known by
/// its digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Maximum descriptors per request.
    pub max_descriptors: usize,
    /// Maximum entries per descriptor.
    pub max_entries: usize,
    /// Maximum length of the domain, in bytes; an entry key or value longer than this is
    /// matched in full, then known by its digest ([`crate::bucket::value_digest`]) in bucket
    /// keys, reference counter names and metric paths.
    pub max_value_len: usize,
}

impl Default for RequestLimits {
    /// Far above anything Envoy's route actions produce, far below what would hurt us.
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 32,
            max_value_len: 4096,
        }
    }
}

/// Settings that shape planning and the response.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    /// Global shadow mode (the reference's `SHADOW_MODE`): every limit is evaluated, counted
    /// and reported (a descriptor over its limit still says OVER_LIMIT), but the request as
    /// a whole is always OK.
    pub shadow_mode: bool,
    /// Global quota mode (the reference's `QUOTA_MODE`): every descriptor is a quota-mode
    /// one (see [`Plan::respond`]).
    pub quota_mode: bool,
    /// Algorithm for descriptor `limit` overrides (configured limits carry their own).
    pub default_algorithm: Algorithm,
    /// `max_wait` of descriptor `limit` overrides counted in token buckets
    /// (`--max-wait-for-overrides`; 0 = off; configured limits carry their own).
    pub override_max_wait_us: u64,
    /// Request-size bounds.
    pub limits: RequestLimits,
    /// Rate-limit response headers to add; `None` adds none (the reference's default).
    pub headers: Option<HeaderOptions>,
    /// Fraction of a limit's capacity above which admitted hits count as near the limit
    /// (`floodgate_rule_near_limit_total`), as the reference's `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: f32,
    /// Report the request and the `metadata:` of the rules it was admitted by in
    /// `dynamic_metadata`, as the reference does with `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
    /// Share fixed-window counters with reference pods (`--reference-counters`): `None` off.
    pub reference_counters: Option<ReferenceCounters>,
}

/// How buckets are shared with reference pods while a Deployment rolls: a fixed-window
/// limit the reference could express (the rule's only limit, no `unit_multiplier`, a domain
/// without `redis_hash_tag`) and descriptor `limit` overrides counted in fixed windows get a
/// [`ReferenceCounter`]; in Redis they are the reference's integer under its key name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceCounters {
    /// The reference's `CACHE_KEY_PREFIX`, starting every counter's name.
    pub prefix: Arc<[u8]>,
    /// `EXPIRATION_JITTER_MAX_SECONDS`: a counter's `EXPIRE` is its unit plus a random
    /// jitter below this, as the reference sets it.
    pub expiry_jitter_max_secs: u64,
}

impl Default for PlanOptions {
    /// The reference's defaults: no shadow mode, no headers, no metadata, near limit at 0.8.
    fn default() -> Self {
        PlanOptions {
            shadow_mode: false,
            quota_mode: false,
            default_algorithm: Algorithm::TokenBucket,
            override_max_wait_us: 0,
            limits: RequestLimits::default(),
            headers: None,
            near_limit_ratio: 0.8,
            dynamic_metadata: false,
            reference_counters: None,
        }
    }
}

/// Why a request was rejected before touching any bucket. The message is for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRequest(pub String);

/// The limit a descriptor is checked against.
#[derive(Debug, Clone, Copy)]
enum LimitSource<'c> {
    Configured(&'c Limit),
    /// A descriptor `limit` override (`requests_per_unit`, unit).
    Override(u32, Unit),
}

/// A matched limit before `replaces` is applied.
struct MatchedLimit<'c> {
    source: LimitSource<'c>,
    /// Metric path.
    rule: MetricPath<'c>,
    /// Not a shadow-mode rule.
    enforce: bool,
    /// A quota-mode descriptor (per rule, or global).
    quota: bool,
    key: BucketKey,
    /// The reference's counter name, when this bucket is shared with reference pods.
    reference: Option<ReferenceKey>,
}

/// A rule's metric path, and whether it holds request values (`detailed_metric`,
/// `value_to_metric`): such paths are as many as the values clients send, so metrics caps
/// them.
#[derive(Clone, Debug)]
struct MetricPath<'c> {
    /// The configuration's path, borrowed, or one built for this request.
    path: Cow<'c, Arc<str>>,
    detailed: bool,
    /// The configured rule's [`crate::config::Rule::index`]; `None` for a path with request
    /// values.
    index: Option<usize>,
}

#[derive(Debug)]
struct PlannedLimit<'c> {
    source: LimitSource<'c>,
    /// Metric path of the rule (shared with the configuration; built per request only where
    /// the rule opts in with `detailed_metric` / `value_to_metric`).
    rule: MetricPath<'c>,
    /// Index into [`Plan::ops`].
    op: usize,
    /// Not a shadow-mode rule: going over makes the descriptor's status OVER_LIMIT.
    enforce: bool,
    /// A quota-mode descriptor (per rule or global): going over does not deny by itself.
    quota: bool,
}

#[derive(Debug)]
enum DescriptorPlan<'c> {
    /// Unknown domain, no entries, no matching rule, or every matched limit replaced.
    Unmatched,
    /// Matched an `unlimited` rule: always OK, no store access.
    Unlimited { rule: MetricPath<'c> },
    /// One or more limits, each backed by a bucket op (`Plan::limits[range]`), and the rule's
    /// `metadata:`.
    Limited(Range<usize>, Option<&'c Metadata>),
}

/// One descriptor of the request, planned.
#[derive(Debug)]
struct PlannedDescriptor<'c> {
    /// Its cost (signed, summed into ops).
    cost: Cost,
    /// How it is answered.
    plan: DescriptorPlan<'c>,
}

/// What a request asks of the store, and how to answer it afterwards.
#[derive(Debug)]
pub struct Plan<'c> {
    /// The domain's metric label, the configuration's; `None` for an unknown domain (which
    /// has no tallies).
    domain: Option<&'c Arc<str>>,
    /// The request's descriptors, in request order.
    descriptors: Vec<PlannedDescriptor<'c>>,
    /// Every descriptor's matched limits, in request order, in one vector per request rather
    /// than one per descriptor (a descriptor's are a range, [`DescriptorPlan::Limited`]).
    limits: Vec<PlannedLimit<'c>>,
    /// One op per distinct bucket, in first-seen order.
    pub ops: Vec<BucketOp>,
    /// The request as `dynamic_metadata` reports it, when that is enabled.
    metadata: Option<headers::RequestSummary>,
    /// Global shadow mode: the request is never denied.
    global_shadow: bool,
    /// Global quota mode: every descriptor is a quota-mode one.
    global_quota: bool,
    /// Entry keys and values over [`RequestLimits::max_value_len`], known by their digest.
    oversized: usize,
    /// Descriptor `limit` overrides ignored for an unknown unit (the configured limit applies).
    ignored_overrides: usize,
}

/// One matched limit of a planned descriptor, as [`Plan::limits_of`] shows it.
#[derive(Debug, Clone)]
pub struct PlannedLimitView<'c> {
    /// The configured limit; `None` for a descriptor `limit` override.
    pub limit: Option<&'c Limit>,
    /// The rule's metric path (`domain.key_value.key`).
    pub rule: Arc<str>,
    /// Index of its bucket in [`Plan::ops`].
    pub op: usize,
    /// The rule is in shadow mode.
    pub shadow: bool,
    /// The descriptor is a quota-mode one.
    pub quota: bool,
}

impl<'c> Plan<'c> {
    /// The limits matched by descriptor `index`, each with the index of its op in
    /// [`Plan::ops`] (empty for an unmatched or `unlimited` descriptor, or a bad index). The
    /// operator console shows them beside the store's answer.
    pub fn limits_of(&self, index: usize) -> Vec<PlannedLimitView<'c>> {
        let Some(PlannedDescriptor {
            plan: DescriptorPlan::Limited(limits, _),
            ..
        }) = self.descriptors.get(index)
        else {
            return Vec::new();
        };
        self.limits[limits.clone()]
            .iter()
            .map(|limit| PlannedLimitView {
                limit: match limit.source {
                    LimitSource::Configured(limit) => Some(limit),
                    LimitSource::Override(..) => None,
                },
                rule: Arc::clone(&limit.rule.path),
                op: limit.op,
                shadow: !limit.enforce,
                quota: limit.quota,
            })
            .collect()
    }

    /// The request's domain as a metric label; `None` when no such domain is configured.
    pub fn domain_label(&self) -> Option<&'c Arc<str>> {
        self.domain
    }

    /// Each matched limit's rule (path, whether it holds request values, hits asked, the
    /// configured rule's index): what metrics count per rule when the store fails and there
    /// is no outcome to tally.
    pub fn rule_hits(&self) -> Vec<(&Arc<str>, bool, u64, Option<usize>)> {
        let mut rules = Vec::new();
        for descriptor in &self.descriptors {
            if let DescriptorPlan::Limited(limits, _) = &descriptor.plan {
                let hits = u64::try_from(descriptor.cost).unwrap_or(0);
                rules.extend(self.limits[limits.clone()].iter().map(|limit| {
                    let rule = &limit.rule;
                    (&*rule.path, rule.detailed, hits, rule.index)
                }));
            }
        }
        rules
    }

    /// How many entry keys and values of the request were over
    /// [`RequestLimits::max_value_len`], matched in full and known by their digest: the
    /// service counts and reports them, never their bytes.
    pub fn oversized_values(&self) -> usize {
        self.oversized
    }

    /// How many descriptor `limit` overrides were ignored for a unit that is not one
    /// (the descriptor is matched against the configured rules instead).
    pub fn ignored_overrides(&self) -> usize {
        self.ignored_overrides
    }

    /// Whether descriptor `index` matched an `unlimited` rule (no bucket, always OK).
    pub fn is_unlimited(&self, index: usize) -> bool {
        matches!(
            self.descriptors.get(index),
            Some(PlannedDescriptor {
                plan: DescriptorPlan::Unlimited { .. },
                ..
            })
        )
    }
}

#[cfg(test)]
mod tests;
