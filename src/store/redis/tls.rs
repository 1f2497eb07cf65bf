//! TLS material for Redis connections: the CA that signs the servers' certificates and the
//! client certificate for servers that ask for one (`tls-auth-clients yes`).
//!
//! The files are read and parsed once, when the store is built ([`crate::pem`]), so a missing
//! or malformed file stops `floodgate serve` at start-up (exit 64, naming the file and the
//! reason) instead of failing every connection later. The same [`certificates`] serve a
//! standalone Redis, a Sentinel-managed master and its sentinels, and any other topology
//! that connects with redis-rs.
//!
//! floodgate's own connections ([`super::wire`]) take the same files as rustls settings
//! ([`client_config`]).
//!
//! Without a CA file, servers are verified against the bundled Mozilla roots (webpki-roots);
//! with one, against that CA only. Host names (or IP addresses) are always verified.

use std::path::PathBuf;
use std::sync::Arc;

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::{ClientConfig, RootCertStore};

use crate::pem::{self, FileRole, Tls, TlsError};

/// Where the TLS files are (`--redis-tls-ca-file`, `--redis-tls-cert-file`,
/// `--redis-tls-key-file`). All absent: TLS, if the URL asks for it, with the default roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM certificates trusted to sign the Redis servers' certificates.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, presented to servers that ask for one.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<PathBuf>,
}

impl RedisTls {
    /// Whether any file is configured.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

/// Reads and checks the files of `tls` into redis-rs's form; `None` when no file is set.
pub fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, TlsError> {
    if !tls.is_set() {
        return Ok(None);
    }
    let root_cert = tls
        .ca_file
        .as_deref()
        .map(|path| pem::certificates(Tls::Redis, FileRole::Ca, path))
        .transpose()?
        .map(|ca| ca.pem);
    let client_tls = pem::client_pair(
        Tls::Redis,
        tls.cert_file.as_deref(),
        tls.key_file.as_deref(),
    )?
    .map(|(cert, key)| ClientTlsConfig {
        client_cert: cert.pem,
        client_key: key.pem,
    });
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The rustls settings of floodgate's own connections ([`super::wire`]) to a `rediss://`
/// server, as redis-rs builds them from the same files: the CA file's certificates as the
/// only roots, or the bundled Mozilla roots without one; the client certificate and key
/// when given; host names verified. Read when the store is built, like [`certificates`].
pub fn client_config(tls: &RedisTls) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    match tls.ca_file.as_deref() {
        Some(path) => {
            let ca = pem::certificates(Tls::Redis, FileRole::Ca, path)?;
            for cert in ca.certs {
                roots.add(cert).map_err(|e| {
                    TlsError::invalid(Tls::Redis, FileRole::Ca, path, format!("unusable CA: {e}"))
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let client = pem::client_pair(
        Tls::Redis,
        tls.cert_file.as_deref(),
        tls.key_file.as_deref(),
    )?;
    let config = match (client, tls.cert_file.as_deref()) {
        (Some((cert, key)), Some(path)) => builder
            .with_client_auth_cert(cert.certs, key.key)
            .map_err(|e| {
                TlsError::invalid(
                    Tls::Redis,
                    FileRole::Cert,
                    path,
                    format!("unusable client certificate and key: {e}"),
                )
            })?,
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;
