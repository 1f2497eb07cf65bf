//! The runtime layout: gRPC is served by N threads, each a single-threaded tokio runtime with a
//! listener of its own on the same address (`SO_REUSEPORT`, so the kernel spreads incoming
//! connections over them).
//!
//! Why not one multi-threaded runtime: hyper's HTTP/2 server answers each request in a task of
//! its own and writes a connection's pending responses whenever the connection's task runs.
//! On tokio's multi-threaded scheduler a finished request wakes that task at once (the
//! worker's LIFO slot) or on another worker, so nearly every response goes out in a `writev`
//! of its own, often after a cross-thread wake-up: 0.73 `writev` per request under 16
//! connections × 8 concurrent streams. On a single-threaded runtime the requests that arrived
//! together run one after the other and the connection's task then writes all their responses
//! at once: 0.13 `writev` per request and no futex, the figure of a server that batches
//! (`bench/run.sh` counts both).
//!
//! The trade-off: one connection is served by one thread. Envoy opens at least one HTTP/2
//! connection per worker thread to each rate-limit host, so a fleet of Envoys keeps every
//! thread busy; a single client on a single connection gets one core.
//!
//! The first listener is served on the runtime that calls [`crate::server::run`] (which also
//! runs the admin HTTP server and the background tasks); each further one gets a thread from
//! [`spawn_runtime_thread`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpSocket};

/// Connections queued by the kernel before they are accepted, per listener (tokio's default).
const BACKLOG: u32 = 1024;

/// The gRPC listeners: one per serving thread, all on one address.
#[derive(Debug)]
pub struct GrpcListeners {
    /// Served on the caller's runtime.
    pub primary: TcpListener,
    /// Each served by a thread of its own (registered with no runtime until then).
    pub extra: Vec<std::net::TcpListener>,
}

impl GrpcListeners {
    /// Binds `count` (at least one) listeners to `addr` with `SO_REUSEPORT`. Port 0 picks a
    /// free port once; the others share it.
    pub async fn bind(addr: SocketAddr, count: usize) -> io::Result<GrpcListeners> {
        let primary = reuseport_listener(addr)?;
        let addr = primary.local_addr()?;
        let extra = (1..count.max(1))
            .map(|_| reuseport_listener(addr)?.into_std())
            .collect::<io::Result<Vec<_>>>()?;
        Ok(GrpcListeners { primary, extra })
    }

    /// The address every listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.primary.local_addr()
    }

    /// How many threads serve gRPC.
    pub fn threads(&self) -> usize {
        1 + self.extra.len()
    }
}

/// One listener, served on the caller's runtime (what tests bind on `127.0.0.1:0`).
impl From<TcpListener> for GrpcListeners {
    fn from(primary: TcpListener) -> GrpcListeners {
        GrpcListeners {
            primary,
            extra: Vec::new(),
        }
    }
}

/// A listening socket on `addr` that others may share (`SO_REUSEPORT`, same user only).
fn reuseport_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Starts a thread named `name` that runs `task` to completion on a single-threaded runtime
/// of its own (I/O and timers enabled). The handle yields `task`'s output, or the error of
/// building the runtime.
pub fn spawn_runtime_thread<F, Fut>(
    name: String,
    task: F,
) -> io::Result<JoinHandle<io::Result<Fut::Output>>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future,
    Fut::Output: Send + 'static,
{
    std::thread::Builder::new().name(name).spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(runtime.block_on(task()))
    })
}

/// The runtime `floodgate serve` runs on: single-threaded too (see the module comment); the
/// other gRPC threads start from [`crate::server::run`].
pub fn main_runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listener shares the one address, port 0 included.
    #[tokio::test]
    async fn listeners_share_one_port() {
        let listeners = GrpcListeners::bind("127.0.0.1:0".parse().unwrap(), 3)
            .await
            .unwrap();
        let addr = listeners.local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        assert_eq!(listeners.threads(), 3);
        for extra in &listeners.extra {
            assert_eq!(extra.local_addr().unwrap(), addr);
        }
    }

    /// A runtime thread runs its task on a runtime with I/O and timers, and hands back its
    /// output.
    #[test]
    fn runtime_thread_returns_the_output() {
        let handle = spawn_runtime_thread("test-rt".into(), || async {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            std::thread::current().name().map(str::to_owned)
        })
        .unwrap();
        let name = handle.join().unwrap().unwrap();
        assert_eq!(name.as_deref(), Some("test-rt"));
    }
}
