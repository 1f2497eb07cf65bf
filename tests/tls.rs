//! TLS and mutual TLS on the gRPC port: real tonic clients over TLS, refusals, certificate
//! rotation through a Kubernetes-style Secret volume (`..data` swap) without restart, a bad
//! rotation that keeps the old certificate, and the binary's start-up checks.
//!
//! Certificates are made at test time (tests/support/certs.rs). Every wait polls (every 20 ms,
//! up to 10 s) for what a client can observe, never sleeps a fixed time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use floodgate::transport::tls::TlsFiles;
use support::certs::{Ca, Leaf};
use support::process::Floodgate;
use support::volume::Volume;
use support::*;
use tempfile::TempDir;
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// How long a reload may take to show before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);
/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(20);

const LIMITS: &str = support::limits::D_K_100_PER_MINUTE;

/// A TLS server serving the certificate `first` of the CA `ca` from a Secret volume.
struct Setup {
    ca: Ca,
    first: Leaf,
    volume: Volume,
    server: TestServer,
    _dir: TempDir,
}

/// Starts a TLS server whose Secret volume holds `tls.crt` / `tls.key` (serial 1) and, with
/// `client_ca`, `ca.crt` (then mutual TLS).
async fn setup(client_ca: Option<&Ca>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let first = ca.server(1);
    let volume = Volume::new(dir.path(), &secret_files(&first, client_ca));
    let files = TlsFiles {
        cert: volume.path("tls.crt"),
        key: volume.path("tls.key"),
        client_ca: client_ca.map(|_| volume.path("ca.crt")),
    };
    let server = TestServer::with(LIMITS).tls(files).start().await;
    Setup {
        ca,
        first,
        volume,
        server,
        _dir: dir,
    }
}

fn secret_files<'a>(leaf: &'a Leaf, client_ca: Option<&'a Ca>) -> Vec<(&'static str, &'a str)> {
    let mut files = vec![
        ("tls.crt", leaf.cert_pem.as_str()),
        ("tls.key", leaf.key_pem.as_str()),
    ];
    if let Some(ca) = client_ca {
        files.push(("ca.crt", ca.pem.as_str()));
    }
    files
}

/// Asks once for `k=v` and returns whether the answer was OK.
async fn answers(client: &mut RateLimitServiceClient<Channel>) -> Result<(), tonic::Status> {
    let response = client
        .should_rate_limit(simple("d", "k", "v"))
        .await?
        .into_inner();
    assert_eq!(response.overall_code, 1, "{response:?}");
    Ok(())
}

/// Connects over TLS and asks once; any failure (handshake, connection, RPC) is an error.
async fn ask_tls(server: &TestServer, ca: &Ca, identity: Option<&Leaf>) -> Result<(), String> {
    let mut client = tls::client(server.grpc_addr, ca, identity)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    answers(&mut client)
        .await
        .map_err(|e| format!("rpc: {e:?}"))
}

/// Polls until the metric series exceeds `before`.
async fn until_metric_above(server: &TestServer, series: &str, before: u64) {
    let deadline = Instant::now() + DEADLINE;
    while server.metric(series) <= before {
        assert!(
            Instant::now() < deadline,
            "{series} never exceeded {before}"
        );
        tokio::time::sleep(POLL).await;
    }
}

const TLS_ERRORS: &str = "floodgate_tls_loads_total{result=\"error\"}";
const TLS_SUCCESSES: &str = "floodgate_tls_loads_total{result=\"success\"}";
const HANDSHAKE_ERRORS: &str = "floodgate_tls_handshake_failures_total{reason=\"error\"}";
const HANDSHAKE_TIMEOUTS: &str = "floodgate_tls_handshake_failures_total{reason=\"timeout\"}";
const TLS_LAST_OK: &str = "floodgate_tls_last_reload_success";

/// A tonic client over TLS, trusting the CA, gets answers; the load is counted.
#[tokio::test]
async fn tls_client_gets_answers() {
    let Setup {
        ca, server, _dir, ..
    } = setup(None).await;
    ask_tls(&server, &ca, None).await.unwrap();
    assert_eq!(server.metric(TLS_SUCCESSES), 1);
    assert_eq!(server.metric(TLS_LAST_OK), 1);
    server.stop().await;
}

