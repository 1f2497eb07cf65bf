//! The Redis store merges the script calls ready together on a connection into one `EVALSHA`
//! (`lua/apply.lua`'s batch convention) and still answers each call as a call of its own: a
//! real redis-server, the real store and its connection, Redis `TIME` as in production.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use floodgate::bucket::{BucketKey, BucketOp, KeyValue};
use floodgate::limiter::{Algorithm, LimitParams};
use floodgate::store::Store;
use floodgate::store::redis::{RedisSettings, RedisStore, script, wire};
use futures_util::future::join_all;
use redis::IntoConnectionInfo;
use support::redis::RedisServer;
use support::redis_settings;

/// A token bucket of `limit` a day with a burst of `limit`: it refills one token per
/// 86,400 / `limit` s, far longer than any test takes, so what it admits is exactly `limit`.
fn daily(name: &str, limit: u64) -> BucketOp {
    let params = LimitParams {
        algorithm: Algorithm::TokenBucket,
        requests_per_period: limit,
        period_us: 86_400_000_000,
        burst: limit,
        overdraft: false,
        max_wait_us: 0,
    };
    debit(name, params, None)
}

/// A debit of 1 of the bucket `name` under `params` (a reference counter's when `reference`).
fn debit(
    name: &str,
    params: LimitParams,
    reference: Option<floodgate::bucket::ReferenceCounter>,
) -> BucketOp {
    BucketOp {
        key: BucketKey::new(
            "batch",
            [(&b"k"[..], KeyValue::Value(name.as_bytes()))],
            params.algorithm,
            params.period_us,
        ),
        params,
        cost: 1,
        enforce: true,
        reference,
        debited_in: None,
        debited_at: None,
    }
}

/// `INFO <section>`'s `<name>:` line's `field`, e.g. `cmdstat_evalsha`'s `calls` (0 when
/// absent: nothing counted since the stats were last reset).
async fn stat(redis: &RedisServer, section: &str, name: &str, field: &str) -> u64 {
    info_fields(redis, section, name)
        .await
        .get(field)
        .copied()
        .unwrap_or(0)
}

