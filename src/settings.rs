//! Command line and environment → settings.
//!
//! Every flag can also be set with an environment variable `FLOODGATE_<FLAG>` (for example
//! `--grpc-addr` ↔ `FLOODGATE_GRPC_ADDR`); a flag on the command line wins. Secrets (the Redis
//! URL's password) are redacted in `Debug` output, so settings can be logged safely.
//!
//! The reference server's own environment variables (`RUNTIME_ROOT`, `REDIS_URL`, `GRPC_PORT`,
//! …) are read too, by [`apply_reference_env`] in [`reference`](mod@reference), after parsing: they fill in
//! what floodgate's own flags and `FLOODGATE_*` variables left at their defaults.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{RuntimeLayout, Source};
use crate::limiter::Algorithm;
use crate::plan::RequestLimits;
use crate::store::FailurePolicy;
use crate::store::redis::redact::redact_url;

pub mod connections;
pub mod console;
pub mod counters;
pub mod per_second;
pub mod reference;
pub mod rlqs;
pub mod statsd;
pub mod traces;
pub mod xds;

pub use connections::GrpcConnectionSettings;
pub use counters::ReferenceCounterSettings;
pub use per_second::PerSecondRedisSettings;
pub use reference::{ReferenceOverrides, ReferenceReport, SettingsError, apply_reference_env};

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

    /// On SIGTERM, how long in-flight requests may take to finish before exit.
    #[arg(long, env = "FLOODGATE_SHUTDOWN_GRACE", value_parser = parse_seconds, default_value = "10")]
    pub shutdown_grace: Duration,

    /// Requests answered at once (gRPC and /json together); one more is refused at once with
    /// RESOURCE_EXHAUSTED (HTTP 503), never queued.
    #[arg(long, env = "FLOODGATE_MAX_IN_FLIGHT", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,

    /// Largest gRPC request accepted, in bytes; a larger one is refused (OUT_OF_RANGE) before
    /// it is decoded. RLS requests are a few hundred bytes.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_MESSAGE_BYTES", default_value_t = 64 * 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_message_bytes: u32,

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

// ---- Reference limits layout and answers (drop-in) ----

/// Why the default algorithm (`--default-algorithm`) is the one in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlgorithmChoice {
    /// floodgate's own default, token buckets: limits come from `--config`.
    #[default]
    Default,
    /// `--default-algorithm` or `FLOODGATE_DEFAULT_ALGORITHM` was given.
    Flag,
    /// The reference's `RUNTIME_*` variables located the limits and no algorithm was given:
    /// fixed windows, so every answer is the reference's.
    ReferenceMode,
}

impl AlgorithmChoice {
    /// The reason, for the start-up log.
    pub fn reason(self) -> &'static str {
        match self {
            AlgorithmChoice::Default => "floodgate's default (limits from --config)",
            AlgorithmChoice::Flag => "set by --default-algorithm / FLOODGATE_DEFAULT_ALGORITHM",
            AlgorithmChoice::ReferenceMode => {
                "reference mode: limits located by RUNTIME_* and no algorithm given, so \
                 answers are the reference's; FLOODGATE_DEFAULT_ALGORITHM=token_bucket \
                 chooses token buckets"
            }
        }
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

// ---- end of the reference limits block ----

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
        self.redis_cluster
            .iter()
            .map(|url| redact_url(url))
            .collect()
    }

    /// The limits path: `--config`, or the directory the reference's `RUNTIME_*` variables
    /// name (filled in by [`apply_reference_env`]).
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

// ---- Bounds under abuse ----

/// Bounds on connections, streams and metric labels (see docs/security.md).
#[derive(Clone, Debug, Args)]
pub struct BoundsSettings {
    /// Connections open at once on the gRPC port; at the limit, the connection idle longest
    /// (no call in flight) is closed to admit a new one, which is refused (closed at once,
    /// counted) only when every connection has a call in flight.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTIONS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_connections: u32,

