use super::*;

/// Both separators are accepted and blanks are trimmed, as the reference reads them.
#[test]
fn pairs_take_either_separator() {
    assert_eq!(
        parse_pairs("a:1, b=2,,").unwrap(),
        vec![("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert!(parse_pairs("nope").is_err());
}
