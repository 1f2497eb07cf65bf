//! Overload and floods: bounded requests in flight (refused at once, never queued), the gRPC
//! message cap, and the memory store bound under a random-key flood.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use floodgate::bucket::{Applied, BucketOp};
use floodgate::clock::ManualClock;
use floodgate::metrics::Metrics;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::{MemoryStore, Store, StoreError};
use support::http::post_json;
use support::*;
use tokio::sync::{Semaphore, mpsc};

/// A store that holds every call until the test hands out passes, reporting each arrival.
struct HeldStore {
    inner: MemoryStore,
    entered: mpsc::UnboundedSender<()>,
    passes: Semaphore,
}

impl HeldStore {
    fn new() -> (Arc<HeldStore>, mpsc::UnboundedReceiver<()>) {
        let (entered, arrivals) = mpsc::unbounded_channel();
        let store = HeldStore {
            inner: MemoryStore::new(Arc::new(ManualClock::new(START_US))),
            entered,
            passes: Semaphore::new(0),
        };
        (Arc::new(store), arrivals)
    }
}

#[async_trait]
impl Store for HeldStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let _ = self.entered.send(());
        // Never closed: a pass is always granted eventually by the test.
        self.passes.acquire().await.unwrap().forget();
        self.inner.apply(ops).await
    }

    fn name(&self) -> &'static str {
        "held"
    }
}

const LIMITS: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// With two requests held in the store and --max-in-flight 2, a third (gRPC or /json) is
/// refused at once with RESOURCE_EXHAUSTED / 503 and counted; once released, requests succeed.
#[tokio::test]
async fn beyond_max_in_flight_is_refused_at_once() {
    let (store, mut arrivals) = HeldStore::new();
    let metrics = Metrics::shared();
    let server = TestServer::start_tuned(
        LIMITS,
        store.clone(),
        metrics.clone(),
        Tuning {
            max_in_flight: Some(2),
            ..Tuning::default()
        },
    )
    .await;
    let held: Vec<_> = (0..2)
        .map(|i| {
            let addr = server.grpc_addr;
            tokio::spawn(async move {
                let mut client =
                    floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient::connect(
                        format!("http://{addr}"),
                    )
                    .await
                    .unwrap();
                client.should_rate_limit(simple("d", "k", &i.to_string())).await
            })
        })
        .collect();
    arrivals.recv().await.unwrap();
    arrivals.recv().await.unwrap();

    let refused = server.ask_err(simple("d", "k", "third")).await;
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("--max-in-flight"), "{refused:?}");
    let body = r#"{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "j"}]}]}"#;
    let json = post_json(server.http_addr, body).await;
    assert_eq!(json.status, 503, "{}", json.body);
    assert!(json.body.contains("overloaded"), "{}", json.body);
    assert!(
        metrics
            .encode()
            .contains(r#"floodgate_requests_total{result="overloaded"} 2"#),
        "{}",
        metrics.encode()
    );

    store.passes.add_permits(Semaphore::MAX_PERMITS / 2);
    for request in held {
        let response = request.await.unwrap().expect("held request answered");
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    assert_eq!(
        server.ask(simple("d", "k", "after")).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(post_json(server.http_addr, body).await.status, 200);
    server.stop().await;
}

/// A request above --grpc-max-message-bytes is refused with the status tonic gives
/// (OUT_OF_RANGE), and the server keeps serving, on the same connection too.
#[tokio::test]
async fn oversized_grpc_request_is_refused() {
    let metrics = Metrics::shared();
    let (store, _arrivals) = HeldStore::new();
    store.passes.add_permits(Semaphore::MAX_PERMITS / 2);
    let server = TestServer::start_tuned(
        LIMITS,
        store,
        metrics,
        Tuning {
            grpc_max_message_bytes: Some(1024),
            ..Tuning::default()
        },
    )
    .await;
    let mut client = server.client().await;
    let huge = "x".repeat(2048);
    let refused = client
        .should_rate_limit(simple("d", "k", &huge))
        .await
        .expect_err("an oversized request is refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let small = client
        .should_rate_limit(simple("d", "k", "v"))
        .await
        .unwrap();
    assert_eq!(small.into_inner().overall_code, Code::Ok as i32);
    assert_eq!(
        server.ask(simple("d", "k", "w")).await.overall_code,
        Code::Ok as i32
    );
    server.stop().await;
}

/// A random-key flood through the real server keeps the memory store within
/// --memory-max-buckets, every request answered, evictions counted.
#[tokio::test]
async fn random_key_flood_keeps_memory_store_bounded() {
    let metrics = Metrics::shared();
    let store = Arc::new(
        MemoryStore::new(Arc::new(ManualClock::new(START_US)))
            .with_max_buckets(128, Some(metrics.clone())),
    );
    let server =
        TestServer::start_tuned(LIMITS, store.clone(), metrics.clone(), Tuning::default()).await;
    let mut client = server.client().await;
    for i in 0..2_000 {
        let response = client
            .should_rate_limit(simple("d", "k", &format!("flood-{i}")))
            .await
            .unwrap();
        assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    }
    assert!(store.len() <= 128, "{} buckets", store.len());
    assert_eq!(store.len() as u64 + store.evictions(), 2_000);
    let counted = format!("floodgate_memory_evictions_total {}\n", store.evictions());
    assert!(metrics.encode().contains(&counted), "{}", metrics.encode());
    server.stop().await;
}
