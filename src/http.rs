//! Admin HTTP endpoints, as the reference server serves them on port 8080.
//!
//! - `GET /healthcheck`: `200 OK` while serving; `503 NOT_SERVING: <why>` once shutdown has
//!   begun, while Redis is unusable under failure policy `error`, or while no limits are loaded
//!   (no xDS configuration yet, or no domain under `--health-requires-limits`).
//! - `POST /json`: ShouldRateLimit with a JSON body in protobuf's JSON mapping (field names in
//!   `snake_case` or `lowerCamelCase`); answers the JSON response with `200` for OK, `429`
//!   for OVER_LIMIT, `400` for a malformed body or invalid request, `503` if the store failed
//!   or `--max-in-flight` requests are already being answered.
//!   Turned off by `--json-endpoint=false` (then 404).
//! - `GET /metrics`: Prometheus/OpenMetrics text (see [`crate::telemetry::metrics`]).
//! - `GET /rlconfig`: the limits in force, one line per limit.
//! - the operator console ([`crate::console`]): `GET /` (the dashboard), `GET /console/state`,
//!   `POST /buckets/get`, `POST /buckets/reset`, `POST /buckets/set`.
//!
//! No write (`POST /json`, `POST /buckets/*`) may come from another site's page (`Origin`,
//! else `403`), nor from a browser that reached the port under a host name it could have
//! rebound (else `403`); a browser's write (one with `Origin`) and every console write must be
//! `Content-Type: application/json` (else `415`), while `/json` serves a client that sends no
//! `Origin` whatever its `Content-Type`, as the reference does: `http::same_origin`.
//!
//! [`debug_router`] serves the reference's debug port (`--debug-addr`, its
//! `DEBUG_HOST`/`DEBUG_PORT`); [`reference_prometheus_router`] serves the reference's
//! Prometheus series on their own port (`--reference-prometheus-addr`, its
//! `PROMETHEUS_ADDR`).

mod same_origin;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::console::{ConsoleOptions, ConsoleState};
use crate::proto::common::{
    RateLimitDescriptor,
    rate_limit_descriptor::{Entry, RateLimitOverride},
};
use crate::proto::rls::{RateLimitRequest, RateLimitResponse, rate_limit_response};
use crate::service::{Call, Decider, EntryPoint, RequestError};
use crate::telemetry::statsd::Stats;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct AdminState {
    /// The request path shared with gRPC.
    pub decider: Arc<Decider>,
    /// False once shutdown has begun.
    pub serving: Arc<Readiness>,
    /// Whether `POST /json` is served (`--json-endpoint`); when not, it answers 404.
    pub json_endpoint: bool,
    /// The operator console's access rules and store health.
    pub console: ConsoleOptions,
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    // Every write: from a browser, only from this origin, as JSON, and only under a name
    // that cannot be rebound; the console's take JSON from every client, `/json` any body
    // from a client that sends no Origin, as the reference serves it.
    let guard = |json_body| {
        axum::middleware::from_fn_with_state(
            same_origin::WriteGuard {
                allowed_hosts: Arc::clone(&state.console.allowed_hosts),
                json_body,
            },
            same_origin::refuse_cross_site_writes,
        )
    };
    let router = Router::new().route("/healthcheck", get(healthcheck));
    // Off, /json is not routed at all: a 404 tells a client it does not exist here.
    let router = if state.json_endpoint {
        router.route("/json", post(json_should_rate_limit))
    } else {
        router
    };
    let console = crate::console::router(ConsoleState {
        decider: state.decider.clone(),
        options: state.console.clone(),
    });
    let console = console.layer(guard(same_origin::JsonBody::Always));
    let router = router
        .route("/metrics", get(metrics))
        .route("/rlconfig", get(rlconfig))
        .layer(guard(same_origin::JsonBody::FromBrowsers));
    router.with_state(state).merge(console)
}