    /// Connections open at once on the admin HTTP port; at the limit, the connection idle
    /// longest is closed to admit a new one, which is refused only when every one is busy.
    #[arg(long, env = "FLOODGATE_HTTP_MAX_CONNECTIONS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,

    /// HTTP/2 streams one gRPC connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS);
    /// Envoy opens another connection when it needs more.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,

    /// Longest a gRPC call may take, its request body's arrival included, in seconds; a
    /// call still unanswered then is cancelled and its stream freed.
    #[arg(long, env = "FLOODGATE_GRPC_REQUEST_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "5")]
    pub grpc_request_timeout: Duration,

    /// A gRPC connection from which nothing was read for this long, in seconds, is closed
    /// (live HTTP/2 peers answer the server's keepalive pings, so they are never silent).
    #[arg(long, env = "FLOODGATE_GRPC_IDLE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "60")]
    pub grpc_idle_timeout: Duration,

    /// An admin HTTP connection from which nothing was read for this long, in seconds, is
    /// closed (an idle keep-alive connection, or a request line never finished).
    #[arg(long, env = "FLOODGATE_HTTP_IDLE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "60")]
    pub http_idle_timeout: Duration,

    /// A connection that has not sent its opening this many seconds after it was accepted is
    /// closed, on every port: the HTTP/2 preface on the gRPC port (the TLS handshake
    /// included), the first request line on the admin HTTP port.
    #[arg(long, env = "FLOODGATE_HANDSHAKE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "10")]
    pub handshake_timeout: Duration,

    /// Distinct rule series carrying request values (`detailed_metric`, `value_to_metric`)
    /// in /metrics; past it, new values count under the rule label `_overflow`.
    #[arg(
        long,
        env = "FLOODGATE_METRICS_MAX_DETAILED_SERIES",
        default_value_t = 10_000
    )]
    pub metrics_max_detailed_series: u32,
}

fn parse_positive_seconds(text: &str) -> Result<Duration, String> {
    match parse_seconds(text)? {
        seconds if seconds > Duration::ZERO => Ok(seconds),
        _ => Err(format!("'{text}' is not a positive number of seconds")),
    }
}

// ---- gRPC TLS ----

/// TLS on the gRPC port: off unless a certificate and key are given. The admin HTTP port
/// stays plaintext (bind it to localhost with --http-addr, or turn it off with --no-http).
#[derive(Clone, Debug, Default, Args)]
pub struct GrpcTlsSettings {
    /// PEM certificate chain (leaf first) for TLS on the gRPC port; needs
    /// --grpc-tls-key-file. Reloaded, with the key and client CA, when the files change.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "grpc_tls_key_file"
    )]
    pub grpc_tls_cert_file: Option<PathBuf>,

    /// PEM private key of the gRPC TLS certificate.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "grpc_tls_cert_file"
    )]
    pub grpc_tls_key_file: Option<PathBuf>,

    /// PEM CA certificates: turns on mutual TLS, every gRPC client must present a certificate
    /// issued by one of them.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_CLIENT_CA_FILE",
        value_name = "PATH",
        requires = "grpc_tls_cert_file"
    )]
    pub grpc_tls_client_ca_file: Option<PathBuf>,
}

impl GrpcTlsSettings {
    /// The files to serve TLS from; `None`: plaintext gRPC.
    pub fn files(&self) -> Option<crate::listen::tls::TlsFiles> {
        Some(crate::listen::tls::TlsFiles {
            cert: self.grpc_tls_cert_file.clone()?,
            key: self.grpc_tls_key_file.clone()?,
            client_ca: self.grpc_tls_client_ca_file.clone(),
        })
    }
}

// ---- Response headers, near-limit ratio, dynamic metadata ----

/// What a response carries besides its statuses, and the near-limit metric's threshold.
#[derive(Clone, Debug, Args)]
pub struct ResponseSettings {
    /// Add RateLimit-Limit / -Remaining / -Reset (and Retry-After on OVER_LIMIT) from the
    /// most constrained descriptor, as the reference's LIMIT_RESPONSE_HEADERS_ENABLED does.
    #[arg(long, env = "FLOODGATE_RESPONSE_HEADERS")]
    pub response_headers: bool,

