//! The request path's one error type, [`RequestError`], and the one place it becomes a gRPC
//! status (`From<RequestError> for Status`), with the reason for each code beside it.

use tonic::Status;

use crate::admission::Overloaded;
use crate::plan::InvalidRequest;
use crate::store::StoreError;

/// Why a ShouldRateLimit call failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request is malformed; the message says exactly how.
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `max_in_flight` requests were already being answered; this one was not queued.
    #[error("overloaded: {max_in_flight} requests already in flight (--max-in-flight); not queued")]
    Overloaded {
        /// The configured bound.
        max_in_flight: usize,
    },
}

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Status {
        match error {
            RequestError::Invalid(e) => Status::invalid_argument(e.0),
            // UNAVAILABLE, not a made-up OK: Envoy then applies its own failure_mode_deny,
            // which is the operator's decision to make, not ours.
            RequestError::Store(e) => Status::unavailable(e.to_string()),
            // RESOURCE_EXHAUSTED is gRPC's code for "out of a quota or capacity"; like
            // UNAVAILABLE, it leaves the allow/deny decision to Envoy's failure_mode_deny.
            e @ RequestError::Overloaded { .. } => Status::resource_exhausted(e.to_string()),
        }
    }
}

impl From<Overloaded> for RequestError {
    fn from(overloaded: Overloaded) -> RequestError {
        RequestError::Overloaded {
            max_in_flight: overloaded.max_in_flight,
        }
    }
}
