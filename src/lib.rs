//! floodgate: a global rate-limit server speaking Envoy's rate-limit service API (RLS v3).
//!
//! # How a request flows
//!
//! ```text
//! Envoy ──gRPC──▶ server ──▶ service::RlsService ─┐
//! curl ───HTTP──▶ server ──▶ http (POST /json) ───┴─▶ service::Decider
//!                                                     │ 1. plan::Plan::build   (config matching, costs;
//!                                                     │    reference counters stamped with the
//!                                                     │    pod's window: bucket::stamp_…)
//!                                                     │ 2. store::Store::apply (all-or-nothing debits)
//!                                                     │ 3. plan::Plan::refunds (undo, if quota mode denies)
//!                                                     │ 4. plan::Plan::respond (statuses, codes, headers)
//!                                                     │ 5. hold, if a max_wait limit admitted it
//!                                                     │    with a delay (refunded if the client leaves)
//!                                                     └─▶ metrics (Prometheus; statsd),
//!                                                         otel (spans, when tracing is on)
//! ```
//!
//! # The modules, top to bottom
//!
//! Each module uses only the modules on its own line or below it, never in a circle
//! (`tests/layering.rs` checks it; `docs/architecture.md` explains the rules).
//!
//! - [`server`]: the composition root ([`server::compose`]: the store, the limiter and the
//!   watchers, built from the settings) and the serving loop: binds gRPC (TCP or a unix
//!   socket) and HTTP, serves health and reflection, shuts down gracefully.
//! - [`settings`]: flags and environment (floodgate's own, or the reference's) to the typed
//!   settings of every layer below.
//! - [`runtime`]: the thread layout: one single-threaded runtime per gRPC thread, each with
//!   its own `SO_REUSEPORT` listener, so responses are batched per connection.
//! - [`admission`], [`http`]: every gRPC stream takes a `--max-in-flight` place from its
//!   first frame, undecodable requests are `INVALID_ARGUMENT`; the admin endpoints
//!   (`/healthcheck`, `/json`, `/metrics`, `/rlconfig`, and the console's routes), whose
//!   writes must be JSON from the port's own origin.
//! - [`console`]: the operator console on the admin port: bucket inspection, reset and
//!   set-remaining (a check-only plan; `store::Store::reset`), the live dashboard at `/`, the
//!   admin token, and the client of `floodgate bucket`.
//! - [`listen`]: admits connections on both ports: a bound per port (the longest-idle
//!   connection makes way for a new one), those that do not open in time or fall silent closed; the
//!   gRPC port's optional TLS / mutual TLS, certificates reloaded from disk ([`listen::tls`]).
//! - [`rlqs`]: Envoy's Rate Limit Quota Service: usage reports in, quota assignments out,
//!   each limit's rate shared among the Envoys that report on it.
//! - [`service`]: the request path, and the one mapping from errors to gRPC statuses.
//! - [`plan`]: pure: request + limits → bucket operations; store answer → response, with
//!   its rate-limit headers and dynamic metadata ([`plan::headers`]).
//! - [`store`]: the `Store` trait; the in-process memory store; the Redis store (one Lua
//!   script per request) and the Redis Cluster store (one per slot touched, in parallel,
//!   refunded across slots on denial), optionally split with a second Redis for per-second
//!   buckets (`store::split`, refunded across the two the same way: `store::fanout`), behind
//!   the local over-limit cache, the circuit breaker and the failure policy
//!   (`store::resilient`).
//! - [`config`]: the limits YAML: model, loading, validation, the matching tree, and hot
//!   reload ([`config::reload`]: watch the path, load again, swap the `ArcSwap<Config>` the
//!   service reads), or limits pushed by an xDS control plane ([`config::xds`]: the same
//!   loader, the same swap, ACK/NACK on the ADS stream).
//! - [`bucket`]: a bucket is one limit's stored state for one identity, whatever the
//!   algorithm: its key, the reference's counter names, and the store protocol (operations,
//!   answers, the all-or-nothing rule every store applies).
//! - [`limiter`]: the algorithms as pure functions of (state, now, cost).
//! - [`file_watch`]: watching files for hot reload (the limits, the TLS certificates).
//! - [`metrics`]: Prometheus metrics, and the reference's statsd stats recorded beside them.
//! - [`statsd`]: sends the reference's statsd stats from a background task, and exposes
//!   them as the reference's Prometheus series (its default mapping, or a statsd_exporter
//!   mapping file).
//! - [`outcome`]: what a request decided (response, per-limit verdicts), as metrics count it.
//! - [`otel`]: OpenTelemetry traces (off by default): a server span per request, joined to
//!   the caller's `traceparent` / B3 trace, a child span per store call, exported over OTLP.
//! - [`clock`], [`proto`]: time; the generated RLS v3 types.
//!
//! `fuzzing` (hidden, not API; built only for the fuzz targets, `--cfg fuzzing`, and the
//! unit tests) holds their entry points.
#![forbid(unsafe_code)]

pub mod admission;
pub mod bucket;
pub mod clock;
pub mod config;
pub mod console;
pub mod file_watch;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod limiter;
pub mod listen;
pub mod metrics;
pub mod otel;
pub mod outcome;
pub mod plan;
pub mod proto;
pub mod rlqs;
pub mod runtime;
pub mod server;
pub mod service;
pub mod settings;
pub mod statsd;
pub mod store;
