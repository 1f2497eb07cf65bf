//! Redis Sentinel and failover: the real binary behind real sentinels follows a failover with
//! no restart, and a demoted master's connections are retired. Every wait polls a condition
//! with a deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use floodgate::store::redis::RedisStore;
use floodgate::telemetry::metrics::Metrics;
use support::process::Floodgate;
use support::redis::RedisServer;
use support::redis::sentinel::{MASTER_NAME, SentinelSetup, info_field, poll};
use support::*;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str =
    "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";

/// The overall code of one request for `value`, or the gRPC error code.
async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    value: &str,
) -> Result<i32, tonic::Code> {
    client
        .should_rate_limit(simple("s", "k", value))
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|status| status.code())
}

/// The real binary serving LIMITS through `setup`'s sentinels (2 s Redis deadlines: a
/// failover may be under way), with a client: the limits directory and process live as long
/// as the returned values.
async fn serve_through(
    setup: &SentinelSetup,
) -> (
    tempfile::TempDir,
    Floodgate,
    RateLimitServiceClient<Channel>,
) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    let nodes = setup.node_urls().join(",");
    let floodgate = Floodgate::start(&[
        "--config",
        dir.path().to_str().unwrap(),
        "--redis-sentinel",
        MASTER_NAME,
        "--redis-sentinel-nodes",
        &nodes,
        "--redis-timeout-ms",
        "2000",
        "--redis-connect-timeout-ms",
        "2000",
    ]);
    let client = RateLimitServiceClient::connect(format!("http://{}", floodgate.grpc))
        .await
        .unwrap();
    (dir, floodgate, client)
}

