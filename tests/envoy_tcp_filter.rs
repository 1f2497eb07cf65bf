//! Envoy's network (TCP) rate-limit filter against floodgate: connections past the limit
//! are closed before any byte reaches the backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;

use support::TestServer;
use support::envoy::{Bootstrap, Envoy, yaml};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITS: &str = r#"
domain: tcp
descriptors:
  - key: service
    value: backend
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

/// A TCP listener asking floodgate once per connection, then proxying to the backend.
const TCP_LISTENER: &str = r#"
name: tcp
address: {socket_address: {address: 127.0.0.1, port_value: 0}}
filter_chains:
  - filters:
      - name: envoy.filters.network.ratelimit
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit
          stat_prefix: tcp
          domain: tcp
          descriptors: [{entries: [{key: service, value: backend}]}]
          timeout: 5s
          failure_mode_deny: false
          rate_limit_service:
            transport_api_version: V3
            grpc_service: {envoy_grpc: {cluster_name: ratelimit}}
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: tcp
          cluster: backend
"#;

/// Sends one HTTP request over a new connection to `addr`; returns whatever comes back
/// before the connection closes.
async fn exchange(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = "GET / HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n";
    // Envoy may close an over-limit connection while the request is still being written.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    String::from_utf8_lossy(&raw).into_owned()
}

/// 3 connections an hour: the first 3 reach the backend (200), the next 2 are closed with
/// nothing sent back, and Envoy counts 3 ok, 2 over_limit, no error.
#[tokio::test]
async fn connections_past_the_limit_are_closed() {
    let server = TestServer::start(LIMITS).await;
    let mut bootstrap = Bootstrap::new(&[server.grpc_addr]);
    bootstrap.json["static_resources"]["listeners"]
        .as_array_mut()
        .unwrap()
        .push(yaml(TCP_LISTENER));
    let envoy = Envoy::start(&bootstrap).await;
    let tcp = envoy.listener("tcp").await;
    let mut answers = Vec::new();
    for _ in 0..5 {
        let answer = exchange(tcp).await;
        answers.push(answer.lines().next().unwrap_or("").to_string());
    }
    assert_eq!(
        answers,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 200 OK",
            "",
            ""
        ]
    );
    assert_eq!(envoy.stat("ratelimit.tcp.ok").await, 3);
    assert_eq!(envoy.stat("ratelimit.tcp.over_limit").await, 2);
    assert_eq!(envoy.stat("ratelimit.tcp.error").await, 0);
    drop(envoy);
    server.stop().await;
}
