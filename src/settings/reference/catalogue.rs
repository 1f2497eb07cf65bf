//! Every environment variable of the reference server's settings, and what becomes of the
//! ones no mapping reads.
//!
//! [`REFERENCE_VARIABLES`] is the reference's whole list (its `settings.go`, plus two that
//! its README still documents). Most are read by a mapping in [`super`]; the rest are decided
//! here: [`REFUSED`] stops start-up (exit 64) when set, [`WITHOUT_EFFECT`] is reported as
//! having no effect, with the reason, when set and no mapping reported it. So every
//! variable set is applied, reported, or refused — never ignored — and a mapping added
//! later for one of them takes over from its entry here without anything else changing.

use super::mapping::Mapping;
use crate::settings::error::SettingsError;

/// Every variable the reference server reads, in the order of its settings.
pub const REFERENCE_VARIABLES: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    // Not in settings.go: the reference's gostats sink reads it from the environment.
    "STATSD_PROTOCOL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// Why the memcache variables stop start-up.
const NO_MEMCACHE: &str = "floodgate has no memcache store: keep the counters in Redis \
                           (REDIS_URL) and remove the memcache variables";

/// Variables whose mere presence stops start-up: honouring them is impossible, and ignoring
/// them would change where the counters are without a word.
pub(super) const REFUSED: &[(&str, &str)] = &[
    ("MEMCACHE_HOST_PORT", NO_MEMCACHE),
    ("MEMCACHE_MAX_IDLE_CONNS", NO_MEMCACHE),
    ("MEMCACHE_SRV", NO_MEMCACHE),
    ("MEMCACHE_SRV_REFRESH", NO_MEMCACHE),
    ("MEMCACHE_TLS", NO_MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_CERT", NO_MEMCACHE),
    ("MEMCACHE_TLS_CLIENT_KEY", NO_MEMCACHE),
    ("MEMCACHE_TLS_CACERT", NO_MEMCACHE),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", NO_MEMCACHE),
];

/// Why the xDS client variables change nothing.
const ONLY_XDS: &str = "read only with CONFIG_TYPE=GRPC_XDS_SOTW, as in the reference";
/// Why the pipelining variables change nothing.
const NO_PIPELINE: &str = "floodgate's Redis connections are multiplexed: concurrent requests \
                           already share writes";
/// Why the pool-exhaustion variables change nothing.
const POOL_WAITS: &str = "floodgate's requests wait for a pooled connection within their \
                          Redis deadline, then fail by the failure policy";
/// Why the start-up retry variables change nothing.
const STARTUP: &str = "floodgate starts at once, reports NOT_SERVING until Redis has \
                       answered, and keeps retrying (every 250 ms); it never exits for want \
                       of Redis";

/// Variables reported as having no effect when set (and not read by a mapping), with why.
pub(super) const WITHOUT_EFFECT: &[(&str, &str)] = &[
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", ONLY_XDS),
    ("CONFIG_GRPC_XDS_NODE_ID", ONLY_XDS),
    ("CONFIG_GRPC_XDS_NODE_METADATA", ONLY_XDS),
    ("CONFIG_GRPC_XDS_SERVER_URL", ONLY_XDS),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", ONLY_XDS),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ONLY_XDS),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", ONLY_XDS),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ONLY_XDS),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ONLY_XDS),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ONLY_XDS),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ONLY_XDS),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", ONLY_XDS),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", ONLY_XDS),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", ONLY_XDS),
    ("XDS_CLIENT_BACKOFF_JITTER", ONLY_XDS),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", ONLY_XDS),
    (
        "MERGE_DOMAIN_CONFIG",
        "not yet supported, no effect: a domain defined in two files is a load error",
    ),
    (
        "QUOTA_MODE",
        "not yet supported, no effect: only limits marked quota_mode are quota limits",
    ),
    ("REDIS_PIPELINE_WINDOW", NO_PIPELINE),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", NO_PIPELINE),
    (
        "REDIS_PIPELINE_LIMIT",
        "deprecated, without effect in the reference too",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "deprecated, without effect in the reference too",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "floodgate sends all the slot groups of a request at once",
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        "floodgate sends all the slot groups of a request at once",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "health always follows Redis: NOT_SERVING while it is unusable under \
         --on-store-error error",
    ),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", POOL_WAITS),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", POOL_WAITS),
    ("REDIS_POOL_ON_EMPTY_WAIT_DURATION", POOL_WAITS),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_WAIT_DURATION", POOL_WAITS),
    ("REDIS_STARTUP_INITIAL_INTERVAL", STARTUP),
    ("REDIS_STARTUP_MAX_INTERVAL", STARTUP),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", STARTUP),
    // Not the reference's: Envoy Gateway sets it beside GRPC_SERVER_USE_TLS, and the
    // reference never reads it. Requiring client certificates from it would refuse every
    // Envoy that Envoy Gateway configures without one.
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "not read by the reference, whose client CA is GRPC_CLIENT_TLS_CACERT: clients are \
         not asked for a certificate",
    ),
];

impl Mapping<'_> {
    /// Stops start-up if a [`REFUSED`] variable is set.
    pub(super) fn refused(&self) -> Result<(), SettingsError> {
        match REFUSED.iter().find(|(name, _)| self.get(name).is_some()) {
            Some(&(name, why)) => Err(SettingsError::Refused {
                name,
                value: self.get(name).unwrap_or_default().to_string(),
                why: why.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Reports every [`WITHOUT_EFFECT`] variable that is set and that no mapping reported.
    pub(super) fn without_effect(&mut self) {
        for &(name, why) in WITHOUT_EFFECT {
            if self.get(name).is_some() && !self.reported(name) {
                self.no_effect(name, why);
            }
        }
    }

    /// Whether the report already names `name` (applied, without effect, or overridden).
    pub(super) fn reported(&self, name: &str) -> bool {
        let report = &self.report;
        report
            .applied
            .iter()
            .chain(&report.no_effect)
            .chain(&report.overridden)
            .any(|entry| {
                entry == name
                    || entry
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(' '))
            })
    }
}