/// Keys on the server at `port` that contain `part`.
async fn keys_with(port: u16, part: &str) -> Vec<String> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    ::redis::cmd("KEYS")
        .arg(format!("*{part}*"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Kill the master: floodgate (the binary, configured with --redis-sentinel) answers per its
/// failure policy meanwhile, then serves from the promoted replica with no restart — loading
/// the script there (its script cache was flushed) — and its limits hold on the new master.
#[tokio::test]
async fn follows_a_failover_without_restart() {
    let mut setup = SentinelSetup::start(3).await;
    setup.wait_failover_ready().await;
    // The promoted replica must answer NOSCRIPT, so the reload after failover is exercised.
    let mut replica = setup.replica.connection().await;
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut replica)
        .await
        .unwrap();

    let (_dir, floodgate, mut client) = serve_through(&setup).await;
    assert_eq!(ask(&mut client, "before").await, Ok(OK));
    assert_eq!(keys_with(setup.master.port(), "before").await.len(), 1);

    setup.master.stop();
    let new_master = setup.replica.port();
    poll("the sentinels promote the replica", || async {
        setup.current_master_port().await == Some(new_master)
    })
    .await;
    // Meanwhile requests get the policy's answer (error: UNAVAILABLE), never a hang.
    poll("floodgate answers from the new master", || async {
        match ask(&mut client.clone(), "probe").await {
            Ok(code) => code == OK,
            Err(code) => {
                assert_eq!(code, tonic::Code::Unavailable);
                false
            }
        }
    })
    .await;

    // Limits apply on the new master: 3 per hour, the fourth is denied.
    for _ in 0..3 {
        assert_eq!(ask(&mut client, "after").await, Ok(OK));
    }
    assert_eq!(ask(&mut client, "after").await, Ok(OVER));
    assert_eq!(keys_with(new_master, "after").await.len(), 1);
    assert_eq!(
        info_field(&setup.replica, "replication", "role")
            .await
            .as_deref(),
        Some("master")
    );
    // Its script cache was empty: floodgate loaded the script there after NOSCRIPT.
    assert!(
        info_field(&setup.replica, "commandstats", "cmdstat_script|load")
            .await
            .is_some()
    );

    let (exit, log) = tokio::task::spawn_blocking(move || floodgate.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    // The operator sees which master each connection went to: the old, then the new one.
    for port in [setup.master.port(), new_master] {
        let line = format!("address=127.0.0.1:{port}");
        assert!(
            log.lines().any(
                |l| l.contains("Redis Sentinel: connecting to the master") && l.contains(&line)
            ),
            "{log}"
        );
    }
}

/// A manual failover (`SENTINEL FAILOVER`) demotes a master that stays up: floodgate's
/// connections to it are dropped by Sentinel or answered READONLY, and either way retired;
/// requests are then served by, and limited on, the new master.
#[tokio::test]
async fn follows_a_manual_failover_to_a_live_replica() {
    let setup = SentinelSetup::start(3).await;
    setup.wait_failover_ready().await;
    let (_dir, floodgate, mut client) = serve_through(&setup).await;
    assert_eq!(ask(&mut client, "before").await, Ok(OK));

    let sentinel = ::redis::Client::open(setup.node_urls()[0].as_str()).unwrap();
    let mut sentinel = sentinel.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query_async(&mut sentinel)
        .await
        .unwrap();
    let new_master = setup.replica.port();
    poll("the sentinels promote the replica", || async {
        setup.current_master_port().await == Some(new_master)
    })
    .await;
    poll("the old master is a replica", || async {
        info_field(&setup.master, "replication", "role")
            .await
            .as_deref()
            == Some("slave")
    })
    .await;
    poll("floodgate answers from the new master", || async {
        match ask(&mut client.clone(), "probe").await {
            Ok(code) => code == OK,
            Err(code) => {
                assert_eq!(code, tonic::Code::Unavailable);
                false
            }
        }
    })
    .await;
    for _ in 0..3 {
        assert_eq!(ask(&mut client, "after").await, Ok(OK));
    }
    assert_eq!(ask(&mut client, "after").await, Ok(OVER));
    assert_eq!(keys_with(new_master, "after").await.len(), 1);
    let (exit, log) = tokio::task::spawn_blocking(move || floodgate.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}

/// A master demoted to replica while floodgate is connected answers READONLY: the request
/// gets UNAVAILABLE, the connection is retired, and once the server is a master again (or,
/// behind Sentinel, once a new connection finds the new master) requests succeed on a new
/// connection — no request is sent to a replica forever.
#[tokio::test]
async fn readonly_retires_the_connection() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    let store = RedisStore::new(&redis_settings(&server.url())).unwrap();
    let app = TestServer::with(LIMITS)
        .store(Arc::new(store), Arc::new(Metrics::new()))
        .start()
        .await;
    assert_eq!(app.ask(simple("s", "k", "a")).await.overall_code, OK);
    let connections = || async {
        info_field(&server, "stats", "total_connections_received")
            .await
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let mut admin = server.connection().await;
    let _: () = ::redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port())
        .query_async(&mut admin)
        .await
        .unwrap();
    poll("the demoted master is in sync", || async {
        info_field(&server, "replication", "master_link_status")
            .await
            .as_deref()
            == Some("up")
    })
    .await;
    let before = connections().await;
    let status = app.ask_err(simple("s", "k", "a")).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("a replica now"), "{status:?}");
    let _: () = ::redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(app.ask(simple("s", "k", "b")).await.overall_code, OK);
    // The retired connection is replaced (the admin connection above was made before
    // `before` was read, so any new one is the pool's).
    poll("the pool replaces the retired connection", || async {
        connections().await > before
    })
    .await;
    app.stop().await;
}

/// A reference Deployment's Sentinel settings alone (`REDIS_TYPE=sentinel`,
/// `REDIS_URL=<master>,<sentinel>,…`) make the binary use the master the sentinels name.
#[tokio::test]
async fn reference_sentinel_environment() {
    let setup = SentinelSetup::start_steady(2).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("limits.yaml"), LIMITS).unwrap();
    let sentinels: Vec<String> = setup
        .node_urls()
        .iter()
        .map(|url| url.trim_start_matches("redis://").to_string())
        .collect();
    let redis_url = format!("{MASTER_NAME},{}", sentinels.join(","));
    // A generous deadline: the first connections are still being made when requests arrive.
    let floodgate = Floodgate::start_with_env(
        &[
            "--redis-timeout-ms",
            "2000",
            "--redis-connect-timeout-ms",
            "2000",
        ],
        &[
            ("RUNTIME_ROOT", dir.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", &redis_url),
            ("LOG_LEVEL", "info"),
        ],
    );
    let mut client = RateLimitServiceClient::connect(format!("http://{}", floodgate.grpc))
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(ask(&mut client, "ref").await, Ok(OK));
    }
    assert_eq!(ask(&mut client, "ref").await, Ok(OVER));
    assert_eq!(keys_with(setup.master.port(), "ref").await.len(), 1);
}
