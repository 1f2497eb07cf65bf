//! Admitting connections on the gRPC and admin ports: a bounded number at once, the idle
//! ones making way for new ones when the bound is reached, each closed once it has been
//! silent too long or has not opened in time, and an accept loop that cannot spin.
//!
//! Place in the flow: between a bound `TcpListener` and the server that serves it. An
//! [`Admission`] accepts connections for tonic ([`Admission::into_stream`], plaintext gRPC),
//! for the TLS handshake ([`tls`]) and for axum (it is an [`axum::serve::Listener`]; serve it
//! with [`CountAdminCalls`]).
//!
//! - **At most `max_connections` at once per port; idle ones make way.** At the bound, a new
//!   connection closes the connection that has been idle longest (no call in flight; PINGs
//!   and other control frames do not count) and takes its place, counted in
//!   `floodgate_connections_evicted_total` (`listen/places.rs` says how idleness is known). Only when
//!   every connection has a call in flight is the new one closed at once (counted in
//!   `floodgate_connections_refused_total`, logged at most every [`LOG_EVERY`]): a client
//!   learns at once, rather than hanging in the kernel's backlog, and busy connections keep
//!   being served. Each port has its own bound, so connections on one never starve the
//!   other (`/healthcheck` stays reachable while the gRPC port is full).
//! - **A connection must open within the handshake timeout.** Until it has sent its opening
//!   (the HTTP/2 client preface on the gRPC port, TLS handshake included; the first request
//!   line on the admin ports: `listen/opening.rs`), a connection is closed `handshake_timeout`
//!   after it was accepted, however it trickles bytes (counted in
//!   `floodgate_connections_handshake_timeouts_total`).
//! - **Silent connections are closed.** A connection from which nothing has been read for
//!   `idle_timeout` is closed ([`Guarded`] fails its read, and hyper drops the connection).
//!   A live HTTP/2 peer is never silent that long: the gRPC server pings idle connections
//!   (`http2_keepalive_interval`) and every HTTP/2 peer must answer a PING.
//! - **Accept errors pause the loop.** Out of file descriptors (`EMFILE`), `accept` fails at
//!   once, again and again: the loop waits [`ACCEPT_ERROR_PAUSE`] after each failure and logs
//!   them at most every [`LOG_EVERY`], so it neither pins a core nor floods the log.
//!
//! [`raise_fd_limit`] lifts the soft limit on open files to the hard limit at start-up, so
//! the connection bounds, not the default 1,024 descriptors, are what applies.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use crate::metrics::{Metrics, Port};

pub mod bind;
mod calls;
mod opening;
mod places;
pub mod tls;

pub use calls::{CallsLayer, ConnectionCalls, CountAdminCalls, CountCalls, Counted, Made};
use opening::{Opening, Progress};
use places::{Activity, Place, Places, Taken};

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Refused connections and accept errors are logged at most this often (with a count).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// How connections on one port are bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; at the bound, the one idle longest makes way for a new one,
    /// and a new one is closed at once only when every one has a call in flight.
    pub max_connections: usize,
    /// A connection from which nothing was read for this long is closed.
    pub idle_timeout: Duration,
    /// A connection that has not sent its opening (HTTP/2 preface, TLS handshake included;
    /// HTTP/1 request line) this long after it was accepted is closed.
    pub handshake_timeout: Duration,
}

/// What every listener of one port shares: its bound on open connections (the gRPC port has
/// one listener per serving thread, [`crate::runtime`]) and its gauge.
#[derive(Clone, Debug)]
pub struct PortBound {
    limits: ConnectionLimits,
    places: Arc<Places>,
    port: Port,
    metrics: Arc<Metrics>,
    open: Gauge,
    /// One log line per [`LOG_EVERY`] for the whole port, whichever thread sees the event.
    refused_log: SharedThrottle,
    evicted_log: SharedThrottle,
    error_log: SharedThrottle,
}

impl PortBound {
    /// A bound of `limits` on `port`, counted in `metrics`.
    pub fn new(limits: ConnectionLimits, port: Port, metrics: Arc<Metrics>) -> PortBound {
        PortBound {
            limits,
            places: Arc::new(Places::new(limits.max_connections)),
            port,
            open: metrics.connections_open(port),
            metrics,
            refused_log: SharedThrottle::default(),
            evicted_log: SharedThrottle::default(),
            error_log: SharedThrottle::default(),
        }
    }

    /// Admits connections from `listener` within this bound (shared with every other
    /// listener admitted by it). Call it on the runtime that will serve `listener`.
    pub fn admit(&self, listener: TcpListener) -> Admission {
        Admission {
            listener,
            bound: self.clone(),
        }
    }

