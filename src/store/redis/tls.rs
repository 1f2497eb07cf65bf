//! TLS material for Redis connections: the CA that signs the servers' certificates and the
//! client certificate for servers that ask for one (`tls-auth-clients yes`).
//!
//! The files are read and parsed once, when the store is built, so a missing or malformed
//! file stops `floodgate serve` at start-up (exit 64, naming the file and the reason) instead
//! of failing every connection later. The same [`certificates`] serve a standalone Redis, a
//! Sentinel-managed master and its sentinels, and any other topology that connects with
//! redis-rs.
//!
//! Without a CA file, servers are verified against the bundled Mozilla roots (webpki-roots);
//! with one, against that CA only. Host names (or IP addresses) are always verified.

use std::fmt;
use std::path::{Path, PathBuf};

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read Redis TLS {role} {path}: {source}")]
    Read {
        /// Which file (`CA file`, `certificate file`, `key file`).
        role: FileRole,
        /// The path given.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file was read but holds no usable PEM content.
    #[error("Redis TLS {role} {path}: {reason}")]
    Invalid {
        /// Which file.
        role: FileRole,
        /// The path given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A certificate without its key, or a key without its certificate.
    #[error(
        "a Redis TLS client certificate needs both --redis-tls-cert-file and \
         --redis-tls-key-file (only the {given} was given)"
    )]
    Unpaired {
        /// The one that was given.
        given: FileRole,
    },
}

/// The role of a TLS file, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRole {
    /// `--redis-tls-ca-file`.
    Ca,
    /// `--redis-tls-cert-file`.
    Cert,
    /// `--redis-tls-key-file`.
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

/// Reads and checks the files of `tls` into redis-rs's form; `None` when no file is set.
pub fn certificates(tls: &RedisTls) -> Result<Option<TlsCertificates>, TlsError> {
    if !tls.is_set() {
        return Ok(None);
    }
    let root_cert = tls
        .ca_file
        .as_deref()
        .map(|path| read_certificates(FileRole::Ca, path))
        .transpose()?;
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: read_certificates(FileRole::Cert, cert)?,
            client_key: read_key(key)?,
        }),
        (None, None) => None,
        (Some(_), None) => {
            return Err(TlsError::Unpaired {
                given: FileRole::Cert,
            });
        }
        (None, Some(_)) => {
            return Err(TlsError::Unpaired {
                given: FileRole::Key,
            });
        }
    };
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

fn read(role: FileRole, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        role,
        path: path.to_path_buf(),
        source,
    })
}

/// The file's bytes, once they are known to hold at least one PEM certificate and nothing
/// malformed.
fn read_certificates(role: FileRole, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(role, path)?;
    let invalid = |reason: String| TlsError::Invalid {
        role,
        path: path.to_path_buf(),
        reason,
    };
    let count = CertificateDer::pem_slice_iter(&pem)
        .try_fold(0usize, |n, cert| cert.map(|_| n + 1))
        .map_err(|e| invalid(format!("malformed PEM: {e}")))?;
    if count == 0 {
        return Err(invalid(
            "no PEM certificate (BEGIN CERTIFICATE) in it".into(),
        ));
    }
    Ok(pem)
}

/// The key file's bytes, once they are known to hold a PEM private key.
fn read_key(path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(FileRole::Key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Invalid {
        role: FileRole::Key,
        path: path.to_path_buf(),
        reason: format!("no usable PEM private key: {e}"),
    })?;
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate and its key, generated for the test.
    fn pair() -> (String, String) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        (cert.cert.pem(), cert.signing_key.serialize_pem())
    }

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// No file: no certificates, and no error.
    #[test]
    fn nothing_configured() {
        assert!(certificates(&RedisTls::default()).unwrap().is_none());
    }

    /// A CA and a client pair load into redis-rs's form, byte for byte.
    #[test]
    fn loads_ca_and_client_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair();
        let tls = RedisTls {
            ca_file: Some(write(&dir, "ca.pem", &cert)),
            cert_file: Some(write(&dir, "client.pem", &cert)),
            key_file: Some(write(&dir, "client.key", &key)),
        };
        let loaded = certificates(&tls).unwrap().unwrap();
        assert_eq!(loaded.root_cert.as_deref(), Some(cert.as_bytes()));
        let client = loaded.client_tls.unwrap();
        assert_eq!(client.client_cert, cert.as_bytes());
        assert_eq!(client.client_key, key.as_bytes());
    }

    /// Every unusable file is named with its role and the reason.
    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair();
        let missing = dir.path().join("missing.pem");
        let empty = write(&dir, "empty.pem", "");
        let key_path = write(&dir, "k.pem", &key);
        let cert_path = write(&dir, "c.pem", &cert);
        let cases = [
            (
                RedisTls {
                    ca_file: Some(missing.clone()),
                    ..RedisTls::default()
                },
                format!("cannot read Redis TLS CA file {}", missing.display()),
            ),
            (
                RedisTls {
                    ca_file: Some(empty.clone()),
                    ..RedisTls::default()
                },
                format!("Redis TLS CA file {}: no PEM certificate", empty.display()),
            ),
            (
                RedisTls {
                    ca_file: Some(key_path.clone()),
                    ..RedisTls::default()
                },
                "no PEM certificate".to_string(),
            ),
            (
                RedisTls {
                    cert_file: Some(cert_path.clone()),
                    key_file: Some(cert_path.clone()),
                    ..RedisTls::default()
                },
                format!(
                    "Redis TLS key file {}: no usable PEM private key",
                    cert_path.display()
                ),
            ),
            (
                RedisTls {
                    cert_file: Some(cert_path.clone()),
                    ..RedisTls::default()
                },
                "only the certificate file was given".to_string(),
            ),
            (
                RedisTls {
                    key_file: Some(key_path),
                    ..RedisTls::default()
                },
                "only the key file was given".to_string(),
            ),
        ];
        for (tls, message) in cases {
            let err = certificates(&tls).unwrap_err().to_string();
            assert!(err.contains(&message), "{err:?} lacks {message:?}");
        }
    }
}
