//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz; see `docs/fuzzing.md`).
//!
//! Not part of floodgate's API (hidden from the docs): each function feeds untrusted input to
//! one stage of the server exactly as the server does, returns quietly when the input is
//! rejected, and panics only when an invariant is broken — which is what the fuzzer reports.
//! Living in the crate lets the targets reach private steps (the `/json` body parser) without
//! making them public.
//!
//! - [`config`]: bytes → the limits loader (parse + validate, as `check-config` and reload).
//! - [`request`]: bytes → protobuf `RateLimitRequest` → plan against [`REQUEST_LIMITS`] →
//!   memory store → response, twice (the second time against the first one's debits).
//! - [`json`]: bytes → the `POST /json` body parser → the same request path → JSON response.
//! - [`bucket_key`]: a structured bucket identity → [`BucketKey`], decoded back and compared:
//!   the encoding is injective.

use std::sync::{Arc, LazyLock};

use arc_swap::ArcSwap;
use prost::Message;
use sha2::{Digest, Sha256};

use crate::bucket::{BucketKey, KeyValue, MAX_COMPONENT};
use crate::clock::ManualClock;
use crate::config::{Config, Defaults};
use crate::limiter::Algorithm;
use crate::plan::{HeaderOptions, PlanOptions};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse, rate_limit_response::Code};
use crate::service::{Call, Decider, RequestError};
use crate::sources::Snapshot;
use crate::store::{MemoryStore, StoreMetrics};
use crate::telemetry::metrics::{Metrics, RuleHandles};

/// The limits the `request` and `json` targets plan against: small, but with every matching
/// feature (exact values, wildcards, `share_threshold`, nesting, `replaces`, `unlimited`,
/// shadow and quota mode, metric keys from values) and every algorithm, overdraft included.
///
/// It is also a seed of the `config` target, so the file lives with the seeds.
pub const REQUEST_LIMITS: &str = include_str!("../fuzz/seeds/config/all-features.yaml");

/// Buckets the fuzzed memory store may hold: small, so eviction runs on most inputs.
const MAX_BUCKETS: usize = 128;

/// Fixed start time of the fuzzed store's clock (µs since the epoch): runs are reproducible.
const START_US: i64 = 1_750_000_000_000_000;

/// How far the clock moves between the two applications of one request.
const STEP_US: i64 = 400_000;

static LIMITS: LazyLock<Arc<Config>> = LazyLock::new(|| {
    let sources = [("fuzz-limits.yaml".to_owned(), REQUEST_LIMITS.to_owned())];
    match Config::from_sources(&sources, &Defaults::default()) {
        Ok(config) => Arc::new(config),
        Err(e) => panic!("REQUEST_LIMITS does not load: {e}"),
    }
});

/// Loads `data` as limits files: split at NUL bytes into at most four files (so duplicate
/// domains across files are reached), each read as UTF-8 with invalid bytes replaced (files
/// are read as text before parsing). Errors are expected; a panic is the bug.
pub fn config(data: &[u8]) {
    let sources: Vec<(String, String)> = data
        .split(|&b| b == 0)
        .take(4)
        .enumerate()
        .map(|(i, part)| {
            (
                format!("{i}.yaml"),
                String::from_utf8_lossy(part).into_owned(),
            )
        })
        .collect();
    match Config::from_sources(&sources, &Defaults::default()) {
        Ok(config) => {
            let listing = config.describe();
            for domain in config.domains() {
                assert!(!domain.name.is_empty(), "a loaded domain has no name");
                assert!(
                    listing.contains(&domain.name),
                    "describe() leaves out domain {}",
                    domain.name
                );
            }
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "the loader failed without an error");
            let _ = errors.to_string();
        }
    }
}

/// Decodes `data` as a protobuf `RateLimitRequest` (entries as bytes, as the gRPC service
/// decodes them) and answers it twice against [`REQUEST_LIMITS`].
pub fn request(data: &[u8]) {
    let Ok(request) = RateLimitRequest::decode(data) else {
        return;
    };
    let _ = answer(&request);
}

/// Parses `data` as a `POST /json` body and, when it parses, answers it and renders the
/// JSON response as the endpoint does.
pub fn json(data: &[u8]) {
    let Ok(request) = crate::http::parse_json_request(data) else {
        return;
    };
    for response in answer(&request) {
        let body = crate::http::response_json(&response).to_string();
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&body);
        assert!(
            parsed.is_ok_and(|v| v["overallCode"].is_string()),
            "the JSON response does not parse back: {body}"
        );
    }
}

