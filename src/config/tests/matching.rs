//! Matching precedence, depth rules, metric keys and the fields a match carries.

use super::*;
use crate::limiter::{Algorithm, LimitParams};

const PRECEDENCE: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foobar
    rate_limit: {unit: second, requests_per_unit: 4}
";

/// An exact value beats wildcards, which beat the bare key.
#[test]
fn exact_beats_wildcard_beats_bare() {
    let config = config(PRECEDENCE);
    assert_eq!(
        find(&config, "d", &[("k", "foobar")]).unwrap(),
        "d.k_foobar"
    );
    assert_eq!(find(&config, "d", &[("k", "foobaz")]).unwrap(), "d.k_foo*");
    assert_eq!(find(&config, "d", &[("k", "zzz")]).unwrap(), "d.k");
    assert_eq!(find(&config, "d", &[("other", "x")]), None);
}

/// Among wildcards of one key, the first in file order wins even if a later one is longer.
#[test]
fn wildcards_in_file_order() {
    let config = config(
        "
domain: d
descriptors:
  - key: k
    value: f*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
",
    );
    assert_eq!(find(&config, "d", &[("k", "foo1")]).unwrap(), "d.k_f*");
}

/// Stars may lead, sit in the middle, trail, or repeat; the step names the pattern.
#[test]
fn wildcard_positions() {
    let config = config(
        "
domain: d
descriptors:
  - {key: host, value: '*.example.com', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: path, value: /api*v1, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: svc, value: svc*ep*rpc, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: pre, value: pre*, rate_limit: {unit: second, requests_per_unit: 1}}
",
    );
    assert_eq!(
        find(&config, "d", &[("host", "a.example.com")]).unwrap(),
        "d.host_*.example.com"
    );
    assert_eq!(find(&config, "d", &[("host", "example.com")]), None);
    assert!(find(&config, "d", &[("path", "/api/users/v1")]).is_some());
    assert_eq!(find(&config, "d", &[("path", "/api/users/v2")]), None);
    assert!(find(&config, "d", &[("svc", "svc-a.ep-b.rpc")]).is_some());
    assert_eq!(find(&config, "d", &[("svc", "svc-a.rpc")]), None);
    assert!(find(&config, "d", &[("pre", "pre")]).is_some());
    let steps = steps(&config, &[(b"path", b"/apiv1")]);
    assert_eq!(
        steps,
        [Step::Wildcard {
            pattern: "/api*v1",
            shared: false
        }]
    );
}

const NESTED: &str = "
domain: d
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: leaf
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: empty
";

/// A rule applies only at the node reached by the last entry, whatever the depth.
#[test]
fn rule_only_at_last_entry() {
    let config = config(NESTED);
    assert_eq!(
        find(&config, "d", &[("a", "x"), ("b", "1")]).unwrap(),
        "d.a_x.b"
    );
    // Stops at `a_x`, which has no limit of its own.
    assert_eq!(find(&config, "d", &[("a", "x")]), None);
    // Deeper than the tree.
    assert_eq!(
        find(&config, "d", &[("a", "x"), ("b", "1"), ("c", "2")]),
        None
    );
    // `leaf` has a limit but no children: the reference stops there, so nothing matches.
    assert_eq!(find(&config, "d", &[("leaf", "1"), ("b", "1")]), None);
    // A node with neither limits nor children matches nothing.
    assert_eq!(find(&config, "d", &[("empty", "1")]), None);
    // No entries, unknown domain.
    assert_eq!(find(&config, "d", &[]), None);
    assert_eq!(find(&config, "other", &[("leaf", "1")]), None);
}

/// Values that are not UTF-8 match bare keys and wildcards, and exact values byte for byte.
#[test]
fn non_utf8_values() {
    let config = config(
        "
domain: d
descriptors:
  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: w, value: 'ab*', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: e, value: 'é', rate_limit: {unit: second, requests_per_unit: 1}}
",
    );
    let domain = config.domain("d").unwrap();
    let found = |k: &[u8], v: &[u8]| domain.find(&[(k, v)]).map(|m| m.rule.path.to_string());
    assert_eq!(found(b"k", b"\xff\xfe").unwrap(), "d.k");
    assert_eq!(found(b"w", b"ab\xff").unwrap(), "d.w_ab*");
    assert_eq!(found(b"e", "é".as_bytes()).unwrap(), "d.e_é");
    assert_eq!(found(b"e", b"\xe9"), None);
}

