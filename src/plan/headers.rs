//! What a response carries besides its statuses: rate-limit headers for the client and
//! dynamic metadata for Envoy. Pure functions of what [`crate::plan::Plan::respond`] decided.
//!
//! Headers (all off unless [`HeaderOptions`] is given, as in the reference), from the most
//! constrained status — the one Envoy itself would pick: on OVER_LIMIT the binding over-limit
//! status (the one that frees last), otherwise the lowest `limit_remaining` among statuses
//! with a `current_limit` (the first on ties):
//!
//! ```text
//! RateLimit-Limit: 10          its current_limit.requests_per_unit (the reference's value)
//! RateLimit-Remaining: 3       its limit_remaining
//! RateLimit-Reset: 42          its duration_until_reset, whole seconds rounded up
//! Retry-After: 7               OVER_LIMIT only: exact time until the request could pass,
//!                              rounded up; the reset when the cost can never pass
//! RateLimit-Policy: "daily";q=10;w=86400   with --ietf-headers (draft-ietf-httpapi-
//! RateLimit: "daily";r=3;t=42              ratelimit-headers structured fields)
//! ```
//!
//! Every number is the status's own (`q` its `current_limit.requests_per_unit`, `w` the
//! length of its unit), so these headers say what Envoy's `x-ratelimit-*` say: the quota
//! as `plan::stated` states it (a burst, a `unit_multiplier`).
//!
//! Dynamic metadata (with `--response-dynamic-metadata`, the reference's
//! `RESPONSE_DYNAMIC_METADATA`), keys as the reference writes them:
//! `{domain, descriptors: [{entries: ["key=value", …], limit (an override, as text),
//! hitsAddend (its own)}, …], hitsAddend (when not 0), metadata}`, where `metadata` merges the
//! `metadata:` of the rules of every descriptor answered OK (the first value of a key wins).

use std::collections::BTreeMap;

use prost_types::{ListValue, Struct, Value, value::Kind};

use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::r#type::v3::RateLimitUnit;
use crate::proto::rls::RateLimitRequest;

/// Names of the draft-03 headers, and whether to add the IETF structured fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderOptions {
    /// The limit header (reference default `RateLimit-Limit`).
    pub limit: String,
    /// The remaining header (reference default `RateLimit-Remaining`).
    pub remaining: String,
    /// The reset header (reference default `RateLimit-Reset`).
    pub reset: String,
    /// Also add the IETF `RateLimit-Policy` and `RateLimit` structured fields.
    pub ietf: bool,
}

impl Default for HeaderOptions {
    /// The reference's header names, no IETF fields.
    fn default() -> Self {
        HeaderOptions {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
            ietf: false,
        }
    }
}

/// The limit a descriptor's status reports, as the headers need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    /// The status is OVER_LIMIT.
    pub over: bool,
    /// `current_limit.requests_per_unit`: the stated quota.
    pub requests_per_unit: u32,
    /// `limit_remaining`.
    pub remaining: u32,
    /// `duration_until_reset` in whole seconds (already rounded up).
    pub reset_s: u64,
    /// When over: time until this request could pass; `None` if it never can.
    pub retry_after_us: Option<u64>,
    /// The stated window in seconds: the length of `current_limit.unit`.
    pub window_s: u64,
    /// The limit's name (may be empty).
    pub name: String,
}

/// The headers for a response whose limited statuses are `reported` (request order).
pub fn headers(options: &HeaderOptions, reported: &[Reported], over: bool) -> Vec<HeaderValue> {
    let Some(chosen) = most_constrained(reported, over) else {
        return Vec::new();
    };
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        // Envoy reads `value`, never `raw_value`.
        raw_value: Vec::new(),
    };
    let mut out = vec![
        header(&options.limit, chosen.requests_per_unit.to_string()),
        header(&options.remaining, chosen.remaining.to_string()),
        header(&options.reset, chosen.reset_s.to_string()),
    ];
    if over {
        let retry_s = chosen
            .retry_after_us
            .map_or(chosen.reset_s, |us| us.div_ceil(1_000_000));
        out.push(header("Retry-After", retry_s.to_string()));
    }
    if options.ietf {
        let name = if chosen.name.is_empty() {
            "default"
        } else {
            chosen.name.as_str()
        };
        let name = sf_string(name);
        out.push(header(
            "RateLimit-Policy",
            format!(
                "{name};q={};w={}",
                chosen.requests_per_unit, chosen.window_s
            ),
        ));
        out.push(header(
            "RateLimit",
            format!("{name};r={};t={}", chosen.remaining, chosen.reset_s),
        ));
    }
    out
}

