//! `floodgate serve`'s settings ([`ServeSettings`]) and the command line around them
//! ([`Cli`], [`Command`]): every flag of the server, each with its environment variable.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::plan::RequestLimits;
use crate::sources::files::{RuntimeLayout, Source};
use crate::store::FailurePolicy;
use crate::store::redis::redact::redact_url;

use super::bounds::BoundsSettings;
use super::connections::GrpcConnectionSettings;
use super::console;
use super::counters::ReferenceCounterSettings;
use super::error::SettingsError;
use super::grpc_tls::GrpcTlsSettings;
use super::limits::{AlgorithmChoice, AlgorithmFlag, CheckConfigSettings, MaxLoadRulesFlag};
use super::parse::{
    parse_lease_fraction, parse_max_wait, parse_millis, parse_seconds, redact_urls,
};
use super::per_second::PerSecondRedisSettings;
use super::response::ResponseSettings;
use super::{rlqs, statsd, traces, xds};

/// floodgate: a global rate-limit server for Envoy (RLS v3).
#[derive(Debug, Parser)]
#[command(name = "floodgate", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once at start-up and then taken apart: boxing `Serve` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the rate-limit API (gRPC) and the admin endpoints (HTTP).
    Serve(ServeSettings),
    /// Validate a limits file or directory, print the limits, and exit (0 valid, 1 invalid).
    CheckConfig(CheckConfigSettings),
    /// Inspect, reset or set a bucket of a running server (its admin port's console API).
    Bucket(console::BucketSettings),
}

/// `floodgate serve`.
#[derive(Args)]
pub struct ServeSettings {
    /// Limits: a YAML file, or a directory whose *.yaml / *.yml files are all loaded.
    /// Required unless the reference's RUNTIME_ROOT / RUNTIME_SUBDIRECTORY give the path.
    #[arg(long, env = "FLOODGATE_CONFIG", value_name = "FILE|DIR")]
    pub config: Option<PathBuf>,

    /// Reload the limits when the file or directory changes (a ConfigMap update included);
    /// a bad edit is logged and the previous limits stay in force.
    #[arg(long, env = "FLOODGATE_WATCH_CONFIG", value_name = "BOOL", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub watch_config: bool,

    /// Address for gRPC: the rate-limit service, health and reflection.
    #[arg(long, env = "FLOODGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: SocketAddr,

    /// TLS on the gRPC port.
    #[command(flatten)]
    pub grpc_tls: GrpcTlsSettings,

    /// A unix socket instead of TCP, connection age and keepalive on the gRPC port.
    #[command(flatten)]
    pub grpc_connections: GrpcConnectionSettings,
    /// Threads serving gRPC, each a single-threaded runtime with its own listener on the gRPC
    /// address (SO_REUSEPORT: the kernel spreads connections over them). 0: one per CPU
    /// available to the process (cgroup CPU quotas included).
    #[arg(long, env = "FLOODGATE_GRPC_THREADS", default_value_t = 0)]
    pub grpc_threads: u16,

    /// Address for HTTP: /healthcheck, /json, /metrics, /rlconfig.
    #[arg(long, env = "FLOODGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,

    /// Serve no admin HTTP at all (no /healthcheck, /json, /metrics, /rlconfig); gRPC health
    /// still answers.
    #[arg(long, env = "FLOODGATE_NO_HTTP")]
    pub no_http: bool,

    /// Serve POST /json (ShouldRateLimit over HTTP); `--json-endpoint=false` answers 404.
    #[arg(long, env = "FLOODGATE_JSON_ENDPOINT", value_name = "BOOL", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub json_endpoint: bool,

    /// The operator console's access rules.
    #[command(flatten)]
    pub console: console::ConsoleSettings,

    /// Bounds and timings of the Rate Limit Quota Service.
    #[command(flatten)]
    pub rlqs: rlqs::RlqsSettings,

