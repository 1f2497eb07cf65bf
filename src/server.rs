//! Serving: gRPC (rate-limit service, `grpc.health.v1`, reflection) and admin HTTP, with
//! graceful shutdown.
//!
//! [`run`] takes already-bound listeners and a shutdown future, so tests bind `127.0.0.1:0`
//! and never sleep. gRPC is plaintext or TLS ([`crate::listen::tls`]) over the same tonic server: only
//! the stream of incoming connections differs. [`serve`] is what `floodgate serve` does:
//! build everything from settings, bind, log the addresses, watch the limits for changes
//! (unless `--watch-config=false`) and the TLS files (when TLS is on), and run until SIGTERM
//! or SIGINT.
//!
//! gRPC listens on a TCP address or a unix socket ([`listener`]); what health reports is
//! [`health`]'s; which Redis (or two: per-second limits apart) is `remote`'s.
//!
//! Shutdown order: health turns NOT_SERVING (gRPC health and `/healthcheck`), both servers
//! stop accepting connections and drain in-flight requests, and after the grace period any
//! straggler is cut off.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

use crate::admission::AdmissionLayer;
use crate::clock::SystemClock;
use crate::config::reload;
use crate::config::{Config, ConfigErrors, Defaults, Loader};
use crate::console::{AdminToken, ConsoleOptions};
use crate::file_watch::FileWatch;
use crate::http::{self, AdminState, NotReady, Readiness};
use crate::listen::tls::{GrpcTls, TlsError};
use crate::listen::{Admission, ConnectionLimits, PortBound};
use crate::metrics::{Metrics, Port};
use crate::otel::{TraceError, Traces};
use crate::plan::PlanOptions;
use crate::proto::{self, rls::rate_limit_service_server::RateLimitServiceServer};
use crate::runtime;
use crate::service::{RateLimiter, RlsService};
use crate::settings::{BoundsSettings, ServeSettings};
use crate::store::{FailurePolicy, MemoryStore, Resilience, ResilientStore, Store};

pub mod health;
pub mod listener;
mod remote;
mod xds;

pub use listener::GrpcListener;
use listener::{Aged, TcpListeners};

/// How long without a single successful Redis call before failures open the breaker. Under
/// overload some call always succeeds within this; a dead or frozen Redis gives none. (Tied
/// to the command timeout instead, saturation benchmarks opened the breaker on a healthy
/// Redis; refused connections fail in µs anyway, so the wait costs only health latency.)
const BREAKER_QUIET_PERIOD: Duration = Duration::from_secs(1);

/// How often a Redis behind an open circuit breaker is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a gRPC connection may be quiet before the server pings it (unless
/// `--grpc-keepalive-interval` says more often), and how long the answer may take: a dead peer
/// is found within their sum, and a live one is never silent for the idle timeout.
const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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
            },
            http: ConnectionLimits {
                max_connections: 100,
                idle_timeout: Duration::from_secs(60),
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
            },
            http: ConnectionLimits {
                max_connections: count(settings.http_max_connections),
                idle_timeout: settings.http_idle_timeout,
            },
            grpc_max_concurrent_streams: settings.grpc_max_concurrent_streams,
            grpc_request_timeout: settings.grpc_request_timeout,
        }
    }
}

impl RunOptions {
    /// The options `prepared` asks for.
    pub fn from_prepared(prepared: &Prepared) -> RunOptions {
        let settings = &prepared.settings;
        let connections = &settings.grpc_connections;
        RunOptions {
            grace: settings.shutdown_grace,
            grpc_max_message_bytes: settings.grpc_max_message_bytes as usize,
            json_endpoint: settings.json_endpoint,
            tls: prepared.tls.clone(),
            limits_health: prepared.limits_loaded.as_ref().map(|tx| tx.subscribe()),
            max_connection_age: connections.jittered_max_age(jitter()),
            max_connection_age_grace: connections.grpc_max_connection_age_grace,
            keepalive_interval: connections.grpc_keepalive_interval,
            bounds: Bounds::from_settings(&settings.bounds),
            console: ConsoleOptions {
                token: prepared.admin_token.clone(),
                read_requires_token: settings.console.admin_read_requires_token,
                redis: prepared.redis.clone(),
            },
        }
    }
}

