//! The Rate Limit Quota Service on the real binary, driven by a client generated from the
//! vendored protos: assignments, shares between Envoys, abandon, bounds, reload, shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use floodgate::proto::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
use floodgate::proto::rlqs::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;
use floodgate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use floodgate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use floodgate::proto::types::rate_limit_strategy::BlanketRule;
use floodgate::rlqs::share::{Ask, Table, reassess, settle};
use support::certs::{Pki, arg};
use support::process::Floodgate;
use support::redis::sentinel::{MASTER_NAME, SentinelSetup, info_field};
use support::redis::{RedisCluster, RedisServer};
use support::rlqs::{
    Envoy, Usage, assignment, blanket, bucket, granted, reports, token_bucket, ttl_secs,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const LIMITS: &str = "
domain: edge
descriptors:
  - key: tenant
    value: a
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: vip
    rate_limit: {unlimited: true}
  - key: tenant
    value: free
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    value: b
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600, burst: 60}
";

/// Turns the re-evaluation of shares without a report off (an interval of a day): the tests
/// that pair each report with its answer must see no assignment pushed in between.
const NO_REASSESS: [&str; 2] = ["--rlqs-reassess-interval", "86400"];

/// Writes `yaml` as the limits file in `dir`; returns its path.
fn limits_file(dir: &Path, yaml: &str) -> String {
    let path = dir.join("limits.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// A server on `LIMITS` with `flags`; the directory holds the limits file.
fn start(flags: &[&str]) -> (Floodgate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = limits_file(dir.path(), LIMITS);
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(flags);
    (Floodgate::start(&args), dir)
}

/// Runs `scenario` on two replicas started with `flags`, then stops both.
async fn on_two_replicas(flags: &[&str], scenario: impl AsyncFnOnce(&Floodgate, &Floodgate)) {
    let (first, _dir1) = start(flags);
    let (second, _dir2) = start(flags);
    scenario(&first, &second).await;
    first.stop().await;
    second.stop().await;
}

/// A matched limit is assigned as a token bucket with the limit's numbers (a lone Envoy
/// holds the whole rate), the configured time to live, and the bucket id echoed.
#[tokio::test]
async fn a_matched_bucket_gets_a_token_bucket() {
    let (server, _dir) = start(&["--rlqs-assignment-ttl", "12"]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let response = envoy
        .report("edge", &[(&[("tenant", "b"), ("path", "/x")], 1, 0, 0)])
        .await;
    assert_eq!(
        response.bucket_action[0].bucket_id,
        Some(bucket(&[("tenant", "b"), ("path", "/x")]))
    );
    let assignment = assignment(&response);
    let bucket = token_bucket(assignment).expect("a token bucket");
    assert_eq!(bucket.max_tokens, 60);
    assert_eq!(bucket.tokens_per_fill, Some(600));
    assert_eq!(
        bucket.fill_interval.map(|d| (d.seconds, d.nanos)),
        Some((60, 0))
    );
    assert_eq!(ttl_secs(assignment), 12.0);
    server.stop().await;
}

/// Unmatched, unknown-domain and unlimited buckets get ALLOW_ALL; a limit of 0 DENY_ALL.
#[tokio::test]
async fn blanket_rules_for_unlimited_unmatched_and_zero() {
    let (server, _dir) = start(&[]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    for (entries, rule) in [
        (&[("tenant", "vip")][..], BlanketRule::AllowAll),
        (&[("tenant", "nobody")][..], BlanketRule::AllowAll),
        (&[("tenant", "free")][..], BlanketRule::DenyAll),
    ] {
        let response = envoy.report("edge", &[(entries, 1, 0, 0)]).await;
        assert_eq!(blanket(assignment(&response)), Some(rule), "{entries:?}");
    }
    let mut other = Envoy::open(&server).await.unwrap();
    let response = other
        .report("unknown", &[(&[("tenant", "a")], 1, 0, 0)])
        .await;
    assert_eq!(blanket(assignment(&response)), Some(BlanketRule::AllowAll));
    server.stop().await;
}

/// Two Envoys on one 100/s bucket: after every report the fill rates they hold sum to at
/// most 100/s, and they settle on shares that follow their demand (80 and 20). The servers
/// run with [`NO_REASSESS`].
async fn two_envoys_share(first: &Floodgate, second: &Floodgate) {
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut a = Envoy::open(first).await.unwrap();
    let mut b = Envoy::open(second).await.unwrap();
    let mut held = (0, 0);
    for _ in 0..6 {
        held.0 = granted(&a.report("edge", &[(tenant, 60, 20, 1)]).await);
        assert!(held.0 + held.1 <= 100, "{held:?}");
        held.1 = granted(&b.report("edge", &[(tenant, 20, 0, 1)]).await);
        assert!(held.0 + held.1 <= 100, "{held:?}");
    }
    assert_eq!(held, (80, 20));
    // Both want more than their fair half: max-min fair, 50 each.
    for _ in 0..4 {
        held.0 = granted(&a.report("edge", &[(tenant, 50, 150, 1)]).await);
        assert!(held.0 + held.1 <= 100, "{held:?}");
        held.1 = granted(&b.report("edge", &[(tenant, 50, 70, 1)]).await);
        assert!(held.0 + held.1 <= 100, "{held:?}");
    }
    assert_eq!(held, (50, 50));
}

/// Two Envoys on one replica share a bucket's rate (see [`two_envoys_share`]).
#[tokio::test]
async fn two_envoys_on_one_replica_share_the_rate() {
    let (server, _dir) = start(&NO_REASSESS);
    two_envoys_share(&server, &server).await;
    server.stop().await;
}

/// Two Envoys on two replicas sharing one Redis share a bucket's rate the same way.
#[tokio::test]
async fn two_replicas_share_the_rate_through_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let store = [&["--redis-url", url.as_str()][..], &NO_REASSESS].concat();
    on_two_replicas(&store, two_envoys_share).await;
}

/// Two replicas share through a Redis that serves TLS only and requires a client
/// certificate: the share tables use the store's `--redis-tls-*` files.
#[tokio::test]
async fn two_replicas_share_the_rate_through_tls_redis() {
    let pki = Pki::generate();
    let redis = RedisServer::start_tls(&pki.server_files(), true);
    let url = redis.url();
    let store = [
        &[
            "--redis-url",
            url.as_str(),
            "--redis-tls-ca-file",
            arg(&pki.ca),
            "--redis-tls-cert-file",
            arg(&pki.client_cert),
            "--redis-tls-key-file",
            arg(&pki.client_key),
            // A TLS handshake in a debug build on a loaded machine can take longer than the
            // 250 ms default connect timeout.
            "--redis-connect-timeout-ms",
            "2000",
        ][..],
        &NO_REASSESS,
    ]
    .concat();
    on_two_replicas(&store, two_envoys_share).await;
}

/// Two Envoys on two replicas that find the master through a real sentinel share a bucket's
/// rate the same way.
#[tokio::test]
async fn two_replicas_share_the_rate_through_sentinel() {
    let setup = SentinelSetup::start_steady(1).await;
    let nodes = setup.node_urls().join(",");
    let store = [
        "--redis-sentinel",
        MASTER_NAME,
        "--redis-sentinel-nodes",
        nodes.as_str(),
        "--redis-connect-timeout-ms",
        "2000",
        NO_REASSESS[0],
        NO_REASSESS[1],
    ];
    on_two_replicas(&store, two_envoys_share).await;
}

/// Waits until `redis` holds no share table (every row given back).
async fn no_share_tables(redis: &RedisServer) {
    support::eventually("every share row given back", || async {
        let tables: Vec<String> = redis.query(redis::cmd("KEYS").arg("*rlqs:*")).unwrap();
        tables.is_empty()
    })
    .await;
}

/// Kill the master: the share tables follow the sentinels' failover with no restart. Once
/// the replica is promoted, a report is answered again, two replicas' Envoys share a bucket
/// through the new master, and the script ran there by EVAL (its cache was flushed).
#[tokio::test]
async fn shares_follow_a_sentinel_failover() {
    let mut setup = SentinelSetup::start(3).await;
    setup.wait_failover_ready().await;
    let mut replica = setup.replica.connection().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut replica)
        .await
        .unwrap();
    let nodes = setup.node_urls().join(",");
    // Short assignments: an ended stream's rows last until its assignments expire.
    let store = [
        "--redis-sentinel",
        MASTER_NAME,
        "--redis-sentinel-nodes",
        nodes.as_str(),
        NO_REASSESS[0],
        NO_REASSESS[1],
        "--rlqs-assignment-ttl",
        "2",
    ];
    let (first, _dir1) = start(&store);
    let (second, _dir2) = start(&store);
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut envoy = Envoy::open(&first).await.unwrap();
    assert_eq!(
        granted(&envoy.report("edge", &[(tenant, 1, 0, 0)]).await),
        100
    );
    drop(envoy);
    // Its row given back (once its assignment has expired) before the master goes: a
    // release that fails leaves the row to its expiry.
    no_share_tables(&setup.master).await;

    setup.master.stop();
    let new_master = setup.replica.port();
    support::eventually("the sentinels promote the replica", || async {
        setup.current_master_port().await == Some(new_master)
    })
    .await;
    // Meanwhile a share call fails its stream (UNAVAILABLE); a fresh stream is answered once
    // the share tables reach the new master.
    for server in [&first, &second] {
        support::eventually("a report is answered through the new master", || async {
            let Ok(mut envoy) = Envoy::open(server).await else {
                return false;
            };
            envoy.send(reports("edge", &[(tenant, 1, 0, 0)])).await;
            matches!(envoy.next().await, Ok(Some(_)))
        })
        .await;
    }
    // The probes' streams gave their rows back (a row outlives a failed release).
    no_share_tables(&setup.replica).await;
    two_envoys_share(&first, &second).await;
    assert!(
        info_field(&setup.replica, "commandstats", "cmdstat_eval")
            .await
            .is_some()
    );
    first.stop().await;
    second.stop().await;
}

/// Two Envoys on two replicas on one Redis Cluster share a bucket's rate the same way.
#[tokio::test]
async fn two_replicas_share_the_rate_in_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seeds().join(",");
    let store = [&["--redis-cluster", seeds.as_str()][..], &NO_REASSESS].concat();
    on_two_replicas(&store, two_envoys_share).await;
}

/// A newcomer to a bucket another Envoy holds in full is first denied, then, without
/// reporting again, gets a token bucket of its fair half once the holder has been pushed its
/// own smaller half: the holder's assignment always shrinks before the newcomer's grows.
async fn a_newcomer_is_served_without_a_second_report(first: &Floodgate, second: &Floodgate) {
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut holder = Envoy::open(first).await.unwrap();
    let mut newcomer = Envoy::open(second).await.unwrap();
    // Both want the whole 100/s (100 requests in 1 s).
    assert_eq!(
        granted(&holder.report("edge", &[(tenant, 60, 40, 1)]).await),
        100
    );
    assert_eq!(
        granted(&newcomer.report("edge", &[(tenant, 60, 40, 1)]).await),
        0
    );
    // No report from either from here on: only pushed assignments arrive.
    let pushed = newcomer.next().await.unwrap().expect("stream ended");
    let share = granted(&pushed);
    assert_eq!(share, 50, "{pushed:?}");
    assert!(token_bucket(assignment(&pushed)).is_some(), "{pushed:?}");
    // The holder's shrink was sent before the newcomer's share was granted: it is there
    // to read, and leaves room for the newcomer's.
    let shrunk = granted(&holder.next().await.unwrap().expect("stream ended"));
    assert!(shrunk + share <= 100, "{shrunk} + {share}");
    assert_eq!(shrunk, 50);
}

/// A newcomer is served without a second report on one replica (see
/// [`a_newcomer_is_served_without_a_second_report`]).
#[tokio::test]
async fn a_newcomer_is_served_promptly_on_one_replica() {
    let (server, _dir) = start(&["--rlqs-reassess-interval", "0.2"]);
    a_newcomer_is_served_without_a_second_report(&server, &server).await;
    server.stop().await;
}

/// The same across two replicas sharing one Redis: the holder's replica re-evaluates it.
#[tokio::test]
async fn a_newcomer_is_served_promptly_through_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let store = [
        "--redis-url",
        url.as_str(),
        "--rlqs-reassess-interval",
        "0.2",
    ];
    on_two_replicas(&store, a_newcomer_is_served_without_a_second_report).await;
}

