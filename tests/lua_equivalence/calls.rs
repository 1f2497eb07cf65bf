//! Deterministic properties of one script call over every algorithm: TTLs on what it
//! writes, an all-or-nothing denial, checks, overdraft, Redis `TIME`, repeated keys, many
//! operations, `now` clamped, and the script reloaded after a restart.

use super::common::*;

/// Every key the script writes carries a TTL (ceil of the state's TTL in ms), and a refund
/// back to "absent" deletes the key instead of storing it.
#[tokio::test]
async fn every_written_key_has_a_ttl() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let ops = one_of_each(3);
    let applied = lua(&mut conn, &ops, Some(NOW)).await;
    assert!(applied.committed);
    for (key, result) in redis_keys(&ops).iter().zip(&applied.buckets) {
        let ttl: i64 = conn.pttl(key).await.unwrap();
        let expected = i64::try_from(result.view.reset_us.div_ceil(1000)).unwrap();
        assert!(
            ttl > 0 && ttl <= expected,
            "PTTL {ttl}, expected ≤ {expected}"
        );
    }
    let refund = lua(&mut conn, &one_of_each(-3), Some(NOW)).await;
    assert!(refund.committed);
    for key in redis_keys(&ops) {
        let exists: bool = conn.exists(&key).await.unwrap();
        assert!(
            !exists,
            "{} survived a full refund",
            String::from_utf8_lossy(&key)
        );
    }
}

/// A batch with one enforcing bucket over its limit changes no key at all (not even the
/// admitted buckets' TTLs), and reports the current views.
#[tokio::test]
async fn denied_batch_changes_no_key() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let ops = one_of_each(4);
    assert!(lua(&mut conn, &ops, Some(NOW)).await.committed);
    let keys = redis_keys(&ops);
    let before = dump(&mut conn, &keys).await;
    let ttl_before: i64 = conn.pttl(&keys[0]).await.unwrap();

    let mut batch = one_of_each(1);
    batch[2].cost = 7; // 4 + 7 > 10: the sliding window denies, so nothing is debited.
    let applied = lua(&mut conn, &batch, Some(NOW + 1000)).await;
    let states = [
        Some(State::TokenBucket {
            tat: Tat::from_us(NOW + 24_000_000),
        }),
        Some(State::FixedWindow {
            window: NOW / 60_000_000,
            count: 4,
        }),
        Some(State::SlidingWindow {
            window: NOW / 60_000_000,
            current: 4,
            previous: 0,
        }),
    ];
    assert_eq!(applied, spec(&batch, &states, NOW + 1000));
    assert!(!applied.committed);
    assert_eq!(applied.buckets[0].view.remaining, 6);
    assert_eq!(dump(&mut conn, &keys).await, before);
    let ttl_after: i64 = conn.pttl(&keys[0]).await.unwrap();
    assert!(
        ttl_after <= ttl_before,
        "the TTL was refreshed: {ttl_before} → {ttl_after} ms"
    );
}

/// Checks (cost 0) change nothing, neither on stored buckets nor by creating keys.
#[tokio::test]
async fn check_only_changes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let fresh = lua(&mut conn, &one_of_each(0), Some(NOW)).await;
    assert_eq!(fresh, spec(&one_of_each(0), &[None, None, None], NOW));
    let count: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(count, 0);

    assert!(lua(&mut conn, &one_of_each(10), Some(NOW)).await.committed);
    let keys = redis_keys(&one_of_each(0));
    let before = dump(&mut conn, &keys).await;
    let check = lua(&mut conn, &one_of_each(0), Some(NOW + 5)).await;
    assert!(check.committed && check.buckets.iter().all(|b| b.view.remaining == 0));
    assert_eq!(dump(&mut conn, &keys).await, before);
}

/// Overdraft debits larger than what is left are stored anyway (into debt), do not block the
/// batch, and the next check is over, exactly as the specification says.
#[tokio::test]
async fn overdraft_debits_apply_past_the_limit() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let overdraft = |cost| {
        let mut ops = one_of_each(cost);
        for op in &mut ops {
            op.params.overdraft = true;
        }
        ops
    };
    let charge = lua(&mut conn, &overdraft(25), Some(NOW)).await;
    assert_eq!(charge, spec(&overdraft(25), &[None, None, None], NOW));
    assert!(charge.committed && charge.buckets.iter().all(|b| !b.admitted));
    let states = [
        Some(State::TokenBucket {
            tat: Tat::from_us(NOW + 150_000_000),
        }),
        Some(State::FixedWindow {
            window: NOW / 60_000_000,
            count: 25,
        }),
        Some(State::SlidingWindow {
            window: NOW / 60_000_000,
            current: 25,
            previous: 0,
        }),
    ];
    for (key, state) in redis_keys(&overdraft(0)).iter().zip(&states) {
        assert_eq!(redis_state(&mut conn, key).await, *state);
    }
    let check = lua(&mut conn, &overdraft(0), Some(NOW + 5)).await;
    assert_eq!(check, spec(&overdraft(0), &states, NOW + 5));
    assert!(check.buckets.iter().all(|b| !b.admitted));
}