/// Everything `floodgate serve` needs, built and validated before any port is bound.
pub struct Prepared {
    /// The request path.
    pub limiter: Arc<RateLimiter>,
    /// The limits in force, shared with the limiter; hot reload swaps them.
    pub config: Arc<ArcSwap<Config>>,
    /// The memory store, when it is the store (its sweeper starts with the server).
    pub memory: Option<Arc<MemoryStore>>,
    /// The Redis (or Redis Cluster) store with its failure policy, when configured.
    pub redis: Option<Arc<ResilientStore>>,
    /// TLS on the gRPC port, loaded, when configured.
    pub tls: Option<GrpcTls>,
    /// With `--health-requires-limits`: whether the limits in force have a domain; hot
    /// reload updates it. With xDS: whether a first configuration has loaded.
    pub limits_loaded: Option<Arc<watch::Sender<bool>>>,
    /// The xDS client's options, when a control plane pushes the limits.
    pub xds: Option<crate::config::xds::XdsOptions>,
    /// The trace export pipeline, when `--tracing` is on; flushed when the server stops.
    pub traces: Option<Arc<Traces>>,
    /// The operator console's bearer token (none configured: mutations refused).
    pub admin_token: AdminToken,
    /// The settings it was built from.
    pub settings: ServeSettings,
}

