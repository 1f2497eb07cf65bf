//! Pure request planning: `(request, config) → bucket operations`, then
//! `(plan, store answer) → response`. No I/O, no clock; everything here is unit-tested.
//!
//! [`Plan::build`] validates the request, matches each descriptor against its domain's rules
//! (or takes its `limit` override), drops limits named in another matched limit's `replaces`,
//! works out each descriptor's cost, and folds the result into one [`BucketOp`] per distinct
//! bucket (the same bucket reached twice is debited once, with the summed cost).
//! [`Plan::respond`] turns the store's [`Applied`] into Envoy's response: one status per
//! descriptor in request order, never `UNKNOWN`.

use std::collections::HashMap;
use std::sync::Arc;

use prost_types::Duration;

pub use crate::annotate::HeaderOptions;
use crate::annotate::{self, Reported};
use crate::bucket::{Applied, BucketKey, BucketOp, KeyValue};
use crate::config::{Config, Limit, Step, Unit};
use crate::limiter::{Algorithm, Cost, LimitParams};
use crate::proto::rls::{
    RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, RateLimit},
};

/// Bounds on what one request may carry; beyond them the request is rejected as invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Maximum descriptors per request.
    pub max_descriptors: usize,
    /// Maximum entries per descriptor.
    pub max_entries: usize,
    /// Maximum length of an entry key or value, in bytes.
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
    /// Global shadow mode: every limit is evaluated and counted, none denies.
    pub shadow_mode: bool,
    /// Algorithm for descriptor `limit` overrides (configured limits carry their own).
    pub default_algorithm: Algorithm,
    /// Request-size bounds.
    pub limits: RequestLimits,
    /// Rate-limit response headers to add; `None` adds none (the reference's default).
    pub headers: Option<HeaderOptions>,
    /// Fraction of a limit's capacity above which admitted hits count as near the limit
    /// (`floodgate_rule_near_limit_total`), as the reference's `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: f32,
    /// Report the request and its quota-mode violations in `dynamic_metadata`, as the
    /// reference does with `RESPONSE_DYNAMIC_METADATA`.
    pub dynamic_metadata: bool,
}

impl Default for PlanOptions {
    /// The reference's defaults: no shadow mode, no headers, no metadata, near limit at 0.8.
    fn default() -> Self {
        PlanOptions {
            shadow_mode: false,
            default_algorithm: Algorithm::TokenBucket,
            limits: RequestLimits::default(),
            headers: None,
            near_limit_ratio: 0.8,
            dynamic_metadata: false,
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

/// A matched limit before `replaces` is applied: (source, metric path, enforce, quota, key).
type MatchedLimit<'c> = (LimitSource<'c>, MetricPath, bool, bool, BucketKey);

/// A rule's metric path, and whether it holds request values (`detailed_metric`,
/// `value_to_metric`): such paths are as many as the values clients send, so metrics caps
/// them.
#[derive(Clone, Debug)]
struct MetricPath {
    path: Arc<str>,
    detailed: bool,
}

#[derive(Debug)]
struct PlannedLimit<'c> {
    source: LimitSource<'c>,
    /// Metric path of the rule (shared with the configuration; built per request only where
    /// the rule opts in with `detailed_metric` / `value_to_metric`).
    rule: MetricPath,
    /// Index into [`Plan::ops`].
    op: usize,
    /// Not in shadow mode (per rule or global).
    enforce: bool,
    /// The rule is in `quota_mode`: going over does not deny by itself.
    quota: bool,
}

#[derive(Debug)]
enum DescriptorPlan<'c> {
    /// Unknown domain, no matching rule, or every matched limit replaced.
    Unmatched,
    /// Matched an `unlimited` rule: always OK, no store access.
    Unlimited { rule: MetricPath },
    /// One or more limits, each backed by a bucket op.
    Limited(Vec<PlannedLimit<'c>>),
}

/// What a request asks of the store, and how to answer it afterwards.
#[derive(Debug)]
pub struct Plan<'c> {
    /// The domain's metric label; `None` for an unknown domain (which has no tallies).
    domain: Option<Arc<str>>,
    /// Each descriptor's cost (signed, summed into ops).
    costs: Vec<Cost>,
    descriptors: Vec<DescriptorPlan<'c>>,
    /// One op per distinct bucket, in first-seen order.
    pub ops: Vec<BucketOp>,
    /// The request as `dynamic_metadata` reports it, when that is enabled.
    metadata: Option<annotate::RequestSummary>,
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
    /// The request's domain as a metric label; `None` when no domain is configured by that
    /// name (then there are no tallies).
    pub domain: Option<Arc<str>>,
    /// One tally per evaluated limit.
    pub tallies: Vec<Tally>,
}