/// With ARGV[1] empty the script takes Redis `TIME`, and a 1-per-minute limit answers as the
/// memory store does at the host's clock (within the time the call took).
#[tokio::test]
async fn redis_time_matches_memory_store() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    for attempt in 0.. {
        assert!(attempt < 5, "a minute boundary fell inside every attempt");
        flush(&mut conn).await;
        let ops = vec![
            op("tb", params(Algorithm::TokenBucket, 1, 60, 1), 1, true),
            op("fw", params(Algorithm::FixedWindow, 1, 60, 1), 1, true),
            op("sw", params(Algorithm::SlidingWindow, 1, 60, 1), 1, true),
        ];
        let before = SystemClock.now_us();
        let first = lua(&mut conn, &ops, None).await;
        let second = lua(&mut conn, &ops, None).await;
        let after = SystemClock.now_us();
        if before / 60_000_000 != after / 60_000_000 {
            continue; // the windows moved in between: answers legitimately differ
        }
        let clock = Arc::new(ManualClock::new(before));
        let memory = MemoryStore::new(clock.clone());
        let expected_first = memory.apply(&ops).await.unwrap();
        let expected_second = memory.apply(&ops).await.unwrap();
        let slack = u64::try_from(after - before).unwrap();
        for (got, expected) in [(&first, &expected_first), (&second, &expected_second)] {
            assert_eq!(got.committed, expected.committed);
            for (g, e) in got.buckets.iter().zip(&expected.buckets) {
                assert_eq!(
                    (g.admitted, g.view.remaining),
                    (e.admitted, e.view.remaining)
                );
                // Later time: reset and retry can only have shrunk, by at most the call time.
                assert!(
                    g.view.reset_us <= e.view.reset_us
                        && g.view.reset_us + slack >= e.view.reset_us
                );
                let (gr, er) = (g.retry_after_us.unwrap(), e.retry_after_us.unwrap());
                assert!(gr <= er && gr + slack >= er, "retry {gr} vs {er}");
            }
        }
        assert!(first.committed && !second.committed);
        break;
    }
}

/// The same key twice in one call: both ops see the state before the call and the later
/// write wins, exactly as in the memory store.
#[tokio::test]
async fn repeated_key_matches_memory_store() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let memory = MemoryStore::new(Arc::new(ManualClock::new(NOW)));
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let ops = vec![op("dup", p, 3, true), op("dup", p, 1, true)];
    for _ in 0..3 {
        assert_eq!(
            lua_kept(&mut conn, &ops, NOW).await,
            memory.apply(&ops).await.unwrap()
        );
        let key = &redis_keys(&ops)[0];
        let stored = redis_state(&mut conn, key).await;
        assert_eq!(stored, memory.state_of(&ops[0].key).map(|(s, _)| s));
    }
}

/// A call of many operations (more than the script's table is first built for), algorithms
/// interleaved and one of them denied on the third call, answers and stores what the memory
/// store does, call after call.
#[tokio::test]
async fn many_operations_match_memory_store() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let memory = MemoryStore::new(Arc::new(ManualClock::new(NOW)));
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ];
    let mut ops: Vec<BucketOp> = (0..12)
        .map(|i| {
            let p = params(algorithms[i % 3], 10 + i as u64, 60, 10 + i as u64);
            op(&format!("many{i}"), p, 1 + (i % 2) as i64, true)
        })
        .collect();
    // A token bucket of 7 per second counts in finer ticks; this one admits two calls of 1.
    ops.push(op(
        "tight",
        params(Algorithm::TokenBucket, 7, 1, 2),
        1,
        true,
    ));
    for call in 0..3 {
        let expected = memory.apply(&ops).await.unwrap();
        assert_eq!(expected.committed, call < 2, "call {call}");
        assert_eq!(
            lua_kept(&mut conn, &ops, NOW).await,
            expected,
            "call {call}"
        );
        for (op, key) in ops.iter().zip(redis_keys(&ops)) {
            let stored = redis_state(&mut conn, &key).await;
            assert_eq!(
                stored,
                memory.state_of(&op.key).map(|(s, _)| s),
                "call {call}"
            );
        }
    }
}

/// A `now` outside [0, 2^52] is clamped exactly as `limiter::evaluate` clamps it.
#[tokio::test]
async fn now_is_clamped_like_the_limiter() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    for now in [-5, i64::MIN, i64::MAX, limiter::MAX_NOW_US + 1] {
        flush(&mut conn).await;
        let ops = one_of_each(2);
        assert_eq!(
            lua(&mut conn, &ops, Some(now)).await,
            spec(&ops, &[None, None, None], now)
        );
    }
}

/// The script is reloaded transparently (EVALSHA, then SCRIPT LOAD on NOSCRIPT) after Redis
/// restarts empty, and answers as a fresh bucket.
#[tokio::test]
async fn script_reloads_after_restart() {
    let mut server = RedisServer::start();
    let mut conn = server.connection().await;
    let ops = one_of_each(10);
    assert!(lua(&mut conn, &ops, Some(NOW)).await.committed);
    assert!(!lua(&mut conn, &ops, Some(NOW)).await.committed);
    server.restart();
    let mut conn = server.connection().await;
    assert_eq!(
        lua(&mut conn, &ops, Some(NOW)).await,
        spec(&ops, &[None, None, None], NOW)
    );
}