/// Loads the limits and builds the request path; fails on anything an operator must fix.
pub fn prepare(settings: ServeSettings) -> Result<Prepared, ServerError> {
    let metrics = Metrics::shared();
    metrics.set_max_detailed_series(
        usize::try_from(settings.bounds.metrics_max_detailed_series).unwrap_or(usize::MAX),
    );
    // Before the limits load, so config_load_success / config_load_error count it.
    let statsd = settings.statsd.config();
    if let Some(statsd) = &statsd {
        tracing::info!(addr = %statsd.addr, protocol = ?statsd.protocol, flavor = ?statsd.flavor,
                       flush_interval = ?statsd.flush_interval, "statsd stats on");
    }
    // The debug port's /stats shows them too.
    if statsd.is_some()
        || settings.statsd.reference_prometheus().is_some()
        || settings.statsd.debug_addr.is_some()
    {
        metrics.attach_reference_stats(statsd);
    }
    let xds = match &settings.xds.config_xds {
        Some(url) => Some(xds::options(
            &settings.xds,
            url,
            Defaults {
                algorithm: settings.algorithm.value.into(),
            },
            settings.merge_domains,
        )?),
        None => None,
    };
    let (config, limits_loaded) = match &xds {
        // The control plane pushes the limits once connected: none until then.
        Some(_) => {
            let ready = settings.xds.xds_force_start;
            if !ready {
                tracing::warn!(
                    "limits from xDS: NOT_SERVING until a first configuration has loaded \
                     (--xds-force-start to serve before)"
                );
            }
            (Config::empty(), Some(Arc::new(watch::Sender::new(ready))))
        }
        None => load_files(&settings, &metrics)?,
    };
    let tls = match settings.grpc_tls.files() {
        Some(files) => {
            let tls = GrpcTls::load(files, metrics.clone())?;
            tracing::info!(mutual = tls.is_mutual(), "gRPC TLS certificate loaded");
            Some(tls)
        }
        None => None,
    };
    let max_buckets = usize::try_from(settings.memory_max_buckets).unwrap_or(usize::MAX);
    let memory_store = || {
        let memory = Arc::new(
            MemoryStore::new(Arc::new(SystemClock))
                .with_max_buckets(max_buckets, Some(metrics.clone())),
        );
        // Read at every scrape: exact, and no task to keep alive.
        let weak = Arc::downgrade(&memory);
        metrics.sample_before_encode(move |metrics| {
            if let Some(memory) = weak.upgrade() {
                metrics.set_memory_buckets(memory.len());
            }
        });
        memory
    };
    let (store, memory, redis): (Arc<dyn Store>, _, _) =
        match remote::remote_store(&settings, &metrics)? {
            None => {
                let memory = memory_store();
                (memory.clone(), Some(memory), None)
            }
            Some(remote) => {
                let fallback = (settings.on_store_error == FailurePolicy::Local).then(memory_store);
                let resilient = Arc::new(ResilientStore::new(
                    remote,
                    Resilience {
                        policy: settings.on_store_error,
                        cache_capacity: settings.local_cache_size,
                        failure_threshold: settings.redis_failure_threshold,
                        quiet_period: BREAKER_QUIET_PERIOD,
                        shed_deadline: settings.redis_shedding.then_some(settings.redis_timeout_ms),
                    },
                    fallback.clone(),
                    metrics.clone(),
                ));
                (resilient.clone(), fallback, Some(resilient))
            }
        };
    let traces = match settings.traces.export() {
        Some(export) => {
            let traces = Traces::start(&export)?;
            tracing::info!(
                transport = ?export.transport,
                endpoint = export
                    .endpoint
                    .as_deref()
                    .unwrap_or("(OTEL_EXPORTER_OTLP_* or localhost)"),
                service_name = %export.service_name,
                sampling_rate = export.sampling_rate,
                parent_based = export.parent_based,
                "OpenTelemetry traces on"
            );
            Some(Arc::new(traces))
        }
        None => None,
    };
    let admin_token = match &settings.console.admin_token_file {
        Some(path) => AdminToken::load(path).map_err(|e| ServerError::Settings(e.to_string()))?,
        None => AdminToken::none(),
    };
    let config = Arc::new(ArcSwap::from_pointee(config));
    let limiter = Arc::new(
        RateLimiter::new(
            config.clone(),
            store,
            PlanOptions {
                shadow_mode: settings.shadow_mode,
                quota_mode: settings.quota_mode,
                default_algorithm: settings.algorithm.value.into(),
                override_max_wait_us: settings.max_wait_for_overrides,
                limits: settings.request_limits(),
                headers: settings.response.header_options(),
                near_limit_ratio: settings.response.near_limit_ratio,
                dynamic_metadata: settings.response.response_dynamic_metadata,
                reference_counters: settings
                    .counters
                    .plan_options(settings.runtime_layout.is_some()),
            },
            metrics,
        )
        .with_max_in_flight(settings.max_in_flight as usize)
        .with_traces(traces.clone()),
    );
    Ok(Prepared {
        traces,
        limiter,
        config,
        memory,
        redis,
        tls,
        limits_loaded,
        xds,
        admin_token,
        settings,
    })
}

/// The limits from files, loaded once at start-up, and (with `--health-requires-limits`)
/// whether they have a domain.
type Loaded = (Config, Option<Arc<watch::Sender<bool>>>);

fn load_files(settings: &ServeSettings, metrics: &Arc<Metrics>) -> Result<Loaded, ServerError> {
    let loader = loader(settings)?;
    let config = loader
        .load_within(crate::config::LOAD_DEADLINE)
        .map_err(|errors| {
            metrics.record_config_load(false);
            ServerError::Config {
                path: loader.source.to_string(),
                errors,
            }
        })?;
    metrics.record_config_load_with(
        true,
        &format!("loaded at start-up: {} domain(s)", config.domains().count()),
    );
    tracing::info!(
        path = %loader.source,
        domains = config.domains().count(),
        merge_domains = settings.merge_domains,
        "limits loaded"
    );
    let limits_loaded = settings.health_requires_limits.then(|| {
        let loaded = has_domains(&config);
        if !loaded {
            tracing::warn!(
                limits = %loader.source,
                "no domain loaded: NOT_SERVING until one is (--health-requires-limits)"
            );
        }
        Arc::new(watch::Sender::new(loaded))
    });
    Ok((config, limits_loaded))
}

