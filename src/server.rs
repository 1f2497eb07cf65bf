//! Serving: gRPC (rate-limit service, `grpc.health.v1`, reflection) and admin HTTP, with
//! graceful shutdown.
//!
//! [`run`] is the serving loop: it takes already-bound listeners, a limiter and a shutdown
//! future, so tests bind `127.0.0.1:0` and never sleep. gRPC is plaintext or TLS
//! ([`crate::listen::tls`]) over the same tonic server: only the stream of incoming
//! connections differs. [`serve`] is what `floodgate serve` does with the [`Components`]
//! that [`compose`] (the composition root) built from the settings: bind, log the addresses,
//! start the watchers of the limits (unless `--watch-config=false`) and of the TLS files
//! (when TLS is on), and run until SIGTERM or SIGINT.
//!
//! gRPC listens on a TCP address or a unix socket ([`listener`]); what health reports is
//! [`health`]'s; which Redis (or two: per-second limits apart) is `remote`'s.
//!
//! Shutdown order: health turns NOT_SERVING (gRPC health and `/healthcheck`), requests a
//! `max_wait` limit holds are answered OK at once, both servers stop accepting connections
//! and drain in-flight requests, and after the grace period any straggler is cut off.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

use crate::admission::AdmissionLayer;
use crate::config::ConfigErrors;
use crate::console::ConsoleOptions;
use crate::http::{self, AdminState, NotReady, Readiness};
use crate::listen::tls::{GrpcTls, TlsError};
use crate::listen::{Admission, CallsLayer, ConnectionLimits, CountAdminCalls, PortBound};
use crate::metrics::Port;
use crate::otel::TraceError;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use crate::proto::{self, rls::rate_limit_service_server::RateLimitServiceServer};
use crate::runtime;
use crate::service::{Decider, RlsService};
use crate::settings::BoundsSettings;
use crate::store::{FailurePolicy, Store};

pub mod compose;
pub mod health;
pub mod listener;
mod remote;
mod xds;

pub use compose::{Components, assemble};
use compose::{Following, follow_xds, watch_limits, watch_tls};
pub use listener::GrpcListener;
use listener::{Aged, TcpListeners};

/// How often a Redis behind an open circuit breaker is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a gRPC connection may be quiet before the server pings it (unless
/// `--grpc-keepalive-interval` says more often), and how long the answer may take: a dead peer
/// is found within their sum, and a live one is never silent for the idle timeout.
const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long shutdown waits for Redis to take back the leases' unspent tokens. A lease
/// expires within tens of milliseconds anyway; this only spares the other replicas the wait.
const LEASE_RETURN_DEADLINE: Duration = Duration::from_secs(1);

