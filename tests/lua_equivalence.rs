//! `lua/apply.lua` against the specification: the same bucket operations at the same fixed
//! times, applied by the script in a real `redis-server` and by the memory store (which calls
//! `limiter::evaluate` and `bucket::settle`), must give identical answers and identical state.
//!
//! Redis expires keys by real time while the memory store expires them by the test's fake
//! time, so the randomized test runs each script call in a MULTI/EXEC together with `PTTL` and
//! `PERSIST` of every key: it records the TTL the script set, then keeps Redis from expiring
//! anything (Redis does not expire keys in the middle of a transaction, but `PTTL` counts real
//! time, so the recorded TTL may be short by up to the time the transaction took, which the
//! test measures). Where the memory store holds a live state, Redis must hold the very same
//! state with the same TTL (rounded up to ms); where the memory store has none, Redis must hold
//! none or one whose own TTL had run out by the fake now (give or take that rounding) — a stale
//! state the algorithms treat as absent, which the identical answers of every later step
//! confirm.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use floodgate::bucket::{
    Applied, BucketKey, BucketOp, KeyValue, ReferenceCounter, ReferenceKey, settle,
};
use floodgate::clock::{Clock, ManualClock, SystemClock};
use floodgate::limiter::{self, Algorithm, LimitParams, State, Tat};
use floodgate::store::redis::script;
use floodgate::store::{MemoryStore, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Value};
use support::START_US;
use support::redis::RedisServer;

/// Prefix of every Redis key the tests write.
const PREFIX: &[u8] = b"fg:";

const SECOND: u64 = 1_000_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `cases` random cases of `strategy` against a fresh redis-server with the script
/// loaded, each by `run` on its own clone of one connection; panics with proptest's report
/// of the first case that fails.
fn check_against_redis<S: Strategy>(
    cases: u32,
    strategy: S,
    run: impl Fn(
        MultiplexedConnection,
        S::Value,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>>>>,
) {
    let server = RedisServer::start();
    let rt = runtime();
    let conn = rt.block_on(async {
        let mut conn = server.connection().await;
        // Transactions send EVALSHA without the NOSCRIPT fallback: load the script first.
        script::script().load_async(&mut conn).await.unwrap();
        conn
    });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&strategy, |case| {
        rt.block_on(run(conn.clone(), case))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn params(algorithm: Algorithm, rate: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_period: rate,
        period_us: period_s * SECOND,
        burst,
        overdraft: false,
        max_wait_us: 0,
    }
}

fn key(name: &str, algorithm: Algorithm, period_us: u64) -> BucketKey {
    BucketKey::new(
        "eq",
        [(&b"k"[..], KeyValue::Value(name.as_bytes()))],
        algorithm,
        period_us,
    )
}

fn op(name: &str, params: LimitParams, cost: i64, enforce: bool) -> BucketOp {
    BucketOp {
        key: key(name, params.algorithm, params.period_us),
        params,
        cost,
        enforce,
        reference: None,
        debited_in: None,
        debited_at: None,
    }
}

/// Runs the script with a fixed `now` (or Redis `TIME` for `None`). The command is the one
/// the store writes (the two encodings are equal byte for byte, `script`'s unit tests).
async fn lua(conn: &mut MultiplexedConnection, ops: &[BucketOp], now: Option<i64>) -> Applied {
    let _: String = script::script().load_async(conn).await.unwrap();
    let reply: Vec<u8> = script::command(PREFIX, ops, now)
        .query_async(conn)
        .await
        .unwrap();
    script::decode(&reply, ops.len()).unwrap()
}

/// [`lua`] at a fixed `now`, with every key it wrote made persistent in the same MULTI/EXEC.
/// Redis expires keys in its own real time while these tests hold `now` still; a key written
/// with a TTL of a few milliseconds must not vanish between one call of a sequence and the
/// next on a loaded machine.
async fn lua_kept(conn: &mut MultiplexedConnection, ops: &[BucketOp], now: i64) -> Applied {
    // EVALSHA inside a transaction cannot fall back to loading the script: load it first.
    let _: String = script::script().load_async(conn).await.unwrap();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .add_command(script::command(PREFIX, ops, Some(now)));
    for key in redis_keys(ops) {
        pipe.cmd("PERSIST").arg(key).ignore();
    }
    let (reply,): (Vec<u8>,) = pipe.query_async(conn).await.unwrap();
    script::decode(&reply, ops.len()).unwrap()
}

/// [`lua`] at `now`, and the state `key` holds right after it, read in the same MULTI/EXEC:
/// Redis samples its clock once for a transaction, so a state written with a TTL of 1 ms is
/// read before it can expire however loaded the machine is (the copy read is a DUMP of it
/// restored without a TTL).
async fn lua_then_state(
    conn: &mut MultiplexedConnection,
    ops: &[BucketOp],
    now: i64,
    key: &[u8],
) -> (Applied, Option<State>) {
    // EVALSHA inside a transaction cannot fall back to loading the script: load it first.
    let _: String = script::script().load_async(conn).await.unwrap();
    let (reply, dump): (Vec<u8>, Option<Vec<u8>>) = redis::pipe()
        .atomic()
        .add_command(script::command(PREFIX, ops, Some(now)))
        .cmd("DUMP")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    let copy = b"lua_then_state:copy";
    let () = conn.del(copy).await.unwrap();
    if let Some(dump) = dump {
        let () = redis::cmd("RESTORE")
            .arg(copy)
            .arg(0)
            .arg(dump)
            .query_async(conn)
            .await
            .unwrap();
    }
    let state = redis_state(conn, copy).await;
    (script::decode(&reply, ops.len()).unwrap(), state)
}

/// What the specification answers for `ops` at `now` against the given stored states.
fn spec(ops: &[BucketOp], states: &[Option<State>], now: i64) -> Applied {
    let evaluations: Vec<_> = ops
        .iter()
        .zip(states)
        .map(|(op, state)| limiter::evaluate(&op.params, state.as_ref(), now, op.cost))
        .collect();
    at(settle(ops, &evaluations).0, now)
}

/// `applied` as a store answers it at `now`: each result names the time it was evaluated at
/// (clamped as the script clamps it), which a refund of its debit carries.
fn at(mut applied: Applied, now: i64) -> Applied {
    for result in &mut applied.buckets {
        result.at_us = Some(now.clamp(0, limiter::MAX_NOW_US));
    }
    applied
}

/// The state a Redis key holds, decoded the way the script reads it (`None` if absent).
async fn redis_state(conn: &mut MultiplexedConnection, key: &[u8]) -> Option<State> {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(conn).await.unwrap();
    match kind.as_str() {
        "none" => None,
        "string" => {
            // A bucket full again within a millisecond may expire between TYPE and GET.
            let text: Option<String> = conn.get(key).await.unwrap();
            let text = text?;
            let tat = Tat::parse(&text).unwrap_or_else(|| panic!("unreadable tat {text:?}"));
            Some(State::TokenBucket { tat })
        }
        "hash" => {
            let h: HashMap<String, i64> = conn.hgetall(key).await.unwrap();
            let (window, count) = (h["w"], h["c"].unsigned_abs());
            Some(match h.get("p") {
                Some(p) => State::SlidingWindow {
                    window,
                    current: count,
                    previous: p.unsigned_abs(),
                },
                None => State::FixedWindow { window, count },
            })
        }
        other => panic!(
            "unexpected type {other} at {}",
            String::from_utf8_lossy(key)
        ),
    }
}

/// DUMP of every key (None when absent): a byte-exact snapshot of their contents.
async fn dump(conn: &mut MultiplexedConnection, keys: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in keys {
        out.push(redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap());
    }
    out
}

async fn flush(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("FLUSHALL").query_async(conn).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// The randomized equivalence test.
// ---------------------------------------------------------------------------------------

/// Keys in the pool of each case.
const POOL: usize = 4;

/// One operation of a step: which pool key, optionally other params (same period: a config
/// reload may change the algorithm or the numbers of a bucket, never the key's period), cost,
/// and the window its debit was counted in, as an offset from the current window's index
/// (`BucketOp::debited_in`: a past window, the current one, or one ahead after the clock
/// stepped back).
#[derive(Clone, Debug)]
struct OpSpec {
    key: usize,
    change: Option<(Algorithm, u64, u64, bool)>,
    cost: i64,
    enforce: bool,
    debited_in: Option<i64>,
    /// For a refund: the time of the debit it gives back (`BucketOp::debited_at`), as an
    /// offset from now; a set since then drops it.
    debited_at: Option<i64>,
}

#[derive(Clone, Debug)]
struct Step {
    /// µs the clock moves before this step (negative: it steps back).
    dt: i64,
    ops: Vec<OpSpec>,
    /// Keep a repeated key (the planner never sends one; both stores must still agree).
    allow_repeat: bool,
    /// The operator's set (`Store::set`, the script's set flag) instead of a request.
    set: bool,
}

#[derive(Clone, Debug)]
struct Case {
    /// Offset of the first step from `START_US` (day-aligned), µs.
    start: i64,
    pool: Vec<LimitParams>,
    steps: Vec<Step>,
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ])
}

/// Rates from 0 to u32::MAX: small ones, round ones, and beyond one per µs of a 1 s period
/// (where the token bucket's ticks get finer than a µs).
fn rate() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => 0u64..=12,
        3 => prop::sample::select(vec![3u64, 7, 10, 60, 100, 1000]),
        1 => 0u64..=1_000_000,
        1 => prop::sample::select(vec![999_999u64, 1_000_001, 4_000_000, 1_000_000_000]),
        1 => 1_000_000u64..=u64::from(u32::MAX),
        1 => Just(u64::from(u32::MAX)),
    ]
}