impl<'c> Plan<'c> {
    /// Validates `request` and works out which buckets it debits and by how much.
    pub fn build(
        request: &RateLimitRequest,
        config: &'c Config,
        options: &PlanOptions,
    ) -> Result<Plan<'c>, InvalidRequest> {
        validate(request, &options.limits)?;
        let domain = config.domain(&request.domain);
        // Request-level hits_addend 0 means 1 (Envoy leaves it unset for ordinary requests).
        let request_hits = u64::from(request.hits_addend.max(1));

        let mut matched: Vec<Vec<MatchedLimit<'c>>> = Vec::new();
        let mut costs = Vec::with_capacity(request.descriptors.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            // A present descriptor hits_addend overrides the request's; present and 0 = check.
            let hits = descriptor
                .hits_addend
                .unwrap_or(request_hits)
                .min(i64::MAX as u64) as i64;
            costs.push(if descriptor.is_negative_hits {
                -hits
            } else {
                hits
            });
            let mut limits = Vec::new();
            let Some(domain) = domain else {
                matched.push(limits);
                continue;
            };
            let entries: Vec<(&[u8], &[u8])> = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_slice(), e.value.as_slice()))
                .collect();
            if let Some(limit) = &descriptor.limit {
                // The reference applies an override whenever the domain is known, matched
                // rule or not.
                let unit = Unit::from_proto(limit.unit).ok_or_else(|| {
                    InvalidRequest(format!(
                        "descriptors[{i}].limit.unit: unit {} is not a valid rate limit unit",
                        limit.unit
                    ))
                })?;
                let source = LimitSource::Override(limit.requests_per_unit, unit);
                let params = override_params(limit.requests_per_unit, unit, options);
                params.validate().map_err(|reason| {
                    InvalidRequest(format!("descriptors[{i}].limit: {reason}"))
                })?;
                let key = BucketKey::in_domain(
                    domain.key_prefix(),
                    entries.iter().map(|&(k, v)| (k, KeyValue::Value(v))),
                    params.algorithm,
                    params.period_us,
                )
                .with_override_rate(limit.requests_per_unit);
                // Never shadow per rule (the reference's choice), but the global switch covers
                // overrides too: in shadow mode nothing denies.
                let enforce = !options.shadow_mode;
                limits.push((
                    source,
                    MetricPath {
                        path: Arc::clone(domain.override_path()),
                        detailed: false,
                    },
                    enforce,
                    false,
                    key,
                ));
            } else if let Some(found) = domain.find(&entries) {
                let rule = found.rule;
                // The rule's path, or with request values where the rule opted in
                // (detailed_metric / value_to_metric).
                let metric = found.metric_key(&entries);
                let metric = MetricPath {
                    detailed: !Arc::ptr_eq(&metric, &rule.path),
                    path: metric,
                };
                let enforce = !(rule.shadow_mode || options.shadow_mode);
                for limit in &rule.limits {
                    let params = limit.params();
                    let key = BucketKey::in_domain(
                        domain.key_prefix(),
                        entries.iter().zip(&found.steps).map(|(&(k, v), step)| {
                            let value = match step {
                                Step::Wildcard {
                                    pattern,
                                    shared: true,
                                } => KeyValue::Shared(pattern),
                                _ => KeyValue::Value(v),
                            };
                            (k, value)
                        }),
                        params.algorithm,
                        params.period_us,
                    );
                    limits.push((
                        LimitSource::Configured(limit),
                        metric.clone(),
                        enforce,
                        rule.quota_mode,
                        key,
                    ));
                }
            }
            matched.push(limits);
        }

        // `replaces`: a matched limit named N is dropped when another matched limit lists N.
        let replaced: Vec<&str> = matched
            .iter()
            .flatten()
            .filter_map(|(source, ..)| match source {
                LimitSource::Configured(limit) => Some(limit),
                LimitSource::Override(..) => None,
            })
            .flat_map(|limit| limit.replaces.iter().map(String::as_str))
            .collect();

        let mut ops: Vec<BucketOp> = Vec::new();
        let mut op_index: HashMap<BucketKey, usize> = HashMap::new();
        let mut descriptors = Vec::with_capacity(matched.len());
        for (limits, &cost) in matched.into_iter().zip(&costs) {
            let mut planned = Vec::new();
            let mut unlimited_rule = None;
            for (source, rule, enforce, quota, key) in limits {
                let params = match source {
                    LimitSource::Configured(limit) => {
                        if limit
                            .name
                            .as_deref()
                            .is_some_and(|name| replaced.contains(&name))
                        {
                            continue;
                        }
                        if limit.unlimited {
                            unlimited_rule = Some(rule);
                            continue;
                        }
                        limit.params()
                    }
                    LimitSource::Override(rpu, unit) => override_params(rpu, unit, options),
                };
                let op = op_slot(&mut ops, &mut op_index, key, params);
                ops[op].cost = ops[op].cost.saturating_add(cost);
                // `overdraft` is not part of the key: if any limit reaching the bucket asks
                // for it, debits of this bucket always apply.
                ops[op].params.overdraft |= params.overdraft;
                // A quota-mode bucket never blocks the store's commit by itself (like a
                // shadow one): whether quota denies is decided per request in `respond`,
                // and a denied request is undone with `refunds`.
                ops[op].enforce |= enforce && !quota;
                planned.push(PlannedLimit {
                    source,
                    rule,
                    op,
                    enforce,
                    quota,
                });
            }
            descriptors.push(match (planned.is_empty(), unlimited_rule) {
                (false, _) => DescriptorPlan::Limited(planned),
                (true, Some(rule)) => DescriptorPlan::Unlimited { rule },
                (true, None) => DescriptorPlan::Unmatched,
            });
        }

        Ok(Plan {
            domain: domain.map(|d| Arc::clone(d.metric_label())),
            costs,
            descriptors,
            ops,
            metadata: options
                .dynamic_metadata
                .then(|| annotate::RequestSummary::of(request)),
        })
    }

    /// Whether a descriptor's limits put it over, and whether it is a quota-mode descriptor:
    /// `(enforcing limit over, quota-mode limit over, has enforcing quota-mode limits)`.
    fn descriptor_over(
        &self,
        limits: &[PlannedLimit<'c>],
        applied: &Applied,
    ) -> (bool, bool, bool) {
        let mut over = (false, false, false);
        for limit in limits.iter().filter(|l| l.enforce) {
            let denied = applied
                .buckets
                .get(limit.op)
                .is_some_and(|result| !result.admitted);
            if limit.quota {
                over.2 = true;
                over.1 |= denied;
            } else {
                over.0 |= denied;
            }
        }
        over
    }

    /// The reference's `quota_mode` rule: quota-mode descriptors deny the request only when
    /// there is at least one and **every** one of them is over.
    fn quota_denies(&self, applied: &Applied) -> bool {
        let mut any = false;
        for descriptor in &self.descriptors {
            if let DescriptorPlan::Limited(limits) = descriptor {
                let (_, quota_over, quota) = self.descriptor_over(limits, applied);
                if quota {
                    if !quota_over {
                        return false;
                    }
                    any = true;
                }
            }
        }
        any
    }

    /// Debits to undo after the store committed a request that quota mode denies (quota-mode
    /// buckets do not block the store's commit, so it cannot know): `(op index, refund)`
    /// for every debited bucket except overdraft ones. Empty when nothing needs undoing.
    /// Like Redis Cluster's cross-slot refunds, this is a second, compensating call, not one
    /// atomic step.
    pub fn refunds(&self, applied: &Applied) -> Vec<(usize, BucketOp)> {
        if !applied.committed || !self.quota_denies(applied) {
            return Vec::new();
        }
        self.ops
            .iter()
            .zip(&applied.buckets)
            .enumerate()
            // An overdraft debit records usage that happened (the pattern charges after the
            // response): it is never undone.
            .filter(|(_, (op, result))| op.cost > 0 && result.admitted && !op.params.overdraft)
            .map(|(i, (op, _))| {
                (
                    i,
                    BucketOp {
                        cost: -op.cost,
                        ..op.clone()
                    },
                )
            })
            .collect()
    }

    /// Builds the response from the store's answer (one result per op of this plan), with
    /// the headers and metadata `options` ask for.
    pub fn respond(&self, applied: &Applied, options: &PlanOptions) -> Outcome {
        let quota_binds = self.quota_denies(applied);
        let mut tallies = Vec::new();
        let mut over = false;
        let mut reported = Vec::with_capacity(self.descriptors.len());
        let mut quota_mode = false;
        let mut violations = Vec::new();
        let mut statuses = Vec::with_capacity(self.descriptors.len());
        for (i, (descriptor, &cost)) in self.descriptors.iter().zip(&self.costs).enumerate() {
            let hits = u64::try_from(cost).unwrap_or(0);
            statuses.push(match descriptor {
                DescriptorPlan::Unmatched => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                DescriptorPlan::Unlimited { rule } => {
                    tallies.push(Tally {
                        rule: rule.path.clone(),
                        detailed: rule.detailed,
                        hits,
                        verdict: Verdict::WithinLimit,
                        near_limit: 0,
                        local_cache: false,
                    });
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    }
                }
                DescriptorPlan::Limited(limits) => {
                    let (_, quota_over, quota) = self.descriptor_over(limits, applied);
                    quota_mode |= quota;
                    if quota_over {
                        violations.push(i);
                    }
                    let context = StatusContext {
                        applied,
                        hits,
                        quota_binds,
                        near_limit_ratio: options.near_limit_ratio,
                    };
                    let (status, binding) = self.limited_status(limits, &context, &mut tallies);
                    over |= status.code == Code::OverLimit as i32;
                    reported.extend(binding);
                    status
                }
            });
        }
        let response_headers_to_add = options
            .headers
            .as_ref()
            .map(|headers| annotate::headers(headers, &reported, over))
            .unwrap_or_default();
        let dynamic_metadata = self
            .metadata
            .as_ref()
            .map(|summary| summary.to_struct(quota_mode, &violations));
        Outcome {
            response: RateLimitResponse {
                overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
                statuses,
                response_headers_to_add,
                dynamic_metadata,
                ..Default::default()
            },
            domain: self.domain.clone(),
            tallies,
        }
    }

    /// The status of a descriptor with limits: OVER_LIMIT if an enforcing limit denied it
    /// (a quota-mode limit only when quota mode denies the whole request); it reports the
    /// binding limit (the denying one that frees last, else the one with the fewest tokens
    /// left), as Envoy builds its headers from a single limit. Also returns what the
    /// response headers need to know about that limit.
    fn limited_status(
        &self,
        limits: &[PlannedLimit<'c>],
        context: &StatusContext<'_>,
        tallies: &mut Vec<Tally>,
    ) -> (DescriptorStatus, Option<Reported>) {
        let applied = context.applied;
        let mut chosen: Option<(&PlannedLimit<'c>, bool)> = None;
        for limit in limits {
            let Some(result) = applied.buckets.get(limit.op) else {
                continue;
            };
            let denied = !result.admitted;
            let over = denied && limit.enforce && (!limit.quota || context.quota_binds);
            tallies.push(Tally {
                rule: limit.rule.path.clone(),
                detailed: limit.rule.detailed,
                hits: context.hits,
                verdict: match (denied, limit.enforce) {
                    (false, _) => Verdict::WithinLimit,
                    (true, true) => Verdict::OverLimit,
                    (true, false) => Verdict::ShadowOverLimit,
                },
                near_limit: if denied || !applied.committed {
                    0
                } else {
                    near_limit_hits(
                        &self.ops[limit.op],
                        result.view.remaining,
                        context.hits,
                        context.near_limit_ratio,
                    )
                },
                local_cache: applied.from_local_cache,
            });
            let better = match chosen {
                None => true,
                Some((current, current_over)) => {
                    let current_result = &applied.buckets[current.op];
                    match (over, current_over) {
                        (true, false) => true,
                        (false, true) => false,
                        // Both deny: the one that frees last binds (None = never).
                        (true, true) => {
                            result.retry_after_us.unwrap_or(u64::MAX)
                                > current_result.retry_after_us.unwrap_or(u64::MAX)
                        }
                        (false, false) => result.view.remaining < current_result.view.remaining,
                    }
                }
            };
            if better {
                chosen = Some((limit, over));
            }
        }
        let Some((limit, over)) = chosen else {
            let status = DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
            return (status, None);
        };
        let result = &applied.buckets[limit.op];
        let params = self.ops[limit.op].params;
        let (name, requests_per_unit, unit) = match limit.source {
            LimitSource::Configured(l) => (
                l.name.clone().unwrap_or_default(),
                l.requests_per_unit,
                l.unit,
            ),
            LimitSource::Override(rpu, unit) => (String::new(), rpu, unit),
        };
        // Envoy reads only the seconds: round up so a client never retries early.
        let reset_s = reported_reset_us(&params, result.view.reset_us).div_ceil(1_000_000);
        let limit_remaining = u32::try_from(result.view.remaining).unwrap_or(u32::MAX);
        let reported = Reported {
            over,
            requests_per_unit,
            remaining: limit_remaining,
            reset_s,
            retry_after_us: result.retry_after_us,
            window_s: params.period_us / 1_000_000,
            name: name.clone(),
        };
        let status = DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name,
                requests_per_unit,
                unit: unit.to_response_proto(),
            }),
            limit_remaining,
            duration_until_reset: Some(Duration {
                seconds: i64::try_from(reset_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            quota: None,
        };
        (status, Some(reported))
    }
}

/// What [`Plan::limited_status`] needs besides the descriptor's limits.
struct StatusContext<'a> {
    applied: &'a Applied,
    /// Hits the descriptor asked for.
    hits: u64,
    /// Quota mode denies this request (every quota-mode descriptor is over).
    quota_binds: bool,
    near_limit_ratio: f32,
}

