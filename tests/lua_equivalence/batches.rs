//! Batches: one script call for several requests (apply.lua's batch convention) answers and
//! stores what the same requests do one call each.

use super::common::*;
use super::counters::counter_op;
use super::garbage::packed;
use super::random::*;

/// One request of a batch as the script receives it: its keys and its packed blob.
#[derive(Clone, Debug)]
pub(crate) struct Encoded {
    pub(crate) keys: Vec<Vec<u8>>,
    pub(crate) blob: Vec<u8>,
    /// A malformed request: the error code and the operation (from 1) its marker names.
    pub(crate) refused: Option<(i64, i64)>,
}

/// `ops` encoded as `script::command` encodes them (its KEYS and its ARGV[2]).
pub(crate) fn encoded(ops: &[BucketOp]) -> Encoded {
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
pub(crate) fn malformed_op() -> impl Strategy<Value = ([f64; 6], i64)> {
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
pub(crate) struct BatchRequest {
    pub(crate) step: Step,
    pub(crate) counters: Vec<(usize, i64, bool, bool)>,
    pub(crate) malformed: Option<(usize, ([f64; 6], i64))>,
}

#[derive(Clone, Debug)]
pub(crate) struct BatchCase {
    pub(crate) pool: Vec<LimitParams>,
    /// Counter limits (fixed windows of 1 s, 1 min or 1 h).
    pub(crate) counters: Vec<LimitParams>,
    /// Applied one by one first, to leave some state: (dt from the case's start, requests).
    pub(crate) before: Vec<BatchRequest>,
    /// µs from the state's making to the batch (0: the same instant).
    pub(crate) dt: i64,
    pub(crate) batch: Vec<BatchRequest>,
}

pub(crate) fn batch_request() -> impl Strategy<Value = BatchRequest> {
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

pub(crate) fn batch_case() -> impl Strategy<Value = BatchCase> {
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
pub(crate) fn batch_request_at(
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
pub(crate) fn batch_cmd(requests: &[Encoded], now: i64) -> redis::Cmd {
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
pub(crate) async fn exec_then_state(
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
pub(crate) async fn exec_alone_then_state(
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
pub(crate) async fn restore(
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
pub(crate) async fn run_batch_case(
    conn: &mut MultiplexedConnection,
    case: &BatchCase,
) -> Result<(), String> {
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