/// Periods of every unit, with multipliers up to the longest (year × 2), mostly short ones.
fn period_s() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => prop::sample::select(vec![1u64, 60, 3600]),
        1 => prop::sample::select(vec![7, 86_400, 604_800, 2_592_000, 31_536_000, 63_072_000]),
    ]
}

/// Burst: the rate itself (the default), a small number, twice the rate, or the largest.
fn burst_for(rate: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => Just(rate),
        4 => 0u64..=20,
        2 => Just(rate.saturating_mul(2)),
        1 => Just(u64::from(u32::MAX)),
    ]
}

/// Mostly valid limits, mostly of 1 s, 1 min and 1 h; a few that config validation would
/// refuse, which both sides must clamp the same way. About a third are `overdraft`, and
/// about two in five have a `max_wait` (from 1 µs to beyond the longest accepted; with
/// `overdraft` or a window too, which validation refuses and both sides ignore).
fn limit_params() -> impl Strategy<Value = LimitParams> {
    let valid = (algorithm(), rate(), period_s())
        .prop_flat_map(|(a, r, p)| burst_for(r).prop_map(move |b| params(a, r, p, b)));
    let refused = (
        algorithm(),
        prop::sample::select(vec![0u64, 5, 2_000_000, u64::MAX]),
        prop::sample::select(vec![0u64, 999, 1500, 7 * SECOND, u64::MAX]),
        prop::sample::select(vec![0u64, 3, u64::MAX]),
    )
        .prop_map(|(a, r, period_us, b)| LimitParams {
            algorithm: a,
            requests_per_period: r,
            period_us,
            burst: b,
            overdraft: false,
            max_wait_us: 0,
        });
    let max_wait = prop_oneof![
        3 => Just(0u64),
        2 => prop::sample::select(vec![
            1u64,
            999,
            50_000,
            1_000_000,
            limiter::MAX_WAIT_US,
            u64::MAX
        ]),
    ];
    (
        prop_oneof![12 => valid, 1 => refused],
        prop::bool::weighted(0.35),
        max_wait,
    )
        .prop_map(|(p, overdraft, max_wait_us)| LimitParams {
            overdraft,
            max_wait_us,
            ..p
        })
}

fn cost() -> impl Strategy<Value = i64> {
    let max = i64::from(u32::MAX);
    prop_oneof![
        8 => -3i64..=12,
        2 => Just(0i64),
        1 => -40i64..=40,
        1 => prop::sample::select(vec![i64::MAX, i64::MIN, max, max + 1, -max, 1 << 53, 1_000_000]),
    ]
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        0..POOL,
        prop::option::weighted(0.1, (algorithm(), rate(), 0u64..=20, any::<bool>())),
        cost(),
        prop::bool::weighted(0.85),
        prop::option::weighted(0.4, -3i64..=1),
        prop::option::weighted(0.4, -3_000_000i64..=1_000),
    )
        .prop_map(
            |(key, change, cost, enforce, debited_in, debited_at)| OpSpec {
                key,
                change,
                cost,
                enforce,
                debited_in,
                debited_at,
            },
        )
}

/// Time steps from 0 µs to 2 h (two periods of the longest limit), sometimes a little back.
fn dt() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        3 => 0i64..1_000,
        4 => 0i64..2_000_000,
        2 => 0i64..120_000_000,
        1 => 0i64..7_200_000_000,
        1 => -2_000_000i64..0,
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        dt(),
        prop::collection::vec(op_spec(), 1..=5),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(dt, ops, allow_repeat, set)| Step {
            dt,
            ops,
            allow_repeat,
            set,
        })
}

fn case() -> impl Strategy<Value = Case> {
    (
        0i64..7_200_000_000,
        prop::collection::vec(limit_params(), POOL),
        prop::collection::vec(step(), 1..40),
    )
        .prop_map(|(start, pool, steps)| Case { start, pool, steps })
}

/// The bucket ops of one step at `now`.
fn ops_of(step: &Step, pool: &[LimitParams], keys: &[BucketKey], now: i64) -> Vec<BucketOp> {
    let mut seen = [false; POOL];
    let mut ops = Vec::new();
    for spec in &step.ops {
        if !step.allow_repeat && std::mem::replace(&mut seen[spec.key], true) {
            continue;
        }
        let base = pool[spec.key];
        let params = match spec.change {
            Some((algorithm, rate, burst, overdraft)) => LimitParams {
                algorithm,
                requests_per_period: rate,
                burst,
                overdraft,
                ..base
            },
            None => base,
        };
        // The window index the limiter puts `now` in (its period clamped as it clamps it).
        let period = i64::try_from(params.period_us.clamp(1000, limiter::MAX_PERIOD_US)).unwrap();
        ops.push(BucketOp {
            key: keys[spec.key].clone(),
            params,
            cost: spec.cost,
            enforce: spec.enforce,
            reference: None,
            debited_in: spec.debited_in.map(|offset| now / period + offset),
            debited_at: spec.debited_at.map(|offset| now + offset),
        });
    }
    ops
}

/// What the test saw of the script's last write of a key.
#[derive(Clone, Copy, Debug)]
struct Write {
    /// Fake time of the write, µs.
    at: i64,
    /// PTTL right after it, ms.
    pttl_ms: i64,
    /// Real time the transaction took, ms (rounded up): the TTL the script set lies in
    /// `[pttl_ms, pttl_ms + took_ms]`.
    took_ms: i64,
}

/// Compares what the memory store holds live (state, expiry) with what Redis holds.
fn compare_state(
    memory: Option<(State, i64)>,
    redis: Option<State>,
    write: Option<&Write>,
    now: i64,
) -> Result<(), String> {
    match (memory, redis, write) {
        (None, None, _) => Ok(()),
        (Some((state, expires_at)), Some(stored), Some(w)) => {
            let ttl_ms = (expires_at - w.at + 999).div_euclid(1000);
            if stored == state && (w.pttl_ms..=w.pttl_ms + w.took_ms).contains(&ttl_ms) {
                Ok(())
            } else {
                Err(format!(
                    "memory holds {state:?} for {ttl_ms} ms, redis {stored:?} with {w:?}"
                ))
            }
        }
        // Only a state whose own TTL (rounded up to ms) ran out by now may linger in Redis.
        (None, Some(_), Some(w)) if w.at + (w.pttl_ms - 1) * 1000 < now => Ok(()),
        (memory, redis, write) => Err(format!(
            "memory holds {memory:?}, redis {redis:?} (last write seen: {write:?})"
        )),
    }
}

/// The key of each limit of a case's pool, named by its index.
fn pool_keys(pool: &[LimitParams]) -> Vec<BucketKey> {
    pool.iter()
        .enumerate()
        .map(|(i, p)| key(&i.to_string(), p.algorithm, p.period_us))
        .collect()
}

