//! The Redis Cluster store against a real Redis Cluster per test (3 masters, created with
//! `redis-cli --cluster create`): keys spread over slots, cross-slot all-or-nothing by
//! refunds (and a refund that cannot be delivered), MOVED after resharding, hash-tagged
//! domains, a cluster down at start-up, losing a master, and the real binary configured the
//! reference's way.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use ::redis::cluster_routing::Slot;
use floodgate::bucket::{BucketKey, KeyValue, hash_tagged_domain};
use floodgate::limiter::Algorithm;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use floodgate::store::redis::cluster::{ClusterSettings, ClusterStore};
use floodgate::store::{FailurePolicy, Resilience, ResilientStore, Store, StoreMetrics};
use floodgate::telemetry::metrics::Metrics;
use support::redis::{CLUSTER_DEADLINE, RedisCluster};
use support::*;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str = r#"
domain: c
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
"#;

/// The Redis key of descriptor `key=value` of domain `c` under a one-minute limit.
fn redis_key(key: &str, value: &str, algorithm: Algorithm) -> Vec<u8> {
    let bucket = BucketKey::new(
        "c",
        [(key.as_bytes(), KeyValue::Value(value.as_bytes()))],
        algorithm,
        60_000_000,
    );
    [&b"fg:"[..], bucket.as_bytes()].concat()
}

fn slot(key: &[u8]) -> Slot {
    Slot::for_key(key)
}

/// A value for descriptor `key` whose bucket is in none of the slots of `taken`.
fn value_outside(key: &str, algorithm: Algorithm, taken: &[Vec<u8>]) -> String {
    (0..)
        .map(|i| format!("v{i}"))
        .find(|v| {
            let candidate = slot(&redis_key(key, v, algorithm));
            taken.iter().all(|t| slot(t) != candidate)
        })
        .unwrap()
}

fn one(key: &str, value: &str) -> RateLimitRequest {
    request("c", vec![descriptor(&[(key, value)])])
}

/// The raw stored state of a bucket on the node that serves it (`None` when absent).
fn stored(cluster: &RedisCluster, key: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let node = cluster.owner(key);
    let kind: String = node.query(::redis::cmd("TYPE").arg(key)).unwrap();
    match kind.as_str() {
        "none" => None,
        "string" => {
            let value: Vec<u8> = node.query(::redis::cmd("GET").arg(key)).unwrap();
            Some(vec![(Vec::new(), value)])
        }
        _ => {
            let mut fields: Vec<(Vec<u8>, Vec<u8>)> =
                node.query(::redis::cmd("HGETALL").arg(key)).unwrap();
            fields.sort();
            Some(fields)
        }
    }
}

fn refunds(metrics: &Metrics, result: &str) -> u64 {
    let line = format!("floodgate_cluster_refunds_total{{result=\"{result}\"}} ");
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |n| n.parse().unwrap())
}

/// Descriptors whose buckets hash to several slots on different masters are all debited,
/// each on the master that serves its slot.
#[tokio::test]
async fn descriptors_over_several_slots_are_all_applied() {
    let server = TestServer::with(LIMITS).on(Backend::Cluster).start().await;
    let cluster = server.cluster();
    // One value per eighth of the slot space (CRC16 keeps similar keys close together).
    let values: Vec<String> = (0..8u16)
        .map(|eighth| {
            (0..)
                .map(|i| format!("10.0.{eighth}.{i}"))
                .find(|v| cluster.slot(&redis_key("a", v, Algorithm::TokenBucket)) / 2048 == eighth)
                .unwrap()
        })
        .collect();
    let response = server
        .ask(request(
            "c",
            values.iter().map(|v| descriptor(&[("a", v)])).collect(),
        ))
        .await;
    assert_eq!(response.overall_code, OK);
    assert!(response.statuses.iter().all(|s| s.limit_remaining == 4));
    let mut owners = Vec::new();
    for value in &values {
        let key = redis_key("a", value, Algorithm::TokenBucket);
        let owner = cluster.owner(&key);
        let exists: i64 = owner.query(::redis::cmd("EXISTS").arg(&key)).unwrap();
        assert_eq!(
            exists,
            1,
            "{} not on its master",
            String::from_utf8_lossy(&key)
        );
        owners.push(owner.port());
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), cluster.master_count(), "not on every master");
    assert_eq!(cluster.key_count(), 8);
    server.stop().await;
}

