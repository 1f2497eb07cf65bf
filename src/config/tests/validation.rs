//! Every load error: its file, its path inside the file and its message.

use super::*;

fn limit(fields: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{fields}}}\n")
}

fn limits(items: &[&str]) -> String {
    let items: Vec<String> = items.iter().map(|i| format!("      - {{{i}}}\n")).collect();
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n{}",
        items.concat()
    )
}

/// A missing or empty domain is rejected, like the reference does.
#[test]
fn empty_domain() {
    assert_error(
        "descriptors: []",
        "domain",
        "config file cannot have empty domain",
    );
    assert_error(
        "domain: ''",
        "domain",
        "config file cannot have empty domain",
    );
    assert_error("", "domain", "config file cannot have empty domain");
    assert_error("# only a comment\n", "domain", "cannot have empty domain");
}

/// Two files may not define the same domain; the error names the first file.
#[test]
fn duplicate_domain() {
    let files = sources(&[("a.yaml", "domain: d"), ("b.yaml", "domain: d")]);
    let ConfigErrors(errors) = Config::from_sources(&files, &Defaults::default()).unwrap_err();
    assert_eq!(
        errors,
        [ConfigError {
            file: "b.yaml".into(),
            path: "domain".into(),
            message: "duplicate domain 'd' (already defined in a.yaml)".into(),
        }]
    );
}

/// A descriptor needs a non-empty key.
#[test]
fn empty_key() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - value: v\n";
    assert_error(
        yaml,
        "descriptors[0].descriptors[0].key",
        "descriptor has empty key",
    );
    assert_error(
        "domain: d\ndescriptors: [{key: ''}]",
        "descriptors[0].key",
        "empty key",
    );
}

/// The same key and value twice at one level, or the same bare key twice, is an error.
#[test]
fn duplicate_composite_key() {
    let yaml =
        "domain: d\ndescriptors:\n  - {key: a, value: v}\n  - {key: a}\n  - {key: a, value: v}\n";
    assert_error(
        yaml,
        "descriptors[2]",
        "duplicate descriptor composite key 'd.a_v' (first defined at descriptors[0])",
    );
    let nested = "domain: d\ndescriptors:\n  - key: p\n    descriptors: [{key: a}, {key: a}]\n";
    assert_error(
        nested,
        "descriptors[0].descriptors[1]",
        "duplicate descriptor composite key 'd.p.a' (first defined at descriptors[0].descriptors[0])",
    );
    // Same key under different parents, or with different values, is fine.
    config(
        "domain: d\ndescriptors:\n  - {key: a, value: v}\n  - {key: a, value: w}\n  - {key: a}\n",
    );
}

/// Units are second … year, case-insensitive; anything else, or none, is an error.
#[test]
fn bad_unit() {
    assert_error(
        &limit("unit: fortnight, requests_per_unit: 1"),
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit 'fortnight' (expected second, minute, hour, day, week, month or year)",
    );
    assert_error(
        &limit("unit: unknown, requests_per_unit: 1"),
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit 'unknown'",
    );
    assert_error(
        &limit("requests_per_unit: 1"),
        "descriptors[0].rate_limit.unit",
        "missing rate limit unit",
    );
    config(&limit("unit: Week, requests_per_unit: 1"));
}

/// requests_per_unit is required on a limited rule.
#[test]
fn missing_requests_per_unit() {
    assert_error(
        &limit("unit: second"),
        "descriptors[0].rate_limit.requests_per_unit",
        "missing requests_per_unit",
    );
}

/// An unlimited limit takes no unit and none of the extensions; requests_per_unit is ignored.
#[test]
fn unlimited_fields() {
    assert_error(
        &limit("unlimited: true, unit: second"),
        "descriptors[0].rate_limit.unit",
        "should not specify rate limit unit when unlimited",
    );
    for field in [
        "algorithm: fixed_window",
        "burst: 5",
        "unit_multiplier: 2",
        "overdraft: true",
        "overdraft: false",
        "max_wait: 50ms",
    ] {
        let name = field.split(':').next().unwrap();
        assert_error(
            &limit(&format!("unlimited: true, {field}")),
            &format!("descriptors[0].rate_limit.{name}"),
            &format!("should not specify {name} when unlimited"),
        );
    }
    config(&limit("unlimited: true, requests_per_unit: 5"));
}