/// Drives one case through both stores; `Err` describes the first divergence.
async fn run_case(conn: &mut MultiplexedConnection, case: &Case) -> Result<(), String> {
    flush(conn).await;
    let keys = pool_keys(&case.pool);
    let redis_keys: Vec<Vec<u8>> = keys.iter().map(|k| script::full_key(PREFIX, k)).collect();
    // The set marker of a key without braces (lua/apply.lua's header): `key{key}~set`.
    let markers: Vec<Vec<u8>> = redis_keys
        .iter()
        .map(|k| [k.as_slice(), b"{", k.as_slice(), b"}~set"].concat())
        .collect();
    let clock = Arc::new(ManualClock::new(START_US + case.start));
    let memory = MemoryStore::new(clock.clone());
    let mut written: HashMap<usize, Write> = HashMap::new();
    for (n, step) in case.steps.iter().enumerate() {
        clock.advance(step.dt);
        let now = clock.now_us();
        let ops = ops_of(step, &case.pool, &keys, now);
        let (expected, command) = if step.set {
            let expected = memory.set(&ops).await;
            (expected, script::set_command(PREFIX, &ops, Some(now)))
        } else {
            let expected = memory.apply(&ops).await;
            (expected, script::command(PREFIX, &ops, Some(now)))
        };
        let expected = expected.map_err(|e| e.to_string())?;

        let mut pipe = redis::pipe();
        pipe.atomic().add_command(command);
        for key in &redis_keys {
            pipe.cmd("PTTL").arg(key).cmd("PERSIST").arg(key).ignore();
        }
        // The sets' markers are judged by the script's `now`, not their PX: kept like the keys.
        for marker in &markers {
            pipe.cmd("PERSIST").arg(marker).ignore();
        }
        let sent = Instant::now();
        let mut results: Vec<Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
        let took_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX) + 1;
        let ttls: Vec<i64> = results
            .split_off(1)
            .into_iter()
            .map(|v| redis::from_redis_value(v).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let reply: script::Reply =
            redis::from_redis_value(results.remove(0)).map_err(|e| e.to_string())?;
        let got = script::decode(&reply, ops.len()).map_err(|e| e.to_string())?;
        let context = || format!("step {n} at now {now} with ops {ops:#?}");
        if got != expected {
            return Err(format!(
                "answers differ at {}:\n lua    {got:?}\n memory {expected:?}",
                context()
            ));
        }

        for (i, key) in keys.iter().enumerate() {
            match ttls[i] {
                // PTTL ≥ 0: written by this very call (PTTL counts real time, so it may
                // have reached 0; expiry itself waits until the transaction is over).
                pttl_ms if pttl_ms >= 0 => {
                    let write = Write {
                        at: now,
                        pttl_ms,
                        took_ms,
                    };
                    written.insert(i, write);
                }
                -2 => {
                    written.remove(&i);
                }
                _ => {}
            }
            let stored = redis_state(conn, &redis_keys[i]).await;
            compare_state(memory.state_of(key), stored, written.get(&i), now)
                .map_err(|e| format!("key {i} at {}: {e}", context()))?;
        }
    }
    Ok(())
}

/// For random batches, limits, costs and times, the script answers and stores exactly what
/// the memory store (the Rust specification) does, step after step.
#[test]
fn script_matches_memory_store() {
    check_against_redis(150, case(), |mut conn, case| {
        Box::pin(async move { run_case(&mut conn, &case).await })
    });
}

// ---------------------------------------------------------------------------------------
// Deterministic properties.
// ---------------------------------------------------------------------------------------

/// `START_US` + 10.5 s: inside a 1 s, 1 min and 1 h window alike, not on a boundary.
const NOW: i64 = START_US + 10_500_000;

fn one_of_each(cost: i64) -> Vec<BucketOp> {
    vec![
        op("tb", params(Algorithm::TokenBucket, 10, 60, 10), cost, true),
        op("fw", params(Algorithm::FixedWindow, 10, 60, 0), cost, true),
        op(
            "sw",
            params(Algorithm::SlidingWindow, 10, 60, 0),
            cost,
            true,
        ),
    ]
}

fn redis_keys(ops: &[BucketOp]) -> Vec<Vec<u8>> {
    script::keys(PREFIX, ops)
}

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

/// Token buckets faster than one token per µs store their `tat` as a decimal with the
/// limit's fraction digits, exactly as the specification computes it; a limit whose time per
/// token is a whole number of µs stores the same integer as ever; and a `tat` written with
/// other digits (the limit changed) reads as the specification reads it.
#[tokio::test]
async fn fine_ticks_are_stored_as_decimals() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let max = u64::from(u32::MAX);
    let limits = [
        (params(Algorithm::TokenBucket, max, 1, max), "1.000000000"),
        (
            params(Algorithm::TokenBucket, 1_000_000_000, 1, 10),
            "1.000",
        ),
        (
            params(Algorithm::TokenBucket, 4_000_000, 1, 4_000_000),
            "1.00",
        ),
        (params(Algorithm::TokenBucket, max, 7, 5), "1.00000000"),
        (params(Algorithm::TokenBucket, 3, 1, 3), "1.0"),
        (params(Algorithm::TokenBucket, 10, 1, 10), "1"),
        (params(Algorithm::TokenBucket, 1, 63_072_000, 2), "1"),
    ];
    for (i, (limit, form)) in limits.iter().enumerate() {
        let digits = form.split_once('.').map_or(0, |(_, f)| f.len());
        for (step, cost) in [3i64, 1, -1, 0, 7].into_iter().enumerate() {
            let ops = vec![op(&format!("fine{i}"), *limit, cost, true)];
            let key = &redis_keys(&ops)[0];
            let before = redis_state(&mut conn, key).await;
            let now = NOW + i64::try_from(step).unwrap();
            let got = lua_kept(&mut conn, &ops, now).await;
            assert_eq!(got, spec(&ops, &[before], now), "limit {i} step {step}");
            if let Some(State::TokenBucket { tat }) = redis_state(&mut conn, key).await {
                assert_eq!(usize::from(tat.digits), digits, "limit {i}");
                let text: Option<String> = conn.get(key).await.unwrap();
                if let Some(text) = text {
                    assert_eq!(Tat::parse(&text), Some(tat));
                }
            }
        }
    }
    // Another limit's digits (more and fewer), and a plain integer from an older version.
    let stored = [
        format!("{}.123456789", NOW + 2),
        format!("{}.5", NOW + 1),
        format!("{}", NOW + 3),
    ];
    for (i, text) in stored.iter().enumerate() {
        for (limit, _) in &limits {
            let ops = vec![op(&format!("other{i}"), *limit, 1, true)];
            let key = &redis_keys(&ops)[0];
            let () = conn.set(key, text).await.unwrap();
            let state = Some(State::TokenBucket {
                tat: Tat::parse(text).unwrap(),
            });
            assert_eq!(
                lua(&mut conn, &ops, Some(NOW)).await,
                spec(&ops, &[state], NOW)
            );
        }
    }
}

/// The token bucket at the edges of its numeric domain — the largest rates, periods and
/// tolerances, a debt at its 2^50-tick cap, `now` at 2^52, stored tats with more and fewer
/// digits — answers and stores exactly what the specification does. The script divides with a
/// plain `floor(a / b)` there (exact for every `a` below 2^53), so this is where a rounding
/// slip would show. Each case has a key of its own: a key written by an earlier case expires in
/// Redis's real time (milliseconds for the fastest rates), so reusing it would race its TTL.
#[tokio::test]
async fn token_bucket_at_its_numeric_bounds() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let max = u64::from(u32::MAX);
    let max_period_s = limiter::MAX_PERIOD_US / SECOND;
    let limits = [
        params(Algorithm::TokenBucket, max, 1, max),
        params(Algorithm::TokenBucket, max, max_period_s, max),
        params(Algorithm::TokenBucket, 1, max_period_s, 16),
        params(Algorithm::TokenBucket, 3, 7, max),
        params(Algorithm::TokenBucket, 7, 3_600, 1),
        LimitParams {
            overdraft: true,
            max_wait_us: 0,
            ..params(Algorithm::TokenBucket, 1, max_period_s, 1)
        },
    ];
    let max_now = limiter::MAX_NOW_US;
    let costs = [1, i64::from(u32::MAX), -i64::from(u32::MAX), 0, 2];
    for (i, limit) in limits.iter().enumerate() {
        for (n, now) in [NOW, max_now - 1, max_now].into_iter().enumerate() {
            let stored = [
                None,
                Some(format!("{}", now + (1 << 49))),
                Some(format!("{}.999999999", now + 12_345)),
                Some(format!("{}.5", now - 1)),
                Some(format!("{}", max_now + (1 << 50))),
            ];
            for (j, text) in stored.iter().enumerate() {
                for (k, cost) in costs.iter().enumerate() {
                    let ops = vec![op(&format!("edge{i}-{n}-{j}-{k}"), *limit, *cost, true)];
                    let key = &redis_keys(&ops)[0];
                    if let Some(text) = text {
                        let () = conn.set(key, text).await.unwrap();
                    }
                    let before = redis_state(&mut conn, key).await;
                    let (got, after) = lua_then_state(&mut conn, &ops, now, key).await;
                    let case = format!("limit {i}, now {now}, stored {text:?}, cost {cost}");
                    assert_eq!(got, spec(&ops, &[before], now), "{case}");
                    let evaluation = limiter::evaluate(limit, before.as_ref(), now, *cost);
                    let expected = match evaluation.next {
                        Some(_) if !got.committed => before,
                        None => before,
                        Some((_, 0)) => None,
                        Some((state, _)) => Some(state),
                    };
                    assert_eq!(after, expected, "{case}");
                }
            }
        }
    }
}

