//! The remote store the settings name: a Redis Cluster, a Sentinel-managed or standalone
//! Redis, and optionally a second one of any kind for per-second buckets
//! ([`crate::store::split`]); `None` for the memory store.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::error::ServerError;
use crate::settings::ServeSettings;
use crate::store::RemoteStore;
use crate::store::StoreMetrics;
use crate::store::redis::cluster::{ClusterSettings, ClusterStore};
use crate::store::redis::{PoolCounts, RedisSettings, RedisStore, RedisTls, SentinelSettings};
use crate::store::split::SplitStore;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::statsd::Sample;

/// Where one Redis is and how to reach it: the main one's flags or the per-second one's.
struct Target<'a> {
    /// Which flags these are, for messages: `--redis` or `--redis-per-second`.
    flags: &'static str,
    url: Option<&'a String>,
    cluster: &'a [String],
    sentinel: Option<&'a String>,
    sentinel_nodes: &'a [String],
    pool_size: u32,
    connect_timeout: Duration,
}

/// The remote store of `settings`, or `None` for the memory store.
pub(super) fn remote_store(
    settings: &ServeSettings,
    metrics: &Arc<Metrics>,
    store_metrics: &StoreMetrics,
) -> Result<Option<Arc<dyn RemoteStore>>, ServerError> {
    let main = one_store(settings, &main_target(settings), metrics, store_metrics)?;
    let per_second = &settings.redis_per_second;
    if !per_second.is_set() {
        return Ok(main);
    }
    let Some(main) = main else {
        return Err(ServerError::Settings(
            "--redis-per-second-* needs a main Redis too (--redis-url, --redis-sentinel or \
             --redis-cluster): without one the other limits would be counted per replica"
                .into(),
        ));
    };
    let target = Target {
        flags: "--redis-per-second",
        url: per_second.redis_per_second_url.as_ref(),
        cluster: &per_second.redis_per_second_cluster,
        sentinel: per_second.redis_per_second_sentinel.as_ref(),
        sentinel_nodes: &per_second.redis_per_second_sentinel_nodes,
        pool_size: per_second.redis_per_second_pool_size,
        connect_timeout: per_second.redis_per_second_connect_timeout_ms,
    };
    let Some(per_second) = one_store(settings, &target, metrics, store_metrics)? else {
        return Ok(Some(main));
    };
    tracing::info!("per-second limits in their own Redis (--redis-per-second-*)");
    Ok(Some(Arc::new(SplitStore::new(
        main,
        per_second,
        store_metrics.clone(),
    ))))
}

/// The main Redis's flags (`--redis-*`).
fn main_target(settings: &ServeSettings) -> Target<'_> {
    Target {
        flags: "--redis",
        url: settings.redis_url.as_ref(),
        cluster: &settings.redis_cluster,
        sentinel: settings.redis_sentinel.as_ref(),
        sentinel_nodes: &settings.redis_sentinel_nodes,
        pool_size: settings.redis_pool_size,
        connect_timeout: settings.redis_connect_timeout_ms,
    }
}

/// Where the RLQS share tables live: a store of their own on the main Redis's topology (the
/// same URL, sentinels or cluster seeds, TLS files, credentials and connect timeout), each
/// call bounded by `command_timeout`; `None` without a main Redis.
pub(super) fn rlqs_topology(
    settings: &ServeSettings,
    store_metrics: &StoreMetrics,
    command_timeout: Duration,
) -> Result<Option<crate::rlqs::redis::Topology>, ServerError> {
    use crate::rlqs::redis::Topology;
    // Share calls come per bucket per reporting interval: one multiplexed connection per
    // thread carries them, and after a failover each thread has only that one to replace.
    let target = Target {
        pool_size: 1,
        ..main_target(settings)
    };
    let built = build(settings, &target, store_metrics, command_timeout)?;
    Ok(built.map(|built| match built {
        Built::Redis(store) => Topology::Redis(store),
        Built::Cluster(store) => Topology::Cluster(store),
    }))
}

/// The store `target` names, or `None` if it names none. The `--redis-tls-*` files apply to
/// every store.
fn one_store(
    settings: &ServeSettings,
    target: &Target<'_>,
    metrics: &Arc<Metrics>,
    store_metrics: &StoreMetrics,
) -> Result<Option<Arc<dyn RemoteStore>>, ServerError> {
    Ok(
        match build(settings, target, store_metrics, settings.redis_timeout_ms)? {
            None => None,
            Some(Built::Cluster(cluster)) => Some(Arc::new(cluster)),
            Some(Built::Redis(store)) => {
                pool_stats(&store, target.flags, metrics);
                Some(Arc::new(store))
            }
        },
    )
}

