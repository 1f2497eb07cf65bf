//! What every case shares: the script called in a real `redis-server` (at a fixed `now`,
//! with its writes kept or read back in the same transaction), the specification's answer,
//! Redis state read back, and the operations most cases build.

pub(crate) use crate::support::START_US;
pub(crate) use crate::support::redis::RedisServer;
pub(crate) use floodgate::bucket::{
    Applied, BucketKey, BucketOp, KeyValue, ReferenceCounter, ReferenceKey, settle,
};
pub(crate) use floodgate::clock::{Clock, ManualClock, SystemClock};
pub(crate) use floodgate::limiter::{self, Algorithm, LimitParams, State, Tat};
pub(crate) use floodgate::store::redis::script;
pub(crate) use floodgate::store::{MemoryStore, Store};
pub(crate) use proptest::prelude::*;
pub(crate) use proptest::test_runner::{Config, TestCaseError, TestRunner};
pub(crate) use redis::aio::MultiplexedConnection;
pub(crate) use redis::{AsyncCommands, Value};
pub(crate) use std::collections::HashMap;
pub(crate) use std::sync::Arc;
pub(crate) use std::time::Instant;

/// Prefix of every Redis key the tests write.
pub(crate) const PREFIX: &[u8] = b"fg:";

pub(crate) const SECOND: u64 = 1_000_000;

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `cases` random cases of `strategy` against a fresh redis-server with the script
/// loaded, each by `run` on its own clone of one connection; panics with proptest's report
/// of the first case that fails.
pub(crate) fn check_against_redis<S: Strategy>(
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

pub(crate) fn params(algorithm: Algorithm, rate: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_period: rate,
        period_us: period_s * SECOND,
        burst,
        overdraft: false,
        max_wait_us: 0,
    }
}

pub(crate) fn key(name: &str, algorithm: Algorithm, period_us: u64) -> BucketKey {
    BucketKey::new(
        "eq",
        [(&b"k"[..], KeyValue::Value(name.as_bytes()))],
        algorithm,
        period_us,
    )
}

pub(crate) fn op(name: &str, params: LimitParams, cost: i64, enforce: bool) -> BucketOp {
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
pub(crate) async fn lua(
    conn: &mut MultiplexedConnection,
    ops: &[BucketOp],
    now: Option<i64>,
) -> Applied {
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
pub(crate) async fn lua_kept(
    conn: &mut MultiplexedConnection,
    ops: &[BucketOp],
    now: i64,
) -> Applied {
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
pub(crate) async fn lua_then_state(
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
pub(crate) fn spec(ops: &[BucketOp], states: &[Option<State>], now: i64) -> Applied {
    let evaluations: Vec<_> = ops
        .iter()
        .zip(states)
        .map(|(op, state)| limiter::evaluate(&op.params, state.as_ref(), now, op.cost))
        .collect();
    at(settle(ops, &evaluations).0, now)
}

/// `applied` as a store answers it at `now`: each result names the time it was evaluated at
/// (clamped as the script clamps it), which a refund of its debit carries.
pub(crate) fn at(mut applied: Applied, now: i64) -> Applied {
    for result in &mut applied.buckets {
        result.at_us = Some(now.clamp(0, limiter::MAX_NOW_US));
    }
    applied
}

/// The state a Redis key holds, decoded the way the script reads it (`None` if absent).
pub(crate) async fn redis_state(conn: &mut MultiplexedConnection, key: &[u8]) -> Option<State> {
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
pub(crate) async fn dump(
    conn: &mut MultiplexedConnection,
    keys: &[Vec<u8>],
) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in keys {
        out.push(redis::cmd("DUMP").arg(key).query_async(conn).await.unwrap());
    }
    out
}

pub(crate) async fn flush(conn: &mut MultiplexedConnection) {
    let () = redis::cmd("FLUSHALL").query_async(conn).await.unwrap();
}

/// `START_US` + 10.5 s: inside a 1 s, 1 min and 1 h window alike, not on a boundary.
pub(crate) const NOW: i64 = START_US + 10_500_000;

pub(crate) fn one_of_each(cost: i64) -> Vec<BucketOp> {
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

pub(crate) fn redis_keys(ops: &[BucketOp]) -> Vec<Vec<u8>> {
    script::keys(PREFIX, ops)
}
