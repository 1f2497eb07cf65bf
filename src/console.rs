//! The operator console on the admin port: bucket inspection, reset and set-remaining, and
//! a live dashboard.
//!
//! Place in the flow: beside the request path, served by [`crate::http`]. An inspection is
//! the [`Plan`] of one descriptor with cost 0 (`hits_addend` present and 0: "check only"),
//! applied to the store: every store evaluates a check without changing state, so it debits
//! nothing, and no metric counts it. Reset and set-remaining are one
//! [`Store::set`] each: every bucket replaced, in one atomic step of its store, by a full
//! bucket debited by the difference to the capacity (nothing, for a reset: the state is
//! deleted, and an absent bucket is a full one). The state is computed by the code that owns
//! the algorithm (the limiter, or the Lua script agreeing with it), and a request landing at
//! the same moment is counted before the set (and overwritten) or after it, never between a
//! reset and a debit.
//!
//! The dashboard (`GET /`) is one embedded page that polls `GET /console/state`: the limits
//! in force, each rule's counters (read from [`crate::telemetry::metrics`] only when polled: the page
//! derives rates from successive reads, so the request path pays nothing when no one
//! watches), the store's health and the last limits loads.
//!
//! Bounded (docs/console.md): the calls that reach the store hold one of [`STORE_CALLS`]
//! places, so a flood of them cannot take Redis from the request path.
//!
//! Access rules (docs/security.md): mutations need the bearer token ([`token`]); reads need
//! it too whenever one is configured (or with `--admin-read-requires-token`); every mutation
//! is logged with the peer. Writes are JSON from the admin port's own origin only
//! (`crate::http`'s cross-site guard).

use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::bucket::BucketOp;
use crate::config::algorithm_name;
use crate::limiter::{Algorithm, LimitParams};
use crate::plan::Plan;
use crate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use crate::proto::rls::RateLimitRequest;
use crate::service::Decider;
use crate::sources::LoadHistory;
use crate::store::{ResilientStore, Store, StoreError};
use crate::transport::PeerAddr;

pub mod client;
mod dashboard;
pub mod token;

pub use token::{AdminToken, Refusal, TokenError};

/// The page served at `/`: self-contained (no external script, font or stylesheet), as
/// clusters are often offline.
const PAGE: &str = include_str!("console/page.html");

/// What the console needs besides the request path.
#[derive(Clone, Default)]
pub struct ConsoleOptions {
    /// The bearer token of mutating calls.
    pub token: AdminToken,
    /// Read-only calls need the token too.
    pub read_requires_token: bool,
    /// Host names besides IP addresses and `localhost` under which browsers may write to
    /// the admin port (`--admin-allowed-host`), lowercase.
    pub allowed_hosts: Arc<[String]>,
    /// The Redis store with its breaker, when buckets live in Redis (health on the page).
    pub redis: Option<Arc<ResilientStore>>,
    /// The last limits loads (the limits sources record them), shown on the page.
    pub loads: Arc<LoadHistory>,
}

impl std::fmt::Debug for ConsoleOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleOptions")
            .field("token", &self.token)
            .field("read_requires_token", &self.read_requires_token)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("redis", &self.redis.as_ref().map(|redis| redis.name()))
            .field("loads", &self.loads.newest_first().len())
            .finish()
    }
}

/// The console's handler state.
#[derive(Clone)]
pub struct ConsoleState {
    /// The request path: limits, store, metrics.
    pub decider: Arc<Decider>,
    /// Access rules and store health.
    pub options: ConsoleOptions,
}

/// Console calls that reach the store at once, at most; one more is refused at once (503,
/// `Retry-After: 1`). An operator's tool needs a few; a flood of them must not take Redis's
/// capacity from the request path nor open its circuit breaker.
pub const STORE_CALLS: usize = 4;

