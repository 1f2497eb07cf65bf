//! Unit tests of the metrics: label escaping and the detailed-series cap, and rule handles
//! against lookups.

use std::sync::Arc;

use super::*;
use crate::outcome::{Outcome, Tally, Verdict};

fn tally(rule: &str, detailed: bool) -> Tally<'static> {
    Tally {
        rule: std::borrow::Cow::Owned(rule.into()),
        detailed,
        hits: 1,
        verdict: Verdict::WithinLimit,
        near_limit: 0,
        local_cache: false,
        rule_index: None,
    }
}

/// Request bytes in a label value are escaped; past the cap, paths with request values
/// share the overflow series (counted), while configured paths are never capped.
#[test]
fn detailed_labels_are_escaped_and_capped() {
    let metrics = Metrics::new();
    metrics.set_max_detailed_series(2);
    let domain: Arc<str> = "d".into();
    let none = RuleHandles::default();
    for rule in ["d.user_a\"b", "d.user_x\ny", "d.user_back\\", "d.user_more"] {
        metrics.record_tally(&domain, &tally(rule, true), &none);
    }
    // Seen before the cap: still its own series.
    metrics.record_tally(&domain, &tally("d.user_a\"b", true), &none);
    metrics.record_tally(&domain, &tally("d.k", false), &none);
    let text = metrics.encode();
    assert!(text.contains(r#"rule="d.user_a\"b"} 2"#), "{text}");
    assert!(text.contains(r#"rule="d.user_x\ny""#), "{text}");
    assert!(text.contains(r#"rule="_overflow"} 2"#), "{text}");
    assert!(text.contains(r#"rule="d.k""#), "{text}");
    assert!(!text.contains("d.user_back"), "{text}");
    assert!(
        text.contains("floodgate_rule_series_overflow_total 2"),
        "{text}"
    );
}

/// The exposition's lines, sorted: a family's series come in its hash map's order, which
/// differs between registries.
fn lines(metrics: &Metrics) -> Vec<String> {
    let mut lines: Vec<String> = metrics.encode().lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// Counting through a rule's handles exports byte for byte what looking each series up
/// exports (a series appears when first counted, not when the rule is resolved), and a
/// rule resolved in one registry or for one domain label still counts the right series
/// in another.
#[test]
fn rule_handles_export_what_lookups_export() {
    let domain: Arc<str> = "d".into();
    let rule: Arc<str> = "d.k".into();
    let tallies = [
        (Verdict::WithinLimit, 0, false),
        (Verdict::WithinLimit, 1, false),
        (Verdict::OverLimit, 0, true),
        (Verdict::ShadowOverLimit, 0, false),
    ];
    let (handles, lookups) = (Metrics::new(), Metrics::new());
    let resolved = handles.resolve_rules([configured(0, &domain, &rule, false)]);
    let none = RuleHandles::default();
    for (i, (verdict, near_limit, local_cache)) in tallies.into_iter().enumerate() {
        let tally = Tally {
            verdict,
            near_limit,
            local_cache,
            hits: 2,
            rule_index: Some(0),
            ..tally("d.k", false)
        };
        handles.record_tally(&domain, &tally, &resolved);
        lookups.record_tally(&domain, &tally, &none);
        assert_eq!(lines(&handles), lines(&lookups), "after tally {i}");
    }
    let outcome = Outcome {
        response: Default::default(),
        over: false,
        domain: Some(&domain),
        tallies: smallvec::smallvec![Tally {
            rule_index: Some(0),
            ..tally("d.k", false)
        }],
        shadowed: false,
    };
    for result in [
        RequestResult::Ok,
        RequestResult::OverLimit,
        RequestResult::Ok,
    ] {
        handles.record_outcome(&outcome, &resolved, result);
        lookups.record_outcome(&outcome, &none, result);
    }
    assert_eq!(lines(&handles), lines(&lookups));
    // What every request counts through handles is spread over stripes (super::striped).
    let handle = resolved.rule(0).expect("resolved");
    assert_eq!(handle.hits_spread(), Some(true));
    // The same rule counted in another registry, and under another domain label.
    let other = Metrics::new();
    let indexed = Tally {
        rule_index: Some(0),
        ..tally("d.k", false)
    };
    other.record_tally(&domain, &indexed, &resolved);
    handles.record_tally(&"e".into(), &indexed, &resolved);
    let text = other.encode();
    assert!(
        text.contains(r#"floodgate_rule_hits_total{domain="d",rule="d.k"} 1"#),
        "{text}"
    );
    let text = handles.encode();
    assert!(
        text.contains(r#"floodgate_rule_hits_total{domain="d",rule="d.k"} 11"#),
        "{text}"
    );
    assert!(
        text.contains(r#"floodgate_rule_hits_total{domain="e",rule="d.k"} 1"#),
        "{text}"
    );
}

/// A configured rule as the limits publisher shows it to telemetry.
fn configured<'a>(
    index: usize,
    domain: &'a Arc<str>,
    path: &'a Arc<str>,
    detailed: bool,
) -> ConfiguredRule<'a> {
    ConfiguredRule {
        index,
        domain,
        path,
        detailed,
    }
}

/// Loading limits resolves each configured rule's handles, the reference's statsd counters
/// included, so a request for the rule resolves nothing new: it counts through the very
/// handles the load made. Series still appear only once counted, and a rule counted only
/// under request values gets none.
#[test]
fn rules_are_resolved_when_limits_load() {
    let metrics = Metrics::new();
    metrics.attach_reference_stats(None, None);
    let domain: Arc<str> = "d".into();
    let (plain, detailed): (Arc<str>, Arc<str>) = ("d.k".into(), "d.user".into());
    let rules = metrics.resolve_rules([
        configured(0, &domain, &plain, false),
        configured(1, &domain, &detailed, true),
    ]);
    assert!(rules.rule(1).is_none(), "a detailed rule has no handles");
    let resolved = rules.rule(0).expect("resolved at load");
    let stats = metrics.reference_stats().expect("attached");
    let counters = resolved.statsd().expect("statsd counters resolved at load");
    assert!(Arc::ptr_eq(counters, &stats.rule(&"d.k".into()).unwrap()));
    assert!(!metrics.encode().contains("floodgate_rule_hits_total{"));

    let tally = Tally {
        hits: 3,
        rule_index: Some(0),
        ..tally("d.k", false)
    };
    let used = metrics
        .record_tally(&domain, &tally, &rules)
        .expect("counted by handles");
    assert!(
        std::ptr::eq(used, resolved),
        "the load's handles, not new ones"
    );
    assert_eq!(
        counters
            .total_hits
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    assert!(
        metrics
            .encode()
            .contains(r#"floodgate_rule_hits_total{domain="d",rule="d.k"} 3"#)
    );
}

/// Store errors of a configured rule count through its handles and export byte for byte what
/// looking the series up exports; a path with request values still looks its series up.
#[test]
fn rule_errors_through_handles_export_what_lookups_export() {
    let domain: Arc<str> = "d".into();
    let (rule, user): (Arc<str>, Arc<str>) = ("d.k".into(), "d.user_u1".into());
    let (counted, lookups) = (Metrics::new(), Metrics::new());
    let rules = counted.resolve_rules([configured(0, &domain, &rule, false)]);
    let none = RuleHandles::default();
    for hits in [2, 3] {
        counted.record_rule_errors(
            &domain,
            [(&rule, false, hits, Some(0)), (&user, true, 1, None)],
            &rules,
        );
        lookups.record_rule_errors(
            &domain,
            [(&rule, false, hits, None), (&user, true, 1, None)],
            &none,
        );
    }
    assert_eq!(lines(&counted), lines(&lookups));
    let errors = rules.rule(0).and_then(|rule| rule.errors_counted());
    assert_eq!(errors, Some(5), "counted through the rule's handles");
    let text = counted.encode();
    assert!(
        text.contains(r#"floodgate_rule_errors_total{domain="d",rule="d.k"} 5"#),
        "{text}"
    );
}
