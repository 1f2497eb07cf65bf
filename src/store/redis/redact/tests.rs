use super::*;

/// Passwords and `pass=` values are masked, whatever URL syntax the password holds.
#[test]
fn secrets_are_masked() {
    assert_eq!(
        redact_url("redis://user:s3cret@host:6379/0"),
        "redis://user:***@host:6379/0"
    );
    assert_eq!(redact_url("rediss://:s3cret@host"), "rediss://:***@host");
    assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    assert_eq!(
        redact_url("redis+unix:///run/r.sock?pass=s3cret&user=u"),
        "redis+unix:///run/r.sock?pass=***&user=u"
    );
    // URL syntax inside an unencoded password does not expose it.
    for (url, secret) in [
        ("redis://:pa/ss@host:6379/0", "pa/ss"),
        ("redis://u:p?w=1@host:6379", "p?w=1"),
        ("redis://u:p#x@host", "p#x"),
        ("redis://u:a@b:c@host/0", "a@b:c"),
        ("rediss://:sec/r?et@h:1?pass=also/secret", "also/secret"),
    ] {
        let redacted = redact_url(url);
        assert!(!redacted.contains(secret), "{url} -> {redacted}");
        let said = redact_in(&format!("cannot parse {url} (near '{secret}')"), url);
        assert!(!said.contains(secret), "{said}");
    }
    assert_eq!(redact_url("redis://u:p/w@h:1/2"), "redis://u:***@h:1/2");
}