/// The console's routes, merged into the admin router. Those that reach the store (bucket
/// inspection, reset, set) hold one of [`STORE_CALLS`] places while they run.
pub fn router(state: ConsoleState) -> Router {
    let places = Arc::new(Semaphore::new(STORE_CALLS));
    let bounded = Router::new()
        .route("/buckets/get", post(inspect))
        .route("/buckets/reset", post(reset))
        .route("/buckets/set", post(set_remaining))
        .route_layer(axum::middleware::from_fn(move |request, next| {
            take_place(places.clone(), request, next)
        }))
        .with_state(state.clone());
    Router::new()
        .route("/", get(page))
        .route("/console/state", get(dashboard::state))
        .with_state(state)
        .merge(bounded)
}

/// Runs a store-reaching console call in one of the [`STORE_CALLS`] places, or refuses it.
async fn take_place(places: Arc<Semaphore>, request: Request, next: Next) -> Response {
    match places.try_acquire() {
        Ok(_place) => next.run(request).await,
        Err(_) => ConsoleError::Busy.into_response(),
    }
}

/// A console call: a descriptor (domain and entries, as in ShouldRateLimit), optionally
/// narrowed to one bucket by its store key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketRequest {
    /// The descriptor's domain.
    pub domain: String,
    /// The descriptor's entries.
    #[serde(default)]
    pub entries: Vec<BucketEntry>,
    /// Only the bucket with this store key (as an inspection reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// For set-remaining: the requests (tokens) left after the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
}

/// One descriptor entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's value (empty: none).
    #[serde(default)]
    pub value: String,
}

/// One matched limit and its bucket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BucketView {
    /// The rule's metric path.
    pub rule: String,
    /// The limit's `name`, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `token_bucket`, `fixed_window` or `sliding_window`.
    pub algorithm: String,
    /// Requests per period.
    pub requests_per_unit: u64,
    /// The period in seconds (unit × `unit_multiplier`).
    pub period_seconds: u64,
    /// Most requests the bucket can hold: `burst` for a token bucket, else the limit.
    pub capacity: u64,
    /// Requests (tokens) that could pass now.
    pub remaining: u64,
    /// µs until the bucket is full again (token bucket) or its window resets.
    pub reset_us: u64,
    /// The rule is in shadow mode.
    pub shadow: bool,
    /// The descriptor is a quota-mode one.
    pub quota: bool,
    /// The store's key of the bucket (Redis: with the prefix).
    pub key: String,
}

/// An inspection's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Inspection {
    /// The domain asked about.
    pub domain: String,
    /// `limited` (buckets below), `unlimited` (an `unlimited` rule: no bucket) or `none`
    /// (unknown domain, or no rule matches).
    pub matched: String,
    /// Every matched limit's bucket (those narrowed to by `key`, if given).
    pub buckets: Vec<BucketView>,
}