/// The same across two replicas on one Redis Cluster (re-evaluations batched by slot).
#[tokio::test]
async fn a_newcomer_is_served_promptly_in_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seeds().join(",");
    let store = [
        "--redis-cluster",
        seeds.as_str(),
        "--rlqs-reassess-interval",
        "0.2",
    ];
    on_two_replicas(&store, a_newcomer_is_served_without_a_second_report).await;
}

/// The grant of each action of `response`, by the bucket's `path` entry.
fn grants_by_path(response: &RateLimitQuotaResponse) -> HashMap<String, u64> {
    response
        .bucket_action
        .iter()
        .map(|action| {
            let path = action.bucket_id.as_ref().unwrap().bucket["path"].clone();
            let single = RateLimitQuotaResponse {
                bucket_action: vec![action.clone()],
            };
            (path, granted(&single))
        })
        .collect()
}

/// Reads `envoy`'s pushed assignments into `held` until `done` holds of it.
async fn read_until(
    envoy: &mut Envoy,
    held: &mut HashMap<String, u64>,
    done: impl Fn(&HashMap<String, u64>) -> bool,
) {
    while !done(held) {
        let pushed = envoy.next().await.unwrap().expect("stream ended");
        held.extend(grants_by_path(&pushed));
    }
}

/// A newcomer on eight buckets that another Envoy holds in full, on a Redis Cluster: the
/// tables lie on several masters, and the batched re-evaluations (one call per slot) serve
/// every bucket its fair half, the holder shrinking first.
#[tokio::test]
async fn a_newcomer_on_many_buckets_is_served_in_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seeds().join(",");
    let store = [
        "--redis-cluster",
        seeds.as_str(),
        "--rlqs-reassess-interval",
        "0.2",
    ];
    let (first, _dir1) = start(&store);
    let (second, _dir2) = start(&store);
    let paths: Vec<String> = (0..8).map(|i| format!("/{i}")).collect();
    let ids: Vec<[(&str, &str); 2]> = paths
        .iter()
        .map(|path| [("tenant", "b"), ("path", path.as_str())])
        .collect();
    // 10 requests in 1 s: the whole 600/minute each.
    let usages: Vec<Usage<'_>> = ids.iter().map(|id| (&id[..], 10, 0, 1)).collect();
    let mut holder = Envoy::open(&first).await.unwrap();
    let mut newcomer = Envoy::open(&second).await.unwrap();
    let mut held = grants_by_path(&holder.report("edge", &usages).await);
    assert!(held.values().all(|&grant| grant == 600), "{held:?}");
    let mut got = grants_by_path(&newcomer.report("edge", &usages).await);
    assert!(got.values().all(|&grant| grant == 0), "{got:?}");
    let masters_holding = cluster
        .masters()
        .iter()
        .filter(|master| {
            let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("*rlqs:*")).unwrap();
            !keys.is_empty()
        })
        .count();
    assert!(masters_holding > 1, "all eight tables on one master");
    read_until(&mut newcomer, &mut got, |got| got.values().all(|&g| g > 0)).await;
    assert!(got.values().all(|&grant| grant == 300), "{got:?}");
    // Every shrink the newcomer's shares needed was sent before them.
    read_until(&mut holder, &mut held, |held| {
        held.values().all(|&grant| grant <= 300)
    })
    .await;
    for path in &paths {
        assert!(held[path] + got[path] <= 600, "{path}: {held:?} {got:?}");
    }
    first.stop().await;
    second.stop().await;
}

