//! Counting each connection's calls in flight, so that the port knows which connections are
//! idle ([`super::places`]): a tower layer for the gRPC server ([`CallsLayer`]) and a
//! make-service wrapper for the admin servers ([`CountAdminCalls`]).
//!
//! A call counts from the moment hyper hands it to the service (a gRPC stream's HEADERS, an
//! HTTP/1 request's head) until its response is ready; the response body is then written
//! without holding the connection busy. A streaming RLQS call counts until its stream ends
//! ([`StreamCall`], which the service holds). That is what "idle" must mean: an HTTP/2 connection
//! with no open stream is idle whatever control frames (PING, SETTINGS, WINDOW_UPDATE) cross
//! it, and one waiting on a held `max_wait` call is busy however long it stays silent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use super::places::{Activity, Call};
use super::{Acceptor, GuardedInfo};

/// Counts every gRPC call on its connection's activity (connections with no bound, such as
/// a unix socket's, are not counted).
#[derive(Clone, Copy, Debug, Default)]
pub struct CallsLayer;

impl<S> Layer<S> for CallsLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> CountCalls<S> {
        CountCalls { inner }
    }
}

/// See [`CallsLayer`].
#[derive(Clone, Debug)]
pub struct CountCalls<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for CountCalls<S>
where
    S: Service<http::Request<B>>,
    // Boxed already by the admission layer inside: no second allocation per call.
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Counted<S::Future> {
        let call = activity(request.extensions()).map(Activity::begin_call);
        let streaming = STREAMS
            .iter()
            .any(|prefix| request.uri().path().starts_with(prefix));
        let call = match call {
            // A stream's call lasts as long as the stream: the service holds it.
            Some(call) if streaming => {
                request.extensions_mut().insert(StreamCall {
                    _call: Arc::new(call),
                });
                None
            }
            call => call,
        };
        Counted {
            future: self.inner.call(request),
            _call: call,
        }
    }
}

/// The gRPC methods whose call lasts as long as its stream rather than until its response is
/// ready: Envoy's RLQS stream carries no other call, and its connection must not count as
/// idle (and make way at the connection bound) while the stream is open.
const STREAMS: &[&str] = &["/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/"];

/// A streaming call's place on its connection, carried in the request's extensions: the
/// connection counts as busy until the service drops them, at the stream's end.
#[derive(Clone, Debug)]
pub struct StreamCall {
    _call: Arc<Call>,
}

/// The activity of the request's connection, from what tonic put in its extensions for a
/// plaintext or a TLS guarded connection.
fn activity(extensions: &http::Extensions) -> Option<&Arc<Activity>> {
    extensions
        .get::<GuardedInfo<TcpConnectInfo>>()
        .and_then(|info| info.activity.as_ref())
        .or_else(|| {
            extensions
                .get::<GuardedInfo<TlsConnectInfo<TcpConnectInfo>>>()
                .and_then(|info| info.activity.as_ref())
        })
}

/// A call's response on its way; the call counts as in flight until it is ready (or dropped).
#[derive(Debug)]
pub struct Counted<F> {
    future: F,
    _call: Option<Call>,
}

impl<F: Future + Unpin> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        Pin::new(&mut self.get_mut().future).poll(cx)
    }
}

/// Wraps an axum make-service (a `Router`, or one with connect info) so that every request on
/// an accepted connection counts as a call on it: `axum::serve(acceptor, CountAdminCalls(app))`.
#[derive(Clone, Debug)]
pub struct CountAdminCalls<M>(pub M);

impl<'a, M, S> Service<axum::serve::IncomingStream<'a, Acceptor>> for CountAdminCalls<M>
where
    M: Service<axum::serve::IncomingStream<'a, Acceptor>, Response = S, Error = Infallible>,
    // axum's make-services are ready at once (`std::future::Ready`).
    M::Future: Unpin,
{
    type Response = ConnectionCalls<S>;
    type Error = Infallible;
    type Future = Made<M::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, stream: axum::serve::IncomingStream<'a, Acceptor>) -> Self::Future {
        let activity = stream.io().activity().cloned();
        Made {
            made: self.0.call(stream),
            activity,
        }
    }
}

/// An admin connection's service being made.
#[derive(Debug)]
pub struct Made<F> {
    made: F,
    activity: Option<Arc<Activity>>,
}

impl<F, S> Future for Made<F>
where
    F: Future<Output = Result<S, Infallible>> + Unpin,
{
    type Output = Result<ConnectionCalls<S>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Poll::Ready(made) = Pin::new(&mut this.made).poll(cx) else {
            return Poll::Pending;
        };
        let activity = this.activity.take();
        Poll::Ready(made.map(|inner| ConnectionCalls { inner, activity }))
    }
}

/// One admin connection's service: counts each request as a call on the connection.
#[derive(Clone, Debug)]
pub struct ConnectionCalls<S> {
    inner: S,
    /// Every connection an [`Acceptor`] accepts has one.
    activity: Option<Arc<Activity>>,
}

impl<S, B> Service<http::Request<B>> for ConnectionCalls<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<Pin<Box<S::Future>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        Counted {
            _call: self.activity.as_ref().map(Activity::begin_call),
            future: Box::pin(self.inner.call(request)),
        }
    }
}
