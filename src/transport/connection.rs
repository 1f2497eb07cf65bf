//! One connection's wrapper, [`Guarded`]: it holds the connection's place under its port's
//! bound and fails the connection's reads when the connection must close: told to make way
//! for a new one, not opened within the handshake timeout, silent for the idle timeout, or
//! (gRPC only) past its maximum age and grace.
//!
//! Place in the flow: an [`Acceptor`](super::Acceptor) wraps each connection it accepts; a
//! unix socket's connections are wrapped too ([`Guarded::unbounded`]), for the age cut only.
//! hyper reads and writes through it.
//!
//! **One timer per connection.** Every deadline lives in one `Sleep`, armed at the earliest
//! of them and moved on lazily: a read only records when it happened, and the timer, when it
//! fires early, is re-armed to the deadline then due. So a busy connection costs no timer
//! updates, and a read costs one clock reading.
//!
//! **The age cut.** tonic sends HTTP/2 `GOAWAY` once a connection reaches its maximum age,
//! and the client then finishes its calls and moves to a new connection. What tonic cannot do
//! together with that is the grace (`GRPC_MAX_CONNECTION_AGE_GRACE`): its own grace option
//! replaces the GOAWAY by a hard close. So the grace is enforced here, below HTTP/2: after
//! age + grace ([`Guarded::cut_after`]) the connection's reads and writes fail, however busy
//! it is, and the server drops it. When an age cut and another deadline are over together,
//! the age cut is the reason given (and the other is not counted).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::PortBound;
use super::connection_bound::{Activity, Place};
use super::metrics::{Port, TransportMetrics};
use super::opening::Progress;

/// A connection under its port's bound and deadlines: holds its place until dropped, and
/// fails its reads once it was told to make way for a new connection (and has answered the
/// calls it had in flight then: `transport/connection_bound.rs`), once it has not sent its opening
/// within the handshake timeout, once nothing has been read for the idle timeout, or once it
/// outlived its maximum age and grace ([`Guarded::cut_after`]; then its writes fail too).
///
/// On a TLS port it wraps the TLS stream (the handshake runs on the bare socket under the
/// same place and deadline, [`super::tls`]), so that it sees the HTTP/2 preface in the clear.
pub struct Guarded<T> {
    inner: T,
    guard: Guard,
}

/// What a connection holds besides the connection itself. Moves from the socket to the TLS
/// stream once the TLS handshake is done.
pub(crate) struct Guard {
    /// Its place under the port's bound and the deadlines that come with it; none on a unix
    /// socket, which has no bound.
    bounded: Option<Bounded>,
    /// When the connection is cut however busy (its maximum age and grace are over).
    cut_at: Option<Instant>,
    /// Whether it was cut: its writes fail too from then on.
    cut: bool,
    /// Fires at the earliest moment a deadline may be over (none: no deadline at all).
    timer: Option<Pin<Box<Sleep>>>,
}

/// A connection's place under its port's bound, and the deadlines of that port.
struct Bounded {
    /// Its place, and its calls.
    place: Place,
    /// How far the connection is through its opening.
    opening: Progress,
    /// When the opening must be complete.
    opening_due: Instant,
    idle_timeout: Duration,
    /// When a byte was last read.
    last_read: Instant,
    /// Counted in `floodgate_connections_open` while the connection lives.
    open: Gauge,
    metrics: TransportMetrics,
    port: Port,
}

/// Why a connection is closed by its [`Guard`].
enum Close {
    /// It outlived its maximum age and grace.
    Aged,
    /// It was told to make way for a new connection.
    Evicted,
    /// It did not send its opening in time.
    NoOpening,
    /// Nothing was read from it for the idle timeout.
    Silent,
}

/// Why a TLS handshake was given up ([`Guard::opening`]).
pub(crate) enum Abandoned {
    /// The connection was told to make way for a new one.
    Evicted,
    /// The handshake timeout is over.
    TimedOut,
}

impl Bounded {
    /// The earliest moment a deadline can be over, as far as is known now.
    fn due(&self) -> Instant {
        let silent = self.last_read + self.idle_timeout;
        if self.opening.is_done() {
            silent
        } else {
            silent.min(self.opening_due)
        }
    }