/// An Envoy that stops reporting loses its share: the other one gets the whole rate once
/// the silent one's row has expired.
#[tokio::test]
async fn a_silent_envoy_loses_its_share() {
    // Rows live 5 s: reports a few ms apart share the rate even on a loaded machine.
    let (server, _dir) = start(&["--rlqs-assignment-ttl", "4"]);
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut a = Envoy::open(&server).await.unwrap();
    let mut b = Envoy::open(&server).await.unwrap();
    for _ in 0..3 {
        granted(&a.report("edge", &[(tenant, 100, 100, 1)]).await);
        granted(&b.report("edge", &[(tenant, 100, 100, 1)]).await);
    }
    assert_eq!(
        granted(&a.report("edge", &[(tenant, 100, 100, 1)]).await),
        50
    );
    // b falls silent (its stream stays open).
    // Polled as `support::eventually` polls (it cannot lend the stream to its closure).
    let started = std::time::Instant::now();
    while granted(&a.report("edge", &[(tenant, 100, 100, 1)]).await) != 100 {
        assert!(
            started.elapsed() < support::EVENTUALLY,
            "the silent Envoy's share never went to the other"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(b);
    server.stop().await;
}

/// A bucket that reports no requests is abandoned after --rlqs-abandon-after; reporting it
/// again subscribes it afresh, on the same stream, which outlived --grpc-request-timeout.
#[tokio::test]
async fn an_idle_bucket_is_abandoned() {
    let (server, _dir) = start(&["--rlqs-abandon-after", "1.5", "--grpc-request-timeout", "1"]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    envoy.report("edge", &[(tenant, 1, 0, 0)]).await;
    let abandoned = loop {
        let response = envoy.next().await.unwrap().expect("stream ended");
        if let Some(action) = response
            .bucket_action
            .iter()
            .find(|action| matches!(action.bucket_action, Some(Action::AbandonAction(_))))
        {
            break action.clone();
        }
    };
    assert_eq!(abandoned.bucket_id, Some(bucket(tenant)));
    let again = envoy.report("edge", &[(tenant, 1, 0, 0)]).await;
    assert_eq!(granted(&again), 100);
    server.stop().await;
}

/// Bad input ends the stream with a status naming what is wrong.
#[tokio::test]
async fn bad_input_gets_precise_statuses() {
    let (server, _dir) = start(&["--rlqs-max-buckets-per-stream", "2"]);
    let tenant: &[(&str, &str)] = &[("tenant", "a")];

    let mut envoy = Envoy::open(&server).await.unwrap();
    let status = envoy.refused(reports("", &[(tenant, 1, 0, 0)])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("domain"), "{status:?}");

    let mut envoy = Envoy::open(&server).await.unwrap();
    envoy.report("edge", &[(tenant, 1, 0, 0)]).await;
    let status = envoy.refused(reports("other", &[(tenant, 1, 0, 0)])).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("'edge', not 'other'"),
        "{status:?}"
    );

    let mut envoy = Envoy::open(&server).await.unwrap();
    let mut no_id = reports("edge", &[(tenant, 1, 0, 0)]);
    no_id.bucket_quota_usages[0].bucket_id = None;
    let status = envoy.refused(no_id).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .contains("bucket_quota_usages[0]: bucket_id is required")
    );

    let mut envoy = Envoy::open(&server).await.unwrap();
    let status = envoy
        .refused(reports("edge", &[(&[("tenant", "")], 1, 0, 0)]))
        .await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("empty"), "{status:?}");

    let mut envoy = Envoy::open(&server).await.unwrap();
    envoy
        .report(
            "edge",
            &[(&[("tenant", "a")], 1, 0, 0), (&[("tenant", "b")], 1, 0, 0)],
        )
        .await;
    let status = envoy
        .refused(reports("edge", &[(&[("tenant", "c")], 1, 0, 0)]))
        .await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--rlqs-max-buckets-per-stream"),
        "{status:?}"
    );
    server.stop().await;
}

