//! Admitting connections on the gRPC and admin ports: a bounded number at once, each closed
//! once it has been silent too long, and an accept loop that cannot spin.
//!
//! Place in the flow: between a bound `TcpListener` and the server that serves it. An
//! [`Admission`] accepts connections for tonic ([`Admission::into_stream`], plaintext gRPC),
//! for the TLS handshake ([`tls`]) and for axum (it is an [`axum::serve::Listener`]).
//!
//! - **At most `max_connections` at once per port.** One more is accepted and closed at
//!   once (counted in `floodgate_connections_refused_total`, logged at most every
//!   [`LOG_EVERY`]): a client learns at once, rather than hanging in the kernel's backlog,
//!   and the connections already open keep being served. Each port has its own bound, so
//!   idle connections on one never starve the other (`/healthcheck` stays reachable while
//!   the gRPC port is full).
//! - **Silent connections are closed.** A connection from which nothing has been read for
//!   `idle_timeout` is closed ([`Guarded`] fails its read, and hyper drops the connection):
//!   an idle TCP connection, a half-sent HTTP/2 preface, a partial HTTP/1 request line.
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::metrics::{Metrics, Port};

pub mod tls;

/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Refused connections and accept errors are logged at most this often (with a count).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// How connections on one port are bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed at once.
    pub max_connections: usize,
    /// A connection from which nothing was read for this long is closed.
    pub idle_timeout: Duration,
}

/// What every listener of one port shares: its bound on open connections (the gRPC port has
/// one listener per serving thread, [`crate::runtime`]) and its gauge.
#[derive(Clone, Debug)]
pub struct PortBound {
    limits: ConnectionLimits,
    permits: Arc<Semaphore>,
    port: Port,
    metrics: Arc<Metrics>,
    open: Gauge,
    /// One log line per [`LOG_EVERY`] for the whole port, whichever thread sees the event.
    refused_log: SharedThrottle,
    error_log: SharedThrottle,
}

impl PortBound {
    /// A bound of `limits` on `port`, counted in `metrics`.
    pub fn new(limits: ConnectionLimits, port: Port, metrics: Arc<Metrics>) -> PortBound {
        let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
        PortBound {
            limits,
            permits: Arc::new(Semaphore::new(max)),
            port,
            open: metrics.connections_open(port),
            metrics,
            refused_log: SharedThrottle::default(),
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
            let Ok(permit) = bound.permits.clone().try_acquire_owned() else {
                // Closed at once: the client learns now, and no descriptor is held.
                drop(stream);
                bound.metrics.record_connection_refused(bound.port);
                if let Some(count) = bound.refused_log.tick() {
                    tracing::warn!(port = bound.port.label(), %peer, count,
                        max_connections = bound.limits.max_connections,
                        "connection limit reached; refusing new connections");
                }
                continue;
            };
            // Envoy multiplexes many small requests on few connections: answer each at once.
            let _ = stream.set_nodelay(true);
            let guarded = Guarded::new(
                stream,
                permit,
                bound.limits.idle_timeout,
                bound.open.clone(),
                bound.metrics.clone(),
                bound.port,
            );
            return (guarded, peer);
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
/// its reads once nothing has been read for the idle timeout.
///
/// Not the same job as [`Aged`](crate::server::listener::Aged), though both fail a
/// connection's I/O on a timer: this one measures *silence* (every byte read moves its
/// deadline on), on connections of every TCP port, and owns the connection's place under the
/// port's bound; `Aged` measures *age* since accept, busy or not, on gRPC connections only
/// (unix sockets too, which have no bound). A gRPC TCP connection carries both: `Aged`
/// outside (around TLS, if on), this one on the socket.
pub struct Guarded<T> {
    inner: T,
    idle_timeout: Duration,
    /// When a byte was last read.
    last_read: Instant,
    /// Fires at the earliest moment the connection may have been silent too long; moved on
    /// lazily (reads only record `last_read`), so a busy connection costs no timer updates.
    idle: Pin<Box<Sleep>>,
    /// Counted in `floodgate_connections_open` while the connection lives.
    open: Gauge,
    metrics: Arc<Metrics>,
    port: Port,
    _permit: OwnedSemaphorePermit,
}

impl<T> Guarded<T> {
    fn new(
        inner: T,
        permit: OwnedSemaphorePermit,
        idle_timeout: Duration,
        open: Gauge,
        metrics: Arc<Metrics>,
        port: Port,
    ) -> Guarded<T> {
        let now = Instant::now();
        open.inc();
        Guarded {
            inner,
            idle_timeout,
            last_read: now,
            idle: Box::pin(tokio::time::sleep_until(now + idle_timeout)),
            open,
            metrics,
            port,
            _permit: permit,
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Whether the connection has been silent for the idle timeout; re-arms the timer when
    /// it fired early (something was read since it was set).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.last_read + self.idle_timeout;
            if due <= Instant::now() {
                return true;
            }
            self.idle.as_mut().reset(due);
        }
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if this.poll_idle(cx) => {
                this.metrics.record_idle_close(this.port);
                tracing::debug!(port = this.port.label(), timeout = ?this.idle_timeout,
                    "closing a silent connection");
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection silent for the idle timeout",
                )))
            }
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
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
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
