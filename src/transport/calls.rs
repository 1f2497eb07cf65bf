//! Counting each connection's calls in flight, so that the port knows which connections are
//! idle ([`super::connection_bound`]): a tower layer for the gRPC server ([`CallsLayer`]) and a
//! make-service wrapper for the admin servers ([`CountAdminCalls`]).
//!
//! A gRPC call counts from the moment hyper hands it to the service (a stream's HEADERS) until
//! its response body ends ([`CountedBody`]): a unary call until its answer and trailers are
//! taken for writing, a streaming call (Envoy's RLQS stream) for as long as its stream lasts,
//! with no list of streaming methods. The body wrapper costs no allocation: tonic boxes every
//! response body once anyway, and boxes this one instead. An admin request counts until its
//! response is ready. That is what "idle" must mean: an HTTP/2 connection with no open
//! stream is idle whatever control frames (PING, SETTINGS, WINDOW_UPDATE) cross it, and one
//! waiting on a held `max_wait` call is busy however long it stays silent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use super::connection_bound::{Activity, Call};
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

impl<S, B, R> Service<http::Request<B>> for CountCalls<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    // Boxed already by the admission layer inside: no second allocation per call.
    S::Future: Unpin,
{
    type Response = http::Response<CountedBody<R>>;
    type Error = S::Error;
    type Future = Answering<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Answering<S::Future> {
        Answering {
            call: activity(request.extensions()).map(Activity::begin_call),
            future: self.inner.call(request),
        }
    }
}

/// A gRPC call's response on its way; once it is ready, its body carries the call on.
#[derive(Debug)]
pub struct Answering<F> {
    future: F,
    call: Option<Call>,
}

impl<F, R, E> Future for Answering<F>
where
    F: Future<Output = Result<http::Response<R>, E>> + Unpin,
{
    type Output = Result<http::Response<CountedBody<R>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Poll::Ready(answer) = Pin::new(&mut this.future).poll(cx) else {
            return Poll::Pending;
        };
        // An error (none in this stack: statuses are responses) ends the call here.
        let call = this.call.take();
        Poll::Ready(answer.map(|response| response.map(|body| CountedBody { body, call })))
    }
}

/// A response body that counts its call in flight until it ends: its last frame taken, or
/// the body dropped (the stream reset, the connection gone).
#[derive(Debug)]
pub struct CountedBody<B> {
    body: B,
    call: Option<Call>,
}

impl<B> hyper::body::Body for CountedBody<B>
where
    B: hyper::body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = frame {
            this.call = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
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
