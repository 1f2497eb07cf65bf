//! Reference counters (flag 16): the reference server's integer under its key name, kept by
//! the script exactly as the fixed-window specification keeps it.

use super::common::*;

/// The reference's prefix in these tests.
pub(crate) const REF_PREFIX: &[u8] = b"rl_";

/// A counter op for the reference name of entry `k=<name>`, stamped at the pod's `pod_secs`
/// with `expiry` seconds of EXPIRE.
pub(crate) fn counter_op(
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
pub(crate) fn counter_spec(
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
pub(crate) struct CounterStep {
    pub(crate) dt: i64,
    pub(crate) skew: i64,
    pub(crate) ops: Vec<(usize, i64, bool, bool)>,
}

pub(crate) fn counter_case() -> impl Strategy<Value = (Vec<LimitParams>, Vec<CounterStep>)> {
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
pub(crate) async fn run_counter_case(
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
