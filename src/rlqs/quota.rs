//! Pure: which quota a `BucketId` gets under the limits in force ([`quota`]), and the
//! strategy a grant becomes ([`strategy`]).
//!
//! A `BucketId` is a map: its entries have no order, while the limits tree is walked level by
//! level. The entries are tried in every order, in lexicographic order of their keys (sorted
//! first), and the first order that reaches a rule wins: so a bucket matches the rule an
//! operator nested for it, whatever the order Envoy's map iteration gave, and the choice is
//! the same on every replica. Ids of more than [`MAX_PERMUTED`] entries are tried sorted
//! only (8! orders would be too many walks for one report).

use crate::config::{Config, Limit, Step};
use crate::proto::types::{RateLimitStrategy, TokenBucket, rate_limit_strategy};

/// The most entries whose every order is tried.
pub const MAX_PERMUTED: usize = 6;

/// What a bucket gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quota {
    /// No rule matched, or the rule is `unlimited` or in shadow mode: `ALLOW_ALL`.
    Allow,
    /// The limit is 0: `DENY_ALL`.
    Deny,
    /// A limit shared by every holder of the bucket.
    Shared(SharedLimit),
}

/// A limit the holders of one bucket share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLimit {
    /// The share table's name: the domain, the rule and the bucket's identity under it (a
    /// `share_threshold` wildcard level by its pattern), and the limit's rate, each
    /// length-prefixed so no two buckets collide. A changed limit is a new table.
    pub table: String,
    /// The rule's path (`domain.key_value...`), for metric labels.
    pub rule: String,
    /// Tokens per period, all holders together.
    pub capacity: u64,
    /// The period, whole seconds (what Envoy's `fill_interval` takes).
    pub period_s: u64,
    /// Burst: the token-bucket capacity of the whole limit.
    pub burst: u64,
}

/// The quota of the bucket with `entries` (sorted by key) in `domain` under `config`.
pub fn quota(config: &Config, domain: &str, entries: &[(String, String)]) -> Quota {
    let Some(tree) = config.domain(domain) else {
        return Quota::Allow;
    };
    let mut order: Vec<usize> = (0..entries.len()).collect();
    loop {
        let ordered: Vec<(&[u8], &[u8])> = order
            .iter()
            .filter_map(|&i| entries.get(i))
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .collect();
        if let Some(found) = tree.find(&ordered) {
            let rule = found.rule;
            if rule.shadow_mode {
                return Quota::Allow;
            }
            let Some(limit) = strictest(&rule.limits) else {
                return Quota::Allow;
            };
            if limit.unlimited {
                return Quota::Allow;
            }
            if limit.requests_per_unit == 0 {
                return Quota::Deny;
            }
            let mut table = String::new();
            push(&mut table, domain);
            push(&mut table, &rule.path);
            for (step, (key, value)) in found.steps.iter().zip(&ordered) {
                push(&mut table, &String::from_utf8_lossy(key));
                match step {
                    Step::Wildcard {
                        pattern,
                        shared: true,
                    } => push(&mut table, pattern),
                    _ => push(&mut table, &String::from_utf8_lossy(value)),
                }
            }
            push(&mut table, &limit.rate());
            return Quota::Shared(SharedLimit {
                table,
                rule: rule.path.to_string(),
                capacity: u64::from(limit.requests_per_unit),
                period_s: limit.period_seconds().max(1),
                burst: u64::from(limit.burst),
            });
        }
        if entries.len() > MAX_PERMUTED || !next_permutation(&mut order) {
            return Quota::Allow;
        }
    }
}

/// The longest part a table's name holds as it is; a longer one (a long bucket id value)
/// is held as a digest, so a subscription's table name stays short whatever Envoy sends.
pub const MAX_TABLE_PART: usize = 64;

/// Appends `part` length-prefixed (`<len>:<part>`), or past [`MAX_TABLE_PART`] bytes its
/// digest (`<len>#<128-bit SHA-256 hex>`: the `#` keeps it apart from any part as it is).
fn push(out: &mut String, part: &str) {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    out.push_str(&part.len().to_string());
    if part.len() <= MAX_TABLE_PART {
        out.push(':');
        out.push_str(part);
        return;
    }
    out.push('#');
    for byte in &Sha256::digest(part.as_bytes())[..16] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// The limit of a rule with the lowest rate (an RLQS bucket takes one token bucket; the
/// strictest rate keeps every limit's rate, though not a longer limit's total).
fn strictest(limits: &[Limit]) -> Option<&Limit> {
    limits.iter().min_by(|a, b| {
        if a.unlimited != b.unlimited {
            // A limited rate is stricter than unlimited.
            return a.unlimited.cmp(&b.unlimited);
        }
        // a.rpu / a.period < b.rpu / b.period, compared without division.
        let left = u128::from(a.requests_per_unit) * u128::from(b.period_seconds());
        let right = u128::from(b.requests_per_unit) * u128::from(a.period_seconds());
        left.cmp(&right)
    })
}

/// The next permutation of `order` in lexicographic order; false after the last.
fn next_permutation(order: &mut [usize]) -> bool {
    let Some(i) = order.windows(2).rposition(|w| w[0] < w[1]) else {
        return false;
    };
    let Some(j) = order.iter().rposition(|&x| x > order[i]) else {
        return false;
    };
    order.swap(i, j);
    order[i + 1..].reverse();
    true
}

/// The strategy of `grant` tokens per period of `limit`: a token bucket filling at the
/// grant's rate, holding the same fraction of the limit's burst (at least one token); a
/// grant of 0 denies all until the next assignment.
pub fn strategy(limit: &SharedLimit, grant: u64) -> RateLimitStrategy {
    if grant == 0 {
        return blanket(rate_limit_strategy::BlanketRule::DenyAll);
    }
    let share = u128::from(limit.burst) * u128::from(grant) / u128::from(limit.capacity.max(1));
    let clamp = |n: u128| u32::try_from(n).unwrap_or(u32::MAX).max(1);
    RateLimitStrategy {
        strategy: Some(rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
            max_tokens: clamp(share),
            tokens_per_fill: Some(clamp(u128::from(grant))),
            // Whole seconds: Envoy divides by the interval's whole seconds.
            fill_interval: Some(prost_types::Duration {
                seconds: i64::try_from(limit.period_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            name: String::new(),
        })),
    }
}

/// A `BlanketRule` strategy.
pub fn blanket(rule: rate_limit_strategy::BlanketRule) -> RateLimitStrategy {
    RateLimitStrategy {
        strategy: Some(rate_limit_strategy::Strategy::BlanketRule(rule as i32)),
    }
}

#[cfg(test)]
mod tests;
