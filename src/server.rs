//! Serving: gRPC (rate-limit service, `grpc.health.v1`, reflection) and admin HTTP, with
//! graceful shutdown.
//!
//! [`run`] takes already-bound listeners and a shutdown future, so tests bind `127.0.0.1:0`
//! and never sleep. gRPC is plaintext or TLS ([`crate::tls`]) over the same tonic server: only
//! the stream of incoming connections differs. [`serve`] is what `floodgate serve` does:
//! build everything from settings, bind, log the addresses, watch the limits for changes
//! (unless `--watch-config=false`) and the TLS files (when TLS is on), and run until SIGTERM
//! or SIGINT.
//!
//! Shutdown order: health turns NOT_SERVING (gRPC health and `/healthcheck`), both servers
//! stop accepting connections and drain in-flight requests, and after the grace period any
//! straggler is cut off.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

use crate::clock::SystemClock;
use crate::config::reload;
use crate::config::{Config, ConfigErrors, Defaults, Loader};
use crate::file_watch::FileWatch;
use crate::http::{self, AdminState};
use crate::metrics::Metrics;
use crate::plan::PlanOptions;
use crate::proto::{self, rls::rate_limit_service_server::RateLimitServiceServer};
use crate::service::{RateLimiter, RlsService};
use crate::settings::ServeSettings;
use crate::store::redis::cluster::{ClusterSettings, ClusterStore};
use crate::store::redis::{RedisSettings, RedisStore, RedisTls, SentinelSettings};
use crate::store::{FailurePolicy, MemoryStore, RemoteStore, Resilience, ResilientStore, Store};
use crate::tls::{GrpcTls, TlsError};

/// Name under which the rate-limit service reports health (besides the server-wide "").
const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// How long without a single successful Redis call before failures open the breaker. Under
/// overload some call always succeeds within this; a dead or frozen Redis gives none. (Tied
/// to the command timeout instead, saturation benchmarks opened the breaker on a healthy
/// Redis; refused connections fail in µs anyway, so the wait costs only health latency.)
const BREAKER_QUIET_PERIOD: Duration = Duration::from_secs(1);

/// How often a Redis behind an open circuit breaker is probed.
const PROBE_INTERVAL: Duration = Duration::from_millis(250);

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
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(io::Error),
    /// Reflection could not be built from the embedded descriptors (a build defect).
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
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
}

impl RunOptions {
    /// The options `prepared` asks for.
    pub fn from_prepared(prepared: &Prepared) -> RunOptions {
        let settings = &prepared.settings;
        RunOptions {
            grace: settings.shutdown_grace,
            grpc_max_message_bytes: settings.grpc_max_message_bytes as usize,
            json_endpoint: settings.json_endpoint,
            tls: prepared.tls.clone(),
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
    /// The settings it was built from.
    pub settings: ServeSettings,
}

/// Loads the limits and builds the request path; fails on anything an operator must fix.
pub fn prepare(settings: ServeSettings) -> Result<Prepared, ServerError> {
    let metrics = Metrics::shared();
    let loader = loader(&settings)?;
    let config = loader.load().map_err(|errors| {
        metrics.record_config_load(false);
        ServerError::Config {
            path: loader.source.to_string(),
            errors,
        }
    })?;
    metrics.record_config_load(true);
    tracing::info!(
        path = %loader.source,
        domains = config.domains().count(),
        merge_domains = settings.merge_domains,
        "limits loaded"
    );
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
    let (store, memory, redis): (Arc<dyn Store>, _, _) = match remote_store(&settings, &metrics)? {
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
                },
                fallback.clone(),
                metrics.clone(),
            ));
            (resilient.clone(), fallback, Some(resilient))
        }
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
                limits: settings.request_limits(),
                headers: settings.response.header_options(),
                near_limit_ratio: settings.response.near_limit_ratio,
                dynamic_metadata: settings.response.response_dynamic_metadata,
            },
            metrics,
        )
        .with_max_in_flight(settings.max_in_flight as usize),
    );
    Ok(Prepared {
        limiter,
        config,
        memory,
        redis,
        tls,
        settings,
    })
}

