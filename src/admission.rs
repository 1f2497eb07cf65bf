//! Admitting gRPC calls: every stream counts against `--max-in-flight` from the moment it
//! opens, and a request that cannot be decoded is `INVALID_ARGUMENT`, counted.
//!
//! Place in the flow: a tower layer around every gRPC service ([`AdmissionLayer`], installed
//! by [`crate::server::run`]), which also answers the rate-limit service's ShouldRateLimit
//! calls itself, past tonic's router (see [`Admit`]); and the codec of the rate-limit service
//! ([`RequestCodec`], named by the code generator in `tests/proto_gen.rs`).
//!
//! Why at the stream and not in the handler: tonic calls a unary handler only once the whole
//! request body has arrived. A client that opens streams with HEADERS and never sends a body
//! would hold each one (about 13 KB) without ever being counted, so `--max-in-flight` would
//! never apply. Here the place is taken when the stream's headers arrive, held until the
//! response is ready (the server's request timeout bounds that), and refused at once with
//! `RESOURCE_EXHAUSTED` when none is left, like any other overload. Health and reflection
//! calls count too: every open stream costs the same memory.
//!
//! The client's deadline (`grpc-timeout`, which Envoy always sends) is read here too, as the
//! stream opens, and set around the call ([`crate::store::shed::within_deadline`]): a store
//! call waits for a place in front of Redis only while it can still be answered by then.
//!
//! Every call's request body is charged, as its bytes arrive, against the replica's budget
//! of request bytes in flight (`--max-in-flight-bytes`, `admission::budget`): the message cap is
//! large enough for whatever Envoy builds from the largest headers it accepts, and the budget
//! keeps the sum of such bodies within the pod's memory.
//!
//! Why a codec: tonic's prost codec answers `INTERNAL` for bytes that are not the request
//! message, which says "server defect" for what is a client's malformed request.

mod budget;

pub use budget::{BodyBudget, ChargedBody, Held};

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::Either;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::codegen::{Body, StdError};
use tonic_prost::ProstCodec;
use tower::{Layer, Service};

use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::service::RlsService;
use crate::store::shed::within_deadline;
use crate::telemetry::metrics::RequestResult;

/// The path of the rate-limit service's one method, which [`Admit`] serves itself.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Wraps every gRPC service in [`Admit`].
#[derive(Clone)]
pub struct AdmissionLayer {
    rls: RlsService,
    budget: Arc<BodyBudget>,
}

impl AdmissionLayer {
    /// Admits calls into the places of `rls`'s decider, charges their request bytes to
    /// `budget`, and answers `rls`'s ShouldRateLimit calls.
    pub fn new(rls: RlsService, budget: Arc<BodyBudget>) -> AdmissionLayer {
        AdmissionLayer { rls, budget }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            rls: self.rls.clone(),
            budget: Arc::clone(&self.budget),
        }
    }
}

/// See [`AdmissionLayer`]. Every call is admitted here; a ShouldRateLimit call is then
/// answered here too, and any other goes on to the router.
///
/// Why ShouldRateLimit does not go through tonic's router: the router is an axum router, and
/// on its way to the generated service a call picked up ten heap allocations (the matched
/// path and URL parameters put in its extensions, the route's service cloned into a box,
/// the response body boxed again at each of three layers) and three boxed futures (the
/// generated service's, its unary handler's, `async_trait`'s). Here the call is decoded,
/// answered and encoded by tonic's own `Grpc::unary`, exactly as the generated service
/// does it, inside the one future this layer boxes anyway.
#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    rls: RlsService,
    budget: Arc<BodyBudget>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Admit<S>
