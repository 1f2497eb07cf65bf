//! Admission: the bounds on what this replica takes in at once, and the request codec.
//!
//! - **Calls in flight** (`--max-in-flight`): [`InFlight`], one atomic count shared by every
//!   serving thread, and its guard [`Place`]. Every gRPC stream takes a place as it opens
//!   (the gRPC stack's layer, `service::grpc`), every `POST /json` as it arrives (`http`),
//!   and the decider answers only a call that holds one (`service::Decider::decide`). One
//!   more than the bound is refused at once ([`Overloaded`], `RESOURCE_EXHAUSTED` on gRPC)
//!   rather than queued: Envoy's rate-limit call has a short deadline (20 ms by default), so
//!   a queued call would mostly time out anyway, after holding memory, while an immediate
//!   refusal lets Envoy apply its `failure_mode_deny` right away.
//! - **Request bytes in flight** (`--max-in-flight-bytes`): [`BodyBudget`]
//!   (`admission::budget`), charged DATA frame by DATA frame as a body arrives.
//! - **The request codec** ([`RequestCodec`], `admission::codec`): a request that cannot be
//!   decoded is `INVALID_ARGUMENT`, the client's fault.
//!
//! Why a gRPC call takes its place at the stream and not in the handler: tonic calls a unary
//! handler only once the whole request body has arrived. A client that opens streams with
//! HEADERS and never sends a body would hold each one (about 13 KB) without ever being
//! counted, so `--max-in-flight` would never apply. Taken when the stream's headers arrive,
//! the place is held until the response is ready (the server's request timeout bounds that).
//! Health and reflection calls count too: every open stream costs the same memory.
//!
//! The other bounds (connections in `transport`, calls to Redis in `store::shed`) are listed
//! side by side in `docs/architecture.md`.

mod budget;
mod codec;

pub use budget::{BodyBudget, ChargedBody, Held};
pub use codec::{InvalidArgumentDecoder, RequestCodec};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::telemetry::metrics::{Metrics, RequestResult};

/// The largest `--max-in-flight`: no practical limit, with room left in the count's `usize`.
pub const MAX_IN_FLIGHT: usize = usize::MAX >> 3;

/// The bound on calls in flight (`--max-in-flight`), gRPC and `/json` together.
#[derive(Debug)]
pub struct InFlight {
    /// Calls in flight at once, at most.
    max: usize,
    /// Calls holding a [`Place`] now (gRPC streams from their first frame), shown by
    /// `metrics` as `floodgate_requests_in_flight` at each exposition. Why not a semaphore:
    /// its permit (an `Arc` clone) and its release (a mutex) cost more per call than one
    /// atomic. On a cache line pair of its own: every serving thread writes it twice per
    /// call, and nothing read beside it should be taken from the reader's cache each time.
    count: Arc<Count>,
    /// Where a refusal is counted (`floodgate_requests_total{result="overloaded"}`).
    metrics: Arc<Metrics>,
}

/// The count of an [`InFlight`], alone on its lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Count(AtomicUsize);

impl InFlight {
    /// A bound of `max` calls (clamped to 1..=[`MAX_IN_FLIGHT`]), its count mirrored in
    /// `metrics`.
    pub fn new(max: usize, metrics: Arc<Metrics>) -> InFlight {
        let count = Arc::new(Count::default());
        let mirrored = Arc::clone(&count);
        metrics.mirror_requests_in_flight(move || mirrored.0.load(Ordering::Relaxed));
        InFlight {
            max: max.clamp(1, MAX_IN_FLIGHT),
            count,
            metrics,
        }
    }

    /// The same count under a bound of `max` (clamped to 1..=[`MAX_IN_FLIGHT`]).
    pub fn with_max(mut self, max: usize) -> InFlight {
        self.max = max.clamp(1, MAX_IN_FLIGHT);
        self
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Takes one of the places, or refuses (counted) when none is left. The place is held
    /// until the returned guard is dropped; this never waits, so overload never queues.
    ///
    /// The guard borrows the bound rather than sharing it: a shared reference count would be
    /// two more writes per call on a line every serving thread writes. A call's future that
    /// must own its place owns what reaches the bound (`service::grpc` owns its thread's
    /// handle) and takes the place from it.
    pub fn take(&self) -> Result<Place<'_>, Overloaded> {
        // One atomic shared by every serving thread: the count never goes above the bound.
        let max = self.max;
        let entered = self
            .count
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if entered.is_err() {
            self.metrics.record_request(RequestResult::Overloaded);
            tracing::debug!("overloaded: request refused");
            return Err(Overloaded { max_in_flight: max });
        }
        Ok(Place {
            count: &self.count.0,
        })
    }
}

/// One of the `--max-in-flight` places, held while alive (see [`InFlight::take`]).
#[derive(Debug)]
pub struct Place<'a> {
    /// The bound's count, given back on drop.
    count: &'a AtomicUsize,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every `--max-in-flight` place was taken; the call was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("overloaded: {max_in_flight} requests already in flight (--max-in-flight); not queued")]
pub struct Overloaded {
    /// The configured bound.
    pub max_in_flight: usize,
}

#[cfg(test)]
mod tests;