/// Answers `request` twice on a fresh memory store (a moment apart, so the second answer sees
/// the first one's debits), checking each response's shape; the responses, when valid.
fn answer(request: &RateLimitRequest) -> Vec<RateLimitResponse> {
    let clock = Arc::new(ManualClock::new(START_US));
    // Fresh metrics per input: `detailed_metric` labels carry request values, so a shared
    // registry would grow for the whole run.
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(
        MemoryStore::new(clock.clone())
            .with_max_buckets(MAX_BUCKETS, Some(StoreMetrics::register(&metrics))),
    );
    let options = PlanOptions {
        headers: Some(HeaderOptions {
            ietf: true,
            ..HeaderOptions::default()
        }),
        dynamic_metadata: true,
        ..PlanOptions::default()
    };
    let decider = Decider::new(
        Arc::new(ArcSwap::from_pointee(Snapshot {
            config: LIMITS.clone(),
            rules: RuleHandles::default(),
        })),
        store.clone(),
        options,
        metrics,
    );
    // docs/algorithms.md: a check (every descriptor's hits_addend present and 0) never changes
    // anything, and a bucket that was never debited is not over.
    let check_only = request.descriptors.iter().all(|d| d.hits_addend == Some(0));
    let mut responses = Vec::new();
    for _ in 0..2 {
        let answered = match decider.in_flight().take() {
            Ok(place) => block_on(decider.decide(&place, Call::new(request))),
            Err(overloaded) => Err(RequestError::from(overloaded)),
        };
        match answered {
            Ok(response) => {
                check_response(request, &response);
                if check_only {
                    assert!(store.is_empty(), "a check stored a bucket");
                    assert_eq!(response.overall_code, Code::Ok as i32, "a check is over");
                }
                responses.push(response);
            }
            Err(RequestError::Invalid(_)) => return responses,
            Err(e) => panic!("the memory store failed: {e}"),
        }
        clock.advance(STEP_US);
    }
    let _ = decider.metrics().encode();
    responses
}

/// One status per descriptor, each OK or OVER_LIMIT, and the overall code OVER_LIMIT only
/// when some status is.
fn check_response(request: &RateLimitRequest, response: &RateLimitResponse) {
    assert_eq!(
        response.statuses.len(),
        request.descriptors.len(),
        "one status per descriptor"
    );
    let over = Code::OverLimit as i32;
    for status in &response.statuses {
        assert!(
            status.code == Code::Ok as i32 || status.code == over,
            "status code {} is neither OK nor OVER_LIMIT",
            status.code
        );
    }
    let any_over = response.statuses.iter().any(|s| s.code == over);
    // Not "exactly when": a quota-mode descriptor over its limit says OVER_LIMIT while the
    // request stays OK, as in the reference.
    assert!(
        response.overall_code != over || any_over,
        "overall code disagrees with the statuses"
    );
}

/// Runs a request-path future to completion on a current-thread runtime (the memory store
/// never waits, but the path is async).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: Option<tokio::runtime::Runtime> =
            tokio::runtime::Builder::new_current_thread().build().ok();
    }
    RUNTIME.with(|runtime| match runtime {
        Some(runtime) => runtime.block_on(future),
        None => panic!("cannot build a tokio runtime"),
    })
}

/// One entry value of a [`bucket_key`] input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FuzzValue {
    /// The request's value.
    Value(Vec<u8>),
    /// A `share_threshold` wildcard pattern.
    Shared(String),
}