/// At most --rlqs-max-streams streams are open at once; a place freed is taken again.
#[tokio::test]
async fn the_stream_bound_holds() {
    let (server, _dir) = start(&["--rlqs-max-streams", "1"]);
    let mut first = Envoy::open(&server).await.unwrap();
    first.report("edge", &[(&[("tenant", "a")], 1, 0, 0)]).await;
    let mut second = Envoy::open(&server).await;
    let status = match second.as_mut() {
        Err(status) => status.clone(),
        Ok(envoy) => envoy.next().await.unwrap_err(),
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--rlqs-max-streams"),
        "{status:?}"
    );
    drop(first);
    support::eventually("a new stream is admitted once the first has ended", || {
        let server = &server;
        async move {
            match Envoy::open(server).await {
                Ok(mut envoy) => {
                    envoy
                        .send(reports("edge", &[(&[("tenant", "a")], 1, 0, 0)]))
                        .await;
                    matches!(envoy.next().await, Ok(Some(_)))
                }
                Err(_) => false,
            }
        }
    })
    .await;
    server.stop().await;
}

/// At SIGTERM every subscribed bucket gets its assignment with a time to live of 0, then
/// the stream ends cleanly and the server exits 0.
#[tokio::test]
async fn sigterm_expires_every_assignment() {
    let (server, _dir) = start(&[]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let response = envoy
        .report(
            "edge",
            &[
                (&[("tenant", "a")], 1, 0, 0),
                (&[("tenant", "vip")], 1, 0, 0),
            ],
        )
        .await;
    assert_eq!(response.bucket_action.len(), 2);
    server.sigterm();
    let expired = envoy.next().await.unwrap().expect("no expiry sent");
    let mut seen = HashMap::new();
    for action in &expired.bucket_action {
        let Some(Action::QuotaAssignmentAction(assignment)) = &action.bucket_action else {
            panic!("not an assignment: {action:?}");
        };
        assert_eq!(ttl_secs(assignment), 0.0);
        let id = action.bucket_id.clone().unwrap();
        let tenant = id.bucket["tenant"].clone();
        seen.insert(tenant, assignment.rate_limit_strategy.clone());
    }
    assert_eq!(seen.len(), 2, "{expired:?}");
    assert_eq!(
        blanket(&QuotaAssignmentAction {
            assignment_time_to_live: None,
            rate_limit_strategy: seen["vip"].clone(),
        }),
        Some(BlanketRule::AllowAll)
    );
    assert!(matches!(envoy.next().await, Ok(None)));
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}

/// During the drain period after SIGTERM a stream is still answered (a new bucket gets its
/// assignment) and expires nothing; its assignments get a time to live of 0 only once the
/// drain is over (here cut short by a second signal), then the server exits 0.
#[tokio::test]
async fn streams_are_served_through_the_drain_and_expire_after_it() {
    // Far longer than the test: only the second signal ends it.
    let (server, _dir) = start(&["--drain-period", "600"]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let first = envoy.report("edge", &[(&[("tenant", "a")], 1, 0, 0)]).await;
    assert!(ttl_secs(assignment(&first)) > 0.0);
    server.sigterm();
    let http = server.http;
    support::eventually("health turns NOT_SERVING", || async {
        support::http::call(http, "GET", "/healthcheck", None)
            .await
            .status
            == 503
    })
    .await;
    let during = envoy.report("edge", &[(&[("tenant", "b")], 1, 0, 0)]).await;
    assert!(ttl_secs(assignment(&during)) > 0.0, "{during:?}");
    server.signal("INT");
    let expired = envoy.next().await.unwrap().expect("no expiry sent");
    assert_eq!(expired.bucket_action.len(), 2, "{expired:?}");
    for action in &expired.bucket_action {
        let Some(Action::QuotaAssignmentAction(assignment)) = &action.bucket_action else {
            panic!("not an assignment: {action:?}");
        };
        assert_eq!(ttl_secs(assignment), 0.0);
    }
    assert!(matches!(envoy.next().await, Ok(None)));
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}

/// A reload that changes a limit re-assigns its buckets without waiting for a report.
#[tokio::test]
async fn a_reload_reassigns_the_changed_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = limits_file(dir.path(), LIMITS);
    let server = Floodgate::start(&["--config", &path]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    assert_eq!(
        granted(&envoy.report("edge", &[(tenant, 1, 0, 0)]).await),
        100
    );
    // Replaced atomically: a reload never sees a half-written file.
    support::configmap::replace(
        Path::new(&path),
        &LIMITS.replace("requests_per_unit: 100}", "requests_per_unit: 40}"),
    );
    let pushed = envoy.next().await.unwrap().expect("stream ended");
    assert_eq!(granted(&pushed), 40);
    server.stop().await;
}

/// The service is listed by reflection, and its metrics are on /metrics.
#[tokio::test]
async fn reflection_and_metrics_show_the_service() {
    let (server, _dir) = start(&[]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    envoy.report("edge", &[(&[("tenant", "a")], 1, 0, 0)]).await;
    let grpcurl = concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/bin/grpcurl");
    let addr = server.grpc.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(grpcurl)
            .args(["-plaintext", &addr, "list"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("envoy.service.rate_limit_quota.v3.RateLimitQuotaService"),
        "{listed}"
    );
    let metric = |series: &'static str| support::http::metric(server.http, series);
    assert_eq!(metric("floodgate_rlqs_streams").await, Some(1.0));
    assert_eq!(metric("floodgate_rlqs_buckets").await, Some(1.0));
    assert_eq!(
        metric("floodgate_rlqs_assignments_total{strategy=\"token_bucket\"}").await,
        Some(1.0)
    );
    assert_eq!(
        metric("floodgate_rlqs_holders{domain=\"edge\",rule=\"edge.tenant_a\"}").await,
        Some(1.0)
    );
    server.stop().await;
}

/// lua/rlqs_share.lua grants exactly what `rlqs::share::settle` and `reassess` grant (and
/// keeps the same rows), over a random sequence of reports, releases and batched
/// re-evaluations of two tables at fixed times.
#[tokio::test]
async fn the_share_script_is_the_rust_rule() {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let script = redis::Script::new(floodgate::rlqs::redis::SCRIPT);
    // Two tables of different rates, by key.
    let capacities = [("t", 97u64), ("u", 61u64)];
    let mut tables = [Table::new(), Table::new()];
    let mut seed: u64 = 11;
    for step in 0..900i64 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let holder = format!("h{}", (seed >> 33) % 5);
        let now = 1_700_000_000_000_000 + step * 7;
        let life_us = i64::try_from((seed >> 12) % 60).unwrap() + 1;
        if (seed >> 24).is_multiple_of(4) {
            let rust: Vec<i64> = tables
                .iter_mut()
                .zip(capacities)
                .map(|(table, (_, capacity))| {
                    reassess(table, &holder, capacity, life_us, now)
                        .map_or(-1, |grant| i64::try_from(grant).unwrap())
                })
                .collect();
            let mut call = script.key("t");
            call.key("u")
                .arg(&holder)
                .arg("reassess")
                .arg(life_us)
                .arg(now)
                .arg(capacities[0].1)
                .arg(capacities[1].1);
            let lua: Vec<i64> = call.invoke_async(&mut connection).await.unwrap();
            assert_eq!(lua, rust, "step {step}: {tables:?}");
            continue;
        }
        let which = usize::from((seed >> 45).is_multiple_of(2));
        let (key, capacity) = capacities[which];
        let table = &mut tables[which];
        if (seed >> 17).is_multiple_of(10) {
            table.remove(&holder);
            let _: u64 = script
                .key(key)
                .arg(&holder)
                .arg("release")
                .invoke_async(&mut connection)
                .await
                .unwrap();
            continue;
        }
        let demand = (!(seed >> 20).is_multiple_of(4)).then_some((seed >> 40) % 130);
        let ask = Ask {
            capacity,
            demand,
            life_us,
        };
        let rust = settle(table, &holder, ask, now);
        let lua: u64 = script
            .key(key)
            .arg(&holder)
            .arg("settle")
            .arg(ask.capacity)
            .arg(demand.map_or(-1, |d| i64::try_from(d.min(capacity)).unwrap()))
            .arg(ask.life_us)
            .arg(now)
            .invoke_async(&mut connection)
            .await
            .unwrap();
        assert_eq!(lua, rust, "step {step}: {tables:?}");
    }
    // The rows too, field by field (the caller clamps a demand to the rate before the script
    // stores it; the Rust table keeps it as reported, and uses it clamped).
    for ((key, capacity), table) in capacities.iter().zip(&tables) {
        let stored: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(*key)
            .query_async(&mut connection)
            .await
            .unwrap();
        let expected: HashMap<String, String> = table
            .iter()
            .map(|(holder, row)| {
                let demand = row
                    .demand
                    .map_or(-1, |d| i64::try_from(d.min(*capacity)).unwrap());
                (
                    holder.clone(),
                    format!("{demand} {} {}", row.grant, row.expires_us),
                )
            })
            .collect();
        assert_eq!(stored, expected, "table {key}");
    }
}

/// Bytes that are not a usage report end the stream with INVALID_ARGUMENT, counted.
#[tokio::test]
async fn garbage_is_invalid_argument() {
    let (server, _dir) = start(&[]);
    // One uncompressed gRPC message of 3 bytes that no protobuf decoder accepts.
    let status = support::h2raw::grpc_status_of(
        server.grpc,
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
        &[0, 0, 0, 0, 3, 0xff, 0xff, 0xff],
        false,
    )
    .await;
    assert_eq!(status, (Code::InvalidArgument as i32).to_string());
    assert_eq!(
        support::http::metric(
            server.http,
            "floodgate_rlqs_refused_total{reason=\"invalid\"}"
        )
        .await,
        Some(1.0)
    );
    server.stop().await;
}

/// A Redis share table that cannot be reached ends the stream with UNAVAILABLE, naming
/// Redis: Envoy keeps its assignments until they expire, then its fallback applies.
#[tokio::test]
async fn an_unreachable_share_table_is_unavailable() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let (server, _dir) = start(&["--redis-url", &url]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let status = envoy
        .refused(reports("edge", &[(&[("tenant", "a")], 1, 0, 0)]))
        .await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("Redis"), "{status:?}");
    server.stop().await;
}

/// A connection that carries only an RLQS stream is busy, not idle: at the connection bound a
/// new connection is refused, and the stream goes on, instead of the stream's connection
/// being closed to make way.
#[tokio::test]
async fn an_rlqs_stream_keeps_its_connection_at_the_bound() {
    let (server, _dir) = start(&["--grpc-max-connections", "1"]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let usage: &[Usage<'_>] = &[(&[("tenant", "b"), ("path", "/x")], 1, 0, 0)];
    envoy.report("edge", usage).await;
    // A second connection, at the bound: whatever it gets, the stream's must not make way.
    let url = format!("http://{}", server.grpc);
    if let Ok(mut other) = RateLimitQuotaServiceClient::connect(url).await {
        let (_keep, outbound) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
        let _ = other
            .stream_rate_limit_quotas(ReceiverStream::new(outbound))
            .await;
    }
    let series = "floodgate_connections_refused_total{port=\"grpc\"}";
    support::eventually("the newcomer refused", || async {
        support::http::metric(server.http, series)
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    let evicted = "floodgate_connections_evicted_total{port=\"grpc\"}";
    let evicted = support::http::metric(server.http, evicted).await;
    assert_eq!(
        evicted.unwrap_or(0.0),
        0.0,
        "the stream's connection made way"
    );
    envoy.report("edge", usage).await;
    server.stop().await;
}

/// With the documented settings for an Envoy configured with a 1 s `reporting_interval`
/// (`--rlqs-reporting-interval 1`, the time to live left at its default), an Envoy that
/// reports every 5 s, as Envoy 1.40 does whatever its interval says, always holds a valid
/// assignment: each one arrives before the one it follows has expired.
#[tokio::test]
async fn reports_every_5_s_never_outlive_their_assignment() {
    let (server, _dir) = start(&["--rlqs-reporting-interval", "1"]);
    let mut envoy = Envoy::open(&server).await.unwrap();
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut valid_until: Option<tokio::time::Instant> = None;
    for round in 0..3 {
        if round > 0 {
            // Envoy's fixed report period: the client's behaviour, not a wait for the server.
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let response = envoy.report("edge", &[(tenant, 5, 0, 5)]).await;
        let now = tokio::time::Instant::now();
        if let Some(until) = valid_until {
            assert!(now < until, "round {round}: the assignment lapsed");
        }
        let ttl = ttl_secs(assignment(&response));
        // A report may be lost, and the next one still extends the assignment.
        assert!(ttl >= 15.0, "round {round}: a {ttl} s assignment");
        valid_until = Some(now + Duration::from_secs_f64(ttl));
    }
    server.stop().await;
}
