//! A refund the decider makes outlives its caller: when a quota-mode denial gives back the
//! debits the store already made and the client goes away mid-refund (it cancelled, or
//! Envoy's timeout reset the stream), the refund still lands, so a denied request debits
//! nothing whether or not anyone waits for its answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use floodgate::clock::SystemClock;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::telemetry::metrics::Metrics;
use support::held::HeldStore;
use support::*;

const LIMITS: &str = support::limits::QUOTA;

/// The quota-mode denial's refund (the store's third call) is held; the client cancels the
/// request meanwhile and the server drops it. Released afterwards, the refund still lands:
/// `hard` has both of its hits left for the next request.
#[tokio::test]
async fn a_quota_denials_refund_lands_when_the_caller_goes_away() {
    let store = HeldStore::one_call(2, Arc::new(SystemClock));
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
    store.arrived().await;
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
    store.release(1);
    tokio::time::timeout(EVENTUALLY, store.applied())
        .await
        .expect("the refund was dropped with the request that made it");
    let response = server.ask(simple("q", "hard", "h")).await;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses[0].limit_remaining, 1);
    server.stop().await;
}