/// `INFO <section>`'s `<prefix>…:` line's fields, e.g. `cmdstat_evalsha` → {calls: …}.
async fn info_fields(redis: &RedisServer, section: &str, name: &str) -> HashMap<String, u64> {
    let mut conn = redis.connection().await;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .map(|fields| {
            fields
                .split(',')
                .filter_map(|field| {
                    let (key, value) = field.split_once('=')?;
                    Some((key.to_owned(), value.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `EVALSHA` calls Redis counted since its stats were last reset.
async fn evalsha_calls(redis: &RedisServer) -> u64 {
    stat(redis, "commandstats", "cmdstat_evalsha", "calls").await
}

async fn command(redis: &RedisServer, args: &[&str]) {
    redis.command(args).await;
}

/// A store on `redis` with the production `TIME`, its script loaded and its thread's
/// connection open (so the calls after this are written without waiting for a checkout).
async fn store(redis: &RedisServer) -> RedisStore {
    let store = RedisStore::new(&RedisSettings {
        command_timeout: Duration::from_secs(30),
        ..redis_settings(&redis.url())
    })
    .unwrap();
    store.apply(&[]).await.unwrap();
    command(redis, &["CONFIG", "RESETSTAT"]).await;
    store
}

/// 1,000 requests on one bucket of 100, all ready at once on one connection: fewer `EVALSHA`s
/// than requests reach Redis, and exactly 100 are admitted.
#[tokio::test]
async fn concurrent_calls_are_merged_and_exact() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let op = [daily("hot", 100)];
    let answers = join_all((0..1000).map(|_| store.apply(&op))).await;
    let admitted = answers
        .iter()
        .filter(|answer| answer.as_ref().unwrap().committed)
        .count();
    assert_eq!(admitted, 100);
    let calls = evalsha_calls(&redis).await;
    assert!(calls < 1000 / 2, "{calls} EVALSHAs for 1,000 requests");
}

/// A request of several buckets keeps its own answer in a merged call: every request's
/// buckets, admitted or not, all or nothing per request, each request seeing the earlier ones.
#[tokio::test]
async fn merged_requests_are_all_or_nothing_each() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    // Requests alternate between (a, b) and (a, c): `a` allows 10, `b` and `c` 3 each, so
    // 3 of each shape pass (6 in all) and the denied ones leave `a` at 10 - 6.
    let both = [daily("a", 10), daily("b", 3)];
    let other = [daily("a", 10), daily("c", 3)];
    let answers = join_all((0..20).map(|i| store.apply(if i % 2 == 0 { &both } else { &other })))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect::<Vec<_>>();
    let committed: Vec<bool> = answers.iter().map(|a| a.committed).collect();
    let mut expected = vec![false; 20];
    expected[..6].fill(true);
    assert_eq!(committed, expected);
    for (i, answer) in answers.iter().enumerate() {
        let a = &answer.buckets[0];
        let passed = committed[..=i].iter().filter(|c| **c).count();
        assert_eq!(a.view.remaining, 10 - passed as u64, "request {i}");
    }
    assert!(evalsha_calls(&redis).await < 20);
}

/// A connection of the store's own kind to `redis`.
async fn connection(redis: &RedisServer) -> wire::Conn {
    let info = redis.url().into_connection_info().unwrap();
    let tls = floodgate::store::redis::tls::client_config(&Default::default()).unwrap();
    wire::connect(&info, &tls, Duration::from_secs(10))
        .await
        .unwrap()
}

/// In one merged call, a call whose deadline passes while Redis stalls fails alone, with the
/// deadline's error; the calls merged with it are answered once Redis is back, and the
/// connection then retires.
#[tokio::test]
async fn a_late_call_in_a_merged_call_fails_alone() {
    let redis = RedisServer::start();
    let conn = connection(&redis).await;
    let op = [daily("late", 10)];
    // Loaded, so the merged call is not answered NOSCRIPT.
    script::call(&conn, b"fg:", &op, None).await.unwrap();
    command(&redis, &["CONFIG", "RESETSTAT"]).await;
    let mut late = conn.clone();
    late.until(tokio::time::Instant::now() + Duration::from_millis(100));
    redis.freeze();
    let (late, patient) = tokio::join!(
        async {
            let answer = script::call(&late, b"fg:", &op, None).await;
            redis.thaw();
            answer
        },
        join_all((0..3).map(|_| script::call(&conn, b"fg:", &op, None))),
    );
    let error = late.unwrap_err();
    assert!(wire::is_late(&error), "{error}");
    for (i, frame) in patient.into_iter().enumerate() {
        let applied = script::decode(script::payload(&frame.unwrap()), 1).unwrap();
        assert!(applied.committed, "call {i}");
    }
    assert_eq!(
        evalsha_calls(&redis).await,
        1,
        "the four calls were not merged"
    );
    // The connection retired with the late call: it takes no later call.
    assert!(conn.is_closed());
    // The late call's debit was applied (it was sent), the others' after it.
    let fresh = connection(&redis).await;
    let applied = script::call(&fresh, b"fg:", &op, None).await.unwrap();
    let applied = script::decode(script::payload(&applied), 1).unwrap();
    assert_eq!(applied.buckets[0].view.remaining, 10 - 6);
}

/// After `SCRIPT FLUSH`, merged calls answered `NOSCRIPT` load the script and are sent again:
/// every call is answered, exactly the limit is admitted, Redis saw fewer `NOSCRIPT` errors
/// than calls (the merged calls shared them), and the calls that met it together loaded the
/// script once between them.
#[tokio::test]
async fn merged_calls_survive_script_flush() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let op = [daily("flushed", 100)];
    let first = join_all((0..50).map(|_| store.apply(&op))).await;
    assert!(
        first
            .iter()
            .all(|answer| answer.as_ref().unwrap().committed)
    );
    command(&redis, &["SCRIPT", "FLUSH"]).await;
    command(&redis, &["CONFIG", "RESETSTAT"]).await;
    let second = join_all((0..200).map(|_| store.apply(&op))).await;
    let admitted = second
        .iter()
        .filter(|answer| answer.as_ref().unwrap().committed)
        .count();
    assert_eq!(admitted, 50);
    let noscript = stat(&redis, "errorstats", "errorstat_NOSCRIPT", "count").await;
    assert!(
        (1..200).contains(&noscript),
        "{noscript} NOSCRIPT errors for 200 calls"
    );
    // The calls that met NOSCRIPT together load the script once between them, not each its
    // own SCRIPT LOAD: one per wave (a load another test's call made on its own server in
    // between can add one more).
    let loads = stat(&redis, "commandstats", "cmdstat_script|load", "calls").await;
    assert!(
        (1..=3).contains(&loads),
        "{loads} SCRIPT LOADs for {noscript} NOSCRIPT answers"
    );
}

/// `spent` (a denied debit, which writes nothing) and `fresh` (a debit that writes), merged
/// into one call that Redis refuses with `code` at its first write: only `fresh` fails with
/// it, `spent` is answered denied.
async fn only_the_writer_fails(
    conn: &wire::Conn,
    spent: &[BucketOp],
    fresh: &[BucketOp],
    code: &str,
) {
    let (denied, writer) = tokio::join!(
        script::call(conn, b"fg:", spent, None),
        script::call(conn, b"fg:", fresh, None),
    );
    let writer = writer.unwrap_err();
    assert_eq!(writer.code(), Some(code), "{writer}");
    let denied = denied.unwrap_or_else(|e| {
        panic!("a request that writes nothing failed with the other's {code}: {e}")
    });
    let denied = script::decode(script::payload(&denied), 1).unwrap();
    assert!(!denied.committed);
    assert!(!denied.buckets[0].admitted);
}

/// Redis at `maxmemory` under `noeviction` refuses a script's first write (`OOM`): alone, a
/// request that writes nothing (a denied debit) is answered and only a request that writes
/// fails. Merged into one call with a request that writes, the denied request is still
/// answered (denied), not failed by the other's `OOM` — which the failure policy could turn
/// into an admission.
#[tokio::test]
async fn an_oom_fails_only_the_merged_calls_that_write() {
    let redis = RedisServer::start();
    let conn = connection(&redis).await;
    let spent = [daily("spent", 1)];
    let fresh = [daily("fresh", 1)];
    // `spent`'s only token is taken: its next debit is denied and writes nothing.
    let first = script::call(&conn, b"fg:", &spent, None).await.unwrap();
    assert!(
        script::decode(script::payload(&first), 1)
            .unwrap()
            .committed
    );
    command(&redis, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    command(&redis, &["CONFIG", "SET", "maxmemory", "1"]).await;
    command(&redis, &["CONFIG", "RESETSTAT"]).await;
    only_the_writer_fails(&conn, &spent, &fresh, "OOM").await;
    let oom = stat(&redis, "errorstats", "errorstat_OOM", "count").await;
    assert!(oom >= 1, "Redis refused no write");
    command(&redis, &["CONFIG", "SET", "maxmemory", "0"]).await;
}

/// A reference counter of 10 an hour, named by the pods' `rl_` keys, debiting 1.
fn counter(name: &str) -> BucketOp {
    use floodgate::bucket::{ReferenceCounter, ReferenceKey};
    let params = LimitParams {
        algorithm: Algorithm::FixedWindow,
        requests_per_period: 10,
        period_us: 3_600_000_000,
        burst: 0,
        overdraft: false,
        max_wait_us: 0,
    };
    let mut reference = ReferenceCounter::new(ReferenceKey::new(
        b"rl_",
        "batch",
        [(&b"k"[..], name.as_bytes())],
    ));
    let now_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    reference.stamp(now_secs, 3600, 0, 0);
    debit(name, params, Some(reference))
}

/// A reference counter holding a count Redis's `INCRBY` refuses (`007`: a leading zero; or
/// more digits than an int64) is read as its count and written back with `SET`, like any
/// other value `INCRBY` cannot take: its request is answered, and a request merged with it
/// is not failed by its error (nor loses its token bucket's debit).
#[tokio::test]
async fn a_counter_incrby_refuses_fails_no_request() {
    let redis = RedisServer::start();
    let conn = connection(&redis).await;
    let bucket = [daily("beside", 10)];
    let odd = [counter("odd")];
    let key = String::from_utf8(odd[0].reference.as_ref().unwrap().key()).unwrap();
    // Loaded, so the merged call is not answered NOSCRIPT.
    script::call(&conn, b"fg:", &[], None).await.unwrap();
    // (stored, cost, what the counter holds after): `007` has a leading zero, the other
    // more digits than an int64; the count read is 7, and u32::MAX (capped) for the other.
    for (stored, cost, after) in [("007", 1, "8"), ("123456789012345678901", -1, "4294967294")] {
        command(&redis, &["SET", &key, stored]).await;
        let mut odd = odd.clone();
        odd[0].cost = cost;
        let (beside, counted) = tokio::join!(
            script::call(&conn, b"fg:", &bucket, None),
            script::call(&conn, b"fg:", &odd, None),
        );
        let beside = beside.expect("a request failed with another's counter error");
        assert!(
            script::decode(script::payload(&beside), 1)
                .unwrap()
                .committed
        );
        let counted = counted.unwrap_or_else(|e| panic!("{stored}: {e}"));
        let counted = script::decode(script::payload(&counted), 1).unwrap();
        assert!(counted.committed, "{stored}");
        let mut conn = redis.connection().await;
        let now: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(now.as_deref(), Some(after), "{stored}");
    }
}

/// A master demoted to a replica (a failover) answers a script's first write `READONLY`:
/// alone, a request that writes nothing (a denied debit) is still answered and only a
/// request that writes fails. Merged with a request that writes, the denied request is still
/// answered (denied), not failed by the other's `READONLY`.
#[tokio::test]
async fn a_readonly_fails_only_the_merged_calls_that_write() {
    use support::redis::sentinel::poll;
    let master = RedisServer::start();
    let replica = RedisServer::start_replica_of(&master);
    let spent = [daily("spent", 1)];
    let fresh = [daily("fresh", 1)];
    // `spent`'s only token is taken on the master: its next debit is denied, writing nothing.
    let on_master = connection(&master).await;
    let first = script::call(&on_master, b"fg:", &spent, None)
        .await
        .unwrap();
    assert!(
        script::decode(script::payload(&first), 1)
            .unwrap()
            .committed
    );
    let key = script::full_key(b"fg:", &spent[0].key);
    let mut replica_admin = replica.connection().await;
    poll("the replica has the spent bucket", || {
        let mut conn = replica_admin.clone();
        let key = key.clone();
        async move {
            redis::cmd("EXISTS")
                .arg(&key)
                .query_async::<i64>(&mut conn)
                .await
                .is_ok_and(|n| n == 1)
        }
    })
    .await;
    let conn = connection(&replica).await;
    script::script()
        .load_async(&mut replica_admin)
        .await
        .unwrap();
    only_the_writer_fails(&conn, &spent, &fresh, "READONLY").await;
}
