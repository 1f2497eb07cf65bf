//! Building a plan: validation, matching each descriptor, costs, one operation per bucket.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::*;
use crate::bucket::value_digest;
use crate::config::{Domain, Match};
use crate::proto::common::RateLimitDescriptor;
use crate::proto::common::rate_limit_descriptor::RateLimitOverride;

impl<'c> Plan<'c> {
    /// Validates `request` and works out which buckets it debits and by how much, in three
    /// steps: each descriptor's cost and the limits it matches (`match_descriptor`), the
    /// names those limits replace (`replaced_names`), then one op per distinct bucket
    /// (`Ops::plan_descriptor`).
    pub fn build(
        request: &RateLimitRequest,
        config: &'c Config,
        options: &PlanOptions,
    ) -> Result<Plan<'c>, InvalidRequest> {
        validate(request, &options.limits)?;
        let domain = config.domain(&request.domain);
        // Request-level hits_addend 0 means 1 (Envoy leaves it unset for ordinary requests).
        let request_hits = u64::from(request.hits_addend.max(1));

        // One list each for the whole request, not one per descriptor, each on the stack up
        // to four items (an allocation and its free cost some 100 instructions): the entries
        // (reused from one descriptor to the next), the matched limits (a range per
        // descriptor) and what each descriptor matched.
        let mut entries: Few<(&[u8], &[u8])> = SmallVec::new();
        let mut matched_limits: Few<MatchedLimit<'c>> = SmallVec::new();
        let mut matched: Few<MatchedDescriptor<'c>> = SmallVec::new();
        let mut oversized = 0;
        let mut ignored_overrides = 0;
        let max_len = options.limits.max_value_len;
        for descriptor in &request.descriptors {
            let start = matched_limits.len();
            let metadata = match domain {
                Some(domain) => {
                    entries.clear();
                    entries.extend(
                        descriptor
                            .entries
                            .iter()
                            .map(|e| (&e.key[..], &e.value[..])),
                    );
                    // A key or value past the cap is matched in full, and known by its
                    // digest from then on, so that nothing kept (a bucket's key, a reference
                    // counter's name, a metric path) holds its bytes. Rare: built only then.
                    let long = |bytes: &[u8]| bytes.len() > max_len;
                    let long_here = entries
                        .iter()
                        .map(|&(k, v)| usize::from(long(k)) + usize::from(long(v)))
                        .sum::<usize>();
                    oversized += long_here;
                    let digested: Vec<KnownEntry<'_>>;
                    let named_entries: Vec<(&[u8], &[u8])>;
                    let named = if long_here == 0 {
                        &entries[..]
                    } else {
                        let known = |bytes| known_as(bytes, max_len);
                        digested = entries.iter().map(|&(k, v)| (known(k), known(v))).collect();
                        named_entries = digested.iter().map(|(k, v)| (&k[..], &v[..])).collect();
                        &named_entries[..]
                    };
                    let found = match_descriptor(
                        descriptor,
                        Entries {
                            matched: &entries,
                            named,
                        },
                        domain,
                        options,
                        &mut matched_limits,
                    );
                    ignored_overrides += usize::from(found.ignored_override);
                    found.metadata
                }
                None => None,
            };
            matched.push(MatchedDescriptor {
                cost: descriptor_cost(descriptor, request_hits),
                charge: is_charge(descriptor),
                limits: matched_limits.len() - start,
                metadata,
            });
        }

        let replaced = replaced_names(&matched_limits);

        let mut ops = Ops::default();
        let mut limits = Vec::with_capacity(matched_limits.len());
        // Drained in place: moving a list into an iterator would copy its inline items.
        let mut matched_limits = matched_limits.drain(..);
        let descriptors = matched
            .drain(..)
            .map(|matched| PlannedDescriptor {
                cost: matched.cost,
                plan: ops.plan_descriptor(
                    matched_limits.by_ref().take(matched.limits),
                    matched.metadata,
                    Charge {
                        cost: matched.cost,
                        explicit: matched.charge,
                    },
                    &replaced,
                    options,
                    &mut limits,
                ),
            })
            .collect();

        Ok(Plan {
            domain: domain.map(Domain::metric_label),
            descriptors,
            limits,
            ops: ops.ops,
            metadata: options
                .dynamic_metadata
                .then(|| headers::RequestSummary::of(request)),
            global_shadow: options.shadow_mode,
            global_quota: options.quota_mode,
            oversized,
            ignored_overrides,
        })
    }
}

/// A list of a request's few items (descriptors, their entries, their matched limits), kept
/// on the stack up to four.
type Few<T> = SmallVec<[T; 4]>;