/// The same request sequence for the memory store and the cluster, whose answers must be
/// equal. Buckets `a`, `fw` and `sw` are in other slots than `b`, which allows 1 per minute.
/// `observe(n)` runs once `n` answers are in.
async fn denial_sequence(server: &TestServer, observe: impl Fn(usize)) -> Vec<RateLimitResponse> {
    let v = Values::new();
    let mut answers = vec![
        server
            .ask(request(
                "c",
                vec![
                    descriptor(&[("a", &v.a)]),
                    descriptor(&[("fw", &v.fw)]),
                    descriptor(&[("sw", &v.sw)]),
                ],
            ))
            .await,
        server.ask(one("b", &v.b)).await,
    ];
    observe(answers.len());
    // Denied by `b`: the other slots' debits are refunded; reported without the debit.
    for _ in 0..2 {
        let denied = request(
            "c",
            vec![
                descriptor(&[("a", &v.a)]),
                descriptor(&[("b", &v.b)]),
                descriptor(&[("fw", &v.fw)]),
                descriptor(&[("sw", &v.sw)]),
                with_hits(descriptor(&[("a", &v.fresh)]), 2),
            ],
        );
        answers.push(server.ask(denied).await);
        observe(answers.len());
    }
    server.advance_ms(10_000);
    answers.push(server.ask(one("a", &v.a)).await);
    answers
}

/// The descriptor values of [`denial_sequence`].
struct Values {
    a: String,
    b: String,
    fw: String,
    sw: String,
    /// An `a` bucket never debited before the denied requests.
    fresh: String,
}

impl Values {
    fn new() -> Values {
        let b = "x".to_string();
        let b_key = [redis_key("b", &b, Algorithm::TokenBucket)];
        let a = value_outside("a", Algorithm::TokenBucket, &b_key);
        let fresh_key = redis_key("a", &a, Algorithm::TokenBucket);
        Values {
            fresh: value_outside("a", Algorithm::TokenBucket, &[b_key[0].clone(), fresh_key]),
            fw: value_outside("fw", Algorithm::FixedWindow, &b_key),
            sw: value_outside("sw", Algorithm::SlidingWindow, &b_key),
            a,
            b,
        }
    }

    /// The Redis keys of the buckets debited before the denied requests (not `b`'s).
    fn used_keys(&self) -> Vec<Vec<u8>> {
        vec![
            redis_key("a", &self.a, Algorithm::TokenBucket),
            redis_key("fw", &self.fw, Algorithm::FixedWindow),
            redis_key("sw", &self.sw, Algorithm::SlidingWindow),
        ]
    }
}

/// A request denied by one slot's bucket leaves every other slot's bucket exactly as it was
/// once the call returns (a used one byte for byte, a fresh one absent), and every answer is
/// the memory store's.
#[tokio::test]
async fn denial_in_one_slot_leaves_other_slots_untouched() {
    let memory = TestServer::with(LIMITS).on(Backend::Memory).start().await;
    let expected = denial_sequence(&memory, |_| {}).await;
    memory.stop().await;
    assert_eq!(expected[2].overall_code, OVER);

    let server = TestServer::with(LIMITS).on(Backend::Cluster).start().await;
    let cluster = server.cluster();
    let values = Values::new();
    let keys = values.used_keys();
    let fresh = redis_key("a", &values.fresh, Algorithm::TokenBucket);
    let before = std::cell::RefCell::new(Vec::new());
    let answers = denial_sequence(&server, |answered| {
        let now: Vec<_> = keys.iter().map(|k| stored(cluster, k)).collect();
        assert!(now.iter().all(Option::is_some), "a used bucket is absent");
        if answered == 2 {
            *before.borrow_mut() = now;
        } else {
            assert_eq!(
                now,
                *before.borrow(),
                "after denied request {}",
                answered - 2
            );
        }
        assert_eq!(
            stored(cluster, &fresh),
            None,
            "a refunded fresh bucket is absent"
        );
    })
    .await;
    assert_eq!(answers, expected);
    // Two denied requests, each refunding the three other slots' groups.
    assert!(refunds(&server.metrics, "ok") >= 2);
    assert_eq!(refunds(&server.metrics, "failed"), 0);
    server.stop().await;
}

