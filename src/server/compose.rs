//! The composition root: everything `floodgate serve` runs, built from its settings before
//! any port is bound ([`assemble`] → [`Components`]): the limits (loaded from files, or none
//! until an xDS control plane pushes them), the store (memory, or Redis behind its failure
//! policy), gRPC TLS, traces, the admin token, and the decider over them; then, while
//! serving, the watchers that keep them current (limits files or the xDS client, TLS files).
//!
//! [`super::serve`] binds and serves the components; [`super::run`] is the serving loop
//! itself, for callers (tests) that build their own decider.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::error::ServerError;
use super::options::{Bounds, RunOptions};
use super::{remote, xds};
use crate::clock::SystemClock;
use crate::config::{Config, Defaults, format_wait};
use crate::console::{AdminToken, ConsoleOptions};
use crate::file_watch::FileWatch;
use crate::plan::PlanOptions;
use crate::rlqs::{MemoryShares, RedisShares, Rlqs, RlqsMetrics, Shares};
use crate::service::Decider;
use crate::settings::ServeSettings;
use crate::sources::files::{self, Loader};
use crate::sources::{Limits, Publisher, Snapshot, SourceMetrics};
use crate::store::lease::LeaseStore;
use crate::store::shed::host;
use crate::store::{
    FailurePolicy, LeaseMetrics, MemoryStore, RemoteStore, Resilience, ResilientStore, Store,
    StoreMetrics,
};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::otel::Traces;
use crate::telemetry::statsd::Mapper;
use crate::transport::TransportMetrics;
use crate::transport::tls::GrpcTls;

/// How long without a single successful Redis call before failures open the breaker. Under
/// overload some call always succeeds within this; a dead or frozen Redis gives none. (Tied
/// to the command timeout instead, saturation benchmarks opened the breaker on a healthy
/// Redis; refused connections fail in µs anyway, so the wait costs only health latency.)
const BREAKER_QUIET_PERIOD: Duration = Duration::from_secs(1);

impl RunOptions {
    /// The options `components` ask for.
    pub fn from_components(components: &Components) -> RunOptions {
        let settings = &components.settings;
        let connections = &settings.grpc_connections;
        RunOptions {
            drain_period: settings.drain_period,
            grace: settings.shutdown_grace,
            grpc_max_message_bytes: settings.grpc_max_message_bytes as usize,
            max_in_flight_bytes: usize::try_from(settings.max_in_flight_bytes)
                .unwrap_or(usize::MAX),
            json_endpoint: settings.json_endpoint,
            tls: components.tls.clone(),
            limits_health: components.limits_loaded.as_ref().map(|tx| tx.subscribe()),
            max_connection_age: connections.jittered_max_age(jitter()),
            max_connection_age_grace: connections.grpc_max_connection_age_grace,
            keepalive_interval: connections.grpc_keepalive_interval,
            bounds: Bounds::from_settings(&settings.bounds),
            transport: components.transport.clone(),
            rlqs: Some(components.rlqs.clone()),
            console: ConsoleOptions {
                token: components.admin_token.clone(),
                read_requires_token: settings.console.admin_read_requires_token,
                allowed_hosts: settings
                    .console
                    .admin_allowed_hosts
                    .iter()
                    .map(|host| host.trim().to_ascii_lowercase())
                    .filter(|host| !host.is_empty())
                    .collect(),
                redis: components.redis.clone(),
                loads: components.sources.history(),
            },
        }
    }
}

/// Everything `floodgate serve` runs, built and validated before any port is bound.
pub struct Components {
    /// The request path.
    pub decider: Arc<Decider>,
    /// The limits in force and their rules' series handles, shared with the decider; hot
    /// reload swaps them.
    pub limits: Limits,
    /// Where the limits sources count their loads (and resolve rules' series handles).
    pub sources: SourceMetrics,
    /// Where the listeners count connections.
    pub transport: TransportMetrics,
    /// The memory store, when it is the store (its sweeper starts with the server).
    pub memory: Option<Arc<MemoryStore>>,
    /// The Redis (or Redis Cluster) store with its failure policy, when configured.
    pub redis: Option<Arc<ResilientStore>>,
    /// The leases on Redis's hot buckets, unless `--lease-fraction 0` or no Redis: swept
    /// while serving, returned at shutdown.
    pub leases: Option<Arc<LeaseStore>>,
    /// TLS on the gRPC port, loaded, when configured.
    pub tls: Option<GrpcTls>,
    /// With `--health-requires-limits`: whether the limits in force have a domain; hot
    /// reload updates it. With xDS: whether a first configuration has loaded.
    pub limits_loaded: Option<Arc<watch::Sender<bool>>>,
    /// The xDS client's options, when a control plane pushes the limits.
    pub xds: Option<crate::sources::xds::XdsOptions>,
    /// The trace export pipeline, when `--tracing` is on; flushed when the server stops.
    pub traces: Option<Arc<Traces>>,
    /// The operator console's bearer token (none configured: mutations refused).
    pub admin_token: AdminToken,
    /// The Rate Limit Quota Service's shared state.
    pub rlqs: Arc<Rlqs>,
    /// The settings it was built from.
    pub settings: ServeSettings,
}

