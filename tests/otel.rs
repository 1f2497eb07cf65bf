//! OpenTelemetry traces from the real binary to real OTLP receivers in the test (a tonic
//! `TraceService` for OTLP/gRPC, an HTTP server decoding OTLP/HTTP protobuf bodies, both on
//! ephemeral loopback ports): the caller's `traceparent` and B3 headers make floodgate's
//! server span a child of the caller's span, the store call is its child, the attributes
//! and resource are set, unsampled requests send nothing, and shutdown flushes the queue.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use support::process::Floodgate;
use support::simple;

const LIMITS: &str = r#"
domain: traced
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

/// A caller's span, as Envoy's tracer would send it.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// A span as received, with its service's resource attributes.
#[derive(Clone, Debug)]
struct Received {
    span: Span,
    resource: Vec<KeyValue>,
}

impl Received {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    fn attribute(&self, key: &str) -> Option<String> {
        value(&self.span.attributes, key)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A string or integer attribute as text.
fn value(attributes: &[KeyValue], key: &str) -> Option<String> {
    let kv = attributes.iter().find(|kv| kv.key == key)?;
    match kv.value.as_ref()?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// Every span the receiver got.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Received>>>);

impl Spans {
    fn add(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().unwrap();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        span,
                        resource: resource.clone(),
                    });
                }
            }
        }
    }

    fn all(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }

    /// The spans named `name` in trace `trace`.
    fn named(&self, trace: &str, name: &str) -> Vec<Received> {
        self.all()
            .into_iter()
            .filter(|s| s.trace_id() == trace && s.span.name == name)
            .collect()
    }
}

#[tonic::async_trait]
impl TraceService for Spans {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver on an ephemeral port.
async fn grpc_receiver() -> (SocketAddr, Spans) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Spans::default();
    let service = TraceServiceServer::new(spans.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, spans)
}

/// An OTLP/HTTP (protobuf) receiver on an ephemeral port, at `/v1/traces`.
async fn http_receiver() -> (SocketAddr, Spans) {
    async fn export(State(spans): State<Spans>, body: Bytes) -> Vec<u8> {
        spans.add(ExportTraceServiceRequest::decode(body).unwrap());
        ExportTraceServiceResponse::default().encode_to_vec()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let spans = Spans::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(export))
        .with_state(spans.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, spans)
}

/// A limits file, kept alive with the returned directory.
fn limits() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    let path = path.to_str().unwrap().to_string();
    (dir, path)
}