/// The status Envoy would build its headers from: on OVER_LIMIT the over status that frees
/// last (never = last of all), else the lowest remaining (first on ties).
pub fn most_constrained(reported: &[Reported], over: bool) -> Option<&Reported> {
    if over {
        let mut best: Option<&Reported> = None;
        for r in reported.iter().filter(|r| r.over) {
            let frees = |r: &Reported| r.retry_after_us.unwrap_or(u64::MAX);
            if best.is_none_or(|b| frees(r) > frees(b)) {
                best = Some(r);
            }
        }
        return best;
    }
    let mut best: Option<&Reported> = None;
    for r in reported {
        if best.is_none_or(|b| r.remaining < b.remaining) {
            best = Some(r);
        }
    }
    best
}

/// An RFC 8941 sf-string: quoted, with `"` and `\` escaped and non-printable bytes dropped.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The request as the reference reports it in dynamic metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSummary {
    domain: String,
    descriptors: Vec<DescriptorSummary>,
    hits_addend: u32,
}

/// One descriptor as the reference reports it in dynamic metadata.
#[derive(Clone, Debug, PartialEq)]
struct DescriptorSummary {
    /// Its entries as `key=value` (bytes that are not UTF-8 replaced).
    entries: Vec<String>,
    /// Its `limit` override in protobuf text form, when it has one.
    limit: Option<String>,
    /// Its own `hits_addend`, when present.
    hits_addend: Option<u64>,
}

impl RequestSummary {
    /// Summarises `request`.
    pub fn of(request: &RateLimitRequest) -> RequestSummary {
        RequestSummary {
            domain: request.domain.clone(),
            descriptors: request
                .descriptors
                .iter()
                .map(|d| DescriptorSummary {
                    entries: d
                        .entries
                        .iter()
                        .map(|e| {
                            format!(
                                "{}={}",
                                String::from_utf8_lossy(&e.key),
                                String::from_utf8_lossy(&e.value)
                            )
                        })
                        .collect(),
                    limit: d
                        .limit
                        .as_ref()
                        .map(|limit| override_text(limit.requests_per_unit, limit.unit)),
                    hits_addend: d.hits_addend,
                })
                .collect(),
            hits_addend: request.hits_addend,
        }
    }

    /// The metadata struct, as the reference builds it:
    /// `{domain, descriptors: [{entries: ["k=v", …], limit?, hitsAddend?}, …], hitsAddend?,
    /// metadata?}`, where `metadata` is the `metadata:` of the rules of the descriptors
    /// answered OK, merged (`admitted`, already merged by the caller; omitted when empty).
    pub fn to_struct(&self, admitted: BTreeMap<String, Value>) -> Struct {
        let list = |values: Vec<Value>| Value {
            kind: Some(Kind::ListValue(ListValue { values })),
        };
        let string = |s: &str| Value {
            kind: Some(Kind::StringValue(s.to_string())),
        };
        let number = |n: f64| Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let mut fields = BTreeMap::new();
        fields.insert("domain".to_string(), string(&self.domain));
        let descriptors = self
            .descriptors
            .iter()
            .map(|descriptor| {
                let mut fields = BTreeMap::new();
                fields.insert(
                    "entries".to_string(),
                    list(descriptor.entries.iter().map(|e| string(e)).collect()),
                );
                if let Some(limit) = &descriptor.limit {
                    fields.insert("limit".to_string(), string(limit));
                }
                if let Some(hits) = descriptor.hits_addend {
                    fields.insert("hitsAddend".to_string(), number(hits as f64));
                }
                Value {
                    kind: Some(Kind::StructValue(Struct { fields })),
                }
            })
            .collect();
        fields.insert("descriptors".to_string(), list(descriptors));
        if self.hits_addend != 0 {
            fields.insert(
                "hitsAddend".to_string(),
                number(f64::from(self.hits_addend)),
            );
        }
        if !admitted.is_empty() {
            fields.insert(
                "metadata".to_string(),
                Value {
                    kind: Some(Kind::StructValue(Struct { fields: admitted })),
                },
            );
        }
        Struct { fields }
    }
}

/// A descriptor `limit` override as protobuf text (`requests_per_unit:10 unit:SECOND`), the
/// form the reference reports; fields at their zero value are left out, as there.
fn override_text(requests_per_unit: u32, unit: i32) -> String {
    let mut parts = Vec::with_capacity(2);
    if requests_per_unit != 0 {
        parts.push(format!("requests_per_unit:{requests_per_unit}"));
    }
    if unit != 0 {
        let name = RateLimitUnit::try_from(unit)
            .map(|u| u.as_str_name().to_string())
            .unwrap_or_else(|_| unit.to_string());
        parts.push(format!("unit:{name}"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests;