where
    S: Service<http::Request<ChargedBody<B>>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + Unpin + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<tonic::body::Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let admitted = match self.rls.decider().admit() {
            Ok(admitted) => admitted,
            Err(e) => {
                let response = Status::from(e).into_http();
                return Box::pin(async move { Ok(response) });
            }
        };
        // The client's deadline runs from when its stream opened (now), not from when its
        // body is decoded: the store calls it makes wait for a place only while they can
        // still be answered before it (crate::store::shed).
        let deadline = grpc_timeout(request.headers()).map(|timeout| Instant::now() + timeout);
        let budget = Arc::clone(&self.budget);
        let request = request.map(|body| ChargedBody::new(body, budget));
        if request.uri().path() == SHOULD_RATE_LIMIT {
            // Built here and wrapped by `map`, not awaited in an async block: the block would
            // keep the request (captured) beside the call that holds it, and the whole box
            // is copied as it is made.
            let (rls, budget) = (self.rls.clone(), Arc::clone(&self.budget));
            let call = within_deadline(deadline, should_rate_limit(rls, budget, request));
            return Box::pin(call.map(move |response| {
                drop(admitted);
                Ok(response)
            }));
        }
        // The service that was polled ready serves this call; the clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let response = within_deadline(deadline, inner.call(request)).await;
            drop(admitted);
            response
        })
    }
}

/// Answers a ShouldRateLimit call as tonic's generated service would (same codec, same
/// message bound, same `Grpc::unary`), and counts a request that [`RequestCodec`] refused
/// before the handler saw it as the handler counts its own invalid requests, and one whose
/// bytes `budget` refused as an overload.
///
/// The body's charge ends once the message is decoded; the decoded request, whose entries
/// are slices of the body's buffer, is charged again (its encoded length) until it is
/// answered.
///
/// Not an `async fn`, which would keep `request` twice (its argument, then the body's own copy)
/// in every call's state.
// The manual form is the point: see above.
#[allow(clippy::manual_async_fn)]
fn should_rate_limit<B>(
    rls: RlsService,
    budget: Arc<BodyBudget>,
    request: http::Request<B>,
) -> impl Future<Output = http::Response<tonic::body::Body>> + Send
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    async move {
        let reached = AtomicBool::new(false);
        let handler = Handler(|request: tonic::Request<RateLimitRequest>| {
            reached.store(true, Ordering::Relaxed);
            match budget.hold(request.get_ref().encoded_len()) {
                Ok(held) => Either::Left(rls.answer_admitted(request).map(move |answer| {
                    drop(held);
                    answer
                })),
                Err(refused) => {
                    rls.decider()
                        .metrics()
                        .record_request(RequestResult::Overloaded);
                    Either::Right(std::future::ready(Err(refused)))
                }
            }
        });
        let mut grpc = tonic::server::Grpc::new(RequestCodec::default())
            .apply_max_message_size_config(rls.max_decoding_message_size(), None);
        let response = grpc.unary(handler, request).await;
        if !reached.load(Ordering::Relaxed) {
            // Refused before the handler: undecodable, or over the bytes budget.
            let refused = match grpc_status(&response) {
                Some(tonic::Code::InvalidArgument) => Some(RequestResult::Invalid),
                Some(tonic::Code::ResourceExhausted) => Some(RequestResult::Overloaded),
                _ => None,
            };
            if let Some(result) = refused {
                rls.decider().metrics().record_request(result);
            }
        }
        response
    }
}

/// A unary handler made of a closure, so that the type of its future is inferred rather
/// than named (which would take a box).
struct Handler<F>(F);

impl<F, A> Service<tonic::Request<RateLimitRequest>> for Handler<F>
where
    F: FnMut(tonic::Request<RateLimitRequest>) -> A,
    A: Future<Output = Result<tonic::Response<RateLimitResponse>, Status>>,
{
    type Response = tonic::Response<RateLimitResponse>;
    type Error = Status;
    type Future = A;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> A {
        (self.0)(request)
    }
}