/// A store built from flags, of the kind they name.
enum Built {
    Redis(RedisStore),
    Cluster(ClusterStore),
}

/// The store `target` names, its calls bounded by `command_timeout`, or `None` if it names
/// none.
fn build(
    settings: &ServeSettings,
    target: &Target<'_>,
    store_metrics: &StoreMetrics,
    command_timeout: Duration,
) -> Result<Option<Built>, ServerError> {
    let tls = RedisTls {
        ca_file: settings.redis_tls_ca_file.clone(),
        cert_file: settings.redis_tls_cert_file.clone(),
        key_file: settings.redis_tls_key_file.clone(),
    };
    let settings_error = |e: &dyn std::fmt::Display| ServerError::Settings(e.to_string());
    let flags = target.flags;
    if !target.cluster.is_empty() {
        // redis-rs turns TLS on for every node once certificates are given, whatever the
        // seeds say: refuse plain or mixed seeds here, as the standalone and Sentinel paths do.
        let tls_seeds = target
            .cluster
            .iter()
            .filter(|seed| seed.starts_with("rediss://"))
            .count();
        if tls_seeds != 0 && tls_seeds != target.cluster.len() {
            return Err(ServerError::Settings(format!(
                "{flags}-cluster mixes rediss:// and plain seeds: a cluster is all TLS or none"
            )));
        }
        if tls.is_set() && tls_seeds == 0 {
            return Err(ServerError::Settings(format!(
                "Redis TLS files are set, but the {flags}-cluster seeds do not use rediss://"
            )));
        }
        let certificates =
            crate::store::redis::tls::certificates(&tls).map_err(|e| settings_error(&e))?;
        let cluster = ClusterStore::new(
            &ClusterSettings {
                seeds: target.cluster.to_vec(),
                key_prefix: settings.redis_key_prefix.clone(),
                connect_timeout: target.connect_timeout,
                command_timeout,
            },
            store_metrics.clone(),
            certificates,
        )
        .map_err(|e| settings_error(&e))?;
        return Ok(Some(Built::Cluster(cluster)));
    }
    let sentinel = target.sentinel.map(|master_name| SentinelSettings {
        master_name: master_name.clone(),
        nodes: target.sentinel_nodes.to_vec(),
    });
    let url = match (target.url, &sentinel) {
        (Some(url), _) => url.clone(),
        // The master's address comes from the sentinels; plain TCP, no credentials.
        (None, Some(sentinel)) => format!("redis://{}", sentinel.master_name),
        (None, None) if tls.is_set() && flags == "--redis" => {
            return Err(ServerError::Settings(
                "Redis TLS files are set, but no Redis is (--redis-url, --redis-sentinel or \
                 --redis-cluster)"
                    .into(),
            ));
        }
        (None, None) => return Ok(None),
    };
    let redis = RedisSettings {
        url,
        sentinel,
        tls,
        key_prefix: settings.redis_key_prefix.clone(),
        pool_size: target.pool_size,
        connect_timeout: target.connect_timeout,
        command_timeout,
    };
    let store = RedisStore::new(&redis).map_err(|e| settings_error(&e))?;
    Ok(Some(Built::Redis(store)))
}

/// The reference's Redis pool stats (`ratelimit.redis_pool.*`, and
/// `ratelimit.redis_per_second_pool.*` for the per-second Redis), when statsd is on:
/// connections opened (`cx_total`), closed (`cx_local_close`) and open now (`cx_active`).
fn pool_stats(store: &RedisStore, flags: &str, metrics: &Metrics) {
    let scope = if flags == "--redis-per-second" {
        "ratelimit.redis_per_second_pool"
    } else {
        "ratelimit.redis_pool"
    };
    let load = |counts: &PoolCounts| {
        (
            counts.opened.load(Ordering::Relaxed),
            counts.closed.load(Ordering::Relaxed),
        )
    };
    let counts = store.pool_counts();
    metrics.statsd_sample(&format!("{scope}.cx_total"), Sample::Counter, {
        let counts = Arc::clone(&counts);
        move || load(&counts).0
    });
    metrics.statsd_sample(&format!("{scope}.cx_local_close"), Sample::Counter, {
        let counts = Arc::clone(&counts);
        move || load(&counts).1
    });
    metrics.statsd_sample(&format!("{scope}.cx_active"), Sample::Gauge, move || {
        let (opened, closed) = load(&counts);
        opened.saturating_sub(closed)
    });
}
