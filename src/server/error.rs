//! Why the server could not start, or stopped with an error: [`ServerError`], the error
//! type of every step of serving.

use std::io;
use std::path::PathBuf;

use crate::config::ConfigErrors;
use crate::pem::TlsError;
use crate::telemetry::otel::TraceError;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The limits could not be loaded at start-up.
    #[error("cannot load limits from {path}:\n{errors}")]
    Config {
        /// The configured path.
        path: String,
        /// Every problem found.
        errors: ConfigErrors,
    },
    /// A TLS file (the gRPC port's, the xDS client's) cannot be used at start-up.
    #[error("{0}")]
    Tls(#[from] TlsError),
    /// A setting cannot be honoured.
    #[error("{0}")]
    Settings(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: io::Error,
    },
    /// The gRPC unix socket could not be bound.
    #[error("cannot listen on unix socket {path}: {source}")]
    BindUnix {
        /// The socket's path.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(io::Error),
    /// Reflection could not be built from the embedded descriptors (a build defect).
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The trace exporter cannot be built as configured.
    #[error("tracing: {0}")]
    Traces(#[from] TraceError),
}