/// Why a console call failed, and its HTTP status.
#[derive(Debug, thiserror::Error)]
enum ConsoleError {
    #[error("{0}")]
    BadRequest(String),
    #[error("authorization required: Authorization: Bearer <token>")]
    Unauthorized,
    #[error("forbidden: wrong admin token, or none configured (--admin-token-file)")]
    Forbidden,
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error(
        "console busy: {STORE_CALLS} bucket calls already in flight; not queued, retry shortly"
    )]
    Busy,
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = match &self {
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Unauthorized => StatusCode::UNAUTHORIZED,
            ConsoleError::Forbidden => StatusCode::FORBIDDEN,
            ConsoleError::Store(_) | ConsoleError::Busy => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut response =
            (status, axum::Json(json!({ "error": self.to_string() }))).into_response();
        if matches!(self, ConsoleError::Busy) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl ConsoleState {
    /// Refuses the call unless it carries the token.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), ConsoleError> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .map(header::HeaderValue::as_bytes);
        self.options
            .token
            .check(presented)
            .map_err(|refusal| match refusal {
                Refusal::Missing => ConsoleError::Unauthorized,
                Refusal::Wrong => ConsoleError::Forbidden,
            })
    }

    /// Refuses a read-only call that does not carry the token when one is configured (the
    /// answers hold bucket keys and limits with request values: client addresses, user
    /// ids), or when reads need it (`--admin-read-requires-token`, which without a token
    /// refuses every read).
    fn authorize_read(&self, headers: &HeaderMap) -> Result<(), ConsoleError> {
        if self.options.read_requires_token || self.options.token.is_set() {
            self.authorize(headers)
        } else {
            Ok(())
        }
    }

    /// The matched limits of `request`'s descriptor, each with its bucket op (cost 0) and
    /// its view without the store's numbers yet.
    fn plan(
        &self,
        request: &BucketRequest,
    ) -> Result<(String, Vec<(BucketOp, BucketView)>), ConsoleError> {
        let config = self.decider.config();
        let rls = RateLimitRequest {
            domain: request.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: request
                    .entries
                    .iter()
                    .map(|e| Entry {
                        key: e.key.clone().into(),
                        value: e.value.clone().into(),
                    })
                    .collect(),
                limit: None,
                // Present and 0: check only, debit nothing.
                hits_addend: Some(0),
                is_negative_hits: false,
            }],
            hits_addend: 0,
        };
        let mut plan = Plan::build(&rls, &config, self.decider.options())
            .map_err(|e| ConsoleError::BadRequest(e.0))?;
        // A counter shared with reference pods is the current window's, as for a request.
        self.decider.stamp_reference_counters(&mut plan.ops);
        if plan.is_unlimited(0) {
            return Ok(("unlimited".into(), Vec::new()));
        }
        let store = self.decider.store();
        let mut found = Vec::new();
        for limit in plan.limits_of(0) {
            let Some(op) = plan.ops.get(limit.op) else {
                continue;
            };
            let key = match &op.reference {
                Some(counter) => counter.key(),
                None => store.stored_key(&op.key),
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            if request.key.as_ref().is_some_and(|wanted| *wanted != key) {
                continue;
            }
            let params = op.params;
            found.push((
                BucketOp {
                    cost: 0,
                    ..op.clone()
                },
                BucketView {
                    rule: limit.rule.to_string(),
                    name: limit.limit.and_then(|l| l.name.clone()),
                    algorithm: algorithm_name(params.algorithm).to_owned(),
                    requests_per_unit: params.requests_per_period,
                    period_seconds: params.period_us / 1_000_000,
                    capacity: capacity(&params),
                    remaining: 0,
                    reset_us: 0,
                    shadow: limit.shadow,
                    quota: limit.quota,
                    key,
                },
            ));
        }
        let matched = if found.is_empty() && request.key.is_none() {
            "none"
        } else {
            "limited"
        };
        Ok((matched.into(), found))
    }

    /// Inspects `request`'s buckets: a check-only apply, debiting nothing.
    async fn inspect(&self, request: &BucketRequest) -> Result<Inspection, ConsoleError> {
        let (matched, found) = self.plan(request)?;
        let (ops, mut views): (Vec<BucketOp>, Vec<BucketView>) = found.into_iter().unzip();
        // With the breaker open the store would answer by the failure policy (made-up or
        // local numbers): an operator asked about Redis's buckets, so say Redis is down.
        if let Some(redis) = &self.options.redis
            && !redis.breaker_closed()
        {
            return Err(ConsoleError::Store(StoreError::Unavailable(
                "Redis unavailable (circuit open): its buckets cannot be read now".into(),
            )));
        }
        if !ops.is_empty() {
            let applied = self.decider.store().apply(&ops).await?;
            for (view, result) in views.iter_mut().zip(&applied.buckets) {
                view.remaining = result.view.remaining;
                view.reset_us = result.view.reset_us;
            }
        }
        Ok(Inspection {
            domain: request.domain.clone(),
            matched,
            buckets: views,
        })
    }
}

/// The most a bucket holds: a token bucket's `burst`, a window's limit.
fn capacity(params: &LimitParams) -> u64 {
    match params.algorithm {
        Algorithm::TokenBucket => params.burst,
        Algorithm::FixedWindow | Algorithm::SlidingWindow => params.requests_per_period,
    }
}

