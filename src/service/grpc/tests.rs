//! Unit tests of the gRPC face: what a call keeps across the store's wait, the client's
//! deadline read from `grpc-timeout`, and each serving thread's handle.

use std::sync::Arc;
use std::time::Duration;

use tower::{Layer, Service};

use super::{AdmissionLayer, RlsService, SHOULD_RATE_LIMIT, grpc_timeout};
use crate::admission::{BodyBudget, ChargedBody, Held};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::plan::PlanOptions;
use crate::proto::rls::RateLimitRequest;
use crate::service::{Call, Decider};
use crate::sources::Snapshot;
use crate::store::MemoryStore;
use crate::telemetry::metrics::Metrics;

/// A decider over no limits and the in-process store.
fn decider() -> Arc<Decider> {
    Arc::new(Decider::new(
        Snapshot::from(Config::empty()).swappable(),
        Arc::new(MemoryStore::new(Arc::new(SystemClock))),
        PlanOptions::default(),
        Arc::new(Metrics::new()),
    ))
}

fn timeout(value: &str) -> Option<Duration> {
    let mut headers = http::HeaderMap::new();
    headers.insert("grpc-timeout", value.parse().unwrap());
    grpc_timeout(&headers)
}

/// What a ShouldRateLimit call keeps while it waits for the store stays small: the
/// admission layer's box, which holds the whole call (tonic's decoding and encoding, the
/// service, the decider's answer) and is copied whole as it is made, and the decider's
/// answer within it (a `max_wait` hold and a quota-mode refund, both rare, boxed apart).
/// The bounds leave about a fifth of room over the sizes measured (2,168 and 496 bytes, debug
/// and release builds alike): a dependency update may move them a little, a regression (the
/// call's request held twice, the rare steps inline: 5,312 and 1,024) much more.
#[tokio::test]
async fn a_call_keeps_a_small_state_across_the_store_wait() {
    let decider = decider();
    let rls = RlsService::new(Arc::clone(&decider));
    let mut admit = AdmissionLayer::new(rls, BodyBudget::new(1 << 20)).layer(tower::service_fn(
        |_: http::Request<ChargedBody<tonic::body::Body, super::ThreadHandle>>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
        },
    ));
    let request = http::Request::builder()
        .uri(SHOULD_RATE_LIMIT)
        .body(tonic::body::Body::empty())
        .unwrap();
    let call = admit.call(request);
    let boxed = std::mem::size_of_val(&*call);
    assert!(boxed <= 2_560, "the admission layer's box is {boxed} bytes");
    let rls_request = RateLimitRequest::default();
    let place = decider.in_flight().take().unwrap();
    let answer = decider.decide(&place, Call::new(&rls_request));
    let answer = std::mem::size_of_val(&answer);
    assert!(answer <= 608, "the decider's answer is {answer} bytes");
}

/// `grpc-timeout` is read in each of gRPC's units; anything else is no deadline.
#[test]
fn grpc_timeout_is_read_in_every_unit_and_nothing_else() {
    assert_eq!(timeout("20m"), Some(Duration::from_millis(20)));
    assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
    assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
    assert_eq!(timeout("1S"), Some(Duration::from_secs(1)));
    assert_eq!(timeout("500u"), Some(Duration::from_micros(500)));
    assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
    for bad in ["", "m", "20", "20x", "123456789m", "-1m", "1.5S", " 20m"] {
        assert_eq!(timeout(bad), None, "{bad:?}");
    }
    assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
}

/// Each application of the layer (tonic applies it once per `serve`, one per serving thread)
/// has a handle of its own, whose reference count that thread alone writes; the clones tonic
/// makes per call share it; every handle reaches the one budget.
#[test]
fn each_serving_thread_has_a_handle_of_its_own() {
    let decider = decider();
    let budget = BodyBudget::new(100);
    let layer = AdmissionLayer::new(RlsService::new(decider), Arc::clone(&budget));
    let (one, other) = (layer.layer(()), layer.layer(()));
    let call = one.clone();
    assert!(
        Arc::ptr_eq(&one.local.0, &call.local.0),
        "a call's clone shares its thread's"
    );
    assert!(
        !Arc::ptr_eq(&one.local.0, &other.local.0),
        "each thread has its own"
    );
    let held = Held::charge(other.local.clone(), 60).unwrap();
    assert_eq!(budget.used(), 60, "one budget behind every handle");
    assert!(Held::charge(&*one.local, 41).is_err());
    drop(held);
    assert_eq!(budget.used(), 0);
}
