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
mod tests;
