use super::*;

fn key(domain: &str, entries: &[(&[u8], KeyValue<'_>)]) -> String {
    let k = BucketKey::new(
        domain,
        entries.iter().copied(),
        Algorithm::TokenBucket,
        60_000_000,
    );
    String::from_utf8(k.as_bytes().to_vec()).unwrap()
}

/// Plain values read naturally; the limit identity is the suffix.
#[test]
fn plain_key_is_readable() {
    assert_eq!(
        key("edge", &[(b"remote_address", KeyValue::Value(b"10.0.0.1"))]),
        "edge:remote_address=10.0.0.1|tb60"
    );
}

/// Separators, braces and non-UTF-8 bytes in user data are escaped, never raw.
#[test]
fn user_bytes_cannot_forge_separators_or_hash_tags() {
    let k = key("d{x}", &[(b"k:=", KeyValue::Value(b"{tag}|\xff*"))]);
    assert_eq!(k, "d%7Bx%7D:k%3A%3D=%7Btag%7D%7C%FF%2A|tb60");
    assert!(!k.contains('{') && !k.contains('}'));
}

/// Joining differently-split entries cannot produce the same key.
#[test]
fn different_splits_give_different_keys() {
    let a = key(
        "d",
        &[
            (b"a", KeyValue::Value(b"b:c=d")),
            (b"e", KeyValue::Value(b"f")),
        ],
    );
    let b = key(
        "d",
        &[
            (b"a", KeyValue::Value(b"b")),
            (b"c", KeyValue::Value(b"d:e=f")),
        ],
    );
    assert_ne!(a, b);
}

/// A shared wildcard bucket never collides with a request whose value is the pattern.
#[test]
fn shared_pattern_differs_from_literal_value() {
    let shared = key("d", &[(b"path", KeyValue::Shared("/api/*"))]);
    let literal = key("d", &[(b"path", KeyValue::Value(b"/api/*"))]);
    assert_eq!(shared, "d:path=*%2Fapi%2F%2A|tb60");
    assert_ne!(shared, literal);
}

/// Long values are hashed to a fixed length; distinct long values stay distinct.
#[test]
fn long_values_are_hashed() {
    let long_a = vec![b'a'; 500];
    let mut long_b = long_a.clone();
    long_b[499] = b'b';
    let a = key("d", &[(b"k", KeyValue::Value(&long_a))]);
    let b = key("d", &[(b"k", KeyValue::Value(&long_b))]);
    assert_ne!(a, b);
    assert_eq!(a.len(), "d:k=#|tb60".len() + 32);
}

/// An override never shares a bucket with the configured limit or another rate.
#[test]
fn override_keys_are_distinct() {
    let e = [(&b"k"[..], KeyValue::Value(b"v"))];
    let configured = BucketKey::new("d", e, Algorithm::TokenBucket, 60_000_000);
    let one = configured.clone().with_override_rate(1);
    let two = configured.clone().with_override_rate(2);
    assert_eq!(one.as_bytes(), b"d:k=v|tb60o1");
    assert_ne!(configured, one);
    assert_ne!(one, two);
}

/// A hash-tagged key wraps exactly the escaped domain in braces, whatever follows it,
/// and differs from the untagged key; hashed (long) domains are tagged too.
#[test]
fn hash_tag_wraps_the_domain() {
    let e = [(&b"k"[..], KeyValue::Value(b"v{x}"))];
    let tagged = |domain: &str, entries: &[(&[u8], KeyValue)], algorithm, period_us| {
        BucketKey::in_domain(
            &hash_tagged_domain(domain),
            entries.iter().copied(),
            algorithm,
            period_us,
        )
    };
    let key = tagged("ed{ge", &e, Algorithm::TokenBucket, 1_000_000);
    assert_eq!(key.as_bytes(), b"{ed%7Bge}:k=v%7Bx%7D|tb1");
    let bare = tagged("d", &[], Algorithm::FixedWindow, 60_000_000);
    assert_eq!(bare.as_bytes(), b"{d}|fw60");
    assert_ne!(
        bare,
        BucketKey::new("d", [], Algorithm::FixedWindow, 60_000_000)
    );
    assert_eq!(bare.with_override_rate(3).as_bytes(), b"{d}|fw60o3");
    let long = "x".repeat(200);
    let hashed = tagged(&long, &e, Algorithm::TokenBucket, 1_000_000);
    let text = String::from_utf8(hashed.as_bytes().to_vec()).unwrap();
    assert!(
        text.starts_with("{#") && text[1..].find('}') == Some(33),
        "{text}"
    );
}

/// A key built from the pre-encoded domain is the key built from the domain name, and
/// periods and override rates are written in decimal.
#[test]
fn in_domain_matches_new() {
    let e = [(&b"k"[..], KeyValue::Value(b"v"))];
    for (domain, period_us) in [("edge", 0), ("d{x}", 1_000_000), ("d", u64::MAX)] {
        assert_eq!(
            BucketKey::in_domain(
                &encode_domain(domain),
                e,
                Algorithm::SlidingWindow,
                period_us
            ),
            BucketKey::new(domain, e, Algorithm::SlidingWindow, period_us)
        );
    }
    let key = BucketKey::new("d", e, Algorithm::TokenBucket, u64::MAX).with_override_rate(0);
    assert_eq!(key.as_bytes(), b"d:k=v|tb18446744073709o0");
    let key =
        BucketKey::new("d", e, Algorithm::TokenBucket, 3_600_000_000).with_override_rate(u32::MAX);
    assert_eq!(key.as_bytes(), b"d:k=v|tb3600o4294967295");
}

/// Algorithm and period are part of the identity.
#[test]
fn limit_identity_is_part_of_the_key() {
    let e = [(&b"k"[..], KeyValue::Value(b"v"))];
    let tb = BucketKey::new("d", e, Algorithm::TokenBucket, 1_000_000);
    let fw = BucketKey::new("d", e, Algorithm::FixedWindow, 1_000_000);
    let tb60 = BucketKey::new("d", e, Algorithm::TokenBucket, 60_000_000);
    assert_ne!(tb, fw);
    assert_ne!(tb, tb60);
}
