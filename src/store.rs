//! Where buckets live. One operation: apply all of a request's bucket operations atomically.
//!
//! Every store evaluates with [`crate::limiter::evaluate`] (or, for Redis, a Lua script that
//! must agree with it) and settles with [`crate::bucket::settle`], so a request's debits are
//! stored all or none, whatever the store.
//!
//! - [`memory`]: buckets in process memory (the embedded default).
//! - [`redis`]: buckets in Redis, one `EVALSHA` per request; in Redis Cluster
//!   ([`redis::cluster`]), one `EVALSHA` per hash slot touched, sent concurrently.
//! - [`split`]: per-second buckets in a second Redis, the rest in the main one; with
//!   [`fanout`], the all-or-nothing across stores (or slots) that cannot share one script.
//! - [`resilient`]: Redis (either kind, a [`RemoteStore`]) behind [`overlimit`] (local over-limit cache) and [`breaker`]
//!   (circuit breaker), answering by the failure policy while Redis is unusable.
//! - [`lease`]: between [`resilient`] and Redis, hot buckets answered locally from tokens
//!   debited in advance (`--lease-fraction`); all or nothing still holds, since every token a
//!   lease spends was debited in Redis by the same script first.

use async_trait::async_trait;

use crate::bucket::{Applied, BucketKey, BucketOp};

pub mod breaker;
pub mod fanout;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod overlimit;
pub mod redis;
pub mod resilient;
pub mod shed;
pub mod split;

pub use memory::MemoryStore;
pub use metrics::{LeaseMetrics, StoreMetrics};
pub use resilient::{FailurePolicy, Resilience, ResilientStore};

/// A store failure. Carries whether retrying could help, so callers pick the right answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time; it may come back.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something we cannot use; retrying will not help.
    #[error("store failed: {0}")]
    Failed(String),
}

impl StoreError {
    /// True when the same call may succeed later (an outage rather than a bug).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }

    /// A metric label: `unavailable` or `failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Failed(_) => "failed",
        }
    }
}

/// A bucket store.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Evaluates every op and stores the debits of all of them or of none (see
    /// [`crate::bucket::settle`]). Returns one result per op, in order.
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError>;

    /// [`Store::apply`]'s answer, given at once by a store that never waits (the in-process
    /// store): the request path then skips the future, whose box is an allocation and whose
    /// poll goes through a vtable. `None` (every other store): await [`Store::apply`].
    fn apply_at_once(&self, ops: &[BucketOp]) -> Option<Applied> {
        let _ = ops;
        None
    }

    /// Sets every bucket of `ops` to what a full bucket holds after a debit of the op's
    /// cost, whatever the bucket held before: cost 0 gives it its full capacity back (its
    /// state is deleted: an absent bucket is a full bucket, an empty window, for every
    /// algorithm), cost `c` leaves exactly capacity − `c` remaining. Each bucket is read and
    /// written in one atomic step of the store that holds it (one script call in Redis, the
    /// shard locks in memory), so a request landing at the same moment is counted either
    /// before the set, and overwritten, or after it; never in between. Returns one result per
    /// op, as [`Store::apply`] does. The ops are passed non-enforcing, without `overdraft`
    /// or `max_wait`, and with a cost within the bucket's capacity (the operator console
    /// checks it), so every set commits. The store remembers the set beside each bucket for
    /// as long as an older debit could be refunded ([`crate::limiter::set_memory_us`]), and
    /// drops a refund of a debit made at or before it ([`BucketOp::debited_at`]): refunds
    /// never cross a set. The operator console calls it (never the request
    /// path); a store that cannot set atomically fails, so the operator is told rather than
    /// answered with a bucket that is not what was asked.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let _ = ops;
        Err(StoreError::Failed(format!(
            "the {} store cannot set buckets",
            self.name()
        )))
    }

    /// The name under which this store keeps `key`'s state (Redis: after the configured key
    /// prefix), shown to operators so they can find it with their own tools.
    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        key.as_bytes().to_vec()
    }

    /// A short name for logs and metrics (`memory`, `redis`, `redis_cluster`).
    fn name(&self) -> &'static str;
}

/// A store shared by every replica over the network (Redis, Redis Cluster): it can be down,
/// so [`ResilientStore`] wraps it and probes it to know when it is back.
#[async_trait]
pub trait RemoteStore: Store {
    /// Is the store usable for requests now? One cheap call within the command timeout that
    /// needs what a request needs. A `PING` would not do: a Redis with writes paused
    /// (`CLIENT PAUSE … WRITE`, as `FAILOVER` does) answers `PING` but holds every script, and
    /// a probe that saw it as healthy would close the circuit breaker on every tick.
    async fn probe(&self) -> Result<(), StoreError>;

    /// Answers `ops` at once, with no call, when this replica already holds all they need
    /// (leases, [`lease::LeaseStore`]); `None` otherwise, and nothing changed. Such an answer
    /// takes no place among the calls in flight to the store ([`ResilientStore`]'s bound).
    fn answer_locally(&self, ops: &[BucketOp]) -> Option<Applied> {
        let _ = ops;
        None
    }
}
