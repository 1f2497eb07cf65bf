//! Serving: gRPC (rate-limit service, `grpc.health.v1`, reflection) and admin HTTP, with
//! graceful shutdown.
//!
//! [`run`] is the serving loop: it takes already-bound listeners, a decider and a shutdown
//! future, so tests bind `127.0.0.1:0` and never sleep. [`serve`] is what `floodgate serve`
//! does with the [`Components`] that [`compose`] (the composition root) built from the
//! settings: bind, start the background tasks and the watchers of the limits (unless
//! `--watch-config=false`) and of the TLS files (when TLS is on), and run until SIGTERM or
//! SIGINT.
//!
//! Connections are [`crate::transport`]'s (bound, TLS, deadlines, age cut); what the gRPC
//! port serves is `grpc`'s, the HTTP ports `admin`'s; what health reports is [`health`]'s;
//! which Redis (or two: per-second limits apart) is `remote`'s.
//!
//! Shutdown order, on the first SIGTERM or SIGINT: health turns NOT_SERVING (gRPC health and
//! `/healthcheck`) while every call is still answered, on old and new connections alike, for
//! the drain period, long enough for Envoy's health checker to take the replica out (a
//! second signal ends it early); then both servers stop accepting, send GOAWAY on every
//! connection and finish in-flight calls, RLQS streams get their last assignments (TTL 0),
//! and after the grace period any straggler is cut off. A request a `max_wait` limit holds
//! is served at its turn if that comes before the cut, else refunded and refused
//! ([`Decider::shutting_down`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::service::Decider;
use crate::settings::ServeSettings;
use crate::store::{FailurePolicy, Store};
use crate::transport::{GrpcListener, TcpListeners};

mod admin;
pub mod compose;
mod error;
mod grpc;
pub mod health;
mod options;
mod remote;
mod stop;
mod xds;

pub use compose::{Components, assemble};
use compose::{Following, follow_xds, watch_limits, watch_tls};
pub use error::ServerError;
pub use options::{Bounds, RunOptions};

/// How often a Redis behind an open circuit breaker is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long shutdown waits for Redis to take back the leases' unspent tokens. A lease
/// expires within tens of milliseconds anyway; this only spares the other replicas the wait.
const LEASE_RETURN_DEADLINE: Duration = Duration::from_secs(1);

/// How often the memory store drops expired buckets.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Binds the configured addresses and serves until SIGTERM or SIGINT.
pub async fn serve(components: Components) -> Result<(), ServerError> {
    let settings = &components.settings;
    let bounds = Bounds::from_settings(&settings.bounds);
    check_open_files(&bounds);
    let grpc = bind_grpc(&components).await?;
    let http = match settings.no_http {
        true => None,
        false => Some(bind(settings.http_addr).await?),
    };
    admin::serve_reference_prometheus(&components, &bounds).await?;
    admin::serve_debug(&components, &bounds).await?;
    let store_health = start_background_tasks(&components);
    log_start(&components);
    // Live until the server has stopped; dropping them stops the watchers.
    let _watches = start_watches(&components);
    let served = run(
        grpc,
        http,
        components.decider.clone(),
        RunOptions::from_components(&components),
        store_health,
        stop_signals(),
    )
    .await;
    finish(&components).await;
    served?;
    tracing::info!("floodgate stopped");
    Ok(())
}

/// Raises the open-files limit, and warns when it is still below the connection bounds.
fn check_open_files(bounds: &Bounds) {
    let wanted = bounds.grpc.max_connections + bounds.http.max_connections;
    match crate::transport::raise_fd_limit() {
        // Redis connections, limits files, watches and the listeners need descriptors too.
        Some(limit) if limit < wanted as u64 + 64 => tracing::warn!(
            open_files = limit,
            connections = wanted,
            "the open-files limit is below the connection limits; lower \
             --grpc-max-connections / --http-max-connections or raise the limit"
        ),
        Some(limit) => tracing::info!(open_files = limit, "open-files limit"),
        None => {}
    }
}

/// A TCP listener on `addr`.
async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// The gRPC listeners: a unix socket (`--grpc-uds`, plaintext only), or one TCP listener per
/// serving thread.
async fn bind_grpc(components: &Components) -> Result<GrpcListener, ServerError> {
    let settings = &components.settings;
    let Some(path) = &settings.grpc_connections.grpc_uds else {
        let listeners = TcpListeners::bind(settings.grpc_addr, settings.grpc_thread_count())
            .await
            .map_err(|source| ServerError::Bind {
                addr: settings.grpc_addr,
                source,
            })?;
        return Ok(GrpcListener::Tcp(listeners));
    };
    if components.tls.is_some() {
        return Err(ServerError::Settings(
            "TLS on a unix socket is not supported: serve TLS on --grpc-addr, or plaintext on \
             --grpc-uds"
                .into(),
        ));
    }
    GrpcListener::bind_unix(path).map_err(|source| ServerError::BindUnix {
        path: path.clone(),
        source,
    })
}