/// Hits admitted above the near-limit threshold, counted as the reference does
/// (`checkNearLimitThreshold` in its base_limiter.go): threshold = ⌊capacity × ratio⌋ computed
/// in `f32`; when the used count after the request is above it, every hit counts if the count
/// before was already at or above it, else only `after − threshold`. The used count is
/// `capacity − limit_remaining` (exact for the windows; whole tokens for the token bucket);
/// "before" takes off the bucket's summed cost, so a bucket reached twice splits fairly.
fn near_limit_hits(op: &BucketOp, remaining: u64, hits: u64, ratio: f32) -> u64 {
    let Ok(cost) = u64::try_from(op.cost) else {
        return 0;
    };
    if hits == 0 || cost == 0 {
        return 0;
    }
    let capacity = match op.params.algorithm {
        Algorithm::TokenBucket => op.params.burst,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => op.params.requests_per_period,
    };
    // The reference multiplies in float32, then floors.
    let threshold = (capacity as f32 * ratio).floor() as u64;
    let after = capacity.saturating_sub(remaining);
    let before = after.saturating_sub(cost);
    if after <= threshold {
        return 0;
    }
    (after - threshold.max(before)).min(hits)
}

/// Up to this many ops, a repeated bucket is found by comparing keys, which is cheaper than
/// hashing them (a request rarely has more than a few); beyond it, by a hash index.
const LINEAR_OPS: usize = 16;