/// What a corrupted key holds before the script runs.
enum Corrupt {
    Text(&'static str),
    Hash(&'static [(&'static str, &'static str)]),
    /// A hash `{w: <NOW's 60 s window + offset>, c: <count>}` plus these extra fields.
    Window(i64, &'static str, &'static [(&'static str, &'static str)]),
    List,
}

/// Keys of the wrong type, another algorithm's shape or unparseable values read as absent
/// (never an error), out-of-range numbers are clamped like the Rust clamps them, and the
/// write replaces whatever was there.
#[tokio::test]
async fn garbage_state_is_absent_or_clamped() {
    use Corrupt::*;
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let index = NOW / 60_000_000;
    let tb = params(Algorithm::TokenBucket, 10, 60, 10);
    let fw = params(Algorithm::FixedWindow, 10, 60, 0);
    let sw = params(Algorithm::SlidingWindow, 10, 60, 0);
    let huge_count = State::FixedWindow {
        window: index,
        count: 99_999_999_999,
    };
    let zero_fixed = State::FixedWindow {
        window: index + 1,
        count: 0,
    };
    let zero_sliding = State::SlidingWindow {
        window: index + 1,
        current: 0,
        previous: 0,
    };
    // (limit, what the key holds, the state the Rust limiter would be given)
    let cases = [
        (tb, Hash(&[("w", "1")]), None),
        (tb, Text("abc"), None),
        (tb, Text("1.5e15"), None),
        (tb, Text("5."), None),
        (tb, Text(".5"), None),
        (tb, Text("5.0000000000"), None),
        (tb, Text("5.-1"), None),
        (tb, Text("5.1.2"), None),
        (tb, Text(""), None),
        (tb, List, None),
        (
            tb,
            Text("99999999999999999999999"),
            Some(State::TokenBucket {
                tat: Tat::from_us(i64::MAX),
            }),
        ),
        (
            tb,
            Text("-99999999999999999999999"),
            Some(State::TokenBucket {
                tat: Tat::from_us(i64::MIN),
            }),
        ),
        (fw, Text("12"), None),
        (fw, List, None),
        (fw, Hash(&[("w", "x"), ("c", "1")]), None),
        (fw, Hash(&[("c", "3")]), None),
        (fw, Window(0, "99999999999", &[]), Some(huge_count)),
        (sw, Window(0, "-4", &[("p", "1")]), None),
        // Zero counters are absent even in a later window (they must not hold the clock).
        (fw, Window(1, "0", &[]), Some(zero_fixed)),
        (sw, Window(1, "0", &[("p", "0")]), Some(zero_sliding)),
        (sw, Hash(&[("w", "-1"), ("c", "4"), ("p", "1")]), None),
        (
            sw,
            Hash(&[("w", "99999999999999999999"), ("c", "4"), ("p", "1")]),
            None,
        ),
        // Another algorithm's shape is absent too (the script tells them apart by `p`).
        (sw, Window(0, "4", &[]), None),
        (fw, Window(0, "4", &[("p", "0")]), None),
    ];
    for (i, (params, corrupt, state)) in cases.into_iter().enumerate() {
        let ops = vec![op(&format!("g{i}"), params, 2, true)];
        let key = &redis_keys(&ops)[0];
        let cmd = match corrupt {
            Text(v) => redis::cmd("SET").arg(key).arg(v).to_owned(),
            Hash(fields) => redis::cmd("HSET").arg(key).arg(fields).to_owned(),
            Window(offset, count, extra) => redis::cmd("HSET")
                .arg(key)
                .arg(&[("w", (index + offset).to_string()), ("c", count.to_owned())])
                .arg(extra)
                .to_owned(),
            List => redis::cmd("RPUSH").arg(key).arg("1").to_owned(),
        };
        let () = cmd.query_async(&mut conn).await.unwrap();
        let got = lua_kept(&mut conn, &ops, NOW).await;
        assert_eq!(got, spec(&ops, &[state], NOW), "case {i}");
        let next = limiter::evaluate(&params, state.as_ref(), NOW, 2).next;
        if let Some((written, _)) = next.filter(|_| got.committed) {
            assert_eq!(redis_state(&mut conn, key).await, Some(written), "case {i}");
        }
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

/// Packs one op's first six numbers as `script::command` does, seven little-endian f64s: the
/// seventh (`debited_at`) 0, none.
fn packed(numbers: [f64; 6]) -> Vec<u8> {
    numbers
        .iter()
        .chain(&[0.0])
        .flat_map(|n| n.to_le_bytes())
        .collect()
}

/// A call that does not follow the KEYS/ARGV layout is an error reply, not a guess, and
/// writes nothing (a batch's framing too: blobs that do not divide into its KEYS).
#[tokio::test]
async fn malformed_call_is_an_error() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    // A token bucket's (flags, interval, scale, cost, burst, wait), what the error says
    let good = [4.0, 1.0, 1e6, 1.0, 1.0, 0.0];
    let cases: [([f64; 6], &str); 12] = [
        ([4.0, 1.0, 0.0, 1.0, 1.0, 0.0], "malformed arguments"),
        ([3.0, 1.0, 1e6, 1.0, 1.0, 0.0], "unknown algorithm"),
        ([64.0, 1.0, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        (
            [20.0, 1.0, 1e6, 1.0, 1.0, 0.0],
            "a counter must be a fixed window",
        ),
        (
            [21.0, 1.0, 1e6, 1.0, 60.0, 0.0],
            "no window start in counter key",
        ),
        ([4.5, 1.0, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.5, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.0, -1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.0, 1e6, f64::NAN, 1.0, 0.0], "malformed arguments"),
        (
            [4.0, 1.0, 1e6, 1.0, f64::INFINITY, 0.0],
            "malformed arguments",
        ),
        ([4.0, 1.0, 1e6, 1.0, 1.0, -1.0], "malformed arguments"),
        ([4.0, 1.0, 1e6, 1.0, 1.0, 0.5], "malformed arguments"),
    ];
    let mut calls: Vec<(Vec<Vec<u8>>, &str)> = cases
        .into_iter()
        .map(|(numbers, message)| (vec![Vec::new(), packed(numbers)], message))
        .collect();
    calls.push((
        vec![Vec::new()],
        "expected 2 arguments (now, then one per request), got 1",
    ));
    // A batch whose blobs do not divide into operations, or whose operations are not #KEYS.
    calls.push((
        vec![Vec::new(), packed(good), packed(good)[..55].to_vec()],
        "request 2 has 55 bytes of operations, not a multiple of 56",
    ));
    calls.push((
        vec![Vec::new(), packed(good), packed(good)],
        "expected 2 keys for the operations of 2 requests, got 1",
    ));
    calls.push((
        vec![Vec::new(), packed(good)[..55].to_vec()],
        "expected 56 bytes of operations for 1 keys, got 55",
    ));
    // A refund's `debited_at` (the seventh number) that is not a whole number ≥ 0.
    for debited_at in [-1.0f64, 0.5] {
        let mut blob = packed([4.0, 1.0, 1e6, -1.0, 1.0, 0.0]);
        blob[48..].copy_from_slice(&debited_at.to_le_bytes());
        calls.push((vec![Vec::new(), blob], "malformed arguments"));
    }
    calls.push((vec![b"x".to_vec(), packed(good)], "now is not an integer"));
    for (args, message) in calls {
        let mut call = script::script().prepare_invoke();
        call.key("k");
        for arg in &args {
            call.arg(arg.as_slice());
        }
        let err = call
            .invoke_async::<script::Reply>(&mut conn)
            .await
            .unwrap_err();
        let err = err.to_string();
        assert!(err.contains("floodgate apply.lua"), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err} lacks {message:?}");
    }
    let count: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(count, 0, "a malformed call wrote something");
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

// ---------------------------------------------------------------------------------------
// Reference counters (flag 16): the reference server's integer under its key name.
// ---------------------------------------------------------------------------------------

/// The reference's prefix in these tests.
const REF_PREFIX: &[u8] = b"rl_";

/// A counter op for the reference name of entry `k=<name>`, stamped at the pod's `pod_secs`
/// with `expiry` seconds of EXPIRE.
fn counter_op(
    name: &str,
    params: LimitParams,
    cost: i64,
    enforce: bool,
    pod_secs: u64,
    expiry: u64,
) -> BucketOp {
    let base = ReferenceKey::new(REF_PREFIX, "eq", [(&b"k"[..], name.as_bytes())]);
    let mut counter = ReferenceCounter::new(base);
    let unit = params.period_us / SECOND;
    counter.stamp(pod_secs, unit, 0, 0);
    counter.expiry_secs = expiry;
    BucketOp {
        reference: Some(counter),
        ..op(name, params, cost, enforce)
    }
}

/// What the specification answers for counter `ops` at `now` against `counts` (the stored
/// integers by key), and the counts a commit leaves: each op sees what the earlier ops of
/// the call leave (`limiter::evaluate_counter`, then `bucket::settle`).
fn counter_spec(
    ops: &[BucketOp],
    counts: &HashMap<Vec<u8>, u64>,
    now: i64,
) -> (Applied, HashMap<Vec<u8>, u64>) {
    let mut pending: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut evaluations = Vec::new();
    for op in ops {
        let counter = op.reference.as_ref().unwrap();
        let key = counter.key();
        let count = pending.get(&key).or(counts.get(&key)).copied();
        let start_us = i64::try_from(counter.window_start_secs)
            .unwrap()
            .saturating_mul(1_000_000);
        let e = limiter::evaluate_counter(&op.params, start_us, count, now, op.cost);
        if let Some((State::FixedWindow { count, .. }, _)) = e.next {
            pending.insert(key, count);
        }
        evaluations.push(e);
    }
    let (applied, store) = settle(ops, &evaluations);
    let applied = at(applied, now);
    let mut after = counts.clone();
    for ((op, e), stored) in ops.iter().zip(&evaluations).zip(store) {
        if let (true, Some((State::FixedWindow { count, .. }, ttl))) = (stored, e.next) {
            let key = op.reference.as_ref().unwrap().key();
            if ttl == 0 {
                after.remove(&key);
            } else {
                after.insert(key, count);
            }
        }
    }
    (applied, after)
}

/// One step of a counter case: clock move, the pod's clock skew against the store's (µs),
/// and (pool key, cost, enforce, overdraft) per op.
#[derive(Clone, Debug)]
struct CounterStep {
    dt: i64,
    skew: i64,
    ops: Vec<(usize, i64, bool, bool)>,
}

fn counter_case() -> impl Strategy<Value = (Vec<LimitParams>, Vec<CounterStep>)> {
    let limit = (
        prop_oneof![3 => 0u64..=8, 1 => Just(u64::from(u32::MAX))],
        prop::sample::select(vec![1u64, 60, 3600]),
    )
        .prop_map(|(rate, period)| params(Algorithm::FixedWindow, rate, period, 0));
    let step = (
        prop_oneof![2 => Just(0i64), 3 => 0i64..2_000_000, 1 => 0i64..120_000_000],
        prop_oneof![3 => Just(0i64), 1 => -2_000_000i64..2_000_000],
        prop::collection::vec(
            (
                0..3usize,
                prop_oneof![6 => -3i64..=6, 1 => Just(0i64), 1 => Just(i64::MAX)],
                prop::bool::weighted(0.85),
                prop::bool::weighted(0.2),
            ),
            1..=4,
        ),
    )
        .prop_map(|(dt, skew, ops)| CounterStep { dt, skew, ops });
    (
        prop::collection::vec(limit, 3),
        prop::collection::vec(step, 1..30),
    )
}

/// Drives one counter case through the script and the specification.
async fn run_counter_case(
    conn: &mut MultiplexedConnection,
    pool: &[LimitParams],
    steps: &[CounterStep],
) -> Result<(), String> {
    flush(conn).await;
    let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut now = START_US + 30 * 1_000_000 + 400_000;
    for (n, step) in steps.iter().enumerate() {
        now += step.dt;
        let pod_secs = u64::try_from((now + step.skew).max(0) / 1_000_000).unwrap();
        let ops: Vec<BucketOp> = step
            .ops
            .iter()
            .map(|&(k, cost, enforce, overdraft)| {
                let params = LimitParams {
                    overdraft,
                    max_wait_us: 0,
                    ..pool[k]
                };
                let expiry = params.period_us / SECOND + 3;
                counter_op(&k.to_string(), params, cost, enforce, pod_secs, expiry)
            })
            .collect();
        let (expected, after) = counter_spec(&ops, &counts, now);
        let keys = script::keys(PREFIX, &ops);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .add_command(script::command(PREFIX, &ops, Some(now)));
        for key in &keys {
            pipe.cmd("PTTL").arg(key).cmd("PERSIST").arg(key).ignore();
        }
        let sent = Instant::now();
        let mut results: Vec<Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
        let took_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX) + 1;
        let ttls: Vec<i64> = results
            .split_off(1)
            .into_iter()
            .map(|v| redis::from_redis_value(v).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let reply: script::Reply =
            redis::from_redis_value(results.remove(0)).map_err(|e| e.to_string())?;
        let got = script::decode(&reply, ops.len()).map_err(|e| e.to_string())?;
        let context = || format!("step {n} at now {now} (pod {pod_secs} s) with ops {ops:#?}");
        if got != expected {
            return Err(format!(
                "answers differ at {}:\n lua  {got:?}\n spec {expected:?}",
                context()
            ));
        }
        for ((key, op), pttl) in keys.iter().zip(&ops).zip(&ttls) {
            let stored: Option<u64> = conn.get(key).await.map_err(|e| e.to_string())?;
            if stored != after.get(key).copied() {
                return Err(format!(
                    "{} holds {stored:?}, spec {:?} at {}",
                    String::from_utf8_lossy(key),
                    after.get(key),
                    context()
                ));
            }
            // Written by this call: the EXPIRE it set (PTTL counts real time, within took).
            let expiry_ms =
                i64::try_from(op.reference.as_ref().unwrap().expiry_secs).unwrap() * 1000;
            if *pttl >= 0 && !(expiry_ms - took_ms..=expiry_ms).contains(pttl) {
                return Err(format!(
                    "PTTL {pttl}, EXPIRE {expiry_ms} ms at {}",
                    context()
                ));
            }
        }
        counts = after;
    }
    Ok(())
}

/// For random counter batches, limits, costs, times and pod clock skews, the script answers
/// and stores (the reference's integer, EXPIRE as stamped) exactly what the specification
/// does.
#[test]
fn script_matches_counter_spec() {
    check_against_redis(120, counter_case(), |mut conn, (pool, steps)| {
        Box::pin(async move { run_counter_case(&mut conn, &pool, &steps).await })
    });
}

/// A counter seeded as a reference pod writes it (its key text, a plain integer) is read as
/// the count: at the limit a debit is denied and the integer is unchanged; below it the
/// debit is an INCRBY, with the stamped EXPIRE; a full refund deletes it.
#[tokio::test]
async fn counter_is_the_reference_integer() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let pod = u64::try_from(NOW / 1_000_000).unwrap();
    let start = pod / 60 * 60;
    let key = format!("rl_eq_k_v_{start}");
    let () = conn.set(&key, "5").await.unwrap();
    let ops = vec![counter_op("v", p, 1, true, pod, 67)];
    assert_eq!(script::keys(PREFIX, &ops), vec![key.clone().into_bytes()]);
    let denied = lua(&mut conn, &ops, Some(NOW)).await;
    assert!(!denied.committed && !denied.buckets[0].admitted);
    let held: String = conn.get(&key).await.unwrap();
    assert_eq!(held, "5");

    let () = conn.set(&key, "2").await.unwrap();
    let admitted = lua(&mut conn, &ops, Some(NOW)).await;
    assert!(admitted.committed);
    assert_eq!(admitted.buckets[0].view.remaining, 2);
    let held: String = conn.get(&key).await.unwrap();
    assert_eq!(held, "3");
    let ttl: i64 = conn.ttl(&key).await.unwrap();
    assert!((66..=67).contains(&ttl), "TTL {ttl}");

    let refund = vec![counter_op("v", p, -3, true, pod, 67)];
    assert!(lua(&mut conn, &refund, Some(NOW)).await.committed);
    let exists: bool = conn.exists(&key).await.unwrap();
    assert!(!exists, "a full refund leaves the counter");
}

/// The operator's set of a counter shared with reference pods replaces the reference's
/// integer whatever it holds (SET with the stamped EXPIRE, never an INCRBY on a count that
/// moved), answering what the specification answers for an absent counter; a set of cost 0
/// deletes it.
#[tokio::test]
async fn set_replaces_the_reference_integer() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let _: String = script::script().load_async(&mut conn).await.unwrap();
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let pod = u64::try_from(NOW / 1_000_000).unwrap();
    let start = pod / 60 * 60;
    let key = format!("rl_eq_k_v_{start}");
    let start_us = i64::try_from(start).unwrap() * 1_000_000;
    let set = |conn: &mut MultiplexedConnection, cost| {
        let ops = vec![counter_op("v", p, cost, false, pod, 67)];
        let mut conn = conn.clone();
        async move {
            let reply: Vec<u8> = script::set_command(PREFIX, &ops, Some(NOW))
                .query_async(&mut conn)
                .await
                .unwrap();
            let expected = at(
                settle(
                    &ops,
                    &[limiter::evaluate_counter(&p, start_us, None, NOW, cost)],
                )
                .0,
                NOW,
            );
            (script::decode(&reply, 1).unwrap(), expected)
        }
    };
    for held in ["4", "0", "junk"] {
        let () = conn.set(&key, held).await.unwrap();
        let (got, expected) = set(&mut conn, 3).await;
        assert_eq!(got, expected, "over {held:?}");
        assert_eq!(got.buckets[0].view.remaining, 2);
        let now_held: String = conn.get(&key).await.unwrap();
        assert_eq!(now_held, "3", "over {held:?}");
        let ttl: i64 = conn.ttl(&key).await.unwrap();
        assert!((66..=67).contains(&ttl), "TTL {ttl}");
    }
    let (got, _) = set(&mut conn, 0).await;
    assert_eq!(
        (got.buckets[0].view.remaining, got.buckets[0].window),
        (5, None)
    );
    let exists: bool = conn.exists(&key).await.unwrap();
    assert!(!exists, "a set to the full capacity leaves no counter");
}

/// A set's marker lives under the bucket's own name and in its hash slot: an ACL user limited
/// to the key prefix (`~fg:*`, as docs/redis.md asks) sets a bucket and has an older refund
/// dropped, a hash-tagged key's marker keeps its tag, and both markers share their key's slot.
#[tokio::test]
async fn set_markers_live_under_the_key_prefix() {
    use redis::cluster_routing::Slot;
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", "limited", "on", ">pw", "~fg:*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let client = redis::Client::open(format!("redis://limited:pw@{}", server.address())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = script::script().load_async(&mut conn).await.unwrap();
    let p = params(Algorithm::TokenBucket, 10, 60, 10);
    let debit = lua(&mut conn, &[op("acl", p, 3, true)], Some(NOW)).await;
    assert!(debit.committed);
    let reply: Vec<u8> = script::set_command(PREFIX, &[op("acl", p, 10, false)], Some(NOW + 1))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        script::decode(&reply, 1).unwrap().buckets[0].view.remaining,
        0
    );
    let refund = op("acl", p, 3, true)
        .undo(&debit.buckets[0], floodgate::bucket::Undo::Withdrawn)
        .unwrap();
    let refunded = lua(&mut conn, &[refund], Some(NOW + 2)).await;
    assert_eq!(
        refunded.buckets[0].view.remaining, 0,
        "the refund was dropped"
    );
    let key = script::full_key(PREFIX, &key("acl", Algorithm::TokenBucket, p.period_us));
    let marker = [key.as_slice(), b"{", key.as_slice(), b"}~set"].concat();
    let exists: bool = admin.exists(&marker).await.unwrap();
    assert!(exists, "the marker is {}", String::from_utf8_lossy(&marker));
    assert_eq!(Slot::for_key(&marker), Slot::for_key(&key));
    // A hash-tagged key's marker: the key, then `~set`.
    let tagged = b"fg:{shop}:user=ann|tb60".to_vec();
    let tagged_marker = [tagged.as_slice(), b"~set"].concat();
    assert_eq!(Slot::for_key(&tagged_marker), Slot::for_key(&tagged));
}

/// The refund of a counter's debit (`BucketOp::undo`) names the counter the debit named (the
/// key carries the pod's window): given after the store's clock has moved into the next
/// window, it lowers the debit's counter, never the next window's, in the script and in the
/// specification alike.
#[tokio::test]
async fn counter_refund_names_the_debits_window() {
    use floodgate::bucket::Undo;
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let pod = u64::try_from(NOW / 1_000_000).unwrap();
    let debit = vec![counter_op("v", p, 3, true, pod, 67)];
    let debited = lua(&mut conn, &debit, Some(NOW)).await;
    assert!(debited.committed);
    assert_eq!(debited, counter_spec(&debit, &HashMap::new(), NOW).0);
    let refund = vec![debit[0].undo(&debited.buckets[0], Undo::Withdrawn).unwrap()];
    assert_eq!(script::keys(PREFIX, &refund), script::keys(PREFIX, &debit));
    // The next window has begun, and a pod of it has counted 4 there already.
    let later = NOW + 60_000_000;
    let next = vec![counter_op("v", p, 4, true, pod + 60, 67)];
    assert!(lua(&mut conn, &next, Some(later)).await.committed);
    let refunded = lua(&mut conn, &refund, Some(later)).await;
    assert!(refunded.committed);
    let counts: HashMap<Vec<u8>, u64> = [(script::keys(PREFIX, &debit)[0].clone(), 3)].into();
    assert_eq!(refunded, counter_spec(&refund, &counts, later).0);
    let debit_key = String::from_utf8(script::keys(PREFIX, &debit)[0].clone()).unwrap();
    let next_key = String::from_utf8(script::keys(PREFIX, &next)[0].clone()).unwrap();
    assert!(
        !conn.exists::<_, bool>(&debit_key).await.unwrap(),
        "3 - 3: deleted"
    );
    let held: String = conn.get(&next_key).await.unwrap();
    assert_eq!(held, "4", "the next window keeps its count");
}

/// A counter key of another type or holding no integer reads as absent and is replaced by
/// the integer (never a script error half-way through the writes).
#[tokio::test]
async fn counter_garbage_is_replaced() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let pod = u64::try_from(NOW / 1_000_000).unwrap();
    let ops = vec![counter_op("v", p, 2, true, pod, 60)];
    let key = &script::keys(PREFIX, &ops)[0];
    for seed in ["text", "hash", "negative"] {
        flush(&mut conn).await;
        let cmd = match seed {
            "text" => redis::cmd("SET").arg(key).arg("abc").to_owned(),
            "hash" => redis::cmd("HSET").arg(key).arg("c").arg("4").to_owned(),
            _ => redis::cmd("SET").arg(key).arg("-4").to_owned(),
        };
        let () = cmd.query_async(&mut conn).await.unwrap();
        let got = lua(&mut conn, &ops, Some(NOW)).await;
        assert_eq!(got, counter_spec(&ops, &HashMap::new(), NOW).0, "{seed}");
        let held: String = conn.get(key).await.unwrap();
        assert_eq!(held, "2", "{seed}");
    }
}

/// The same counter twice in one call: the second op sees the first's count, as the
/// reference's sequential INCRBYs would, so together they cannot pass the limit.
#[tokio::test]
async fn repeated_counter_sees_the_earlier_op() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let p = params(Algorithm::FixedWindow, 5, 60, 0);
    let pod = u64::try_from(NOW / 1_000_000).unwrap();
    let ops = vec![
        counter_op("v", p, 3, true, pod, 60),
        counter_op("v", p, 3, true, pod, 60),
    ];
    let got = lua(&mut conn, &ops, Some(NOW)).await;
    assert_eq!(got, counter_spec(&ops, &HashMap::new(), NOW).0);
    assert!(!got.committed && got.buckets[0].admitted && !got.buckets[1].admitted);
    let ops = vec![
        counter_op("v", p, 2, true, pod, 60),
        counter_op("v", p, 3, true, pod, 60),
    ];
    assert!(lua(&mut conn, &ops, Some(NOW)).await.committed);
    let held: String = conn.get(&script::keys(PREFIX, &ops)[0]).await.unwrap();
    assert_eq!(held, "5");
}

// ---------------------------------------------------------------------------------------
// Batches: one script call for several requests (apply.lua's batch convention).
// ---------------------------------------------------------------------------------------

/// One request of a batch as the script receives it: its keys and its packed blob.
#[derive(Clone, Debug)]
struct Encoded {
    keys: Vec<Vec<u8>>,
    blob: Vec<u8>,
    /// A malformed request: the error code and the operation (from 1) its marker names.
    refused: Option<(i64, i64)>,
}

/// `ops` encoded as `script::command` encodes them (its KEYS and its ARGV[2]).
fn encoded(ops: &[BucketOp]) -> Encoded {
    let mut args: Vec<Vec<u8>> = script::command(PREFIX, ops, Some(0))
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            _ => unreachable!("only plain arguments in a script call"),
        })
        .collect();
    let blob = args.pop().unwrap();
    Encoded {
        keys: args[3..3 + ops.len()].to_vec(),
        blob,
        refused: None,
    }
}

