//! Certificates made at test time with rcgen: a CA, and the server and client certificates
//! it issues (names `localhost` and `127.0.0.1`), in memory or as PEM files ([`Pki`]).
//! Nothing is checked in, so nothing expires.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate issued by a [`Ca`], with its key.
pub struct Leaf {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The certificate, DER: what a peer receives.
    pub der: Vec<u8>,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    /// A server certificate for `localhost` with serial number `serial` (and common name
    /// `floodgate <serial>`), so tests can tell rotations apart.
    pub fn server(&self, serial: u64) -> Leaf {
        self.issue(
            &format!("floodgate {serial}"),
            serial,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate for `name`.
    pub fn client(&self, name: &str) -> Leaf {
        self.issue(name, 1, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A certificate for `localhost` good for both ends, as Envoy Gateway's rate-limit
    /// certificate serves gRPC and authenticates to its xDS server.
    pub fn server_and_client(&self, name: &str) -> Leaf {
        self.issue_for(
            name,
            1,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn issue(&self, name: &str, serial: u64, usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.issue_for(name, serial, vec![usage])
    }

    fn issue_for(&self, name: &str, serial: u64, usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

/// PEM files of a test PKI (a CA, one server and one client certificate), in a temporary
/// directory removed on drop.
pub struct Pki {
    /// The CA certificate.
    pub ca: PathBuf,
    /// Server certificate and key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Client certificate and key (extended key usage: client auth).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pki {
    /// A fresh CA with one server and one client certificate, written as files.
    pub fn generate() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca = Ca::new("floodgate test CA");
        let server = ca.server(1);
        let client = ca.client("floodgate");
        Pki {
            ca: write("ca.pem", &ca.pem),
            server_cert: write("server.pem", &server.cert_pem),
            server_key: write("server.key", &server.key_pem),
            client_cert: write("client.pem", &client.cert_pem),
            client_key: write("client.key", &client.key_pem),
            _dir: dir,
        }
    }

    /// The files a TLS redis-server needs.
    pub fn server_files(&self) -> super::redis::TlsFiles {
        super::redis::TlsFiles {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            ca: self.ca.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        }
    }
}

/// A path as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}
