//! Request size and request bytes in flight: a ShouldRateLimit as large as Envoy builds from
//! its largest default headers is answered and limited, and what request bodies hold
//! together stays within `--max-in-flight-bytes` (refused past it with RESOURCE_EXHAUSTED,
//! counted as overloaded, given back when the calls end).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;

use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_response::Code;
use prost::Message;
use support::h2raw::rss_bytes;
use support::http::metric;
use support::process::Floodgate;
use support::*;

/// One descriptor per API key, and one per client address and API key.
const LIMITS: &str = "
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 100}
";

/// A request carrying `key` in two descriptors, as Envoy builds it from one header.
fn key_twice(key: &str) -> RateLimitRequest {
    request(
        "edge",
        vec![
            descriptor(&[("api_key", key)]),
            descriptor(&[("remote_address", "10.0.0.1"), ("api_key", key)]),
        ],
    )
}

/// A ShouldRateLimit holding a 60 KiB header value twice (about 120 KiB, over the former
/// 64 KiB cap) is answered, and limited once its limit is used up.
#[tokio::test]
async fn a_request_with_a_60_kib_value_twice_is_limited() {
    let server = TestServer::start(LIMITS).await;
    let key = "k".repeat(60 * 1024);
    let request = key_twice(&key);
    assert!(request.encoded_len() > 120 * 1024);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(server.ask(request.clone()).await.overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    server.stop().await;
}

/// A gRPC message header (uncompressed, `len` bytes) and `sent` bytes of its message.
fn partial_message(len: usize, sent: usize) -> Vec<u8> {
    let mut bytes = vec![0];
    bytes.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    bytes.extend(std::iter::repeat_n(b'x', sent));
    bytes
}

/// An HTTP/2 connection to `addr` on which ShouldRateLimit streams send part of a body and
/// wait: what a slow or hostile client holds.
struct Sender {
    client: h2::client::SendRequest<bytes::Bytes>,
    connection: tokio::task::JoinHandle<()>,
    streams: Vec<h2::SendStream<bytes::Bytes>>,
}

impl Sender {
    async fn connect(addr: SocketAddr) -> Sender {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Sender {
            client,
            connection,
            streams: Vec::new(),
        }
    }

    /// Opens a stream that sends `bytes` of a larger message and keeps it open; answers its
    /// response's future.
    async fn send_part(&mut self, bytes: usize) -> h2::client::ResponseFuture {
        let request = ::http::Request::builder()
            .method("POST")
            .uri("http://floodgate/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let client = self.client.clone();
        let mut client = client.ready().await.unwrap();
        let (response, mut body) = client.send_request(request, false).unwrap();
        body.reserve_capacity(bytes + 5);
        body.send_data(partial_message(bytes * 2, bytes).into(), false)
            .unwrap();
        self.streams.push(body);
        response
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// With `--max-in-flight-bytes` 128 KiB, two streams holding 50 KiB of unfinished bodies
/// each leave room for small calls only: a 40 KiB request and a third 50 KiB body are
/// refused with RESOURCE_EXHAUSTED (counted as overloaded) while a small call is answered,
/// and once the streams are gone their bytes are given back (the 40 KiB request is
/// answered). Each body fits in HTTP/2's initial 64 KiB window, so each arrives whole.
#[tokio::test]
async fn request_bytes_past_the_budget_are_refused_and_given_back() {
    let server = TestServer::with(support::limits::D_K_100_PER_MINUTE)
        .tuning(Tuning {
            max_in_flight_bytes: Some(128 * 1024),
            ..Tuning::default()
        })
        .start()
        .await;
    let large = simple("d", "k", &"v".repeat(40 * 1024));
    let mut sender = Sender::connect(server.grpc_addr).await;
    let _first = sender.send_part(50 * 1024).await;
    let _second = sender.send_part(50 * 1024).await;
    // Both bodies charged: the 40 KiB request no longer fits.
    eventually("two bodies hold the budget", || async {
        let mut client = server.client().await;
        client
            .should_rate_limit(large.clone())
            .await
            .is_err_and(|status| status.code() == tonic::Code::ResourceExhausted)
    })
    .await;
    let third = sender.send_part(50 * 1024).await;
    let third = tokio::time::timeout(EVENTUALLY, third)
        .await
        .expect("the third stream is answered at once")
        .unwrap();
    assert_eq!(third.headers()["grpc-status"], "8", "{third:?}");
    assert_eq!(
        server.ask(simple("d", "k", "small")).await.overall_code,
        Code::Ok as i32
    );
    let overloaded = |text: String| {
        text.lines()
            .find_map(|line| line.strip_prefix(r#"floodgate_requests_total{result="overloaded"} "#))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    assert!(overloaded(server.metrics.encode()) >= 2);
    drop(sender);
    eventually("closed streams give their bytes back", || async {
        let mut client = server.client().await;
        client.should_rate_limit(large.clone()).await.is_ok()
    })
    .await;
    server.stop().await;
}

/// The binary at its defaults (`--max-in-flight-bytes` 32 MiB) under 700 streams each
/// holding 60 KiB of an unfinished body (42 MB sent): those past the budget are refused,
/// counted as overloaded, and RSS grows by less than 160 MiB (five times the budget; measured
/// about 3.3 times: the streams' own state, tonic's growing decode buffers, allocator
/// slack); once the streams close their bytes are given back and a call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_bodies_keep_memory_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, support::limits::D_K_100_PER_MINUTE).unwrap();
    let server = Floodgate::start(&["--config", limits.to_str().unwrap()]);
    let legit = || async {
        let mut client =
            floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::connect(
                format!("http://{}", server.grpc),
            )
            .await
            .unwrap();
        client
            .should_rate_limit(simple("d", "k", "v"))
            .await
            .map(|r| r.into_inner().overall_code)
    };
    assert_eq!(legit().await.unwrap(), Code::Ok as i32);
    let before = rss_bytes(server.child.id());
    let mut senders = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..7 {
        let mut sender = Sender::connect(server.grpc).await;
        for _ in 0..100 {
            responses.push(sender.send_part(60 * 1024).await);
        }
        senders.push(sender);
    }
    let overloaded = r#"floodgate_requests_total{result="overloaded"}"#;
    // 32 MiB holds 546 such bodies: the other 154 are refused.
    eventually("the bodies past the budget refused", || async {
        metric(server.http, overloaded).await.unwrap_or(0.0) >= 150.0
    })
    .await;
    let after = rss_bytes(server.child.id());
    let grown = after.saturating_sub(before);
    eprintln!("RSS {before} -> {after} bytes");
    assert!(grown < 160 << 20, "RSS grew by {grown} bytes");
    drop(responses);
    drop(senders);
    eventually("closed streams give their bytes back", || async {
        legit().await.is_ok_and(|code| code == Code::Ok as i32)
    })
    .await;
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}