    /// Which deadline is over at `now`, if one is.
    fn overdue(&self, now: Instant) -> Option<Close> {
        if self.due() > now {
            None
        } else if self.opening.is_done() || self.opening_due > now {
            Some(Close::Silent)
        } else {
            Some(Close::NoOpening)
        }
    }
}

impl Guard {
    /// The guard of a connection accepted at `now` into `place` under `bound`.
    pub(crate) fn new(place: Place, bound: &PortBound, now: Instant) -> Guard {
        let limits = bound.limits;
        bound.open.inc();
        let opening_due = now + limits.handshake_timeout;
        let bounded = Bounded {
            place,
            opening: Progress::new(bound.opening()),
            opening_due,
            idle_timeout: limits.idle_timeout,
            last_read: now,
            open: bound.open.clone(),
            metrics: bound.metrics.clone(),
            port: bound.port,
        };
        Guard {
            timer: Some(Box::pin(tokio::time::sleep_until(bounded.due()))),
            bounded: Some(bounded),
            cut_at: None,
            cut: false,
        }
    }

    /// The connection's calls, and whether it was told to close (none: it has no bound).
    pub(crate) fn activity(&self) -> Option<&Arc<Activity>> {
        self.bounded
            .as_ref()
            .map(|bounded| bounded.place.activity())
    }

    /// Runs `handshake` (TLS's, on the bare connection) within the connection's opening
    /// deadline, unless the connection is told to make way for a new one meanwhile. A
    /// handshake timeout is counted here.
    pub(crate) async fn opening<F: Future>(&self, handshake: F) -> Result<F::Output, Abandoned> {
        let Some(bounded) = &self.bounded else {
            return Ok(handshake.await);
        };
        tokio::select! {
            done = tokio::time::timeout_at(bounded.opening_due, handshake) => {
                done.map_err(|_| {
                    bounded.metrics.record_handshake_timeout(bounded.port);
                    Abandoned::TimedOut
                })
            }
            () = bounded.place.activity().closing() => Err(Abandoned::Evicted),
        }
    }

    /// Records bytes just read; the age cut, if it is over.
    fn read(&mut self, bytes: &[u8]) -> Option<Close> {
        // One clock reading per read, and none on a connection with no deadline.
        let now = match (&mut self.bounded, self.cut_at) {
            (None, None) => return None,
            (Some(bounded), _) => {
                let now = Instant::now();
                bounded.last_read = now;
                if !bounded.opening.is_done() {
                    bounded.opening.advance(bytes);
                }
                now
            }
            (None, Some(_)) => Instant::now(),
        };
        self.overdue_cut(now)
    }

    /// The age cut, if it is over at `now`.
    fn overdue_cut(&self, now: Instant) -> Option<Close> {
        self.cut_at
            .is_some_and(|cut_at| cut_at <= now)
            .then_some(Close::Aged)
    }

    /// The earliest moment a deadline can be over, as far as is known now.
    fn due(&self) -> Option<Instant> {
        let bounded = self.bounded.as_ref().map(Bounded::due);
        match (bounded, self.cut_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Arms the timer for `due`, or earlier if it is set to fire earlier already.
    fn arm(&mut self, due: Instant) {
        match &mut self.timer {
            Some(timer) if timer.deadline() <= due => {}
            Some(timer) => timer.as_mut().reset(due),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(due))),
        }
    }

    /// Why the connection must close now, if it must; otherwise `cx` is woken when it may.
    /// Re-arms the timer when it fired early (something was read since it was set).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Option<Close> {
        if let Some(activity) = self.activity()
            && activity.poll_closing(cx).is_ready()
        {
            return Some(Close::Evicted);
        }
        loop {
            let timer = self.timer.as_mut()?;
            if timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            let now = Instant::now();
            // The age cut first: it is the one that fails writes too.
            if let Some(close) = self
                .overdue_cut(now)
                .or_else(|| self.bounded.as_ref()?.overdue(now))
            {
                return Some(close);
            }
            let due = self.due()?;
            self.timer.as_mut()?.as_mut().reset(due);
        }
    }

    /// Counts and logs a close; the error the read fails with.
    fn close(&mut self, close: Close) -> io::Error {
        let port = self.bounded.as_ref().map_or("grpc", |b| b.port.label());
        let (kind, message) = match close {
            Close::Aged => {
                self.cut = true;
                return cut();
            }
            Close::Evicted => {
                tracing::debug!(port, "closing an idle connection to admit a new one");
                (
                    io::ErrorKind::ConnectionAborted,
                    "connection closed to admit a new one (connection limit reached)",
                )
            }
            Close::NoOpening => {
                if let Some(bounded) = &self.bounded {
                    bounded.metrics.record_handshake_timeout(bounded.port);
                }
                tracing::debug!(port, "closing a connection that did not open in time");
                (
                    io::ErrorKind::TimedOut,
                    "connection did not send its opening within the handshake timeout",
                )
            }
            Close::Silent => {
                if let Some(bounded) = &self.bounded {
                    bounded.metrics.record_idle_close(bounded.port);
                    tracing::debug!(port, timeout = ?bounded.idle_timeout,
                        "closing a silent connection");
                }
                (
                    io::ErrorKind::TimedOut,
                    "connection silent for the idle timeout",
                )
            }
        };
        io::Error::new(kind, message)
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// The error a connection's I/O fails with once it was cut for its age.
fn cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "gRPC connection outlived its maximum age and grace",
    )
}