    /// Name of the limit header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_LIMIT",
        default_value = "RateLimit-Limit"
    )]
    pub header_limit: String,

    /// Name of the remaining header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_REMAINING",
        default_value = "RateLimit-Remaining"
    )]
    pub header_remaining: String,

    /// Name of the reset header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_RESET",
        default_value = "RateLimit-Reset"
    )]
    pub header_reset: String,

    /// With --response-headers, also add the IETF `RateLimit-Policy` and `RateLimit`
    /// structured fields.
    #[arg(long, env = "FLOODGATE_IETF_HEADERS")]
    pub ietf_headers: bool,

    /// Admitted hits above this fraction of a limit's capacity count as near the limit.
    #[arg(long, env = "FLOODGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub near_limit_ratio: f32,

    /// Report the request and the `metadata:` of the rules that admitted it in the
    /// response's dynamic metadata, as the reference's RESPONSE_DYNAMIC_METADATA does.
    #[arg(long, env = "FLOODGATE_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
}

impl ResponseSettings {
    /// The header options for the planner; `None` when headers are off.
    pub fn header_options(&self) -> Option<crate::plan::HeaderOptions> {
        self.response_headers.then(|| crate::plan::HeaderOptions {
            limit: self.header_limit.clone(),
            remaining: self.header_remaining.clone(),
            reset: self.header_reset.clone(),
            ietf: self.ietf_headers,
        })
    }
}

fn parse_ratio(text: &str) -> Result<f32, String> {
    text.parse::<f32>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| format!("'{text}' is not a ratio between 0 and 1"))
}

/// `--lease-fraction`: a number from 0 (leases off) to 0.5. More than half a bucket in one
/// replica's hands would leave the others less than this one holds.
fn parse_lease_fraction(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|r| (0.0..=0.5).contains(r))
        .ok_or_else(|| format!("'{text}' is not a lease fraction between 0 (off) and 0.5"))
}

// ---- end of the response block ----

/// `floodgate check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigSettings {
    /// Limits: a YAML file or a directory of them.
    #[arg(value_name = "FILE|DIR")]
    pub path: PathBuf,

    /// Algorithm for limits that do not name one.
    #[command(flatten)]
    pub algorithm: AlgorithmFlag,

    /// Most rules the limits may hold.
    #[command(flatten)]
    pub max_load_rules: MaxLoadRulesFlag,

    /// How long the clients (Envoy's rate-limit filter `timeout`, 20ms by default) wait for
    /// an answer: a limit whose `max_wait` is longer gets a warning.
    #[arg(long, value_name = "DURATION", default_value = "20ms",
          value_parser = crate::config::parse_wait)]
    pub expected_client_timeout: u64,
}

/// `--default-algorithm`, shared by `serve` and `check-config` so both read limits alike.
#[derive(Clone, Copy, Debug, Args)]
pub struct AlgorithmFlag {
    /// Algorithm for limits that do not name one (and, when serving, for limit overrides).
    #[arg(
        long = "default-algorithm",
        value_name = "ALGORITHM",
        env = "FLOODGATE_DEFAULT_ALGORITHM",
        value_enum,
        default_value_t = AlgorithmArg::TokenBucket
    )]
    pub value: AlgorithmArg,
}

/// `--max-load-rules`, shared by `serve` and `check-config` so both accept the same limits.
#[derive(Clone, Copy, Debug, Args)]
pub struct MaxLoadRulesFlag {
    /// Most rules (descriptors, nested ones included) one load of limits may hold: all the
    /// files of a reload, or all the resources of an xDS push. A load over it is refused
    /// whole before anything is compiled (at start-up exit 64, on reload the limits in force
    /// stay, an xDS push is NACKed), naming the count and this cap; it keeps a hostile or
    /// mistaken push from exhausting the pod's memory.
    #[arg(
        id = "max_load_rules",
        long = "max-load-rules",
        value_name = "N",
        env = "FLOODGATE_MAX_LOAD_RULES",
        default_value_t = crate::config::MAX_LOAD_RULES,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub value: usize,
}