/// After the slot of a used bucket moves to another master (keys migrated, `SETSLOT NODE`),
/// the next request is redirected (`MOVED`) and debits the moved bucket on its new master.
#[tokio::test]
async fn moved_slot_is_followed() {
    let server = TestServer::with(LIMITS).on(Backend::Cluster).start().await;
    let cluster = server.cluster();
    let key = redis_key("a", "moving", Algorithm::TokenBucket);
    assert_eq!(remaining(&server.ask(one("a", "moving")).await), 4);
    let from = cluster.owner(&key).port();
    let to = cluster
        .masters()
        .into_iter()
        .find(|m| m.port() != from)
        .unwrap();
    cluster.move_slot(cluster.slot(&key), to);
    assert_eq!(cluster.owner(&key).port(), to.port());
    // The store still routes the slot to its old master, which answers MOVED.
    assert_eq!(remaining(&server.ask(one("a", "moving")).await), 3);
    assert_eq!(remaining(&server.ask(one("a", "moving")).await), 2);
    assert_eq!(cluster.key_count(), 1);
    server.stop().await;
}

fn remaining(response: &RateLimitResponse) -> u32 {
    assert_eq!(response.statuses.len(), 1, "{response:?}");
    response.statuses[0].limit_remaining
}

/// Losing a master gives the failure policy's answer (here `deny`: OVER_LIMIT) for its slots,
/// and once its replica is promoted the same request is served again, with no restart — the
/// promoted replica has no script loaded, so this also proves NOSCRIPT is handled.
#[tokio::test]
async fn losing_a_master_gives_the_policy_answer_until_failover() {
    let mut cluster = RedisCluster::start(3, 1);
    let metrics = Arc::new(Metrics::new());
    let store_metrics = StoreMetrics::register(&metrics);
    let store = ClusterStore::new(
        &ClusterSettings {
            // Well under the 1 s node timeout, so the outage is seen before any failover.
            command_timeout: Duration::from_millis(500),
            ..cluster_settings(&cluster.seeds())
        },
        store_metrics.clone(),
        None,
    )
    .unwrap();
    let resilient = Arc::new(ResilientStore::new(
        Arc::new(store),
        Resilience {
            policy: FailurePolicy::Deny,
            cache_capacity: 0,
            failure_threshold: 3,
            quiet_period: Duration::from_millis(50),
            shed_deadline: None,
        },
        None,
        store_metrics,
    ));
    resilient.spawn_probe(Duration::from_millis(50));
    let store: Arc<dyn Store> = resilient;
    let server = TestServer::with(LIMITS).store(store, metrics).start().await;
    // The first call also connects to the node and loads the script: on a loaded machine
    // that can take longer than the 500 ms command timeout, which the policy answers.
    eventually_within("the cluster to serve", CLUSTER_DEADLINE, || async {
        server.ask(one("a", "x")).await.overall_code == OK
    })
    .await;

    let key = redis_key("a", "x", Algorithm::TokenBucket);
    let owner = cluster.owner(&key).port();
    let dead = cluster
        .nodes
        .iter()
        .position(|n| n.port() == owner)
        .unwrap();
    cluster.nodes[dead].stop();
    assert_eq!(server.ask(one("a", "x")).await.overall_code, OVER);

    eventually_within(
        "the replica to take over and the request to pass again",
        CLUSTER_DEADLINE,
        || async { server.ask(one("a", "x")).await.overall_code == OK },
    )
    .await;
    let promoted = cluster.owner(&key);
    assert_ne!(promoted.port(), owner);
    server.stop().await;
}