/// `max_wait` is a duration on a token bucket without overdraft, at most 60 s.
#[test]
fn bad_max_wait() {
    let at = "descriptors[0].rate_limit.max_wait";
    let rate = "unit: second, requests_per_unit: 10";
    for (value, message) in [
        ("fast", "invalid duration 'fast'"),
        ("50", "invalid duration '50'"),
        ("5m", "invalid duration '5m'"),
        ("-5ms", "invalid duration '-5ms'"),
        ("61s", "max_wait 61s exceeds the longest supported, 60s"),
    ] {
        assert_error(&limit(&format!("{rate}, max_wait: {value}")), at, message);
    }
    assert_error(
        &limit(&format!("{rate}, algorithm: fixed_window, max_wait: 50ms")),
        at,
        "max_wait applies only to token_bucket; fixed_window",
    );
    assert_error(
        &limit(&format!(
            "{rate}, algorithm: sliding_window, max_wait: 50ms"
        )),
        at,
        "max_wait applies only to token_bucket; sliding_window",
    );
    assert_error(
        &limit(&format!("{rate}, overdraft: true, max_wait: 50ms")),
        at,
        "max_wait and overdraft exclude each other",
    );
}

/// replaces entries need a name, and not the limit's own.
#[test]
fn bad_replaces() {
    assert_error(
        &limit("name: n, unit: second, requests_per_unit: 1, replaces: [{name: ''}]"),
        "descriptors[0].rate_limit.replaces[0].name",
        "should not have an empty replaces entry",
    );
    assert_error(
        &limit("name: n, unit: second, requests_per_unit: 1, replaces: [{name: x}, {name: n}]"),
        "descriptors[0].rate_limit.replaces[1].name",
        "replaces should not contain name of same descriptor",
    );
}

/// Unknown keys are rejected at every level, with their path.
#[test]
fn unknown_keys() {
    assert_error(
        "domain: d\ndescriptor: []",
        "descriptor",
        "unknown field `descriptor`",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n    shadowmode: true\n",
        "descriptors[0].shadowmode",
        "unknown field `shadowmode`",
    );
    assert_error(
        &limit("unit: second, requests_per_unit: 1, shadow_mode: true"),
        "descriptors[0].rate_limit.shadow_mode",
        "unknown field `shadow_mode`",
    );
}

/// A wrong YAML type names the field, the expected type, line and column.
#[test]
fn wrong_types() {
    assert_error(
        &limit("unit: second, requests_per_unit: lots"),
        "descriptors[0].rate_limit.requests_per_unit",
        "invalid type: string \"lots\", expected u32 (line 4, column 51)",
    );
    assert_error(
        &limit("unit: second, requests_per_unit: -1"),
        "descriptors[0].rate_limit.requests_per_unit",
        "expected u32",
    );
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n",
        "descriptors[0].shadow_mode",
        "expected a boolean",
    );
    assert_error(
        "domain: d\ndescriptors: {key: a}",
        "descriptors",
        "expected a sequence",
    );
    assert_error(
        &limit("unit: second, requests_per_unit: 1, algorithm: leaky"),
        "descriptors[0].rate_limit.algorithm",
        "unknown variant `leaky`, expected one of `token_bucket`, `fixed_window`, `sliding_window`",
    );
}

/// Scalars other than strings are accepted where the reference accepts them (`value: 200`).
#[test]
fn scalar_values() {
    let config = config(
        "domain: 42\ndescriptors:\n  - {key: status, value: 200, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    );
    assert_eq!(
        find(&config, "42", &[("status", "200")]).unwrap(),
        "42.status_200"
    );
}

/// A YAML syntax error and a file that is not a limits mapping report line and column.
#[test]
fn not_yaml() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: a\n   value: b\n",
        "descriptors",
        "invalid YAML: did not find expected '-' indicator at line 4 column 4",
    );
    assert_error(
        "just some text",
        "",
        "invalid type: string \"just some text\", expected a mapping with `domain` and `descriptors` (line 1, column 1)",
    );
    assert_error("- a\n- b\n", "", "invalid type: sequence");
}

