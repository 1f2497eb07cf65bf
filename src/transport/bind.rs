//! Where gRPC listens: a TCP address, one `SO_REUSEPORT` listener per serving thread
//! ([`TcpListeners`], [`crate::runtime`]), or a unix domain socket (the reference's
//! `GRPC_UDS`, [`UnixSocket`]).
//!
//! Place in the flow: first. The listeners bound here are handed to the server, which accepts
//! from them through an [`Acceptor`](super::Acceptor) (TCP) or wraps each unix connection
//! [`Guarded::unbounded`](super::Guarded::unbounded) for its age cut.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, TcpSocket, UnixListener};

/// The gRPC listener.
#[derive(Debug)]
pub enum GrpcListener {
    /// A TCP address (`--grpc-addr`), one listener per serving thread.
    Tcp(TcpListeners),
    /// A unix domain socket (`--grpc-uds`); the file is removed when the listener is dropped.
    Unix(UnixSocket),
}

impl From<TcpListener> for GrpcListener {
    fn from(listener: TcpListener) -> GrpcListener {
        GrpcListener::Tcp(listener.into())
    }
}

/// Connections queued by the kernel before they are accepted, per listener (tokio's default).
const BACKLOG: u32 = 1024;

/// The gRPC TCP listeners: one per serving thread ([`crate::runtime`]), all on one address.
#[derive(Debug)]
pub struct TcpListeners {
    /// Served on the caller's runtime.
    pub primary: TcpListener,
    /// Each served by a thread of its own (registered with no runtime until then).
    pub extra: Vec<std::net::TcpListener>,
}

impl TcpListeners {
    /// Binds `count` (at least one) listeners to `addr` with `SO_REUSEPORT`. Port 0 picks a
    /// free port once; the others share it.
    pub async fn bind(addr: SocketAddr, count: usize) -> io::Result<TcpListeners> {
        let primary = reuseport_listener(addr)?;
        let addr = primary.local_addr()?;
        let extra = (1..count.max(1))
            .map(|_| reuseport_listener(addr)?.into_std())
            .collect::<io::Result<Vec<_>>>()?;
        Ok(TcpListeners { primary, extra })
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
impl From<TcpListener> for TcpListeners {
    fn from(primary: TcpListener) -> TcpListeners {
        TcpListeners {
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

/// A bound unix socket and its path.
#[derive(Debug)]
pub struct UnixSocket {
    /// The listener, taken when serving starts.
    pub listener: Option<UnixListener>,
    /// The socket file.
    pub path: PathBuf,
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        // Leaves no stale socket for the next start; a failure only costs a replace then.
        let _ = std::fs::remove_file(&self.path);
    }
}

impl GrpcListener {
    /// Binds a unix socket at `path`, replacing a socket file left by an earlier run (the
    /// reference fails to start then; a restarted container would crash-loop). Any other
    /// kind of file there is an error: it is not ours to delete.
    pub fn bind_unix(path: &Path) -> io::Result<GrpcListener> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.file_type().is_socket()
        {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        Ok(GrpcListener::Unix(UnixSocket {
            listener: Some(listener),
            path: path.to_path_buf(),
        }))
    }
}

#[cfg(test)]
mod tests;
