//! `floodgate serve`'s TLS on the gRPC port.

use std::path::PathBuf;

use clap::Args;

/// TLS on the gRPC port: off unless a certificate and key are given. The admin HTTP port
/// stays plaintext (bind it to localhost with --http-addr, or turn it off with --no-http).
#[derive(Clone, Debug, Default, Args)]
pub struct GrpcTlsSettings {
    /// PEM certificate chain (leaf first) for TLS on the gRPC port; needs
    /// --grpc-tls-key-file. Reloaded, with the key and client CA, when the files change.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_CERT_FILE",
        value_name = "PATH",
        requires = "grpc_tls_key_file"
    )]
    pub grpc_tls_cert_file: Option<PathBuf>,

    /// PEM private key of the gRPC TLS certificate.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_KEY_FILE",
        value_name = "PATH",
        requires = "grpc_tls_cert_file"
    )]
    pub grpc_tls_key_file: Option<PathBuf>,

    /// PEM CA certificates: turns on mutual TLS, every gRPC client must present a certificate
    /// issued by one of them.
    #[arg(
        long,
        env = "FLOODGATE_GRPC_TLS_CLIENT_CA_FILE",
        value_name = "PATH",
        requires = "grpc_tls_cert_file"
    )]
    pub grpc_tls_client_ca_file: Option<PathBuf>,
}

impl GrpcTlsSettings {
    /// The files to serve TLS from; `None`: plaintext gRPC.
    pub fn files(&self) -> Option<crate::transport::tls::TlsFiles> {
        Some(crate::transport::tls::TlsFiles {
            cert: self.grpc_tls_cert_file.clone()?,
            key: self.grpc_tls_key_file.clone()?,
            client_ca: self.grpc_tls_client_ca_file.clone(),
        })
    }
}
