use super::*;

fn yaml(text: &str) -> Yaml {
    serde_yaml_ng::from_str(text).unwrap()
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// Scalars, lists and nested mappings become the protobuf values `structpb` makes.
#[test]
fn every_yaml_shape_converts() {
    let m = compile(&yaml(
        "name: svc\nweight: 3\nratio: 0.5\non: true\nnone: null\ntags: [a, 1]\nnested: {1: x}",
    ))
    .unwrap()
    .unwrap();
    let f = &m.0.fields;
    assert_eq!(f["name"], string("svc"));
    assert_eq!(f["weight"].kind, Some(Kind::NumberValue(3.0)));
    assert_eq!(f["ratio"].kind, Some(Kind::NumberValue(0.5)));
    assert_eq!(f["on"].kind, Some(Kind::BoolValue(true)));
    assert_eq!(f["none"].kind, Some(Kind::NullValue(0)));
    let Some(Kind::ListValue(list)) = &f["tags"].kind else {
        panic!("tags: {:?}", f["tags"]);
    };
    assert_eq!(list.values[0], string("a"));
    let Some(Kind::StructValue(nested)) = &f["nested"].kind else {
        panic!("nested: {:?}", f["nested"]);
    };
    assert_eq!(nested.fields["1"], string("x"));
}

/// Absent, null and empty metadata is none; a scalar or list is an error.
#[test]
fn empty_is_none_and_non_mappings_fail() {
    assert_eq!(compile(&yaml("null")).unwrap(), None);
    assert_eq!(compile(&yaml("{}")).unwrap(), None);
    assert!(compile(&yaml("text")).is_err());
    assert!(compile(&yaml("[a, b]")).is_err());
    assert!(compile(&yaml("a:\n  ? [1]\n  : b")).is_err());
}

/// The first value of a key wins; mappings under one key are merged recursively.
#[test]
fn merge_keeps_first_and_merges_mappings() {
    let first = compile(&yaml("name: a\nsvc: {x: 1}")).unwrap().unwrap();
    let second = compile(&yaml("name: b\nother: c\nsvc: {x: 2, y: 3}"))
        .unwrap()
        .unwrap();
    let mut dest = BTreeMap::new();
    merge(&mut dest, &first.0);
    merge(&mut dest, &second.0);
    assert_eq!(dest["name"], string("a"));
    assert_eq!(dest["other"], string("c"));
    let Some(Kind::StructValue(svc)) = &dest["svc"].kind else {
        panic!("svc: {:?}", dest["svc"]);
    };
    assert_eq!(svc.fields["x"].kind, Some(Kind::NumberValue(1.0)));
    assert_eq!(svc.fields["y"].kind, Some(Kind::NumberValue(3.0)));
}
