//! An operator's view: grpcurl drives the server through reflection alone, no proto files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::Command;

use floodgate::transport::tls::TlsFiles;
use serde_json::Value;
use support::TestServer;
use support::certs::Ca;

/// grpcurl from `GRPCURL`, else where `scripts/test.sh` installs it. Missing is a failure, not
/// a skip: run `scripts/test.sh` (or `scripts/install-test-tools.sh`) first.
fn grpcurl() -> PathBuf {
    let path = std::env::var_os("GRPCURL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/bin/grpcurl"))
        });
    assert!(
        path.exists(),
        "grpcurl not found at {}: run scripts/install-test-tools.sh",
        path.display()
    );
    path
}

async fn grpcurl_run(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(grpcurl()).args(&args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

const LIMITS: &str = r#"
domain: d
descriptors:
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// The README's grpcurl call works as printed: OK, then OVER_LIMIT, through reflection only.
#[tokio::test]
async fn grpcurl_should_rate_limit_via_reflection() {
    let server = TestServer::start(LIMITS).await;
    let addr = server.grpc_addr.to_string();
    let call = || {
        vec![
            "-plaintext".to_string(),
            "-d".to_string(),
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#.to_string(),
            addr.clone(),
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit".to_string(),
        ]
    };
    let (ok, stdout, stderr) = grpcurl_run(call()).await;
    assert!(ok, "{stderr}");
    let first: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(first["overallCode"], "OK");
    assert_eq!(first["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    let (_, stdout, _) = grpcurl_run(call()).await;
    let second: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(second["overallCode"], "OVER_LIMIT");
    server.stop().await;
}

/// Reflection lists the rate-limit and health services; health answers SERVING.
#[tokio::test]
async fn grpcurl_lists_services_and_checks_health() {
    let server = TestServer::start(LIMITS).await;
    let addr = server.grpc_addr.to_string();
    let (ok, stdout, stderr) =
        grpcurl_run(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{stdout}"
    );
    assert!(stdout.contains("grpc.health.v1.Health"), "{stdout}");
    let (ok, stdout, stderr) = grpcurl_run(vec![
        "-plaintext".into(),
        addr,
        "grpc.health.v1.Health/Check".into(),
    ])
    .await;
    assert!(ok, "{stderr}");
    assert!(stdout.contains("SERVING"), "{stdout}");
    server.stop().await;
}

/// grpcurl (Go's TLS stack, not rustls) calls the mutual-TLS server with a client certificate
/// from the client CA, through reflection; without a certificate it is refused.
#[tokio::test]
async fn grpcurl_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, clients) = (Ca::new("test CA"), Ca::new("clients CA"));
    let (leaf, client) = (ca.server(1), clients.client("grpcurl"));
    let write = |name: &str, content: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let files = TlsFiles {
        cert: write("tls.crt", &leaf.cert_pem),
        key: write("tls.key", &leaf.key_pem),
        client_ca: Some(write("clients.crt", &clients.pem)),
    };
    let trust = write("ca.crt", &ca.pem).display().to_string();
    let cert = write("client.crt", &client.cert_pem).display().to_string();
    let key = write("client.key", &client.key_pem).display().to_string();
    let server = TestServer::with(LIMITS).tls(files).start().await;
    let call = |identity: &[&str]| {
        let mut args: Vec<String> = ["-cacert", &trust, "-servername", "localhost"]
            .iter()
            .chain(identity)
            .map(|a| a.to_string())
            .collect();
        args.extend([
            "-d".to_string(),
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#.to_string(),
            server.grpc_addr.to_string(),
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit".to_string(),
        ]);
        args
    };
    let (ok, stdout, stderr) = grpcurl_run(call(&["-cert", &cert, "-key", &key])).await;
    assert!(ok, "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["overallCode"], "OK");
    let (ok, _, stderr) = grpcurl_run(call(&[])).await;
    assert!(!ok, "answered without a client certificate");
    assert!(!stderr.is_empty());
    server.stop().await;
}