    /// What a client must send first on this port: gRPC is HTTP/2; the others are HTTP/1
    /// (whose server also takes HTTP/2 with prior knowledge, whose preface starts with a
    /// request line).
    fn opening(&self) -> Opening {
        match self.port {
            Port::Grpc => Opening::Http2Preface,
            Port::Http | Port::Prometheus | Port::Debug => Opening::RequestLine,
        }
    }
}

/// Accepts connections on one port within its [`ConnectionLimits`].
pub struct Admission {
    listener: TcpListener,
    bound: PortBound,
}

impl Admission {
    /// Admits connections from `listener` within `limits` of its own, counted under `port`.
    pub fn new(
        listener: TcpListener,
        limits: ConnectionLimits,
        port: Port,
        metrics: Arc<Metrics>,
    ) -> Admission {
        PortBound::new(limits, port, metrics).admit(listener)
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next admitted connection. Never fails: refused connections and accept errors are
    /// handled (counted, logged, paused after) here.
    pub async fn accept(&mut self) -> (Guarded<TcpStream>, SocketAddr) {
        let bound = &self.bound;
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    bound.metrics.record_accept_error(bound.port);
                    if let Some(count) = bound.error_log.tick() {
                        tracing::warn!(port = bound.port.label(), error = %e, count,
                            "cannot accept connections; pausing between attempts");
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let Some((place, taken)) = bound.places.take() else {
                // Closed at once: the client learns now, and no descriptor is held.
                drop(stream);
                bound.metrics.record_connection_refused(bound.port);
                if let Some(count) = bound.refused_log.tick() {
                    tracing::warn!(port = bound.port.label(), %peer, count,
                        max_connections = bound.limits.max_connections,
                        "connection limit reached and every connection busy; refusing new \
                         connections");
                }
                continue;
            };
            if taken == Taken::Evicted {
                bound.metrics.record_connection_evicted(bound.port);
                if let Some(count) = bound.evicted_log.tick() {
                    tracing::warn!(port = bound.port.label(), %peer, count,
                        max_connections = bound.limits.max_connections,
                        "connection limit reached; closing the longest-idle connections to \
                         admit new ones");
                }
            }
            // Envoy multiplexes many small requests on few connections: answer each at once.
            let _ = stream.set_nodelay(true);
            let guard = Guard::new(place, bound, Instant::now());
            return (
                Guarded {
                    inner: stream,
                    guard,
                },
                peer,
            );
        }
    }

    /// The admitted connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    /// Accepting stops (and the listener is closed) once the stream is dropped.
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = io::Result<Guarded<TcpStream>>> + Send {
        futures_util::stream::unfold(self, |mut admission| async move {
            let (stream, _) = admission.accept().await;
            Some((Ok(stream), admission))
        })
    }
}

/// The peer of an admin HTTP connection, for handlers that log who called them (axum
/// provides its `ConnectInfo` for its own `TcpListener` only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Admission>>
    for PeerAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Admission>) -> PeerAddr {
        PeerAddr(*stream.remote_addr())
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl axum::serve::Listener for Admission {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl Future<Output = (Self::Io, Self::Addr)> + Send {
        Admission::accept(self)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Admission::local_addr(self)
    }
}

/// An admitted connection: holds its place under the port's bound until dropped, and fails
/// its reads once it was told to make way for a new connection (and has answered the calls
/// it had in flight then: `listen/places.rs`), once it has not sent its
/// opening within the handshake timeout, or once nothing has been read for the idle timeout.
///
/// On a TLS port it wraps the TLS stream (the handshake runs on the bare socket under the
/// same place and deadline, [`tls`]), so that it sees the HTTP/2 preface in the clear.
///
/// Not the same job as [`Aged`](bind::Aged), though both fail a
/// connection's I/O on a timer: this one measures *silence* and the opening (every byte read
/// moves the silence deadline on), on connections of every TCP port, and owns the
/// connection's place under the port's bound; `Aged` measures *age* since accept, busy or
/// not, on gRPC connections only (unix sockets too, which have no bound). A gRPC TCP
/// connection carries both: `Aged` outside, this one inside.
pub struct Guarded<T> {
    inner: T,
    guard: Guard,
}

/// What an admitted connection holds besides the connection itself. Moves from the socket to
/// the TLS stream once the TLS handshake is done.
pub(crate) struct Guard {
    /// Its place under the port's bound, and its calls.
    place: Place,
    /// How far the connection is through its opening.
    opening: Progress,
    /// When the opening must be complete.
    opening_due: Instant,
    idle_timeout: Duration,
    /// When a byte was last read.
    last_read: Instant,
    /// Fires at the earliest moment a deadline may be over; moved on lazily (reads only
    /// record `last_read`), so a busy connection costs no timer updates.
    timer: Pin<Box<Sleep>>,
    /// Counted in `floodgate_connections_open` while the connection lives.
    open: Gauge,
    metrics: Arc<Metrics>,
    port: Port,
}

/// Why a connection is closed by its [`Guard`].
enum Close {
    /// It was told to make way for a new connection.
    Evicted,
    /// It did not send its opening in time.
    NoOpening,
    /// Nothing was read from it for the idle timeout.
    Silent,
}

impl Guard {
    fn new(place: Place, bound: &PortBound, now: Instant) -> Guard {
        let limits = bound.limits;
        bound.open.inc();
        let opening_due = now + limits.handshake_timeout;
        Guard {
            place,
            opening: Progress::new(bound.opening()),
            opening_due,
            idle_timeout: limits.idle_timeout,
            last_read: now,
            timer: Box::pin(tokio::time::sleep_until(
                opening_due.min(now + limits.idle_timeout),
            )),
            open: bound.open.clone(),
            metrics: bound.metrics.clone(),
            port: bound.port,
        }
    }

    /// The connection's calls, and whether it was told to close.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        self.place.activity()
    }

    /// When the connection must have sent its opening.
    pub(crate) fn opening_due(&self) -> Instant {
        self.opening_due
    }

    /// Counts a connection closed for not opening in time (a TLS handshake not done).
    pub(crate) fn record_handshake_timeout(&self) {
        self.metrics.record_handshake_timeout(self.port);
    }

    /// Records bytes just read.
    fn read(&mut self, bytes: &[u8]) {
        self.last_read = Instant::now();
        if !self.opening.is_done() {
            self.opening.advance(bytes);
        }
    }

    /// The earliest moment a deadline can be over, as far as is known now.
    fn due(&self) -> Instant {
        let silent = self.last_read + self.idle_timeout;
        if self.opening.is_done() {
            silent
        } else {
            silent.min(self.opening_due)
        }
    }

    /// Why the connection must close now, if it must; otherwise `cx` is woken when it may.
    /// Re-arms the timer when it fired early (something was read since it was set).
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Option<Close> {
        if self.activity().poll_closing(cx).is_ready() {
            return Some(Close::Evicted);
        }
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return None;
            }
            let now = Instant::now();
            let due = self.due();
            if due <= now {
                return Some(if self.opening.is_done() || self.opening_due > now {
                    Close::Silent
                } else {
                    Close::NoOpening
                });
            }
            self.timer.as_mut().reset(due);
        }
    }

    /// Counts and logs a close; the error the read fails with.
    fn close(&self, close: Close) -> io::Error {
        let port = self.port.label();
        let (kind, message) = match close {
            Close::Evicted => {
                tracing::debug!(port, "closing an idle connection to admit a new one");
                (
                    io::ErrorKind::ConnectionAborted,
                    "connection closed to admit a new one (connection limit reached)",
                )
            }
            Close::NoOpening => {
                self.record_handshake_timeout();
                tracing::debug!(port, "closing a connection that did not open in time");
                (
                    io::ErrorKind::TimedOut,
                    "connection did not send its opening within the handshake timeout",
                )
            }
            Close::Silent => {
                self.metrics.record_idle_close(self.port);
                tracing::debug!(port, timeout = ?self.idle_timeout,
                    "closing a silent connection");
                (
                    io::ErrorKind::TimedOut,
                    "connection silent for the idle timeout",
                )
            }
        };
        io::Error::new(kind, message)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<T> Guarded<T> {
    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The connection's calls, and whether it was told to close.
    pub(crate) fn activity(&self) -> &Arc<Activity> {
        self.guard.activity()
    }

    /// The connection and its guard, to run a handshake on the bare connection.
    pub(crate) fn into_parts(self) -> (T, Guard) {
        (self.inner, self.guard)
    }

    /// `inner` (what the handshake made of the connection) under `guard`; its silence counts
    /// from now, the handshake having just read from it.
    pub(crate) fn from_parts(inner: T, mut guard: Guard) -> Guarded<T> {
        guard.last_read = Instant::now();
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
        // Checked first too: a peer that keeps sending (PINGs) would otherwise keep reads
        // ready and never see the eviction.
        if this.guard.activity().must_close() {
            return Poll::Ready(Err(this.guard.close(Close::Evicted)));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    this.guard.read(read);
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
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if let Poll::Ready(Ok(())) = flushed {
            this.guard.activity().flushed();
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What tonic puts in every request's extensions for a guarded connection: the connection's
/// own information (peer address; TLS certificates) and its calls, which [`CallsLayer`]
/// counts.
#[derive(Clone, Debug)]
pub struct GuardedInfo<I> {
    /// The underlying connection's information.
    pub inner: I,
    activity: Arc<Activity>,
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<T> {
    type ConnectInfo = GuardedInfo<T::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        GuardedInfo {
            inner: self.inner.connect_info(),
            activity: self.activity().clone(),
        }
    }
}

/// A [`Throttle`] shared by the listeners of one port.
#[derive(Clone, Debug, Default)]
struct SharedThrottle(Arc<std::sync::Mutex<Throttle>>);

impl SharedThrottle {
    /// [`Throttle::tick`], under the lock (a poisoned lock still counts: it guards two numbers).
    fn tick(&self) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .tick()
    }
}

/// Lets a repeated event be logged at most every [`LOG_EVERY`], with how often it happened.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    /// Counts one event; `Some(count since the last log line)` when it is time to log.
    fn tick(&mut self) -> Option<u64> {
        self.tick_at(Instant::now())
    }

    fn tick_at(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        match self.last {
            Some(last) if now.duration_since(last) < LOG_EVERY => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.count))
            }
        }
    }
}

