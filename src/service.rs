//! The rate-limit service: `ShouldRateLimit` from request to response.
//!
//! - `decider` — [`Decider`], the whole request path: plan against the current limits,
//!   apply the plan's bucket operations in the store, build the response, count it. Its one
//!   entry point, [`Decider::decide`], answers a [`Call`] that holds a place in the bound on
//!   calls in flight ([`crate::admission::Place`]); the gRPC service and the HTTP `POST /json`
//!   endpoint both come this way.
//! - `hold` — a request a `max_wait` limit admitted with a delay, held until its turn
//!   (refused at shutdown's cut, refunded when its caller leaves).
//! - `grpc` — the gRPC face: [`RlsService`], and [`AdmissionLayer`], which takes each
//!   stream's place as it opens and answers ShouldRateLimit past tonic's router.
//! - `error` — [`RequestError`], the one error type of the request path, and
//!   `From<RequestError> for Status`, the one place it becomes a gRPC status.
//! - `notice` — what the planner stood in for, logged at a bounded rate.

mod decider;
mod error;
mod grpc;
mod hold;
mod notice;

pub use decider::{Call, DELAYED_HEADER, Decider, EntryPoint};
pub use error::RequestError;
pub use grpc::{AdmissionLayer, Admit, RlsService};
