//! Where gRPC listens — a TCP address or a unix domain socket (the reference's `GRPC_UDS`) —
//! and [`Aged`], which cuts a connection that outlived its maximum age and grace.
//!
//! tonic sends HTTP/2 `GOAWAY` once a connection reaches its maximum age, and the client then
//! finishes its calls and moves to a new connection. What tonic cannot do together with that
//! is the grace (`GRPC_MAX_CONNECTION_AGE_GRACE`): its own grace option replaces the GOAWAY by
//! a hard close. So the grace is enforced here, below HTTP/2: after age + grace the
//! connection's reads and writes fail, and the server drops it.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::net::{TcpListener, TcpSocket, UnixListener};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

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

/// A connection that fails once `lifetime` has passed since it was accepted (none: never).
///
/// Not the same job as [`Guarded`](crate::transport::Guarded), though both fail a connection's
/// I/O on a timer: this one cuts a gRPC connection at a fixed *age* (its maximum age plus
/// grace), however busy, failing writes as well as reads, on TCP and unix sockets alike;
/// `Guarded` closes a connection of any TCP port after a *silence* (reset by every read), or
/// when it has not opened in time or must make way for a new one, and holds its place under
/// the port's connection bound.
#[derive(Debug)]
pub struct Aged<T> {
    inner: T,
    /// When the connection is cut.
    cut: Option<Pin<Box<Sleep>>>,
}

impl<T> Aged<T> {
    /// Wraps a connection accepted now.
    pub fn new(inner: T, lifetime: Option<Duration>) -> Aged<T> {
        Aged {
            inner,
            cut: lifetime.map(|lifetime| Box::pin(tokio::time::sleep(lifetime))),
        }
    }

    /// Whether the lifetime is over; if not, registers for a wake-up when it is.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.cut
            .as_mut()
            .is_some_and(|cut| cut.as_mut().poll(cx).is_ready())
    }
}

fn cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "gRPC connection outlived its maximum age and grace",
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for Aged<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // HTTP/2 always has a read pending, so the timer's wake-up lands here.
        if this.expired(cx) {
            return Poll::Ready(Err(cut()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Aged<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired(cx) {
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
        if this.expired(cx) {
            return Poll::Ready(Err(cut()));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
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

impl<T: Connected> Connected for Aged<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listener shares the one address, port 0 included.
    #[tokio::test]
    async fn listeners_share_one_port() {
        let listeners = TcpListeners::bind("127.0.0.1:0".parse().unwrap(), 3)
            .await
            .unwrap();
        let addr = listeners.local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        assert_eq!(listeners.threads(), 3);
        for extra in &listeners.extra {
            assert_eq!(extra.local_addr().unwrap(), addr);
        }
    }

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection works until its lifetime is over, then fails; without one it never does.
    #[tokio::test]
    async fn an_aged_connection_is_cut() {
        let (mut client, server) = tokio::io::duplex(64);
        // Long enough that a loaded machine still reads before the lifetime ends (the read
        // right below must succeed); the test waits it out once.
        let mut aged = Aged::new(server, Some(Duration::from_secs(1)));
        client.write_all(b"hi").await.unwrap();
        let mut buf = [0; 2];
        aged.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        // A read pending when the lifetime ends fails then, without any traffic.
        let error = aged.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(aged.write(b"x").await.is_err());
        assert!(Aged::new(client, None).cut.is_none());
    }

    /// A stale socket file is replaced; the file is removed when the listener goes.
    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grpc.sock");
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(path.exists(), "a dropped std listener leaves its file");
        let listener = GrpcListener::bind_unix(&path).unwrap();
        assert!(path.exists());
        drop(listener);
        assert!(!path.exists());
        // Not a socket: left alone, and an error.
        std::fs::write(&path, "data").unwrap();
        assert!(GrpcListener::bind_unix(&path).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
    }
}
