//! Graceful shutdown: in-flight requests finish, new connections are refused, clean exit.
//! (The same for the real binary under load on Redis, SIGTERM included: tests/faults.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use floodgate::bucket::{Applied, BucketOp};
use floodgate::clock::ManualClock;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::{MemoryStore, Store, StoreError};
use floodgate::telemetry::metrics::Metrics;
use support::*;
use tokio::sync::Notify;

/// A store that holds every call until the test releases it.
struct HeldStore {
    inner: MemoryStore,
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl Store for HeldStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        self.entered.notify_one();
        self.release.notified().await;
        self.inner.apply(ops).await
    }

    fn name(&self) -> &'static str {
        "held"
    }
}

const LIMITS: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// A request in flight when shutdown begins is answered; new connections are refused meanwhile.
#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let store = Arc::new(HeldStore {
        inner: MemoryStore::new(Arc::new(ManualClock::new(START_US))),
        entered: Notify::new(),
        release: Notify::new(),
    });
    let mut server = TestServer::with(LIMITS)
        .store(store.clone(), Metrics::shared())
        .start()
        .await;
    let grpc_addr = server.grpc_addr;
    let mut client = server.client().await;
    let in_flight =
        tokio::spawn(async move { client.should_rate_limit(simple("d", "k", "v")).await });
    store.entered.notified().await;

    server.begin_stop();
    // The listener closes while the request is still held inside the store.
    let deadline = Instant::now() + support::EVENTUALLY;
    while tokio::net::TcpStream::connect(grpc_addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting connections");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !in_flight.is_finished(),
        "the held request cannot have finished"
    );

    store.release.notify_one();
    let response = in_flight
        .await
        .unwrap()
        .expect("in-flight request answered");
    assert_eq!(response.into_inner().overall_code, Code::Ok as i32);
    server.join().await;
}
