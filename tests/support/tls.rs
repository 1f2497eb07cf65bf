//! TLS clients of the gRPC port: a tonic client, and a bare handshake that reports the
//! certificate the server presented.

use std::net::SocketAddr;
use std::sync::Arc;

use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ProtocolVersion, RootCertStore, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::certs::{Ca, Leaf};

/// A gRPC client over TLS to `addr` (as `localhost`), trusting `ca`, presenting `identity`
/// if given. Errors are returned: refusals are what some tests expect.
pub async fn client(
    addr: SocketAddr,
    ca: &Ca,
    identity: Option<&Leaf>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert_pem, &leaf.key_pem));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

/// Completes a TLS handshake with `addr` (ALPN h2, trusting `cas`, presenting `identity` if
/// given) and returns the leaf certificate the server presented, DER.
pub async fn served_certificate(addr: SocketAddr, cas: &[&Ca], identity: Option<&Leaf>) -> Vec<u8> {
    handshake(addr, cas, identity, rustls::DEFAULT_VERSIONS)
        .await
        .0
}

/// Completes a TLS handshake offering only `versions`; returns the leaf certificate the
/// server presented (DER) and the version negotiated.
pub async fn handshake(
    addr: SocketAddr,
    cas: &[&Ca],
    identity: Option<&Leaf>,
    versions: &[&'static SupportedProtocolVersion],
) -> (Vec<u8>, ProtocolVersion) {
    let tls = connect(addr, cas, identity, versions).await;
    let session = tls.get_ref().1;
    (
        session.peer_certificates().unwrap()[0].to_vec(),
        session.protocol_version().unwrap(),
    )
}

/// A TLS connection to `addr` (ALPN h2, trusting `cas`, presenting `identity` if given,
/// offering only `versions`), handshake done, nothing sent over it yet.
pub async fn connect(
    addr: SocketAddr,
    cas: &[&Ca],
    identity: Option<&Leaf>,
    versions: &[&'static SupportedProtocolVersion],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
    let mut config = match identity {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}
