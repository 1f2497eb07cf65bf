//! TLS, and optionally mutual TLS, on the gRPC port, with certificates reloaded from disk.
//!
//! Place in the flow: between the gRPC listener and tonic. [`GrpcTls::incoming`] turns the
//! bound `TcpListener` into the stream of connections tonic serves
//! (`serve_with_incoming_shutdown`, the same call as in plaintext): every accepted connection
//! gets its own task for the TLS handshake, bounded by the port's handshake timeout (which
//! covers the TLS handshake and the HTTP/2 preface after it together, [`super::Guarded`]), so
//! a slow or hostile client never stalls the accept loop; a failed handshake is logged at
//! debug and counted in `floodgate_tls_handshake_failures_total`. A connection still in its
//! handshake is idle: at the connection bound it makes way for a new one like any other.
//!
//! Why not tonic's `ServerTlsConfig`: it cannot change its certificate without a restart, and
//! certificates rotate (cert-manager renews them; the kubelet swaps a Secret volume's `..data`
//! symlink). Here the rustls `ServerConfig` in force sits in an `ArcSwap`; each handshake takes
//! the one current when it starts, and [`GrpcTls::watch`] loads the files again when they
//! change ([`crate::file_watch`], as the limits are), then swaps in the new configuration only
//! if everything loaded: a bad rotation keeps the previous certificate serving, with one error
//! line and `floodgate_tls_loads_total{result="error"}`.
//!
//! rustls with the ring provider (no aws-lc), TLS 1.2 and 1.3 (Envoy's upstream TLS defaults
//! to at most 1.2), ALPN `h2` only: gRPC is HTTP/2. With a client CA, a client certificate is
//! required and verified against it (TLS 1.3 clients learn of a refusal on their first read).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::connection::Abandoned;
use super::metrics::{HandshakeFailure, TransportMetrics};
use super::{Acceptor, Guarded};
use crate::file_watch::{self, FileWatch, WatchError};
use crate::pem::{self, FileRole, Tls, TlsError};

/// Handshaken connections waiting for tonic to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// A TLS connection on the gRPC port: guarded above TLS, so the guard sees the HTTP/2 preface.
pub type Connection = Guarded<TlsStream<TcpStream>>;

/// The files TLS is loaded from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf certificate.
    pub key: PathBuf,
    /// PEM CA certificates client certificates must chain to; `Some` turns on mutual TLS.
    pub client_ca: Option<PathBuf>,
}

/// TLS on the gRPC port: the configuration in force, and where it comes from. Clones share it.
#[derive(Clone)]
pub struct GrpcTls {
    files: Arc<TlsFiles>,
    config: Arc<ArcSwap<ServerConfig>>,
    metrics: TransportMetrics,
}

impl fmt::Debug for GrpcTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl GrpcTls {
    /// Loads the certificate, its key and the client CA (if any); counts the load.
    pub fn load(files: TlsFiles, metrics: TransportMetrics) -> Result<GrpcTls, TlsError> {
        let config = server_config(&files);
        metrics.record_tls_load(config.is_ok());
        Ok(GrpcTls {
            config: Arc::new(ArcSwap::from_pointee(config?)),
            files: Arc::new(files),
            metrics,
        })
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// Loads the files again; on success the new configuration serves every later handshake,
    /// on failure the previous one stays. Counted and logged either way (one line), once
    /// the new configuration is in force: whoever sees the count or the line and connects
    /// gets it.
    pub fn reload(&self) -> Result<(), TlsError> {
        match server_config(&self.files) {
            Ok(config) => {
                self.config.store(Arc::new(config));
                self.metrics.record_tls_load(true);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.record_tls_load(false);
                tracing::error!("TLS reload failed, keeping the previous certificate: {e}");
                Err(e)
            }
        }
    }

    /// Reloads whenever a file changes, until the guard is dropped (see [`crate::file_watch`]:
    /// a Secret volume's `..data` swap included). Must be called inside a tokio runtime.
    pub fn watch(&self) -> Result<FileWatch, WatchError> {
        let files = &self.files;
        let mut paths = vec![files.cert.as_path(), files.key.as_path()];
        paths.extend(files.client_ca.as_deref());
        let tls = self.clone();
        let watch = file_watch::spawn(
            &paths,
            file_watch::RecursiveMode::NonRecursive,
            "TLS",
            move || {
                // Logged and counted by reload.
                let _ = tls.reload();
            },
        )?;
        tracing::info!(cert = %files.cert.display(), "watching TLS files for changes");
        Ok(watch)
    }

    /// The TLS connections accepted by `listener` (its connection bound and handshake timeout
    /// cover the TLS handshake too), for tonic's `serve_with_incoming_shutdown`. Accepting stops
    /// (and the listener is closed) once the stream is dropped, which tonic does when
    /// shutdown begins.
    pub fn incoming(&self, listener: Acceptor) -> ReceiverStream<io::Result<Connection>> {
        let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
        tokio::spawn(accept_loop(listener, self.clone(), tx));
        ReceiverStream::new(rx)
    }

    /// Completes one handshake, within the connection's handshake deadline and unless it is
    /// told to make way for a new connection meanwhile; a failure is logged and counted.
    async fn handshake(&self, stream: Guarded<TcpStream>, peer: SocketAddr) -> Option<Connection> {
        // The configuration current now serves this whole connection.
        let acceptor = TlsAcceptor::from(self.config.load_full());
        let (tcp, guard) = stream.into_parts();
        let failure = match guard.opening(acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => return Some(Guarded::from_parts(tls, guard)),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                HandshakeFailure::Error
            }
            // Counted in floodgate_connections_handshake_timeouts_total by the guard.
            Err(Abandoned::TimedOut) => {
                tracing::debug!(%peer, "TLS handshake not done within the handshake timeout");
                HandshakeFailure::Timeout
            }
            Err(Abandoned::Evicted) => {
                tracing::debug!(%peer, "TLS handshake abandoned to admit a new connection");
                return None;
            }
        };
        self.metrics.record_tls_handshake_failure(failure);
        None
    }
}

/// Accepts connections and hands each to its own handshake task, until `tx`'s receiver is
/// gone (the server stopped accepting).
async fn accept_loop(
    mut listener: Acceptor,
    tls: GrpcTls,
    tx: mpsc::Sender<io::Result<Connection>>,
) {
    loop {
        // Accept errors are paused after and logged by the acceptor itself.
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
        };
        let (tls, tx) = (tls.clone(), tx.clone());
        tokio::spawn(async move {
            if let Some(connection) = tls.handshake(stream, peer).await {
                // An error means the server stopped accepting: the connection is dropped.
                let _ = tx.send(Ok(connection)).await;
            }
        });
    }
}

/// Builds the rustls configuration from the files; the error names the file at fault.
fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = pem::certificates(Tls::Grpc, FileRole::Cert, &files.cert)?.certs;
    let key = pem::private_key(Tls::Grpc, &files.key)?.key;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::invalid(Tls::Grpc, FileRole::Cert, &files.cert, e))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let invalid = |reason: String| TlsError::invalid(Tls::Grpc, FileRole::Ca, ca, reason);
            let mut roots = RootCertStore::empty();
            for cert in pem::certificates(Tls::Grpc, FileRole::Ca, ca)?.certs {
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError::invalid(
            Tls::Grpc,
            FileRole::Key,
            &files.key,
            format!("cannot be used with {}: {e}", files.cert.display()),
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
