//! The embedded store: buckets in process memory, for a single node.
//!
//! Buckets are spread over [`SHARDS`] mutex-protected hash maps. A request locks the shards
//! its buckets live in, in ascending shard order (so two requests can never deadlock),
//! evaluates every bucket, settles all-or-nothing, writes, and unlocks: atomic per request.
//! Every stored state carries an expiry (the limiter's TTL: the moment the state becomes
//! equivalent to an absent one); expired entries read as absent and a background sweep
//! ([`MemoryStore::spawn_sweeper`]) removes them, so idle buckets do not hold memory.
//!
//! # The bound
//!
//! A flood of distinct descriptor values creates one bucket each, so the store holds at most
//! `max_buckets` ([`MemoryStore::with_max_buckets`]), enforced per shard as
//! ⌊`max_buckets` / [`SHARDS`]⌋ (at least 1) so it needs no global lock. When a request would
//! add a bucket to a full shard, the shard first drops its expired buckets (only if one can
//! have expired: the shard remembers a lower bound of its expiries); if it is still full, it
//! evicts the bucket with the **earliest expiry** among the first [`EVICTION_SAMPLE`] entries
//! of its table (an arbitrary sample: the hash is randomly seeded). A bucket's expiry is the
//! moment it would read as absent anyway, so the earliest-expiring one is the nearest to
//! full and its loss costs the least accuracy; a bucket deep over its limit expires last and
//! is evicted last within the sample (not never: the sample is not the whole shard). Buckets
//! of the request being applied are never evicted: should only they be left, a shard may
//! exceed its capacity by the request's own new buckets until its next insert. Evictions are
//! counted in `floodgate_memory_evictions_total`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use hashbrown::HashTable;
use smallvec::SmallVec;

use super::{Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp, settle};
use crate::clock::Clock;
use crate::limiter::{self, State, Tat};
use crate::store::metrics::StoreMetrics;

/// Number of shards; a power of two well above the core count keeps lock contention low.
pub const SHARDS: usize = 64;

/// Entries of a full shard compared to choose the one to evict.
pub const EVICTION_SAMPLE: usize = 8;

/// One stored bucket in 24 bytes. `limiter::State` is 32 (three words for the sliding window
/// plus its tag) and the expiry 8 more; with the 16-byte key and hashbrown's control byte a
/// table slot was 57 bytes, and tables are sized in powers of two, so a million buckets took
/// 2 M slots (114 MB). Packed, a slot is 41 bytes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The whole µs of a token bucket's `tat`, or the window index of a window.
    time: i64,
    /// The (current) window's count, or the fraction of a token bucket's `tat` (below 10^9).
    /// The limiter caps counts at `limiter::MAX_COUNT` (`u32::MAX`), so 32 bits hold any
    /// count it stores.
    count: u32,
    /// The previous window's count (sliding window), or the fraction digits of a `tat`.
    previous: u32,
    /// The expiry (µs since the epoch at which the state becomes equivalent to absent) in the
    /// low 62 bits, sign-extended; the state's kind in the top two.
    expiry_and_kind: u64,
}

/// Expiries are kept within 62 signed bits: ±2^61 µs is ±73,000 years.
const EXPIRY_LIMIT: i64 = 1 << 61;

impl Entry {
    fn new(state: State, expires_at_us: i64) -> Entry {
        let (kind, time, count, previous) = match state {
            State::TokenBucket { tat } => {
                (0u64, tat.us, u64::from(tat.frac), u64::from(tat.digits))
            }
            State::FixedWindow { window, count } => (1, window, count, 0),
            State::SlidingWindow {
                window,
                current,
                previous,
            } => (2, window, current, previous),
        };
        let narrow = |n: u64| u32::try_from(n.min(limiter::MAX_COUNT)).unwrap_or(u32::MAX);
        let expiry = expires_at_us.clamp(-EXPIRY_LIMIT, EXPIRY_LIMIT - 1);
        Entry {
            time,
            count: narrow(count),
            previous: narrow(previous),
            expiry_and_kind: (expiry as u64 & (u64::MAX >> 2)) | kind << 62,
        }
    }

