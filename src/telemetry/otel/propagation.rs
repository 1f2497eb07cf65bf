//! The caller's trace context, from request headers: W3C `traceparent` (and `tracestate`),
//! else B3 single-header (`b3`), else B3 multi-header (`x-b3-traceid`, `x-b3-spanid`,
//! `x-b3-sampled`, `x-b3-flags`). Envoy's tracers send one of these on the rate-limit call:
//! OpenTelemetry's sends `traceparent`, Zipkin's sends B3. The reference reads the same three
//! (TraceContext, then B3) so floodgate's spans join the same traces.
//!
//! Pure functions of a header map; nothing here allocates unless a header is present.

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The caller's span, if its headers carry a valid one.
pub fn remote_parent(headers: &HeaderMap) -> Option<SpanContext> {
    w3c(headers)
        .or_else(|| {
            headers
                .get("b3")
                .and_then(|v| v.to_str().ok())
                .and_then(b3_single)
        })
        .or_else(|| b3_multi(headers))
}

/// `traceparent` / `tracestate`, through the SDK's W3C propagator.
fn w3c(headers: &HeaderMap) -> Option<SpanContext> {
    headers.get("traceparent")?;
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let span = cx.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// B3 single header: `{trace id}-{span id}[-{sampling}[-{parent span id}]]`. A header that
/// holds only a sampling decision (`0`, `1`, `d`) names no parent span: ignored.
pub fn b3_single(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let trace_id = b3_trace_id(parts.next()?)?;
    let span_id = b3_span_id(parts.next()?)?;
    let sampled = match parts.next() {
        None => false,
        Some("1" | "d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    Some(remote(trace_id, span_id, sampled))
}

/// B3 multi-header. `X-B3-Flags: 1` (debug) means sampled; an absent `X-B3-Sampled`
/// (a deferred decision) counts as not sampled, as the reference's B3 propagator does.
pub fn b3_multi(headers: &HeaderMap) -> Option<SpanContext> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let trace_id = b3_trace_id(get("x-b3-traceid")?)?;
    let span_id = b3_span_id(get("x-b3-spanid")?)?;
    let sampled =
        get("x-b3-flags") == Some("1") || matches!(get("x-b3-sampled"), Some("1" | "true" | "d"));
    Some(remote(trace_id, span_id, sampled))
}

fn remote(trace_id: TraceId, span_id: SpanId, sampled: bool) -> SpanContext {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
}

/// A B3 trace id: 32 or 16 lower-case hex digits (16 are the low half), not all zero.
fn b3_trace_id(text: &str) -> Option<TraceId> {
    let text = text.trim();
    if (text.len() != 32 && text.len() != 16) || !is_lower_hex(text) {
        return None;
    }
    let id = TraceId::from_hex(text).ok()?;
    (id != TraceId::INVALID).then_some(id)
}

/// A B3 span id: 16 lower-case hex digits, not all zero.
fn b3_span_id(text: &str) -> Option<SpanId> {
    let text = text.trim();
    if text.len() != 16 || !is_lower_hex(text) {
        return None;
    }
    let id = SpanId::from_hex(text).ok()?;
    (id != SpanId::INVALID).then_some(id)
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Header lookup for the SDK's propagator.
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

#[cfg(test)]
mod tests;