fn parse(body: &[u8]) -> Result<BucketRequest, ConsoleError> {
    serde_json::from_slice(body)
        .map_err(|e| ConsoleError::BadRequest(format!("invalid JSON body: {e}")))
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing but itself: no external script, font or frame, whatever a value says.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        Html(PAGE),
    )
        .into_response()
}

async fn inspect(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<Inspection>, ConsoleError> {
    state.authorize_read(&headers)?;
    let request = parse(&body)?;
    Ok(axum::Json(state.inspect(&request).await?))
}

async fn reset(
    State(state): State<ConsoleState>,
    ConnectInfo(peer): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<Inspection>, ConsoleError> {
    write_buckets(&state, peer, &headers, &body, Write::Reset).await
}

async fn set_remaining(
    State(state): State<ConsoleState>,
    ConnectInfo(peer): ConnectInfo<PeerAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::Json<Inspection>, ConsoleError> {
    write_buckets(&state, peer, &headers, &body, Write::SetRemaining).await
}

/// The console's two writes.
#[derive(Clone, Copy)]
enum Write {
    /// Every bucket named back to full.
    Reset,
    /// Every bucket named to the request's `remaining`.
    SetRemaining,
}

/// Runs one write: authorized (the admin token), planned check-only, then every bucket set in
/// one [`Store::set`] (a reset is a set to the capacity: the bucket's state deleted);
/// logged with the caller's address and answered with the buckets as the set left them.
async fn write_buckets(
    state: &ConsoleState,
    peer: PeerAddr,
    headers: &HeaderMap,
    body: &[u8],
    write: Write,
) -> Result<axum::Json<Inspection>, ConsoleError> {
    state.authorize(headers)?;
    let request = parse(body)?;
    let remaining = match (write, request.remaining) {
        (Write::Reset, _) => None,
        (Write::SetRemaining, Some(remaining)) => Some(remaining),
        (Write::SetRemaining, None) => {
            return Err(ConsoleError::BadRequest("\"remaining\" is required".into()));
        }
    };
    let (matched, found) = state.plan(&request)?;
    if let Some(remaining) = remaining
        && let Some((_, view)) = found.iter().find(|(_, view)| remaining > view.capacity)
    {
        return Err(ConsoleError::BadRequest(format!(
            "remaining {remaining} exceeds the capacity {} of {}",
            view.capacity, view.key
        )));
    }
    // Each bucket set to a full one debited by the difference, in one atomic step of the
    // store: the state every algorithm writes for it is its own, and a request landing at
    // the same moment cannot come between a reset and a debit. Non-enforcing, with no
    // overdraft or waiting: the debit fits a full bucket, so it always commits.
    let ops: Vec<BucketOp> = found
        .iter()
        .map(|(op, view)| BucketOp {
            cost: i64::try_from(view.capacity - remaining.unwrap_or(view.capacity))
                .unwrap_or(i64::MAX),
            enforce: false,
            params: LimitParams {
                overdraft: false,
                max_wait_us: 0,
                ..op.params
            },
            ..op.clone()
        })
        .collect();
    let (_, mut views): (Vec<BucketOp>, Vec<BucketView>) = found.into_iter().unzip();
    if !ops.is_empty() {
        let set = state.decider.store().set(&ops).await?;
        for (view, result) in views.iter_mut().zip(&set.buckets) {
            view.remaining = result.view.remaining;
            view.reset_us = result.view.reset_us;
        }
    }
    let keys: Vec<&str> = views.iter().map(|view| view.key.as_str()).collect();
    match remaining {
        None => tracing::info!(%peer, action = "reset", domain = %request.domain, ?keys,
                               "console: buckets reset"),
        Some(remaining) => tracing::info!(%peer, action = "set_remaining", remaining,
                                          domain = %request.domain, ?keys,
                                          "console: buckets set"),
    }
    Ok(axum::Json(Inspection {
        domain: request.domain.clone(),
        matched,
        buckets: views,
    }))
}