/// The remote store the settings name: a Redis Cluster (`--redis-cluster`), or a standalone or
/// Sentinel-managed Redis; `None` for the memory store. The `--redis-tls-*` files apply to
/// each of them.
fn remote_store(
    settings: &ServeSettings,
    metrics: &Arc<Metrics>,
) -> Result<Option<Arc<dyn RemoteStore>>, ServerError> {
    let tls = RedisTls {
        ca_file: settings.redis_tls_ca_file.clone(),
        cert_file: settings.redis_tls_cert_file.clone(),
        key_file: settings.redis_tls_key_file.clone(),
    };
    let settings_error = |e: &dyn std::fmt::Display| ServerError::Settings(e.to_string());
    if !settings.redis_cluster.is_empty() {
        // redis-rs turns TLS on for every node once certificates are given, whatever the
        // seeds say: refuse plain or mixed seeds here, as the standalone and Sentinel paths do.
        let tls_seeds = settings
            .redis_cluster
            .iter()
            .filter(|seed| seed.starts_with("rediss://"))
            .count();
        if tls_seeds != 0 && tls_seeds != settings.redis_cluster.len() {
            return Err(ServerError::Settings(
                "--redis-cluster mixes rediss:// and plain seeds: a cluster is all TLS or none"
                    .into(),
            ));
        }
        if tls.is_set() && tls_seeds == 0 {
            return Err(ServerError::Settings(
                "Redis TLS files are set, but the --redis-cluster seeds do not use rediss://"
                    .into(),
            ));
        }
        let certificates =
            crate::store::redis::tls::certificates(&tls).map_err(|e| settings_error(&e))?;
        let cluster = ClusterStore::new(
            &ClusterSettings {
                seeds: settings.redis_cluster.clone(),
                key_prefix: settings.redis_key_prefix.clone(),
                connect_timeout: settings.redis_connect_timeout_ms,
                command_timeout: settings.redis_timeout_ms,
            },
            metrics.clone(),
            certificates,
        )
        .map_err(|e| settings_error(&e))?;
        return Ok(Some(Arc::new(cluster)));
    }
    match redis_settings(settings, tls)? {
        None => Ok(None),
        Some(redis) => {
            let store = RedisStore::new(&redis).map_err(|e| settings_error(&e))?;
            Ok(Some(Arc::new(store)))
        }
    }
}

/// The Redis store's settings, or `None` for the memory store.
fn redis_settings(
    settings: &ServeSettings,
    tls: RedisTls,
) -> Result<Option<RedisSettings>, ServerError> {
    let sentinel = settings
        .redis_sentinel
        .as_ref()
        .map(|master_name| SentinelSettings {
            master_name: master_name.clone(),
            nodes: settings.redis_sentinel_nodes.clone(),
        });
    let url = match (&settings.redis_url, &sentinel) {
        (Some(url), _) => url.clone(),
        // The master's address comes from the sentinels; plain TCP, no credentials.
        (None, Some(sentinel)) => format!("redis://{}", sentinel.master_name),
        (None, None) if tls.is_set() => {
            return Err(ServerError::Settings(
                "Redis TLS files are set, but no Redis is (--redis-url, --redis-sentinel or \
                 --redis-cluster)"
                    .into(),
            ));
        }
        (None, None) => return Ok(None),
    };
    Ok(Some(RedisSettings {
        url,
        sentinel,
        tls,
        key_prefix: settings.redis_key_prefix.clone(),
        pool_size: settings.redis_pool_size,
        connect_timeout: settings.redis_connect_timeout_ms,
        command_timeout: settings.redis_timeout_ms,
    }))
}

