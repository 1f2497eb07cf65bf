//! Answering: the store's answer to Envoy's response, statuses, refunds, what metrics count.

use super::stated::Stated;
use super::*;
use crate::bucket::BucketResult;

impl<'c> Plan<'c> {
    /// Whether the request is answered OVER_LIMIT, as the reference decides it
    /// (`shouldRateLimitWorker` in its service):
    /// - a descriptor is over when a limit of a rule not in shadow mode denied it;
    /// - quota-mode descriptors (per rule, or every descriptor but unlimited ones under
    ///   global quota mode) deny the request only when there is at least one and **every**
    ///   one is over; any other descriptor over denies it;
    /// - global shadow mode then makes the request OK, leaving the descriptors' verdicts.
    pub fn denies(&self, applied: &Applied) -> bool {
        self.over(applied) && !self.global_shadow
    }

    /// Whether the request is over, before global shadow mode (see [`Plan::denies`]).
    pub(super) fn over(&self, applied: &Applied) -> bool {
        let (mut rate_limited, mut quota_total, mut quota_over) = (false, 0usize, 0usize);
        for descriptor in &self.descriptors {
            let (over, quota) = match &descriptor.plan {
                DescriptorPlan::Unlimited { .. } => continue,
                DescriptorPlan::Unmatched => (false, self.global_quota),
                DescriptorPlan::Limited(limits, _) => {
                    let limits = &self.limits[limits.clone()];
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
    /// `(op index, refund)` for every debited bucket except overdraft ones
    /// ([`Undo::Withdrawn`]). Empty when
    /// nothing needs undoing. Like Redis Cluster's cross-slot refunds, this is a second,
    /// compensating call, not one atomic step.
    pub fn refunds(&self, applied: &Applied) -> Vec<(usize, BucketOp)> {
        if !self.denies(applied) {
            return Vec::new();
        }
        self.undo(applied)
    }

    /// Debits to undo when a committed request is not answered after all (its client left
    /// while a `max_wait` limit held it): `(op index, refund)` as for [`Plan::refunds`].
    /// Empty when the store did not commit.
    pub fn undo(&self, applied: &Applied) -> Vec<(usize, BucketOp)> {
        if !applied.committed {
            return Vec::new();
        }
        self.ops
            .iter()
            .zip(&applied.buckets)
            .enumerate()
            .filter_map(|(i, (op, result))| Some((i, op.undo(result, Undo::Withdrawn)?)))
            .collect()
    }

    /// Builds the response from the store's answer (one result per op of this plan), with
    /// the headers and metadata `options` ask for.
    pub fn respond(&self, applied: &Applied, options: &PlanOptions) -> Outcome<'c> {
        let over = self.denies(applied);
        let mut tallies = Tallies::new();
        // What the rate-limit headers are made of: nothing to collect without them.
        let mut reported = Vec::new();
        let mut admitted_metadata = std::collections::BTreeMap::new();
        let mut statuses = Vec::with_capacity(self.descriptors.len());
        for descriptor in &self.descriptors {
            let hits = u64::try_from(descriptor.cost).unwrap_or(0);
            statuses.push(match &descriptor.plan {
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
                        rule_index: rule.index,
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
                        report: options.headers.is_some(),
                    };
                    let (status, binding) =
                        self.limited_status(&self.limits[limits.clone()], &context, &mut tallies);
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
            .map(|names| headers::headers(names, &reported, over))
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
            over,
            domain: self.domain,
            tallies,
            shadowed: self.global_shadow && self.over(applied),
        }
    }

    /// The status of a descriptor with limits: OVER_LIMIT if a limit of a rule not in shadow
    /// mode denied it (quota mode and global shadow mode included); it reports the
    /// binding limit (the denying one that frees last, else the one that states the fewest
    /// remaining), as Envoy builds its headers from a single limit, stated as
    /// [`Stated`] says. Also returns what the
    /// response headers need to know about that limit, when the response has them.
    pub(super) fn limited_status(
        &self,
        limits: &[PlannedLimit<'c>],
        context: &StatusContext<'_>,
        tallies: &mut Tallies<'c>,
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
                rule_index: limit.rule.index,
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
                        // Neither denies: the one that states the fewest remaining binds,
                        // as Envoy picks among statuses.
                        (false, false) => {
                            self.stated_remaining(limit, result)
                                < self.stated_remaining(current, current_result)
                        }
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
        let (name, unit) = match limit.source {
            LimitSource::Configured(l) => (l.name.clone().unwrap_or_default(), l.unit),
            LimitSource::Override(_, unit) => (String::new(), unit),
        };
        // What the status says of the limit, so that the headers Envoy builds from it agree
        // (a burst, a multiplied unit: `stated`).
        let stated = Stated::of(&params, unit);
        let tokens = result.view.remaining;
        let reset_us = stated.reset_us(
            &params,
            tokens,
            reported_reset_us(&params, result.view.reset_us),
        );
        // Envoy reads only the seconds: round up so a client never retries early.
        let reset_s = reset_us.div_ceil(1_000_000);
        let limit_remaining = stated.remaining(tokens);
        let reported = context.report.then(|| Reported {
            over,
            requests_per_unit: stated.requests,
            remaining: limit_remaining,
            reset_s,
            retry_after_us: result.retry_after_us,
            window_s: stated.unit.seconds(),
            name: name.clone(),
        });
        let status = DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: Some(RateLimit {
                name,
                requests_per_unit: stated.requests,
                unit: stated.unit.to_response_proto(),
            }),
            limit_remaining,
            duration_until_reset: Some(Duration {
                seconds: i64::try_from(reset_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            quota: None,
        };
        (status, reported)
    }

    /// The `limit_remaining` a limit's status would state for the store's `result`.
    fn stated_remaining(&self, limit: &PlannedLimit<'_>, result: &BucketResult) -> u32 {
        let unit = match limit.source {
            LimitSource::Configured(l) => l.unit,
            LimitSource::Override(_, unit) => unit,
        };
        Stated::of(&self.ops[limit.op].params, unit).remaining(result.view.remaining)
    }
}

/// What [`Plan::limited_status`] needs besides the descriptor's limits.
pub(super) struct StatusContext<'a> {
    applied: &'a Applied,
    /// Hits the descriptor asked for.
    hits: u64,
    near_limit_ratio: f32,
    /// The response carries rate-limit headers: the binding limit is reported for them.
    report: bool,
}

/// Hits admitted above the near-limit threshold, counted as the reference does
/// (`checkNearLimitThreshold` in its base_limiter.go): threshold = ⌊capacity × ratio⌋ computed
/// in `f32`; when the used count after the request is above it, every hit counts if the count
/// before was already at or above it, else only `after − threshold`. The used count is
/// `capacity − limit_remaining` (exact for the windows; whole tokens for the token bucket);
/// "before" takes off the bucket's summed cost, so a bucket reached twice splits fairly.
pub(super) fn near_limit_hits(op: &BucketOp, remaining: u64, hits: u64, ratio: f32) -> u64 {
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
    // The reference multiplies in float32, then floors. The saturating cast is that floor
    // for every input (truncation and floor differ only below 0, where both give 0) without
    // a call to libm's `floorf` (baseline x86-64 has no rounding instruction).
    let threshold = (capacity as f32 * ratio) as u64;
    let after = capacity.saturating_sub(remaining);
    let before = after.saturating_sub(cost);
    if after <= threshold {
        return 0;
    }
    (after - threshold.max(before)).min(hits)
}

/// The token bucket charges `T` rounded up to a whole tick per token (never faster than
/// configured), so a full refill can take a little longer than the period. Report the time
/// at the configured rate so "3 per second" says 1 s, not 2 s after rounding up.
pub(super) fn reported_reset_us(params: &LimitParams, reset_us: u64) -> u64 {
    if params.algorithm != Algorithm::TokenBucket {
        return reset_us;
    }
    crate::limiter::reset_at_configured_rate(params, reset_us)
}
