//! The replica-wide budget on request bytes in flight (`--max-in-flight-bytes`).
//!
//! `--max-in-flight` bounds how many calls are open, `--grpc-max-message-bytes` how large one
//! message may be; their product is what bodies could hold at worst, far beyond a pod's
//! memory once the message cap fits what Envoy builds from 60 KiB headers. So bytes are
//! charged against one shared count as they arrive, DATA frame by DATA frame
//! ([`ChargedBody`]): a call whose body would take the count over the budget fails with
//! `RESOURCE_EXHAUSTED` at once, and no other call waits for it.
//!
//! What a charge covers: the bytes of a message still arriving (tonic buffers them until the
//! message is whole) are held by the body; once a message is whole and tonic asks for more,
//! its bytes are given back. A ShouldRateLimit request's decoded entries are slices of that
//! same buffer, so its call charges the decoded request again ([`Held::charge`]) until
//! its answer is ready. A stream that ends, or is cancelled, gives back all it holds.

use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use hyper::body::{Body, Buf, Frame, SizeHint};
use tonic::Status;
use tonic::codegen::{Bytes, StdError};

/// Request bytes in flight on this replica, bounded. Shared by every serving thread.
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicUsize,
    max: usize,
}

impl BodyBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            used: AtomicUsize::new(0),
            max,
        })
    }

    /// The bytes charged now (for tests and diagnostics).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// Charges `bytes`, or refuses (charging nothing) when they would take the count over
    /// the budget. One compare-and-swap: a refused charge never shows in the count, so it
    /// cannot make a concurrent charge that fits look over the budget.
    fn charge(&self, bytes: usize) -> Result<(), Status> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|after| *after <= self.max)
            })
            .map(|_| ())
            .map_err(|_| self.refusal())
    }

    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Charges `bytes` until the returned guard is dropped, or refuses at once.
    pub fn hold(self: &Arc<BodyBudget>, bytes: usize) -> Result<Held, Status> {
        Held::charge(Arc::clone(self), bytes)
    }

    /// What a call over the budget is answered: RESOURCE_EXHAUSTED, as for `--max-in-flight`,
    /// so Envoy's `failure_mode_deny` decides.
    fn refusal(&self) -> Status {
        Status::resource_exhausted(format!(
            "overloaded: request bytes in flight would exceed --max-in-flight-bytes ({}); \
             not queued",
            self.max
        ))
    }
}

/// Bytes charged to a [`BodyBudget`] until dropped, through `H`: an `Arc`, a reference, or
/// any handle that reaches the budget (a serving thread's own: `service::grpc`).
#[derive(Debug)]
pub struct Held<H: Deref<Target = BodyBudget> = Arc<BodyBudget>> {
    budget: H,
    bytes: usize,
}

impl<H: Deref<Target = BodyBudget>> Held<H> {
    /// Charges `bytes` to the budget `budget` reaches until the guard is dropped, or refuses
    /// at once (charging nothing).
    pub fn charge(budget: H, bytes: usize) -> Result<Held<H>, Status> {
        budget.charge(bytes)?;
        Ok(Held { budget, bytes })
    }
}

impl<H: Deref<Target = BodyBudget>> Drop for Held<H> {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// A request body whose DATA frames are charged to a [`BodyBudget`] as they arrive (see the
/// module's documentation), reached through `H` (as [`Held`]). Its error is a [`Status`],
/// which tonic answers as it is.
#[derive(Debug)]
pub struct ChargedBody<B, H: Deref<Target = BodyBudget> = Arc<BodyBudget>> {
    inner: B,
    budget: H,
    /// Bytes charged and not yet given back.
    charged: usize,
    /// Of those, the bytes of messages already whole, given back at the next poll.
    whole: usize,
    framing: Framing,
}

impl<B, H: Deref<Target = BodyBudget>> ChargedBody<B, H> {
    /// `inner`, charged to `budget`.
    pub fn new(inner: B, budget: H) -> ChargedBody<B, H> {
        ChargedBody {
            inner,
            budget,
            charged: 0,
            whole: 0,
            framing: Framing::default(),
        }
    }
}

impl<B, H: Deref<Target = BodyBudget>> Drop for ChargedBody<B, H> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

impl<B, H> Body for ChargedBody<B, H>
where
    H: Deref<Target = BodyBudget> + Unpin,
    // Request bodies of the HTTP/2 server are `Unpin`; requiring it keeps this wrapper free
    // of a box or a pin projection.
    B: Body + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        // Asked for more, the decoder is done with the messages it had whole.
        if this.whole > 0 {
            this.budget.release(this.whole);
            this.charged -= this.whole;
            this.whole = 0;
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Ready(Some(Err(error))) => {
                return Poll::Ready(Some(Err(Status::from_error(error.into()))));
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let frame = frame.map_data(|mut data| data.copy_to_bytes(data.remaining()));
        if let Some(data) = frame.data_ref() {
            this.budget.charge(data.len())?;
            this.charged += data.len();
            this.whole += this.framing.feed(data);
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a request body stands in gRPC's length-prefixed messages (a flag byte, a 4-byte
/// big-endian length, the message), so that the bytes of whole messages can be told apart.
#[derive(Debug, Default)]
struct Framing {
    /// Header bytes seen of the current message (0 to 5).
    header: u8,
    /// The current message's length, as read so far from its header.
    length: usize,
    /// Message bytes still to come once the header is whole.
    left: usize,
    /// Bytes of the current message seen so far, its header included.
    current: usize,
}

impl Framing {
    /// Reads `data`; answers the bytes of the messages it completed (their earlier parts
    /// included).
    fn feed(&mut self, mut data: &[u8]) -> usize {
        let mut whole = 0;
        while let Some((&byte, rest)) = data.split_first() {
            if self.header < 5 {
                if self.header > 0 {
                    self.length = (self.length << 8) | usize::from(byte);
                }
                self.header += 1;
                self.current += 1;
                data = rest;
                if self.header == 5 {
                    self.left = std::mem::take(&mut self.length);
                }
            } else {
                let take = self.left.min(data.len());
                self.left -= take;
                self.current += take;
                data = &data[take..];
            }
            if self.header == 5 && self.left == 0 {
                whole += std::mem::take(&mut self.current);
                self.header = 0;
            }
        }
        whole
    }
}

#[cfg(test)]
mod tests;
