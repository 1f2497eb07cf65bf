//! Envoy calling floodgate over TLS and mutual TLS, configured as docs/deploy.md shows
//! (`UpstreamTlsContext` with SNI, ALPN h2, the CA, and Envoy's own certificate for mTLS).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::transport::tls::TlsFiles;
use serde_json::{Value, json};
use support::TestServer;
use support::certs::Pki;
use support::envoy::{Bootstrap, Envoy, ratelimit_filter};

const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// The `ratelimit` cluster's TLS: SNI and SAN `localhost` (the test certificates' name), ALPN
/// h2, the test CA, and Envoy's client certificate when `client` is set.
fn upstream_tls(pki: &Pki, client: bool) -> Value {
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let mut context = json!({
        "alpn_protocols": ["h2"],
        "validation_context": {
            "trusted_ca": {"filename": path(&pki.ca)},
            "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": "localhost"}}]
        }
    });
    if client {
        context["tls_certificates"] = json!([{
            "certificate_chain": {"filename": path(&pki.client_cert)},
            "private_key": {"filename": path(&pki.client_key)}
        }]);
    }
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "localhost",
            "common_tls_context": context
        }
    })
}

/// Statuses of three requests through an Envoy whose `ratelimit` cluster speaks TLS to
/// `server`, with its client certificate when `client` is set; and Envoy's RLS error count.
async fn through_tls(server: &TestServer, pki: &Pki, client: bool) -> (Vec<u16>, u64) {
    let mut bootstrap = Bootstrap::rls(
        &[server.grpc_addr],
        ratelimit_filter("edge"),
        "- actions: [{remote_address: {}}]",
    );
    bootstrap.cluster("ratelimit")["transport_socket"] = upstream_tls(pki, client);
    let envoy = Envoy::start(&bootstrap).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(envoy.get("/", &[]).await.status);
    }
    (statuses, envoy.ratelimit_stat("error").await)
}

/// Over TLS, Envoy's answers are floodgate's: 2 of 3 admitted, no RLS error.
#[tokio::test]
async fn envoy_over_tls() {
    let pki = Pki::generate();
    let server = TestServer::with(LIMITS)
        .tls(TlsFiles {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca: None,
        })
        .start()
        .await;
    assert_eq!(
        through_tls(&server, &pki, false).await,
        (vec![200, 200, 429], 0)
    );
    server.stop().await;
}

/// Under mutual TLS, Envoy with its client certificate is answered (2 of 3 admitted, no
/// error); an Envoy without one is refused the connection, which it counts as RLS errors
/// (and, failing open, lets every request through).
#[tokio::test]
async fn envoy_over_mutual_tls() {
    let pki = Pki::generate();
    let server = TestServer::with(LIMITS)
        .tls(TlsFiles {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca: Some(pki.ca.clone()),
        })
        .start()
        .await;
    assert_eq!(
        through_tls(&server, &pki, true).await,
        (vec![200, 200, 429], 0)
    );
    assert_eq!(
        through_tls(&server, &pki, false).await,
        (vec![200, 200, 200], 3)
    );
    server.stop().await;
}
