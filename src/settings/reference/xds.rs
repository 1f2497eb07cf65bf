//! The reference's xDS variables (`CONFIG_TYPE=GRPC_XDS_SOTW` and what goes with it) → the
//! `--config-xds` / `--xds-*` settings, unless floodgate's own flag set the value. Defaults
//! are the reference's (server `localhost:18000`, node `default`, backoff 10 s to 60 s).

use super::mapping::{Mapping, bad};
use crate::settings::error::SettingsError;
use crate::settings::serve::ServeSettings;

/// The reference's management-server default.
const REFERENCE_SERVER_URL: &str = "localhost:18000";

impl Mapping<'_> {
    /// Every xDS variable, when `CONFIG_TYPE=GRPC_XDS_SOTW` chose that source.
    pub(super) fn xds(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let xds = &mut settings.xds;
        if self.own("config_xds") {
            self.override_by(&["CONFIG_GRPC_XDS_SERVER_URL"], "--config-xds");
        } else {
            let url = self.get("CONFIG_GRPC_XDS_SERVER_URL");
            xds.config_xds = Some(url.unwrap_or(REFERENCE_SERVER_URL).to_string());
            if url.is_some() {
                self.applied("CONFIG_GRPC_XDS_SERVER_URL");
            }
        }
        let strings: [(&'static str, &str, &mut String); 3] = [
            (
                "CONFIG_GRPC_XDS_NODE_ID",
                "xds_node_id",
                &mut xds.xds_node_id,
            ),
            (
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "xds_node_metadata",
                &mut xds.xds_node_metadata,
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "xds_headers",
                &mut xds.xds_headers,
            ),
        ];
        for (name, id, field) in strings {
            if let Some(value) = self.unless_own(name, id) {
                *field = value.to_string();
                self.applied(name);
            }
        }
        let paths = [
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                "xds_tls_ca",
                &mut xds.xds_tls_ca,
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                "xds_tls_cert",
                &mut xds.xds_tls_cert,
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                "xds_tls_key",
                &mut xds.xds_tls_key,
            ),
        ];
        for (name, id, field) in paths {
            if let Some(value) = self.unless_own(name, id) {
                *field = Some(value.into());
                self.applied(name);
            }
        }
        if let Some(san) = self.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
            xds.xds_tls_san = Some(san.to_string());
            self.applied("CONFIG_GRPC_XDS_SERVER_TLS_SAN");
        }
        for (name, field) in [
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", &mut xds.xds_tls),
            (
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
                &mut xds.xds_force_start,
            ),
        ] {
            if let Some(on) = self.parse_bool(name)? {
                *field |= on;
                self.applied(name);
            }
        }
        for (name, field) in [
            (
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
                &mut xds.xds_connect_timeout,
            ),
            (
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                &mut xds.xds_backoff_initial,
            ),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", &mut xds.xds_backoff_max),
        ] {
            if let Some(d) = self.go_duration(name)? {
                if !d.is_zero() {
                    *field = d;
                }
                self.applied(name);
            }
        }
        if let Some(v) = self.get("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            let factor: f64 = v
                .parse()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(|| {
                    bad(
                        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                        v,
                        "a fraction from 0 to 1",
                    )
                })?;
            xds.xds_backoff_jitter = factor;
            self.applied("XDS_CLIENT_BACKOFF_RANDOM_FACTOR");
        }
        if let Some(false) = self.parse_bool("XDS_CLIENT_BACKOFF_JITTER")? {
            xds.xds_backoff_jitter = 0.0;
        }
        if self.get("XDS_CLIENT_BACKOFF_JITTER").is_some() {
            self.applied("XDS_CLIENT_BACKOFF_JITTER");
        }
        if let Some(v) = self.get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
            xds.xds_max_message_bytes = v
                .parse()
                .map_err(|_| bad("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", v, "a number of bytes"))?;
            self.applied("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES");
        }
        Ok(())
    }
}
