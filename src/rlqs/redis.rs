//! The share tables in Redis, for replicas sharing one Redis — standalone, Sentinel-managed
//! or a Cluster: one hash per bucket, settled by one script call (`lua/rlqs_share.lua`, the
//! twin of [`super::share::settle`]) on Redis's clock, so every replica's holders count
//! against the same rate.
//!
//! The calls go through the store's connection code ([`Topology`]: a [`RedisStore`] or a
//! [`ClusterStore`] built from the same flags, so the same TLS, credentials, Sentinel lookup
//! and failover, cluster routing and error handling), but through a store of their own, not
//! the rate-limit store's connections: share settles come once per bucket per reporting
//! interval (seconds), not per request, and keeping them apart means a report never waits
//! behind the request path, nor the other way round.
//!
//! On a Cluster a script may only touch keys of one slot: a settle or release touches one
//! key, the bucket's table; a stream's batch of re-evaluations ([`Shares::reassess`]) is
//! split by slot, one call per slot (concurrently), where one server takes one call per
//! [`BATCH`] tables.

use async_trait::async_trait;
use redis::cluster_routing::Slot;

use super::share::{Ask, ShareError, Shares};
use crate::store::StoreError;
use crate::store::redis::RedisStore;
use crate::store::redis::cluster::ClusterStore;
use crate::store::redis::shared::Script;

/// The script (see its header for KEYS, ARGV and the reply).
pub const SCRIPT: &str = include_str!("../../lua/rlqs_share.lua");

/// The most tables one re-evaluation call takes: a stream's buckets (up to
/// `--rlqs-max-buckets-per-stream`) in calls short enough not to hold Redis up.
pub const BATCH: usize = 100;

/// Where the share tables are: the Redis topology the rate-limit store's flags name.
pub enum Topology {
    /// One server, or the master a set of sentinels names.
    Redis(RedisStore),
    /// A Redis Cluster.
    Cluster(ClusterStore),
}

/// Share tables in one Redis (of any topology).
pub struct RedisShares {
    topology: Topology,
    script: Script,
    /// The configured key prefix, then `rlqs:`.
    prefix: String,
}

impl RedisShares {
    /// Tables in `topology`, under `key_prefix`. Nothing is contacted yet.
    pub fn new(topology: Topology, key_prefix: &str) -> RedisShares {
        RedisShares {
            topology,
            script: Script::new(SCRIPT),
            prefix: format!("{key_prefix}rlqs:"),
        }
    }

    /// The Redis key of `bucket`'s table.
    fn key(&self, bucket: &str) -> String {
        format!("{}{bucket}", self.prefix)
    }

    /// One script call on `keys` (all of one slot) with `args`; sent once more if Redis was
    /// unavailable. The store retires a connection that failed, so the second try goes out
    /// on a fresh one: after a failover each thread's first call meets its connection to the
    /// old master, and a stream should not end for that. Every operation of the script may
    /// run twice (a settle, a re-evaluation and a release leave the same row when repeated).
    async fn call<T: redis::FromRedisValue>(
        &self,
        keys: &[String],
        args: &[String],
    ) -> Result<T, ShareError> {
        let reply = match self.once(keys, args).await {
            Err(StoreError::Unavailable(_)) => self.once(keys, args).await,
            reply => reply,
        };
        reply.map_err(|e| match e {
            StoreError::Unavailable(said) | StoreError::Failed(said) => ShareError(said),
        })
    }

    async fn once<T: redis::FromRedisValue>(
        &self,
        keys: &[String],
        args: &[String],
    ) -> Result<T, StoreError> {
        match &self.topology {
            Topology::Redis(store) => store.run_script(&self.script, keys, args).await,
            Topology::Cluster(store) => store.run_script(&self.script, keys, args).await,
        }
    }
}

#[async_trait]
impl Shares for RedisShares {
    async fn settle(&self, bucket: &str, holder: &str, ask: Ask) -> Result<u64, ShareError> {
        let demand = match ask.demand {
            Some(demand) => demand.min(ask.capacity).to_string(),
            None => "-1".to_owned(),
        };
        self.call(
            &[self.key(bucket)],
            &[
                holder.to_owned(),
                "settle".to_owned(),
                ask.capacity.to_string(),
                demand,
                ask.life_us.max(1).to_string(),
            ],
        )
        .await
    }

    async fn release(&self, bucket: &str, holder: &str) -> Result<(), ShareError> {
        self.call::<u64>(
            &[self.key(bucket)],
            &[holder.to_owned(), "release".to_owned()],
        )
        .await
        .map(|_| ())
    }

    async fn reassess(
        &self,
        holder: &str,
        buckets: &[(String, u64)],
        life_us: i64,
    ) -> Result<Vec<Option<u64>>, ShareError> {
        // Batches of table indices: one per slot on a Cluster, any on one server.
        let mut batches: Vec<(Option<Slot>, Vec<usize>)> = Vec::new();
        for (index, (bucket, _)) in buckets.iter().enumerate() {
            let slot = match self.topology {
                Topology::Redis(_) => None,
                Topology::Cluster(_) => Some(Slot::for_key(self.key(bucket))),
            };
            match batches
                .iter_mut()
                .find(|(s, members)| *s == slot && members.len() < BATCH)
            {
                Some((_, members)) => members.push(index),
                None => batches.push((slot, vec![index])),
            }
        }
        let calls = batches.iter().map(|(_, members)| {
            let keys: Vec<String> = members.iter().map(|&i| self.key(&buckets[i].0)).collect();
            let mut args = vec![
                holder.to_owned(),
                "reassess".to_owned(),
                life_us.max(1).to_string(),
                String::new(),
            ];
            args.extend(members.iter().map(|&i| buckets[i].1.to_string()));
            async move { self.call::<Vec<i64>>(&keys, &args).await }
        });
        let replies = futures_util::future::try_join_all(calls).await?;
        let mut grants = vec![None; buckets.len()];
        for ((_, members), reply) in batches.iter().zip(replies) {
            if reply.len() != members.len() {
                return Err(ShareError(format!(
                    "malformed rlqs_share.lua reply: {} grants for {} tables",
                    reply.len(),
                    members.len()
                )));
            }
            for (&index, grant) in members.iter().zip(reply) {
                grants[index] = u64::try_from(grant).ok();
            }
        }
        Ok(grants)
    }
}
