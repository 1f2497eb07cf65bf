//! Building a plan: validation, matching each descriptor, costs, one operation per bucket.

use super::*;

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
                // Nor is `max_wait`: the longest of the limits reaching the bucket holds.
                ops[op].params.max_wait_us = ops[op].params.max_wait_us.max(params.max_wait_us);
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
                .then(|| headers::RequestSummary::of(request)),
            global_shadow: options.shadow_mode,
            global_quota: options.quota_mode,
        })
    }
}

/// The reference's stat key of a descriptor `limit` override (its `descriptorKey`): the
/// domain, then each entry as `key_value` (`key` alone for an empty value), joined by `.`.
pub(super) fn override_metric_path(domain: &str, entries: &[(&[u8], &[u8])]) -> Arc<str> {
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

/// Up to this many ops, a repeated bucket is found by comparing keys, which is cheaper than
/// hashing them (a request rarely has more than a few); beyond it, by a hash index.
pub(super) const LINEAR_OPS: usize = 16;

/// The index in `ops` of the op for `key`, pushed (cost 0, not enforcing) if there is none.
/// `index` maps keys to op indices once `ops` outgrows [`LINEAR_OPS`]: it always holds
/// `ops[..index.len()]` and catches up here before it is read.
pub(super) fn op_slot(
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
pub(super) fn reference_key<'a>(
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

pub(super) fn override_params(
    requests_per_unit: u32,
    unit: Unit,
    options: &PlanOptions,
) -> LimitParams {
    LimitParams {
        algorithm: options.default_algorithm,
        requests_per_period: u64::from(requests_per_unit),
        period_us: unit.seconds() * 1_000_000,
        burst: u64::from(requests_per_unit),
        overdraft: false,
        max_wait_us: if options.default_algorithm == Algorithm::TokenBucket {
            options.override_max_wait_us
        } else {
            0
        },
    }
}