/// rate_limit and rate_limits are exclusive, and rate_limits may not be empty.
#[test]
fn rate_limit_and_rate_limits() {
    let both = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: minute, requests_per_unit: 1}]\n";
    assert_error(
        both,
        "descriptors[0]",
        "has both `rate_limit` and `rate_limits`",
    );
    assert_error(
        "domain: d\ndescriptors: [{key: k, rate_limits: []}]",
        "descriptors[0].rate_limits",
        "must list at least one limit",
    );
}

/// Two limits with the same algorithm and period would share a bucket.
#[test]
fn same_bucket_twice() {
    assert_error(
        &limits(&[
            "unit: minute, requests_per_unit: 10",
            "unit: second, unit_multiplier: 60, requests_per_unit: 20",
        ]),
        "descriptors[0].rate_limits[1]",
        "same algorithm (token_bucket) and period as rate_limits[0]",
    );
}

/// An unlimited limit cannot sit next to real ones.
#[test]
fn unlimited_with_others() {
    assert_error(
        &limits(&["unit: minute, requests_per_unit: 10", "unlimited: true"]),
        "descriptors[0].rate_limits[1]",
        "an unlimited limit cannot be combined with other limits",
    );
}

/// burst is a token-bucket setting, and at least 1; unit_multiplier is at least 1.
#[test]
fn burst_and_multiplier() {
    assert_error(
        &limit("unit: second, requests_per_unit: 1, burst: 5, algorithm: fixed_window"),
        "descriptors[0].rate_limit.burst",
        "burst applies only to token_bucket; fixed_window has no burst",
    );
    assert_error(
        &limit("unit: second, requests_per_unit: 1, burst: 0"),
        "descriptors[0].rate_limit.burst",
        "burst must be at least 1",
    );
    assert_error(
        &limit("unit: second, requests_per_unit: 1, unit_multiplier: 0"),
        "descriptors[0].rate_limit.unit_multiplier",
        "unit_multiplier must be at least 1",
    );
}

/// Bounds that keep the limiter's arithmetic exact: period, rate and bucket span.
#[test]
fn limiter_bounds() {
    config(&limit(
        "unit: year, unit_multiplier: 2, requests_per_unit: 1",
    ));
    assert_error(
        &limit("unit: year, unit_multiplier: 3, requests_per_unit: 1"),
        "descriptors[0].rate_limit.unit_multiplier",
        "period of 3 × year is too long: at most 2^36 ms (about 795 days)",
    );
    // Every rate up to u32::MAX with every unit, under every algorithm, with bursts and
    // multipliers.
    for algorithm in ["token_bucket", "fixed_window", "sliding_window"] {
        for unit in ["second", "minute", "hour", "day", "week", "month", "year"] {
            for rate in [1, 1_000_001, 4_000_000, 1_000_000_000, u32::MAX] {
                config(&limit(&format!(
                    "unit: {unit}, requests_per_unit: {rate}, algorithm: {algorithm}"
                )));
            }
        }
    }
    config(&limit(
        "unit: second, unit_multiplier: 7, requests_per_unit: 4294967295, burst: 4294967295",
    ));
    config(&limit(
        "unit: year, unit_multiplier: 2, requests_per_unit: 4294967295, burst: 1",
    ));
    // One token a year (31 536 000 000 000 µs) with a burst of 36 spans > 2^50 µs.
    assert_error(
        &limit("unit: year, requests_per_unit: 1, burst: 36"),
        "descriptors[0].rate_limit.burst",
        "burst 36 × 31536000000000 µs per token exceeds 2^50 µs",
    );
    config(&limit("unit: year, requests_per_unit: 1, burst: 35"));
}

