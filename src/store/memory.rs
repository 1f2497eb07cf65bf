//! The embedded store: buckets in process memory, for a single node.
//!
//! Buckets are spread over [`SHARDS`] mutex-protected hash maps. A request locks the shards
//! its buckets live in, in ascending shard order (so two requests can never deadlock),
//! evaluates every bucket, settles all-or-nothing, writes, and unlocks: atomic per request.
//! Every stored state carries an expiry (the limiter's TTL: the moment the state becomes
//! equivalent to an absent one); expired entries read as absent and a background sweep
//! ([`MemoryStore::spawn_sweeper`]) removes them, so idle buckets do not hold memory.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;

use super::{Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp, settle};
use crate::clock::Clock;
use crate::limiter::{self, State};

/// Number of shards; a power of two well above the core count keeps lock contention low.
pub const SHARDS: usize = 64;

#[derive(Debug)]
struct Entry {
    state: State,
    /// µs since the epoch at which `state` becomes equivalent to absent.
    expires_at_us: i64,
}

type Shard = HashMap<BucketKey, Entry>;

/// In-process bucket store.
pub struct MemoryStore {
    /// The buckets, sharded by key hash.
    shards: Box<[Mutex<Shard>]>,
    /// Hashes keys to shards (randomly seeded: keys come from request values).
    hasher: RandomState,
    /// The time source; tests pass a manual clock.
    clock: Arc<dyn Clock>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            clock,
        }
    }

    /// Starts a task that removes expired buckets every `interval`, one shard at a time.
    /// The task ends when the store is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<MemoryStore> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(store) = weak.upgrade() else { return };
                store.sweep();
            }
        })
    }

    /// Removes every expired bucket now. Returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_us();
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|_, e| e.expires_at_us > now);
            removed += before - shard.len();
        }
        removed
    }

    /// The stored state of `key` and the µs time at which it expires, if any is stored and
    /// not yet expired. For tests that compare stores.
    pub fn state_of(&self, key: &BucketKey) -> Option<(State, i64)> {
        let now = self.clock.now_us();
        let shard = lock(&self.shards[self.shard_of(key)]);
        shard
            .get(key)
            .filter(|e| e.expires_at_us > now)
            .map(|e| (e.state, e.expires_at_us))
    }

    /// Number of stored buckets (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// True when no bucket is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, key: &BucketKey) -> usize {
        // SHARDS is a power of two; the low bits of a SipHash are well mixed.
        (self.hasher.hash_one(key) as usize) & (SHARDS - 1)
    }

    fn apply_now(&self, ops: &[BucketOp]) -> Applied {
        let now = self.clock.now_us();
        let shard_ids: Vec<usize> = ops.iter().map(|op| self.shard_of(&op.key)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        // Lock in ascending shard order: no two requests can wait on each other in a cycle.
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let guard_index = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        let evaluations: Vec<_> = ops
            .iter()
            .zip(&shard_ids)
            .map(|(op, &shard)| {
                let map = &guards[guard_index(shard)].1;
                let state = map
                    .get(&op.key)
                    .filter(|e| e.expires_at_us > now)
                    .map(|e| &e.state);
                limiter::evaluate(&op.params, state, now, op.cost)
            })
            .collect();

        let (applied, writes) = settle(ops, &evaluations);
        for ((op, evaluation), (&shard, write)) in ops
            .iter()
            .zip(&evaluations)
            .zip(shard_ids.iter().zip(writes))
        {
            let Some((state, ttl_us)) = evaluation.next.filter(|_| write) else {
                continue;
            };
            let map = &mut guards[guard_index(shard)].1;
            if ttl_us == 0 {
                map.remove(&op.key);
            } else {
                let expires_at_us = now.saturating_add(i64::try_from(ttl_us).unwrap_or(i64::MAX));
                map.insert(
                    op.key.clone(),
                    Entry {
                        state,
                        expires_at_us,
                    },
                );
            }
        }
        applied
    }
}

