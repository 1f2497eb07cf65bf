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
    let Some(rate_limit_strategy::Strategy::TokenBucket(bucket)) = strategy(&limit, 25).strategy
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