/// `--default-algorithm` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AlgorithmArg {
    /// Continuous refill (GCRA).
    TokenBucket,
    /// The reference server's fixed windows.
    FixedWindow,
    /// Two-window weighted estimate.
    SlidingWindow,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(value: AlgorithmArg) -> Algorithm {
        match value {
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
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

fn parse_millis(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("'{text}' is not a positive number of milliseconds"))
}

/// A `max_wait`-style duration (`50ms`, `250us`, `1s`, `0`), in µs, at most 60 s.
fn parse_max_wait(text: &str) -> Result<u64, String> {
    let us = crate::config::parse_wait(text)?;
    if us > crate::limiter::MAX_WAIT_US {
        return Err(format!("'{text}' exceeds the longest max_wait, 60s"));
    }
    Ok(us)
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("'{text}' is not a number of seconds (0 or more)"))
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
                &self
                    .redis_sentinel_nodes
                    .iter()
                    .map(|n| redact_url(n))
                    .collect::<Vec<_>>(),
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
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_in_flight", &self.max_in_flight)
            .field("grpc_max_message_bytes", &self.grpc_max_message_bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("floodgate").chain(args.iter().copied()))
    }

    /// Defaults match the reference server's ports and floodgate's documented defaults.
    #[test]
    fn serve_defaults() {
        let Command::Serve(s) = parse(&["serve", "--config", "x.yaml"]).unwrap().command else {
            panic!("not serve");
        };
        assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(s.algorithm.value, AlgorithmArg::TokenBucket);
        assert!(!s.shadow_mode && s.redis_url.is_none());
        assert_eq!(s.shutdown_grace, Duration::from_secs(10));
        assert_eq!(s.redis_timeout_ms, Duration::from_millis(10));
        assert_eq!(s.on_store_error, FailurePolicy::Error);
        assert!(s.watch_config);
        assert_eq!(s.max_in_flight, 10_000);
        assert_eq!(s.grpc_max_message_bytes, 65_536);
        assert_eq!(s.grpc_threads, 0);
        assert!(s.grpc_thread_count() >= 1);
        assert_eq!(s.memory_max_buckets, 1_000_000);
        assert!(!s.no_http && s.json_endpoint);
        assert_eq!(s.request_limits(), RequestLimits::default());
    }

    /// The request caps are flags, positive, and reach the planner's bounds.
    #[test]
    fn request_caps_are_flags() {
        let caps = |extra: &[&str]| match parse(&[&["serve", "--config", "x"][..], extra].concat())
            .map(|cli| cli.command)
        {
            Ok(Command::Serve(s)) => Ok(s.request_limits()),
            Ok(_) => panic!("not serve"),
            Err(e) => Err(e),
        };
        let set = caps(&[
            "--max-descriptors",
            "2",
            "--max-entries",
            "3",
            "--max-value-bytes",
            "16",
        ])
        .unwrap();
        assert_eq!(
            set,
            RequestLimits {
                max_descriptors: 2,
                max_entries: 3,
                max_value_len: 16,
            }
        );
        for flag in ["--max-descriptors", "--max-entries", "--max-value-bytes"] {
            assert!(caps(&[flag, "0"]).is_err(), "{flag} 0");
        }
    }

    /// `--max-in-flight` takes a positive count.
    #[test]
    fn max_in_flight_is_positive() {
        let Command::Serve(s) = parse(&["serve", "--config", "x", "--max-in-flight", "2"])
            .unwrap()
            .command
        else {
            panic!("not serve");
        };
        assert_eq!(s.max_in_flight, 2);
        assert!(parse(&["serve", "--config", "x", "--max-in-flight", "0"]).is_err());
    }

    /// Leases are on at a tenth by default, off at 0, and a fraction outside [0, 0.5] is
    /// refused with the flag's meaning.
    #[test]
    fn lease_fraction_defaults_and_bounds() {
        let fraction = |extra: &[&str]| {
            let args = [&["serve", "--config", "x"][..], extra].concat();
            parse(&args).map(|cli| match cli.command {
                Command::Serve(s) => s.lease_fraction,
                _ => panic!("not serve"),
            })
        };
        assert_eq!(fraction(&[]).unwrap(), 0.1);
        assert_eq!(fraction(&["--lease-fraction", "0"]).unwrap(), 0.0);
        assert_eq!(fraction(&["--lease-fraction", "0.5"]).unwrap(), 0.5);
        for bad in ["0.6", "-0.1", "NaN", "a tenth"] {
            let flag = format!("--lease-fraction={bad}");
            let error = fraction(&[&flag]).unwrap_err().to_string();
            assert!(
                error.contains("lease fraction between 0 (off) and 0.5"),
                "{bad}: {error}"
            );
        }
    }

    /// The admin listener can be turned off, and /json on its own.
    #[test]
    fn admin_http_can_be_turned_off() {
        let Command::Serve(s) = parse(&[
            "serve",
            "--config",
            "x",
            "--no-http",
            "--json-endpoint=false",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        assert!(s.no_http && !s.json_endpoint);
    }

    /// `--watch-config` takes an explicit boolean, so hot reload can be turned off.
    #[test]
    fn watch_config_takes_a_boolean() {
        let watch = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Serve(s)) => Ok(s.watch_config),
            Ok(_) => panic!("not serve"),
            Err(e) => Err(e),
        };
        let base = ["serve", "--config", "x"];
        assert!(!watch(&[&base[..], &["--watch-config=false"]].concat()).unwrap());
        assert!(!watch(&[&base[..], &["--watch-config", "false"]].concat()).unwrap());
        assert!(watch(&[&base[..], &["--watch-config=true"]].concat()).unwrap());
        assert!(watch(&[&base[..], &["--watch-config=maybe"]].concat()).is_err());
        // A bare flag is not a boolean: the value must be explicit.
        assert!(watch(&[&base[..], &["--watch-config"]].concat()).is_err());
    }

    /// Every flag parses, including the snake_case algorithm names.
    #[test]
    fn serve_flags() {
        let Command::Serve(s) = parse(&[
            "serve",
            "--config",
            "dir",
            "--grpc-addr",
            "127.0.0.1:1",
            "--http-addr",
            "127.0.0.1:2",
            "--default-algorithm",
            "fixed_window",
            "--shadow-mode",
            "--log-format",
            "json",
            "--shutdown-grace",
            "0.5",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        assert_eq!(s.algorithm.value, AlgorithmArg::FixedWindow);
        assert!(s.shadow_mode);
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.shutdown_grace, Duration::from_millis(500));
    }

    /// Response flags default off (as the reference), with its header names and 0.8 ratio.
    #[test]
    fn response_flags() {
        let serve = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Serve(s)) => Ok(s.response),
            Ok(_) => panic!("not serve"),
            Err(e) => Err(e),
        };
        let base = ["serve", "--config", "x"];
        let defaults = serve(&base).unwrap();
        assert!(defaults.header_options().is_none() && !defaults.response_dynamic_metadata);
        assert_eq!(defaults.near_limit_ratio, 0.8);
        let on = serve(
            &[
                &base[..],
                &["--response-headers", "--header-reset", "X-Reset"],
            ]
            .concat(),
        )
        .unwrap()
        .header_options()
        .unwrap();
        assert_eq!(
            (on.limit.as_str(), on.remaining.as_str(), on.reset.as_str()),
            ("RateLimit-Limit", "RateLimit-Remaining", "X-Reset")
        );
        assert!(serve(&[&base[..], &["--near-limit-ratio", "1.5"]].concat()).is_err());
    }

    /// TLS needs both a certificate and a key; a client CA needs them too.
    #[test]
    fn grpc_tls_flags() {
        let tls = |extra: &[&str]| match parse(&[&["serve", "--config", "x"][..], extra].concat())
            .map(|cli| cli.command)
        {
            Ok(Command::Serve(s)) => Ok(s.grpc_tls.files()),
            Ok(_) => panic!("not serve"),
            Err(e) => Err(e.kind()),
        };
        assert_eq!(tls(&[]), Ok(None));
        let files = tls(&[
            "--grpc-tls-cert-file",
            "c.pem",
            "--grpc-tls-key-file",
            "k.pem",
            "--grpc-tls-client-ca-file",
            "ca.pem",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (files.cert, files.key, files.client_ca),
            ("c.pem".into(), "k.pem".into(), Some("ca.pem".into()))
        );
        let missing = Err(clap::error::ErrorKind::MissingRequiredArgument);
        assert_eq!(tls(&["--grpc-tls-cert-file", "c.pem"]), missing);
        assert_eq!(tls(&["--grpc-tls-key-file", "k.pem"]), missing);
        assert_eq!(tls(&["--grpc-tls-client-ca-file", "ca.pem"]), missing);
    }

    /// Out-of-range durations are parse errors (exit 64), not panics.
    #[test]
    fn bad_durations_are_rejected() {
        for bad in ["1e30", "-1", "NaN", "soon"] {
            assert!(
                parse(&["serve", "--config", "x", "--shutdown-grace", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(parse(&["serve", "--config", "x", "--redis-timeout-ms", "0"]).is_err());
    }

    /// A malformed address is a parse error, not a panic later.
    #[test]
    fn bad_address_is_rejected() {
        assert!(parse(&["serve", "--config", "x", "--grpc-addr", "nope"]).is_err());
    }

    /// Sentinel takes a master name and a comma-separated list of sentinels, each needing
    /// the other; TLS files are paths. Sentinel passwords never reach Debug output.
    #[test]
    fn sentinel_and_tls_flags() {
        let Command::Serve(s) = parse(&[
            "serve",
            "--config",
            "x",
            "--redis-sentinel",
            "mymaster",
            "--redis-sentinel-nodes",
            "redis://:sentinelpw@10.0.0.1:26379,redis://10.0.0.2:26379",
            "--redis-tls-ca-file",
            "/etc/ca.pem",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        assert_eq!(s.redis_sentinel.as_deref(), Some("mymaster"));
        assert_eq!(
            s.redis_sentinel_nodes,
            [
                "redis://:sentinelpw@10.0.0.1:26379",
                "redis://10.0.0.2:26379"
            ]
        );
        assert_eq!(s.redis_tls_ca_file, Some(PathBuf::from("/etc/ca.pem")));
        assert!(!format!("{s:?}").contains("sentinelpw"));
        assert!(parse(&["serve", "--config", "x", "--redis-sentinel", "m"]).is_err());
        assert!(
            parse(&[
                "serve",
                "--config",
                "x",
                "--redis-sentinel-nodes",
                "redis://a:1"
            ])
            .is_err()
        );
    }

    /// Passwords never reach Debug output.
    #[test]
    fn redis_password_is_redacted() {
        let Command::Serve(s) = parse(&["serve", "--config", "x", "--redis-url", "redis://:pw@h"])
            .unwrap()
            .command
        else {
            panic!("not serve");
        };
        assert!(!format!("{s:?}").contains("pw@"));
    }

    /// `--redis-cluster` takes comma-separated seeds, redacted in Debug, and excludes
    /// `--redis-url`.
    #[test]
    fn redis_cluster_seeds() {
        let Command::Serve(s) = parse(&[
            "serve",
            "--config",
            "x",
            "--redis-cluster",
            "redis://:pw@a:1,rediss://b:2",
        ])
        .unwrap()
        .command
        else {
            panic!("not serve");
        };
        assert_eq!(s.redis_cluster, ["redis://:pw@a:1", "rediss://b:2"]);
        assert!(!format!("{s:?}").contains("pw@"));
        let both = parse(&[
            "serve",
            "--config",
            "x",
            "--redis-cluster",
            "redis://a:1",
            "--redis-url",
            "redis://b:2",
        ]);
        assert!(both.is_err());
    }
}