/// A plaintext gRPC client is refused, and the failed handshake is counted.
#[tokio::test]
async fn plaintext_client_is_refused() {
    let Setup { server, _dir, .. } = setup(None).await;
    let plaintext = async {
        let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .map_err(|e| e.to_string())?;
        answers(&mut client).await.map_err(|e| e.to_string())
    };
    assert!(plaintext.await.is_err());
    until_metric_above(&server, HANDSHAKE_ERRORS, 0).await;
    server.stop().await;
}

/// With a client CA, a client without a certificate, or with one from another CA, is
/// refused (each refusal counted); a client with a certificate from the CA gets answers.
#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let clients_ca = Ca::new("clients CA");
    let Setup {
        ca, server, _dir, ..
    } = setup(Some(&clients_ca)).await;

    let refused = ask_tls(&server, &ca, None).await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let stranger = Ca::new("other CA").client("stranger");
    let refused = ask_tls(&server, &ca, Some(&stranger)).await;
    assert!(refused.is_err(), "certificate of another CA: {refused:?}");
    until_metric_above(&server, HANDSHAKE_ERRORS, 1).await;

    let envoy = clients_ca.client("envoy");
    ask_tls(&server, &ca, Some(&envoy)).await.unwrap();
    server.stop().await;
}

/// A client offering only TLS 1.2 (Envoy's default maximum as a TLS client) is served, as is
/// one offering only TLS 1.3.
#[tokio::test]
async fn tls12_and_tls13_clients_are_served() {
    let Setup {
        ca,
        first,
        server,
        _dir,
        ..
    } = setup(None).await;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let (served, negotiated) = tls::handshake(server.grpc_addr, &[&ca], None, &[version]).await;
        assert_eq!(negotiated, version.version);
        assert_eq!(served, first.der);
    }
    server.stop().await;
}

/// A connection that never completes its handshake does not hold up others: a good client
/// is answered while it is still open (had the handshakes run one at a time, the good one
/// would have waited for the stalled one to time out, which would be counted).
#[tokio::test]
async fn stalled_handshake_does_not_block_others() {
    let Setup {
        ca, server, _dir, ..
    } = setup(None).await;
    let stalled = TcpStream::connect(server.grpc_addr).await.unwrap();
    ask_tls(&server, &ca, None).await.unwrap();
    assert_eq!(server.metric(HANDSHAKE_TIMEOUTS), 0);
    drop(stalled);
    server.stop().await;
}

