use super::Pattern;

fn glob(pattern: &str, value: &[u8]) -> bool {
    Pattern::new(pattern).matches(value)
}

/// A trailing star is a prefix match, as in the reference's original wildcard support.
#[test]
fn trailing_star_is_prefix() {
    assert!(glob("foo*", b"foo"));
    assert!(glob("foo*", b"foobar"));
    assert!(!glob("foo*", b"fo"));
    assert!(!glob("foo*", b"xfoo"));
}

/// A leading star is a suffix match.
#[test]
fn leading_star_is_suffix() {
    assert!(glob("*.example.com", b"a.example.com"));
    assert!(glob("*.example.com", b".example.com"));
    assert!(!glob("*.example.com", b"example.com"));
}

/// A middle star needs both ends and does not let them overlap.
#[test]
fn middle_star_needs_both_ends() {
    assert!(glob("/api*v1", b"/api/users/v1"));
    assert!(glob("/api*v1", b"/apiv1"));
    assert!(!glob("ab*ba", b"aba"));
    assert!(!glob("/api*v1", b"/api/users/v2"));
}

/// Several stars, consecutive stars and a lone star all match as globs.
#[test]
fn multiple_stars() {
    assert!(glob("svc*ep*rpc", b"svc-a.ep-b.rpc"));
    assert!(glob("svc*ep*rpc", b"svceprpc"));
    assert!(!glob("svc*ep*rpc", b"svc-a.rpc"));
    assert!(glob("a**b", b"ab"));
    assert!(glob("*", b""));
    assert!(glob("*a*a*", b"xaya"));
    assert!(!glob("*a*a*", b"xay"));
}

/// Patterns compare bytes, so non-UTF-8 values match too.
#[test]
fn non_utf8_values() {
    assert!(glob("a*", b"a\xff\xfe"));
    assert!(glob("*z", b"\xc3z"));
}