/// Starts the stores' sweepers and the Redis probe; the store's health, when it takes part
/// in the server's.
fn start_background_tasks(components: &Components) -> Option<watch::Receiver<bool>> {
    if let Some(memory) = &components.memory {
        memory.spawn_sweeper(SWEEP_INTERVAL);
    }
    if let Some(leases) = &components.leases {
        leases.spawn_sweeper();
    }
    let redis = components.redis.as_ref()?;
    redis.spawn_probe(PROBE_INTERVAL);
    // Only under policy `error` is the service unusable while Redis is: the other policies
    // still answer, so health stays SERVING.
    (components.settings.on_store_error == FailurePolicy::Error).then(|| redis.availability())
}

/// Logs what the server starts with.
fn log_start(components: &Components) {
    let settings: &ServeSettings = &components.settings;
    tracing::info!(
        store = components.redis.as_ref().map_or("memory", |redis| redis.name()),
        redis = ?settings.redis_url.as_deref().map(crate::store::redis::redact::redact_url),
        redis_sentinel = ?settings.redis_sentinel,
        redis_cluster = ?settings.redis_cluster_redacted(),
        on_store_error = settings.on_store_error.as_str(),
        shadow_mode = settings.shadow_mode,
        quota_mode = settings.quota_mode,
        default_algorithm = %crate::config::algorithm_name(settings.algorithm.value.into()),
        default_algorithm_reason = %settings.algorithm_choice.reason(),
        reference_counters = settings.counters.enabled(settings.runtime_layout.is_some()),
        "floodgate starting"
    );
}

/// What keeps the served components current while it lives: the limits' source (files or
/// xDS), the TLS files' watch and the admin token's.
struct Watches {
    _limits: Option<Following>,
    _tls: Option<crate::file_watch::FileWatch>,
    _token: Option<crate::file_watch::FileWatch>,
}

/// Starts following the limits, the TLS files and the admin token.
fn start_watches(components: &Components) -> Watches {
    let limits = match &components.xds {
        None => watch_limits(components).map(Following::Files),
        Some(options) => Some(Following::Xds(follow_xds(components, options.clone()))),
    };
    let tls = components.tls.as_ref().and_then(watch_tls);
    let token = match components.admin_token.watch() {
        Some(Ok(watch)) => Some(watch),
        Some(Err(e)) => {
            tracing::error!("{e}; admin token reload is off");
            None
        }
        None => None,
    };
    Watches {
        _limits: limits,
        _tls: tls,
        _token: token,
    }
}

/// After the drain: gives the leases' unspent tokens back and exports the last spans.
async fn finish(components: &Components) {
    // Drained: no request spends a lease any more, so their rest goes back to the other
    // replicas now rather than at expiry (bounded: the grace is spent, Redis calls are not).
    if let Some(leases) = &components.leases
        && tokio::time::timeout(LEASE_RETURN_DEADLINE, leases.return_all())
            .await
            .is_err()
    {
        tracing::warn!("leases not returned in time: their tokens come back at expiry");
    }
    // Spans of the drained requests are still queued: export them before the process exits.
    if let Some(traces) = &components.traces {
        traces
            .shutdown(crate::telemetry::otel::FLUSH_DEADLINE)
            .await;
    }
}

/// Serves gRPC on `grpc` (a TCP listener or a [`GrpcListener`]) and admin HTTP on `http`
/// (none: no admin HTTP at all) until the first of `signals`, then shuts down: health goes
/// NOT_SERVING while both servers keep answering every call for `options.drain_period` (or
/// until the next of `signals`), then they stop accepting, send GOAWAY and finish in-flight
/// requests, for at most `options.grace`. While `store_health` (if given) or
/// `options.limits_health` (if given) says false, health reports NOT_SERVING.
pub async fn run(
    grpc: impl Into<GrpcListener>,
    http: Option<TcpListener>,
    decider: Arc<Decider>,
    options: RunOptions,
    store_health: Option<watch::Receiver<bool>>,
    signals: impl Stream<Item = ()>,
) -> Result<(), ServerError> {
    let grpc = grpc.into();
    let listening = Listening::of(&grpc, http.as_ref(), &options)?;
    let (health, health_service) =
        health::Reporting::start(store_health, options.limits_health.clone()).await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let router = grpc::router(&decider, health_service, &options)?;
    let mut grpc_task = grpc::spawn(grpc, router, &options, &stop_rx)?;
    let serving = health.serving.clone();
    let mut http_task = admin::spawn(http, decider.clone(), serving, &options, stop_rx);
    listening.log();
    let mut signals = std::pin::pin!(signals);

    // A stream that ends without a signal stops the server too: nothing can stop it later.
    tokio::select! {
        _ = signals.next() => {}
        result = &mut grpc_task => return flatten(result),
        result = &mut http_task => return flatten(result),
    }

    let (drain_period, grace) = (options.drain_period, options.grace);
    tracing::info!(
        ?drain_period,
        ?grace,
        "shutting down: health NOT_SERVING, every call still answered for the drain period"
    );
    health.shutting_down().await;
    // Held requests learn when the connections will be cut, and whether their turn comes
    // before that.
    decider.shutting_down(tokio::time::Instant::now() + drain_period + grace);
    tokio::select! {
        () = tokio::time::sleep(drain_period) => {}
        Some(()) = signals.next() => tracing::info!("drain period cut short"),
        result = &mut grpc_task => return flatten(result),
        result = &mut http_task => return flatten(result),
    }

    tracing::info!("drain period over: GOAWAY, finishing in-flight requests");
    decider.shutting_down(tokio::time::Instant::now() + grace);
    // RLQS streams last as long as their Envoy: each expires its assignments and ends now,
    // once Envoy's health checker has moved new streams to other replicas.
    if let Some(rlqs) = &options.rlqs {
        rlqs.shut_down();
    }
    let _ = stop_tx.send(true);
    drain(grpc_task, http_task, grace).await
}

