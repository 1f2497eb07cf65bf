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
//! runs the admin HTTP server and the background tasks); each further one
//! ([`crate::transport::TcpListeners`]) gets a thread from [`spawn_runtime_thread`].
//! A unix socket (`--grpc-uds`) is served by the first thread alone.
//!
//! Each of these runtimes also runs the host's scheduling-delay probe
//! ([`host::probe`]): with no work stealing, a busy thread delays the
//! calls it serves, and the bound on calls to Redis takes that delay out of their latency.

use std::future::Future;
use std::io;
use std::thread::JoinHandle;

pub mod host;

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
        runtime.spawn(host::probe());
        Ok(runtime.block_on(task()))
    })
}

/// The runtime `floodgate serve` runs on: single-threaded too (see the module comment); the
/// other gRPC threads start from [`crate::server::run`].
pub fn main_runtime() -> io::Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.spawn(host::probe());
    Ok(runtime)
}

#[cfg(test)]
mod tests;
