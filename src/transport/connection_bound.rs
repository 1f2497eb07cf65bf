//! The connection bound of one port: how many connections are open (at most the port's bound), which of
//! them have a call in flight, and, when every place is taken, which connection has been idle
//! longest, so that it can be closed to admit the new one.
//!
//! Place in the flow: [`super::Acceptor`] takes a [`Place`] for every accepted connection
//! ([`ConnectionBound::take`]); the connection's [`super::Guarded`] holds it until the connection is
//! dropped. The HTTP layers above count each call on the place's [`Activity`]
//! ([`super::calls`]): a gRPC stream from its HEADERS until its response, an admin request
//! until its response.
//!
//! **Idle means no call in flight.** Bytes read say nothing about it: an attacker's
//! connection answers PINGs and sends SETTINGS or PINGs of its own, all control frames that
//! never open a stream. What the connection layer cannot see from the bytes (they may be
//! encrypted, and HTTP/2 frames interleave), the service layer knows exactly: a call exists
//! from the moment hyper hands it to the service. So each [`Activity`] counts its calls, and
//! records when the last one ended (or, if there never was one, when the connection was
//! accepted): that is how long it has been idle.
//!
//! **Full port: the longest-idle connection makes way.** An attacker who opens and keeps
//! `max_connections` idle connections would otherwise lock out every new client for as long
//! as he likes. Instead, a new connection at the bound closes the connection idle the longest
//! (its next read fails, and hyper drops it) and takes its place at once. Only when every
//! connection has a call in flight is the new one refused: a busy connection is
//! never cut. An idle Envoy connection that is closed this way costs Envoy a reconnect on its
//! next call, not a failed call.
//!
//! **A call that races the eviction is still answered.** hyper may have read a call's
//! HEADERS just before the connection was chosen and hand it to the service just after:
//! failing the next read then would reset that call. So an evicted connection closes only
//! once it has no call in flight and every answer given since the eviction has been flushed
//! ([`ANSWERED`]); until then it reads and writes as usual.
//!
//! Finding the longest-idle connection scans the port's connections (a few µs for the
//! default 1,000) under a lock; it happens only when the port is full. Taking and freeing a
//! place is an atomic counter plus one short lock to list the connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::task::AtomicWaker;

/// Set in [`Activity::calls`] once the connection has been chosen to make way.
const EVICTED: u32 = 1 << 31;
/// Set in [`Activity::calls`] when a call ends on an evicted connection, until the connection
/// is next flushed: its answer may still sit in hyper's buffers, and closing now would lose it.
const ANSWERED: u32 = 1 << 30;
/// The bits of [`Activity::calls`] that are not the count.
const FLAGS: u32 = EVICTED | ANSWERED;

/// The places of one port (shared by all its listeners).
#[derive(Debug)]
pub(crate) struct ConnectionBound {
    /// Connections open at once.
    max: usize,
    /// Places taken: connections open, less those evicted (an evicted connection's place
    /// passed to the connection that evicted it while it closes).
    taken: AtomicUsize,
    /// The id of the next connection.
    next_id: AtomicU64,
    /// Where idle times are measured from.
    epoch: Instant,
    /// Every connection holding a place, by id.
    open: Mutex<HashMap<u64, Arc<Activity>>>,
}

/// How a place was taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// A place was free.
    Free,
    /// The port was full: the connection idle longest was told to close, and its place
    /// passed on.
    Evicted,
}

