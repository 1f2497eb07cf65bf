//! Bucket keys: a bucket's identity, encoded once per request as bytes that are also its
//! Redis key (after the configured prefix).
//!
//! [`BucketKey`] is an unambiguous, printable byte encoding of (domain, entries, limit
//! identity) — except for a fixed window shared with reference pods, which Redis keeps under
//! the reference's own name ([`super::ReferenceCounter`]).
//!
//! ```text
//! <domain>:<key>=<value>:<key>=<value>|<algorithm><period seconds>
//! edge:remote_address=10.0.0.1|tb1          token bucket, 1 s period
//! edge:path=*%2Fapi%2F%2A|fw60              share_threshold wildcard `/api/*`, fixed 60 s window
//! edge:remote_address=10.0.0.1|tb60o5      a descriptor `limit` override of 5 per minute
//! ```
//! Every byte outside `[A-Za-z0-9._-]` in a component is `%XX`-escaped, so `:`, `=`, `|`, `*`
//! and `#` only ever appear as separators or markers, and `{`/`}` never appear at all: user
//! bytes cannot inject a Redis Cluster hash tag. A value shared by a `share_threshold`
//! wildcard is written `*<escaped pattern>` (a real value's `*` is escaped, so they cannot
//! collide). A component longer than [`MAX_COMPONENT`] bytes once escaped is replaced by
//! `#` + 32 hex digits of its SHA-256.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::limiter::Algorithm;

/// Escaped components longer than this are hashed, so keys stay short whatever Envoy sends.
pub const MAX_COMPONENT: usize = 96;

/// The identity of one bucket; also its Redis key after the prefix.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey(Box<[u8]>);

/// How one descriptor entry's value takes part in a bucket key.
#[derive(Clone, Copy, Debug)]
pub enum KeyValue<'a> {
    /// The request's own value: each distinct value is its own bucket.
    Value(&'a [u8]),
    /// A `share_threshold` wildcard: every value matching the pattern shares one bucket.
    Shared(&'a str),
}

/// The first component of every bucket key of `domain`, encoded once per configured domain
/// (see [`BucketKey::in_domain`]).
pub fn encode_domain(domain: &str) -> Box<[u8]> {
    let mut out = Vec::with_capacity(domain.len());
    push_component(&mut out, domain.as_bytes());
    out.into_boxed_slice()
}

/// `domain` encoded as a Redis Cluster hash tag, `{<encoded domain>}`, to pass to
/// [`BucketKey::in_domain`]: every key of the domain then hashes to the same slot (a domain's
/// `redis_hash_tag: true`). Encoded components never contain braces, so the tag is exactly the
/// encoded domain, and a tagged key (the only kind starting with `{`) never equals an untagged
/// one.
pub fn hash_tagged_domain(domain: &str) -> Box<[u8]> {
    let mut out = Vec::with_capacity(domain.len() + 2);
    out.push(b'{');
    push_component(&mut out, domain.as_bytes());
    out.push(b'}');
    out.into_boxed_slice()
}

impl BucketKey {
    /// Encodes a bucket identity. `entries` are the request's entries as matched.
    pub fn new<'a>(
        domain: &str,
        entries: impl IntoIterator<Item = (&'a [u8], KeyValue<'a>)>,
        algorithm: Algorithm,
        period_us: u64,
    ) -> BucketKey {
        BucketKey::in_domain(&encode_domain(domain), entries, algorithm, period_us)
    }

    /// [`BucketKey::new`] with the domain already encoded by [`encode_domain`]: the request
    /// path encodes only the request's entries.
    pub fn in_domain<'a>(
        encoded_domain: &[u8],
        entries: impl IntoIterator<Item = (&'a [u8], KeyValue<'a>)>,
        algorithm: Algorithm,
        period_us: u64,
    ) -> BucketKey {
        // Written into this thread's scratch buffer, then copied once into a box of exactly
        // its length: one allocation per key, where a vector of a guessed capacity took a
        // second one (its shrink to the key's length).
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const {
                std::cell::RefCell::new(Vec::new())
            };
        }
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut out) => {
                out.clear();
                encode_in_domain(&mut out, encoded_domain, entries, algorithm, period_us);
                BucketKey(Box::from(&out[..]))
            }
            // Not reached (encoding does not nest), but never a panic.
            Err(_) => {
                let mut out = Vec::new();
                encode_in_domain(&mut out, encoded_domain, entries, algorithm, period_us);
                BucketKey(out.into_boxed_slice())
            }
        })
    }

    /// The key of a descriptor `limit` override of `rate` requests per period: marked, and
    /// with its rate, so it never shares state with a configured limit (or an override of
    /// another rate) of the same algorithm and period — their token sizes differ.
    pub fn with_override_rate(self, rate: u32) -> BucketKey {
        let mut bytes = self.0.into_vec();
        bytes.push(b'o');
        push_decimal(&mut bytes, u64::from(rate));
        BucketKey(bytes.into_boxed_slice())
    }

    /// The encoded key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always ASCII by construction.
        write!(f, "BucketKey({})", String::from_utf8_lossy(&self.0))
    }
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Writes the key of [`BucketKey::in_domain`] onto `out`.
fn encode_in_domain<'a>(
    out: &mut Vec<u8>,
    encoded_domain: &[u8],
    entries: impl IntoIterator<Item = (&'a [u8], KeyValue<'a>)>,
    algorithm: Algorithm,
    period_us: u64,
) {
    out.extend_from_slice(encoded_domain);
    for (key, value) in entries {
        out.push(b':');
        push_component(out, key);
        out.push(b'=');
        match value {
            KeyValue::Value(v) => push_component(out, v),
            KeyValue::Shared(pattern) => {
                out.push(b'*');
                push_component(out, pattern.as_bytes());
            }
        }
    }
    out.push(b'|');
    out.extend_from_slice(match algorithm {
        Algorithm::TokenBucket => b"tb",
        Algorithm::FixedWindow => b"fw",
        Algorithm::SlidingWindow => b"sw",
    });
    push_decimal(out, period_us / 1_000_000);
}

/// The name a request key or value longer than `--max-value-bytes` is known by once matched
/// (in bucket keys, reference counter names and metric paths): `#` and 32 hex digits of its
/// SHA-256, 33 bytes whatever the value's length. A value of exactly this form names the same
/// bucket, which gives its sender nothing: they could send the long value itself.
pub fn value_digest(raw: &[u8]) -> Vec<u8> {
    let digest = Sha256::digest(raw);
    let mut out = Vec::with_capacity(33);
    out.push(b'#');
    for b in &digest[..16] {
        push_hex(&mut out, *b);
    }
    out
}

fn push_component(out: &mut Vec<u8>, raw: &[u8]) {
    let escaped_len: usize = raw.iter().map(|&b| if is_plain(b) { 1 } else { 3 }).sum();
    if escaped_len > MAX_COMPONENT {
        let digest = Sha256::digest(raw);
        out.push(b'#');
        for b in &digest[..16] {
            push_hex(out, *b);
        }
        return;
    }
    for &b in raw {
        if is_plain(b) {
            out.push(b);
        } else {
            out.push(b'%');
            push_hex(out, b);
        }
    }
}

/// Appends `n` in decimal, without the `String` that `to_string` would allocate per key.
pub(super) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

fn push_hex(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push(HEX[usize::from(b >> 4)]);
    out.push(HEX[usize::from(b & 0xf)]);
}

#[cfg(test)]
mod tests {
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
        let key = BucketKey::new("d", e, Algorithm::TokenBucket, 3_600_000_000)
            .with_override_rate(u32::MAX);
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
}
