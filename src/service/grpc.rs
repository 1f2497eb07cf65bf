//! The gRPC face of the decider: [`RlsService`], and [`AdmissionLayer`], the tower layer
//! around every gRPC service (installed by [`crate::server::run`]) that takes each stream's
//! place in the bound on calls in flight ([`crate::admission`]) as it opens, charges its
//! body to the request bytes budget, and answers the rate-limit service's ShouldRateLimit
//! calls itself, past tonic's router (see [`Admit`]).
//!
//! The client's deadline (`grpc-timeout`, which Envoy always sends) is read here too, as the
//! stream opens, and set around the call ([`crate::store::shed::within_deadline`]): a store
//! call waits for a place in front of Redis only while it can still be answered by then.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::Either;
use prost::Message;
use tonic::codegen::{Body, StdError};
use tonic::{Request, Response, Status};
use tower::{Layer, Service};

use super::decider::{Call, Decider, EntryPoint};
use super::error::RequestError;
use crate::admission::{BodyBudget, ChargedBody, Held, Overloaded, Place, RequestCodec};
use crate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_server::RateLimitService,
};
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
    /// Takes a place for every call in the bound of `rls`'s decider, charges their request
    /// bytes to `budget`, and answers `rls`'s ShouldRateLimit calls.
    pub fn new(rls: RlsService, budget: Arc<BodyBudget>) -> AdmissionLayer {
        AdmissionLayer { rls, budget }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    /// tonic applies its layers once per `serve`, and each serving thread serves its own
    /// clone of the router: so each thread gets a `ThreadHandle` of its own here.
    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            local: ThreadHandle(Arc::new(Local {
                rls: self.rls.clone(),
                budget: Arc::clone(&self.budget),
            })),
        }
    }
}

/// What a serving thread's calls share (the service and the bytes budget), behind a
/// reference count of the thread's own.
///
/// Why: tonic clones the whole service stack for every call, and each call's future keeps
/// what it answers with. Cloned per call, the decider's and the budget's own `Arc`s would
/// have their counts written by every serving thread, each write a cache line taken from
/// the other core (some 20 ns each, a dozen per call); this handle's count is written by
/// its thread alone. It reaches the budget itself ([`Deref`]), so a call's body and its
/// decoded request are charged through it.
#[derive(Clone)]
pub struct ThreadHandle(Arc<Local>);

struct Local {
    rls: RlsService,
    budget: Arc<BodyBudget>,
}

impl Deref for ThreadHandle {
    type Target = BodyBudget;

    fn deref(&self) -> &BodyBudget {
        &self.0.budget
    }
}

/// See [`AdmissionLayer`]. Every call takes its place here; a ShouldRateLimit call is then
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
    local: ThreadHandle,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Admit<S>
where
    S: Service<
            http::Request<ChargedBody<B, ThreadHandle>>,
            Response = http::Response<tonic::body::Body>,
        > + Clone
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
        // The client's deadline runs from when its stream opened (now), not from when its
        // body is decoded: the store calls it makes wait for a place only while they can
        // still be answered before it (crate::store::shed).
        let deadline = grpc_timeout(request.headers()).map(|timeout| Instant::now() + timeout);
        let request = request.map(|body| ChargedBody::new(body, self.local.clone()));
        if request.uri().path() == SHOULD_RATE_LIMIT {
            // Built here and wrapped by `map`, not awaited in an async block: the block would
            // keep the request (captured) beside the call that holds it, and the whole box
            // is copied as it is made.
            let call = within_deadline(deadline, should_rate_limit(self.local.clone(), request));
            return Box::pin(call.map(Ok));
        }
        // The service that was polled ready serves this call; the clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let local = self.local.clone();
        Box::pin(async move {
            // Taken as the future is first polled, which the server does at once.
            let _place = match local.take_place() {
                Ok(place) => place,
                Err(overloaded) => return Ok(refusal(overloaded)),
            };
            within_deadline(deadline, inner.call(request)).await
        })
    }
}

impl ThreadHandle {
    /// A place in the bound on calls in flight, borrowed from this handle (so a call's future
    /// that owns the handle holds its place without a reference count every thread writes).
    fn take_place(&self) -> Result<Place<'_>, Overloaded> {
        self.0.rls.decider().in_flight().take()
    }
}