/// How often the memory store drops expired buckets.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The limits could not be loaded at start-up.
    #[error("cannot load limits from {path}:\n{errors}")]
    Config {
        /// The configured path.
        path: String,
        /// Every problem found.
        errors: ConfigErrors,
    },
    /// A gRPC TLS file cannot be used at start-up.
    #[error("gRPC TLS: {0}")]
    Tls(#[from] TlsError),
    /// A setting cannot be honoured.
    #[error("{0}")]
    Settings(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The gRPC unix socket could not be bound.
    #[error("cannot listen on unix socket {path}: {source}")]
    BindUnix {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(io::Error),
    /// Reflection could not be built from the embedded descriptors (a build defect).
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The trace exporter cannot be built as configured.
    #[error("tracing: {0}")]
    Traces(#[from] TraceError),
}

/// How [`run`] serves, besides its listeners, limiter and store health.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// How long in-flight requests may take to finish once shutdown begins.
    pub grace: Duration,
    /// Largest ShouldRateLimit request accepted, in bytes (encoded protobuf); a larger one is
    /// refused by tonic before it is decoded.
    pub grpc_max_message_bytes: usize,
    /// Whether the admin HTTP server answers `POST /json` (404 when not).
    pub json_endpoint: bool,
    /// TLS on the gRPC port; `None`: plaintext.
    pub tls: Option<GrpcTls>,
    /// Whether limits are loaded, with `--health-requires-limits` (false: NOT_SERVING).
    pub limits_health: Option<watch::Receiver<bool>>,
    /// gRPC connections get `GOAWAY` at this age (already jittered); `None`: never.
    pub max_connection_age: Option<Duration>,
    /// ...and are cut this long after that; `None`: they close when their calls finish.
    pub max_connection_age_grace: Option<Duration>,
    /// HTTP/2 PING interval on idle gRPC connections; `None`: every
    /// 20 s. Never longer than a third of the idle timeout.
    pub keepalive_interval: Option<Duration>,
    /// Connection and stream bounds of both ports.
    pub bounds: Bounds,
    /// The operator console's token, access rules and store health.
    pub console: ConsoleOptions,
    /// The Rate Limit Quota Service, served beside the rate-limit service; `None`: not
    /// served.
    pub rlqs: Option<Arc<crate::rlqs::Rlqs>>,
}

/// The bounds that keep one client from exhausting the server (docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Connections on the gRPC port (all serving threads together).
    pub grpc: ConnectionLimits,
    /// Connections on the admin HTTP port.
    pub http: ConnectionLimits,
    /// HTTP/2 streams open at once on one gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// Longest a gRPC call may take, its request body's arrival included.
    pub grpc_request_timeout: Duration,
}

impl Default for Bounds {
    /// The defaults of the `serve` flags.
    fn default() -> Bounds {
        Bounds {
            grpc: ConnectionLimits {
                max_connections: 1_000,
                idle_timeout: Duration::from_secs(60),
                handshake_timeout: Duration::from_secs(10),
            },
            http: ConnectionLimits {
                max_connections: 100,
                idle_timeout: Duration::from_secs(60),
                handshake_timeout: Duration::from_secs(10),
            },
            grpc_max_concurrent_streams: 100,
            grpc_request_timeout: Duration::from_secs(5),
        }
    }
}

impl Bounds {
    /// The bounds `settings` ask for.
    pub fn from_settings(settings: &BoundsSettings) -> Bounds {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Bounds {
            grpc: ConnectionLimits {
                max_connections: count(settings.grpc_max_connections),
                idle_timeout: settings.grpc_idle_timeout,
                handshake_timeout: settings.handshake_timeout,
            },
            http: ConnectionLimits {
                max_connections: count(settings.http_max_connections),
                idle_timeout: settings.http_idle_timeout,
                handshake_timeout: settings.handshake_timeout,
            },
            grpc_max_concurrent_streams: settings.grpc_max_concurrent_streams,
            grpc_request_timeout: settings.grpc_request_timeout,
        }
    }
}

/// Binds the configured addresses and serves until SIGTERM or SIGINT.
pub async fn serve(components: Components) -> Result<(), ServerError> {
    let settings = &components.settings;
    let open_files = crate::listen::raise_fd_limit();
    let bounds = Bounds::from_settings(&settings.bounds);
    let wanted = bounds.grpc.max_connections + bounds.http.max_connections;
    match open_files {
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
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })
    };
    let grpc = match &settings.grpc_connections.grpc_uds {
        Some(path) => {
            if components.tls.is_some() {
                return Err(ServerError::Settings(
                    "TLS on a unix socket is not supported: serve TLS on --grpc-addr, or \
                     plaintext on --grpc-uds"
                        .into(),
                ));
            }
            GrpcListener::bind_unix(path).map_err(|source| ServerError::BindUnix {
                path: path.clone(),
                source,
            })?
        }
        None => GrpcListener::Tcp(
            TcpListeners::bind(settings.grpc_addr, settings.grpc_thread_count())
                .await
                .map_err(|source| ServerError::Bind {
                    addr: settings.grpc_addr,
                    source,
                })?,
        ),
    };
    let http = if settings.no_http {
        None
    } else {
        Some(bind(settings.http_addr).await?)
    };
    serve_reference_prometheus(&components, &bounds).await?;
    serve_debug(&components, &bounds).await?;
    if let Some(memory) = &components.memory {
        memory.spawn_sweeper(SWEEP_INTERVAL);
    }
    if let Some(leases) = &components.leases {
        leases.spawn_sweeper();
    }
    let mut store_health = None;
    if let Some(redis) = &components.redis {
        redis.spawn_probe(PROBE_INTERVAL);
        // Only under policy `error` is the service unusable while Redis is: the other
        // policies still answer, so health stays SERVING.
        if settings.on_store_error == FailurePolicy::Error {
            store_health = Some(redis.availability());
        }
    }
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
    // Live until the server has stopped; dropping them stops the watchers.
    let _watch = match &components.xds {
        None => watch_limits(&components).map(Following::Files),
        Some(options) => Some(Following::Xds(follow_xds(&components, options.clone()))),
    };
    let _tls_watch = components.tls.as_ref().and_then(watch_tls);
    let _token_watch = match components.admin_token.watch() {
        Some(Ok(watch)) => Some(watch),
        Some(Err(e)) => {
            tracing::error!("{e}; admin token reload is off");
            None
        }
        None => None,
    };
    let shutdown = shutdown_signal();
    let served = run(
        grpc,
        http,
        components.limiter.clone(),
        RunOptions::from_components(&components),
        store_health,
        shutdown,
    )
    .await;
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
        traces.shutdown(crate::otel::FLUSH_DEADLINE).await;
    }
    served?;
    tracing::info!("floodgate stopped");
    Ok(())
}

