//! Certificates generated at test time (rcgen): a CA, a server certificate for 127.0.0.1 and
//! localhost, and a client certificate, all signed by the CA, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::redis::TlsFiles;

/// PEM files of a test PKI, in a temporary directory removed on drop.
pub struct Pki {
    /// The CA certificate.
    pub ca: PathBuf,
    /// Server certificate and key (SANs 127.0.0.1 and localhost).
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Client certificate and key (extended key usage: client auth).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pki {
    /// A fresh CA with one server and one client certificate.
    pub fn generate() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "floodgate test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().unwrap();
        let ca = write("ca.pem", ca_params.self_signed(&ca_key).unwrap().pem());
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "redis test server",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["floodgate".into()],
            "floodgate test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Pki {
            ca,
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            _dir: dir,
        }
    }

    /// The files a TLS redis-server needs.
    pub fn server_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            ca: self.ca.clone(),
        }
    }
}

/// A path as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}
