//! The real binary as an operator runs it: start on ephemeral ports, answer, SIGTERM → exit 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use floodgate::proto::rls::{RateLimitRequest, rate_limit_service_client::RateLimitServiceClient};
use support::process::Floodgate;

/// The binary serves the examples on the embedded store and exits 0 on SIGTERM.
#[tokio::test]
async fn serves_then_exits_zero_on_sigterm() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits");
    let server = Floodgate::start(&["--config", config]);
    let (grpc, http) = (server.grpc, server.http);
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "unknown-domain".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: b"k".to_vec().into(),
                    value: b"v".to_vec().into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.overall_code, 1);

    let log = server.stop().await;
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("floodgate stopped"), "{log}");
    // Both ports are closed once it has exited.
    assert!(std::net::TcpStream::connect(grpc).is_err());
    assert!(std::net::TcpStream::connect(http).is_err());
}