/// Polls until a new connection to `addr` is served `expected`.
async fn until_served(addr: SocketAddr, ca: &Ca, expected: &Leaf) {
    let deadline = Instant::now() + DEADLINE;
    while tls::served_certificate(addr, &[ca], None).await != expected.der {
        assert!(
            Instant::now() < deadline,
            "the new certificate is never served"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The certificate a new connection is served.
async fn served(server: &TestServer, ca: &Ca) -> Vec<u8> {
    tls::served_certificate(server.grpc_addr, &[ca], None).await
}

/// Rotating the Secret volume (new `..data`) makes new connections see the new certificate
/// without a restart; a connection opened before keeps working.
#[tokio::test]
async fn rotated_certificate_serves_new_connections() {
    let Setup {
        ca,
        first,
        mut volume,
        server,
        _dir,
        ..
    } = setup(None).await;
    assert_eq!(served(&server, &ca).await, first.der);
    let mut before = tls::client(server.grpc_addr, &ca, None).await.unwrap();
    answers(&mut before).await.unwrap();

    let second = ca.server(2);
    volume.update(&secret_files(&second, None));
    until_served(server.grpc_addr, &ca, &second).await;
    ask_tls(&server, &ca, None).await.unwrap();
    answers(&mut before).await.unwrap();
    assert!(server.metric(TLS_SUCCESSES) >= 2);
    assert_eq!(server.metric(TLS_ERRORS), 0);
    server.stop().await;
}

/// A rotation to a key that does not match the certificate, or to garbage, is refused: the
/// old certificate keeps serving, the failure is counted, and the next good rotation is taken.
#[tokio::test]
async fn bad_rotation_keeps_the_old_certificate() {
    let Setup {
        ca,
        first,
        mut volume,
        server,
        _dir,
        ..
    } = setup(None).await;
    let (second, third) = (ca.server(2), ca.server(3));

    // The second certificate with the third's key.
    volume.update(&[
        ("tls.crt", second.cert_pem.as_str()),
        ("tls.key", third.key_pem.as_str()),
    ]);
    until_metric_above(&server, TLS_ERRORS, 0).await;
    assert_eq!(server.metric(TLS_LAST_OK), 0);
    assert_eq!(served(&server, &ca).await, first.der);
    ask_tls(&server, &ca, None).await.unwrap();

    let errors = server.metric(TLS_ERRORS);
    volume.update(&[("tls.crt", "not a certificate"), ("tls.key", "nor a key")]);
    until_metric_above(&server, TLS_ERRORS, errors).await;
    assert_eq!(served(&server, &ca).await, first.der);

    volume.update(&secret_files(&third, None));
    until_served(server.grpc_addr, &ca, &third).await;
    assert_eq!(server.metric(TLS_LAST_OK), 1);
    server.stop().await;
}

/// Rotating the client CA (to trust a new clients' CA) takes effect for new connections.
#[tokio::test]
async fn rotated_client_ca_is_used() {
    let (old_clients, new_clients) = (Ca::new("old clients"), Ca::new("new clients"));
    let Setup {
        ca,
        first,
        mut volume,
        server,
        _dir,
        ..
    } = setup(Some(&old_clients)).await;
    let newcomer = new_clients.client("newcomer");
    assert!(ask_tls(&server, &ca, Some(&newcomer)).await.is_err());

    let successes = server.metric(TLS_SUCCESSES);
    volume.update(&secret_files(&first, Some(&new_clients)));
    until_metric_above(&server, TLS_SUCCESSES, successes).await;
    ask_tls(&server, &ca, Some(&newcomer)).await.unwrap();
    let veteran = old_clients.client("veteran");
    assert!(ask_tls(&server, &ca, Some(&veteran)).await.is_err());
    server.stop().await;
}

/// The binary serves TLS from the flags and reloads a rotated certificate: `floodgate serve`
/// wires the same watcher as the in-process tests.
#[tokio::test]
async fn binary_serves_and_reloads_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (first, second) = (ca.server(1), ca.server(2));
    let mut volume = Volume::new(dir.path(), &secret_files(&first, None));
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits");
    let (cert, key) = (volume.path("tls.crt"), volume.path("tls.key"));
    let server = Floodgate::start(&[
        "--config",
        config,
        "--grpc-tls-cert-file",
        cert.to_str().unwrap(),
        "--grpc-tls-key-file",
        key.to_str().unwrap(),
    ]);
    assert_eq!(
        tls::served_certificate(server.grpc, &[&ca], None).await,
        first.der
    );
    let mut client = tls::client(server.grpc, &ca, None).await.unwrap();
    let response = client
        .should_rate_limit(simple("unknown-domain", "k", "v"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, 1);

    volume.update(&secret_files(&second, None));
    until_served(server.grpc, &ca, &second).await;
    // Logged just after the new certificate is in force, by the reloading thread, which a
    // stop does not wait for.
    support::eventually("the reload logged", || async {
        server.log_count("TLS certificate reloaded") >= 1
    })
    .await;
    let log = server.stop().await;
    assert!(log.contains("gRPC TLS certificate loaded"), "{log}");
}

/// Unusable TLS files at start exit 64 naming the file and the reason, before listening.
#[test]
fn bad_tls_files_exit_64() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (leaf, other) = (ca.server(1), ca.server(2));
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_string()
    };
    let cert = write("tls.crt", &leaf.cert_pem);
    let key = write("tls.key", &leaf.key_pem);
    let other_key = write("other.key", &other.key_pem);
    let garbage = write("garbage.pem", "hello");
    let missing = dir.path().join("missing.pem").to_str().unwrap().to_string();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits");
    let cases = [
        (&cert, &missing, None, "missing.pem", "No such file"),
        (&garbage, &key, None, "garbage.pem", "no PEM certificate"),
        (&cert, &garbage, None, "garbage.pem", "no PEM private key"),
        (&cert, &other_key, None, "other.key", "cannot be used with"),
        (
            &cert,
            &key,
            Some(&garbage),
            "garbage.pem",
            "no PEM certificate",
        ),
    ];
    for (cert, key, client_ca, file, reason) in cases {
        let mut args = vec![
            "serve",
            "--config",
            config,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-tls-cert-file",
            cert,
            "--grpc-tls-key-file",
            key,
        ];
        if let Some(ca) = client_ca {
            args.extend(["--grpc-tls-client-ca-file", ca]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_floodgate"))
            .args(&args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains(file) && stderr.contains(reason),
            "{args:?}: {stderr}"
        );
        assert!(!stdout.contains("listening"), "{stdout}");
    }
}