/// The numbers of a malformed op (see `malformed_call_is_an_error`) and the code the script's
/// marker gives it.
fn malformed_op() -> impl Strategy<Value = ([f64; 6], i64)> {
    prop::sample::select(vec![
        ([4.0, 1.0, 0.0, 1.0, 1.0, 0.0], 1),
        ([4.5, 1.0, 1e6, 1.0, 1.0, 0.0], 1),
        ([4.0, 1.0, 1e6, f64::NAN, 1.0, 0.0], 1),
        ([3.0, 1.0, 1e6, 1.0, 1.0, 0.0], 2),
        ([20.0, 1.0, 1e6, 1.0, 1.0, 0.0], 3),
        // A counter whose key (a pool key) names no window start.
        ([21.0, 1.0, 1e6, 1.0, 60.0, 0.0], 4),
    ])
}

/// One request of a batch case: ops over the pool (a [`Step`] without its time), counter
/// ops (counter index, cost, enforce, overdraft), and maybe one op made malformed (where,
/// which).
#[derive(Clone, Debug)]
struct BatchRequest {
    step: Step,
    counters: Vec<(usize, i64, bool, bool)>,
    malformed: Option<(usize, ([f64; 6], i64))>,
}

#[derive(Clone, Debug)]
struct BatchCase {
    pool: Vec<LimitParams>,
    /// Counter limits (fixed windows of 1 s, 1 min or 1 h).
    counters: Vec<LimitParams>,
    /// Applied one by one first, to leave some state: (dt from the case's start, requests).
    before: Vec<BatchRequest>,
    /// µs from the state's making to the batch (0: the same instant).
    dt: i64,
    batch: Vec<BatchRequest>,
}