/// The real binary on a cluster given the reference's way (`REDIS_TYPE=cluster`,
/// `REDIS_URL=host:port,host:port`): it serves from the cluster, and a denied request over
/// several slots leaves the cluster as it was.
#[tokio::test]
async fn binary_serves_a_cluster_from_reference_variables() {
    use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
    use support::process::Floodgate;
    let cluster = RedisCluster::start(3, 0);
    let tmp = tempfile::tempdir().unwrap();
    let limits = tmp.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let addresses: Vec<String> = cluster.nodes.iter().map(|n| n.address()).collect();
    let server = Floodgate::start_with_env(
        &[
            "--config",
            limits.to_str().unwrap(),
            "--redis-timeout-ms",
            "2000",
        ],
        &[
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", &addresses.join(",")),
            ("LOG_LEVEL", "info"),
        ],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let v = Values::new();
    for request in [one("a", &v.a), one("b", &v.b)] {
        let answer = client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.overall_code, OK);
    }
    let a_key = redis_key("a", &v.a, Algorithm::TokenBucket);
    let before = stored(&cluster, &a_key);
    assert!(before.is_some());
    let denied = request(
        "c",
        vec![descriptor(&[("a", &v.a)]), descriptor(&[("b", &v.b)])],
    );
    let answer = client.should_rate_limit(denied).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    assert_eq!(stored(&cluster, &a_key), before);
    assert_eq!(cluster.key_count(), 2);
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(log.contains("redis_cluster"), "{log}");
}

/// A domain with `redis_hash_tag: true` keeps every bucket in one slot: a request over many
/// descriptors is one script, so a denied one is rejected atomically, with no refund.
#[tokio::test]
async fn hash_tagged_domain_lives_in_one_slot() {
    const TAGGED: &str = r#"
domain: h
redis_hash_tag: true
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;
    let server = TestServer::with(TAGGED).on(Backend::Cluster).start().await;
    let cluster = server.cluster();
    let values: Vec<String> = (0..8).map(|i| format!("user-{i}-{}", i * 7919)).collect();
    let mut descriptors: Vec<_> = values.iter().map(|v| descriptor(&[("a", v)])).collect();
    assert_eq!(
        server
            .ask(request("h", descriptors.clone()))
            .await
            .overall_code,
        OK
    );
    let keys: Vec<Vec<u8>> = values
        .iter()
        .map(|v| {
            let bucket = BucketKey::in_domain(
                &hash_tagged_domain("h"),
                [(&b"a"[..], KeyValue::Value(v.as_bytes()))],
                Algorithm::TokenBucket,
                60_000_000,
            );
            [&b"fg:"[..], bucket.as_bytes()].concat()
        })
        .collect();
    assert!(keys[0].starts_with(b"fg:{h}:a="));
    let slots: Vec<u16> = keys.iter().map(|k| cluster.slot(k)).collect();
    assert!(slots.iter().all(|&s| s == cluster.slot(b"h")), "{slots:?}");
    let owner = cluster.owner(&keys[0]).port();
    for key in &keys {
        let exists: i64 = cluster
            .owner(key)
            .query(::redis::cmd("EXISTS").arg(key))
            .unwrap();
        assert_eq!((cluster.owner(key).port(), exists), (owner, 1));
    }
    // Exhaust `b`, then deny a request over every bucket: one script, nothing debited.
    assert_eq!(
        server
            .ask(request("h", vec![descriptor(&[("b", "x")])]))
            .await
            .overall_code,
        OK
    );
    let before: Vec<_> = keys.iter().map(|k| stored(cluster, k)).collect();
    descriptors.push(descriptor(&[("b", "x")]));
    let denied = server.ask(request("h", descriptors)).await;
    assert_eq!(denied.overall_code, OVER);
    assert!(denied.statuses[..8].iter().all(|s| s.limit_remaining == 4));
    let after: Vec<_> = keys.iter().map(|k| stored(cluster, k)).collect();
    assert_eq!(after, before);
    assert_eq!(
        refunds(&server.metrics, "ok") + refunds(&server.metrics, "failed"),
        0
    );
    server.stop().await;
}

/// A cluster that is down when the store is built is an outage, not a start-up failure: the
/// store answers `Unavailable` (transient), and serves once the cluster is up, without being
/// rebuilt.
#[tokio::test]
async fn cluster_down_at_start_is_served_once_up() {
    use floodgate::bucket::BucketOp;
    use floodgate::limiter::LimitParams;
    let mut cluster = RedisCluster::start(3, 0);
    for node in &mut cluster.nodes {
        node.stop();
    }
    let store = ClusterStore::new(
        &ClusterSettings {
            command_timeout: Duration::from_millis(500),
            ..cluster_settings(&cluster.seeds())
        },
        StoreMetrics::register(&Metrics::new()),
        None,
    )
    .unwrap();
    let ops = [BucketOp {
        key: BucketKey::new(
            "c",
            [(&b"a"[..], KeyValue::Value(b"x"))],
            Algorithm::TokenBucket,
            60_000_000,
        ),
        params: LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_period: 5,
            period_us: 60_000_000,
            burst: 5,
            overdraft: false,
            max_wait_us: 0,
        },
        cost: 1,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    }];
    let down = store.apply(&ops).await.unwrap_err();
    assert!(down.is_transient(), "{down}");
    // Same ports, same cluster config files: the cluster forms again (empty).
    for node in &mut cluster.nodes {
        node.restart();
    }
    cluster.wait_until(CLUSTER_DEADLINE, "the restarted cluster to be ok", |c| {
        c.masters().len() == 3
    });
    eventually_within(
        "the store to serve the restarted cluster",
        CLUSTER_DEADLINE,
        || async {
            store
                .apply(&ops)
                .await
                .is_ok_and(|applied| applied.committed)
        },
    )
    .await;
    assert!(store.probe().await.is_ok());
}