impl<T> Guarded<T> {
    /// `inner` accepted under `guard`.
    pub(crate) fn new(inner: T, guard: Guard) -> Guarded<T> {
        Guarded { inner, guard }
    }

    /// A connection with no bound and no deadline but the age cut, if
    /// [`cut_after`](Guarded::cut_after) sets one: a unix socket's.
    pub fn unbounded(inner: T) -> Guarded<T> {
        Guarded {
            inner,
            guard: Guard {
                bounded: None,
                cut_at: None,
                cut: false,
                timer: None,
            },
        }
    }

    /// Cuts the connection once `lifetime` has passed from now (none: never): its reads and
    /// writes fail then, however busy it is.
    pub fn cut_after(mut self, lifetime: Option<Duration>) -> Guarded<T> {
        if let Some(lifetime) = lifetime {
            let cut_at = Instant::now() + lifetime;
            self.guard.cut_at = Some(cut_at);
            self.guard.arm(cut_at);
        }
        self
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The connection's calls, and whether it was told to close (none: it has no bound).
    pub(crate) fn activity(&self) -> Option<&Arc<Activity>> {
        self.guard.activity()
    }

    /// The connection and its guard, to run a handshake on the bare connection.
    pub(crate) fn into_parts(self) -> (T, Guard) {
        (self.inner, self.guard)
    }

    /// `inner` (what the handshake made of the connection) under `guard`; its silence counts
    /// from now, the handshake having just read from it.
    pub(crate) fn from_parts(inner: T, mut guard: Guard) -> Guarded<T> {
        if let Some(bounded) = &mut guard.bounded {
            bounded.last_read = Instant::now();
        }
        Guarded { inner, guard }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.guard.cut {
            return Poll::Ready(Err(cut()));
        }
        // Checked first too: a peer that keeps sending (PINGs) would otherwise keep reads
        // ready and never see the eviction.
        if this.guard.activity().is_some_and(|a| a.must_close()) {
            return Poll::Ready(Err(this.guard.close(Close::Evicted)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                // The age cut is seen here too: a peer that keeps sending keeps reads ready.
                if !read.is_empty()
                    && let Some(close) = this.guard.read(read)
                {
                    return Poll::Ready(Err(this.guard.close(close)));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.guard.poll_close(cx) {
                Some(close) => Poll::Ready(Err(this.guard.close(close))),
                None => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.guard.cut {
            return Poll::Ready(Err(cut()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.guard.cut {
            return Poll::Ready(Err(cut()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed
            && let Some(activity) = this.guard.activity()
        {
            activity.flushed();
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What tonic puts in every request's extensions for a guarded connection: the connection's
/// own information (peer address; TLS certificates) and its calls, which
/// [`CallsLayer`](super::CallsLayer) counts.
#[derive(Clone, Debug)]
pub struct GuardedInfo<I> {
    /// The underlying connection's information.
    pub inner: I,
    /// Its calls; none on a connection with no bound (a unix socket's).
    pub(crate) activity: Option<Arc<Activity>>,
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<T> {
    type ConnectInfo = GuardedInfo<T::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        GuardedInfo {
            inner: self.inner.connect_info(),
            activity: self.activity().cloned(),
        }
    }
}

#[cfg(test)]
mod tests;
