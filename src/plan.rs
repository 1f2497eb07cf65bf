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
use crate::bucket::{Applied, BucketKey, BucketOp, KeyValue, ReferenceCounter, ReferenceKey};
use crate::config::{Config, Limit, Metadata, Step, Unit};
use crate::limiter::{Algorithm, Cost, LimitParams};
pub use crate::outcome::{Outcome, Tally, Verdict};
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
    /// Global shadow mode (the reference's `SHADOW_MODE`): every limit is evaluated, counted
    /// and reported (a descriptor over its limit still says OVER_LIMIT), but the request as
    /// a whole is always OK.
    pub shadow_mode: bool,
    /// Global quota mode (the reference's `QUOTA_MODE`): every descriptor is a quota-mode
    /// one (see [`Plan::respond`]).
    pub quota_mode: bool,
    /// Algorithm for descriptor `limit` overrides (configured limits carry their own).
    pub default_algorithm: Algorithm,
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

/// The reference's stat key of a descriptor `limit` override (its `descriptorKey`): the
/// domain, then each entry as `key_value` (`key` alone for an empty value), joined by `.`.
fn override_metric_path(domain: &str, entries: &[(&[u8], &[u8])]) -> Arc<str> {
    let mut path = String::from(domain);
    for (key, value) in entries {
        path.push('.');
        path.push_str(&String::from_utf8_lossy(key));
        if !value.is_empty() {
            path.push('_');
            path.push_str(&String::from_utf8_lossy(value));
        }
    }
    Arc::from(path)
}

