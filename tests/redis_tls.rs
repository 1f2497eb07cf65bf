//! TLS to Redis: the real binary against a TLS-only redis-server whose certificates are
//! generated at test time — the CA file, a client certificate when the server requires one,
//! a wrong CA answered by the failure policy, and unusable files refused at start-up — and
//! against a TLS-only Sentinel set-up and a TLS-only Redis Cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::process::Command;

use floodgate::bucket::{BucketKey, KeyValue};
use floodgate::limiter::Algorithm;
use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::certs::{Pki, arg};
use support::process::Floodgate;
use support::redis::{RedisCluster, RedisServer};
use support::*;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const LIMITS: &str =
    "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

fn limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("limits.yaml"), LIMITS).unwrap();
    dir
}

/// Starts the binary on `redis` with `extra` flags; returns it and a connected client.
async fn serve(
    redis: &RedisServer,
    limits: &tempfile::TempDir,
    extra: &[&str],
) -> (Floodgate, RateLimitServiceClient<tonic::transport::Channel>) {
    serve_on(&["--redis-url", &redis.url()], limits, extra).await
}

/// Starts the binary with the Redis flags `store` and `extra` flags; returns it and a
/// connected client.
async fn serve_on(
    store: &[&str],
    limits: &tempfile::TempDir,
    extra: &[&str],
) -> (Floodgate, RateLimitServiceClient<tonic::transport::Channel>) {
    // Generous deadlines: TLS handshakes in a debug build on a loaded machine can take longer
    // than the 250 ms default connect timeout.
    let mut args = vec!["--config", limits.path().to_str().unwrap()];
    args.extend_from_slice(store);
    args.extend_from_slice(&[
        "--redis-timeout-ms",
        "2000",
        "--redis-connect-timeout-ms",
        "2000",
    ]);
    args.extend_from_slice(extra);
    let floodgate = Floodgate::start(&args);
    let client = RateLimitServiceClient::connect(format!("http://{}", floodgate.grpc))
        .await
        .unwrap();
    (floodgate, client)
}

/// The overall code of one request, or the gRPC error code.
async fn ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
) -> Result<i32, tonic::Code> {
    ask_for(client, simple("t", "k", "v")).await
}

/// The overall code of `request`, or the gRPC error code.
async fn ask_for(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    request: RateLimitRequest,
) -> Result<i32, tonic::Code> {
    client
        .should_rate_limit(request)
        .await
        .map(|r| r.into_inner().overall_code)
        .map_err(|status| status.code())
}

/// `rediss://` with the CA file: the limit is enforced in the TLS Redis (1 per hour).
#[tokio::test]
async fn connects_with_the_ca_file() {
    let pki = Pki::generate();
    let redis = RedisServer::start_tls(&pki.server_files(), false);
    let limits = limits();
    let (_floodgate, mut client) =
        serve(&redis, &limits, &["--redis-tls-ca-file", arg(&pki.ca)]).await;
    assert_eq!(ask(&mut client).await, Ok(OK));
    assert_eq!(ask(&mut client).await, Ok(OVER));
}

/// A server that requires client certificates accepts floodgate's, and refuses a
/// connection without one: the request gets the failure policy's answer (error:
/// UNAVAILABLE), at once rather than after a hang.
#[tokio::test]
async fn client_certificate_when_the_server_requires_one() {
    let pki = Pki::generate();
    let redis = RedisServer::start_tls(&pki.server_files(), true);
    let limits = limits();
    let (_with, mut client) = serve(
        &redis,
        &limits,
        &[
            "--redis-tls-ca-file",
            arg(&pki.ca),
            "--redis-tls-cert-file",
            arg(&pki.client_cert),
            "--redis-tls-key-file",
            arg(&pki.client_key),
        ],
    )
    .await;
    assert_eq!(ask(&mut client).await, Ok(OK));
    assert_eq!(ask(&mut client).await, Ok(OVER));

    let (_without, mut client) =
        serve(&redis, &limits, &["--redis-tls-ca-file", arg(&pki.ca)]).await;
    assert_eq!(ask(&mut client).await, Err(tonic::Code::Unavailable));
}