/// Binds the configured addresses and serves until SIGTERM or SIGINT.
pub async fn serve(prepared: Prepared) -> Result<(), ServerError> {
    let settings = &prepared.settings;
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })
    };
    let grpc = bind(settings.grpc_addr).await?;
    let http = if settings.no_http {
        None
    } else {
        Some(bind(settings.http_addr).await?)
    };
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
        redis = ?settings.redis_url.as_deref().map(crate::settings::redact_url),
        redis_sentinel = ?settings.redis_sentinel,
        redis_cluster = ?settings.redis_cluster_redacted(),
        on_store_error = settings.on_store_error.as_str(),
        shadow_mode = settings.shadow_mode,
        quota_mode = settings.quota_mode,
        default_algorithm = %crate::config::algorithm_name(settings.algorithm.value.into()),
        default_algorithm_reason = %settings.algorithm_choice.reason(),
        "floodgate starting"
    );
    // Live until the server has stopped; dropping them stops the watchers.
    let _watch = watch_limits(&prepared);
    let _tls_watch = prepared.tls.as_ref().and_then(watch_tls);
    let shutdown = shutdown_signal();
    run(
        grpc,
        http,
        prepared.limiter.clone(),
        RunOptions::from_prepared(&prepared),
        store_health,
        shutdown,
    )
    .await?;
    tracing::info!("floodgate stopped");
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
    let on_reload = move |_: &Config| {
        // Denials cached under the old limits may be wrong under the new ones.
        if let Some(redis) = &redis {
            redis.clear_cache();
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

/// Serves gRPC on `grpc` and admin HTTP on `http` (none: no admin HTTP at all) until
/// `shutdown` completes, then drains: health goes NOT_SERVING, both servers stop accepting and
/// finish in-flight requests, for at most `options.grace`. While `store_health` (if given) says false, health reports
/// NOT_SERVING.
pub async fn run(
    grpc: TcpListener,
    http: Option<TcpListener>,
    limiter: Arc<RateLimiter>,
    options: RunOptions,
    store_health: Option<watch::Receiver<bool>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let grpc_addr = grpc.local_addr().map_err(ServerError::Http)?;
    let http_addr = match &http {
        Some(http) => Some(http.local_addr().map_err(ServerError::Http)?),
        None => None,
    };

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    health
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::Serving)
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let serving = Arc::new(AtomicBool::new(true));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mirror = store_health.map(|store_health| {
        tokio::spawn(mirror_store_health(
            store_health,
            health.clone(),
            serving.clone(),
        ))
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        // An Err means the sender is gone, which only happens once we are stopping anyway.
        let _ = rx.wait_for(|stop| *stop).await;
    };

    // RLS requests are a few hundred bytes; tonic's 4 MiB default would let one hostile
    // message make the server allocate and decode megabytes.
    let rls = RateLimitServiceServer::new(RlsService::new(limiter.clone()))
        .max_decoding_message_size(options.grpc_max_message_bytes);
    let grpc_router = tonic::transport::Server::builder()
        .add_service(rls)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let grpc_stopped = stopped(stop_rx.clone());
    let grpc_tls = match &options.tls {
        None => "off",
        Some(tls) if tls.is_mutual() => "mutual",
        Some(_) => "on",
    };
    let mut grpc_task = match options.tls {
        None => {
            // Envoy multiplexes many requests on few connections: answer each small message
            // at once.
            let incoming = TcpListenerStream::new(grpc).map(|stream| {
                stream.inspect(|s| {
                    let _ = s.set_nodelay(true);
                })
            });
            tokio::spawn(grpc_router.serve_with_incoming_shutdown(incoming, grpc_stopped))
        }
        Some(tls) => {
            tokio::spawn(grpc_router.serve_with_incoming_shutdown(tls.incoming(grpc), grpc_stopped))
        }
    };
    let mut http_task = match http {
        Some(http) => {
            let admin = http::router(AdminState {
                limiter,
                serving: serving.clone(),
                json_endpoint: options.json_endpoint,
            });
            let http_server = axum::serve(http, admin).with_graceful_shutdown(stopped(stop_rx));
            tokio::spawn(async move { http_server.await.map_err(ServerError::Http) })
        }
        // No admin HTTP: a task that only ends with the server keeps the shutdown logic one.
        None => tokio::spawn(async move {
            stopped(stop_rx).await;
            Ok(())
        }),
    };
    match http_addr {
        Some(http_addr) => tracing::info!(%grpc_addr, grpc_tls, %http_addr, "listening"),
        None => tracing::info!(%grpc_addr, grpc_tls, http_addr = "off", "listening"),
    }

    tokio::select! {
        () = shutdown => {}
        result = &mut grpc_task => return flatten(result.map(|r| r.map_err(ServerError::from))),
        result = &mut http_task => return flatten(result),
    }

    tracing::info!("shutting down: health NOT_SERVING, draining in-flight requests");
    if let Some(mirror) = mirror {
        // Stop mirroring first, or a late store update could report SERVING again.
        mirror.abort();
        let _ = mirror.await;
    }
    serving.store(false, Ordering::SeqCst);
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_service_status(RLS_SERVICE_NAME, ServingStatus::NotServing)
        .await;
    let _ = stop_tx.send(true);

    let grace = options.grace;
    let drained = tokio::time::timeout(grace, async {
        let grpc = flatten((&mut grpc_task).await.map(|r| r.map_err(ServerError::from)));
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

/// Reports the store's availability through gRPC health and `/healthcheck` (until aborted
/// at shutdown).
async fn mirror_store_health(
    mut store: watch::Receiver<bool>,
    health: tonic_health::server::HealthReporter,
    serving: Arc<AtomicBool>,
) {
    loop {
        let usable = *store.borrow_and_update();
        let status = if usable {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        serving.store(usable, Ordering::SeqCst);
        health.set_service_status("", status).await;
        health.set_service_status(RLS_SERVICE_NAME, status).await;
        if store.changed().await.is_err() {
            return;
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