/// The reference's Prometheus series (`USE_PROMETHEUS`) at `path`, and nothing else, as
/// the reference's sink serves them on their own port: `response_time_ms` is
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`.
pub fn reference_prometheus_router(
    stats: Arc<Stats>,
    path: &str,
    response_time_ms: bool,
) -> Router {
    Router::new().route(
        path,
        get(move || {
            let stats = Arc::clone(&stats);
            async move {
                (
                    // What client_golang's promhttp handler serves unless OpenMetrics is
                    // enabled (the reference's is not): counters keep their names, no
                    // `_total` added.
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    stats.encode_prometheus(response_time_ms),
                )
            }
        }),
    )
}

/// The debug port's endpoints and their help lines, sorted by path: what `GET /` lists.
/// The help texts are the reference's own.
const DEBUG_ENDPOINTS: [(&str, &str); 2] = [
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

/// The reference's debug port (`DEBUG_HOST`:`DEBUG_PORT`): `/rlconfig` in its text format
/// ([`crate::config::Config::dump_reference`]), `/stats`, the current value of every
/// reference stat as `name: value` lines ([`Stats::dump`]), and at `/` (and any other path,
/// as the reference's catch-all `/` handler answers) the index of those endpoints, one
/// `path: help` line each, sorted by path, as the reference lists its own. The reference's
/// Go profiling endpoints (`/debug/pprof/…`) have no counterpart here, so they are not listed.
pub fn debug_router(decider: Arc<Decider>) -> Router {
    let config = Arc::clone(&decider);
    Router::new()
        .route("/", get(debug_index))
        .fallback(debug_index)
        .route(
            "/rlconfig",
            get(move || {
                let decider = Arc::clone(&config);
                async move { text(decider.config().dump_reference()) }
            }),
        )
        .route(
            "/stats",
            get(move || {
                let decider = Arc::clone(&decider);
                async move {
                    text(
                        decider
                            .metrics()
                            .reference_stats()
                            .map(|stats| stats.dump())
                            .unwrap_or_default(),
                    )
                }
            }),
        )
}

async fn debug_index() -> Response {
    let index: String = DEBUG_ENDPOINTS
        .iter()
        .map(|(path, help)| format!("{path}: {help}\n"))
        .collect();
    text(index)
}

fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn healthcheck(State(state): State<AdminState>) -> Response {
    match state.serving.get() {
        Ok(()) => (StatusCode::OK, "OK\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("NOT_SERVING: {}\n", why.reason()),
        )
            .into_response(),
    }
}

/// Why the server is not ready (gRPC health NOT_SERVING, `/healthcheck` 503).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NotReady {
    /// The store is unavailable under failure policy `error`.
    Store = 1,
    /// No limits are loaded: a first xDS configuration has not arrived, or no domain is
    /// loaded under `--health-requires-limits`.
    Limits = 2,
    /// Shutdown has begun.
    ShuttingDown = 3,
}

impl NotReady {
    /// The reason, as `/healthcheck` says it.
    pub fn reason(self) -> &'static str {
        match self {
            NotReady::Store => "the store is unavailable (failure policy error)",
            NotReady::Limits => {
                "no limits loaded yet (no xDS configuration received, or no domain loaded \
                 under --health-requires-limits)"
            }
            NotReady::ShuttingDown => "shutting down",
        }
    }
}

/// Whether the server is ready, and why not: written by the health mirror, read by
/// `/healthcheck`.
#[derive(Debug)]
pub struct Readiness(AtomicU8);

impl Readiness {
    /// Readiness starting at `state`.
    pub fn new(state: Result<(), NotReady>) -> Readiness {
        Readiness(AtomicU8::new(Readiness::code(state)))
    }

    /// Records `state`.
    pub fn set(&self, state: Result<(), NotReady>) {
        self.0.store(Readiness::code(state), Ordering::SeqCst);
    }

    /// The state last recorded.
    pub fn get(&self) -> Result<(), NotReady> {
        match self.0.load(Ordering::SeqCst) {
            0 => Ok(()),
            1 => Err(NotReady::Store),
            2 => Err(NotReady::Limits),
            _ => Err(NotReady::ShuttingDown),
        }
    }

    fn code(state: Result<(), NotReady>) -> u8 {
        match state {
            Ok(()) => 0,
            Err(why) => why as u8,
        }
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.decider.metrics().encode(),
    )
        .into_response()
}

async fn rlconfig(State(state): State<AdminState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        state.decider.config().describe(),
    )
        .into_response()
}

async fn json_should_rate_limit(
    State(state): State<AdminState>,
    mut request: axum::extract::Request,
) -> Response {
    // Moved out, not copied (an empty map does not allocate): only a traced request reads
    // them, for the caller's trace context.
    let headers = std::mem::take(request.headers_mut());
    let body = match Bytes::from_request(request, &state).await {
        Ok(body) => body,
        Err(rejection) => return rejection.into_response(),
    };
    let request = match parse_json_request(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {e}")),
    };
    let answered = match state.decider.in_flight().take() {
        Ok(place) => {
            let call = Call::with_headers(&request, EntryPoint::Json, &headers);
            state.decider.decide(&place, call).await
        }
        Err(overloaded) => Err(RequestError::from(overloaded)),
    };
    match answered {
        Ok(response) => {
            let status = if response.overall_code == rate_limit_response::Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(response_json(&response))).into_response()
        }
        Err(RequestError::Invalid(e)) => error(StatusCode::BAD_REQUEST, &e.0),
        Err(e @ (RequestError::Store(_) | RequestError::Overloaded { .. })) => {
            error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// Parses a `POST /json` body (pure: the fuzz target `json` calls it directly); an error is
/// the client's, answered `400`.
pub(crate) fn parse_json_request(body: &[u8]) -> Result<RateLimitRequest, serde_json::Error> {
    serde_json::from_slice::<JsonRequest>(body).map(JsonRequest::into_proto)
}

/// `RateLimitRequest` in protobuf's JSON mapping.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    /// protobuf's JSON mapping writes 64-bit integers as strings; accept both.
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<JsonU64>,
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requestsPerUnit")]
    requests_per_unit: u32,
    unit: JsonUnit,
}

/// A uint64 as protobuf JSON allows it: a number or a decimal string. Anything else is a
/// body error (400), never a guessed value.
#[derive(Deserialize)]
#[serde(try_from = "JsonU64Repr")]
struct JsonU64(u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonU64Repr {
    Number(u64),
    Text(String),
}

impl TryFrom<JsonU64Repr> for JsonU64 {
    type Error = String;

    fn try_from(repr: JsonU64Repr) -> Result<JsonU64, String> {
        match repr {
            JsonU64Repr::Number(n) => Ok(JsonU64(n)),
            JsonU64Repr::Text(text) => text
                .parse()
                .map(JsonU64)
                .map_err(|_| format!("hits_addend: '{text}' is not an unsigned 64-bit integer")),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonUnit {
    Number(i32),
    Name(String),
}

impl JsonRequest {
    fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain,
            hits_addend: self.hits_addend,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key.into(),
                            value: e.value.into(),
                        })
                        .collect(),
                    limit: d.limit.map(|l| RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: match l.unit {
                            JsonUnit::Number(n) => n,
                            // An unknown name maps to UNKNOWN (0), which planning rejects.
                            JsonUnit::Name(name) => {
                                crate::proto::envoy::r#type::v3::RateLimitUnit::from_str_name(&name)
                                    .map_or(0, |u| u as i32)
                            }
                        },
                    }),
                    hits_addend: d.hits_addend.map(|h| h.0),
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
        }
    }
}

/// The response in protobuf's JSON mapping (lowerCamelCase, defaults omitted).
pub(crate) fn response_json(response: &RateLimitResponse) -> Value {
    let code_name = |code: i32| {
        rate_limit_response::Code::try_from(code)
            .map_or("UNKNOWN", |c| c.as_str_name())
            .to_string()
    };
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = Map::new();
            status.insert("code".into(), code_name(s.code).into());
            if let Some(limit) = &s.current_limit {
                let mut l = Map::new();
                if !limit.name.is_empty() {
                    l.insert("name".into(), limit.name.clone().into());
                }
                l.insert("requestsPerUnit".into(), limit.requests_per_unit.into());
                l.insert(
                    "unit".into(),
                    rate_limit_response::rate_limit::Unit::try_from(limit.unit)
                        .map_or("UNKNOWN", |u| u.as_str_name())
                        .into(),
                );
                status.insert("currentLimit".into(), l.into());
            }
            if s.limit_remaining != 0 {
                status.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                status.insert(
                    "durationUntilReset".into(),
                    format!("{}s", d.seconds).into(),
                );
            }
            Value::Object(status)
        })
        .collect();
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        code_name(response.overall_code).into(),
    );
    out.insert("statuses".into(), statuses.into());
    if !response.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            response
                .response_headers_to_add
                .iter()
                .map(|h| json!({ "key": h.key, "value": h.value }))
                .collect::<Vec<_>>()
                .into(),
        );
    }
    Value::Object(out)
}