/// A server certificate from another CA fails the handshake: the failure policy answers
/// (here deny: OVER_LIMIT), never a panic or a hang, and the process keeps serving.
#[tokio::test]
async fn wrong_ca_is_answered_by_the_failure_policy() {
    let pki = Pki::generate();
    let other = Pki::generate();
    let redis = RedisServer::start_tls(&pki.server_files(), false);
    let limits = limits();
    let (floodgate, mut client) = serve(
        &redis,
        &limits,
        &[
            "--redis-tls-ca-file",
            arg(&other.ca),
            "--on-store-error",
            "deny",
        ],
    )
    .await;
    assert_eq!(ask(&mut client).await, Ok(OVER));
    assert_eq!(ask(&mut client).await, Ok(OVER));
    let (exit, log) = tokio::task::spawn_blocking(move || floodgate.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// A missing or unusable TLS file, a certificate without its key, or TLS files with no TLS
/// connection to use them on, exits 64 at start-up naming the cause, before any port is
/// bound.
#[test]
fn unusable_tls_files_exit_64() {
    let pki = Pki::generate();
    let limits = limits();
    let missing = limits.path().join("missing.pem");
    let tls_url = ["--redis-url", "rediss://127.0.0.1:1"];
    let ca = ["--redis-tls-ca-file", arg(&pki.ca)];
    let cases: [(Vec<&str>, String); 9] = [
        (
            ca.to_vec(),
            "Redis TLS files are set, but no Redis is".to_string(),
        ),
        (
            [&["--redis-url", "redis://127.0.0.1:1"][..], &ca].concat(),
            "requires a URL with the `rediss://` scheme".to_string(),
        ),
        (
            [
                &[
                    "--redis-sentinel",
                    "m",
                    "--redis-sentinel-nodes",
                    "redis://127.0.0.1:1",
                ][..],
                &ca,
            ]
            .concat(),
            "neither --redis-url nor the sentinel URLs use rediss://".to_string(),
        ),
        (
            [&["--redis-cluster", "redis://127.0.0.1:1"][..], &ca].concat(),
            "the --redis-cluster seeds do not use rediss://".to_string(),
        ),
        (
            vec![
                "--redis-cluster",
                "rediss://127.0.0.1:1,redis://127.0.0.1:2",
            ],
            "mixes rediss:// and plain seeds".to_string(),
        ),
        (
            vec!["--redis-tls-ca-file", arg(&missing)],
            format!("cannot read Redis TLS CA file {}", missing.display()),
        ),
        (
            vec!["--redis-tls-ca-file", arg(&pki.client_key)],
            format!(
                "Redis TLS CA file {}: no PEM certificate",
                pki.client_key.display()
            ),
        ),
        (
            vec!["--redis-tls-cert-file", arg(&pki.client_cert)],
            "needs both --redis-tls-cert-file and --redis-tls-key-file".to_string(),
        ),
        (
            vec![
                "--redis-tls-cert-file",
                arg(&pki.client_cert),
                "--redis-tls-key-file",
                arg(&pki.client_cert),
            ],
            format!(
                "Redis TLS key file {}: no usable PEM private key",
                pki.client_cert.display()
            ),
        ),
    ];
    for (i, (flags, message)) in cases.into_iter().enumerate() {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command
            .args(["serve", "--config", limits.path().to_str().unwrap()])
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
        // The first five cases choose their Redis themselves; the others get a TLS one.
        if i >= 5 {
            command.args(tls_url);
        }
        let out = command
            .args(&flags)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(
            stderr.contains(&message),
            "{flags:?}: {stderr:?} lacks {message:?}"
        );
    }
}

/// Sentinel over TLS: master, replica and sentinels serve TLS only; floodgate asks the
/// sentinels over `rediss://` and reaches the master over TLS (`--redis-url
/// rediss://<master name>`), trusting the one CA file for both.
#[tokio::test]
async fn sentinel_and_master_over_tls() {
    use support::redis::sentinel::{MASTER_NAME, SentinelSetup};
    let pki = Pki::generate();
    let setup = SentinelSetup::start_tls(2, &pki.server_files()).await;
    let limits = limits();
    let nodes = setup.node_urls().join(",");
    assert!(nodes.starts_with("rediss://"), "{nodes}");
    let master_url = format!("rediss://{MASTER_NAME}");
    let floodgate = Floodgate::start(&[
        "--config",
        limits.path().to_str().unwrap(),
        "--redis-sentinel",
        MASTER_NAME,
        "--redis-sentinel-nodes",
        &nodes,
        "--redis-url",
        &master_url,
        "--redis-tls-ca-file",
        arg(&pki.ca),
        "--redis-timeout-ms",
        "2000",
        "--redis-connect-timeout-ms",
        "2000",
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", floodgate.grpc))
        .await
        .unwrap();
    assert_eq!(ask(&mut client).await, Ok(OK));
    assert_eq!(ask(&mut client).await, Ok(OVER));
    let mut master = setup.master.connection().await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("fg:t:*")
        .query_async(&mut master)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

/// The Redis key of descriptor `k=value` of domain `t` (one hour, token bucket).
fn bucket(value: &str) -> Vec<u8> {
    let key = BucketKey::new(
        "t",
        [(&b"k"[..], KeyValue::Value(value.as_bytes()))],
        Algorithm::TokenBucket,
        3_600_000_000,
    );
    [&b"fg:"[..], key.as_bytes()].concat()
}

/// A request with one `k=value` descriptor per value.
fn several(values: &[String]) -> RateLimitRequest {
    request(
        "t",
        values.iter().map(|v| descriptor(&[("k", v)])).collect(),
    )
}

/// Redis Cluster over TLS, through the settings, the server and the cluster store of the real
/// binary: three masters serving TLS only to clients and on the cluster bus, requiring client
/// certificates. Given `rediss://` seeds, the CA and the client certificate, floodgate admits
/// a request whose buckets live on every master (each stored on its own master), then denies
/// it; a denial across masters refunds the other master's debit. Without the client
/// certificate, or trusting another CA, the failure policy answers: no hang, no panic.
#[tokio::test]
async fn cluster_over_tls() {
    let pki = Pki::generate();
    let other = Pki::generate();
    let cluster = RedisCluster::start_tls(3, 0, &pki.server_files(), true);
    let seeds = cluster.seeds().join(",");
    assert!(seeds.starts_with("rediss://"), "{seeds}");
    let limits = limits();
    // One value per master: each bucket's slot is served by a master no earlier value's is.
    let mut owners = Vec::new();
    let values: Vec<String> = (0..)
        .map(|i| format!("v{i}"))
        .filter(|v| {
            let port = cluster.owner(&bucket(v)).port();
            let new = !owners.contains(&port);
            owners.push(port);
            new
        })
        .take(3)
        .collect();
    let client_files = [
        "--redis-tls-cert-file",
        arg(&pki.client_cert),
        "--redis-tls-key-file",
        arg(&pki.client_key),
    ];
    let (floodgate, mut client) = serve_on(
        &["--redis-cluster", &seeds],
        &limits,
        &[&["--redis-tls-ca-file", arg(&pki.ca)][..], &client_files].concat(),
    )
    .await;
    assert_eq!(ask_for(&mut client, several(&values)).await, Ok(OK));
    for value in &values {
        let key = bucket(value);
        let exists: i64 = cluster
            .owner(&key)
            .query(::redis::cmd("EXISTS").arg(&key))
            .unwrap();
        assert_eq!(exists, 1, "{value}: not on its master");
    }
    assert_eq!(ask_for(&mut client, several(&values)).await, Ok(OVER));
    assert_eq!(cluster.key_count(), 3);

    // values[0] is spent: a request with it and a fresh bucket on another master is denied,
    // and the fresh bucket's debit refunded, so it still admits once on its own.
    let first_owner = cluster.owner(&bucket(&values[0])).port();
    let fresh = (0..)
        .map(|i| format!("w{i}"))
        .find(|w| cluster.owner(&bucket(w)).port() != first_owner)
        .unwrap();
    let mixed = several(&[values[0].clone(), fresh.clone()]);
    assert_eq!(ask_for(&mut client, mixed).await, Ok(OVER));
    let alone = several(std::slice::from_ref(&fresh));
    assert_eq!(ask_for(&mut client, alone.clone()).await, Ok(OK));
    assert_eq!(ask_for(&mut client, alone).await, Ok(OVER));
    let log = floodgate.stop().await;
    assert!(!log.contains("panicked"), "{log}");

    // A bucket never used: a connected floodgate would admit it.
    let unused = several(&["unused".to_string()]);
    let refused = [
        // No client certificate: the nodes refuse the handshake. Default policy: UNAVAILABLE.
        (
            vec!["--redis-tls-ca-file", arg(&pki.ca)],
            Err(tonic::Code::Unavailable),
        ),
        // The nodes' certificates are not signed by the CA trusted: deny answers OVER_LIMIT.
        (
            [
                &[
                    "--redis-tls-ca-file",
                    arg(&other.ca),
                    "--on-store-error",
                    "deny",
                ][..],
                &client_files,
            ]
            .concat(),
            Ok(OVER),
        ),
    ];
    for (flags, answer) in refused {
        let (floodgate, mut client) = serve_on(&["--redis-cluster", &seeds], &limits, &flags).await;
        assert_eq!(
            ask_for(&mut client, unused.clone()).await,
            answer,
            "{flags:?}"
        );
        assert_eq!(
            ask_for(&mut client, unused.clone()).await,
            answer,
            "{flags:?}"
        );
        let log = floodgate.stop().await;
        assert!(!log.contains("panicked"), "{flags:?}: {log}");
    }
    assert_eq!(cluster.key_count(), 4);
}