/// A poisoned shard only means another request panicked mid-update of plain data; the map
/// itself is still valid, so keep serving rather than failing every later request.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[async_trait]
impl Store for MemoryStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        Ok(self.apply_now(ops))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::KeyValue;
    use crate::clock::ManualClock;
    use crate::limiter::{Algorithm, LimitParams};

    const NOW: i64 = 1_749_945_600_000_000;

    fn op(value: &str, algorithm: Algorithm, rate: u64, cost: i64) -> BucketOp {
        BucketOp {
            key: BucketKey::new(
                "d",
                [(&b"k"[..], KeyValue::Value(value.as_bytes()))],
                algorithm,
                60_000_000,
            ),
            params: LimitParams {
                algorithm,
                requests_per_period: rate,
                period_us: 60_000_000,
                burst: rate,
                overdraft: false,
            },
            cost,
            enforce: true,
        }
    }

    fn store() -> (Arc<ManualClock>, MemoryStore) {
        let clock = Arc::new(ManualClock::new(NOW));
        (clock.clone(), MemoryStore::new(clock))
    }

    /// Idle buckets expire: they read as absent after their TTL and the sweep frees them.
    #[test]
    fn idle_buckets_expire_and_are_swept() {
        let (clock, store) = store();
        for (i, algorithm) in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ]
        .into_iter()
        .enumerate()
        {
            store.apply_now(&[op(&i.to_string(), algorithm, 10, 1)]);
        }
        assert_eq!(store.len(), 3);
        assert_eq!(store.sweep(), 0, "nothing has expired yet");
        // The longest TTL is the sliding window's: the end of the next window.
        clock.advance(120_000_000);
        assert_eq!(store.sweep(), 3);
        assert!(store.is_empty());
    }

    /// An expired-but-unswept bucket reads as absent (full), not as its stale state.
    #[test]
    fn expired_state_reads_as_absent() {
        let (clock, store) = store();
        let first = store.apply_now(&[op("a", Algorithm::FixedWindow, 1, 1)]);
        assert!(first.committed);
        assert!(
            !store
                .apply_now(&[op("a", Algorithm::FixedWindow, 1, 1)])
                .committed
        );
        clock.advance(60_000_000);
        assert!(
            store
                .apply_now(&[op("a", Algorithm::FixedWindow, 1, 1)])
                .committed
        );
    }

    /// A denied batch writes nothing, and a refund to full removes the bucket.
    #[test]
    fn denied_batch_writes_nothing_and_full_refund_deletes() {
        let (_, store) = store();
        store.apply_now(&[op("full", Algorithm::TokenBucket, 1, 1)]);
        let denied = store.apply_now(&[
            op("other", Algorithm::TokenBucket, 5, 1),
            op("full", Algorithm::TokenBucket, 1, 1),
        ]);
        assert!(!denied.committed);
        assert!(
            store
                .state_of(&op("other", Algorithm::TokenBucket, 5, 1).key)
                .is_none(),
            "the admitted bucket of a denied request is not debited"
        );
        store.apply_now(&[op("full", Algorithm::TokenBucket, 1, -1)]);
        assert!(store.is_empty(), "a full bucket is not stored");
    }

    /// Concurrent requests over shared buckets never admit more than the limit in total.
    #[test]
    fn concurrent_requests_never_over_admit() {
        let (_, store) = store();
        let store = Arc::new(store);
        let admitted: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    let store = store.clone();
                    scope.spawn(move || {
                        (0..200)
                            .filter(|i| {
                                // Every request touches the shared bucket and a private one,
                                // in varying order, so shard locks are taken in many orders.
                                let private = format!("p{t}-{i}");
                                let mut ops = vec![
                                    op("shared", Algorithm::TokenBucket, 100, 1),
                                    op(&private, Algorithm::FixedWindow, 1_000, 1),
                                ];
                                if i % 2 == 0 {
                                    ops.reverse();
                                }
                                store.apply_now(&ops).committed
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
    }
}