/// One gRPC ShouldRateLimit with `headers` as metadata.
async fn ask(server: &Floodgate, value: &str, headers: &[(&'static str, &str)]) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut request = tonic::Request::new(simple("traced", "k", value));
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    client.should_rate_limit(request).await.unwrap();
}

/// The server span of trace `trace` and its store child, checked for shape.
fn request_spans(spans: &Spans, trace: &str, name: &str) -> (Received, Received) {
    let servers = spans.named(trace, name);
    assert_eq!(servers.len(), 1, "{name} in {trace}: {:#?}", spans.all());
    let server = servers[0].clone();
    assert_eq!(server.span.kind, SpanKind::Server as i32);
    assert_eq!(
        server.attribute("ratelimit.domain").as_deref(),
        Some("traced")
    );
    assert_eq!(
        server.attribute("ratelimit.descriptors").as_deref(),
        Some("1")
    );
    assert_eq!(server.attribute("ratelimit.result").as_deref(), Some("ok"));
    assert_eq!(
        server.attribute("ratelimit.store").as_deref(),
        Some("memory")
    );
    let stores = spans.named(trace, "store.apply");
    assert_eq!(stores.len(), 1, "{:#?}", spans.all());
    let store = stores[0].clone();
    assert_eq!(
        store.parent_id(),
        server.span_id(),
        "the store span is the server's child"
    );
    assert_eq!(store.attribute("ratelimit.buckets").as_deref(), Some("1"));
    (server, store)
}

/// `POST /json` with `body` and a `traceparent` header; the whole response.
async fn post_traced_json(addr: SocketAddr, body: &str, traceparent: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         traceparent: {traceparent}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    String::from_utf8(raw).unwrap()
}

const GRPC_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// OTLP/gRPC: a sampled `traceparent` makes the server span the caller's child (same trace
/// id, parent = the header's span id), the store span the server span's child, with the
/// attributes and the configured resource; the spans are flushed at shutdown.
#[tokio::test]
async fn grpc_export_joins_the_traceparent_trace() {
    let (addr, spans) = grpc_receiver().await;
    let (_dir, path) = limits();
    let endpoint = format!("http://{addr}");
    let server = Floodgate::start(&[
        "--config",
        &path,
        "--tracing",
        "--tracing-protocol",
        "grpc",
        "--tracing-endpoint",
        &endpoint,
        "--tracing-service-name",
        "gate",
        "--tracing-service-instance-id",
        "pod-7",
    ]);
    let traceparent = format!("00-{TRACE}-{PARENT}-01");
    ask(&server, "a", &[("traceparent", &traceparent)]).await;
    server.stop().await;

    let (server_span, _) = request_spans(&spans, TRACE, GRPC_SPAN);
    assert_eq!(server_span.parent_id(), PARENT);
    assert_eq!(
        value(&server_span.resource, "service.name").as_deref(),
        Some("gate")
    );
    assert_eq!(
        value(&server_span.resource, "service.instance.id").as_deref(),
        Some("pod-7")
    );
}

/// OTLP/HTTP: B3 single and multi headers on gRPC, and a `traceparent` on `POST /json`,
/// each join their caller's trace; a request without a caller's context starts its own
/// (sampled at the default rate 1).
#[tokio::test]
async fn http_export_joins_b3_and_json_traces() {
    let (addr, spans) = http_receiver().await;
    let (_dir, path) = limits();
    let endpoint = format!("http://{addr}/v1/traces");
    let server = Floodgate::start(&[
        "--config",
        &path,
        "--tracing",
        "--tracing-protocol",
        "http/protobuf",
        "--tracing-endpoint",
        &endpoint,
    ]);
    let single_trace = "a3ce929d0e0e47364bf92f3577b34da6";
    let multi_trace = "0000000000000000a3ce929d0e0e4736";
    let json_trace = "11111111111111112222222222222222";
    ask(
        &server,
        "b3",
        &[("b3", &format!("{single_trace}-{PARENT}-1"))],
    )
    .await;
    ask(
        &server,
        "multi",
        &[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", PARENT),
            ("x-b3-sampled", "1"),
        ],
    )
    .await;
    ask(&server, "none", &[]).await;
    let body = r#"{"domain":"traced","descriptors":[{"entries":[{"key":"k","value":"j"}]}]}"#;
    let traceparent = format!("00-{json_trace}-{PARENT}-01");
    let response = post_traced_json(server.http, body, &traceparent).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    server.stop().await;

    for trace in [single_trace, multi_trace] {
        let (span, _) = request_spans(&spans, trace, GRPC_SPAN);
        assert_eq!(span.parent_id(), PARENT);
    }
    let (json, _) = request_spans(&spans, json_trace, "POST /json");
    assert_eq!(json.parent_id(), PARENT);
    assert_eq!(
        value(&json.resource, "service.name").as_deref(),
        Some("floodgate")
    );
    // The request without a caller's context: a root span of a new trace.
    let roots: Vec<_> = spans
        .all()
        .into_iter()
        .filter(|s| s.span.name == GRPC_SPAN && s.span.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "{:#?}", spans.all());
    request_spans(&spans, &roots[0].trace_id(), GRPC_SPAN);
}

/// Sampling rate 0 from the reference's variables: requests without a caller's decision,
/// or whose caller did not sample, send nothing; one whose caller sampled is still
/// exported (parent-based, as the reference), which shows the pipeline was working.
#[tokio::test]
async fn sampling_off_sends_nothing() {
    let (addr, spans) = grpc_receiver().await;
    let (_dir, path) = limits();
    let endpoint = format!("http://{addr}");
    let server = Floodgate::start_with_env(
        &[
            "--config",
            &path,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
            "--tracing-endpoint",
            &endpoint,
        ],
        &[
            ("RUST_LOG", "info"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SAMPLING_RATE", "0"),
        ],
    );
    let unsampled = format!("00-{TRACE}-{PARENT}-00");
    let sampled_trace = "99999999999999998888888888888888";
    ask(&server, "a", &[]).await;
    ask(&server, "b", &[("traceparent", &unsampled)]).await;
    ask(&server, "c", &[("b3", &format!("{TRACE}-{PARENT}-0"))]).await;
    ask(
        &server,
        "d",
        &[("traceparent", &format!("00-{sampled_trace}-{PARENT}-01"))],
    )
    .await;
    server.stop().await;

    let all = spans.all();
    assert_eq!(all.len(), 2, "only the sampled caller's request: {all:#?}");
    let (span, _) = request_spans(&spans, sampled_trace, GRPC_SPAN);
    // The reference's default service name.
    assert_eq!(
        value(&span.resource, "service.name").as_deref(),
        Some("RateLimit")
    );
}

/// A collector that accepts connections and never answers: every request is still answered
/// at once, and shutdown gives up on the flush within its deadline (exit 0).
#[tokio::test]
async fn a_silent_collector_never_blocks_requests_or_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let (_dir, path) = limits();
    let endpoint = format!("http://{addr}");
    let server = Floodgate::start(&[
        "--config",
        &path,
        "--tracing",
        "--tracing-protocol",
        "grpc",
        "--tracing-endpoint",
        &endpoint,
        "--shutdown-grace",
        "1",
    ]);
    // One request held by the export would wait for the exporter's timeout (10 s): each is
    // bounded alone, with room for a loaded machine (not the 50 together, which a loaded
    // machine can stretch past any small bound).
    for i in 0..50 {
        let started = std::time::Instant::now();
        ask(&server, &i.to_string(), &[]).await;
        let answering = started.elapsed();
        assert!(
            answering < std::time::Duration::from_secs(8),
            "request {i}: {answering:?}"
        );
    }
    let stopping = std::time::Instant::now();
    server.stop().await;
    let stopped = stopping.elapsed();
    // The flush deadline (5 s) plus the drain: well under the exporter's own 10 s timeout.
    assert!(stopped < std::time::Duration::from_secs(9), "{stopped:?}");
}