const METRICS: &str = "
domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value: api/*
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
  - key: svc
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: plain
    value: p*
    rate_limit: {unit: minute, requests_per_unit: 90}
";

fn metric(config: &Config, entries: &[(&str, &str)]) -> String {
    let entries: Vec<(&[u8], &[u8])> = entries
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    let found = config.domain("d").unwrap().find(&entries).unwrap();
    found.metric_key(&entries).to_string()
}

/// share_threshold marks the step shared and keeps the pattern in the metric key.
#[test]
fn share_threshold_step_and_metric() {
    let config = config(METRICS);
    let steps = steps(&config, &[(b"files", b"files/a.pdf")]);
    assert_eq!(
        steps,
        [Step::Wildcard {
            pattern: "files/*",
            shared: true
        }]
    );
    assert_eq!(
        metric(&config, &[("files", "files/a.pdf")]),
        "d.files_files/*"
    );
    // Unshared wildcard without value_to_metric: the pattern too.
    assert_eq!(metric(&config, &[("plain", "pq")]), "d.plain_p*");
}

/// value_to_metric puts the request's value in the metric key at that level only.
#[test]
fn value_to_metric_metric_key() {
    let config = config(METRICS);
    assert_eq!(
        metric(&config, &[("route", "api/users"), ("method", "GET")]),
        "d.route_api/users.method"
    );
}

/// detailed_metric uses every value; a shared level keeps its pattern.
#[test]
fn detailed_metric_metric_key() {
    let config = config(METRICS);
    assert_eq!(metric(&config, &[("user", "alice")]), "d.user_alice");
    // Without share_threshold an empty value still gets its underscore, as in the reference.
    assert_eq!(metric(&config, &[("user", "")]), "d.user_");
    assert_eq!(
        metric(&config, &[("svc", "svc/a"), ("endpoint", "x")]),
        "d.svc_svc/*.endpoint_x"
    );
    assert_eq!(
        metric(&config, &[("svc", "svc/a"), ("endpoint", "")]),
        "d.svc_svc/*.endpoint"
    );
}

/// Rule flags, limit fields and defaults are read from the reference's keys.
#[test]
fn reference_fields() {
    let config = config(
        "
domain: d
descriptors:
  - key: k
    value: v
    shadow_mode: true
    quota_mode: true
    rate_limit:
      name: mine
      unit: HOUR
      requests_per_unit: 7
      replaces: [{name: other}]
  - key: free
    rate_limit: {unlimited: true, requests_per_unit: 3}
",
    );
    let domain = config.domain("d").unwrap();
    let found = domain.find(&[(b"k", b"v")]).unwrap();
    let rule = found.rule;
    assert!(rule.shadow_mode && rule.quota_mode);
    assert!(!rule.detailed_metric && !rule.value_to_metric);
    assert_eq!(
        rule.limits,
        [Limit {
            name: Some("mine".into()),
            unlimited: false,
            unit: Unit::Hour,
            unit_multiplier: 1,
            requests_per_unit: 7,
            algorithm: Algorithm::TokenBucket,
            burst: 7,
            replaces: vec!["other".into()],
            overdraft: false,
            max_wait_us: 0,
        }]
    );
    let free = domain.find(&[(b"free", b"x")]).unwrap();
    assert!(free.rule.limits[0].unlimited);
}

/// The extensions parse: several limits, algorithm, burst, unit_multiplier, overdraft,
/// max_wait.
#[test]
fn extensions() {
    let config = config(
        "
domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10, burst: 50}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 300, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 1000, algorithm: sliding_window}
      - {unit: second, requests_per_unit: 10, algorithm: fixed_window}
      - {unit: hour, requests_per_unit: 100, algorithm: fixed_window, overdraft: true}
      - {unit: minute, requests_per_unit: 100, max_wait: 50ms}
      - {unit: hour, requests_per_unit: 100, max_wait: 250us}
      - {unit: day, requests_per_unit: 100, max_wait: 2s}
      - {unit: week, requests_per_unit: 100, max_wait: 0}
",
    );
    let found = config.domain("d").unwrap().find(&[(b"k", b"v")]).unwrap();
    let params: Vec<LimitParams> = found.rule.limits.iter().map(Limit::params).collect();
    let p = |algorithm, requests_per_period, period_us, burst| LimitParams {
        algorithm,
        requests_per_period,
        period_us,
        burst,
        overdraft: false,
        max_wait_us: 0,
    };
    assert_eq!(
        params,
        [
            p(Algorithm::TokenBucket, 10, 1_000_000, 50),
            p(Algorithm::FixedWindow, 300, 300_000_000, 300),
            p(Algorithm::SlidingWindow, 1000, 86_400_000_000, 1000),
            p(Algorithm::FixedWindow, 10, 1_000_000, 10),
            LimitParams {
                overdraft: true,
                max_wait_us: 0,
                ..p(Algorithm::FixedWindow, 100, 3_600_000_000, 100)
            },
            LimitParams {
                max_wait_us: 50_000,
                ..p(Algorithm::TokenBucket, 100, 60_000_000, 100)
            },
            LimitParams {
                max_wait_us: 250,
                ..p(Algorithm::TokenBucket, 100, 3_600_000_000, 100)
            },
            LimitParams {
                max_wait_us: 2_000_000,
                ..p(Algorithm::TokenBucket, 100, 86_400_000_000, 100)
            },
            p(Algorithm::TokenBucket, 100, 604_800_000_000, 100),
        ]
    );
    assert_eq!(found.rule.limits[1].unit_multiplier, 5);
}

/// A limit that names no algorithm gets the loader's default.
#[test]
fn default_algorithm() {
    let yaml =
        "{domain: d, descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]}";
    let defaults = Defaults {
        algorithm: Algorithm::SlidingWindow,
        ..Defaults::default()
    };
    let config = Config::from_sources(&sources(&[("x.yaml", yaml)]), &defaults).unwrap();
    let found = config.domain("d").unwrap().find(&[(b"k", b"v")]).unwrap();
    assert_eq!(found.rule.limits[0].algorithm, Algorithm::SlidingWindow);
    assert_eq!(Defaults::default().algorithm, Algorithm::TokenBucket);
}

/// Unit lengths, names and both proto enums.
#[test]
fn units() {
    let seconds: Vec<u64> = Unit::ALL.iter().map(|u| u.seconds()).collect();
    assert_eq!(
        seconds,
        [1, 60, 3600, 86_400, 604_800, 2_592_000, 31_536_000]
    );
    assert_eq!(Unit::from_name("MiNuTe"), Some(Unit::Minute));
    assert_eq!(Unit::from_name("unknown"), None);
    assert_eq!(Unit::Week.name(), "week");
    assert_eq!(Unit::from_proto(5), Some(Unit::Month));
    assert_eq!(Unit::from_proto(0), None);
    assert_eq!(Unit::from_proto(7), None);
    assert_eq!(Unit::Week.to_response_proto(), 7);
    assert_eq!(Unit::Year.to_response_proto(), 6);
}
