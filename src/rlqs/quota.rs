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
mod tests {
    use super::*;
    use crate::config::Defaults;

    const LIMITS: &str = "
domain: edge
descriptors:
  - key: tenant
    value: a
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: free
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tenant
    value: vip
    rate_limit: {unlimited: true}
  - key: user
    rate_limits:
      - {unit: day, requests_per_unit: 86400000}
      - {unit: second, requests_per_unit: 10, burst: 20}
";

    fn config() -> Config {
        Config::from_sources(
            &[("limits.yaml".into(), LIMITS.into())],
            &Defaults::default(),
        )
        .unwrap()
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut entries: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        entries.sort();
        entries
    }

    /// A bucket whose keys sort against the tree's nesting still matches its rule.
    #[test]
    fn entries_match_in_the_order_the_tree_needs() {
        let Quota::Shared(limit) = quota(
            &config(),
            "edge",
            &entries(&[("tenant", "a"), ("path", "/x")]),
        ) else {
            panic!("not shared");
        };
        assert_eq!((limit.capacity, limit.period_s, limit.burst), (100, 1, 100));
    }

    /// Unmatched, unknown-domain and unlimited buckets are allowed; a limit of 0 denies.
    #[test]
    fn blanket_quotas() {
        let config = config();
        assert_eq!(
            quota(&config, "edge", &entries(&[("x", "y")])),
            Quota::Allow
        );
        assert_eq!(
            quota(&config, "other", &entries(&[("user", "u")])),
            Quota::Allow
        );
        let vip = entries(&[("tenant", "vip")]);
        assert_eq!(quota(&config, "edge", &vip), Quota::Allow);
        let free = entries(&[("tenant", "free")]);
        assert_eq!(quota(&config, "edge", &free), Quota::Deny);
    }

    /// Of several limits, the lowest rate is the one shared, with its burst.
    #[test]
    fn the_strictest_limit_is_shared() {
        let Quota::Shared(limit) = quota(&config(), "edge", &entries(&[("user", "u")])) else {
            panic!("not shared");
        };
        assert_eq!((limit.capacity, limit.period_s, limit.burst), (10, 1, 20));
    }

    /// A grant becomes a token bucket at its rate with its fraction of the burst; 0 denies.
    #[test]
    fn grants_become_token_buckets() {
        let limit = SharedLimit {
            table: String::new(),
            rule: String::new(),
            capacity: 100,
            period_s: 60,
            burst: 200,
        };
        let Some(rate_limit_strategy::Strategy::TokenBucket(bucket)) =
            strategy(&limit, 25).strategy
        else {
            panic!("not a token bucket");
        };
        assert_eq!(bucket.max_tokens, 50);
        assert_eq!(bucket.tokens_per_fill, Some(25));
        assert_eq!(bucket.fill_interval.map(|d| d.seconds), Some(60));
        assert_eq!(
            strategy(&limit, 0),
            blanket(rate_limit_strategy::BlanketRule::DenyAll)
        );
    }

    /// A long value is held in a table's name as a digest: short, and apart from others.
    #[test]
    fn long_values_are_digested_in_table_names() {
        let config = config();
        let long = |c: char| entries(&[("user", &c.to_string().repeat(10_000))]);
        let (Quota::Shared(a), Quota::Shared(b)) = (
            quota(&config, "edge", &long('a')),
            quota(&config, "edge", &long('b')),
        ) else {
            panic!("not shared");
        };
        assert!(a.table.len() < 200, "{}", a.table);
        assert_ne!(a.table, b.table);
        assert!(a.table.contains("10000#"), "{}", a.table);
    }

    /// Permutations come in lexicographic order and end after the last.
    #[test]
    fn permutations_are_lexicographic() {
        let mut order = vec![0, 1, 2];
        let mut seen = vec![order.clone()];
        while next_permutation(&mut order) {
            seen.push(order.clone());
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[1], vec![0, 2, 1]);
        assert_eq!(seen[5], vec![2, 1, 0]);
    }
}
