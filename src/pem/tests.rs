use super::*;

/// A self-signed certificate and its key (PEM), generated for the test.
pub(crate) fn pair() -> (String, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    (cert.cert.pem(), cert.signing_key.serialize_pem())
}

/// `text` in a new file `name` under `dir`.
pub(crate) fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A certificate and its key load, byte for byte and parsed.
#[test]
fn a_certificate_and_its_key_load() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair();
    let (cert_path, key_path) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let (certs, key_read) = client_pair(Tls::Xds, Some(&cert_path), Some(&key_path))
        .unwrap()
        .unwrap();
    assert_eq!(certs.pem, cert.as_bytes());
    assert_eq!(certs.certs.len(), 1);
    assert_eq!(key_read.pem, key.as_bytes());
    assert!(client_pair(Tls::Xds, None, None).unwrap().is_none());
}

/// Each error names the TLS, the file's role and path, what was expected and what was
/// found instead.
#[test]
fn errors_say_what_was_expected_and_found() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair();
    let (cert_path, key_path) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let garbage = write(&dir, "garbage.pem", "hello");
    let missing = dir.path().join("missing.pem");
    let cases = [
        (
            certificates(Tls::Grpc, FileRole::Ca, &key_path).unwrap_err(),
            format!(
                "gRPC TLS CA file {}: no PEM certificate (BEGIN CERTIFICATE) in it; found \
                 only PRIVATE KEY",
                key_path.display()
            ),
        ),
        (
            private_key(Tls::Redis, &cert_path).unwrap_err(),
            format!(
                "Redis TLS key file {}: no usable PEM private key: no PEM private key",
                cert_path.display()
            ),
        ),
        (
            certificates(Tls::Xds, FileRole::Cert, &garbage).unwrap_err(),
            "found no PEM section at all".to_string(),
        ),
        (
            certificates(Tls::Redis, FileRole::Ca, &missing).unwrap_err(),
            format!("cannot read Redis TLS CA file {}: ", missing.display()),
        ),
        (
            client_pair(Tls::Xds, None, Some(&key_path)).unwrap_err(),
            "xDS TLS: a client certificate needs both --xds-tls-cert and --xds-tls-key \
             (only the key file was given)"
                .to_string(),
        ),
    ];
    for (error, message) in cases {
        let error = error.to_string();
        assert!(error.contains(&message), "{error:?} lacks {message:?}");
    }
}