    /// µs since the epoch at which the state becomes equivalent to absent.
    fn expires_at_us(&self) -> i64 {
        ((self.expiry_and_kind << 2) as i64) >> 2
    }

    fn state(&self) -> State {
        match self.expiry_and_kind >> 62 {
            0 => State::TokenBucket {
                tat: Tat {
                    us: self.time,
                    frac: self.count,
                    digits: u8::try_from(self.previous).unwrap_or(u8::MAX),
                },
            },
            1 => State::FixedWindow {
                window: self.time,
                count: u64::from(self.count),
            },
            _ => State::SlidingWindow {
                window: self.time,
                current: u64::from(self.count),
                previous: u64::from(self.previous),
            },
        }
    }
}

/// A bucket key's hash, computed once per request ([`MemoryStore::hash_of`]): its low bits
/// choose the shard, and the shard's table takes it rotated, so that the bits a table indexes
/// by are not the ones every key of the shard shares.
#[derive(Debug, Clone, Copy)]
struct KeyHash(u64);

impl KeyHash {
    fn shard(self) -> usize {
        // SHARDS is a power of two; the low bits of a SipHash are well mixed.
        (self.0 as usize) & (SHARDS - 1)
    }

    fn table(self) -> u64 {
        self.0.rotate_left(32)
    }
}

#[derive(Debug, Default)]
struct Shard {
    /// The buckets of this shard, by [`KeyHash::table`].
    map: HashTable<(BucketKey, Entry)>,
    /// No entry expires before this (a lower bound, µs): a full shard sweeps only when some
    /// entry can have expired, so a flood of live buckets does not rescan it on every insert.
    earliest_expiry_us: i64,
    /// The buckets of this shard set or reset lately ([`Store::set`]): when (µs), and until
    /// when it is remembered ([`limiter::set_memory_us`]). A refund of a debit made at or
    /// before the set is dropped. Only the operator's sets add to it, and the sweep empties it.
    sets: HashMap<BucketKey, (i64, i64)>,
}

impl Shard {
    /// The entry stored for `key`, whose hash is `hash`.
    fn get(&self, hash: KeyHash, key: &BucketKey) -> Option<&Entry> {
        self.map
            .find(hash.table(), |(k, _)| k == key)
            .map(|(_, e)| e)
    }

    /// Removes the entry stored for `key`, whose hash is `hash`, if any.
    fn remove(&mut self, hash: KeyHash, key: &BucketKey) {
        if let Ok(entry) = self.map.find_entry(hash.table(), |(k, _)| k == key) {
            entry.remove();
        }
    }

    /// Drops expired entries, and gives back the table's memory when it is mostly empty
    /// (`retain` keeps the capacity a flood of keys grew it to); returns how many it dropped.
    /// `hasher` rehashes the entries a smaller table keeps.
    fn sweep(&mut self, now: i64, hasher: &RandomState) -> usize {
        let before = self.map.len();
        self.map.retain(|(_, e)| e.expires_at_us() > now);
        self.sets.retain(|_, &mut (_, until)| until > now);
        if self.map.len() < self.map.capacity() / 4 {
            self.map.shrink_to_fit(|(k, _)| hash_of(hasher, k).table());
        }
        self.earliest_expiry_us = self
            .map
            .iter()
            .map(|(_, e)| e.expires_at_us())
            .min()
            .unwrap_or(i64::MAX);
        before - self.map.len()
    }

    /// Whether `op` is a refund of a debit made at or before a set of its bucket that is
    /// still remembered at `now`.
    fn set_since(&self, op: &BucketOp, now: i64) -> bool {
        let Some(debited_at) = op.debited_at.filter(|_| op.cost < 0) else {
            return false;
        };
        // As the Redis script reads it.
        let debited_at = debited_at.clamp(0, limiter::MAX_NOW_US);
        self.sets
            .get(&op.key)
            .is_some_and(|&(at, until)| now < until && at >= debited_at)
    }

