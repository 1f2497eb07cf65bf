//! Why an RLQS stream ends with an error status: each error's gRPC status and the reason
//! its refusal is counted under.

use std::time::Duration;

use tonic::Status;

use crate::rlqs::ids::Full;
use crate::rlqs::share::ShareError;

/// Why a stream ends with an error status.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The client sent something the protocol does not allow; the message says what.
    #[error("{0}")]
    Invalid(String),
    /// The stream would subscribe to more buckets than `--rlqs-max-buckets-per-stream`.
    #[error(
        "this stream already subscribes to {0} buckets (--rlqs-max-buckets-per-stream); \
         open another stream"
    )]
    TooManyBuckets(usize),
    /// The replica holds as many subscriptions (or bytes of them) as its bound allows.
    #[error("{0}; open a stream again later")]
    Full(#[from] Full),
    /// A message larger than the port's `--grpc-max-message-bytes`; the codec says how large.
    #[error("{0} (--grpc-max-message-bytes)")]
    TooLarge(String),
    /// No report came for `--rlqs-report-timeout`.
    #[error(
        "no usage report for {} s (--rlqs-report-timeout); Envoy reports every 5 s",
        .0.as_secs_f64()
    )]
    Silent(Duration),
    /// The share table failed.
    #[error(transparent)]
    Shares(#[from] ShareError),
}

impl From<StreamError> for Status {
    fn from(error: StreamError) -> Status {
        match error {
            StreamError::Invalid(message) => Status::invalid_argument(message),
            e @ (StreamError::TooManyBuckets(_)
            | StreamError::Full(_)
            | StreamError::TooLarge(_)) => Status::resource_exhausted(e.to_string()),
            e @ StreamError::Silent(_) => Status::deadline_exceeded(e.to_string()),
            // Like a store failure on ShouldRateLimit: Envoy then keeps its current
            // assignments until they expire, and applies its expired_assignment_behavior.
            StreamError::Shares(e) => Status::unavailable(e.to_string()),
        }
    }
}

impl StreamError {
    pub(super) fn reason(&self) -> &'static str {
        match self {
            StreamError::Invalid(_) => "invalid",
            StreamError::TooManyBuckets(_) => "buckets",
            StreamError::Full(_) => "memory",
            StreamError::TooLarge(_) => "too_large",
            StreamError::Silent(_) => "silent",
            StreamError::Shares(_) => "shares",
        }
    }
}
