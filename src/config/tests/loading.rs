//! Several files compiled together (merged domains, the rule cap), and `describe`.

use super::*;

const LIMITS: &str =
    "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n";

/// describe lists one line per limit, domains and rules sorted, flags spelled out.
#[test]
fn describe_output() {
    let files = sources(&[
        (
            "edge.yaml",
            "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
  - key: path
    value: /api/*
    shadow_mode: true
    quota_mode: true
    rate_limit:
      name: api
      unit: minute
      unit_multiplier: 5
      requests_per_unit: 100
      algorithm: fixed_window
      replaces: [{name: a}, {name: b}]
  - key: user
    detailed_metric: true
    value_to_metric: true
    rate_limits:
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_window}
      - {unit: second, requests_per_unit: 5}
  - key: health
    rate_limit: {unlimited: true}
",
        ),
        (
            "internal.yaml",
            "domain: internal\nredis_hash_tag: true\ndescriptors: [{key: k}]\n",
        ),
    ]);
    let config = Config::from_sources(&files, &Defaults::default()).unwrap();
    assert_eq!(
        config.describe(),
        "edge.health: unlimited shadow_mode=false
edge.path_/api/*: 100/5 minutes fixed_window name=api replaces=a,b shadow_mode=true quota_mode
edge.remote_address: 10/second token_bucket burst=20 shadow_mode=false
edge.user: 1000/hour sliding_window shadow_mode=false detailed_metric value_to_metric
edge.user: 5/second token_bucket burst=5 shadow_mode=false detailed_metric value_to_metric
internal: redis_hash_tag
internal: no limits
"
    );
}

/// With `merge_domains`, files naming one domain are joined; a top-level key defined in two
/// of them is still an error. Without it, the second file is a duplicate domain.
#[test]
fn merged_domains() {
    let a =
        "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let b =
        "domain: d\ndescriptors:\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 2}}\n";
    let files = sources(&[("a.yaml", a), ("b.yaml", b)]);
    let merged = Config::compile(&files, &Defaults::default(), true).unwrap();
    assert!(find(&merged, "d", &[("a", "x")]).is_some());
    assert!(find(&merged, "d", &[("b", "x")]).is_some());
    let Err(ConfigErrors(errors)) = Config::compile(&files, &Defaults::default(), false) else {
        panic!("a duplicate domain loaded");
    };
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].message.starts_with("duplicate domain 'd'"),
        "{errors:?}"
    );
    let twice = sources(&[("a.yaml", a), ("c.yaml", a)]);
    let Err(ConfigErrors(errors)) = Config::compile(&twice, &Defaults::default(), true) else {
        panic!("a key defined twice loaded");
    };
    assert_eq!(
        (errors[0].file.as_str(), errors[0].path.as_str()),
        ("c.yaml", "descriptors[0]")
    );
    assert!(
        errors[0].message.contains("another file of the domain"),
        "{errors:?}"
    );
}

/// A domain read twice because a volume's `..` copy was walked says which variable fixes it.
#[test]
fn duplicate_from_a_volume_copy_names_the_fix() {
    let files = sources(&[("cfg/..2026_01/x", LIMITS), ("cfg/x", LIMITS)]);
    let Err(ConfigErrors(errors)) = Config::compile(&files, &Defaults::default(), false) else {
        panic!("a duplicate domain loaded");
    };
    assert!(
        errors[0].message.contains("RUNTIME_IGNOREDOTFILES=true"),
        "{errors:?}"
    );
}

/// `metadata:` that is not a mapping is an error at its path.
#[test]
fn metadata_must_be_a_mapping() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        "descriptors[0].metadata",
        "mapping",
    );
}

/// A load holds at most `max_rules` rules (descriptors, nested ones included), all files
/// together: over it, the load is refused whole, naming the file that passed the cap, the
/// total and the cap; at it, it loads.
#[test]
fn rules_per_load_are_capped() {
    let nested = "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - {key: x, rate_limit: {unit: second, requests_per_unit: 1}}\n      - {key: y, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let flat = "domain: b\ndescriptors:\n  - {key: p, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: q, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: r, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    let files = sources(&[("a.yaml", nested), ("b.yaml", flat), ("c.yaml", flat)]);
    let capped = |max_rules| {
        Config::from_sources(
            &files,
            &Defaults {
                max_rules,
                ..Defaults::default()
            },
        )
    };
    let ConfigErrors(errors) = capped(5).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].file, "b.yaml");
    assert!(
        errors[0]
            .message
            .contains("holds 9 rules (descriptors, nested ones included), more than the 5"),
        "{}",
        errors[0].message
    );
    assert!(errors[0].message.contains("--max-load-rules"));
    // Duplicate domain b aside (c.yaml), the cap is all that is said once it is passed.
    let two = &files[..2];
    assert!(
        Config::from_sources(
            two,
            &Defaults {
                max_rules: 6,
                ..Defaults::default()
            }
        )
        .is_ok()
    );
    assert!(capped(9).is_err_and(|ConfigErrors(e)| e[0].message.contains("duplicate domain")));
}

/// Each rule of a compiled configuration has its own index below `rule_count`, numbered by
/// domain and path, so the same limits number their rules the same way every load.
#[test]
fn rules_are_numbered_by_domain_and_path() {
    let files = sources(&[
        (
            "b.yaml",
            "domain: b\ndescriptors:\n  - {key: z, rate_limit: {unit: second, requests_per_unit: 1}}\n  - key: a\n    value: '*'\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - {key: n, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
        ),
        ("a.yaml", LIMITS),
    ]);
    let numbered = |config: &Config| -> Vec<(String, usize)> {
        config
            .domains()
            .flat_map(|domain| domain.rules())
            .map(|rule| (rule.path.to_string(), rule.index))
            .collect()
    };
    let config = Config::from_sources(&files, &Defaults::default()).unwrap();
    assert_eq!(config.rule_count(), 4);
    assert_eq!(
        numbered(&config),
        [
            ("b.a_*".to_string(), 0),
            ("b.a_*.n".to_string(), 1),
            ("b.z".to_string(), 2),
            ("d.k".to_string(), 3),
        ]
    );
    let again = Config::from_sources(&files, &Defaults::default()).unwrap();
    assert_eq!(numbered(&again), numbered(&config));
}