    /// Makes room for one new entry when the shard holds `capacity` or more: sweeps if
    /// something can have expired, then evicts per the module's policy, never a key `in_use`.
    /// Returns how many entries it evicted.
    fn make_room(
        &mut self,
        capacity: usize,
        now: i64,
        in_use: &[BucketOp],
        hasher: &RandomState,
    ) -> u64 {
        if self.map.len() < capacity {
            return 0;
        }
        if self.earliest_expiry_us <= now {
            self.sweep(now, hasher);
        }
        let mut evicted = 0;
        while self.map.len() >= capacity {
            let victim = self
                .map
                .iter()
                .filter(|(key, _)| !in_use.iter().any(|op| &op.key == key))
                .take(EVICTION_SAMPLE)
                .min_by_key(|(_, e)| e.expires_at_us())
                .map(|(key, _)| key.clone());
            // Only the request's own buckets are left: let the shard exceed its capacity by
            // them rather than lose a debit mid-request.
            let Some(key) = victim else { break };
            self.remove(hash_of(hasher, &key), &key);
            evicted += 1;
        }
        evicted
    }
}

/// In-process bucket store.
pub struct MemoryStore {
    /// The buckets, sharded by key hash.
    shards: Box<[Mutex<Shard>]>,
    /// Hashes keys to shards (randomly seeded: keys come from request values).
    hasher: RandomState,
    /// The time source; tests pass a manual clock.
    clock: Arc<dyn Clock>,
    /// Buckets one shard may hold (see the module's bound).
    shard_capacity: usize,
    /// Buckets evicted to stay within the bound, since start.
    evictions: AtomicU64,
    /// Where evictions are counted, when the store serves requests.
    metrics: Option<StoreMetrics>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashTable::new(),
                        earliest_expiry_us: i64::MAX,
                        sets: HashMap::new(),
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            clock,
            shard_capacity: usize::MAX,
            evictions: AtomicU64::new(0),
            metrics: None,
        }
    }

    /// Holds at most `max` buckets (⌊`max` / [`SHARDS`]⌋ per shard, at least 1), evicting as
    /// the module describes and counting evictions in `metrics`.
    pub fn with_max_buckets(mut self, max: usize, metrics: Option<StoreMetrics>) -> MemoryStore {
        self.shard_capacity = (max / SHARDS).max(1);
        self.metrics = metrics;
        self
    }

    /// Buckets evicted to stay within the bound, since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
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
            removed += lock(shard).sweep(now, &self.hasher);
        }
        removed
    }

    /// The stored state of `key` and the µs time at which it expires, if any is stored and
    /// not yet expired. For tests that compare stores.
    pub fn state_of(&self, key: &BucketKey) -> Option<(State, i64)> {
        let now = self.clock.now_us();
        let hash = self.hash_of(key);
        let shard = lock(&self.shards[hash.shard()]);
        shard
            .get(hash, key)
            .filter(|e| e.expires_at_us() > now)
            .map(|e| (e.state(), e.expires_at_us()))
    }

    /// Number of stored buckets (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Buckets the shards' tables can hold without growing.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.capacity()).sum()
    }

    /// True when no bucket is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn hash_of(&self, key: &BucketKey) -> KeyHash {
        hash_of(&self.hasher, key)
    }

    #[cfg(test)]
    fn shard_of(&self, key: &BucketKey) -> usize {
        self.hash_of(key).shard()
    }

    fn apply_now(&self, ops: &[BucketOp]) -> Applied {
        self.run(ops, Action::Apply)
    }

    /// Reads, evaluates, settles and writes `ops` under their shards' locks, doing `action`.
    fn run(&self, ops: &[BucketOp], action: Action) -> Applied {
        let now = self.clock.now_us();
        // Each key hashed once, for its shard and its table; the lists below stay on the
        // stack for up to four buckets.
        let hashes: SmallVec<[KeyHash; 4]> = ops.iter().map(|op| self.hash_of(&op.key)).collect();
        let mut order: SmallVec<[usize; 4]> = hashes.iter().map(|h| h.shard()).collect();
        order.sort_unstable();
        order.dedup();
        // Lock in ascending shard order: no two requests can wait on each other in a cycle.
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let guard_index = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        let evaluations: SmallVec<[_; 4]> = ops
            .iter()
            .zip(&hashes)
            .map(|(op, &hash)| {
                let shard = &guards[guard_index(hash.shard())].1;
                let state = match action {
                    Action::Apply => shard
                        .get(hash, &op.key)
                        .filter(|e| e.expires_at_us() > now)
                        .map(Entry::state),
                    Action::Set => None,
                };
                if action == Action::Apply && shard.set_since(op, now) {
                    // The debit this refund gives back was set away: nothing to give.
                    let check = limiter::evaluate(&op.params, state.as_ref(), now, 0);
                    return limiter::Evaluation {
                        admitted: true,
                        retry_after_us: Some(0),
                        ..check
                    };
                }
                limiter::evaluate_refund_of(&op.params, state.as_ref(), now, op.cost, op.debited_in)
            })
            .collect();

        let (mut applied, writes) = settle(ops, &evaluations);
        for result in &mut applied.buckets {
            result.at_us = Some(now);
        }
        let mut evicted = 0;
        for ((op, evaluation), (&hash, write)) in
            ops.iter().zip(&evaluations).zip(hashes.iter().zip(writes))
        {
            let shard = &mut guards[guard_index(hash.shard())].1;
            if action == Action::Set && applied.committed {
                let memory = i64::try_from(limiter::set_memory_us(&op.params)).unwrap_or(i64::MAX);
                if memory > 0 {
                    shard
                        .sets
                        .insert(op.key.clone(), (now, now.saturating_add(memory)));
                }
            }
            // A set that debits nothing leaves a full bucket: no state at all.
            if action == Action::Set && op.cost == 0 {
                if applied.committed {
                    shard.remove(hash, &op.key);
                }
                continue;
            }
            let Some((state, ttl_us)) = evaluation.next.filter(|_| write) else {
                continue;
            };
            if ttl_us == 0 {
                shard.remove(hash, &op.key);
            } else {
                let expires_at_us = now.saturating_add(i64::try_from(ttl_us).unwrap_or(i64::MAX));
                let entry = Entry::new(state, expires_at_us);
                let expiry_us = entry.expires_at_us();
                // A stored bucket is updated in place: its key is cloned (an allocation)
                // only for a new one.
                match shard.map.find_mut(hash.table(), |(k, _)| k == &op.key) {
                    Some((_, stored)) => *stored = entry,
                    None => {
                        evicted += shard.make_room(self.shard_capacity, now, ops, &self.hasher);
                        shard
                            .map
                            .insert_unique(hash.table(), (op.key.clone(), entry), |(k, _)| {
                                hash_of(&self.hasher, k).table()
                            });
                    }
                }
                shard.earliest_expiry_us = shard.earliest_expiry_us.min(expiry_us);
            }
        }
        drop(guards);
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
            if let Some(metrics) = &self.metrics {
                metrics.record_memory_evictions(evicted);
            }
        }
        applied
    }
}

/// What [`MemoryStore::run`] does with the stored states it reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Evaluates the ops against them ([`Store::apply`]).
    Apply,
    /// Replaces them ([`Store::set`]): each op is evaluated against a full bucket.
    Set,
}

/// The hash of `key` under the store's `hasher` (randomly seeded: keys come from request
/// values).
fn hash_of(hasher: &RandomState, key: &BucketKey) -> KeyHash {
    KeyHash(hasher.hash_one(key))
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

    fn apply_at_once(&self, ops: &[BucketOp]) -> Option<Applied> {
        Some(self.apply_now(ops))
    }

    /// Under the same shard locks as a request: nothing lands between reading and writing.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        Ok(self.run(ops, Action::Set))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests;
