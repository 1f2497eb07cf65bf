//! Test harness: the real server on ephemeral loopback ports, with a manual clock so tests
//! move time instead of sleeping, and helpers to build requests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use floodgate::clock::ManualClock;
use floodgate::config::{Config, Defaults};
use floodgate::file_watch::FileWatch;
use floodgate::limiter::Algorithm;
use floodgate::plan::{PlanOptions, RequestLimits};
use floodgate::proto::common::{
    RateLimitDescriptor,
    rate_limit_descriptor::{Entry, RateLimitOverride},
};
use floodgate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
};
use floodgate::server::{self, ServerError};
use floodgate::service::Decider;
use floodgate::sources::{Publisher, Snapshot, SourceMetrics};
use floodgate::store::redis::cluster::{ClusterSettings, ClusterStore};
use floodgate::store::redis::{RedisSettings, RedisStore, SentinelSettings};
use floodgate::store::{MemoryStore, Store, StoreMetrics};
use floodgate::telemetry::metrics::Metrics;
use floodgate::transport::TransportMetrics;
use floodgate::transport::tls::{GrpcTls, TlsFiles};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub mod certs;
pub mod configmap;
pub mod envoy;
pub mod h2raw;
pub mod held;
pub mod http;
pub mod limits;
pub mod load;
pub mod process;
pub mod redis;
pub mod rlqs;
pub mod scenarios;
pub mod tls;
pub mod volume;

/// How long [`eventually`] waits before failing the test: long enough for a loaded machine
/// (failovers, reloads, restarts all finish in well under a second on a quiet one).
pub const EVENTUALLY: Duration = Duration::from_secs(30);

/// Polls `check` every 10 ms until it holds, failing the test after [`EVENTUALLY`]; returns
/// how long it took. The one way tests wait for something asynchronous: never a sleep.
pub async fn eventually<F, Fut>(what: &str, check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_within(what, EVENTUALLY, check).await
}

/// [`eventually`] with its own bound, for what is slow by design (a Redis Cluster failover).
pub async fn eventually_within<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < within,
            "never happened within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// Which store a test server uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The in-process memory store.
    Memory,
    /// A real redis-server started for this test, driven at the manual clock's time.
    Redis,
    /// A master (with a replica) found through a real sentinel, started for this test.
    Sentinel,
    /// A real Redis Cluster (3 masters) started for this test, at the manual clock's time.
    Cluster,
}

enum Buckets {
    Memory(Arc<MemoryStore>),
    Redis(redis::RedisServer),
    /// Boxed: a whole set-up of processes is large, and rare.
    Sentinel(Box<redis::sentinel::SentinelSetup>),
    Cluster(redis::RedisCluster),
    /// A store built by the test itself.
    External,
}

/// 2025-06-15T00:00:00Z in µs: aligned to the day, so windows start exactly here.
pub const START_US: i64 = 1_749_945_600_000_000;

/// A running server and handles to its insides.
pub struct TestServer {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    /// The metrics the server records into.
    pub metrics: Arc<Metrics>,
    /// How many times hot reload swapped in new limits (its `on_reload` hook ran).
    pub reloads: Arc<AtomicUsize>,
    buckets: Buckets,
    /// Hot reload, of the limits path or the TLS files, when the server watches them.
    watches: Vec<FileWatch>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

/// Where a test server's limits come from.
enum Limits {
    /// One limits file's text, loaded once.
    Yaml(String),
    /// A file or directory, loaded as `floodgate serve` does and hot-reloaded.
    Watched(PathBuf),
}

/// How a test server is set up: made by [`TestServer::with`] or [`TestServer::watching`],
/// adjusted by its methods, started by [`Setup::start`]. The defaults are `floodgate serve`'s
/// (memory store, default plan options), on a manual clock at [`START_US`].
#[must_use]
pub struct Setup {
    limits: Limits,
    backend: Backend,
    options: PlanOptions,
    /// A store built by the test, with the metrics it reports to.
    store: Option<(Arc<dyn Store>, Arc<Metrics>)>,
    store_health: Option<tokio::sync::watch::Receiver<bool>>,
    tuning: Tuning,
    tls: Option<TlsFiles>,
}

impl Setup {
    /// The store: started for this test (a real redis-server, Sentinel or Cluster).
    pub fn on(mut self, backend: Backend) -> Setup {
        self.backend = backend;
        self
    }