/// share_threshold only makes sense on a wildcard value.
#[test]
fn share_threshold_needs_wildcard() {
    assert_error(
        "domain: d\ndescriptors:\n  - {key: a, value: v, share_threshold: true}\n",
        "descriptors[0].share_threshold",
        "share_threshold can only be used with a wildcard value",
    );
    config("domain: d\ndescriptors:\n  - {key: a, value: 'v*x', share_threshold: true}\n");
}

/// Every error of every file is reported, not just the first.
#[test]
fn all_errors_collected() {
    let files = sources(&[
        (
            "a.yaml",
            "domain: a\ndescriptors:\n  - {key: ''}\n  - {key: k, rate_limit: {unit: eon, requests_per_unit: 1}}\n",
        ),
        ("b.yaml", "domain: b\ndescriptors: [{key: k, bogus: 1}]\n"),
        ("c.yaml", "domain: c\n"),
        (
            "d.yaml",
            "domain: a\ndescriptors:\n  - {key: k, rate_limit: {unit: second}}\n",
        ),
    ]);
    let ConfigErrors(errors) = Config::from_sources(&files, &Defaults::default()).unwrap_err();
    let found: Vec<(&str, &str)> = errors
        .iter()
        .map(|e| (e.file.as_str(), e.path.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("a.yaml", "descriptors[0].key"),
            ("a.yaml", "descriptors[1].rate_limit.unit"),
            ("b.yaml", "descriptors[0].bogus"),
            ("d.yaml", "domain"),
            ("d.yaml", "descriptors[0].rate_limit.requests_per_unit"),
        ]
    );
}

/// A wrong YAML type hides no other error of its file: every ill-typed key is reported (the
/// first with line and column), the rest of the file is still validated, and a dropped key is
/// not reported again as missing.
#[test]
fn type_errors_hide_nothing_else() {
    let yaml = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n  - key: b\n    shadow_mode: maybe\n    rate_limit: {unit: eon, requests_per_unit: 1}\n  - {key: '', rate_limit: {unlimited: sure}}\n";
    let found: Vec<(String, String)> = errors(yaml)
        .into_iter()
        .map(|e| (e.path, e.message))
        .collect();
    let paths: Vec<&str> = found.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "descriptors[0].rate_limit.requests_per_unit",
            "descriptors[1].shadow_mode",
            "descriptors[2].rate_limit.unlimited",
            "descriptors[1].rate_limit.unit",
            "descriptors[2].key",
        ]
    );
    assert!(
        found[0].1.contains("expected u32 (line 4, column 51)"),
        "{found:?}"
    );
    assert!(found[1].1.contains("expected a boolean"), "{found:?}");
    assert!(
        found[2].1.contains("other fields are not checked"),
        "{found:?}"
    );
    assert!(found[3].1.contains("'eon'"), "{found:?}");
}

/// A YAML syntax error is the only error of its file and says that it hides the rest; the
/// other files are still checked.
#[test]
fn syntax_error_says_it_hides_the_rest() {
    let files = sources(&[
        (
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: a\n   value: b\n",
        ),
        (
            "b.yaml",
            "domain: b\ndescriptors: [{key: k, rate_limit: {unit: eon, requests_per_unit: 1}}]\n",
        ),
    ]);
    let ConfigErrors(errors) = Config::from_sources(&files, &Defaults::default()).unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].message.contains("invalid YAML"), "{errors:#?}");
    assert!(
        errors[0]
            .message
            .contains("nothing else in this file is checked"),
        "{errors:#?}"
    );
    assert_eq!(errors[1].file, "b.yaml");
}

/// Errors display as `file: path: message`, one per line, without a path when there is none.
#[test]
fn error_display() {
    let errors = ConfigErrors(vec![
        ConfigError {
            file: "a.yaml".into(),
            path: "descriptors[0].key".into(),
            message: "descriptor has empty key".into(),
        },
        ConfigError {
            file: "b.yaml".into(),
            path: String::new(),
            message: "cannot read: denied".into(),
        },
    ]);
    assert_eq!(
        errors.to_string(),
        "a.yaml: descriptors[0].key: descriptor has empty key\nb.yaml: cannot read: denied"
    );
}
