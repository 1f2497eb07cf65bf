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

use super::{Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp, settle};
use crate::clock::Clock;
use crate::limiter::{self, State, Tat};
use crate::telemetry::metrics::Metrics;

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

#[derive(Debug, Default)]
struct Shard {
    /// The buckets of this shard.
    map: HashMap<BucketKey, Entry>,
    /// No entry expires before this (a lower bound, µs): a full shard sweeps only when some
    /// entry can have expired, so a flood of live buckets does not rescan it on every insert.
    earliest_expiry_us: i64,
}

impl Shard {
    /// Drops expired entries, and gives back the table's memory when it is mostly empty
    /// (`retain` keeps the capacity a flood of keys grew it to); returns how many it dropped.
    fn sweep(&mut self, now: i64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| e.expires_at_us() > now);
        if self.map.len() < self.map.capacity() / 4 {
            self.map.shrink_to_fit();
        }
        self.earliest_expiry_us = self
            .map
            .values()
            .map(|e| e.expires_at_us())
            .min()
            .unwrap_or(i64::MAX);
        before - self.map.len()
    }

    /// Makes room for one new entry when the shard holds `capacity` or more: sweeps if
    /// something can have expired, then evicts per the module's policy, never a key `in_use`.
    /// Returns how many entries it evicted.
    fn make_room(&mut self, capacity: usize, now: i64, in_use: &[BucketOp]) -> u64 {
        if self.map.len() < capacity {
            return 0;
        }
        if self.earliest_expiry_us <= now {
            self.sweep(now);
        }
        let mut evicted = 0;
        while self.map.len() >= capacity {
            let victim = self
                .map
                .iter()
                .filter(|(key, _)| !in_use.iter().any(|op| &op.key == *key))
                .take(EVICTION_SAMPLE)
                .min_by_key(|(_, e)| e.expires_at_us())
                .map(|(key, _)| key.clone());
            // Only the request's own buckets are left: let the shard exceed its capacity by
            // them rather than lose a debit mid-request.
            let Some(key) = victim else { break };
            self.map.remove(&key);
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
    metrics: Option<Arc<Metrics>>,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::new(),
                        earliest_expiry_us: i64::MAX,
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
    pub fn with_max_buckets(mut self, max: usize, metrics: Option<Arc<Metrics>>) -> MemoryStore {
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
            removed += lock(shard).sweep(now);
        }
        removed
    }

    /// The stored state of `key` and the µs time at which it expires, if any is stored and
    /// not yet expired. For tests that compare stores.
    pub fn state_of(&self, key: &BucketKey) -> Option<(State, i64)> {
        let now = self.clock.now_us();
        let shard = lock(&self.shards[self.shard_of(key)]);
        shard
            .map
            .get(key)
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
                let map = &guards[guard_index(shard)].1.map;
                let state = map
                    .get(&op.key)
                    .filter(|e| e.expires_at_us() > now)
                    .map(Entry::state);
                limiter::evaluate_refund_of(&op.params, state.as_ref(), now, op.cost, op.debited_in)
            })
            .collect();

        let (applied, writes) = settle(ops, &evaluations);
        let mut evicted = 0;
        for ((op, evaluation), (&shard, write)) in ops
            .iter()
            .zip(&evaluations)
            .zip(shard_ids.iter().zip(writes))
        {
            let Some((state, ttl_us)) = evaluation.next.filter(|_| write) else {
                continue;
            };
            let shard = &mut guards[guard_index(shard)].1;
            if ttl_us == 0 {
                shard.map.remove(&op.key);
            } else {
                let expires_at_us = now.saturating_add(i64::try_from(ttl_us).unwrap_or(i64::MAX));
                if !shard.map.contains_key(&op.key) {
                    evicted += shard.make_room(self.shard_capacity, now, ops);
                }
                let entry = Entry::new(state, expires_at_us);
                shard.earliest_expiry_us = shard.earliest_expiry_us.min(entry.expires_at_us());
                shard.map.insert(op.key.clone(), entry);
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

    async fn reset(&self, ops: &[BucketOp]) -> Result<(), StoreError> {
        for op in ops {
            lock(&self.shards[self.shard_of(&op.key)])
                .map
                .remove(&op.key);
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Algorithm, LimitParams};

    const NOW: i64 = 1_749_945_600_000_000;

    fn op(value: &str, algorithm: Algorithm, rate: u64, cost: i64) -> BucketOp {
        let params = LimitParams::of(algorithm, rate, 60, rate);
        BucketOp::debit("d", "k", value.as_bytes(), params, cost)
    }

    fn store() -> (Arc<ManualClock>, MemoryStore) {
        let clock = Arc::new(ManualClock::new(NOW));
        (clock.clone(), MemoryStore::new(clock))
    }

    /// A reset removes the buckets, of every algorithm: each is full again, and a check-only
    /// op (what the console inspects with) reports what is left without debiting.
    #[tokio::test]
    async fn reset_gives_full_capacity_back_and_checks_debit_nothing() {
        let (_clock, store) = store();
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            let debit = op("a", algorithm, 4, 3);
            store.apply_now(std::slice::from_ref(&debit));
            let check = op("a", algorithm, 4, 0);
            for _ in 0..3 {
                let seen = store.apply_now(std::slice::from_ref(&check));
                assert_eq!(seen.buckets[0].view.remaining, 1, "{algorithm:?}");
            }
            store.reset(std::slice::from_ref(&check)).await.unwrap();
            assert!(store.state_of(&check.key).is_none(), "{algorithm:?}");
            let seen = store.apply_now(std::slice::from_ref(&check));
            assert_eq!(seen.buckets[0].view.remaining, 4, "{algorithm:?}");
        }
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

    /// An entry is 24 bytes and gives back the state and expiry it was given, at the edges
    /// of every field.
    #[test]
    fn entries_are_packed_without_loss() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        let max = limiter::MAX_COUNT;
        let states = [
            State::TokenBucket {
                tat: Tat::from_us(i64::MIN),
            },
            State::TokenBucket {
                tat: Tat {
                    us: i64::MAX,
                    frac: 999_999_999,
                    digits: 9,
                },
            },
            State::FixedWindow {
                window: -1,
                count: max,
            },
            State::FixedWindow {
                window: i64::MAX,
                count: 0,
            },
            State::SlidingWindow {
                window: 7,
                current: max,
                previous: 1,
            },
            State::SlidingWindow {
                window: 0,
                current: 0,
                previous: max,
            },
        ];
        for state in states {
            for expiry in [NOW, 0, -1, EXPIRY_LIMIT - 1, -EXPIRY_LIMIT] {
                let entry = Entry::new(state, expiry);
                assert_eq!((entry.state(), entry.expires_at_us()), (state, expiry));
            }
            // Beyond 62 bits an expiry is clamped: still ~73,000 years away.
            assert_eq!(
                Entry::new(state, i64::MAX).expires_at_us(),
                EXPIRY_LIMIT - 1
            );
        }
    }

    /// Once a flood of buckets has expired, the sweep gives the tables' memory back.
    #[test]
    fn sweep_after_a_flood_shrinks_the_tables() {
        let (clock, store) = store();
        for i in 0..20_000 {
            store.apply_now(&[op(&format!("flood-{i}"), Algorithm::TokenBucket, 10, 1)]);
        }
        let grown = store.capacity();
        assert!(grown >= 20_000);
        clock.advance(60_000_000);
        store.apply_now(&[op("survivor", Algorithm::TokenBucket, 10, 1)]);
        assert_eq!(store.sweep(), 20_000);
        assert_eq!(store.len(), 1);
        assert!(
            store.capacity() < grown / 10,
            "{grown} → {}",
            store.capacity()
        );
    }

    /// A random-key flood keeps the store within its bound, counting every eviction.
    #[test]
    fn flood_stays_within_bound() {
        let (_, store) = store();
        let metrics = Metrics::shared();
        let store = store.with_max_buckets(128, Some(metrics.clone()));
        for i in 0..10_000 {
            assert!(
                store
                    .apply_now(&[op(&format!("flood-{i}"), Algorithm::TokenBucket, 10, 1)])
                    .committed
            );
            assert!(store.len() <= 128);
        }
        assert_eq!(store.len() as u64 + store.evictions(), 10_000);
        let counted = format!("floodgate_memory_evictions_total {}\n", store.evictions());
        assert!(metrics.encode().contains(&counted), "{}", metrics.encode());
    }

    /// A full shard frees expired buckets before evicting live ones.
    #[test]
    fn full_shard_sweeps_before_evicting() {
        let (clock, store) = store();
        let store = store.with_max_buckets(SHARDS, None);
        for i in 0..1_000 {
            store.apply_now(&[op(&format!("old-{i}"), Algorithm::FixedWindow, 10, 1)]);
        }
        let evicted = store.evictions();
        clock.advance(60_000_000);
        for i in 0..1_000 {
            store.apply_now(&[op(&format!("new-{i}"), Algorithm::FixedWindow, 10, 1)]);
        }
        assert!(store.len() <= SHARDS);
        // Each shard's first new bucket replaced expired ones, not a live one.
        assert_eq!(store.evictions() - evicted, 1_000 - store.len() as u64);
    }

    /// The buckets of the request being applied are never evicted by its own inserts, and
    /// the earliest-expiring buckets are the ones evicted.
    #[test]
    fn request_buckets_are_never_evicted() {
        let (_, store) = store();
        // Two buckets per shard.
        let store = store.with_max_buckets(2 * SHARDS, None);
        let shard = store.shard_of(&op("probe", Algorithm::TokenBucket, 10, 1).key);
        let [a, b, c, d]: [BucketOp; 4] = (0..)
            .map(|i| op(&format!("k{i}"), Algorithm::TokenBucket, 10, 1))
            .filter(|o| store.shard_of(&o.key) == shard)
            .take(4)
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        // Three new buckets in a two-bucket shard: the third insert may not evict the first
        // two, so the shard holds all three rather than lose a debit mid-request.
        assert!(
            store
                .apply_now(&[a.clone(), b.clone(), c.clone()])
                .committed
        );
        for key in [&a.key, &b.key, &c.key] {
            assert!(store.state_of(key).is_some());
        }
        assert_eq!(store.evictions(), 0);
        // More debt means a later expiry: c expires last, a first, b in between.
        store.apply_now(&[b.clone(), c.clone()]);
        store.apply_now(std::slice::from_ref(&c));
        store.apply_now(std::slice::from_ref(&d));
        assert_eq!(store.evictions(), 2);
        assert!(store.state_of(&a.key).is_none() && store.state_of(&b.key).is_none());
        assert!(store.state_of(&c.key).is_some() && store.state_of(&d.key).is_some());
    }
}
