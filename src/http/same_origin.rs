//! Cross-site writes refused on the admin port: every state-changing request (`POST /json`,
//! the console's `POST /buckets/*`) must be `Content-Type: application/json` and, when it
//! carries an `Origin`, come from the admin port's own origin.
//!
//! Why: the admin port is reached through `kubectl port-forward` from an operator's browser.
//! A page from anywhere can make that browser send a "simple" cross-origin POST (a form or a
//! `fetch` with `Content-Type: text/plain`) to `localhost:8080` without any preflight, so a
//! body that parses as JSON whatever its type would let that page drain or refill buckets.
//! Requiring `application/json` makes such a request non-simple (a browser must preflight it,
//! and nothing here answers CORS preflights), and the `Origin` check refuses a browser that
//! sends it anyway. A request without `Origin` comes from a non-browser client (the CLI,
//! curl, Envoy's Lua filters): browsers always send it on a cross-origin POST.
//!
//! Same-origin means the `Origin`'s `host[:port]` is the request's `Host` (HTTP/2:
//! `:authority`), a default port written or not.
//!
//! Same-origin is not enough against DNS rebinding: a page at `http://evil.example:8080`
//! whose name its owner re-points at 127.0.0.1 sends its writes with `Origin` and `Host` both
//! `evil.example:8080`, and the browser believes it is talking to its own site. So a write
//! that carries `Origin` (a browser's) is taken only under a host name nobody can rebind: an
//! IP address, `localhost` or a `*.localhost` name (browsers resolve those to loopback
//! themselves), or a name the operator listed (`--admin-allowed-host`, for an ingress in front
//! of the port). The same defence as webpack-dev-server's `allowedHosts` and Jupyter's host
//! check. docs/security.md describes the model.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Passes reads (GET, HEAD, OPTIONS) through; answers any other request `415` unless its body
/// is declared JSON, and `403` when its `Origin` is another site's or, for a browser's write,
/// when it was sent to a host name outside `allowed_hosts` that could be rebound.
pub(crate) async fn refuse_cross_site_writes(
    State(allowed_hosts): State<Arc<[String]>>,
    request: Request,
    next: Next,
) -> Response {
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return next.run(request).await;
    }
    let host = request
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| header_text(request.headers(), header::HOST).map(str::to_owned));
    if let Err((status, message)) = check(request.headers(), host.as_deref(), &allowed_hosts) {
        return (status, axum::Json(json!({ "error": message }))).into_response();
    }
    next.run(request).await
}

/// The verdict on a write's headers, `host` being the authority it was sent to.
fn check(
    headers: &HeaderMap,
    host: Option<&str>,
    allowed_hosts: &[String],
) -> Result<(), (StatusCode, String)> {
    let content_type = header_text(headers, header::CONTENT_TYPE);
    if !content_type.is_some_and(is_json) {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type must be application/json (got {}): the admin port takes only \
                 JSON bodies, so that no web page can send one cross-site",
                content_type.map_or_else(|| "none".to_owned(), |t| format!("'{t}'"))
            ),
        ));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    match host {
        Some(host) if same_origin(origin, host) => {
            if cannot_be_rebound(host, allowed_hosts) {
                return Ok(());
            }
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "browser write refused: this admin port was reached as '{host}', a name \
                     that could be pointed at it by DNS rebinding; use its IP address or \
                     localhost, or list the name with --admin-allowed-host"
                ),
            ));
        }
        _ => {}
    }
    Err((
        StatusCode::FORBIDDEN,
        format!(
            "cross-origin request refused: Origin '{origin}' is not this admin port ({}); \
             use the console page served here, or a client that sends no Origin",
            host.unwrap_or("no Host header")
        ),
    ))
}

/// Whether `authority` (`host[:port]`) names the admin port by an IP address, `localhost`,
/// a `*.localhost` name, or one of `allowed_hosts` (lowercase).
fn cannot_be_rebound(authority: &str, allowed_hosts: &[String]) -> bool {
    let host = match authority.strip_prefix('[') {
        // `[v6]:port` or `[v6]`
        Some(rest) => rest.split_once(']').map_or(rest, |(ip, _)| ip),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host.parse::<IpAddr>().is_ok()
        || host == "localhost"
        || host.ends_with(".localhost")
        || allowed_hosts.contains(&host)
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// `application/json`, with or without parameters (`; charset=utf-8`), in any case.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Whether `origin` (`scheme://host[:port]`, or `null`) names the authority `host`. A
/// scheme's default port may be written on one side and left out on the other.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false; // `null` (a sandboxed frame, a file: page) or garbage
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let bare = |a: &str| {
        let a = a.to_ascii_lowercase();
        match a.strip_suffix(default_port) {
            Some(without) => without.to_owned(),
            None => a,
        }
    };
    !authority.is_empty() && bare(authority) == bare(host)
}

#[cfg(test)]
mod tests {
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

    /// Only JSON bodies pass, parameters and case aside.
    #[test]
    fn only_json_bodies() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
        ] {
            assert_eq!(
                check(&headers(Some(ok), None), Some("h:1"), &[]),
                Ok(()),
                "{ok}"
            );
        }
        for refused in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonx"),
        ] {
            let (status, message) = check(&headers(refused, None), Some("h:1"), &[]).unwrap_err();
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{refused:?}");
            assert!(message.contains("application/json"), "{message}");
        }
    }

    /// No Origin passes (not a browser); the page's own origin passes; any other is refused.
    #[test]
    fn only_the_admin_ports_own_origin() {
        let json = Some("application/json");
        assert_eq!(
            check(&headers(json, None), Some("127.0.0.1:8080"), &[]),
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
            &[],
        )
        .unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(message.contains("http://evil.example"), "{message}");
        let (status, _) =
            check(&headers(json, Some("http://evil.example")), None, &[]).unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
    }

    /// A browser's same-origin write is taken under an IP address, `localhost` or a listed
    /// name, and refused under any other name (DNS rebinding); a client without Origin is
    /// not affected by the name.
    #[test]
    fn browser_writes_only_under_names_that_cannot_be_rebound() {
        let json = Some("application/json");
        let allowed = ["admin.internal".to_owned()];
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
                check(&headers(json, None), Some(host), &[]),
                Ok(()),
                "{host}"
            );
        }
    }
}