/// A refund that cannot be delivered (its master died after its group committed) is counted
/// as failed and leaves that bucket debited — reported as such — while the request is still
/// answered denied. The denying master is held with `CLIENT PAUSE WRITE` until the other
/// group's debit is seen and its master killed, so the order is forced, not timed.
#[tokio::test]
async fn failed_refund_is_counted_and_leaves_one_debit() {
    use floodgate::bucket::BucketOp;
    use floodgate::limiter::LimitParams;
    let op = |key: &str, value: &str, rate: u64| BucketOp {
        key: BucketKey::new(
            "c",
            [(key.as_bytes(), KeyValue::Value(value.as_bytes()))],
            Algorithm::TokenBucket,
            60_000_000,
        ),
        params: LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_period: rate,
            period_us: 60_000_000,
            burst: rate,
            overdraft: false,
            max_wait_us: 0,
        },
        cost: 1,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    };
    let mut cluster = RedisCluster::start(3, 0);
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(
        ClusterStore::new(
            &ClusterSettings {
                // The paused group's call waits while the test sees the other group's debit,
                // kills its node and unpauses: room for a loaded machine to do all three (the
                // refund to the dead node then fails at this deadline).
                command_timeout: Duration::from_secs(3),
                ..cluster_settings(&cluster.seeds())
            },
            StoreMetrics::register(&metrics),
            None,
        )
        .unwrap(),
    );
    let b_key = redis_key("b", "x", Algorithm::TokenBucket);
    let b_owner = cluster.owner(&b_key).port();
    let a = (0..)
        .map(|i| format!("v{i}"))
        .find(|v| {
            cluster
                .owner(&redis_key("a", v, Algorithm::TokenBucket))
                .port()
                != b_owner
        })
        .unwrap();
    let a_key = redis_key("a", &a, Algorithm::TokenBucket);
    assert!(store.apply(&[op("b", "x", 1)]).await.unwrap().committed);

    let b_node = cluster
        .nodes
        .iter()
        .position(|n| n.port() == b_owner)
        .unwrap();
    let paused: String = cluster.nodes[b_node]
        .query(::redis::cmd("CLIENT").arg("PAUSE").arg(60_000).arg("WRITE"))
        .unwrap();
    assert_eq!(paused, "OK");
    let request = {
        let store = store.clone();
        let ops = [op("a", &a, 5), op("b", "x", 1)];
        tokio::spawn(async move { store.apply(&ops).await })
    };
    eventually_within(
        "the other group's debit to be stored",
        CLUSTER_DEADLINE,
        || async { stored(&cluster, &a_key).is_some() },
    )
    .await;
    let a_owner = cluster.owner(&a_key).port();
    let dead = cluster
        .nodes
        .iter()
        .position(|n| n.port() == a_owner)
        .unwrap();
    cluster.nodes[dead].stop();
    let unpaused: String = cluster.nodes[b_node]
        .query(::redis::cmd("CLIENT").arg("UNPAUSE"))
        .unwrap();
    assert_eq!(unpaused, "OK");

    let applied = request.await.unwrap().unwrap();
    assert!(!applied.committed);
    assert!(applied.buckets[0].admitted && !applied.buckets[1].admitted);
    // The refund failed: `a` stays debited, and says so.
    assert_eq!(applied.buckets[0].view.remaining, 4);
    assert_eq!(refunds(&metrics, "failed"), 1);
    assert_eq!(refunds(&metrics, "ok"), 0);
}
