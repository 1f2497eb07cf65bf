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
