//! Reading TLS material from PEM files: certificate chains, CA bundles and private keys, each
//! checked when read, with errors that name the file, what was expected in it and what was
//! found. One error type, [`TlsError`], serves every TLS the server speaks: the gRPC port's
//! ([`crate::transport::tls`]), Redis's (`store::redis::tls`) and the xDS client's
//! (`server::xds`).
//!
//! Place in the flow: start-up (and the gRPC port's certificate reload), never the request
//! path. A leaf: it knows the files and rustls's PEM parser, nothing of the server.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Which TLS a file is for, as messages name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    /// The gRPC port's (`--grpc-tls-*`).
    Grpc,
    /// The Redis connections' (`--redis-tls-*`).
    Redis,
    /// The xDS client's (`--xds-tls-*`).
    Xds,
}

impl Tls {
    /// The flags of a client certificate and its key.
    fn pair_flags(self) -> (&'static str, &'static str) {
        match self {
            Tls::Grpc => ("--grpc-tls-cert-file", "--grpc-tls-key-file"),
            Tls::Redis => ("--redis-tls-cert-file", "--redis-tls-key-file"),
            Tls::Xds => ("--xds-tls-cert", "--xds-tls-key"),
        }
    }
}

impl fmt::Display for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tls::Grpc => "gRPC TLS",
            Tls::Redis => "Redis TLS",
            Tls::Xds => "xDS TLS",
        })
    }
}

/// The role of a file, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRole {
    /// CA certificates the peer's certificate must chain to.
    Ca,
    /// Our own certificate chain, leaf first.
    Cert,
    /// The private key of our certificate.
    Key,
}

impl fmt::Display for FileRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileRole::Ca => "CA file",
            FileRole::Cert => "certificate file",
            FileRole::Key => "key file",
        })
    }
}

/// Why TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {tls} {role} {path}: {source}")]
    Read {
        /// Which TLS.
        tls: Tls,
        /// Which file.
        role: FileRole,
        /// The path given.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A file was read but cannot be used: what was expected, what was found.
    #[error("{tls} {role} {path}: {reason}")]
    Invalid {
        /// Which TLS.
        tls: Tls,
        /// Which file.
        role: FileRole,
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error(
        "{tls}: a client certificate needs both {} and {} (only the {given} was given)",
        tls.pair_flags().0,
        tls.pair_flags().1
    )]
    Unpaired {
        /// Which TLS.
        tls: Tls,
        /// The one that was given.
        given: FileRole,
    },
}

impl TlsError {
    /// `path`, in `role` for `tls`, cannot be used for `reason`.
    pub fn invalid(tls: Tls, role: FileRole, path: &Path, reason: impl fmt::Display) -> TlsError {
        TlsError::Invalid {
            tls,
            role,
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

/// A certificate chain or CA bundle read from a PEM file: its bytes (what redis-rs and tonic
/// take) and the certificates in it, at least one.
#[derive(Clone, Debug)]
pub struct Certificates {
    /// The file's bytes.
    pub pem: Vec<u8>,
    /// The certificates, in the file's order.
    pub certs: Vec<CertificateDer<'static>>,
}

/// A private key read from a PEM file (PKCS#8, PKCS#1 or SEC1): its bytes and the key.
#[derive(Debug)]
pub struct PrivateKey {
    /// The file's bytes.
    pub pem: Vec<u8>,
    /// The first private key in the file.
    pub key: PrivateKeyDer<'static>,
}

/// The certificates in `path` (for `tls`, in `role`); an error unless there is at least one
/// and nothing malformed.
pub fn certificates(tls: Tls, role: FileRole, path: &Path) -> Result<Certificates, TlsError> {
    let pem = read(tls, role, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::invalid(tls, role, path, format!("malformed PEM: {e}")))?;
    if certs.is_empty() {
        let reason = format!(
            "no PEM certificate (BEGIN CERTIFICATE) in it; found {}",
            found(&pem)
        );
        return Err(TlsError::invalid(tls, role, path, reason));
    }
    Ok(Certificates { pem, certs })
}

/// The private key in `path` (for `tls`); an error unless there is one.
pub fn private_key(tls: Tls, path: &Path) -> Result<PrivateKey, TlsError> {
    let role = FileRole::Key;
    let pem = read(tls, role, path)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let reason = match e {
            pem::Error::NoItemsFound => format!(
                "no usable PEM private key: no PEM private key (BEGIN PRIVATE KEY, RSA PRIVATE \
                 KEY or EC PRIVATE KEY) in it; found {}",
                found(&pem)
            ),
            e => format!("no usable PEM private key: malformed PEM: {e}"),
        };
        TlsError::invalid(tls, role, path, reason)
    })?;
    Ok(PrivateKey { pem, key })
}

/// A client certificate and its key, both or neither (for `tls`).
pub fn client_pair(
    tls: Tls,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<(Certificates, PrivateKey)>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((
            certificates(tls, FileRole::Cert, cert)?,
            private_key(tls, key)?,
        ))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Unpaired {
            tls,
            given: FileRole::Cert,
        }),
        (None, Some(_)) => Err(TlsError::Unpaired {
            tls,
            given: FileRole::Key,
        }),
    }
}

fn read(tls: Tls, role: FileRole, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        tls,
        role,
        path: path.to_path_buf(),
        source,
    })
}

/// What a file holds instead, for messages: the labels of its PEM sections, or that it has
/// none.
fn found(pem: &[u8]) -> String {
    let text = String::from_utf8_lossy(pem);
    let mut labels: Vec<&str> = text
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("-----BEGIN ")?
                .strip_suffix("-----")
        })
        .collect();
    labels.dedup();
    if labels.is_empty() {
        "no PEM section at all".to_string()
    } else {
        format!("only {}", labels.join(", "))
    }
}

#[cfg(test)]
pub(crate) mod tests;
