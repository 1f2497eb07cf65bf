//! The Redis Cluster store: a request's buckets grouped by hash slot, one script per slot
//! group, all groups sent at once; if any group denies, the groups that debited are refunded.
//!
//! Redis Cluster runs a script only on keys of one slot, so the standalone guarantee "one
//! atomic script per request" becomes "one atomic script per slot touched, in parallel": a
//! request costs one round trip per node it touches, all concurrent, so its latency is that of
//! the slowest node rather than the sum. Each group is all-or-nothing inside its script, as in
//! standalone. Across groups the end state is all-or-nothing too, by compensation: if any
//! group denies, the groups that debited are refunded ([`crate::store::fanout`], shared with
//! the per-second split). A refund that fails is logged and counted
//! (`floodgate_cluster_refunds_total{result="failed"}`) and leaves that request's cost debited
//! until the bucket refills. A domain with
//! `redis_hash_tag: true` keeps every key in one slot, hence one group: strictly atomic.
//! docs/cluster.md has the operator's view.
//!
//! Routing, `MOVED`/`ASK` redirections and topology refresh are redis-rs's
//! [`ClusterConnection`]: one multiplexed connection per node, cheap to clone, shared by every
//! call, so no pool. `NOSCRIPT` (a node promoted by failover, a node added by resharding, or a
//! `SCRIPT FLUSH`) sends the call once more as `EVAL`, which also caches the script there.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, Slot};
use redis::{Arg, Cmd, ErrorKind, RedisResult, ServerErrorKind, TlsCertificates};

use super::deadline;
use super::errors::classify;
use super::redact::{redact_in, redact_url};
use super::script::{self, Action};
use crate::bucket::{Applied, BucketKey, BucketOp};
use crate::clock::Clock;
use crate::store::fanout::{apply_groups, set_groups};
use crate::store::metrics::StoreMetrics;
use crate::store::{RemoteStore, Store, StoreError};

/// How to reach a Redis Cluster.
#[derive(Clone)]
pub struct ClusterSettings {
    /// Seed nodes, `redis://[user:password@]host:port` or `rediss://…` for TLS; the rest of
    /// the cluster is discovered from them.
    pub seeds: Vec<String>,
    /// Prepended to every bucket key.
    pub key_prefix: String,
    /// Deadline to establish a connection to a node.
    pub connect_timeout: Duration,
    /// Deadline for one slot group's script (redirections included), and again for its
    /// refund.
    pub command_timeout: Duration,
}

impl fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seeds: Vec<String> = self.seeds.iter().map(|s| redact_url(s)).collect();
        f.debug_struct("ClusterSettings")
            .field("seeds", &seeds)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

/// Buckets in a Redis Cluster.
pub struct ClusterStore {
    /// Routes each command to its slot's master; cloned per call (a handle on one task).
    conn: ClusterConnection,
    /// Key prefix bytes.
    prefix: Vec<u8>,
    /// Deadline per slot group call and per refund.
    command_timeout: Duration,
    /// Where refunds are counted.
    metrics: StoreMetrics,
    /// Tests only: a clock whose time is passed to the script instead of Redis `TIME`.
    test_clock: Option<Arc<dyn Clock>>,
}

impl ClusterStore {
    /// A store for `settings`; `tls` adds a CA and client certificate to `rediss://` seeds.
    /// Connects in the background, like [`super::RedisStore`]: a cluster that is down at
    /// start-up is an outage for the failure policy, not a start-up failure.
    pub fn new(
        settings: &ClusterSettings,
        metrics: StoreMetrics,
        tls: Option<TlsCertificates>,
    ) -> Result<ClusterStore, StoreError> {
        let invalid = |e: redis::RedisError| {
            let seeds: Vec<String> = settings.seeds.iter().map(|s| redact_url(s)).collect();
            let mut said = format!("invalid Redis Cluster seeds {}: {e}", seeds.join(","));
            // redis-rs may quote a seed, or the part it choked on, in its error.
            for seed in &settings.seeds {
                said = redact_in(&said, seed);
            }
            StoreError::Failed(said)
        };
        if settings.seeds.is_empty() {
            return Err(StoreError::Failed(
                "Redis Cluster needs at least one seed node".into(),
            ));
        }
        let mut builder = ClusterClientBuilder::new(settings.seeds.iter().map(String::as_str))
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.command_timeout);
        if let Some(certificates) = tls {
            builder = builder.certs(certificates);
        }
        let client = builder.build().map_err(invalid)?;
        let conn = client.get_pending_async_connection_with_config(
            ClusterConfig::new()
                .set_connection_timeout(settings.connect_timeout)
                .set_response_timeout(settings.command_timeout),
        );
        Ok(ClusterStore {
            conn,
            prefix: settings.key_prefix.clone().into_bytes(),
            command_timeout: settings.command_timeout,
            metrics,
            test_clock: None,
        })
    }

    /// For tests only: evaluate at `clock`'s time instead of Redis `TIME` (see
    /// [`super::RedisStore::with_test_clock`]).
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> ClusterStore {
        self.test_clock = Some(clock);
        self
    }

    /// Runs the script with no bucket on every master within the command timeout: is every
    /// slot served, and taking writes, now? (See [`RemoteStore::probe`] for why not `PING`.)
    /// Sent as `EVAL` with the source, so a master that never ran it needs no second call.
    /// Then writes one short-lived key under the prefix, as the standalone probe does: the
    /// script writes nothing without buckets, so `maxmemory` under `noeviction` or an ACL
    /// refusal of the prefix would otherwise pass unseen.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(super::PROBE_KEY);
        let mut conn = self.conn.clone();
        let every_master = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::AllSucceeded),
        ));
        let probe = eval(&script::command(&self.prefix, &[], None));
        deadline(self.command_timeout, async move {
            // A fan-out's replies come back as values: a node's error reply is one of them.
            conn.route_command(probe, every_master)
                .await
                .and_then(redis::Value::extract_error)
                .map_err(|e| classify(&e))?;
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("PX")
                .arg(super::PROBE_KEY_TTL_MS)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| classify(&e))
        })
        .await
    }

    /// Runs the script for `ops`, all in one slot, within the command timeout.
    async fn run(&self, ops: &[BucketOp], now: Option<i64>, action: Action) -> Group {
        self.runner(ops, now, action).await
    }

    /// [`ClusterStore::run`] as a future that owns what it uses (the command, built now, and a
    /// handle on the connection), so that it can run in a task of its own.
    fn runner(
        &self,
        ops: &[BucketOp],
        now: Option<i64>,
        action: Action,
    ) -> impl Future<Output = Group> + Send + use<> {
        let command = script::command_doing(&self.prefix, ops, now, action);
        let mut conn = self.conn.clone();
        let (timeout, count) = (self.command_timeout, ops.len());
        deadline(timeout, async move {
            let reply = call(&mut conn, &command).await.map_err(|e| classify(&e))?;
            script::decode(&reply, count)
        })
    }
}