/// Binds and serves the reference's Prometheus series when asked to, within the HTTP port's
/// connection bounds. The task lives as long as the process: a scrape is read-only and
/// needs no draining.
async fn serve_reference_prometheus(
    components: &Components,
    bounds: &Bounds,
) -> Result<(), ServerError> {
    let Some(prom) = components.settings.statsd.reference_prometheus() else {
        return Ok(());
    };
    let metrics = components.limiter.metrics();
    let Some(stats) = metrics.reference_stats() else {
        return Ok(());
    };
    let listener = TcpListener::bind(prom.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: prom.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServerError::Http)?;
    let router =
        http::reference_prometheus_router(Arc::clone(stats), &prom.path, prom.response_time_ms);
    let admission = Admission::new(listener, bounds.http, Port::Prometheus, Arc::clone(metrics));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(admission, CountAdminCalls(router)).await {
            tracing::error!(error = %e, "the reference's Prometheus listener failed");
        }
    });
    tracing::info!(%addr, path = %prom.path, "serving the reference's Prometheus series");
    Ok(())
}

/// Binds and serves the reference's debug port when asked to (`--debug-addr`), within the
/// HTTP port's connection bounds; like the Prometheus one, it lives as long as the process.
async fn serve_debug(components: &Components, bounds: &Bounds) -> Result<(), ServerError> {
    let Some(addr) = components.settings.statsd.debug_addr else {
        return Ok(());
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(ServerError::Http)?;
    let router = http::debug_router(Arc::clone(&components.limiter));
    let metrics = Arc::clone(components.limiter.metrics());
    let admission = Admission::new(listener, bounds.http, Port::Debug, metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(admission, CountAdminCalls(router)).await {
            tracing::error!(error = %e, "the debug listener failed");
        }
    });
    tracing::info!(addr = %bound, "serving the debug port (/rlconfig, /stats)");
    Ok(())
}

