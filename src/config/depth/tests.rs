use super::*;

fn depth_ok(yaml: &str) -> bool {
    check_flow_depth(yaml).is_ok()
}

/// Deep flow nesting is refused however it is spelled; brackets in scalars and comments
/// are not nesting.
#[test]
fn flow_depth_is_bounded() {
    let deep = |open: &str, n: usize| open.repeat(n);
    assert!(depth_ok(&deep("[", MAX_FLOW_DEPTH)));
    assert!(!depth_ok(&deep("[", MAX_FLOW_DEPTH + 1)));
    assert!(!depth_ok(&format!("a: {}", deep("{a: ", 100_000))));
    // A quoted closer does not hide an opener.
    assert!(!depth_ok(&deep("[ \"]\", ", MAX_FLOW_DEPTH + 1)));
    assert!(!depth_ok(&deep("[ ']''', ", MAX_FLOW_DEPTH + 1)));
    // A quote inside a plain scalar is not a quote.
    assert!(!depth_ok(&format!(
        "a: don't\nb: {}",
        deep("[x'y, ", MAX_FLOW_DEPTH + 1)
    )));
    // A block scalar's text hides nothing after it.
    assert!(!depth_ok(&format!(
        "a: |\n  \"\n  text\nb: {}",
        deep("[", MAX_FLOW_DEPTH + 1)
    )));
    assert!(depth_ok(&format!(
        "a: |\n  \"\n  {}\nb: 1\n",
        deep("[", MAX_FLOW_DEPTH + 1)
    )));
    // Brackets in plain scalars, quoted scalars and comments are text.
    let text = "domain: a[b\ndescriptors:\n  - key: \"[[[[\"\n    value: '{{{{'  # [[[[\n";
    assert!(depth_ok(&text.repeat(100)));
    assert!(depth_ok(
        "descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]"
    ));
}