/// A matched limit before `replaces` is applied.
struct MatchedLimit<'c> {
    source: LimitSource<'c>,
    /// Metric path.
    rule: MetricPath,
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
    Unlimited { rule: MetricPath },
    /// One or more limits, each backed by a bucket op, and the rule's `metadata:`.
    Limited(Vec<PlannedLimit<'c>>, Option<&'c Metadata>),
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
    /// Global shadow mode: the request is never denied.
    global_shadow: bool,
    /// Global quota mode: every descriptor is a quota-mode one.
    global_quota: bool,
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

        let mut matched: Vec<(Vec<MatchedLimit<'c>>, Option<&'c Metadata>)> = Vec::new();
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
            let mut metadata = None;
            let Some(domain) = domain else {
                matched.push((limits, metadata));
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
                // The reference names an override's counter like the configured limit's.
                let reference = reference_key(
                    options,
                    domain,
                    params,
                    entries.iter().map(|&(k, v)| (k, v)),
                );
                // Never a shadow-mode or quota-mode rule (the reference's choice); the
                // global switches cover overrides too.
                limits.push(MatchedLimit {
                    source,
                    // The reference's stat key for an override: the request's own
                    // entries (`domain.key_value.key`), so as many as clients send: capped
                    // like detailed_metric paths.
                    rule: MetricPath {
                        path: override_metric_path(&domain.name, &entries),
                        detailed: true,
                    },
                    enforce: true,
                    quota: options.quota_mode,
                    key,
                    reference,
                });
            } else if let Some(found) = domain.find(&entries) {
                let rule = found.rule;
                // The rule's path, or with request values where the rule opted in
                // (detailed_metric / value_to_metric).
                let metric = found.metric_key(&entries);
                let metric = MetricPath {
                    detailed: !Arc::ptr_eq(&metric, &rule.path),
                    path: metric,
                };
                metadata = rule.metadata.as_ref();
                for limit in &rule.limits {
                    let params = limit.params();
                    // Only a rule the reference could express has a reference counter.
                    let reference = (rule.limits.len() == 1 && limit.unit_multiplier == 1)
                        .then(|| {
                            reference_key(
                                options,
                                domain,
                                params,
                                entries.iter().zip(&found.steps).map(
                                    |(&(k, v), step)| match step {
                                        Step::Wildcard {
                                            pattern,
                                            shared: true,
                                        } => (k, pattern.as_bytes()),
                                        _ => (k, v),
                                    },
                                ),
                            )
                        })
                        .flatten();
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
                    limits.push(MatchedLimit {
                        source: LimitSource::Configured(limit),
                        rule: metric.clone(),
                        enforce: !rule.shadow_mode,
                        quota: rule.quota_mode || options.quota_mode,
                        key,
                        reference,
                    });
                }
            }
            matched.push((limits, metadata));
        }

        // `replaces`: a matched limit named N is dropped when another matched limit lists N.
        let replaced: Vec<&str> = matched
            .iter()
            .flat_map(|(limits, _)| limits)
            .filter_map(|matched| match matched.source {
                LimitSource::Configured(limit) => Some(limit),
                LimitSource::Override(..) => None,
            })
            .flat_map(|limit| limit.replaces.iter().map(String::as_str))
            .collect();

        let mut ops: Vec<BucketOp> = Vec::new();
        let mut op_index: HashMap<BucketKey, usize> = HashMap::new();
        let mut descriptors = Vec::with_capacity(matched.len());
        for ((limits, metadata), &cost) in matched.into_iter().zip(&costs) {
            let mut planned = Vec::new();
            let mut unlimited_rule = None;
            for MatchedLimit {
                source,
                rule,
                enforce,
                quota,
                key,
                reference,
            } in limits
            {
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
                let op = op_slot(&mut ops, &mut op_index, key, params, reference);
                ops[op].cost = ops[op].cost.saturating_add(cost);
                // `overdraft` is not part of the key: if any limit reaching the bucket asks
                // for it, debits of this bucket always apply.
                ops[op].params.overdraft |= params.overdraft;
                // A quota-mode bucket never blocks the store's commit by itself (like a
                // shadow one): whether quota denies is decided per request in `respond`,
                // and a denied request is undone with `refunds`. In global shadow mode
                // nothing blocks it.
                ops[op].enforce |= enforce && !quota && !options.shadow_mode;
                planned.push(PlannedLimit {
                    source,
                    rule,
                    op,
                    enforce,
                    quota,
                });
            }
            descriptors.push(match (planned.is_empty(), unlimited_rule) {
                (false, _) => DescriptorPlan::Limited(planned, metadata),
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
            global_shadow: options.shadow_mode,
            global_quota: options.quota_mode,
        })
    }

    /// The limits matched by descriptor `index`, each with the index of its op in
    /// [`Plan::ops`] (empty for an unmatched or `unlimited` descriptor, or a bad index). The
    /// operator console shows them beside the store's answer.
    pub fn limits_of(&self, index: usize) -> Vec<PlannedLimitView<'c>> {
        let Some(DescriptorPlan::Limited(limits, _)) = self.descriptors.get(index) else {
            return Vec::new();
        };
        limits
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
    pub fn domain_label(&self) -> Option<&Arc<str>> {
        self.domain.as_ref()
    }

    /// Each matched limit's rule (path, whether it holds request values, hits asked): what
    /// metrics count per rule when the store fails and there is no outcome to tally.
    pub fn rule_hits(&self) -> Vec<(&Arc<str>, bool, u64)> {
        let mut rules = Vec::new();
        for (descriptor, &cost) in self.descriptors.iter().zip(&self.costs) {
            if let DescriptorPlan::Limited(limits, _) = descriptor {
                let hits = u64::try_from(cost).unwrap_or(0);
                rules.extend(
                    limits
                        .iter()
                        .map(|limit| (&limit.rule.path, limit.rule.detailed, hits)),
                );
            }
        }
        rules
    }

    /// Whether descriptor `index` matched an `unlimited` rule (no bucket, always OK).
    pub fn is_unlimited(&self, index: usize) -> bool {
        matches!(
            self.descriptors.get(index),
            Some(DescriptorPlan::Unlimited { .. })
        )
    }

    /// Whether the request is answered OVER_LIMIT, as the reference decides it
    /// (`shouldRateLimitWorker` in its service):
    /// - a descriptor is over when a limit of a rule not in shadow mode denied it;
    /// - quota-mode descriptors (per rule, or every descriptor but unlimited ones under
    ///   global quota mode) deny the request only when there is at least one and **every**
    ///   one is over; any other descriptor over denies it;
    /// - global shadow mode then makes the request OK, leaving the descriptors' verdicts.
    fn denies(&self, applied: &Applied) -> bool {
        self.over(applied) && !self.global_shadow
    }

    /// Whether the request is over, before global shadow mode (see [`Plan::denies`]).
    fn over(&self, applied: &Applied) -> bool {
        let (mut rate_limited, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for descriptor in &self.descriptors {
            let (over, quota) = match descriptor {
                DescriptorPlan::Unlimited { .. } => continue,
                DescriptorPlan::Unmatched => (false, self.global_quota),
                DescriptorPlan::Limited(limits, _) => {
                    let over = limits.iter().any(|limit| {
                        limit.enforce
                            && applied
                                .buckets
                                .get(limit.op)
                                .is_some_and(|result| !result.admitted)
                    });
                    (over, limits.iter().any(|limit| limit.quota))
                }
            };
            if quota {
                quota_total += 1;
                quota_over += usize::from(over);
            } else {
                rate_limited |= over;
            }
        }
        rate_limited || (quota_total > 0 && quota_total == quota_over)
    }

    /// Debits to undo after the store committed a request that is nonetheless denied (by
    /// quota mode: quota-mode buckets do not block the store's commit, so it cannot know):
    /// `(op index, refund)` for every debited bucket except overdraft ones. Empty when
    /// nothing needs undoing. Like Redis Cluster's cross-slot refunds, this is a second,
    /// compensating call, not one atomic step.
    pub fn refunds(&self, applied: &Applied) -> Vec<(usize, BucketOp)> {
        if !applied.committed || !self.denies(applied) {
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
        let over = self.denies(applied);
        let mut tallies = Vec::new();
        let mut reported = Vec::with_capacity(self.descriptors.len());
        let mut admitted_metadata = std::collections::BTreeMap::new();
        let mut statuses = Vec::with_capacity(self.descriptors.len());
        for (descriptor, &cost) in self.descriptors.iter().zip(&self.costs) {
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
                DescriptorPlan::Limited(limits, metadata) => {
                    let context = StatusContext {
                        applied,
                        hits,
                        near_limit_ratio: options.near_limit_ratio,
                    };
                    let (status, binding) = self.limited_status(limits, &context, &mut tallies);
                    reported.extend(binding);
                    // The reference reports the metadata of the descriptors it answered OK,
                    // the first value of a key winning.
                    let admitted = status.code == Code::Ok as i32;
                    if let (Some(metadata), true, true) =
                        (metadata, admitted, self.metadata.is_some())
                    {
                        crate::config::merge_metadata(&mut admitted_metadata, &metadata.0);
                    }
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
            .map(|summary| summary.to_struct(admitted_metadata));
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
            shadowed: self.global_shadow && self.over(applied),
        }
    }

    /// The status of a descriptor with limits: OVER_LIMIT if a limit of a rule not in shadow
    /// mode denied it (quota mode and global shadow mode included); it reports the
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
            let over = denied && limit.enforce;
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
    reference: Option<ReferenceKey>,
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
            reference: reference.map(ReferenceCounter::new),
        });
        ops.len() - 1
    })
}