/// The client's deadline (`grpc-timeout`: at most 8 digits and a unit, H M S m u n, gRPC over
/// HTTP/2), as tonic reads it; `None` when absent or malformed (tonic then sets none either,
/// and the call has the server's request timeout).
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.as_bytes();
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let count: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(count * 3600),
        b'M' => Duration::from_secs(count * 60),
        b'S' => Duration::from_secs(count),
        b'm' => Duration::from_millis(count),
        b'u' => Duration::from_micros(count),
        b'n' => Duration::from_nanos(count),
        _ => return None,
    })
}

/// The `grpc-status` of a trailers-only response (an error answered before any message).
fn grpc_status<R>(response: &http::Response<R>) -> Option<tonic::Code> {
    let value = response.headers().get("grpc-status")?.to_str().ok()?;
    Some(tonic::Code::from(value.parse::<i32>().ok()?))
}

/// The rate-limit service's codec: prost's, except that a request that cannot be decoded is
/// `INVALID_ARGUMENT` (the client's fault), not `INTERNAL`.
#[derive(Debug)]
pub struct RequestCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        RequestCodec(ProstCodec::default())
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = InvalidArgumentDecoder<<ProstCodec<T, U> as Codec>::Decoder, U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder(ProstCodec::<T, U>::raw_decoder(buffers()), PhantomData)
    }
}

/// The codec's buffers: 1 KiB to start with rather than tonic's 8 KiB, as rate-limit
/// requests and responses are a few hundred bytes (a larger message grows its buffer); the
/// point at which a long stream yields is tonic's default.
fn buffers() -> BufferSettings {
    BufferSettings::new(1024, 32 * 1024)
}

/// A decoder whose failures are `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct InvalidArgumentDecoder<D, U>(D, PhantomData<U>);

impl<D, U> Decoder for InvalidArgumentDecoder<D, U>
where
    D: Decoder<Item = U, Error = Status>,
{
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!("malformed request: {}", status.message()))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&headers)
    }

    /// What a ShouldRateLimit call keeps while it waits for the store stays small: the
    /// admission layer's box, which holds the whole call (tonic's decoding and encoding, the
    /// service, the decider's answer) and is copied whole as it is made, and the decider's
    /// answer within it (a `max_wait` hold and a quota-mode refund, both rare, boxed apart).
    /// The bounds leave about a fifth of room over the sizes now (1,848 and 432 bytes; with
    /// the call's request held twice and the rare steps inline they were 5,312 and 1,024):
    /// a dependency update may move them a little, a regression much more.
    #[tokio::test]
    async fn a_call_keeps_a_small_state_across_the_store_wait() {
        use crate::clock::SystemClock;
        use crate::config::Config;
        use crate::plan::PlanOptions;
        use crate::service::{Decider, EntryPoint};
        use crate::sources::Snapshot;
        use crate::store::MemoryStore;
        use crate::telemetry::metrics::Metrics;

        let decider = Arc::new(Decider::new(
            Snapshot::from(Config::empty()).swappable(),
            Arc::new(MemoryStore::new(Arc::new(SystemClock))),
            PlanOptions::default(),
            Arc::new(Metrics::new()),
        ));
        let rls = RlsService::new(Arc::clone(&decider));
        let mut admit = AdmissionLayer::new(rls, BodyBudget::new(1 << 20)).layer(
            tower::service_fn(|_: http::Request<ChargedBody<tonic::body::Body>>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
            }),
        );
        let request = http::Request::builder()
            .uri(SHOULD_RATE_LIMIT)
            .body(tonic::body::Body::empty())
            .unwrap();
        let call = admit.call(request);
        let boxed = std::mem::size_of_val(&*call);
        assert!(boxed <= 2_304, "the admission layer's box is {boxed} bytes");
        let rls_request = RateLimitRequest::default();
        let answer = decider.answer_traced(&rls_request, EntryPoint::Grpc, None);
        let answer = std::mem::size_of_val(&answer);
        assert!(answer <= 544, "the decider's answer is {answer} bytes");
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
}