    /// The plan options (global shadow or quota mode, header options, request bounds).
    pub fn options(mut self, options: PlanOptions) -> Setup {
        self.options = options;
        self
    }

    /// A store built by the test (on real time), reporting to `metrics`.
    pub fn store(mut self, store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Setup {
        self.store = Some((store, metrics));
        self
    }

    /// The store's health, reported through the health service as `floodgate serve` does.
    pub fn store_health(mut self, health: Option<tokio::sync::watch::Receiver<bool>>) -> Setup {
        self.store_health = health;
        self
    }

    /// Overload and listener settings.
    pub fn tuning(mut self, tuning: Tuning) -> Setup {
        self.tuning = tuning;
        self
    }

    /// gRPC over TLS from `files`, reloaded when they change, as `floodgate serve` does.
    pub fn tls(mut self, files: TlsFiles) -> Setup {
        self.tls = Some(files);
        self
    }

    /// Starts the server on ephemeral loopback ports.
    pub async fn start(self) -> TestServer {
        let clock = Arc::new(ManualClock::new(START_US));
        let metrics = match &self.store {
            Some((_, metrics)) => metrics.clone(),
            None => Arc::new(Metrics::new()),
        };
        let transport = TransportMetrics::register(&metrics);
        let reloads = Arc::new(AtomicUsize::new(0));
        let mut watches = Vec::new();
        let config = match &self.limits {
            Limits::Yaml(yaml) => shared(load(yaml), &metrics),
            Limits::Watched(path) => {
                let config = shared(
                    floodgate::sources::files::load(path, &defaults())
                        .unwrap_or_else(|e| panic!("test limits do not load:\n{e}")),
                    &metrics,
                );
                let counter = reloads.clone();
                let loader = floodgate::sources::files::Loader {
                    source: floodgate::sources::files::Source::Path(path.clone()),
                    defaults: defaults(),
                    merge_domains: false,
                };
                let publisher = Publisher::new(config.clone(), SourceMetrics::register(&metrics))
                    .on_publish(move |_| {
                        counter.fetch_add(1, Ordering::SeqCst);
                    });
                let watch = floodgate::sources::files::spawn(loader, publisher).unwrap();
                watches.push(watch);
                config
            }
        };
        let tls = self.tls.map(|files| {
            let tls = GrpcTls::load(files, transport.clone()).unwrap();
            watches.push(tls.watch().unwrap());
            tls
        });
        let (store, buckets): (Arc<dyn Store>, Buckets) = match (self.store, self.backend) {
            (Some((store, _)), _) => (store, Buckets::External),
            (None, backend) => start_store(backend, &clock, &metrics).await,
        };
        let mut decider = Decider::new(config, store, self.options, metrics.clone());
        if let Some(max) = self.tuning.max_in_flight {
            decider = decider.with_max_in_flight(max);
        }
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_addr = grpc.local_addr().unwrap();
        let http_addr = http.local_addr().unwrap();
        // Bound then released, so the address is known to be free of any server.
        let http = (!self.tuning.no_http).then_some(http);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(
            grpc,
            http,
            Arc::new(decider),
            server::RunOptions {
                // Stopped at once: the drain period is tests/shutdown.rs's, on the binary.
                drain_period: Duration::ZERO,
                grace: Duration::from_secs(5),
                grpc_max_message_bytes: self.tuning.grpc_max_message_bytes.unwrap_or(1024 * 1024),
                max_in_flight_bytes: self.tuning.max_in_flight_bytes.unwrap_or(32 * 1024 * 1024),
                json_endpoint: !self.tuning.no_json_endpoint,
                tls,
                limits_health: None,
                max_connection_age: None,
                max_connection_age_grace: None,
                keepalive_interval: None,
                bounds: server::Bounds::default(),
                transport,
                console: Default::default(),
                rlqs: None,
            },
            self.store_health,
            futures_util::stream::once(async move {
                let _ = rx.await;
            }),
        ));
        TestServer {
            grpc_addr,
            http_addr,
            clock,
            metrics,
            reloads,
            buckets,
            watches,
            shutdown: Some(tx),
            task: Some(task),
        }
    }
}

/// A store of `backend` at `clock`'s time, with what keeps it alive.
async fn start_store(
    backend: Backend,
    clock: &Arc<ManualClock>,
    metrics: &Arc<Metrics>,
) -> (Arc<dyn Store>, Buckets) {
    match backend {
        Backend::Memory => {
            let memory = Arc::new(MemoryStore::new(clock.clone()));
            (memory.clone(), Buckets::Memory(memory))
        }
        Backend::Redis => {
            let server = redis::RedisServer::start();
            let store = RedisStore::new(&redis_settings(&server.url()))
                .unwrap()
                .with_test_clock(clock.clone());
            (Arc::new(store), Buckets::Redis(server))
        }
        Backend::Sentinel => {
            let setup = redis::sentinel::SentinelSetup::start_steady(1).await;
            let master_name = redis::sentinel::MASTER_NAME;
            let store = RedisStore::new(&RedisSettings {
                sentinel: Some(SentinelSettings {
                    master_name: master_name.to_string(),
                    nodes: setup.node_urls(),
                }),
                ..redis_settings(&format!("redis://{master_name}"))
            })
            .unwrap()
            .with_test_clock(clock.clone());
            (Arc::new(store), Buckets::Sentinel(Box::new(setup)))
        }
        Backend::Cluster => {
            let cluster = redis::RedisCluster::start(3, 0);
            let store = ClusterStore::new(
                &cluster_settings(&cluster.seeds()),
                StoreMetrics::register(metrics),
                None,
            )
            .unwrap()
            .with_test_clock(clock.clone());
            (Arc::new(store), Buckets::Cluster(cluster))
        }
    }
}

impl TestServer {
    /// A server with `yaml` as its only limits file; see [`Setup`] for the rest.
    pub fn with(yaml: &str) -> Setup {
        Setup::new(Limits::Yaml(yaml.to_string()))
    }

