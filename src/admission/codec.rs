//! The rate-limit service's request codec: prost's, except that a request that cannot be
//! decoded is `INVALID_ARGUMENT`.
//!
//! Why a codec: tonic's prost codec answers `INTERNAL` for bytes that are not the request
//! message, which says "server defect" for what is a client's malformed request. The code
//! generator names it (`tests/proto_gen.rs`), and `service::grpc` decodes ShouldRateLimit with
//! it.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstCodec;

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