/// What the server listens on, for the one log line saying so.
struct Listening {
    grpc_addr: String,
    grpc_threads: usize,
    grpc_tls: &'static str,
    http_addr: Option<std::net::SocketAddr>,
    grpc_max_connection_age: Option<String>,
}

impl Listening {
    fn of(
        grpc: &GrpcListener,
        http: Option<&TcpListener>,
        options: &RunOptions,
    ) -> Result<Listening, ServerError> {
        let (grpc_addr, grpc_threads) = match grpc {
            GrpcListener::Tcp(listeners) => (
                listeners
                    .local_addr()
                    .map_err(ServerError::Http)?
                    .to_string(),
                listeners.threads(),
            ),
            GrpcListener::Unix(socket) => (format!("unix:{}", socket.path.display()), 1),
        };
        let http_addr = match http {
            Some(http) => Some(http.local_addr().map_err(ServerError::Http)?),
            None => None,
        };
        let grpc_tls = match &options.tls {
            None => "off",
            Some(tls) if tls.is_mutual() => "mutual",
            Some(_) => "on",
        };
        Ok(Listening {
            grpc_addr,
            grpc_threads,
            grpc_tls,
            http_addr,
            grpc_max_connection_age: options.max_connection_age.map(|age| format!("{age:.0?}")),
        })
    }

    fn log(&self) {
        let Listening {
            grpc_addr,
            grpc_threads,
            grpc_tls,
            http_addr,
            grpc_max_connection_age,
        } = self;
        match http_addr {
            Some(http_addr) => tracing::info!(
                %grpc_addr, grpc_threads, grpc_tls, %http_addr, ?grpc_max_connection_age,
                "listening"
            ),
            None => tracing::info!(
                %grpc_addr, grpc_threads, grpc_tls, http_addr = "off", ?grpc_max_connection_age,
                "listening"
            ),
        }
    }
}

/// Waits for both servers to finish their in-flight requests, for at most `grace`; then
/// cuts off what is left.
async fn drain(
    mut grpc_task: JoinHandle<Result<(), ServerError>>,
    mut http_task: JoinHandle<Result<(), ServerError>>,
    grace: Duration,
) -> Result<(), ServerError> {
    let drained = tokio::time::timeout(grace, async {
        let grpc = flatten((&mut grpc_task).await);
        let http = flatten((&mut http_task).await);
        grpc.and(http)
    })
    .await;
    match drained {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(?grace, "grace period over; closing remaining connections");
            grpc_task.abort();
            http_task.abort();
            Ok(())
        }
    }
}

fn flatten(
    result: Result<Result<(), ServerError>, tokio::task::JoinError>,
) -> Result<(), ServerError> {
    match result {
        Ok(inner) => inner,
        // A panic in a server task is a defect: re-raise it rather than hide it.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Ok(()),
    }
}

/// Registers SIGTERM (Kubernetes) and SIGINT (Ctrl-C) handlers now, and returns the stream of
/// either, one item per signal. Registering before the listeners are announced means a
/// signal sent as soon as the server says "listening" is never handled by the default action
/// (killing us); registered for good, a second signal during the drain ends the drain early
/// instead of killing the process.
fn stop_signals() -> impl Stream<Item = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let registered = |name: &'static str, kind: SignalKind| match signal(kind) {
        Ok(signal) => Some((name, signal)),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {name}");
            None
        }
    };
    let term = registered("SIGTERM", SignalKind::terminate());
    let int = registered("SIGINT", SignalKind::interrupt());
    futures_util::stream::unfold((term, int), |(mut term, mut int)| async move {
        let name = tokio::select! {
            Some(name) = next_signal(&mut term) => name,
            Some(name) = next_signal(&mut int) => name,
            // Neither can be received: no signal will ever come (never a stop either).
            else => std::future::pending::<&'static str>().await,
        };
        tracing::info!("{name} received");
        Some(((), (term, int)))
    })
}

/// The name of `signal` once it is next received; `None` if it cannot be (not registered).
async fn next_signal(
    signal: &mut Option<(&'static str, tokio::signal::unix::Signal)>,
) -> Option<&'static str> {
    let (name, signal) = signal.as_mut()?;
    signal.recv().await?;
    Some(*name)
}