/// Raises the soft limit on open files to the hard limit; returns the limit now in force
/// (`None` if it cannot be read). The default soft limit (often 1,024) would otherwise run
/// out before the connection bounds apply.
pub fn raise_fd_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guarded(bound: &PortBound) -> (Guarded<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (place, _) = bound.places.take().unwrap();
        let (client, server) = tokio::io::duplex(64);
        let guard = Guard::new(place, bound, Instant::now());
        (
            Guarded {
                inner: server,
                guard,
            },
            client,
        )
    }

    /// A read pending on an idle connection fails as soon as a new connection takes its
    /// place, with no traffic and no timer; a connection with a call in flight is never
    /// chosen, so the new one is refused.
    #[tokio::test]
    async fn an_evicted_connection_fails_its_pending_read() {
        use tokio::io::AsyncReadExt;
        let limits = ConnectionLimits {
            max_connections: 1,
            idle_timeout: Duration::from_secs(600),
            handshake_timeout: Duration::from_secs(600),
        };
        let bound = PortBound::new(limits, Port::Grpc, Metrics::shared());
        let (mut idle, _client) = guarded(&bound);
        let read = tokio::spawn(async move { idle.read(&mut [0; 1]).await });
        // The single-threaded test runtime runs the read until it is pending.
        tokio::task::yield_now().await;
        assert!(!read.is_finished());
        let (busy, _client) = guarded(&bound);
        let read = tokio::time::timeout(Duration::from_secs(10), read).await;
        let error = read.expect("the read was not woken").unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        let _call = busy.activity().begin_call();
        assert!(bound.places.take().is_none());
    }

    /// A call that starts on a connection just chosen to make way (hyper read its HEADERS
    /// before the eviction) is not cut: reads go on until the call has ended and its answer
    /// has been flushed, and only then fail.
    #[tokio::test]
    async fn a_call_racing_its_eviction_is_answered_before_the_close() {
        use futures_util::FutureExt;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = ConnectionLimits {
            max_connections: 1,
            idle_timeout: Duration::from_secs(600),
            handshake_timeout: Duration::from_secs(600),
        };
        let bound = PortBound::new(limits, Port::Http, Metrics::shared());
        let (mut raced, mut client) = guarded(&bound);
        let (_newcomer, taken) = bound.places.take().unwrap();
        assert_eq!(taken, Taken::Evicted);
        let call = raced.activity().begin_call();
        // The rest of the call's request still reaches it.
        client.write_all(b"body").await.unwrap();
        let mut buf = [0; 4];
        raced.read_exact(&mut buf).await.unwrap();
        drop(call);
        // Answered but not flushed: the read waits rather than failing.
        raced.write_all(b"answer").await.unwrap();
        assert!(raced.read(&mut buf).now_or_never().is_none());
        raced.flush().await.unwrap();
        let error = tokio::time::timeout(Duration::from_secs(10), raced.read(&mut buf))
            .await
            .expect("the read was not woken")
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
        let mut answer = [0; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
    }

    /// A repeated event is logged once, then again only after LOG_EVERY, with its count.
    #[test]
    fn throttle_logs_once_per_period_with_a_count() {
        let start = Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.tick_at(start), Some(1));
        assert_eq!(throttle.tick_at(start + Duration::from_secs(1)), None);
        assert_eq!(throttle.tick_at(start + Duration::from_secs(2)), None);
        assert_eq!(throttle.tick_at(start + LOG_EVERY), Some(3));
        assert_eq!(throttle.tick_at(start + LOG_EVERY), None);
    }
}