impl ConnectionBound {
    /// At most `max` (at least one) connections at once.
    pub(crate) fn new(max: usize) -> ConnectionBound {
        ConnectionBound {
            max: max.max(1),
            taken: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A place for a new connection: a free one, else the place of the connection idle
    /// longest (which is told to close); `None` when every connection has a call in flight.
    pub(crate) fn take(self: &Arc<ConnectionBound>) -> Option<(Place, Taken)> {
        let taken = if self.take_free() {
            Taken::Free
        } else if self.evict_longest_idle() {
            Taken::Evicted
        } else if self.take_free() {
            // Freed while every connection looked busy.
            Taken::Free
        } else {
            return None;
        };
        let activity = Arc::new(Activity {
            calls: AtomicU32::new(0),
            idle_since: AtomicU64::new(self.now()),
            epoch: self.epoch,
            closing: AtomicWaker::new(),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, activity.clone());
        let place = Place {
            bound: self.clone(),
            id,
            activity,
        };
        Some((place, taken))
    }

    /// Takes a free place, if there is one.
    fn take_free(&self) -> bool {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Tells the connection idle longest to close; false if every one has a call in flight.
    fn evict_longest_idle(&self) -> bool {
        let open = self.lock();
        // A connection that starts a call between the scan and the claim is not evicted (the
        // claim fails): scan again, a few times at most.
        for _ in 0..4 {
            let longest = open
                .iter()
                .filter(|(_, activity)| activity.calls.load(Ordering::Acquire) == 0)
                .min_by_key(|(id, activity)| (activity.idle_since.load(Ordering::Relaxed), **id));
            let Some((_, activity)) = longest else {
                return false;
            };
            if activity
                .calls
                .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                activity.closing.wake();
                return true;
            }
        }
        false
    }

    /// Microseconds since `epoch`.
    fn now(&self) -> u64 {
        micros_since(self.epoch)
    }

    /// The open connections (a poisoned lock still holds a usable map: each change to it is
    /// one insert or remove).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn micros_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// One connection's place under its port's bound; freed when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    bound: Arc<ConnectionBound>,
    id: u64,
    activity: Arc<Activity>,
}

impl Place {
    /// The connection's calls, and whether it was told to close.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.bound.lock().remove(&self.id);
        // An evicted connection's place already belongs to the one that evicted it.
        if !self.activity.is_evicted() {
            self.bound.taken.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The calls in flight on one connection, and whether it was told to close.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Calls in flight, plus [`EVICTED`] once the connection was chosen to make way, plus
    /// [`ANSWERED`] while an answer given since then may not be flushed yet.
    calls: AtomicU32,
    /// When the last call ended, or the connection was accepted: µs since `epoch`.
    idle_since: AtomicU64,
    epoch: Instant,
    /// Woken when the connection is evicted, and when it may close after that (its last call
    /// ended; its answers were flushed).
    closing: AtomicWaker,
}

impl Activity {
    /// Counts a call in flight until the guard is dropped.
    pub(crate) fn begin_call(self: &Arc<Activity>) -> Call {
        self.calls.fetch_add(1, Ordering::AcqRel);
        Call(self.clone())
    }

    /// Whether the connection was told to close to make way for another.
    pub(crate) fn is_evicted(&self) -> bool {
        self.calls.load(Ordering::Acquire) & EVICTED != 0
    }

    /// Whether the connection must close now: it was evicted, has no call in flight, and
    /// every answer given since was flushed.
    pub(crate) fn must_close(&self) -> bool {
        self.calls.load(Ordering::Acquire) == EVICTED
    }

    /// Ready once the connection must close ([`Activity::must_close`]); until then, `cx` is
    /// woken when it may.
    pub(crate) fn poll_closing(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.must_close() {
            return Poll::Ready(());
        }
        self.closing.register(cx.waker());
        // Closing between the check and the registration: its wake-up may have been missed.
        if self.must_close() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Completes once the connection must close.
    pub(crate) async fn closing(&self) {
        std::future::poll_fn(|cx| self.poll_closing(cx)).await;
    }

    /// Records that what was written to the connection has been flushed: the answers of calls
    /// that ended on it since its eviction are on their way, so it may close.
    pub(crate) fn flushed(&self) {
        // One load on every flush of a connection that was not evicted.
        if self.calls.load(Ordering::Acquire) & ANSWERED != 0
            && self.calls.fetch_and(!ANSWERED, Ordering::AcqRel) & !ANSWERED == EVICTED
        {
            self.closing.wake();
        }
    }
}

/// One call in flight on a connection (see [`Activity::begin_call`]).
#[derive(Debug)]
pub(crate) struct Call(Arc<Activity>);

impl Drop for Call {
    fn drop(&mut self) {
        let activity = &self.0;
        // One atomic step, so the connection is never seen with no call and no answer pending
        // between this call's end and its answer's flush.
        let ended = |n: u32| {
            let n = n.wrapping_sub(1);
            Some(if n & EVICTED != 0 { n | ANSWERED } else { n })
        };
        let Ok(before) = activity
            .calls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, ended)
        else {
            return;
        };
        if before & !FLAGS == 1 {
            // The last call ended: the connection is idle from now.
            activity
                .idle_since
                .store(micros_since(activity.epoch), Ordering::Relaxed);
        }
        if before & EVICTED != 0 {
            // A pending read waits on the flush now, not on this call.
            activity.closing.wake();
        }
    }
}

#[cfg(test)]
mod tests;