/// What a call refused by the bound on calls in flight is answered, at once.
fn refusal(overloaded: Overloaded) -> http::Response<tonic::body::Body> {
    Status::from(RequestError::from(overloaded)).into_http()
}

/// Takes a place in the bound on calls in flight for a ShouldRateLimit call (or refuses it
/// at once) and answers it as tonic's generated service would (same codec, same message
/// bound, same `Grpc::unary`), with the service and budget of `local`, and counts a request
/// that [`RequestCodec`] refused before the handler saw it as the handler counts its own
/// invalid requests, and one whose bytes the budget refused as an overload.
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
    local: ThreadHandle,
    request: http::Request<B>,
) -> impl Future<Output = http::Response<tonic::body::Body>> + Send
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    async move {
        let place = match local.take_place() {
            Ok(place) => place,
            Err(overloaded) => return refusal(overloaded),
        };
        let rls = &local.0.rls;
        let reached = AtomicBool::new(false);
        let handler = Handler(|request: tonic::Request<RateLimitRequest>| {
            reached.store(true, Ordering::Relaxed);
            // Held through a reference: the call's future owns `local`.
            match Held::charge(&*local, request.get_ref().encoded_len()) {
                Ok(held) => Either::Left(rls.answer(&place, request).map(move |answer| {
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

/// The gRPC face of [`Decider`]: the generated service's trait, and the answer
/// [`AdmissionLayer`] gives ShouldRateLimit calls.
#[derive(Clone)]
pub struct RlsService {
    decider: Arc<Decider>,
    /// The largest request message decoded (tonic's 4 MiB when `None`).
    max_decoding_message_size: Option<usize>,
}

impl RlsService {
    /// Serves `decider` over gRPC.
    pub fn new(decider: Arc<Decider>) -> RlsService {
        RlsService {
            decider,
            max_decoding_message_size: None,
        }
    }

    /// Refuses request messages larger than `bytes` (`--grpc-max-message-bytes`).
    pub fn with_max_decoding_message_size(mut self, bytes: usize) -> RlsService {
        self.max_decoding_message_size = Some(bytes);
        self
    }

    /// The decider that answers the calls.
    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// The largest request message decoded, if bounded.
    pub fn max_decoding_message_size(&self) -> Option<usize> {
        self.max_decoding_message_size
    }

    /// Answers one call that holds `place` (the layer in front of the gRPC services takes it
    /// as the stream opens, before its body arrives), timed as the reference's interceptor
    /// times every call that reaches the handler.
    ///
    /// Not an `async fn`: one keeps its arguments apart from the body's own copy of them, so
    /// the request would be part of the call's state twice while it waits for the store; the
    /// block below only borrows it.
    // The manual form is the point: see above.
    #[allow(clippy::manual_async_fn)]
    pub fn answer<'a>(
        &'a self,
        place: &'a Place<'a>,
        request: Request<RateLimitRequest>,
    ) -> impl Future<Output = Result<Response<RateLimitResponse>, Status>> + Send + 'a {
        async move {
            // Timed only where the time is counted (statsd): the two clock reads are some 70 ns
            // of a call that costs a few µs in all.
            let started = self.decider.metrics().times_grpc_calls().then(Instant::now);
            let call = Call::with_headers(
                request.get_ref(),
                EntryPoint::Grpc,
                request.metadata().as_ref(),
            );
            let answered = self.decider.decide(place, call).await;
            // The reference's interceptor times every call that reaches the handler, errors
            // included.
            if let Some(started) = started {
                self.decider.metrics().record_grpc_call(started.elapsed());
            }
            answered.map(Response::new).map_err(Status::from)
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    /// Behind [`AdmissionLayer`] (the server's gRPC stack) a ShouldRateLimit call never comes
    /// this way: the layer takes its place and answers it through [`RlsService::answer`]
    /// itself. A call that does (a service used without the layer) takes its place here.
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        match self.decider.in_flight().take() {
            Ok(place) => self.answer(&place, request).await,
            Err(overloaded) => {
                self.decider.metrics().record_grpc_call(started.elapsed());
                Err(Status::from(RequestError::from(overloaded)))
            }
        }
    }
}

#[cfg(test)]
mod tests;