/// Loads the limits and builds the request path; fails on anything an operator must fix.
pub fn assemble(settings: ServeSettings) -> Result<Components, ServerError> {
    let metrics = Arc::new(Metrics::new());
    // Each capability registers the families it owns, once, and counts through the handles.
    let store_metrics = StoreMetrics::register(&metrics);
    let lease_metrics = LeaseMetrics::register(&metrics);
    let source_metrics = SourceMetrics::register(&metrics);
    let transport_metrics = TransportMetrics::register(&metrics);
    metrics.set_max_detailed_series(
        usize::try_from(settings.bounds.metrics_max_detailed_series).unwrap_or(usize::MAX),
    );
    // Before the limits load, so config_load_success / config_load_error count it.
    let statsd = settings.statsd.config();
    if let Some(statsd) = &statsd {
        tracing::info!(addr = %statsd.addr, protocol = ?statsd.protocol, flavor = ?statsd.flavor,
                       flush_interval = ?statsd.flush_interval, "statsd stats on");
    }
    // The mapping file of the reference's Prometheus series, read now: one that cannot be
    // used stops start-up before any port is bound.
    let mapper = match settings.statsd.reference_prometheus() {
        Some(prom) => match prom.mapper_file {
            Some(path) => {
                let mapper =
                    Mapper::load(&path).map_err(|e| ServerError::Settings(e.to_string()))?;
                tracing::info!(file = %path.display(), "reference Prometheus series mapped by file");
                Some(Arc::new(mapper))
            }
            None => None,
        },
        None => {
            if let Some(path) = &settings.statsd.reference_prometheus_mapper_file {
                tracing::warn!(file = %path.display(),
                    "mapping file without effect: the reference's Prometheus series are off");
            }
            None
        }
    };
    // The debug port's /stats shows them too.
    if statsd.is_some()
        || settings.statsd.reference_prometheus().is_some()
        || settings.statsd.debug_addr.is_some()
    {
        metrics.attach_reference_stats(statsd, mapper);
    }
    let xds = match &settings.xds.config_xds {
        Some(url) => Some(xds::options(
            &settings.xds,
            url,
            Defaults {
                algorithm: settings.algorithm.value.into(),
                max_rules: settings.max_load_rules.value,
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
        None => load_files(&settings, &source_metrics)?,
    };
    let tls = match settings.grpc_tls.files() {
        Some(files) => {
            let tls = GrpcTls::load(files, transport_metrics.clone())?;
            tracing::info!(mutual = tls.is_mutual(), "gRPC TLS certificate loaded");
            Some(tls)
        }
        None => None,
    };
    let max_buckets = usize::try_from(settings.memory_max_buckets).unwrap_or(usize::MAX);
    let memory_store = || {
        let memory = Arc::new(
            MemoryStore::new(Arc::new(SystemClock))
                .with_max_buckets(max_buckets, Some(store_metrics.clone())),
        );
        // Read at every scrape: exact, and no task to keep alive.
        let weak = Arc::downgrade(&memory);
        let gauges = store_metrics.clone();
        store_metrics.sample(move || {
            if let Some(memory) = weak.upgrade() {
                gauges.set_memory_buckets(memory.len());
            }
        });
        memory
    };
    // The host's scheduling delay, read at every scrape from the runtime threads' probes.
    let gauges = store_metrics.clone();
    store_metrics.sample(move || gauges.set_host_delay(host::largest()));
    // Leases sit between the failure policy and Redis (store::lease): a Redis fault is still
    // the policy's to answer.
    let mut lease_store = None;
    let (store, memory, redis): (Arc<dyn Store>, _, _) =
        match remote::remote_store(&settings, &metrics, &store_metrics)? {
            None => {
                let memory = memory_store();
                (memory.clone(), Some(memory), None)
            }
            Some(remote) => {
                let remote = match settings.lease_fraction > 0.0 {
                    true => {
                        let leases = Arc::new(LeaseStore::new(
                            remote,
                            settings.lease_fraction,
                            lease_metrics.clone(),
                        ));
                        lease_store = Some(leases.clone());
                        leases as Arc<dyn RemoteStore>
                    }
                    false => remote,
                };
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
                    store_metrics.clone(),
                ));
                // The bound on calls to Redis, read at every scrape (as the memory store's size).
                let weak = Arc::downgrade(&resilient);
                let gauges = store_metrics.clone();
                store_metrics.sample(move || {
                    if let Some((bound, waiting)) =
                        weak.upgrade().and_then(|store| store.calls_bound())
                    {
                        gauges.set_redis_calls_bound(bound, waiting);
                    }
                });
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
    // The start-up limits' series handles are resolved here, as the publisher resolves a
    // reload's.
    let limits = Snapshot::resolved(config, &metrics).swappable();
    let decider = Arc::new(
        Decider::new(
            limits.clone(),
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
            metrics.clone(),
        )
        .with_store_metrics(store_metrics.clone())
        .with_max_in_flight(settings.max_in_flight as usize)
        .with_traces(traces.clone()),
    );
    let rlqs = Rlqs::new(
        settings.rlqs.options(),
        limits.clone(),
        rlqs_shares(&settings, &store_metrics)?,
        RlqsMetrics::register(&metrics),
    );
    Ok(Components {
        rlqs,
        traces,
        decider,
        limits,
        sources: source_metrics,
        transport: transport_metrics,
        memory,
        redis,
        leases: lease_store,
        tls,
        limits_loaded,
        xds,
        admin_token,
        settings,
    })
}

/// Where RLQS shares are settled: the main Redis (standalone, Sentinel or Cluster), shared
/// by every replica; without one, this process.
fn rlqs_shares(
    settings: &ServeSettings,
    store_metrics: &StoreMetrics,
) -> Result<Arc<dyn Shares>, ServerError> {
    let timeout = settings.redis_timeout_ms.max(RLQS_REDIS_TIMEOUT);
    Ok(
        match remote::rlqs_topology(settings, store_metrics, timeout)? {
            Some(topology) => Arc::new(RedisShares::new(topology, &settings.redis_key_prefix)),
            None => Arc::new(MemoryShares::new(Arc::new(SystemClock))),
        },
    )
}

/// The least time an RLQS share call may take: reports come every few seconds, so the
/// request path's tight Redis timeout (milliseconds) would only fail them on a busy Redis.
const RLQS_REDIS_TIMEOUT: Duration = Duration::from_millis(500);

/// The limits from files, loaded once at start-up, and (with `--health-requires-limits`)
/// whether they have a domain.
type Loaded = (Config, Option<Arc<watch::Sender<bool>>>);

fn load_files(settings: &ServeSettings, metrics: &SourceMetrics) -> Result<Loaded, ServerError> {
    let loader = loader(settings)?;
    let config = loader
        .load_within(crate::sources::LOAD_DEADLINE)
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
    let timeout_us = request_timeout_us(settings);
    warn_of_waits_beyond(&config, timeout_us);
    if settings.max_wait_for_overrides >= timeout_us {
        tracing::warn!(
            max_wait = %format_wait(settings.max_wait_for_overrides),
            grpc_request_timeout = %format_wait(timeout_us),
            "--max-wait-for-overrides is not shorter than --grpc-request-timeout: a request \
             held that long is cancelled (and refunded) before its turn; raise the timeout"
        );
    }
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

/// `--grpc-request-timeout` in µs, the unit of `max_wait`.
fn request_timeout_us(settings: &ServeSettings) -> u64 {
    u64::try_from(settings.bounds.grpc_request_timeout.as_micros()).unwrap_or(u64::MAX)
}

/// Warns of every limit whose `max_wait` is not shorter than `--grpc-request-timeout`
/// (`timeout_us`): floodgate cancels a gRPC call at that timeout, so a request held that long
/// fails (its debits refunded) instead of being answered in its turn. At start-up and after
/// every load of new limits; the limits are served as they are.
fn warn_of_waits_beyond(config: &Config, timeout_us: u64) {
    for (rule, wait) in config.waits_longer_than(timeout_us.saturating_sub(1)) {
        tracing::warn!(
            %rule,
            max_wait = %format_wait(wait),
            grpc_request_timeout = %format_wait(timeout_us),
            "max_wait is not shorter than --grpc-request-timeout: a request held that long is \
             cancelled (and refunded) before its turn; raise the timeout above max_wait"
        );
    }
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

/// The limits loader, identical at start-up and on every reload.
fn loader(settings: &ServeSettings) -> Result<Loader, ServerError> {
    Ok(Loader {
        source: settings
            .limits_source()
            .map_err(|e| ServerError::Settings(e.to_string()))?,
        defaults: Defaults {
            algorithm: settings.algorithm.value.into(),
            max_rules: settings.max_load_rules.value,
        },
        merge_domains: settings.merge_domains,
    })
}

/// Starts hot reload of the limits, unless turned off. A watcher that cannot start (e.g. the
/// inotify instance limit is reached) is logged and the server runs on the limits it loaded:
/// refusing to serve would take every request's rate limiting down over a convenience.
pub(super) fn watch_limits(components: &Components) -> Option<FileWatch> {
    let settings = &components.settings;
    if !settings.watch_config {
        tracing::info!("limits hot reload off (--watch-config=false)");
        return None;
    }
    // assemble() loaded the limits with this loader, so it can be built.
    let loader = loader(settings).ok()?;
    let redis = components.redis.clone();
    let limits_loaded = components.limits_loaded.clone();
    let timeout_us = request_timeout_us(settings);
    let on_reload = move |config: &Config| {
        // Denials cached under the old limits may be wrong under the new ones.
        if let Some(redis) = &redis {
            redis.clear_cache();
        }
        warn_of_waits_beyond(config, timeout_us);
        if let Some(loaded) = &limits_loaded {
            let now = has_domains(config);
            if !now {
                tracing::warn!("no domain loaded: NOT_SERVING until one is");
            }
            loaded.send_replace(now);
        }
    };
    let publisher =
        Publisher::new(components.limits.clone(), components.sources.clone()).on_publish(on_reload);
    match files::spawn(loader, publisher) {
        Ok(watch) => Some(watch),
        Err(e) => {
            tracing::error!("{e}; limits hot reload is off");
            None
        }
    }
}

/// How the limits are followed while serving: dropping it stops that.
pub(super) enum Following {
    /// File watches.
    Files(#[allow(dead_code, reason = "held for its Drop")] FileWatch),
    /// The xDS client task.
    Xds(#[allow(dead_code, reason = "held for its Drop")] AbortOnDrop),
}

/// Aborts the task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the xDS client: each configuration that loads is swapped in, clears the over-limit
/// cache and makes the server ready (unless `--health-requires-limits` finds no domain).
pub(super) fn follow_xds(
    components: &Components,
    options: crate::sources::xds::XdsOptions,
) -> AbortOnDrop {
    let redis = components.redis.clone();
    let limits_loaded = components.limits_loaded.clone();
    let requires_domain = components.settings.health_requires_limits;
    let timeout_us = request_timeout_us(&components.settings);
    let on_load = move |config: &Config| {
        // Denials cached under the old limits may be wrong under the new ones.
        if let Some(redis) = &redis {
            redis.clear_cache();
        }
        warn_of_waits_beyond(config, timeout_us);
        if let Some(loaded) = &limits_loaded {
            loaded.send_replace(!requires_domain || has_domains(config));
        }
    };
    tracing::info!(node_id = %options.node.id, "limits from an xDS management server");
    let publisher =
        Publisher::new(components.limits.clone(), components.sources.clone()).on_publish(on_load);
    AbortOnDrop(crate::sources::xds::spawn(options, publisher))
}

/// Starts reloading the TLS files when they change. As for the limits, a watcher that cannot
/// start is logged and the server serves the certificate it loaded.
pub(super) fn watch_tls(tls: &GrpcTls) -> Option<FileWatch> {
    match tls.watch() {
        Ok(watch) => Some(watch),
        Err(e) => {
            tracing::error!("{e}; TLS certificate reload is off");
            None
        }
    }
}
