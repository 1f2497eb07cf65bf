use super::*;

fn check_yaml(yaml: &str) -> Checked {
    check(serde_yaml_ng::from_str(yaml).unwrap())
}

fn paths(checked: &Checked) -> Vec<&str> {
    checked.errors.iter().map(|e| e.path.as_str()).collect()
}

/// Every ill-typed or unknown key of a file is reported, in order, and the rest is kept.
#[test]
fn every_wrong_key_is_reported_and_dropped() {
    let checked = check_yaml(
        "domain: d\nbogus: 1\ndescriptors:\n  - key: a\n    shadow_mode: yes\n    \
         rate_limit: {unit: second, requests_per_unit: -1}\n  - 5\n  - key: b\n    \
         rate_limits: [{unit: [x], requests_per_unit: 2}]\n",
    );
    assert_eq!(
        paths(&checked),
        [
            "bogus",
            "descriptors[0].shadow_mode",
            "descriptors[0].rate_limit.requests_per_unit",
            "descriptors[1]",
            "descriptors[2].rate_limits[0].unit",
        ]
    );
    assert!(checked.errors[0].message.contains("unknown field `bogus`"));
    assert!(checked.errors[2].message.contains("expected u32"));
    assert!(
        checked.errors[3].message.contains("expected a descriptor"),
        "{}",
        checked.errors[3].message
    );
    let model = checked.model.unwrap();
    let descriptors = model.descriptors.unwrap();
    assert_eq!(descriptors.len(), 3);
    let limit = descriptors[0].rate_limit.as_ref().unwrap();
    assert_eq!(limit.unit.as_deref(), Some("second"));
    assert_eq!(limit.requests_per_unit, None);
    assert_eq!(
        descriptors[2].rate_limits.as_ref().unwrap()[0].requests_per_unit,
        Some(2)
    );
}

/// What a dropped key covers: its own path and below; a wrong `unlimited` covers its limit.
#[test]
fn hidden_paths() {
    let checked = check_yaml(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: maybe}\n    \
         descriptors: {key: b}\n",
    );
    assert_eq!(
        paths(&checked),
        [
            "descriptors[0].rate_limit.unlimited",
            "descriptors[0].descriptors"
        ]
    );
    assert_eq!(checked.errors[0].hides, HIDES_LIMIT);
    assert_eq!(checked.errors[1].hides, HIDES_CONTENT);
    let hidden = &checked.hidden;
    assert!(hidden.covers("descriptors[0].rate_limit.unit"));
    assert!(hidden.covers("descriptors[0].descriptors[0].key"));
    assert!(!hidden.covers("descriptors[0].key"));
    assert!(!hidden.covers("descriptors[0].rate_limits"));
}

/// A file that is not a mapping is one error, and no model.
#[test]
fn not_a_mapping() {
    let checked = check_yaml("- a\n- b\n");
    assert!(checked.model.is_none());
    assert_eq!(paths(&checked), [""]);
    assert!(
        checked.errors[0]
            .message
            .contains("expected a mapping with `domain`")
    );
}