/// The index in `ops` of the op for `key`, pushed (cost 0, not enforcing) if there is none.
/// `index` maps keys to op indices once `ops` outgrows [`LINEAR_OPS`]: it always holds
/// `ops[..index.len()]` and catches up here before it is read.
fn op_slot(
    ops: &mut Vec<BucketOp>,
    index: &mut HashMap<BucketKey, usize>,
    key: BucketKey,
    params: LimitParams,
) -> usize {
    let found = if ops.len() <= LINEAR_OPS {
        ops.iter().position(|op| op.key == key)
    } else {
        let indexed = index.len();
        index.extend(
            ops.iter()
                .enumerate()
                .skip(indexed)
                .map(|(i, op)| (op.key.clone(), i)),
        );
        index.get(&key).copied()
    };
    found.unwrap_or_else(|| {
        ops.push(BucketOp {
            key,
            params,
            cost: 0,
            enforce: false,
        });
        ops.len() - 1
    })
}

fn override_params(requests_per_unit: u32, unit: Unit, options: &PlanOptions) -> LimitParams {
    LimitParams {
        algorithm: options.default_algorithm,
        requests_per_period: u64::from(requests_per_unit),
        period_us: unit.seconds() * 1_000_000,
        burst: u64::from(requests_per_unit),
        overdraft: false,
    }
}