/// The reference's counter name for a bucket of `params` reached through `entries` (values
/// as the reference writes them: a `share_threshold` entry's pattern), when reference
/// counters are on and the reference counts such a bucket: a fixed window in a domain without
/// a hash tag (the reference's names have none, so they would leave the domain's slot).
fn reference_key<'a>(
    options: &PlanOptions,
    domain: &crate::config::Domain,
    params: LimitParams,
    entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
) -> Option<ReferenceKey> {
    let counters = options.reference_counters.as_ref()?;
    if params.algorithm != Algorithm::FixedWindow || domain.hash_tag {
        return None;
    }
    Some(ReferenceKey::new(&counters.prefix, &domain.name, entries))
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
        // A descriptor without entries is valid: the reference matches it against nothing
        // and answers it OK with no limit (or applies its `limit` override).
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

    /// With reference counters on, exactly the fixed windows the reference could express get
    /// its counter name (a `share_threshold` entry by its pattern, an override like the
    /// configured limit): not token buckets, not a rule with two limits, not a
    /// `unit_multiplier`, not a hash-tagged domain; off, none does.
    #[test]
    fn reference_counters_only_where_the_reference_counts() {
        const SHARED: &str = r#"
domain: r
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 9, algorithm: fixed_window}
  - key: multi
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: fixed_window}
"#;
        const TAGGED: &str = "domain: t\nredis_hash_tag: true\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}\n";
        let config = Config::from_sources(
            &[
                ("r.yaml".to_string(), SHARED.to_string()),
                ("t.yaml".to_string(), TAGGED.to_string()),
            ],
            &Defaults {
                algorithm: Algorithm::TokenBucket,
            },
        )
        .unwrap();
        let on = PlanOptions {
            default_algorithm: Algorithm::FixedWindow,
            reference_counters: Some(ReferenceCounters {
                prefix: Arc::from(&b"rl_"[..]),
                expiry_jitter_max_secs: 0,
            }),
            ..options()
        };
        let mut overridden = descriptor("ip", "9");
        overridden.limit = Some(
            crate::proto::common::rate_limit_descriptor::RateLimitOverride {
                requests_per_unit: 1,
                unit: 2,
            },
        );
        let mut req = request(vec![
            descriptor("ip", "1.2.3.4"),
            descriptor("path", "/api/x"),
            descriptor("tb", "x"),
            descriptor("two", "x"),
            descriptor("multi", "x"),
            overridden,
        ]);
        req.domain = "r".into();
        let names = |options: &PlanOptions, req: &RateLimitRequest| -> Vec<Option<Vec<u8>>> {
            Plan::build(req, &config, options)
                .unwrap()
                .ops
                .iter()
                .map(|op| op.reference.as_ref().map(|r| r.base.as_bytes().to_vec()))
                .collect()
        };
        assert_eq!(
            names(&on, &req),
            [
                Some(b"rl_r_ip_1.2.3.4_".to_vec()),
                Some(b"rl_r_path_/api/*_".to_vec()),
                None,
                None,
                None,
                None,
                Some(b"rl_r_ip_9_".to_vec()),
            ]
        );
        assert!(names(&options(), &req).iter().all(Option::is_none));
        let mut tagged = request(vec![descriptor("a", "x")]);
        tagged.domain = "t".into();
        assert_eq!(names(&on, &tagged), [None]);
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
            reference: None,
        };
        // Threshold 8: 7 → 10 has two hits above it; 8 → 9 has one; 5 → 8 none.
        assert_eq!(near_limit_hits(&op(3), 0, 3, 0.8), 2);
        assert_eq!(near_limit_hits(&op(1), 1, 1, 0.8), 1);
        assert_eq!(near_limit_hits(&op(3), 2, 3, 0.8), 0);
        assert_eq!(near_limit_hits(&op(0), 0, 0, 0.8), 0);
    }

    const MODES: &str = r#"
