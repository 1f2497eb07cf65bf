//! Admitting gRPC calls: every stream counts against `--max-in-flight` from the moment it
//! opens, and a request that cannot be decoded is `INVALID_ARGUMENT`, counted.
//!
//! Place in the flow: a tower layer around every gRPC service ([`AdmissionLayer`], installed
//! by [`crate::server::run`]), and the codec of the rate-limit service ([`RequestCodec`], named
//! by the code generator in `tests/proto_gen.rs`).
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
//! Why a codec: tonic's prost codec answers `INTERNAL` for bytes that are not the request
//! message, which says "server defect" for what is a client's malformed request.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstCodec;
use tower::{Layer, Service};

use crate::service::{Decider, Reached};
use crate::store::shed::within_deadline;
use crate::telemetry::metrics::RequestResult;

/// The path prefix of the rate-limit service's calls.
const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/";

/// Wraps every gRPC service in [`Admit`].
#[derive(Clone)]
pub struct AdmissionLayer {
    limiter: Arc<Decider>,
}

impl AdmissionLayer {
    /// Admits calls into `limiter`'s places.
    pub fn new(limiter: Arc<Decider>) -> AdmissionLayer {
        AdmissionLayer { limiter }
    }
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// See [`AdmissionLayer`].
#[derive(Clone)]
pub struct Admit<S> {
    inner: S,
    limiter: Arc<Decider>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Admit<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let admitted = match self.limiter.admit() {
            Ok(admitted) => admitted,
            Err(e) => {
                let response = Status::from(e).into_http();
                return Box::pin(async move { Ok(response) });
            }
        };
        let rls = request.uri().path().starts_with(RLS_PATH);
        // The client's deadline runs from when its stream opened (now), not from when its
        // body is decoded: the store calls it makes wait for a place only while they can
        // still be answered before it (crate::store::shed).
        let deadline = grpc_timeout(request.headers()).map(|timeout| Instant::now() + timeout);
        let reached = Reached::default();
        if rls {
            request.extensions_mut().insert(reached.clone());
        }
        // The service that was polled ready serves this call; the clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let response = within_deadline(deadline, inner.call(request)).await;
            drop(admitted);
            if let Ok(response) = &response
                && rls
                && !reached.is_marked()
                && grpc_status(response) == Some(tonic::Code::InvalidArgument)
            {
                // Refused by RequestCodec before the handler: count it as the handler
                // counts its own invalid requests.
                limiter.metrics().record_request(RequestResult::Invalid);
            }
            response
        })
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
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder(self.0.decoder(), PhantomData)
    }
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