impl ClusterStore {
    /// Runs another service's `script` with `keys` (all of one slot) and `args` on the
    /// keys' master, within the command timeout (see [`super::shared`]).
    pub async fn run_script<T: redis::FromRedisValue>(
        &self,
        script: &super::shared::Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.clone();
        deadline(self.command_timeout, async move {
            super::shared::eval(&mut conn, script, keys, args)
                .await
                .map_err(|e| classify(&e))
        })
        .await
    }
}

/// One slot group's answer.
type Group = Result<Applied, StoreError>;

/// Sends a [`script::command`] and returns the script's raw reply. On `NOSCRIPT` the same
/// call is sent once more as `EVAL` with the script's source, which runs it and caches it on
/// whichever node serves the keys now, following redirections like any keyed command.
/// (`SCRIPT LOAD` first would need its own routing: through the cluster connection it goes to
/// every node and fails while any node is down — exactly after a failover; routed to the
/// slot's master, the failover test still met `NOSCRIPT` on the retry.)
async fn call(conn: &mut ClusterConnection, command: &Cmd) -> RedisResult<script::Reply> {
    match command.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            eval(command).query_async(conn).await
        }
        reply => reply,
    }
}

/// `EVALSHA <sha> <#keys> KEYS… ARGV…` as `EVAL <source> <#keys> KEYS… ARGV…`.
fn eval(evalsha: &Cmd) -> Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(script::SOURCE);
    for arg in evalsha.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// The indices of `ops` grouped by the hash slot of their Redis key ([`script::op_key`]),
/// groups in order of first appearance.
pub fn slot_groups(prefix: &[u8], ops: &[BucketOp]) -> Vec<(Slot, Vec<usize>)> {
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        // A reference counter's name (window start included) decides its slot, as it does
        // for reference pods.
        let slot = Slot::for_key(script::op_key(prefix, op));
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups
}

#[async_trait]
impl Store for ClusterStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let now = self.test_clock.as_ref().map(|clock| clock.now_us());
        let groups = slot_groups(&self.prefix, ops);
        match groups.as_slice() {
            [] => {
                return Ok(Applied::nothing());
            }
            // One slot (one descriptor, or a hash-tagged domain): exactly the standalone call.
            [_] => return self.run(ops, now, Action::Apply).await,
            _ => {}
        }
        let groups: Vec<Vec<usize>> = groups.into_iter().map(|(_, members)| members).collect();
        // The runners own what they use: a refund outlives a caller that goes away (fanout).
        let metrics = self.metrics.clone();
        apply_groups(
            ops,
            &groups,
            |_, group| self.runner(&group, now, Action::Apply),
            move |ok| metrics.record_cluster_refund(ok),
        )
        .await
    }

    /// One set script per slot group, sent concurrently: each bucket is set atomically in
    /// its slot. A set always commits, so no refund is ever sent; a group that fails fails
    /// the call.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let now = self.test_clock.as_ref().map(|clock| clock.now_us());
        let groups: Vec<Vec<usize>> = slot_groups(&self.prefix, ops)
            .into_iter()
            .map(|(_, members)| members)
            .collect();
        set_groups(ops, &groups, |_, group| async move {
            self.run(&group, now, Action::Set).await
        })
        .await
    }

    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        script::full_key(&self.prefix, key)
    }

    fn name(&self) -> &'static str {
        "redis_cluster"
    }
}

#[async_trait]
impl RemoteStore for ClusterStore {
    async fn probe(&self) -> Result<(), StoreError> {
        ClusterStore::probe(self).await
    }
}

#[cfg(test)]
mod tests;