/// Serves gRPC on `grpc` (a TCP listener or a [`GrpcListener`]) and admin HTTP on `http`
/// (none: no admin HTTP at all) until `shutdown` completes, then drains: health goes
/// NOT_SERVING, both servers stop accepting and finish in-flight requests, for at most
/// `options.grace`. While `store_health` (if given) or `options.limits_health` (if given) says
/// false, health reports NOT_SERVING.
pub async fn run(
    grpc: impl Into<GrpcListener>,
    http: Option<TcpListener>,
    limiter: Arc<Decider>,
    options: RunOptions,
    store_health: Option<watch::Receiver<bool>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let grpc = grpc.into();
    let grpc_addr = match &grpc {
        GrpcListener::Tcp(listeners) => listeners
            .local_addr()
            .map_err(ServerError::Http)?
            .to_string(),
        GrpcListener::Unix(socket) => format!("unix:{}", socket.path.display()),
    };
    let http_addr = match &http {
        Some(http) => Some(http.local_addr().map_err(ServerError::Http)?),
        None => None,
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    let limits_health = options.limits_health.clone();
    let initially = health::initially_serving(store_health.as_ref(), limits_health.as_ref());
    let serving = Arc::new(Readiness::new(initially));
    health::publish(&health, &serving, initially).await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let metrics = limiter.metrics().clone();
    let releases_waiting = Arc::clone(&limiter);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mirror = (store_health.is_some() || limits_health.is_some()).then(|| {
        tokio::spawn(health::mirror(
            store_health,
            limits_health,
            health.clone(),
            serving.clone(),
        ))
    });
    // RLS requests are a few hundred bytes; tonic's 4 MiB default would let one hostile
    // message make the server allocate and decode megabytes.
    let rls = RateLimitServiceServer::new(RlsService::new(limiter.clone()))
        .max_decoding_message_size(options.grpc_max_message_bytes);
    // Usage reports are as small as RLS requests: the same bound.
    let rlqs = options.rlqs.clone().map(|rlqs| {
        RateLimitQuotaServiceServer::new(crate::rlqs::RlqsService::new(rlqs))
            .max_decoding_message_size(options.grpc_max_message_bytes)
    });
    let bounds = options.bounds;
    // Pinged well within the idle timeout, a live peer is never closed as silent.
    let keepalive_interval = options
        .keepalive_interval
        .unwrap_or(GRPC_KEEPALIVE_INTERVAL)
        .min(bounds.grpc.idle_timeout / 3);
    let keepalive_timeout = GRPC_KEEPALIVE_TIMEOUT.min(bounds.grpc.idle_timeout / 3);
    let max_connection_age = options.max_connection_age;
    // One router per serving thread, over the same services and state.
    let grpc_router = || {
        let mut builder = tonic::transport::Server::builder()
            // Bounded per connection (SETTINGS_MAX_CONCURRENT_STREAMS) and in total (every
            // stream takes a --max-in-flight place from its first frame, crate::admission);
            // the request timeout frees a stream whose body never comes.
            .max_concurrent_streams(Some(bounds.grpc_max_concurrent_streams))
            .timeout(bounds.grpc_request_timeout)
            .http2_keepalive_interval(Some(keepalive_interval))
            .http2_keepalive_timeout(Some(keepalive_timeout));
        if let Some(age) = max_connection_age {
            // Graceful only (GOAWAY, calls finish): tonic's own grace would replace the GOAWAY
            // by a hard close, so the grace is [`Aged`]'s.
            builder = builder.max_connection_age(age);
        }
        builder
            // Outermost: a call counts on its connection (busy: never evicted at the
            // connection bound) from its HEADERS, refused by admission or not.
            .layer(CallsLayer)
            .layer(AdmissionLayer::new(limiter.clone()))
            .add_service(rls.clone())
            .add_optional_service(rlqs.clone())
            .add_service(health_service.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
    };
    // A connection is cut at age + grace; without a grace it lives until its calls end.
    let lifetime = options
        .max_connection_age
        .zip(options.max_connection_age_grace)
        .map(|(age, grace)| age + grace);
    let grpc_stopped = stopped(stop_rx.clone());
    let grpc_tls = match &options.tls {
        None => "off",
        Some(tls) if tls.is_mutual() => "mutual",
        Some(_) => "on",
    };
    let mut grpc_threads = 1;
    let mut grpc_task = match grpc {
        GrpcListener::Tcp(TcpListeners { primary, extra }) => {
            grpc_threads += extra.len();
            // One connection bound for the port, shared by every serving thread.
            let bound = PortBound::new(bounds.grpc, Port::Grpc, metrics.clone());
            let mut threads = Vec::with_capacity(extra.len());
            for (index, listener) in extra.into_iter().enumerate() {
                let router = grpc_router();
                let tls = options.tls.clone();
                let stop = stop_rx.clone();
                let bound = bound.clone();
                let thread = runtime::spawn_runtime_thread(
                    format!("floodgate-grpc-{}", index + 1),
                    move || async move {
                        // Registered with this thread's runtime: its connections are served
                        // here.
                        let listener =
                            TcpListener::from_std(listener).map_err(ServerError::Http)?;
                        let admission = bound.admit(listener);
                        serve_tcp(router, admission, tls, lifetime, stopped(stop)).await
                    },
                )
                .map_err(ServerError::Http)?;
                threads.push(thread);
            }
            let primary = serve_tcp(
                grpc_router(),
                bound.admit(primary),
                options.tls.clone(),
                lifetime,
                grpc_stopped,
            );
            tokio::spawn(async move {
                let others =
                    futures_util::future::try_join_all(threads.into_iter().map(join_thread));
                futures_util::future::try_join(primary, others)
                    .await
                    .map(|_| ())
            })
        }
        GrpcListener::Unix(mut socket) => {
            // serve() refuses TLS on a socket before binding; a test passing both gets
            // plaintext, as the socket's only use here.
            let Some(listener) = socket.listener.take() else {
                return Err(ServerError::Settings("unix socket already served".into()));
            };
            let incoming = UnixListenerStream::new(listener)
                .map(move |stream| stream.map(|s| Aged::new(s, lifetime)));
            let serve = grpc_router().serve_with_incoming_shutdown(incoming, grpc_stopped);
            tokio::spawn(async move {
                let served = serve.await;
                // The socket file goes with the server.
                drop(socket);
                served.map_err(ServerError::from)
            })
        }
    };
    let mut http_task = match http {
        Some(http) => {
            let admin = http::router(AdminState {
                limiter,
                serving: serving.clone(),
                json_endpoint: options.json_endpoint,
                console: options.console.clone(),
            });
            let http = Admission::new(http, bounds.http, Port::Http, metrics);
            // With the peer's address: the console logs who changed a bucket. Each request
            // counts as a call on its connection: busy connections never make way for new ones.
            let http_server = axum::serve(
                http,
                CountAdminCalls(
                    admin.into_make_service_with_connect_info::<crate::listen::PeerAddr>(),
                ),
            )
            .with_graceful_shutdown(stopped(stop_rx));
            tokio::spawn(async move { http_server.await.map_err(ServerError::Http) })
        }
        // No admin HTTP: a task that only ends with the server keeps the shutdown logic one.
        None => tokio::spawn(async move {
            stopped(stop_rx).await;
            Ok(())
        }),
    };
    let grpc_max_connection_age = options.max_connection_age.map(|age| format!("{age:.0?}"));
    match http_addr {
        Some(http_addr) => tracing::info!(
            %grpc_addr, grpc_threads, grpc_tls, %http_addr, ?grpc_max_connection_age, "listening"
        ),
        None => tracing::info!(
            %grpc_addr, grpc_threads, grpc_tls, http_addr = "off", ?grpc_max_connection_age,
            "listening"
        ),
    }

    tokio::select! {
        () = shutdown => {}
        result = &mut grpc_task => return flatten(result),
        result = &mut http_task => return flatten(result),
    }

    tracing::info!("shutting down: health NOT_SERVING, draining in-flight requests");
    if let Some(mirror) = mirror {
        // Stop mirroring first, or a late store update could report SERVING again.
        mirror.abort();
        let _ = mirror.await;
    }
    health::publish(&health, &serving, Err(NotReady::ShuttingDown)).await;
    // Requests a max_wait limit holds would keep the drain waiting: answer them now.
    releases_waiting.release_waiting();
    // RLQS streams last as long as their Envoy: each expires its assignments and ends now.
    if let Some(rlqs) = &options.rlqs {
        rlqs.shut_down();
    }
    let _ = stop_tx.send(true);

    let grace = options.grace;
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

/// The gRPC server of one serving thread: tonic's router behind [`CallsLayer`] (calls counted
/// per connection) and [`AdmissionLayer`].
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        AdmissionLayer,
        tower::layer::util::Stack<CallsLayer, tower::layer::util::Identity>,
    >,
>;

/// Completes once `stop` says true (or its sender is gone, which only happens once the
/// server is stopping anyway).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Serves gRPC on a TCP `listener`, plaintext or TLS, each connection cut after `lifetime`
/// (if any), until `stopped` completes and the connections have drained.
async fn serve_tcp(
    router: GrpcRouter,
    listener: Admission,
    tls: Option<GrpcTls>,
    lifetime: Option<Duration>,
    stopped: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    match tls {
        None => {
            let incoming = listener
                .into_stream()
                .map(move |stream| stream.map(|s| Aged::new(s, lifetime)));
            router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await?;
        }
        Some(tls) => {
            let incoming = tls
                .incoming(listener)
                .map(move |stream| stream.map(|s| Aged::new(s, lifetime)));
            router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await?;
        }
    }
    Ok(())
}

/// Waits, off the runtime's thread, for a gRPC serving thread to end, and hands back its
/// result.
async fn join_thread(
    thread: std::thread::JoinHandle<io::Result<Result<(), ServerError>>>,
) -> Result<(), ServerError> {
    match tokio::task::spawn_blocking(move || thread.join()).await {
        Ok(Ok(Ok(served))) => served,
        Ok(Ok(Err(runtime))) => Err(ServerError::Http(runtime)),
        // A panic in a serving thread is a defect: re-raise it rather than hide it.
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The blocking pool is shutting down: so is the server.
        Err(_) => Ok(()),
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

/// Registers SIGTERM (Kubernetes) and SIGINT (Ctrl-C) handlers now, and returns a future that
/// completes on either. Registering before the listeners are announced means a signal sent as
/// soon as the server says "listening" is never handled by the default action (killing us).
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        let wait = |name: &'static str, registered: io::Result<tokio::signal::unix::Signal>| async move {
            match registered {
                Ok(mut s) => {
                    s.recv().await;
                    tracing::info!("{name} received");
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for {name}");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = wait("SIGTERM", term) => {}
            () = wait("SIGINT", int) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::settings::{Cli, Command};

    /// `Bounds::default()` (what tests and embedders get) is what the `serve` flags default to.
    #[test]
    fn default_bounds_are_the_flag_defaults() {
        let Command::Serve(settings) =
            Cli::parse_from(["floodgate", "serve", "--config", "x"]).command
        else {
            panic!("not serve");
        };
        assert_eq!(Bounds::from_settings(&settings.bounds), Bounds::default());
    }
}
