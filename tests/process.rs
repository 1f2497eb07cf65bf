//! The real binary as an operator runs it: start on ephemeral ports, answer, SIGTERM → exit 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use floodgate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use floodgate::proto::rls::{RateLimitRequest, rate_limit_service_client::RateLimitServiceClient};

/// Starts `floodgate serve` on ephemeral ports and reads the addresses from its log.
fn start(
    config: &str,
) -> (
    Child,
    SocketAddr,
    SocketAddr,
    std::thread::JoinHandle<Vec<String>>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args([
            "serve",
            "--config",
            config,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let field = |line: &str, name: &str| -> SocketAddr {
        let start = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
        line[start..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (grpc, http) = loop {
        let line = lines
            .next()
            .expect("server exited before listening")
            .unwrap();
        if line.contains("listening") {
            break (field(&line, "grpc_addr"), field(&line, "http_addr"));
        }
    };
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
    (child, grpc, http, rest)
}

/// The binary serves the examples on the embedded store and exits 0 on SIGTERM.
#[tokio::test]
async fn serves_then_exits_zero_on_sigterm() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits");
    let (mut child, grpc, http, log) = start(config);
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "unknown-domain".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, 1);

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    let log = log.join().unwrap().join("\n");
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("floodgate stopped"), "{log}");
    // Both ports are closed once it has exited.
    assert!(std::net::TcpStream::connect(grpc).is_err());
    assert!(std::net::TcpStream::connect(http).is_err());
}
