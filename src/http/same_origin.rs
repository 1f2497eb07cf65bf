//! Cross-site writes refused on the admin port: every state-changing request (`POST /json`,
//! the console's `POST /buckets/*`) may come from a browser only from the admin port's own
//! origin, and its body must be declared `Content-Type: application/json` wherever a browser
//! could be sending it.
//!
//! Why: the admin port is reached through `kubectl port-forward` from an operator's browser.
//! A page from anywhere can make that browser send a "simple" cross-origin POST (a form or a
//! `fetch` with `Content-Type: text/plain`) to `localhost:8080` without any preflight, so a
//! body that parses as JSON whatever its type would let that page drain or refill buckets.
//! Browsers always send `Origin` on such a POST, and the `Origin` check refuses it; requiring
//! `application/json` of every write that carries `Origin` makes a browser's write
//! non-simple besides (a browser must preflight it, and nothing here answers CORS
//! preflights). A request without `Origin` comes from a non-browser client (the CLI, curl,
//! Envoy's Lua filters, the reference's own tests): on `/json` it is served whatever its
//! `Content-Type`, as the reference serves it (`curl -d` declares a form, the reference's
//! `TestJsonHandler` declares nothing); the console's writes, which only floodgate's page and
//! CLI send, take JSON from every client ([`JsonBody`]).
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

/// Which writes must declare a JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JsonBody {
    /// Every write: the console's, which only floodgate's own page and CLI send.
    Always,
    /// A browser's writes, those that carry `Origin`: `/json`, which the reference serves
    /// whatever the `Content-Type`, to clients that send none.
    FromBrowsers,
}

/// What the guard of a group of routes knows.
#[derive(Clone, Debug)]
pub(crate) struct WriteGuard {
    /// Host names a browser's write may be sent to besides IP addresses and `localhost`
    /// (`--admin-allowed-host`, lowercase).
    pub(crate) allowed_hosts: Arc<[String]>,
    /// Which of its writes must declare a JSON body.
    pub(crate) json_body: JsonBody,
}

/// Passes reads (GET, HEAD, OPTIONS) through; answers a write `415` unless its body is
/// declared JSON where the guard asks for it, and `403` when its `Origin` is another site's
/// or, for a browser's write, when it was sent to a host name outside the allowed hosts that
/// could be rebound.
pub(crate) async fn refuse_cross_site_writes(
    State(guard): State<WriteGuard>,
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
    if let Err((status, message)) = check(request.headers(), host.as_deref(), &guard) {
        return (status, axum::Json(json!({ "error": message }))).into_response();
    }
    next.run(request).await
}

/// The verdict on a write's headers, `host` being the authority it was sent to.
fn check(
    headers: &HeaderMap,
    host: Option<&str>,
    guard: &WriteGuard,
) -> Result<(), (StatusCode, String)> {
    let from_browser = headers.contains_key(header::ORIGIN);
    let content_type = header_text(headers, header::CONTENT_TYPE);
    let json_required = from_browser || guard.json_body == JsonBody::Always;
    if json_required && !content_type.is_some_and(is_json) {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type must be application/json (got {}): {}",
                content_type.map_or_else(|| "none".to_owned(), |t| format!("'{t}'")),
                if from_browser {
                    "a browser's write (it sent Origin) must be JSON, so that no web page can \
                     send one cross-site"
                } else {
                    "this endpoint takes only JSON bodies"
                }
            ),
        ));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    match host {
        Some(host) if same_origin(origin, host) => {
            if cannot_be_rebound(host, &guard.allowed_hosts) {
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
mod tests;