fn batch_request() -> impl Strategy<Value = BatchRequest> {
    (
        step(),
        prop::collection::vec(
            (
                0..2usize,
                prop_oneof![6 => -3i64..=6, 1 => Just(i64::MAX)],
                prop::bool::weighted(0.85),
                prop::bool::weighted(0.2),
            ),
            0..=2,
        ),
        prop::option::weighted(0.12, (0..8usize, malformed_op())),
    )
        .prop_map(|(step, counters, malformed)| BatchRequest {
            step,
            counters,
            malformed,
        })
}

fn batch_case() -> impl Strategy<Value = BatchCase> {
    let counter_limit = (
        prop_oneof![3 => 0u64..=8, 1 => Just(u64::from(u32::MAX))],
        prop::sample::select(vec![1u64, 60, 3600]),
    )
        .prop_map(|(rate, period)| params(Algorithm::FixedWindow, rate, period, 0));
    (
        prop::collection::vec(limit_params(), POOL),
        prop::collection::vec(counter_limit, 2),
        prop::collection::vec(batch_request(), 0..6),
        dt(),
        prop::collection::vec(batch_request(), 1..=12),
    )
        .prop_map(|(pool, counters, before, dt, batch)| BatchCase {
            pool,
            counters,
            before,
            dt,
            batch,
        })
}