/// What one descriptor matched, before `replaces` is applied.
struct MatchedDescriptor<'c> {
    /// Its cost (see [`descriptor_cost`]).
    cost: Cost,
    /// Whether that cost is an explicit charge (see [`is_charge`]).
    charge: bool,
    /// How many limits it matched (none for an unknown domain or no matching rule): the next
    /// ones of the request's matched limits, which are in request order.
    limits: usize,
    /// The `metadata:` of its rule.
    metadata: Option<&'c Metadata>,
}

/// A descriptor's cost: its own `hits_addend` when present (present and 0: a check), else the
/// request's `request_hits`; negative with `is_negative_hits`.
fn descriptor_cost(descriptor: &RateLimitDescriptor, request_hits: u64) -> Cost {
    let hits = descriptor
        .hits_addend
        .unwrap_or(request_hits)
        .min(i64::MAX as u64) as i64;
    if descriptor.is_negative_hits {
        -hits
    } else {
        hits
    }
}

/// Whether a descriptor's cost is an explicit charge: its own `hits_addend`, present and
/// above 0, not a refund. Envoy sends one for usage measured after the fact (Envoy Gateway's
/// `cost.response`, an `apply_on_stream_done` rule whose answer Envoy ignores), so it is
/// debited with overdraft semantics: applied whether it fits or not, never blocking the
/// request's other buckets. Implicit hits (the request-level `hits_addend`, or 1) stay all or
/// nothing. docs/algorithms.md, "Explicit charges".
fn is_charge(descriptor: &RateLimitDescriptor) -> bool {
    descriptor.hits_addend.is_some_and(|hits| hits > 0) && !descriptor.is_negative_hits
}

/// What one descriptor adds to each bucket it reaches: its cost, and whether that cost is an
/// explicit charge ([`is_charge`]).
#[derive(Clone, Copy)]
struct Charge {
    cost: Cost,
    explicit: bool,
}

/// An entry as it is known once matched: its key and value, each itself or its digest.
type KnownEntry<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// How a key or value is known once matched: itself, or past `max_len` bytes its digest.
fn known_as(bytes: &[u8], max_len: usize) -> Cow<'_, [u8]> {
    if bytes.len() > max_len {
        Cow::Owned(value_digest(bytes))
    } else {
        Cow::Borrowed(bytes)
    }
}

/// A descriptor's entries twice: as the request sent them, which rules are matched against,
/// and as they are known once matched (a key or value over `--max-value-bytes` by its digest),
/// which bucket keys, reference counter names and metric paths are made of.
#[derive(Clone, Copy)]
struct Entries<'e> {
    matched: &'e [(&'e [u8], &'e [u8])],
    named: &'e [(&'e [u8], &'e [u8])],
}

/// What [`match_descriptor`] found besides the limits it pushed.
struct Found<'c> {
    /// The matched rule's `metadata:`.
    metadata: Option<&'c Metadata>,
    /// The descriptor's `limit` override was ignored (its unit is none).
    ignored_override: bool,
}

/// The limits a descriptor (its `entries`) matches in `domain`, pushed onto `limits`: its
/// `limit` override if it carries one (the reference applies an override whenever the domain
/// is known, matched rule or not), else the limits of the rule its entries find, else none.
/// An override whose unit is none (Envoy passes through whatever unit dynamic metadata names,
/// `UNKNOWN` included) is ignored rather than refused: refusing the request would let Envoy
/// fail it open, while the configured rules still limit it.
fn match_descriptor<'c>(
    descriptor: &RateLimitDescriptor,
    entries: Entries<'_>,
    domain: &'c Domain,
    options: &PlanOptions,
    limits: &mut Few<MatchedLimit<'c>>,
) -> Found<'c> {
    let mut ignored_override = false;
    if let Some(limit) = &descriptor.limit {
        match match_override(limit, domain, entries.named, options) {
            Some(matched) => {
                limits.push(matched);
                return Found {
                    metadata: None,
                    ignored_override,
                };
            }
            None => ignored_override = true,
        }
    }
    let metadata = domain
        .find(entries.matched)
        .and_then(|found| match_rule(&found, domain, entries.named, options, limits));
    Found {
        metadata,
        ignored_override,
    }
}

/// The limit of a descriptor's `limit` override, reached through `entries`; `None` when its
/// unit is none or its limit is not one floodgate can count.
fn match_override<'c>(
    limit: &RateLimitOverride,
    domain: &Domain,
    entries: &[(&[u8], &[u8])],
    options: &PlanOptions,
) -> Option<MatchedLimit<'c>> {
    let unit = Unit::from_proto(limit.unit)?;
    let source = LimitSource::Override(limit.requests_per_unit, unit);
    let params = override_params(limit.requests_per_unit, unit, options);
    params.validate().ok()?;
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
    // Never a shadow-mode or quota-mode rule (the reference's choice); the global switches
    // cover overrides too.
    Some(MatchedLimit {
        source,
        // The reference's stat key for an override: the request's own entries
        // (`domain.key_value.key`), so as many as clients send: capped like detailed_metric
        // paths.
        rule: MetricPath {
            path: Cow::Owned(override_metric_path(&domain.name, entries)),
            detailed: true,
            index: None,
        },
        enforce: true,
        quota: options.quota_mode,
        key,
        reference,
    })
}