    /// Redis URL (redis:// or rediss://). Without it (and without --redis-sentinel or
    /// --redis-cluster), buckets live in process memory. With --redis-sentinel: the master's scheme, credentials and
    /// database, as redis://user:password@MASTER_NAME/db or rediss://… (optional; TLS,
    /// credentials and database each optional).
    #[arg(long, env = "FLOODGATE_REDIS_URL", value_name = "URL")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed nodes, comma-separated URLs (redis:// or rediss://, credentials in
    /// the URL); the rest of the cluster is discovered from them. Instead of --redis-url;
    /// the --redis-tls-* files apply to every node.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_CLUSTER",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        conflicts_with_all = ["redis_url", "redis_sentinel"]
    )]
    pub redis_cluster: Vec<String>,

    /// Redis Sentinel: the master's name; every connection goes to the master the sentinels
    /// of --redis-sentinel-nodes name, so a failover is followed without a restart.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_SENTINEL",
        value_name = "MASTER_NAME",
        requires = "redis_sentinel_nodes"
    )]
    pub redis_sentinel: Option<String>,

    /// The sentinels, comma-separated: redis://host:port, with user:password@ if they need
    /// credentials, or rediss:// for TLS.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_SENTINEL_NODES",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        requires = "redis_sentinel"
    )]
    pub redis_sentinel_nodes: Vec<String>,

    /// PEM CA certificates that sign the Redis servers' certificates (rediss://); without
    /// it, the bundled Mozilla roots.
    #[arg(long, env = "FLOODGATE_REDIS_TLS_CA_FILE", value_name = "PATH")]
    pub redis_tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for Redis servers that require one (tls-auth-clients);
    /// needs --redis-tls-key-file.
    #[arg(long, env = "FLOODGATE_REDIS_TLS_CERT_FILE", value_name = "PATH")]
    pub redis_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --redis-tls-cert-file.
    #[arg(long, env = "FLOODGATE_REDIS_TLS_KEY_FILE", value_name = "PATH")]
    pub redis_tls_key_file: Option<PathBuf>,

    /// Prefix of every Redis key floodgate writes.
    #[arg(long, env = "FLOODGATE_REDIS_KEY_PREFIX", default_value = "fg:")]
    pub redis_key_prefix: String,

    /// Multiplexed Redis connections in the pool (each carries many requests at once).
    #[arg(long, env = "FLOODGATE_REDIS_POOL_SIZE", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub redis_pool_size: u32,

    /// Deadline to establish a Redis connection, in milliseconds.
    #[arg(long, env = "FLOODGATE_REDIS_CONNECT_TIMEOUT_MS", default_value = "250", value_parser = parse_millis)]
    pub redis_connect_timeout_ms: Duration,

    /// Deadline for one request's Redis call, in milliseconds. Keep it well under Envoy's
    /// rate-limit RPC timeout (20 ms by default).
    #[arg(long, env = "FLOODGATE_REDIS_TIMEOUT_MS", default_value = "10", value_parser = parse_millis)]
    pub redis_timeout_ms: Duration,

    /// Consecutive Redis failures that open the circuit breaker.
    #[arg(long, env = "FLOODGATE_REDIS_FAILURE_THRESHOLD", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub redis_failure_threshold: u32,

    /// Bound the calls in flight to Redis (an adaptive limit with a short queue): calls
    /// beyond what Redis answers in time are answered at once by --on-store-error instead
    /// (docs/redis.md).
    #[arg(long, env = "FLOODGATE_REDIS_SHEDDING", value_name = "BOOL", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub redis_shedding: bool,

    /// A second Redis for per-second limits.
    #[command(flatten)]
    pub redis_per_second: PerSecondRedisSettings,

    /// What to answer while Redis is unusable: error (gRPC UNAVAILABLE, so Envoy's
    /// failure_mode_deny decides), allow, deny, or local (in-memory buckets until Redis is back).
    #[arg(long, env = "FLOODGATE_ON_STORE_ERROR", value_enum, default_value_t = FailurePolicy::Error)]
    pub on_store_error: FailurePolicy,

    /// Buckets remembered as over limit, to answer without a Redis call (0 disables).
    #[arg(long, env = "FLOODGATE_LOCAL_CACHE_SIZE", default_value_t = 100_000)]
    pub local_cache_size: u64,

    /// Most of a bucket's capacity one replica may hold as a lease on a hot Redis bucket,
    /// spent locally for tens of milliseconds (0 turns leases off; docs/leases.md).
    #[arg(long, env = "FLOODGATE_LEASE_FRACTION", value_name = "RATIO",
          default_value_t = crate::store::lease::DEFAULT_FRACTION, value_parser = parse_lease_fraction)]
    pub lease_fraction: f64,

    /// Algorithm for limits that do not name one, and for descriptor limit overrides.
    #[command(flatten)]
    pub algorithm: AlgorithmFlag,

    /// Most rules one load of limits may hold, files and xDS pushes alike.
    #[command(flatten)]
    pub max_load_rules: MaxLoadRulesFlag,

    /// `max_wait` of descriptor limit overrides counted in token buckets (e.g. 50ms; 0 = off):
    /// a request whose tokens arrive within it is held and answered OK (docs/algorithms.md).
    #[arg(long, env = "FLOODGATE_MAX_WAIT_FOR_OVERRIDES", value_name = "DURATION",
          default_value = "0", value_parser = parse_max_wait)]
    pub max_wait_for_overrides: u64,

    /// Evaluate and count every limit, but never answer OVER_LIMIT.
    #[arg(long, env = "FLOODGATE_SHADOW_MODE")]
    pub shadow_mode: bool,

    /// Report NOT_SERVING (gRPC health and /healthcheck) while the limits in force have no
    /// domain, as the reference does with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: a replica
    /// whose ConfigMap is empty or unreadable takes no traffic.
    #[arg(long, env = "FLOODGATE_HEALTH_REQUIRES_LIMITS")]
    pub health_requires_limits: bool,

    /// Log line format.
    #[arg(long, env = "FLOODGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// On SIGTERM (or SIGINT), seconds health reports NOT_SERVING while every call, on old
    /// and new connections, is still answered, so that Envoy's health checker takes the
    /// replica out before it closes (docs/reliability.md); a second signal ends it early.
    #[arg(long, env = "FLOODGATE_DRAIN_PERIOD", value_parser = parse_seconds, default_value = "15")]
    pub drain_period: Duration,

    /// After the drain period, how long in-flight requests may take to finish before exit.
    #[arg(long, env = "FLOODGATE_SHUTDOWN_GRACE", value_parser = parse_seconds, default_value = "10")]
    pub shutdown_grace: Duration,

    /// Requests answered at once (gRPC and /json together); one more is refused at once with
    /// RESOURCE_EXHAUSTED (HTTP 503), never queued.
    #[arg(long, env = "FLOODGATE_MAX_IN_FLIGHT", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,

    /// Largest gRPC request message accepted, in bytes; a larger one is refused
    /// (OUT_OF_RANGE) before it is decoded. The default holds 16 copies of a 60 KiB header
    /// (Envoy's default `max_request_headers_kb`), so no descriptors Envoy builds from
    /// headers it accepted are refused; --max-in-flight-bytes bounds what calls hold together.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_MESSAGE_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_message_bytes: u32,

    /// Request bytes in flight on the gRPC port, all calls together (bodies as they arrive,
    /// and ShouldRateLimit requests until answered); a call that would go over is refused at
    /// once with RESOURCE_EXHAUSTED, never queued.
    #[arg(long, env = "FLOODGATE_MAX_IN_FLIGHT_BYTES", default_value_t = 32 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight_bytes: u64,

    /// Most buckets the memory store holds (also the fallback store of --on-store-error
    /// local); beyond it, expired buckets are dropped first, then the earliest-expiring
    /// one of a small sample is evicted. Enforced per shard (of 64), hence at least 64.
    #[arg(long, env = "FLOODGATE_MEMORY_MAX_BUCKETS", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(64..))]
    pub memory_max_buckets: u64,

    /// Most descriptors in one request; more is refused with INVALID_ARGUMENT.
    #[arg(long, env = "FLOODGATE_MAX_DESCRIPTORS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_descriptors: u32,

    /// Most entries in one descriptor; more is refused with INVALID_ARGUMENT.
    #[arg(long, env = "FLOODGATE_MAX_ENTRIES", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_entries: u32,

    /// Longest domain, entry key or entry value, in bytes; longer is refused with
    /// INVALID_ARGUMENT.
    #[arg(long, env = "FLOODGATE_MAX_VALUE_BYTES", default_value_t = 4096,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_value_bytes: u32,

    /// Response headers, near-limit accounting and dynamic metadata.
    #[command(flatten)]
    pub response: ResponseSettings,

    /// Connection, stream and label bounds that keep one client from exhausting the server.
    #[command(flatten)]
    pub bounds: BoundsSettings,

    /// Limits from an xDS control plane instead of files.
    #[command(flatten)]
    pub xds: xds::XdsSettings,

    /// The reference's statsd stats.
    #[command(flatten)]
    pub statsd: statsd::StatsdSettings,

    /// OpenTelemetry trace export.
    #[command(flatten)]
    pub traces: traces::TraceSettings,

    /// Fixed-window counters shared with reference pods while a Deployment rolls.
    #[command(flatten)]
    pub counters: ReferenceCounterSettings,

    // ---- Reference limits layout and answers (drop-in) ----
    /// Merge limits files that name the same domain into one domain (a composite key
    /// defined twice is still an error), as the reference's MERGE_DOMAIN_CONFIG does;
    /// without it a domain in two files is an error.
    #[arg(long, env = "FLOODGATE_MERGE_DOMAINS")]
    pub merge_domains: bool,

    /// Every descriptor is a quota-mode one (the reference's QUOTA_MODE): a descriptor
    /// over its limit says OVER_LIMIT, and the request is denied only when every descriptor
    /// (but unlimited ones) is over.
    #[arg(long, env = "FLOODGATE_QUOTA_MODE")]
    pub quota_mode: bool,

    /// The reference's runtime layout, when its `RUNTIME_*` variables located the limits
    /// (then `config` is that layout's directory, and the files are those it would read).
    #[arg(skip)]
    pub runtime_layout: Option<RuntimeLayout>,

    /// Why the default algorithm is the one in force, for the start-up log.
    #[arg(skip)]
    pub algorithm_choice: AlgorithmChoice,
    // ---- end of the reference limits block ----
}

