//! A refund the decider makes outlives its caller: when a quota-mode denial gives back the
//! debits the store already made and the client goes away mid-refund (it cancelled, or
//! Envoy's timeout reset the stream), the refund still lands, so a denied request debits
//! nothing whether or not anyone waits for its answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use floodgate::bucket::{Applied, BucketOp};
use floodgate::clock::SystemClock;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::store::{MemoryStore, Store, StoreError};
use floodgate::telemetry::metrics::Metrics;
use support::*;
use tokio::sync::Notify;

/// The memory store, with its `held`-th call (0-based) held until the test releases it, and
/// a notice once that call has been applied.
struct HoldsOneCall {
    inner: MemoryStore,
    calls: AtomicUsize,
    held: usize,
    entered: Notify,
    release: Notify,
    applied: Notify,
}

#[async_trait]
impl Store for HoldsOneCall {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) != self.held {
            return self.inner.apply(ops).await;
        }
        self.entered.notify_one();
        self.release.notified().await;
        let applied = self.inner.apply(ops).await;
        self.applied.notify_one();
        applied
    }

    fn name(&self) -> &'static str {
        "holds-one-call"
    }
}

const LIMITS: &str = support::limits::QUOTA;

/// The quota-mode denial's refund (the store's third call) is held; the client cancels the
/// request meanwhile and the server drops it. Released afterwards, the refund still lands:
/// `hard` has both of its hits left for the next request.
#[tokio::test]
async fn a_quota_denials_refund_lands_when_the_caller_goes_away() {
    let store = Arc::new(HoldsOneCall {
        inner: MemoryStore::new(Arc::new(SystemClock)),
        calls: AtomicUsize::new(0),
        held: 2,
        entered: Notify::new(),
        release: Notify::new(),
        applied: Notify::new(),
    });
    let server = TestServer::with(LIMITS)
        .store(store.clone(), Arc::new(Metrics::new()))
        .start()
        .await;
    // Call 0: `soft` spends its one hit.
    assert_eq!(
        server.ask(simple("q", "soft", "a")).await.overall_code,
        Code::Ok as i32
    );
    // Call 1 debits `hard` and finds `soft` over: every quota-mode descriptor is over, so the
    // request is denied and call 2 gives `hard`'s debit back.
    let mixed = request(
        "q",
        vec![descriptor(&[("soft", "a")]), descriptor(&[("hard", "h")])],
    );
    let mut client = server.client().await;
    let cancelled = tokio::spawn(async move { client.should_rate_limit(mixed).await });
    store.entered.notified().await;
    cancelled.abort();
    let _ = cancelled.await;
    // The server has dropped the request once its place in flight is given back.
    let deadline = Instant::now() + EVENTUALLY;
    while !server
        .metrics
        .encode()
        .contains("\nfloodgate_requests_in_flight 0\n")
    {
        assert!(
            Instant::now() < deadline,
            "the cancelled request is still in flight"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.release.notify_one();
    tokio::time::timeout(EVENTUALLY, store.applied.notified())
        .await
        .expect("the refund was dropped with the request that made it");
    let response = server.ask(simple("q", "hard", "h")).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses[0].limit_remaining, 1);
    server.stop().await;
}
