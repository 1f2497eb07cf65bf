//! Opening a connection: TCP (`TCP_NODELAY`), TLS with the store's rustls settings
//! ([`crate::store::redis::tls::client_config`]) or a unix socket, as the store's URLs say;
//! then the connection's task spawned on the calling runtime (`task.rs`) and, through it, the
//! setup commands redis-rs would send: `AUTH [user] password` (retried without the user on a
//! Redis older than 6, which knows no users) and `SELECT db`. RESP2 throughout. The script is
//! loaded when a call first meets `NOSCRIPT` (`script::call`), not here: a Redis that
//! restarts forgets it anyway.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::{
    ConnectionAddr, ConnectionInfo, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value,
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::conn::{Conn, State, shared};
use super::task::{Stream, Task};

/// Connects to the server `info` names (TLS with `tls` for a `rediss://` address), within
/// `timeout` for the connection and its setup commands.
pub async fn connect(
    info: &ConnectionInfo,
    tls: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> RedisResult<Conn> {
    tokio::time::timeout(timeout, connect_now(info, tls))
        .await
        .unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connection to Redis timed out after {timeout:?}"),
            )
            .into())
        })
}

async fn connect_now(info: &ConnectionInfo, tls: &Arc<rustls::ClientConfig>) -> RedisResult<Conn> {
    let stream = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Stream::Tcp(tcp(host, *port).await?),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => {
            if *insecure {
                // What redis-rs answers too: floodgate is built without its insecure mode.
                return Err(RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "Cannot create insecure client without tls-rustls-insecure feature",
                )));
            }
            let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| {
                RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "invalid TLS server name",
                    e.to_string(),
                ))
            })?;
            let socket = tcp(host, *port).await?;
            let stream = TlsConnector::from(Arc::clone(tls))
                .connect(name, socket)
                .await?;
            Stream::Tls(Box::new(stream))
        }
        ConnectionAddr::Unix(path) => unix(path).await?,
        other => {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "unsupported Redis address",
                other.to_string(),
            )));
        }
    };
    let shared = shared(State::new());
    tokio::spawn(Task::new(stream, Arc::clone(&shared)));
    let conn = Conn::new(shared, info.redis_settings().db());
    set_up(&conn, info).await?;
    Ok(conn)
}

async fn tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let socket = TcpStream::connect((host, port)).await?;
    socket.set_nodelay(true)?;
    Ok(socket)
}

#[cfg(unix)]
async fn unix(path: &Path) -> io::Result<Stream> {
    Ok(Stream::Unix(tokio::net::UnixStream::connect(path).await?))
}

#[cfg(not(unix))]
async fn unix(_path: &Path) -> io::Result<Stream> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "unix sockets are not supported on this platform",
    ))
}

/// `AUTH` and `SELECT`, answered as redis-rs answers them.
async fn set_up(conn: &Conn, info: &ConnectionInfo) -> RedisResult<()> {
    let settings = info.redis_settings();
    if let Some(password) = settings.password() {
        let auth = |user: Option<&str>| {
            let mut cmd = redis::cmd("AUTH");
            if let Some(user) = user {
                cmd.arg(user);
            }
            cmd.arg(password);
            cmd
        };
        let mut reply = conn.command(&auth(settings.username())).await?;
        if settings.username().is_some() && refused_user(&reply) {
            // A Redis before 6 knows no users: redis-rs retries with the password alone.
            reply = conn.command(&auth(None)).await?;
        }
        if !matches!(reply, Value::Okay) {
            return Err(RedisError::from((
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
            )));
        }
    }
    if settings.db() != 0 {
        let reply = conn
            .command(redis::cmd("SELECT").arg(settings.db()))
            .await?;
        if let Value::ServerError(error) = reply {
            return Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::ResponseError),
                "Redis server refused to switch database",
                error.details().unwrap_or_default().to_owned(),
            )));
        }
    }
    Ok(())
}

/// Whether `AUTH user password` was refused for its arity (a Redis before 6).
fn refused_user(reply: &Value) -> bool {
    let arity = "wrong number of arguments for 'auth' command";
    matches!(reply, Value::ServerError(error)
        if error.details().is_some_and(|detail| detail.contains(arity)))
}