domain: q
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {name: service_1, nested: {a: 1}}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
    metadata: {name: service_2, other: x, nested: {a: 2, b: 3}}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

    /// Plans `keys` (one descriptor each, domain `q`) and answers with each op admitted or
    /// not: (overall code, each status's code, the outcome).
    fn modes(keys: &[&str], admitted: &[bool], options: &PlanOptions) -> (i32, Vec<i32>, Outcome) {
        let config = Config::from_sources(
            &[("q.yaml".to_string(), MODES.to_string())],
            &Defaults {
                algorithm: Algorithm::FixedWindow,
            },
        )
        .unwrap();
        let mut req = request(keys.iter().map(|k| descriptor(k, "v")).collect());
        req.domain = "q".into();
        let plan = Plan::build(&req, &config, options).unwrap();
        let mut applied = answer(&plan, true, 1, 1);
        for (bucket, &ok) in applied.buckets.iter_mut().zip(admitted) {
            bucket.admitted = ok;
        }
        let outcome = plan.respond(&applied, options);
        let codes = outcome.response.statuses.iter().map(|s| s.code).collect();
        (outcome.response.overall_code, codes, outcome)
    }

    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;

    /// Global shadow mode keeps each descriptor's OVER_LIMIT and answers the request OK
    /// (the reference's TestServiceGlobalShadowMode).
    #[test]
    fn global_shadow_keeps_descriptor_codes() {
        let shadow = PlanOptions {
            shadow_mode: true,
            ..options()
        };
        let (overall, codes, outcome) = modes(&["regular", "zzz"], &[false], &shadow);
        assert_eq!((overall, codes), (OK, vec![OVER, OK]));
        assert!(outcome.shadowed);
        assert!(!modes(&["regular"], &[true], &shadow).2.shadowed);
        // Quota-mode descriptors all over, under global shadow: still OK
        // (TestServiceQuotaModeWithShadowMode).
        let (overall, codes, _) = modes(&["quota", "quota2"], &[false, false], &shadow);
        assert_eq!((overall, codes), (OK, vec![OVER, OVER]));
    }

    /// A shadow rule over its limit says OK and is tallied as shadow; another rule over its
    /// limit still denies (TestMixedRuleShadowMode).
    #[test]
    fn mixed_rule_shadow_mode() {
        let (overall, codes, outcome) = modes(&["shadow", "regular"], &[false, false], &options());
        assert_eq!((overall, codes), (OVER, vec![OK, OVER]));
        assert_eq!(outcome.tallies[0].verdict, Verdict::ShadowOverLimit);
        assert_eq!(outcome.tallies[1].verdict, Verdict::OverLimit);
    }

    /// The reference's quota_mode answers: an over quota-mode descriptor says OVER_LIMIT;
    /// the request is denied by any other descriptor over, or by every quota-mode one over.
    #[test]
    fn quota_mode_answers() {
        let o = options();
        // TestServicePerDescriptorQuotaMode: regular over, quota within.
        let (overall, codes, _) = modes(&["regular", "quota"], &[false, true], &o);
        assert_eq!((overall, codes), (OVER, vec![OVER, OK]));
        // TestServiceMixedPerDescriptorModes: the only quota descriptor over.
        let (overall, codes, _) = modes(&["regular", "quota"], &[true, false], &o);
        assert_eq!((overall, codes), (OVER, vec![OK, OVER]));
        // TestServiceMixedPerDescriptorModesUnderLimit.
        let (overall, codes, _) = modes(&["regular", "quota"], &[true, true], &o);
        assert_eq!((overall, codes), (OK, vec![OK, OK]));
        // TestServiceQuotaModeOnlyAllOverTheLimit.
        let (overall, codes, _) = modes(&["quota", "quota2"], &[false, false], &o);
        assert_eq!((overall, codes), (OVER, vec![OVER, OVER]));
        // TestServiceQuotaModeOnlySomeOverTheLimit: OK, the over one says so.
        let (overall, codes, _) = modes(&["quota", "quota2"], &[false, true], &o);
        assert_eq!((overall, codes), (OK, vec![OVER, OK]));
    }

    /// Global quota mode makes every descriptor a quota-mode one, unmatched ones included
    /// (TestServiceGlobalQuotaMode).
    #[test]
    fn global_quota_mode() {
        let quota = PlanOptions {
            quota_mode: true,
            ..options()
        };
        let (overall, codes, _) = modes(&["regular", "shadow"], &[false, true], &quota);
        assert_eq!((overall, codes), (OK, vec![OVER, OK]));
        let (overall, _, _) = modes(&["regular", "quota"], &[false, false], &quota);
        assert_eq!(overall, OVER);
        // An unmatched descriptor is a quota-mode one that passed.
        let (overall, codes, _) = modes(&["regular", "zzz"], &[false], &quota);
        assert_eq!((overall, codes), (OK, vec![OVER, OK]));
    }

    /// A request denied by quota mode after the store committed is refunded whole; one
    /// answered OK is not.
    #[test]
    fn quota_denial_refunds_everything() {
        let config = Config::from_sources(
            &[("q.yaml".to_string(), MODES.to_string())],
            &Defaults::default(),
        )
        .unwrap();
        let mut req = request(vec![descriptor("regular", "v"), descriptor("quota", "v")]);
        req.domain = "q".into();
        let plan = Plan::build(&req, &config, &options()).unwrap();
        let mut applied = answer(&plan, true, 1, 1);
        assert!(plan.refunds(&applied).is_empty());
        applied.buckets[1].admitted = false;
        let refunds = plan.refunds(&applied);
        assert_eq!(refunds.len(), 1);
        assert_eq!((refunds[0].0, refunds[0].1.cost), (0, -1));
    }

    /// Dynamic metadata merges the `metadata:` of the descriptors answered OK, the first
    /// value of a key winning and mappings merged (TestMetadataReturnedForPassedDescriptors,
    /// TestOverlappingMetadataReturnsTheFirstValue); an over descriptor adds none.
    #[test]
    fn metadata_of_admitted_descriptors() {
        let with = PlanOptions {
            dynamic_metadata: true,
            quota_mode: true,
            ..options()
        };
        let metadata = |outcome: &Outcome| {
            let fields = &outcome.response.dynamic_metadata.as_ref().unwrap().fields;
            fields.get("metadata").map(|v| format!("{v:?}"))
        };
        let (_, _, both) = modes(&["regular", "quota"], &[true, true], &with);
        let text = metadata(&both).unwrap();
        assert!(
            text.contains("service_1") && !text.contains("service_2"),
            "{text}"
        );
        assert!(
            text.contains("\"other\"") && text.contains("\"b\""),
            "{text}"
        );
        assert!(text.contains("NumberValue(1.0)") && !text.contains("NumberValue(2.0)"));
        let (_, _, first_over) = modes(&["regular", "quota"], &[false, true], &with);
        let text = metadata(&first_over).unwrap();
        assert!(
            text.contains("service_2") && !text.contains("service_1"),
            "{text}"
        );
        let (_, _, none) = modes(&["regular", "quota"], &[false, false], &with);
        assert_eq!(metadata(&none), None);
    }

    /// A descriptor without entries matches nothing: OK with no limit, no bucket.
    #[test]
    fn empty_descriptor_is_unmatched() {
        let config = config();
        let plan = Plan::build(
            &request(vec![RateLimitDescriptor::default()]),
            &config,
            &options(),
        )
        .unwrap();
        assert!(plan.ops.is_empty());
        let response = plan
            .respond(&answer(&plan, true, 0, 0), &options())
            .response;
        assert_eq!(response.statuses[0].code, OK);
        assert!(response.statuses[0].current_limit.is_none());
    }
}
