//! floodgate: a global rate-limit server speaking Envoy's rate-limit service API (RLS v3).
//!
//! # How a request flows
//!
//! ```text
//! Envoy ──gRPC──▶ server ──▶ service::RlsService ─┐
//! curl ───HTTP──▶ server ──▶ http (POST /json) ───┴─▶ service::RateLimiter
//!                                                     │ 1. plan::Plan::build   (config matching, costs)
//!                                                     │ 2. store::Store::apply (all-or-nothing debits)
//!                                                     │ 3. plan::Plan::refunds (undo, if quota mode denies)
//!                                                     │ 4. plan::Plan::respond (statuses, codes, headers)
//!                                                     └─▶ metrics (Prometheus; statsd)
//! ```
//!
//! # The modules, top to bottom
//!
//! Each layer imports only the layers below it.
//!
//! - [`server`]: binds gRPC (TCP or a unix socket) and HTTP, serves health and reflection,
//!   shuts down gracefully.
//! - [`runtime`]: the thread layout: one single-threaded runtime per gRPC thread, each with
//!   its own `SO_REUSEPORT` listener, so responses are batched per connection.
//! - [`listen`]: admits connections on both ports: a bound per port, silent ones closed.
//! - [`admission`]: every gRPC stream takes a `--max-in-flight` place from its first frame;
//!   undecodable requests are `INVALID_ARGUMENT`.
//! - [`tls`]: optional TLS / mutual TLS on the gRPC port, certificates reloaded from disk.
//! - [`http`]: admin endpoints: `/healthcheck`, `/json`, `/metrics`, `/rlconfig`, and the
//!   [`console`]: bucket inspection, reset and set-remaining, and the live dashboard at `/`.
//! - [`service`]: the request path, and the one mapping from errors to gRPC statuses.
//! - [`plan`]: pure: request + limits → bucket operations; store answer → response.
//! - [`annotate`]: pure: the response's rate-limit headers and dynamic metadata.
//! - [`store`]: the `Store` trait; the in-process memory store; the Redis store (one Lua
//!   script per request) and the Redis Cluster store (one per slot touched, in parallel,
//!   refunded across slots on denial), optionally split with a second Redis for per-second
//!   buckets (`store::split`, refunded across the two the same way: `store::fanout`), behind
//!   the local over-limit cache, the circuit breaker and the failure policy
//!   (`store::resilient`).
//! - [`config`]: the limits YAML: model, loading, validation, the matching tree, and hot
//!   reload ([`config::reload`]: watch the path, load again, swap the `ArcSwap<Config>` the
//!   service reads).
//! - [`bucket`]: bucket keys and operations, and the all-or-nothing rule every store applies.
//! - [`limiter`]: the algorithms as pure functions of (state, now, cost).
//! - [`file_watch`]: watching files for hot reload (the limits, the TLS certificates).
//! - [`settings`], [`metrics`], [`clock`], [`proto`]: flags, Prometheus metrics, time, the
//!   generated RLS v3 types.
//! - [`statsd`]: the reference's statsd stats, recorded through [`metrics`] and sent by a
//!   background task (below `metrics`: it imports nothing of the crate).
//!
//! `fuzzing` (hidden, not API) holds the entry points of the fuzz targets in `fuzz/`.
#![forbid(unsafe_code)]

pub mod admission;
pub mod annotate;
pub mod bucket;
pub mod clock;
pub mod config;
pub mod console;
pub mod file_watch;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod limiter;
pub mod listen;
pub mod metrics;
pub mod plan;
pub mod proto;
pub mod runtime;
pub mod server;
pub mod service;
pub mod settings;
pub mod statsd;
pub mod store;
pub mod tls;
