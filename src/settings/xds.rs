//! `floodgate serve`'s xDS config source: limits pushed by a control plane over ADS (state of
//! the world) instead of read from files. Off unless `--config-xds` (or, in reference mode,
//! `CONFIG_TYPE=GRPC_XDS_SOTW`) names the management server. Defaults are the reference's.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// Where the limits come from when a control plane pushes them.
#[derive(Clone, Debug, Args)]
pub struct XdsSettings {
    /// Take the limits from this xDS management server (`host:port`, or `http://` /
    /// `https://` URL) over ADS instead of from files.
    #[arg(long, env = "FLOODGATE_CONFIG_XDS", value_name = "URL")]
    pub config_xds: Option<String>,

    /// The node id sent to the control plane (it keys its snapshots on it).
    #[arg(long, env = "FLOODGATE_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,

    /// Node metadata, `key1:val1,key2=val2` (either separator), sent with the node.
    #[arg(long, env = "FLOODGATE_XDS_NODE_METADATA", default_value = "")]
    pub xds_node_metadata: String,

    /// Extra gRPC headers on the ADS stream, `name1:value1,name2:value2`.
    #[arg(long, env = "FLOODGATE_XDS_HEADERS", default_value = "")]
    pub xds_headers: String,

    /// Serve before a first configuration has arrived (health SERVING, every request OK);
    /// by default the server is NOT_SERVING until one has loaded.
    #[arg(long, env = "FLOODGATE_XDS_FORCE_START")]
    pub xds_force_start: bool,

    /// Connect to the management server with TLS.
    #[arg(long, env = "FLOODGATE_XDS_TLS")]
    pub xds_tls: bool,

    /// CA certificate (PEM) the management server's certificate must chain to.
    #[arg(long, env = "FLOODGATE_XDS_TLS_CA", value_name = "FILE")]
    pub xds_tls_ca: Option<PathBuf>,

    /// Name the management server's certificate must carry (default: the URL's host).
    #[arg(long, env = "FLOODGATE_XDS_TLS_SAN")]
    pub xds_tls_san: Option<String>,

    /// Client certificate (PEM) for mutual TLS.
    #[arg(long, env = "FLOODGATE_XDS_TLS_CERT", value_name = "FILE")]
    pub xds_tls_cert: Option<PathBuf>,

    /// Client private key (PEM) for mutual TLS.
    #[arg(long, env = "FLOODGATE_XDS_TLS_KEY", value_name = "FILE")]
    pub xds_tls_key: Option<PathBuf>,

    /// How long one connection attempt may take, in seconds.
    #[arg(long, env = "FLOODGATE_XDS_CONNECT_TIMEOUT", value_name = "SECONDS",
          value_parser = super::parse::parse_positive_seconds, default_value = "3")]
    pub xds_connect_timeout: Duration,

    /// First delay before reconnecting, in seconds (doubles up to the maximum).
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_INITIAL", value_name = "SECONDS",
          value_parser = super::parse::parse_positive_seconds, default_value = "10")]
    pub xds_backoff_initial: Duration,

    /// Longest delay before reconnecting, in seconds.
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_MAX", value_name = "SECONDS",
          value_parser = super::parse::parse_positive_seconds, default_value = "60")]
    pub xds_backoff_max: Duration,

    /// Each delay is drawn within ± this fraction of itself (0 to 1), so replicas do not
    /// reconnect in step.
    #[arg(long, env = "FLOODGATE_XDS_BACKOFF_JITTER", default_value_t = 0.5)]
    pub xds_backoff_jitter: f64,

    /// Largest ADS response accepted, in bytes (0: tonic's default, 4 MiB).
    #[arg(long, env = "FLOODGATE_XDS_MAX_MESSAGE_BYTES", default_value_t = 0)]
    pub xds_max_message_bytes: usize,
}

/// `key:value` or `key=value` pairs separated by commas (the reference's format for node
/// metadata and extra headers); empty items are skipped.
pub fn parse_pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let at = item
            .find([':', '='])
            .ok_or_else(|| format!("'{item}' is not key:value"))?;
        pairs.push((
            item[..at].trim().to_string(),
            item[at + 1..].trim().to_string(),
        ));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests;
