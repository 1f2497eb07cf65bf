use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Algorithm, LimitParams};
use crate::telemetry::metrics::Metrics;

const NOW: i64 = 1_749_945_600_000_000;

fn op(value: &str, algorithm: Algorithm, rate: u64, cost: i64) -> BucketOp {
    let params = LimitParams::of(algorithm, rate, 60, rate);
    BucketOp::debit("d", "k", value.as_bytes(), params, cost)
}

fn store() -> (Arc<ManualClock>, MemoryStore) {
    let clock = Arc::new(ManualClock::new(NOW));
    (clock.clone(), MemoryStore::new(clock))
}

/// A set of cost 0 (a reset) removes the buckets, of every algorithm: each is full again, and
/// a check-only op (what the console inspects with) reports what is left without debiting.
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
        let reset = store.set(std::slice::from_ref(&check)).await.unwrap();
        assert_eq!(reset.buckets[0].view.remaining, 4, "{algorithm:?}");
        assert!(store.state_of(&check.key).is_none(), "{algorithm:?}");
        let seen = store.apply_now(std::slice::from_ref(&check));
        assert_eq!(seen.buckets[0].view.remaining, 4, "{algorithm:?}");
    }
}

/// A set leaves exactly capacity − cost remaining whatever the bucket held (empty, part
/// spent, overdrawn), for every algorithm, and answers that view itself.
#[tokio::test]
async fn set_leaves_exactly_what_it_names() {
    let (_clock, store) = store();
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        for spent in [0, 2, 4] {
            let key = format!("{spent}");
            let _ = store.apply(&[op(&key, algorithm, 4, spent)]).await;
            let set = store.set(&[op(&key, algorithm, 4, 3)]).await.unwrap();
            assert!(set.committed);
            assert_eq!(
                set.buckets[0].view.remaining, 1,
                "{algorithm:?} after {spent}"
            );
            let seen = store.apply(&[op(&key, algorithm, 4, 0)]).await.unwrap();
            assert_eq!(
                seen.buckets[0].view.remaining, 1,
                "{algorithm:?} after {spent}"
            );
        }
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
    let metrics = Arc::new(Metrics::new());
    let store = store.with_max_buckets(128, Some(StoreMetrics::register(&metrics)));
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

/// The request path's synchronous answer ([`Store::apply_at_once`]) is [`Store::apply`]'s:
/// the same debits, stored alike, through the store's trait object as the decider calls it.
#[tokio::test]
async fn the_answer_at_once_is_the_awaited_answer() {
    let (_clock, at_once) = store();
    let (_clock, awaited) = store();
    let (at_once, awaited): (Arc<dyn Store>, Arc<dyn Store>) =
        (Arc::new(at_once), Arc::new(awaited));
    let ops = [
        op("a", Algorithm::TokenBucket, 3, 1),
        op("b", Algorithm::FixedWindow, 5, 2),
    ];
    for _ in 0..4 {
        let now = at_once
            .apply_at_once(&ops)
            .expect("the memory store answers at once");
        assert_eq!(now, awaited.apply(&ops).await.unwrap());
    }
}
