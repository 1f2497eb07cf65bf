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
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    /// A sampled `traceparent` gives its trace id, span id and flag, marked remote.
    #[test]
    fn traceparent_is_read() {
        let map = headers(&[("traceparent", &format!("00-{TRACE}-{SPAN}-01"))]);
        let parent = remote_parent(&map).unwrap();
        assert_eq!(parent.trace_id().to_string(), TRACE);
        assert_eq!(parent.span_id().to_string(), SPAN);
        assert!(parent.is_sampled() && parent.is_remote());
    }

    /// A malformed `traceparent` gives way to B3.
    #[test]
    fn bad_traceparent_falls_back_to_b3() {
        let map = headers(&[
            ("traceparent", "00-zz-00-01"),
            ("b3", &format!("{TRACE}-{SPAN}-1")),
        ]);
        assert_eq!(remote_parent(&map).unwrap().span_id().to_string(), SPAN);
    }

    /// B3 single: sampling `1`/`d` samples, `0` and none do not, a parent id is allowed, a
    /// 64-bit trace id is widened, and decision-only or malformed headers name no parent.
    #[test]
    fn b3_single_forms() {
        assert!(
            b3_single(&format!("{TRACE}-{SPAN}-1"))
                .unwrap()
                .is_sampled()
        );
        assert!(
            b3_single(&format!("{TRACE}-{SPAN}-d"))
                .unwrap()
                .is_sampled()
        );
        assert!(
            !b3_single(&format!("{TRACE}-{SPAN}-0"))
                .unwrap()
                .is_sampled()
        );
        assert!(!b3_single(&format!("{TRACE}-{SPAN}")).unwrap().is_sampled());
        let with_parent = b3_single(&format!("{TRACE}-{SPAN}-1-0000000000000001")).unwrap();
        assert_eq!(with_parent.span_id().to_string(), SPAN);
        let short = b3_single(&format!("a3ce929d0e0e4736-{SPAN}-1")).unwrap();
        assert_eq!(
            short.trace_id().to_string(),
            "0000000000000000a3ce929d0e0e4736"
        );
        assert!(b3_single("1").is_none());
        assert!(b3_single(&format!("{TRACE}-{SPAN}-x")).is_none());
        assert!(b3_single(&format!("{}-{SPAN}-1", TRACE.to_uppercase())).is_none());
        assert!(b3_single(&format!("{}-{SPAN}-1", "0".repeat(32))).is_none());
    }

    /// B3 multi: sampled by `x-b3-sampled: 1` or `x-b3-flags: 1`, not when the decision is
    /// deferred; missing ids name no parent.
    #[test]
    fn b3_multi_forms() {
        let sampled = headers(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-sampled", "1"),
        ]);
        let parent = remote_parent(&sampled).unwrap();
        assert_eq!(parent.trace_id().to_string(), TRACE);
        assert!(parent.is_sampled());
        let debug = headers(&[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", SPAN),
            ("x-b3-flags", "1"),
        ]);
        assert!(remote_parent(&debug).unwrap().is_sampled());
        let deferred = headers(&[("x-b3-traceid", TRACE), ("x-b3-spanid", SPAN)]);
        assert!(!remote_parent(&deferred).unwrap().is_sampled());
        assert!(remote_parent(&headers(&[("x-b3-traceid", TRACE)])).is_none());
        assert!(remote_parent(&HeaderMap::new()).is_none());
    }
}