/// The request `spec` at `now`, encoded (malformed as it says), against the case's limits.
fn batch_request_at(
    spec: &BatchRequest,
    case: &BatchCase,
    keys: &[BucketKey],
    now: i64,
) -> Encoded {
    let mut ops = ops_of(&spec.step, &case.pool, keys, now);
    let pod_secs = u64::try_from(now / 1_000_000).unwrap();
    for &(k, cost, enforce, overdraft) in &spec.counters {
        let params = LimitParams {
            overdraft,
            ..case.counters[k]
        };
        let expiry = params.period_us / SECOND + 3;
        ops.push(counter_op(
            &format!("c{k}"),
            params,
            cost,
            enforce,
            pod_secs,
            expiry,
        ));
    }
    let mut request = encoded(&ops);
    if let Some((at, (numbers, code))) = spec.malformed {
        let at = at % ops.len();
        request.blob[at * script::OP_BYTES..(at + 1) * script::OP_BYTES]
            .copy_from_slice(&packed(numbers));
        // A counter's key must name no window start for code 4: the pool's do not.
        request.keys[at] = script::full_key(PREFIX, &keys[0]);
        request.refused = Some((code, i64::try_from(at + 1).unwrap()));
    }
    request
}

/// `EVALSHA` of `requests` in one call (the batch convention) at `now`.
fn batch_cmd(requests: &[Encoded], now: i64) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script::script().get_hash())
        .arg(requests.iter().map(|r| r.keys.len()).sum::<usize>());
    for request in requests {
        for key in &request.keys {
            cmd.arg(key.as_slice());
        }
    }
    cmd.arg(now);
    for request in requests {
        cmd.arg(request.blob.as_slice());
    }
    cmd
}

/// Runs `calls` in one MULTI/EXEC followed by PTTL and DUMP of every key of `keys`: the
/// replies, (PTTL, DUMP) per key, and the real time the transaction took, ms (rounded up).
async fn exec_then_state(
    conn: &mut MultiplexedConnection,
    calls: Vec<redis::Cmd>,
    keys: &[Vec<u8>],
) -> Result<(Vec<Vec<u8>>, Vec<(i64, Option<Vec<u8>>)>, i64), String> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let n = calls.len();
    for call in calls {
        pipe.add_command(call);
    }
    for key in keys {
        pipe.cmd("PTTL").arg(key).cmd("DUMP").arg(key);
    }
    let sent = Instant::now();
    let mut results: Vec<Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
    let took_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX) + 1;
    let state = results.split_off(n);
    let replies = results
        .into_iter()
        .map(|v| redis::from_redis_value(v).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let state = state
        .chunks(2)
        .map(|pair| {
            let pttl = redis::from_redis_value(pair[0].clone()).map_err(|e| e.to_string())?;
            let dump = redis::from_redis_value(pair[1].clone()).map_err(|e| e.to_string())?;
            Ok((pttl, dump))
        })
        .collect::<Result<_, String>>()?;
    Ok((replies, state, took_ms))
}

/// Runs `calls` (requests alone) in one MULTI/EXEC as [`exec_then_state`] does, but reads
/// every key's PTTL and PERSISTs it after each call, and answers for each key the PTTL read
/// after the last call that gave it one (or deleted it). Within a transaction a script judges
/// expiry by its own start, in real time: a TTL of a few ms one call writes could run out
/// before a later call reads the key (on a loaded machine), where the same requests in one
/// batch (one script, one instant) still see it. The transaction's other commands see the
/// time it started, so the PERSIST after a call always finds what the call wrote.
async fn exec_alone_then_state(
    conn: &mut MultiplexedConnection,
    calls: Vec<redis::Cmd>,
    keys: &[Vec<u8>],
) -> Result<(Vec<Vec<u8>>, Vec<(i64, Option<Vec<u8>>)>, i64), String> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    // Each key's PTTL before the first call: -1 (restored without one) or -2 (absent).
    for key in keys {
        pipe.cmd("PTTL").arg(key);
    }
    let n = calls.len();
    for call in calls {
        pipe.add_command(call);
        for key in keys {
            pipe.cmd("PTTL").arg(key).cmd("PERSIST").arg(key);
        }
    }
    for key in keys {
        pipe.cmd("DUMP").arg(key);
    }
    let sent = Instant::now();
    let mut results: Vec<Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
    let took_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX) + 1;
    let dumps = results.split_off(keys.len() + n * (1 + 2 * keys.len()));
    let calls = results.split_off(keys.len());
    let mut replies = Vec::with_capacity(n);
    // A key no call touched since keeps what it had (-1 after our PERSIST).
    let mut pttls = results
        .into_iter()
        .map(|pttl| redis::from_redis_value::<i64>(pttl).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    for call in calls.chunks(1 + 2 * keys.len()) {
        replies.push(redis::from_redis_value(call[0].clone()).map_err(|e| e.to_string())?);
        for (k, pair) in call[1..].chunks(2).enumerate() {
            let pttl: i64 = redis::from_redis_value(pair[0].clone()).map_err(|e| e.to_string())?;
            if pttl != -1 {
                pttls[k] = pttl;
            }
        }
    }
    let state = pttls
        .into_iter()
        .zip(dumps)
        .map(|(pttl, dump)| {
            let dump = redis::from_redis_value(dump).map_err(|e| e.to_string())?;
            Ok((pttl, dump))
        })
        .collect::<Result<_, String>>()?;
    Ok((replies, state, took_ms))
}