/// Encodes a bucket identity, decodes the key back, and asserts it is the identity it came
/// from (long components compared as the hash the encoding promises). A decoder that
/// recovers every input proves the encoding injective: two distinct entry lists can never
/// share a bucket.
pub fn bucket_key(
    domain: &str,
    entries: &[(Vec<u8>, FuzzValue)],
    algorithm: u8,
    period_us: u64,
    override_rate: Option<u32>,
) {
    let algorithm = match algorithm % 3 {
        0 => Algorithm::TokenBucket,
        1 => Algorithm::FixedWindow,
        _ => Algorithm::SlidingWindow,
    };
    let key = BucketKey::new(
        domain,
        entries.iter().map(|(k, v)| {
            let value = match v {
                FuzzValue::Value(v) => KeyValue::Value(v.as_slice()),
                FuzzValue::Shared(p) => KeyValue::Shared(p.as_str()),
            };
            (k.as_slice(), value)
        }),
        algorithm,
        period_us,
    );
    let key = match override_rate {
        Some(rate) => key.with_override_rate(rate),
        None => key,
    };
    let decoded = match decode_key(key.as_bytes()) {
        Ok(decoded) => decoded,
        Err(reason) => panic!("{key:?} does not decode: {reason}"),
    };
    let expected = DecodedKey {
        domain: Component::of(domain.as_bytes()),
        entries: entries
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    FuzzValue::Value(v) => (false, Component::of(v)),
                    FuzzValue::Shared(p) => (true, Component::of(p.as_bytes())),
                };
                (Component::of(k), value)
            })
            .collect(),
        suffix: format!(
            "{}{}{}",
            match algorithm {
                Algorithm::TokenBucket => "tb",
                Algorithm::FixedWindow => "fw",
                Algorithm::SlidingWindow => "sw",
            },
            period_us / 1_000_000,
            override_rate.map(|r| format!("o{r}")).unwrap_or_default()
        ),
    };
    assert_eq!(decoded, expected, "{key:?} decodes to another identity");
}

/// A key component as the encoding keeps it: the raw bytes, or the hash of long ones.
#[derive(Debug, PartialEq, Eq)]
enum Component {
    Raw(Vec<u8>),
    Hashed(String),
}

impl Component {
    /// What the encoding promises to keep of `raw`: all of it, or its SHA-256 prefix.
    fn of(raw: &[u8]) -> Component {
        let escaped: usize = raw.iter().map(|&b| if is_plain(b) { 1 } else { 3 }).sum();
        if escaped > MAX_COMPONENT {
            let digest = Sha256::digest(raw);
            Component::Hashed(digest[..16].iter().map(|b| format!("{b:02X}")).collect())
        } else {
            Component::Raw(raw.to_vec())
        }
    }
}

/// A bucket key taken apart: domain, `(key, (shared, value))` entries, limit suffix.
#[derive(Debug, PartialEq, Eq)]
struct DecodedKey {
    domain: Component,
    entries: Vec<(Component, (bool, Component))>,
    suffix: String,
}

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Parses `<domain>(:<key>=[*]<value>)*|<suffix>`, strictly: every component is plain bytes
/// and `%XX` escapes (upper-case hex), or `#` and 32 hex digits.
fn decode_key(key: &[u8]) -> Result<DecodedKey, String> {
    let text = std::str::from_utf8(key).map_err(|e| e.to_string())?;
    let (body, suffix) = text.split_once('|').ok_or("no `|`")?;
    let mut parts = body.split(':');
    let domain = decode_component(parts.next().unwrap_or_default())?;
    let mut entries = Vec::new();
    for part in parts {
        let (k, v) = part.split_once('=').ok_or("an entry without `=`")?;
        let (shared, v) = match v.strip_prefix('*') {
            Some(pattern) => (true, pattern),
            None => (false, v),
        };
        entries.push((decode_component(k)?, (shared, decode_component(v)?)));
    }
    let suffix_ok = suffix.len() > 2
        && suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !suffix_ok {
        return Err(format!("bad suffix {suffix:?}"));
    }
    Ok(DecodedKey {
        domain,
        entries,
        suffix: suffix.to_owned(),
    })
}

fn decode_component(text: &str) -> Result<Component, String> {
    let upper_hex = |b: u8| b.is_ascii_digit() || (b'A'..=b'F').contains(&b);
    if let Some(hash) = text.strip_prefix('#') {
        if hash.len() != 32 || !hash.bytes().all(upper_hex) {
            return Err(format!("bad hash component {text:?}"));
        }
        return Ok(Component::Hashed(hash.to_owned()));
    }
    let bytes = text.as_bytes();
    let mut raw = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if bytes.len() > i + 2 && upper_hex(bytes[i + 1]) && upper_hex(bytes[i + 2]) => {
                let hex = &text[i + 1..i + 3];
                let byte = u8::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                if is_plain(byte) {
                    return Err(format!("plain byte escaped in {text:?}"));
                }
                raw.push(byte);
                i += 3;
            }
            b if is_plain(b) => {
                raw.push(b);
                i += 1;
            }
            b => return Err(format!("unescaped byte {b:#04x} in {text:?}")),
        }
    }
    Ok(Component::Raw(raw))
}

#[cfg(test)]
mod tests;