/// The token bucket charges `T` rounded up to a whole tick per token (never faster than
/// configured), so a full refill can take a little longer than the period. Report the time
/// at the configured rate so "3 per second" says 1 s, not 2 s after rounding up.
fn reported_reset_us(params: &LimitParams, reset_us: u64) -> u64 {
    if params.algorithm != Algorithm::TokenBucket {
        return reset_us;
    }
    crate::limiter::reset_at_configured_rate(params, reset_us)
}

fn validate(request: &RateLimitRequest, limits: &RequestLimits) -> Result<(), InvalidRequest> {
    let invalid = |message: String| Err(InvalidRequest(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > limits.max_value_len {
        return invalid(format!(
            "rate limit domain is {} bytes long; at most {} are allowed (--max-value-bytes)",
            request.domain.len(),
            limits.max_value_len
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > limits.max_descriptors {
        return invalid(format!(
            "request has {} descriptors; at most {} are allowed (--max-descriptors)",
            request.descriptors.len(),
            limits.max_descriptors
        ));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        if descriptor.entries.len() > limits.max_entries {
            return invalid(format!(
                "descriptors[{i}] has {} entries; at most {} are allowed (--max-entries)",
                descriptor.entries.len(),
                limits.max_entries
            ));
        }
        for (j, entry) in descriptor.entries.iter().enumerate() {
            for (field, bytes) in [("key", &entry.key), ("value", &entry.value)] {
                if bytes.len() > limits.max_value_len {
                    return invalid(format!(
                        "descriptors[{i}].entries[{j}].{field} is {} bytes long; at most {} are allowed \
                         (--max-value-bytes)",
                        bytes.len(),
                        limits.max_value_len
                    ));
                }
            }
            if entry.key.is_empty() {
                return invalid(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::BucketResult;
    use crate::config::Defaults;
    use crate::limiter::View;
    use crate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};

    const LIMITS: &str = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: b
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: b}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: b}]}
  - key: u
    rate_limit: {unlimited: true}
"#;

    fn config() -> Config {
        Config::from_sources(
            &[("t.yaml".to_string(), LIMITS.to_string())],
            &Defaults {
                algorithm: Algorithm::TokenBucket,
            },
        )
        .unwrap()
    }

    fn options() -> PlanOptions {
        PlanOptions::default()
    }

    fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: value.into(),
            }],
            ..Default::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn answer(plan: &Plan<'_>, admitted: bool, remaining: u64, reset_us: u64) -> Applied {
        Applied {
            committed: admitted,
            from_local_cache: false,
            buckets: plan
                .ops
                .iter()
                .map(|_| BucketResult {
                    admitted,
                    view: View {
                        remaining,
                        reset_us,
                    },
                    retry_after_us: if admitted { Some(0) } else { Some(1) },
                })
                .collect(),
        }
    }

    /// A domain with `redis_hash_tag: true` tags every key, configured and override alike;
    /// another domain's keys stay untagged, byte for byte.
    #[test]
    fn hash_tagged_domain_tags_every_key() {
        let tagged = "domain: t\nredis_hash_tag: true\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
        let config = Config::from_sources(
            &[
                ("t.yaml".to_string(), tagged.to_string()),
                ("d.yaml".to_string(), LIMITS.to_string()),
            ],
            &Defaults {
                algorithm: Algorithm::TokenBucket,
            },
        )
        .unwrap();
        let mut overridden = descriptor("z", "y");
        overridden.limit = Some(
            crate::proto::common::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 4,
                unit: 2,
            },
        );
        let mut req = request(vec![descriptor("a", "x"), overridden]);
        req.domain = "t".into();
        let plan = Plan::build(&req, &config, &options()).unwrap();
        let keys: Vec<&[u8]> = plan.ops.iter().map(|op| op.key.as_bytes()).collect();
        assert_eq!(keys, [&b"{t}:a=x|tb1"[..], b"{t}:z=y|tb60o4"]);
        let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options()).unwrap();
        assert_eq!(plan.ops[0].key.as_bytes(), b"d:a=x|tb1");
    }

    /// Two descriptors reaching one bucket make one op with the summed cost.
    #[test]
    fn same_bucket_is_one_op_with_summed_cost() {
        let config = config();
        let mut req = request(vec![descriptor("a", "x"), descriptor("a", "x")]);
        req.hits_addend = 2;
        let plan = Plan::build(&req, &config, &options()).unwrap();
        assert_eq!(plan.ops.len(), 1);
        assert_eq!(plan.ops[0].cost, 4);
        assert!(plan.ops[0].enforce);
    }

    /// Past the linear scan's reach, repeated buckets still fold into one op each.
    #[test]
    fn repeated_buckets_fold_beyond_the_linear_scan() {
        // More distinct buckets than the linear scan covers, each reached twice.
        let n = LINEAR_OPS + 8;
        let values: Vec<String> = (0..n).chain(0..n).map(|i| i.to_string()).collect();
        let config = config();
        let req = request(values.iter().map(|v| descriptor("a", v)).collect());
        let plan = Plan::build(&req, &config, &options()).unwrap();
        assert_eq!(plan.ops.len(), n);
        assert!(plan.ops.iter().all(|op| op.cost == 2));
        let keys: std::collections::HashSet<_> = plan.ops.iter().map(|op| &op.key).collect();
        assert_eq!(keys.len(), n);
    }

    /// Different values of a bare key are different buckets.
    #[test]
    fn distinct_values_are_distinct_buckets() {
        let config = config();
        let req = request(vec![descriptor("a", "x"), descriptor("a", "y")]);
        assert_eq!(Plan::build(&req, &config, &options()).unwrap().ops.len(), 2);
    }

    /// A present descriptor hits_addend wins; zero checks; negative hits refund.
    #[test]
    fn descriptor_hits_addend_and_negative_hits() {
        let config = config();
        let mut check = descriptor("a", "x");
        check.hits_addend = Some(0);
        let mut refund = descriptor("a", "y");
        refund.hits_addend = Some(7);
        refund.is_negative_hits = true;
        let mut req = request(vec![check, refund]);
        req.hits_addend = 5;
        let plan = Plan::build(&req, &config, &options()).unwrap();
        assert_eq!(plan.ops.iter().map(|o| o.cost).collect::<Vec<_>>(), [0, -7]);
    }

    /// Shadow rules and global shadow mode produce non-enforcing ops.
    #[test]
    fn shadow_ops_do_not_enforce() {
        let config = config();
        let plan = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
        assert!(!plan.ops[0].enforce);
        let mut shadow = options();
        shadow.shadow_mode = true;
        let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &shadow).unwrap();
        assert!(!plan.ops[0].enforce);
    }

    /// `replaces` drops the named limit only when the replacing limit also matched.
    #[test]
    fn replaces_needs_both_matched() {
        let config = config();
        let alone = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
        assert_eq!(alone.ops.len(), 1);
        let both = Plan::build(
            &request(vec![descriptor("b", "x"), descriptor("c", "x")]),
            &config,
            &options(),
        )
        .unwrap();
        assert_eq!(both.ops.len(), 1);
        let outcome = both.respond(&answer(&both, true, 4, 12_000_000), &options());
        assert!(outcome.response.statuses[0].current_limit.is_none());
        assert!(outcome.response.statuses[1].current_limit.is_some());
    }

    /// Unlimited and unmatched descriptors need no store access.
    #[test]
    fn unlimited_and_unmatched_make_no_ops() {
        let config = config();
        let plan = Plan::build(
            &request(vec![descriptor("u", "x"), descriptor("zzz", "x")]),
            &config,
            &options(),
        )
        .unwrap();
        assert!(plan.ops.is_empty());
        let response = plan
            .respond(&answer(&plan, true, 0, 0), &options())
            .response;
        assert_eq!(response.overall_code, Code::Ok as i32);
        assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(response.statuses[1].limit_remaining, 0);
    }

    /// The response reports remaining and reset (rounded up to whole seconds).
    #[test]
    fn response_rounds_reset_up() {
        let config = config();
        let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options()).unwrap();
        let response = plan
            .respond(&answer(&plan, true, 2, 1), &options())
            .response;
        let status = &response.statuses[0];
        assert_eq!(status.limit_remaining, 2);
        assert_eq!(status.duration_until_reset.unwrap().seconds, 1);
        // 5 per minute: 12 s per token exactly, so the raw reset is reported, rounded up.
        let plan = Plan::build(&request(vec![descriptor("c", "x")]), &config, &options()).unwrap();
        let response = plan
            .respond(&answer(&plan, false, 0, 2_000_001), &options())
            .response;
        assert_eq!(response.overall_code, Code::OverLimit as i32);
        assert_eq!(
            response.statuses[0].duration_until_reset.unwrap().seconds,
            3
        );
    }

    /// A shadow limit that denies is reported OK, and tallied as shadow.
    #[test]
    fn shadow_denial_is_ok_and_tallied() {
        let config = config();
        let plan = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
        let outcome = plan.respond(&answer(&plan, false, 0, 1), &options());
        assert_eq!(outcome.response.overall_code, Code::Ok as i32);
        assert_eq!(outcome.tallies[0].verdict, Verdict::ShadowOverLimit);
        assert_eq!(&*outcome.tallies[0].rule, "d.b");
    }

    /// The reported reset of a non-divisible token bucket rate uses the configured rate.
    #[test]
    fn token_bucket_reset_is_reported_at_configured_rate() {
        let params = LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_period: 3,
            period_us: 1_000_000,
            burst: 3,
            overdraft: false,
        };
        // Three tokens at 3_333_334 ticks of 0.1 µs each: 1_000_001 µs of debt (rounded up),
        // reported as 1 s.
        assert_eq!(reported_reset_us(&params, 1_000_001), 1_000_000);
        let exact = LimitParams {
            requests_per_period: 4,
            burst: 4,
            ..params
        };
        assert_eq!(reported_reset_us(&exact, 750_000), 750_000);
    }

    fn with_headers() -> PlanOptions {
        PlanOptions {
            headers: Some(HeaderOptions::default()),
            ..PlanOptions::default()
        }
    }

    fn header_pairs(response: &RateLimitResponse) -> Vec<(String, String)> {
        response
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// When OK, headers come from the status with the fewest remaining; none when off.
    #[test]
    fn headers_follow_lowest_remaining() {
        let config = config();
        let req = request(vec![descriptor("a", "x"), descriptor("c", "x")]);
        let plan = Plan::build(&req, &config, &with_headers()).unwrap();
        let mut applied = answer(&plan, true, 2, 1_000_000);
        applied.buckets[1].view = View {
            remaining: 1,
            reset_us: 24_000_000,
        };
        let response = plan.respond(&applied, &with_headers()).response;
        assert_eq!(
            header_pairs(&response),
            pairs(&[
                ("RateLimit-Limit", "5"),
                ("RateLimit-Remaining", "1"),
                ("RateLimit-Reset", "24"),
            ])
        );
        assert!(
            plan.respond(&applied, &options())
                .response
                .response_headers_to_add
                .is_empty()
        );
    }

    /// On OVER_LIMIT the denying status binds and Retry-After is its retry time, rounded up.
    #[test]
    fn over_limit_headers_carry_retry_after() {
        let config = config();
        let req = request(vec![descriptor("a", "x"), descriptor("c", "x")]);
        let plan = Plan::build(&req, &config, &with_headers()).unwrap();
        let mut applied = answer(&plan, true, 0, 1_000_000);
        applied.committed = false;
        applied.buckets[1] = BucketResult {
            admitted: false,
            view: View {
                remaining: 0,
                reset_us: 60_000_000,
            },
            retry_after_us: Some(11_000_001),
        };
        let response = plan.respond(&applied, &with_headers()).response;
        assert_eq!(
            header_pairs(&response),
            pairs(&[
                ("RateLimit-Limit", "5"),
                ("RateLimit-Remaining", "0"),
                ("RateLimit-Reset", "60"),
                ("Retry-After", "12"),
            ])
        );
        // A cost that can never pass: Retry-After falls back to the reset.
        applied.buckets[1].retry_after_us = None;
        let response = plan.respond(&applied, &with_headers()).response;
        assert_eq!(response.response_headers_to_add[3].value, "60");
    }

    /// The IETF structured fields name the policy and carry quota, window, remaining, reset.
    #[test]
    fn ietf_headers_are_structured_fields() {
        let config = config();
        let mut options = with_headers();
        if let Some(h) = options.headers.as_mut() {
            h.ietf = true;
        }
        let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options).unwrap();
        let response = plan
            .respond(&answer(&plan, true, 2, 333_334), &options)
            .response;
        let headers = header_pairs(&response);
        assert_eq!(
            headers[3..],
            pairs(&[
                ("RateLimit-Policy", "\"default\";q=3;w=1"),
                ("RateLimit", "\"default\";r=2;t=1"),
            ])
        );
    }

    /// Near-limit hits follow the reference: only the part above ⌊capacity × ratio⌋ counts.
    #[test]
    fn near_limit_counts_hits_above_threshold() {
        let op = |cost| BucketOp {
            key: BucketKey::new("d", [], Algorithm::FixedWindow, 60_000_000),
            params: LimitParams {
                algorithm: Algorithm::FixedWindow,
                requests_per_period: 10,
                period_us: 60_000_000,
                burst: 10,
                overdraft: false,
            },
            cost,
            enforce: true,
        };
        // Threshold 8: 7 → 10 has two hits above it; 8 → 9 has one; 5 → 8 none.
        assert_eq!(near_limit_hits(&op(3), 0, 3, 0.8), 2);
        assert_eq!(near_limit_hits(&op(1), 1, 1, 0.8), 1);
        assert_eq!(near_limit_hits(&op(3), 2, 3, 0.8), 0);
        assert_eq!(near_limit_hits(&op(0), 0, 0, 0.8), 0);
    }
}