impl ServeSettings {
    /// How many threads serve gRPC: `--grpc-threads`, or one per available CPU when 0.
    pub fn grpc_thread_count(&self) -> usize {
        match self.grpc_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => usize::from(n),
        }
    }

    /// The Redis Cluster seeds with their passwords redacted, for logs.
    pub fn redis_cluster_redacted(&self) -> Vec<String> {
        redact_urls(&self.redis_cluster)
    }

    /// The limits path: `--config`, or the directory the reference's `RUNTIME_*` variables
    /// name (filled in by [`apply_reference_env`](super::apply_reference_env)).
    pub fn limits_path(&self) -> Result<&Path, SettingsError> {
        self.config.as_deref().ok_or(SettingsError::NoLimits)
    }

    /// The request-size caps (`--max-descriptors`, `--max-entries`, `--max-value-bytes`).
    pub fn request_limits(&self) -> RequestLimits {
        let size = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        RequestLimits {
            max_descriptors: size(self.max_descriptors),
            max_entries: size(self.max_entries),
            max_value_len: size(self.max_value_bytes),
        }
    }
}

/// `--log-format` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Debug for ServeSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSettings")
            .field("config", &self.config)
            .field("watch_config", &self.watch_config)
            .field("grpc_addr", &self.grpc_addr)
            .field("grpc_tls", &self.grpc_tls)
            .field("grpc_connections", &self.grpc_connections)
            .field("http_addr", &self.http_addr)
            .field("no_http", &self.no_http)
            .field("json_endpoint", &self.json_endpoint)
            .field("console", &self.console)
            .field("redis_url", &self.redis_url.as_deref().map(redact_url))
            .field("redis_sentinel", &self.redis_sentinel)
            .field(
                "redis_sentinel_nodes",
                &redact_urls(&self.redis_sentinel_nodes),
            )
            .field("redis_tls_ca_file", &self.redis_tls_ca_file)
            .field("redis_tls_cert_file", &self.redis_tls_cert_file)
            .field("redis_tls_key_file", &self.redis_tls_key_file)
            .field("redis_cluster", &self.redis_cluster_redacted())
            .field("redis_key_prefix", &self.redis_key_prefix)
            .field("redis_pool_size", &self.redis_pool_size)
            .field("redis_connect_timeout_ms", &self.redis_connect_timeout_ms)
            .field("redis_timeout_ms", &self.redis_timeout_ms)
            .field("redis_failure_threshold", &self.redis_failure_threshold)
            .field("redis_shedding", &self.redis_shedding)
            .field("redis_per_second", &self.redis_per_second)
            .field("on_store_error", &self.on_store_error)
            .field("local_cache_size", &self.local_cache_size)
            .field("lease_fraction", &self.lease_fraction)
            .field("default_algorithm", &self.algorithm.value)
            .field("max_load_rules", &self.max_load_rules.value)
            .field("shadow_mode", &self.shadow_mode)
            .field("health_requires_limits", &self.health_requires_limits)
            .field("log_format", &self.log_format)
            .field("drain_period", &self.drain_period)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_in_flight", &self.max_in_flight)
            .field("grpc_max_message_bytes", &self.grpc_max_message_bytes)
            .field("max_in_flight_bytes", &self.max_in_flight_bytes)
            .field("grpc_threads", &self.grpc_threads)
            .field("memory_max_buckets", &self.memory_max_buckets)
            .field("max_descriptors", &self.max_descriptors)
            .field("max_entries", &self.max_entries)
            .field("max_value_bytes", &self.max_value_bytes)
            .field("response", &self.response)
            .field("bounds", &self.bounds)
            .field("statsd", &self.statsd)
            .field("xds", &self.xds)
            .field("counters", &self.counters)
            .field("merge_domains", &self.merge_domains)
            .field("quota_mode", &self.quota_mode)
            .field("runtime_layout", &self.runtime_layout)
            .field("algorithm_choice", &self.algorithm_choice)
            .finish()
    }
}

impl ServeSettings {
    /// Where the limits files are: the reference's runtime layout when its variables located
    /// them, else `--config`.
    pub fn limits_source(&self) -> Result<Source, SettingsError> {
        match &self.runtime_layout {
            Some(layout) => Ok(Source::Runtime(layout.clone())),
            None => Ok(Source::Path(self.limits_path()?.to_path_buf())),
        }
    }
}
