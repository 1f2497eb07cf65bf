//! The xDS config source's connection, built from settings: the endpoint (TLS, its files
//! read and checked by [`crate::pem`]; timeouts), the node, the extra headers and the backoff
//! handed to [`crate::sources::xds`].

use std::str::FromStr;

use prost_types::{Struct, Value, value::Kind};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::error::ServerError;
use crate::config::Defaults;
use crate::pem::{self, FileRole, Tls};
use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::settings::xds::{XdsSettings, parse_pairs};
use crate::sources::xds::{Backoff, XdsOptions};

/// The client options `settings` ask for, or why they cannot be used (before any port is
/// bound, so a mistake exits 64).
pub(super) fn options(
    settings: &XdsSettings,
    url: &str,
    defaults: Defaults,
    merge_domains: bool,
) -> Result<XdsOptions, ServerError> {
    let bad = |why: String| ServerError::Settings(format!("xDS: {why}"));
    // The reference takes `host:port`; a scheme is accepted too.
    let tls = settings.xds_tls || url.starts_with("https://");
    let uri = if url.contains("://") {
        url.to_string()
    } else if tls {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| bad(format!("'{url}' is not a server address: {e}")))?
        .connect_timeout(settings.xds_connect_timeout)
        // Keep a half-open connection from looking alive for ever.
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if tls {
        let mut config = ClientTlsConfig::new();
        if let Some(ca) = &settings.xds_tls_ca {
            let ca = pem::certificates(Tls::Xds, FileRole::Ca, ca)?;
            config = config.ca_certificate(Certificate::from_pem(ca.pem));
        }
        if let Some(san) = &settings.xds_tls_san {
            config = config.domain_name(san.clone());
        }
        let (cert, key) = (
            settings.xds_tls_cert.as_deref(),
            settings.xds_tls_key.as_deref(),
        );
        if let Some((cert, key)) = pem::client_pair(Tls::Xds, cert, key)? {
            config = config.identity(Identity::from_pem(cert.pem, key.pem));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| bad(format!("TLS: {e}")))?;
    }
    let metadata =
        parse_pairs(&settings.xds_node_metadata).map_err(|e| bad(format!("node metadata: {e}")))?;
    let node = Node {
        id: settings.xds_node_id.clone(),
        cluster: String::new(),
        metadata: (!metadata.is_empty()).then(|| Struct {
            fields: metadata
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        Value {
                            kind: Some(Kind::StringValue(v)),
                        },
                    )
                })
                .collect(),
        }),
        user_agent_name: "floodgate".into(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").into(),
        )),
    };
    let mut headers = MetadataMap::new();
    for (name, value) in
        parse_pairs(&settings.xds_headers).map_err(|e| bad(format!("headers: {e}")))?
    {
        let key = MetadataKey::from_str(&name.to_ascii_lowercase())
            .map_err(|_| bad(format!("'{name}' is not a header name")))?;
        let value = MetadataValue::from_str(&value)
            .map_err(|_| bad(format!("the value of header '{name}' is not valid")))?;
        headers.insert(key, value);
    }
    if !(0.0..=1.0).contains(&settings.xds_backoff_jitter) {
        return Err(bad("the backoff jitter is a fraction from 0 to 1".into()));
    }
    Ok(XdsOptions {
        endpoint,
        node,
        headers,
        max_message_bytes: settings.xds_max_message_bytes,
        backoff: Backoff {
            initial: settings.xds_backoff_initial,
            max: settings.xds_backoff_max.max(settings.xds_backoff_initial),
            jitter: settings.xds_backoff_jitter,
        },
        defaults,
        merge_domains,
    })
}