/// The limits of the rule `found` for `entries`, each with its bucket key, pushed onto
/// `limits`; returns the rule's `metadata:`.
fn match_rule<'c>(
    found: &Match<'c>,
    domain: &Domain,
    entries: &[(&[u8], &[u8])],
    options: &PlanOptions,
    limits: &mut Few<MatchedLimit<'c>>,
) -> Option<&'c Metadata> {
    let rule = found.rule;
    // The rule's path, or with request values where the rule opted in
    // (detailed_metric / value_to_metric).
    let metric = found.metric_key(entries);
    let detailed = matches!(metric, Cow::Owned(_));
    let metric = MetricPath {
        detailed,
        path: metric,
        index: (!detailed).then_some(rule.index),
    };
    for limit in &rule.limits {
        let params = limit.params();
        // Only a rule the reference could express has a reference counter.
        let reference = (rule.limits.len() == 1 && limit.unit_multiplier == 1)
            .then(|| {
                reference_key(
                    options,
                    domain,
                    params,
                    entries
                        .iter()
                        .zip(&found.steps)
                        .map(|(&(k, v), step)| match step {
                            Step::Wildcard {
                                pattern,
                                shared: true,
                            } => (k, pattern.as_bytes()),
                            _ => (k, v),
                        }),
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
    rule.metadata.as_ref()
}

/// `replaces`: the names of the limits that another matched limit replaces; a matched limit
/// of such a name is dropped.
fn replaced_names<'c>(matched: &[MatchedLimit<'c>]) -> Vec<&'c str> {
    matched
        .iter()
        .filter_map(|matched| match matched.source {
            LimitSource::Configured(limit) => Some(limit),
            LimitSource::Override(..) => None,
        })
        .flat_map(|limit| limit.replaces.iter().map(String::as_str))
        .collect()
}

/// The plan's ops as descriptors are folded in: one per distinct bucket, in first-seen order.
#[derive(Default)]
struct Ops {
    ops: Vec<BucketOp>,
    /// Keys to op indices, once `ops` outgrows [`LINEAR_OPS`] (see [`op_slot`]).
    index: HashMap<BucketKey, usize>,
}

impl Ops {
    /// Folds one descriptor's `matched` limits, less the `replaced` ones, into the ops (its
    /// `charge` added to each bucket it reaches) and its planned limits onto `planned`, and
    /// says how the descriptor is answered (`metadata`: its rule's).
    fn plan_descriptor<'c>(
        &mut self,
        matched: impl Iterator<Item = MatchedLimit<'c>>,
        metadata: Option<&'c Metadata>,
        charge: Charge,
        replaced: &[&str],
        options: &PlanOptions,
        planned: &mut Vec<PlannedLimit<'c>>,
    ) -> DescriptorPlan<'c> {
        let ops = &mut self.ops;
        let start = planned.len();
        let mut unlimited_rule = None;
        for MatchedLimit {
            source,
            rule,
            enforce,
            quota,
            key,
            reference,
        } in matched
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
            let op = op_slot(ops, &mut self.index, key, params, reference);
            let bucket = &mut ops[op];
            bucket.cost = bucket.cost.saturating_add(charge.cost);
            // `overdraft` is not part of the key: if any limit reaching the bucket asks for
            // it, or an explicit charge reaches it, debits of this bucket always apply.
            bucket.params.overdraft |= params.overdraft || charge.explicit;
            // Nor is `max_wait`: the longest of the limits reaching the bucket holds, unless
            // the debit is an overdraft one, which is applied at once (the two exclude each
            // other: `LimitParams::validate`).
            bucket.params.max_wait_us = if bucket.params.overdraft {
                0
            } else {
                bucket.params.max_wait_us.max(params.max_wait_us)
            };
            // A quota-mode bucket never blocks the store's commit by itself (like a shadow
            // one): whether quota denies is decided per request in `respond`, and a denied
            // request is undone with `refunds`. In global shadow mode nothing blocks it.
            ops[op].enforce |= enforce && !quota && !options.shadow_mode;
            planned.push(PlannedLimit {
                source,
                rule,
                op,
                enforce,
                quota,
            });
        }
        match (planned.len() == start, unlimited_rule) {
            (false, _) => DescriptorPlan::Limited(start..planned.len(), metadata),
            (true, Some(rule)) => DescriptorPlan::Unlimited { rule },
            (true, None) => DescriptorPlan::Unmatched,
        }
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
            debited_in: None,
            debited_at: None,
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
