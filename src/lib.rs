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
//!                                                     └─▶ telemetry: each tally adds to its
//!                                                         rule's handles (by rule index, in
//!                                                         the snapshot beside the config the
//!                                                         request planned with: Prometheus;
//!                                                         statsd); spans, when tracing is on
//! ```
//!
//! # The modules, top to bottom
//!
//! Each module uses only the modules on its own line or below it, never in a circle
//! (`tests/layering.rs` checks it; `docs/architecture.md` explains the rules).
//!
//! - [`server`]: the composition root ([`server::compose`]: the store, the decider and the
//!   watchers, built from the settings) and the serving loop: binds gRPC (TCP or a unix
//!   socket) and HTTP, serves health and reflection, shuts down gracefully.
//! - [`settings`]: flags and environment (floodgate's own, or the reference's) to the typed
//!   settings of every layer below.
//! - [`runtime`]: the thread layout: one single-threaded runtime per gRPC thread, each with
//!   its own `SO_REUSEPORT` listener, so responses are batched per connection, and each with
//!   the host's scheduling-delay probe ([`runtime::host`]).
//! - [`http`]: the admin endpoints (`/healthcheck`, `/json`, `/metrics`, `/rlconfig`, and
//!   the console's routes), whose writes must be JSON from the port's own origin.
//! - [`console`]: the operator console on the admin port: bucket inspection, reset and
//!   set-remaining (a check-only plan; `store::Store::set`), the live dashboard at `/`, the
//!   admin token, and the client of `floodgate bucket`.
//! - [`transport`]: connections on every port: binds the listeners (TCP, `SO_REUSEPORT`, the
//!   gRPC unix socket), accepts within a bound per port (`transport::connection_bound`: the
//!   longest-idle connection makes way for a new one), and wraps each connection once, with one timer for its deadlines (the
//!   handshake and idle timeouts, the gRPC age cut); the gRPC port's optional TLS / mutual
//!   TLS, certificates reloaded from disk ([`transport::tls`]); the connection and TLS
//!   metrics it registers and counts ([`transport::metrics`]).
//! - [`rlqs`]: Envoy's Rate Limit Quota Service: usage reports in, quota assignments out,
//!   each limit's rate shared among the Envoys that report on it; its own metrics.
//! - [`service`]: the request path (`service::Decider`, one entry point, for a call holding
//!   a place in the bound on calls in flight), the gRPC face (every gRPC stream takes its
//!   place from its first frame; ShouldRateLimit calls are decoded, decided and encoded
//!   right there), and the one mapping from errors to gRPC statuses.
//! - [`admission`]: the bounds on what the replica takes in at once: calls in flight
//!   (`--max-in-flight`: `admission::InFlight`, a `admission::Place` per call) and request
//!   bytes (`--max-in-flight-bytes`); the request codec (undecodable requests are
//!   `INVALID_ARGUMENT`).
//! - [`plan`]: pure: request + limits → bucket operations; store answer → response, with
//!   its rate-limit headers and dynamic metadata ([`plan::headers`]).
//! - [`store`]: the `Store` trait; the in-process memory store; the Redis store (one Lua
//!   script per request) and the Redis Cluster store (one per slot touched, in parallel,
//!   refunded across slots on denial), optionally split with a second Redis for per-second
//!   buckets (`store::split`, refunded across the two the same way: `store::fanout`), behind
//!   the local over-limit cache, the circuit breaker and the failure policy
//!   (`store::resilient`); the store's metrics, leases' included ([`store::metrics`]).
//! - [`sources`]: where the limits come from, off the request path: files
//!   ([`sources::files`]: listed and read safely, watched, loaded again) or an xDS control
//!   plane ([`sources::xds`]: ACK/NACK on the ADS stream), both published through one
//!   [`sources::Publisher`] (resolve the rules' series handles, swap the
//!   [`sources::Snapshot`] of config and handles the service reads, count the load in the
//!   sources' own metrics).
//! - [`config`]: pure: the limits YAML (file names and text, as a source read them) parsed,
//!   validated and compiled into the matching tree; no I/O, no metrics.
//! - [`bucket`]: a bucket is one limit's stored state for one identity, whatever the
//!   algorithm: its key, the reference's counter names, and the store protocol (operations,
//!   answers, the all-or-nothing rule every store applies).
//! - [`limiter`]: the algorithms as pure functions of (state, now, cost).
//! - [`file_watch`]: watching files for hot reload (the limits, the TLS certificates).
//! - [`telemetry`]: what the server tells its operators: the Prometheus registry every
//!   capability registers its own families in, and the counting of outcomes and requests
//!   ([`telemetry::metrics`], each rule's series resolved once per limits load), the
//!   reference's statsd stats, sent from a background task and exposed as the reference's
//!   Prometheus series ([`telemetry::statsd`]), and OpenTelemetry traces ([`telemetry::otel`],
//!   off by default: a server span per request, joined to the caller's `traceparent` / B3
//!   trace, a child span per store call, exported over OTLP).
//! - [`outcome`]: what a request decided (response, per-limit verdicts, each naming its rule
//!   by path and index), as metrics count it: plain data.
//! - [`pem`]: TLS material from PEM files (certificate chains, CA bundles, private keys),
//!   checked when read, and the one TLS error type of the gRPC port, Redis and the xDS client.
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
pub mod outcome;
pub mod pem;
pub mod plan;
pub mod proto;
pub mod rlqs;
pub mod runtime;
pub mod server;
pub mod service;
pub mod settings;
pub mod sources;
pub mod store;
pub mod telemetry;
pub mod transport;