    /// A server on the limits at `path` (a file or directory, loaded as `floodgate serve`
    /// does), hot-reloaded as `floodgate serve` does; see [`Setup`] for the rest.
    pub fn watching(path: &Path) -> Setup {
        Setup::new(Limits::Watched(path.to_path_buf()))
    }

    /// Starts a memory-store server with `yaml` as its only limits file and default options.
    pub async fn start(yaml: &str) -> TestServer {
        TestServer::with(yaml).start().await
    }

    /// The Redis Cluster behind a [`Backend::Cluster`] server.
    pub fn cluster(&self) -> &redis::RedisCluster {
        match &self.buckets {
            Buckets::Cluster(cluster) => cluster,
            _ => panic!("not a Redis Cluster server"),
        }
    }

    /// A connected gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .unwrap()
    }

    /// Sends one request and expects an answer.
    pub async fn ask(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
    }

    /// Sends one request and expects an error status.
    pub async fn ask_err(&self, request: RateLimitRequest) -> tonic::Status {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .expect_err("expected an error status")
    }

    /// The value of the metric series `series` (e.g. `floodgate_x_total{result="error"}`);
    /// 0 when it has not been recorded yet.
    pub fn metric(&self, series: &str) -> u64 {
        let prefix = format!("{series} ");
        self.metrics
            .encode()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix).map(|n| n.parse().unwrap()))
            .unwrap_or(0)
    }

    /// How many buckets the store holds.
    pub async fn bucket_count(&self) -> usize {
        let server = match &self.buckets {
            Buckets::Memory(memory) => return memory.len(),
            Buckets::External => panic!("bucket_count: the test owns the store"),
            Buckets::Redis(server) => server,
            Buckets::Sentinel(setup) => &setup.master,
            Buckets::Cluster(cluster) => return cluster.key_count(),
        };
        let mut conn = server.connection().await;
        let size: usize = ::redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        size
    }

    /// Moves the server's clock forward.
    pub fn advance_ms(&self, ms: i64) {
        self.clock.advance(ms * 1000);
    }

    /// Signals shutdown without waiting for it (see [`TestServer::join`]).
    pub fn begin_stop(&mut self) {
        self.shutdown.take().unwrap().send(()).unwrap();
    }

    /// Shuts the server down and re-raises any panic or error from it.
    pub async fn stop(mut self) {
        self.begin_stop();
        self.join().await;
    }

    /// Waits for a server whose shutdown has begun; re-raises any panic or error from it.
    pub async fn join(mut self) {
        self.watches.clear();
        let result = self.task.take().unwrap().await;
        match result {
            Ok(result) => result.unwrap(),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// Overload and listener settings of a test server; the default is `floodgate serve`'s,
/// except that requests in flight are unbounded.
#[derive(Clone, Debug, Default)]
pub struct Tuning {
    /// `--max-in-flight`.
    pub max_in_flight: Option<usize>,
    /// `--grpc-max-message-bytes`; `None`: its default, 1 MiB.
    pub grpc_max_message_bytes: Option<usize>,
    /// `--max-in-flight-bytes`; `None`: its default, 32 MiB.
    pub max_in_flight_bytes: Option<usize>,
    /// `--no-http`: `http_addr` is then an address nothing listens on.
    pub no_http: bool,
    /// `--json-endpoint=false`.
    pub no_json_endpoint: bool,
}

impl Setup {
    fn new(limits: Limits) -> Setup {
        Setup {
            limits,
            backend: Backend::Memory,
            options: options(),
            store: None,
            store_health: None,
            tuning: Tuning::default(),
            tls: None,
        }
    }
}

/// Loader settings of every test server: token bucket by default.
pub fn defaults() -> Defaults {
    Defaults {
        algorithm: Algorithm::TokenBucket,
        ..Defaults::default()
    }
}

/// Loads `yaml` as the only limits file (token bucket default).
pub fn load(yaml: &str) -> Config {
    Config::from_sources(
        &[("limits.yaml".to_string(), yaml.to_string())],
        &defaults(),
    )
    .unwrap_or_else(|e| panic!("test config does not load:\n{e}"))
}

fn shared(config: Config, metrics: &Metrics) -> Arc<ArcSwap<Snapshot>> {
    Arc::new(ArcSwap::from_pointee(Snapshot::resolved(config, metrics)))
}

/// Redis store settings for tests: generous timeouts, so a loaded test machine never turns
/// into a spurious failure.
pub fn redis_settings(url: &str) -> RedisSettings {
    RedisSettings {
        url: url.to_string(),
        sentinel: None,
        tls: Default::default(),
        key_prefix: "fg:".to_string(),
        pool_size: 2,
        connect_timeout: Duration::from_secs(2),
        command_timeout: Duration::from_secs(2),
    }
}

/// Redis Cluster store settings for tests: generous timeouts, like [`redis_settings`].
pub fn cluster_settings(seeds: &[String]) -> ClusterSettings {
    ClusterSettings {
        seeds: seeds.to_vec(),
        key_prefix: "fg:".to_string(),
        connect_timeout: Duration::from_secs(2),
        command_timeout: Duration::from_secs(2),
    }
}

/// Default plan options: no shadow mode, token bucket overrides, default request bounds,
/// no headers or metadata, near limit at 0.8.
pub fn options() -> PlanOptions {
    PlanOptions {
        shadow_mode: false,
        default_algorithm: Algorithm::TokenBucket,
        limits: RequestLimits::default(),
        ..PlanOptions::default()
    }
}

/// A descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.as_bytes().to_vec().into(),
                value: v.as_bytes().to_vec().into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with a descriptor-level `hits_addend`.
pub fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(hits);
    d
}

/// A descriptor with a limit override.
pub fn with_override(mut d: RateLimitDescriptor, rpu: u32, unit: i32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit,
    });
    d
}

/// A request for `domain` with the given descriptors.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// The rate-limit service's gRPC health status at `grpc` (a `ServingStatus` as i32).
pub async fn health(grpc: SocketAddr) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// A request with one single-entry descriptor.
pub fn simple(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    request(domain, vec![descriptor(&[(key, value)])])
}
