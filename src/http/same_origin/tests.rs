use super::*;
use axum::http::HeaderValue;

fn headers(content_type: Option<&'static str>, origin: Option<&'static str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(t) = content_type {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
    }
    if let Some(o) = origin {
        headers.insert(header::ORIGIN, HeaderValue::from_static(o));
    }
    headers
}

fn guard(json_body: JsonBody, allowed: &[&str]) -> WriteGuard {
    WriteGuard {
        allowed_hosts: allowed.iter().map(|h| h.to_string()).collect(),
        json_body,
    }
}

/// Only JSON bodies pass where JSON is required (every console write, every browser
/// write), parameters and case aside.
#[test]
fn only_json_bodies() {
    for ok in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
    ] {
        assert_eq!(
            check(
                &headers(Some(ok), None),
                Some("h:1"),
                &guard(JsonBody::Always, &[])
            ),
            Ok(()),
            "{ok}"
        );
    }
    let own = Some("http://127.0.0.1:8080");
    for refused in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/jsonx"),
    ] {
        for (origin, json_body) in [
            (None, JsonBody::Always),
            (own, JsonBody::Always),
            (own, JsonBody::FromBrowsers),
        ] {
            let (status, message) = check(
                &headers(refused, origin),
                Some("127.0.0.1:8080"),
                &guard(json_body, &[]),
            )
            .unwrap_err();
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{refused:?}");
            assert!(message.contains("application/json"), "{message}");
        }
    }
}

/// Where JSON is required of browsers only (`/json`), a client without Origin is served
/// whatever it declares, or nothing, under any host name, as the reference serves it.
#[test]
fn any_body_without_origin_where_only_browsers_need_json() {
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/json"),
    ] {
        for host in [Some("127.0.0.1:8080"), Some("evil.example:8080"), None] {
            assert_eq!(
                check(
                    &headers(content_type, None),
                    host,
                    &guard(JsonBody::FromBrowsers, &[])
                ),
                Ok(()),
                "{content_type:?} {host:?}"
            );
        }
    }
    // A cross-site form with Origin is still refused.
    assert!(
        check(
            &headers(
                Some("application/x-www-form-urlencoded"),
                Some("http://evil.example")
            ),
            Some("127.0.0.1:8080"),
            &guard(JsonBody::FromBrowsers, &[])
        )
        .is_err()
    );
}

/// No Origin passes (not a browser); the page's own origin passes; any other is refused.
#[test]
fn only_the_admin_ports_own_origin() {
    let json = Some("application/json");
    assert_eq!(
        check(
            &headers(json, None),
            Some("127.0.0.1:8080"),
            &guard(JsonBody::Always, &[])
        ),
        Ok(())
    );
    for (origin, host) in [
        ("http://127.0.0.1:8080", "127.0.0.1:8080"),
        ("http://LOCALHOST:8080", "localhost:8080"),
        ("http://admin.internal", "admin.internal:80"),
        ("http://admin.internal:80", "admin.internal"),
    ] {
        assert!(same_origin(origin, host), "{origin} vs {host}");
    }
    for (origin, host) in [
        ("http://evil.example", "127.0.0.1:8080"),
        ("http://localhost:8081", "localhost:8080"),
        ("http://127.0.0.1", "127.0.0.1:8080"),
        ("https://admin.internal", "admin.internal:80"),
        ("null", "127.0.0.1:8080"),
        ("file://", "127.0.0.1:8080"),
    ] {
        assert!(!same_origin(origin, host), "{origin} vs {host}");
    }
    let (status, message) = check(
        &headers(json, Some("http://evil.example")),
        Some("127.0.0.1:8080"),
        &guard(JsonBody::FromBrowsers, &[]),
    )
    .unwrap_err();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(message.contains("http://evil.example"), "{message}");
    let (status, _) = check(
        &headers(json, Some("http://evil.example")),
        None,
        &guard(JsonBody::Always, &[]),
    )
    .unwrap_err();
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A browser's same-origin write is taken under an IP address, `localhost` or a listed
/// name, and refused under any other name (DNS rebinding); a client without Origin is
/// not affected by the name.
#[test]
fn browser_writes_only_under_names_that_cannot_be_rebound() {
    let json = Some("application/json");
    let allowed = guard(JsonBody::FromBrowsers, &["admin.internal"]);
    for host in [
        "127.0.0.1:8080",
        "10.1.2.3:8080",
        "[::1]:8080",
        "[fe80::1]",
        "localhost:8080",
        "LOCALHOST",
        "floodgate.localhost:8080",
        "admin.internal:8080",
        "Admin.Internal.",
    ] {
        let origin: &'static str = Box::leak(format!("http://{host}").into_boxed_str());
        assert_eq!(
            check(&headers(json, Some(origin)), Some(host), &allowed),
            Ok(()),
            "{host}"
        );
    }
    for host in [
        "evil.example:8080",
        "localhost.evil.example:8080",
        "127.0.0.1.nip.io:8080",
        "admin.internal.evil.example",
    ] {
        let origin: &'static str = Box::leak(format!("http://{host}").into_boxed_str());
        let (status, message) =
            check(&headers(json, Some(origin)), Some(host), &allowed).unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN, "{host}");
        assert!(message.contains("--admin-allowed-host"), "{message}");
        assert_eq!(
            check(
                &headers(json, None),
                Some(host),
                &guard(JsonBody::Always, &[])
            ),
            Ok(()),
            "{host}"
        );
    }
}
