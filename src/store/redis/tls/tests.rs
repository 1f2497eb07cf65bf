use super::*;
use crate::pem::tests::{pair, write};

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
