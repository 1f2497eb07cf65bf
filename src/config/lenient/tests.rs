use super::*;

/// A misplaced reference key is dropped and a missing count becomes 0; a correct file is
/// left to the strict parse.
#[test]
fn reads_as_the_reference() {
    let yaml =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, shadow_mode: true}\n";
    let model = parse("f", yaml).unwrap();
    let descriptors = model.descriptors.unwrap();
    let limit = descriptors[0].rate_limit.as_ref().unwrap();
    assert_eq!(limit.requests_per_unit, Some(0));
    assert_eq!(descriptors[0].shadow_mode, None);
    let fine =
        "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n";
    assert!(parse("f", fine).is_none());
    // A key the reference does not know stays, for the strict parse to refuse.
    let unknown = "domain: d\nbogus: 1\ndescriptors:\n  - {key: k, shadow_mode: true, rate_limit: {unit: second, name: x, key: y}}\n";
    assert!(parse("f", unknown).is_none());
}
