//! Connections, from the bound socket to the stream hyper serves: binding the listeners
//! ([`bind`]: TCP with `SO_REUSEPORT`, or the gRPC unix socket), accepting within a bound per
//! port, the TLS handshake on the gRPC port ([`tls`]), and one wrapper per connection
//! ([`Guarded`], `transport/connection.rs`) with one timer for its deadlines: the handshake
//! and idle timeouts and the age cut.
//!
//! Place in the flow: between a bound listener and the server that serves it. An
//! [`Acceptor`] accepts connections for tonic ([`Acceptor::into_stream`], plaintext gRPC),
//! for the TLS handshake ([`tls`]) and for axum (it is an [`axum::serve::Listener`]; serve it
//! with [`CountAdminCalls`]).
//!
//! - **At most `max_connections` at once per port; idle ones make way.** At the bound, a new
//!   connection closes the connection that has been idle longest (no call in flight; PINGs
//!   and other control frames do not count) and takes its place, counted in
//!   `floodgate_connections_evicted_total` (`transport/connection_bound.rs` says how idleness is
//!   known). Only when every connection has a call in flight is the new one closed at once
//!   (counted in `floodgate_connections_refused_total`, logged at most every
//!   [`LOG_EVERY`]): a client learns at once, rather than hanging in the kernel's backlog,
//!   and busy connections keep being served. Each port has its own bound, so connections on
//!   one never starve the other (`/healthcheck` stays reachable while the gRPC port is full).
//! - **A connection must open within the handshake timeout.** Until it has sent its opening
//!   (the HTTP/2 client preface on the gRPC port, TLS handshake included; the first request
//!   line on the admin ports: `transport/opening.rs`), a connection is closed
//!   `handshake_timeout` after it was accepted, however it trickles bytes (counted in
//!   `floodgate_connections_handshake_timeouts_total`).
//! - **Silent connections are closed.** A connection from which nothing has been read for
//!   `idle_timeout` is closed ([`Guarded`] fails its read, and hyper drops the connection).
//!   A live HTTP/2 peer is never silent that long: the gRPC server pings idle connections
//!   (`http2_keepalive_interval`) and every HTTP/2 peer must answer a PING.
//! - **gRPC connections are cut at their maximum age and grace** ([`Guarded::cut_after`]),
//!   on TCP and unix sockets alike, after tonic's `GOAWAY` at the age itself.
//! - **Accept errors pause the loop.** Out of file descriptors (`EMFILE`), `accept` fails at
//!   once, again and again: the loop waits [`ACCEPT_ERROR_PAUSE`] after each failure and logs
//!   them at most every [`LOG_EVERY`], so it neither pins a core nor floods the log.
//!
//! [`raise_fd_limit`] lifts the soft limit on open files to the hard limit at start-up, so
//! the connection bounds, not the default 1,024 descriptors, are what applies.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub mod bind;
mod calls;
mod connection;
mod connection_bound;
pub mod metrics;
mod opening;
pub mod tls;

pub use bind::{GrpcListener, TcpListeners, UnixSocket};
pub use calls::{
    Answering, CallsLayer, ConnectionCalls, CountAdminCalls, CountCalls, Counted, CountedBody, Made,
};
use connection::Guard;
pub use connection::{Guarded, GuardedInfo};
use connection_bound::{ConnectionBound, Taken};
pub use metrics::{HandshakeFailure, Port, TransportMetrics};
use opening::Opening;

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
    connections: Arc<ConnectionBound>,
    port: Port,
    metrics: TransportMetrics,
    open: Gauge,
    /// One log line per [`LOG_EVERY`] for the whole port, whichever thread sees the event.
    refused_log: SharedThrottle,
    evicted_log: SharedThrottle,
    error_log: SharedThrottle,
}

impl PortBound {
    /// A bound of `limits` on `port`, counted in `metrics`.
    pub fn new(limits: ConnectionLimits, port: Port, metrics: TransportMetrics) -> PortBound {
        PortBound {
            limits,
            connections: Arc::new(ConnectionBound::new(limits.max_connections)),
            port,
            open: metrics.connections_open(port),
            metrics,
            refused_log: SharedThrottle::default(),
            evicted_log: SharedThrottle::default(),
            error_log: SharedThrottle::default(),
        }
    }

    /// Accepts connections from `listener` within this bound (shared with every other
    /// listener accepted under it). Call it on the runtime that will serve `listener`.
    pub fn acceptor(&self, listener: TcpListener) -> Acceptor {
        Acceptor {
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

/// Accepts connections on one port within its [`ConnectionLimits`], and hands each off
/// [`Guarded`].
pub struct Acceptor {
    listener: TcpListener,
    bound: PortBound,
}

impl Acceptor {
    /// Accepts connections from `listener` within `limits` of its own, counted under `port`.
    pub fn new(
        listener: TcpListener,
        limits: ConnectionLimits,
        port: Port,
        metrics: TransportMetrics,
    ) -> Acceptor {
        PortBound::new(limits, port, metrics).acceptor(listener)
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next accepted connection. Never fails: refused connections and accept errors are
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
            let Some((place, taken)) = bound.connections.take() else {
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
            return (Guarded::new(stream, guard), peer);
        }
    }

    /// The accepted connections as a stream, for tonic's `serve_with_incoming_shutdown`.
    /// Accepting stops (and the listener is closed) once the stream is dropped.
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = io::Result<Guarded<TcpStream>>> + Send {
        futures_util::stream::unfold(self, |mut acceptor| async move {
            let (stream, _) = acceptor.accept().await;
            Some((Ok(stream), acceptor))
        })
    }
}

/// The peer of an admin HTTP connection, for handlers that log who called them (axum
/// provides its `ConnectInfo` for its own `TcpListener` only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Acceptor>>
    for PeerAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, Acceptor>) -> PeerAddr {
        PeerAddr(*stream.remote_addr())
    }
}

impl std::fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl axum::serve::Listener for Acceptor {
    type Io = Guarded<TcpStream>;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl Future<Output = (Self::Io, Self::Addr)> + Send {
        Acceptor::accept(self)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Acceptor::local_addr(self)
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
mod tests;
