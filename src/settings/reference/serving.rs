//! The reference's server-wide variables: the gRPC listener (`GRPC_UDS`, connection age,
//! TLS: `GRPC_SERVER_USE_TLS` and what goes with it), health
//! (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), which store and which config source
//! (`BACKEND_TYPE`, `CONFIG_TYPE`) and counting while over the limit
//! (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).

use std::path::PathBuf;
use std::time::Duration;

use super::duration::parse_go_duration;
use super::mapping::{Mapping, bad};
use crate::settings::error::SettingsError;
use crate::settings::serve::ServeSettings;

/// The reference's `GRPC_MAX_CONNECTION_AGE` default, which applies when only the grace is
/// given.
const REFERENCE_MAX_CONNECTION_AGE: Duration = Duration::from_secs(24 * 3600);

impl Mapping<'_> {
    /// Every variable of this module.
    pub(super) fn serving(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        self.backend_type(settings)?;
        self.config_type(settings)?;
        self.grpc_listener(settings)?;
        self.health(settings)?;
        if let Some(stop) = self.parse_bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
            let why = if stop {
                "floodgate never debits a denied request: what this asks, and more"
            } else {
                "floodgate never debits a denied request (no counter pollution)"
            };
            self.no_effect("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", why);
        }
        Ok(())
    }

    /// `BACKEND_TYPE`: `redis` is what floodgate does with `REDIS_URL`; `memcache` cannot be
    /// honoured, and serving from memory instead would make every replica count alone.
    fn backend_type(&mut self, settings: &ServeSettings) -> Result<(), SettingsError> {
        let Some(value) = self.get("BACKEND_TYPE") else {
            return Ok(());
        };
        match value.to_ascii_lowercase().as_str() {
            "redis" => {
                let redis = settings.redis_url.is_some()
                    || settings.redis_sentinel.is_some()
                    || !settings.redis_cluster.is_empty()
                    || self.get("REDIS_URL").is_some();
                if redis {
                    self.applied("BACKEND_TYPE");
                } else {
                    self.no_effect("BACKEND_TYPE", "no REDIS_URL: the in-memory store is used");
                }
                Ok(())
            }
            "memcache" => Err(SettingsError::Refused {
                name: "BACKEND_TYPE",
                value: value.to_string(),
                why: "floodgate has no memcache store; serving from memory instead would make \
                      every replica count on its own. Keep the counters in Redis \
                      (BACKEND_TYPE=redis, REDIS_URL)"
                    .into(),
            }),
            _ => Err(bad("BACKEND_TYPE", value, "redis or memcache")),
        }
    }

    /// `CONFIG_TYPE`: `FILE` is floodgate's way; `GRPC_XDS_SOTW` takes the limits from an
    /// xDS control plane (see `xds`).
    fn config_type(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let Some(value) = self.get("CONFIG_TYPE") else {
            return Ok(());
        };
        match value.to_ascii_uppercase().as_str() {
            "FILE" => {
                self.applied("CONFIG_TYPE");
                Ok(())
            }
            "GRPC_XDS_SOTW" => {
                self.applied("CONFIG_TYPE");
                self.xds(settings)
            }
            _ => Err(bad("CONFIG_TYPE", value, "FILE or GRPC_XDS_SOTW")),
        }
    }

    /// `GRPC_UDS` → `--grpc-uds`; `GRPC_MAX_CONNECTION_AGE` / `_GRACE` →
    /// `--grpc-max-connection-age` / `-grace`.
    fn grpc_listener(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let connections = &mut settings.grpc_connections;
        if let Some(path) = self.get("GRPC_UDS") {
            if self.own("grpc_uds") {
                self.override_by(&["GRPC_UDS"], "--grpc-uds");
            } else if self.own("grpc_addr") {
                self.override_by(&["GRPC_UDS"], "--grpc-addr");
            } else {
                connections.grpc_uds = Some(PathBuf::from(path));
                self.applied("GRPC_UDS");
            }
        }
        let age = self.go_duration("GRPC_MAX_CONNECTION_AGE")?;
        let grace = self.go_duration("GRPC_MAX_CONNECTION_AGE_GRACE")?;
        if self.own("grpc_max_connection_age") {
            self.override_by(
                &["GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"],
                "--grpc-max-connection-age",
            );
            return Ok(());
        }
        if age.is_none() && grace.is_none() {
            return Ok(());
        }
        // Zero means "infinity" for grpc-go; the grace alone applies to the reference's 24 h.
        let age = age.unwrap_or(REFERENCE_MAX_CONNECTION_AGE);
        if age.is_zero() {
            for name in self.present(&["GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"])
            {
                self.no_effect(name, "a zero age means connections are never closed");
            }
            return Ok(());
        }
        connections.grpc_max_connection_age = Some(age);
        self.applied("GRPC_MAX_CONNECTION_AGE");
        if let Some(grace) = grace {
            if grace.is_zero() {
                self.no_effect(
                    "GRPC_MAX_CONNECTION_AGE_GRACE",
                    "zero: an old connection stays open until its calls finish",
                );
            } else {
                connections.grpc_max_connection_age_grace = Some(grace);
                self.applied("GRPC_MAX_CONNECTION_AGE_GRACE");
            }
        }
        Ok(())
    }

    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` → `--health-requires-limits`.
    fn health(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        const NAME: &str = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED";
        let Some(on) = self.parse_bool(NAME)? else {
            return Ok(());
        };
        if self.own("health_requires_limits") {
            self.override_by(&[NAME], "--health-requires-limits");
        } else {
            settings.health_requires_limits = on;
            self.applied(NAME);
        }
        Ok(())
    }

    /// A Go duration variable.
    pub(super) fn go_duration(
        &self,
        name: &'static str,
    ) -> Result<Option<Duration>, SettingsError> {
        self.get(name)
            .map(|v| {
                parse_go_duration(v).ok_or_else(|| bad(name, v, "a Go duration such as 30s or 1h"))
            })
            .transpose()
    }
}

impl Mapping<'_> {
    /// `GRPC_SERVER_USE_TLS` with `GRPC_SERVER_TLS_CERT` / `GRPC_SERVER_TLS_KEY` → TLS on the
    /// gRPC port, and `GRPC_CLIENT_TLS_CACERT` → mutual TLS, as the reference does.
    /// `GRPC_CLIENT_TLS_SAN` (accept only client certificates with that DNS name) is refused:
    /// ignoring it would accept every certificate the CA issued.
    pub(super) fn grpc_tls(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        const VARS: [&str; 5] = [
            "GRPC_SERVER_USE_TLS",
            "GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_CACERT",
            "GRPC_CLIENT_TLS_SAN",
        ];
        let enabled = self.parse_bool("GRPC_SERVER_USE_TLS")?;
        if [
            "grpc_tls_cert_file",
            "grpc_tls_key_file",
            "grpc_tls_client_ca_file",
        ]
        .iter()
        .any(|id| self.own(id))
        {
            self.override_by(&VARS, "--grpc-tls-*");
            return Ok(());
        }
        if enabled != Some(true) {
            if enabled == Some(false) {
                // Plaintext, as floodgate serves by default.
                self.applied("GRPC_SERVER_USE_TLS");
            }
            for name in self.present(&VARS[1..]) {
                self.no_effect(name, "GRPC_SERVER_USE_TLS is not true");
            }
            return Ok(());
        }
        if let Some(san) = self.get("GRPC_CLIENT_TLS_SAN") {
            return Err(bad(
                "GRPC_CLIENT_TLS_SAN",
                san,
                "no value: floodgate cannot restrict client certificates to one name, and \
                 refuses to start rather than accept every certificate the CA issued",
            ));
        }
        let (Some(cert), Some(key)) = (
            self.get("GRPC_SERVER_TLS_CERT"),
            self.get("GRPC_SERVER_TLS_KEY"),
        ) else {
            return Err(bad(
                "GRPC_SERVER_USE_TLS",
                "true",
                "GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY with it",
            ));
        };
        let tls = &mut settings.grpc_tls;
        tls.grpc_tls_cert_file = Some(PathBuf::from(cert));
        tls.grpc_tls_key_file = Some(PathBuf::from(key));
        tls.grpc_tls_client_ca_file = self.get("GRPC_CLIENT_TLS_CACERT").map(PathBuf::from);
        for name in self.present(&VARS[..4]) {
            self.applied(name);
        }
        Ok(())
    }
}
