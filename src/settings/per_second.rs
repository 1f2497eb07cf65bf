//! `floodgate serve`'s second Redis, for per-second limits.
//!
//! The reference server can keep its per-second counters in a Redis of their own
//! (`REDIS_PERSECOND=true`): they are the hottest and the shortest-lived, and a separate
//! instance keeps them from crowding out the longer windows. floodgate does the same when one
//! of these is given: every bucket whose period is exactly one second goes to this Redis, every
//! other bucket to the main one (`--redis-url`, `--redis-sentinel` or `--redis-cluster`), both
//! called at once for a request, and a request is still debited all or nothing across the two
//! (see [`crate::store::split`]). The `--redis-tls-*` files apply to both.

use std::fmt;
use std::time::Duration;

use clap::Args;

use super::parse::{parse_millis, redact_urls};
use crate::store::redis::redact::redact_url;

/// Where per-second buckets live, when not in the main Redis.
#[derive(Clone, Default, Args)]
pub struct PerSecondRedisSettings {
    /// Redis URL (redis:// or rediss://) for buckets of one-second periods; the others stay
    /// in the main Redis. With --redis-per-second-sentinel: the master's scheme, credentials
    /// and database, as for --redis-url.
    #[arg(long, env = "FLOODGATE_REDIS_PER_SECOND_URL", value_name = "URL")]
    pub redis_per_second_url: Option<String>,

    /// Redis Cluster seed nodes for the per-second buckets, comma-separated URLs.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_PER_SECOND_CLUSTER",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        conflicts_with_all = ["redis_per_second_url", "redis_per_second_sentinel"]
    )]
    pub redis_per_second_cluster: Vec<String>,

    /// Redis Sentinel master name for the per-second buckets.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_PER_SECOND_SENTINEL",
        value_name = "MASTER_NAME",
        requires = "redis_per_second_sentinel_nodes"
    )]
    pub redis_per_second_sentinel: Option<String>,

    /// The per-second master's sentinels, comma-separated `redis://[user:password@]host:port`.
    #[arg(
        long,
        env = "FLOODGATE_REDIS_PER_SECOND_SENTINEL_NODES",
        value_name = "URL[,URL...]",
        value_delimiter = ',',
        requires = "redis_per_second_sentinel"
    )]
    pub redis_per_second_sentinel_nodes: Vec<String>,

    /// Multiplexed connections in the per-second Redis pool.
    #[arg(long, env = "FLOODGATE_REDIS_PER_SECOND_POOL_SIZE", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub redis_per_second_pool_size: u32,

    /// Deadline to establish a connection to the per-second Redis, in milliseconds.
    #[arg(long, env = "FLOODGATE_REDIS_PER_SECOND_CONNECT_TIMEOUT_MS", default_value = "250",
          value_parser = parse_millis)]
    pub redis_per_second_connect_timeout_ms: Duration,
}

impl PerSecondRedisSettings {
    /// True when a per-second Redis is configured.
    pub fn is_set(&self) -> bool {
        self.redis_per_second_url.is_some()
            || self.redis_per_second_sentinel.is_some()
            || !self.redis_per_second_cluster.is_empty()
    }
}

impl fmt::Debug for PerSecondRedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerSecondRedisSettings")
            .field(
                "redis_per_second_url",
                &self.redis_per_second_url.as_deref().map(redact_url),
            )
            .field(
                "redis_per_second_cluster",
                &redact_urls(&self.redis_per_second_cluster),
            )
            .field("redis_per_second_sentinel", &self.redis_per_second_sentinel)
            .field(
                "redis_per_second_sentinel_nodes",
                &redact_urls(&self.redis_per_second_sentinel_nodes),
            )
            .field(
                "redis_per_second_pool_size",
                &self.redis_per_second_pool_size,
            )
            .field(
                "redis_per_second_connect_timeout_ms",
                &self.redis_per_second_connect_timeout_ms,
            )
            .finish()
    }
}