/// Puts back the `snapshot` (DUMPs without TTL) of `keys`, and nothing else.
async fn restore(
    conn: &mut MultiplexedConnection,
    keys: &[Vec<u8>],
    snapshot: &[Option<Vec<u8>>],
) -> Result<(), String> {
    flush(conn).await;
    for (key, dump) in keys.iter().zip(snapshot) {
        if let Some(dump) = dump {
            let () = redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(dump.as_slice())
                .query_async(conn)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Drives one batch case: some state made one request at a time, then the batch as one
/// call and the same requests as calls of their own from that same state, at the same `now`.
async fn run_batch_case(conn: &mut MultiplexedConnection, case: &BatchCase) -> Result<(), String> {
    flush(conn).await;
    let keys = pool_keys(&case.pool);
    let start = START_US + 30 * 1_000_000 + 400_000;
    let before: Vec<Encoded> = case
        .before
        .iter()
        .map(|r| batch_request_at(r, case, &keys, start))
        .collect();
    let now = start + case.dt.max(0);
    let batch: Vec<Encoded> = case
        .batch
        .iter()
        .map(|r| batch_request_at(r, case, &keys, now))
        .collect();
    let mut all_keys: Vec<Vec<u8>> = before
        .iter()
        .chain(&batch)
        .flat_map(|r| r.keys.iter().cloned())
        .collect();
    all_keys.sort();
    all_keys.dedup();

    // The state to start from, kept without TTLs (so nothing expires in real time).
    let calls: Vec<_> = before
        .iter()
        .filter(|r| r.refused.is_none())
        .map(|r| batch_cmd(std::slice::from_ref(r), start))
        .collect();
    if !calls.is_empty() {
        exec_then_state(conn, calls, &[]).await?;
    }
    for key in &all_keys {
        let _: i64 = redis::cmd("PERSIST")
            .arg(key)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    let snapshot = dump(conn, &all_keys).await;

    if let [
        Encoded {
            refused: Some((_, op)),
            ..
        },
    ] = batch.as_slice()
    {
        // A malformed request alone is an error reply (as it always was), not a marker.
        let error = batch_cmd(&batch, now)
            .query_async::<Value>(conn)
            .await
            .err()
            .ok_or("a malformed request alone was answered")?
            .to_string();
        if !(error.contains("floodgate apply.lua") && error.ends_with(&format!(" {op}"))) {
            return Err(format!("a malformed request alone: {error}"));
        }
        if dump(conn, &all_keys).await != snapshot {
            return Err("a malformed request alone wrote something".into());
        }
        return Ok(());
    }
    let (batched, batched_state, batched_took) =
        exec_then_state(conn, vec![batch_cmd(&batch, now)], &all_keys).await?;
    restore(conn, &all_keys, &snapshot).await?;
    let alone = batch
        .iter()
        .filter(|r| r.refused.is_none())
        .map(|r| batch_cmd(std::slice::from_ref(r), now))
        .collect();
    let (alone, alone_state, alone_took) = exec_alone_then_state(conn, alone, &all_keys).await?;

    // The batch's reply, split by the requests' op counts: each the reply of its call alone,
    // or a malformed request's marker.
    let reply = &batched[0];
    let mut at = 0;
    let mut alone = alone.iter();
    for (j, request) in batch.iter().enumerate() {
        let len = script::reply_len(request.keys.len()) * script::REPLY_VALUE_BYTES;
        let part = reply
            .get(at..at + len)
            .ok_or_else(|| format!("the batch's reply is {} bytes, short", reply.len()))?;
        at += len;
        match request.refused {
            None => {
                let own = alone.next().unwrap();
                if part != own.as_slice() {
                    return Err(format!(
                        "request {j} of {}: batched {:?}, alone {:?}\nbatch {case:#?}",
                        batch.len(),
                        script::decode(part, request.keys.len()),
                        script::decode(own, request.keys.len()),
                    ));
                }
            }
            Some((code, op)) => {
                let mut marker = vec![0.0; script::reply_len(request.keys.len())];
                marker[0] = -1.0;
                marker[1] = code as f64;
                marker[2] = op as f64;
                let marker: Vec<u8> = marker.iter().flat_map(|v| v.to_le_bytes()).collect();
                if part != marker.as_slice() {
                    return Err(format!(
                        "request {j}: the marker of code {code}, op {op} is not {part:?}"
                    ));
                }
                let refused = script::decode(part, request.keys.len()).unwrap_err();
                if !refused
                    .to_string()
                    .contains("apply.lua refused the request")
                {
                    return Err(format!("request {j}: {refused}"));
                }
            }
        }
    }
    if at != reply.len() {
        return Err(format!(
            "the batch's reply is {} bytes, expected {at}",
            reply.len()
        ));
    }
    // The same state, and the same TTL but for the time each transaction took.
    let slack = batched_took + alone_took;
    for ((key, (pttl_b, dump_b)), (pttl_a, dump_a)) in
        all_keys.iter().zip(&batched_state).zip(&alone_state)
    {
        let key = String::from_utf8_lossy(key);
        if dump_b != dump_a {
            return Err(format!(
                "{key}: batched {dump_b:?}, alone {dump_a:?}\nbatch {case:#?}"
            ));
        }
        let same = if *pttl_b < 0 || *pttl_a < 0 {
            pttl_b == pttl_a
        } else {
            (pttl_b - pttl_a).abs() <= slack
        };
        if !same {
            return Err(format!(
                "{key}: PTTL batched {pttl_b}, alone {pttl_a}\nbatch {case:#?}"
            ));
        }
    }
    Ok(())
}

/// The calls alone that a batch is compared with are judged at one instant too: a token
/// bucket's TTL of 1 ms that one call writes is still there for the next call, however long
/// Redis takes in between (here a script that spins 20 ms, as a loaded machine might).
#[test]
fn calls_alone_see_no_ttl_run_out_between_them() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let mut conn = server.connection().await;
        script::script().load_async(&mut conn).await.unwrap();
        // 1,000 a second: a debit of 1 is 1 ms of debt, a TTL of 1 ms.
        let pool = vec![params(Algorithm::TokenBucket, 1000, 1, 1000)];
        let keys = vec![key("0", Algorithm::TokenBucket, SECOND)];
        let request = |cost| BatchRequest {
            step: Step {
                dt: 0,
                ops: vec![OpSpec {
                    key: 0,
                    change: None,
                    cost,
                    enforce: true,
                    debited_in: None,
                    debited_at: None,
                }],
                allow_repeat: false,
                set: false,
            },
            counters: Vec::new(),
            malformed: None,
        };
        let case = BatchCase {
            pool,
            counters: Vec::new(),
            before: Vec::new(),
            dt: 0,
            batch: vec![request(1), request(0)],
        };
        let now = START_US;
        let batch: Vec<Encoded> = case
            .batch
            .iter()
            .map(|r| batch_request_at(r, &case, &keys, now))
            .collect();
        let all_keys = vec![script::full_key(PREFIX, &keys[0])];
        flush(&mut conn).await;
        let (batched, _, _) = exec_then_state(&mut conn, vec![batch_cmd(&batch, now)], &all_keys)
            .await
            .unwrap();
        flush(&mut conn).await;
        let mut spin = redis::cmd("EVAL");
        spin.arg(
            "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
             repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > 20000 \
             return 'spun'",
        )
        .arg(0);
        let alone = vec![
            batch_cmd(&batch[..1], now),
            spin,
            batch_cmd(&batch[1..], now),
        ];
        let (alone, _, _) = exec_alone_then_state(&mut conn, alone, &all_keys)
            .await
            .unwrap();
        let len = script::reply_len(1) * script::REPLY_VALUE_BYTES;
        assert_eq!(batched[0].len(), 2 * len);
        let check = script::decode(&alone[2], 1).unwrap();
        assert_eq!(check.buckets[0].view.remaining, 999, "the debit expired");
        assert_eq!(&batched[0][len..], alone[2].as_slice());
        // With no call at all (a batch of malformed requests only), the state is as it was.
        flush(&mut conn).await;
        let (_, state, _) = exec_alone_then_state(&mut conn, Vec::new(), &all_keys)
            .await
            .unwrap();
        assert_eq!(state, vec![(-2, None)]);
    });
}

/// A batch of random requests (every algorithm, refunds, shadow, overdraft, max_wait,
/// reference counters, malformed requests among them) over a few shared keys answers, byte
/// for byte, what the same requests made one call each answer at the same `now`, and leaves
/// the same state; a malformed request gets its marker and writes nothing.
#[test]
fn batch_matches_calls_one_by_one() {
    check_against_redis(150, batch_case(), |mut conn, case| {
        Box::pin(async move { run_batch_case(&mut conn, &case).await })
    });
}

/// In a batch, a token bucket's write held back for the batch's end (each hot key is written
/// once) still comes before a window operation of a later request, or of the same request
/// after it, that reads or replaces the same key: the same state as calls one by one.
#[test]
fn batch_keeps_the_order_of_writes_to_one_key() {
    let server = RedisServer::start();
    let rt = runtime();
    let mut conn = rt.block_on(async {
        let mut conn = server.connection().await;
        script::script().load_async(&mut conn).await.unwrap();
        conn
    });
    let bucket = |cost| OpSpec {
        key: 0,
        change: None,
        cost,
        enforce: true,
        debited_in: None,
        debited_at: None,
    };
    let window = |algorithm| OpSpec {
        change: Some((algorithm, 10, 0, false)),
        ..bucket(1)
    };
    let request = |ops: Vec<OpSpec>| BatchRequest {
        step: Step {
            dt: 0,
            ops,
            allow_repeat: true,
            set: false,
        },
        counters: Vec::new(),
        malformed: None,
    };
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let case = BatchCase {
            pool: vec![params(Algorithm::TokenBucket, 10, 60, 10); POOL],
            counters: vec![params(Algorithm::FixedWindow, 5, 60, 0); 2],
            before: Vec::new(),
            dt: 0,
            batch: vec![
                request(vec![bucket(1)]),
                request(vec![bucket(1), window(algorithm)]),
                request(vec![bucket(2)]),
                request(vec![window(algorithm), bucket(1)]),
                request(vec![bucket(-1)]),
            ],
        };
        rt.block_on(run_batch_case(&mut conn, &case))
            .unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
    }
}
