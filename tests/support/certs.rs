//! Certificates made at test time with rcgen: a CA, and the server and client certificates
//! it issues. Nothing is checked in, so nothing expires.

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

    fn issue(&self, name: &str, serial: u64, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}