/// Whether `config` has at least one domain (what `--health-requires-limits` asks).
fn has_domains(config: &Config) -> bool {
    config.domains().next().is_some()
}

/// A number in [-1, 1], different in every process: spreads the connection age of replicas
/// started together (std's hasher keys are random per process).
fn jitter() -> f64 {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (random as f64 / u64::MAX as f64) * 2.0 - 1.0
}

/// Binds the configured addresses and serves until SIGTERM or SIGINT.
pub async fn serve(prepared: Prepared) -> Result<(), ServerError> {
    let settings = &prepared.settings;
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
            if prepared.tls.is_some() {
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
    serve_reference_prometheus(&prepared, &bounds).await?;
    serve_debug(&prepared, &bounds).await?;
    if let Some(memory) = &prepared.memory {
        memory.spawn_sweeper(SWEEP_INTERVAL);
    }
    let mut store_health = None;
    if let Some(redis) = &prepared.redis {
        redis.spawn_probe(PROBE_INTERVAL);
        // Only under policy `error` is the service unusable while Redis is: the other
        // policies still answer, so health stays SERVING.
        if settings.on_store_error == FailurePolicy::Error {
            store_health = Some(redis.availability());
        }
    }
    tracing::info!(
        store = prepared.redis.as_ref().map_or("memory", |redis| redis.name()),
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
    let _watch = match &prepared.xds {
        None => watch_limits(&prepared).map(Following::Files),
        Some(options) => Some(Following::Xds(follow_xds(&prepared, options.clone()))),
    };
    let _tls_watch = prepared.tls.as_ref().and_then(watch_tls);
    let _token_watch = match prepared.admin_token.watch() {
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
        prepared.limiter.clone(),
        RunOptions::from_prepared(&prepared),
        store_health,
        shutdown,
    )
    .await;
    // Spans of the drained requests are still queued: export them before the process exits.
    if let Some(traces) = &prepared.traces {
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
    prepared: &Prepared,
    bounds: &Bounds,
) -> Result<(), ServerError> {
    let Some(prom) = prepared.settings.statsd.reference_prometheus() else {
        return Ok(());
    };
    let metrics = prepared.limiter.metrics();
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
        if let Err(e) = axum::serve(admission, router).await {
            tracing::error!(error = %e, "the reference's Prometheus listener failed");
        }
    });
    tracing::info!(%addr, path = %prom.path, "serving the reference's Prometheus series");
    Ok(())
}

/// Binds and serves the reference's debug port when asked to (`--debug-addr`), within the
/// HTTP port's connection bounds; like the Prometheus one, it lives as long as the process.
async fn serve_debug(prepared: &Prepared, bounds: &Bounds) -> Result<(), ServerError> {
    let Some(addr) = prepared.settings.statsd.debug_addr else {
        return Ok(());
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(ServerError::Http)?;
    let router = http::debug_router(Arc::clone(&prepared.limiter));
    let metrics = Arc::clone(prepared.limiter.metrics());
    let admission = Admission::new(listener, bounds.http, Port::Debug, metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(admission, router).await {
            tracing::error!(error = %e, "the debug listener failed");
        }
    });
    tracing::info!(addr = %bound, "serving the debug port (/rlconfig, /stats)");
    Ok(())
}

/// The limits loader, identical at start-up and on every reload.
fn loader(settings: &ServeSettings) -> Result<Loader, ServerError> {
    Ok(Loader {
        source: settings
            .limits_source()
            .map_err(|e| ServerError::Settings(e.to_string()))?,
        defaults: Defaults {
            algorithm: settings.algorithm.value.into(),
        },
        merge_domains: settings.merge_domains,
    })
}

/// Starts hot reload of the limits, unless turned off. A watcher that cannot start (e.g. the
/// inotify instance limit is reached) is logged and the server runs on the limits it loaded:
/// refusing to serve would take every request's rate limiting down over a convenience.
fn watch_limits(prepared: &Prepared) -> Option<FileWatch> {
    let settings = &prepared.settings;
    if !settings.watch_config {
        tracing::info!("limits hot reload off (--watch-config=false)");
        return None;
    }
    // prepare() loaded the limits with this loader, so it can be built.
    let loader = loader(settings).ok()?;
    let redis = prepared.redis.clone();
    let limits_loaded = prepared.limits_loaded.clone();
    let on_reload = move |config: &Config| {
        // Denials cached under the old limits may be wrong under the new ones.
        if let Some(redis) = &redis {
            redis.clear_cache();
        }
        if let Some(loaded) = &limits_loaded {
            let now = has_domains(config);
            if !now {
                tracing::warn!("no domain loaded: NOT_SERVING until one is");
            }
            loaded.send_replace(now);
        }
    };
    match reload::spawn(
        loader,
        prepared.config.clone(),
        prepared.limiter.metrics().clone(),
        on_reload,
    ) {
        Ok(watch) => Some(watch),
        Err(e) => {
            tracing::error!("{e}; limits hot reload is off");
            None
        }
    }
}

/// How the limits are followed while serving: dropping it stops that.
enum Following {
    /// File watches.
    Files(#[allow(dead_code, reason = "held for its Drop")] FileWatch),
    /// The xDS client task.
    Xds(#[allow(dead_code, reason = "held for its Drop")] AbortOnDrop),
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the xDS client: each configuration that loads is swapped in, clears the over-limit
/// cache and makes the server ready (unless `--health-requires-limits` finds no domain).
fn follow_xds(prepared: &Prepared, options: crate::config::xds::XdsOptions) -> AbortOnDrop {
    let redis = prepared.redis.clone();
    let limits_loaded = prepared.limits_loaded.clone();
    let requires_domain = prepared.settings.health_requires_limits;
    let on_load = move |config: &Config| {
        // Denials cached under the old limits may be wrong under the new ones.
        if let Some(redis) = &redis {
            redis.clear_cache();
        }
        if let Some(loaded) = &limits_loaded {
            loaded.send_replace(!requires_domain || has_domains(config));
        }
    };
    tracing::info!(node_id = %options.node.id, "limits from an xDS management server");
    AbortOnDrop(crate::config::xds::spawn(
        options,
        prepared.config.clone(),
        prepared.limiter.metrics().clone(),
        on_load,
    ))
}

/// Starts reloading the TLS files when they change. As for the limits, a watcher that cannot
/// start is logged and the server serves the certificate it loaded.
fn watch_tls(tls: &GrpcTls) -> Option<FileWatch> {
    match tls.watch() {
        Ok(watch) => Some(watch),
        Err(e) => {
            tracing::error!("{e}; TLS certificate reload is off");
            None
        }
    }
}

/// Serves gRPC on `grpc` (a TCP listener or a [`GrpcListener`]) and admin HTTP on `http`
/// (none: no admin HTTP at all) until `shutdown` completes, then drains: health goes
/// NOT_SERVING, both servers stop accepting and finish in-flight requests, for at most
/// `options.grace`. While `store_health` (if given) or `options.limits_health` (if given) says
/// false, health reports NOT_SERVING.
pub async fn run(
    grpc: impl Into<GrpcListener>,
    http: Option<TcpListener>,
    limiter: Arc<RateLimiter>,
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
            .layer(AdmissionLayer::new(limiter.clone()))
            .add_service(rls.clone())
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
            // With the peer's address: the console logs who changed a bucket.
            let http_server = axum::serve(
                http,
                admin.into_make_service_with_connect_info::<crate::listen::PeerAddr>(),
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

/// The gRPC server of one serving thread: tonic's router behind [`AdmissionLayer`].
type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<AdmissionLayer, tower::layer::util::Identity>,
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
