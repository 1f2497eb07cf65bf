//! The reference server's environment variables → floodgate settings.
//!
//! envoyproxy/ratelimit is configured only through environment variables (`RUNTIME_ROOT`,
//! `REDIS_URL`, `GRPC_PORT`, …). So that an operator can swap the image and keep the
//! Deployment's `env:`, [`apply_reference_env`] reads those variables from a key→value map
//! (the process environment in `main`, a literal map in tests) and fills in every setting that
//! floodgate's own flag or `FLOODGATE_*` variable did not set: floodgate's own always win.
//!
//! Variables that floodgate accepts but cannot honour, or that change nothing, are listed in
//! the [`ReferenceReport`] (logged once at start-up); a value that cannot be parsed is a
//! [`SettingsError`], which `main` turns into exit code 64 before any port is bound.
//! Variables set to the empty string count as unset (a Kubernetes `value: ""`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::{LogFormat, ServeSettings};

/// Approximate bytes one entry of the reference's local cache (freecache) takes: a Redis key
/// of ~100 bytes plus freecache's entry header and slack. `LOCAL_CACHE_SIZE_IN_BYTES` is
/// divided by it to size floodgate's cache, which counts entries.
const LOCAL_CACHE_BYTES_PER_ENTRY: u64 = 128;

/// A setting that cannot be used; `main` exits with code 64.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A reference environment variable holds a value floodgate cannot parse.
    #[error("environment variable {name}={value:?}: {reason}")]
    BadReferenceValue {
        /// The variable.
        name: &'static str,
        /// Its value (`***` for secrets).
        value: String,
        /// What was expected.
        reason: String,
    },
    /// Neither `--config` nor the reference's `RUNTIME_*` variables say where the limits are.
    #[error(
        "no limits to load: give --config FILE|DIR (or FLOODGATE_CONFIG), or the reference \
         server's RUNTIME_ROOT / RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY"
    )]
    NoLimits,
}

/// Reference settings that belong to the response-header and metrics options (their flags
/// live elsewhere): recorded here, for those options to take when their own flags are unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceOverrides {
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub response_headers: Option<bool>,
    /// `LIMIT_LIMIT_HEADER` (reference default `RateLimit-Limit`).
    pub header_limit: Option<String>,
    /// `LIMIT_REMAINING_HEADER` (reference default `RateLimit-Remaining`).
    pub header_remaining: Option<String>,
    /// `LIMIT_RESET_HEADER` (reference default `RateLimit-Reset`).
    pub header_reset: Option<String>,
    /// `NEAR_LIMIT_RATIO` (reference default 0.8), in `[0, 1]`.
    pub near_limit_ratio: Option<f64>,
    /// `RESPONSE_DYNAMIC_METADATA` (reference default false).
    pub dynamic_metadata: Option<bool>,
    /// The tracing filter from `LOG_LEVEL`, when `RUST_LOG` is unset.
    pub log_filter: Option<String>,
}

/// What [`apply_reference_env`] did, for the start-up log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceReport {
    /// Reference variables that set something (names, with a note where the mapping is
    /// approximate).
    pub applied: Vec<String>,
    /// Reference variables ignored because floodgate's own flag or variable is set.
    pub overridden: Vec<String>,
    /// Reference variables accepted that change nothing, each with the reason.
    pub no_effect: Vec<String>,
    /// Values for settings configured elsewhere (response headers, near-limit ratio, logs).
    pub overrides: ReferenceOverrides,
}

impl ReferenceReport {
    /// Logs the report: one info line for what was applied, one warning for what was not.
    pub fn log(&self) {
        if !self.applied.is_empty() {
            tracing::info!(applied = %self.applied.join(", "), "reference environment variables");
        }
        if !self.no_effect.is_empty() || !self.overridden.is_empty() {
            tracing::warn!(
                no_effect = %self.no_effect.join("; "),
                overridden = %self.overridden.join("; "),
                "reference environment variables accepted without effect"
            );
        }
    }
}

/// Fills `settings` from the reference server's environment variables in `env`, wherever
/// floodgate's own flag or `FLOODGATE_*` variable did not set a value (`matches` are the
/// `serve` subcommand's, telling where each value came from). Then checks that the limits
/// path is known. Pure: reads only its arguments.
pub fn apply_reference_env(
    settings: &mut ServeSettings,
    matches: &ArgMatches,
    env: &HashMap<String, String>,
) -> Result<ReferenceReport, SettingsError> {
    let mut mapping = Mapping {
        env,
        matches,
        report: ReferenceReport::default(),
    };
    mapping.runtime(settings)?;
    mapping.addresses(settings)?;
    mapping.grpc_tls(settings)?;
    mapping.redis(settings)?;
    mapping.store(settings)?;
    mapping.service(settings)?;
    mapping.logs(settings)?;
    if settings.config.is_none() {
        return Err(SettingsError::NoLimits);
    }
    Ok(mapping.report)
}

/// The state of one [`apply_reference_env`] call.
struct Mapping<'a> {
    env: &'a HashMap<String, String>,
    matches: &'a ArgMatches,
    report: ReferenceReport,
}

impl<'a> Mapping<'a> {
    /// The variable's value; empty counts as unset.
    fn get(&self, name: &str) -> Option<&'a str> {
        let env: &'a HashMap<String, String> = self.env;
        env.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// Whether floodgate's own flag or `FLOODGATE_*` variable set the argument `id`.
    fn own(&self, id: &str) -> bool {
        matches!(
            self.matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    }

    /// Which of `names` are set.
    fn present(&self, names: &[&'static str]) -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|n| self.get(n).is_some())
            .collect()
    }

    /// Records `names` (those set) as overridden by floodgate's `flag`.
    fn override_by(&mut self, names: &[&'static str], flag: &str) {
        for name in self.present(names) {
            self.report.overridden.push(format!("{name} (by {flag})"));
        }
    }

    fn no_effect(&mut self, name: &str, why: &str) {
        self.report.no_effect.push(format!("{name} ({why})"));
    }

    fn applied(&mut self, name: &str) {
        self.report.applied.push(name.to_string());
    }

    fn parse_bool(&self, name: &'static str) -> Result<Option<bool>, SettingsError> {
        self.get(name).map(|v| go_bool(name, v)).transpose()
    }

    /// The recorded response-header and near-limit values → their flags, unless floodgate's
    /// own flag or variable set them.
    fn response(&mut self, settings: &mut ServeSettings) {
        let overrides = self.report.overrides.clone();
        let response = &mut settings.response;
        let mut take = |name: &'static str, id: &str, flag: &str, apply: &mut dyn FnMut()| {
            if self.get(name).is_none() {
                return;
            }
            if self.own(id) {
                self.override_by(&[name], flag);
            } else {
                apply();
                self.applied(name);
            }
        };
        if let Some(on) = overrides.response_headers {
            take(
                "LIMIT_RESPONSE_HEADERS_ENABLED",
                "response_headers",
                "--response-headers",
                &mut || response.response_headers = on,
            );
        }
        for (name, id, flag, value) in [
            (
                "LIMIT_LIMIT_HEADER",
                "header_limit",
                "--header-limit",
                &overrides.header_limit,
            ),
            (
                "LIMIT_REMAINING_HEADER",
                "header_remaining",
                "--header-remaining",
                &overrides.header_remaining,
            ),
            (
                "LIMIT_RESET_HEADER",
                "header_reset",
                "--header-reset",
                &overrides.header_reset,
            ),
        ] {
            if let Some(value) = value {
                take(name, id, flag, &mut || {
                    let slot = match id {
                        "header_limit" => &mut response.header_limit,
                        "header_remaining" => &mut response.header_remaining,
                        _ => &mut response.header_reset,
                    };
                    *slot = value.clone();
                });
            }
        }
        if let Some(on) = overrides.dynamic_metadata {
            take(
                "RESPONSE_DYNAMIC_METADATA",
                "response_dynamic_metadata",
                "--response-dynamic-metadata",
                &mut || response.response_dynamic_metadata = on,
            );
        }
        if let Some(ratio) = overrides.near_limit_ratio {
            take(
                "NEAR_LIMIT_RATIO",
                "near_limit_ratio",
                "--near-limit-ratio",
                // In [0, 1], checked when parsed: the narrowing cannot go out of range.
                &mut || response.near_limit_ratio = ratio as f32,
            );
        }
    }

    /// `HOST`/`PORT` → `--http-addr`, `GRPC_HOST`/`GRPC_PORT` → `--grpc-addr`.
    fn addresses(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        for (id, flag, host, port) in [
            ("http_addr", "--http-addr", "HOST", "PORT"),
            ("grpc_addr", "--grpc-addr", "GRPC_HOST", "GRPC_PORT"),
        ] {
            if self.own(id) {
                self.override_by(&[host, port], flag);
                continue;
            }
            let addr = match id {
                "http_addr" => &mut settings.http_addr,
                _ => &mut settings.grpc_addr,
            };
            if let Some(value) = self.get(host) {
                addr.set_ip(parse_host(host, value)?);
                self.report.applied.push(host.to_string());
            }
            if let Some(value) = self.get(port) {
                addr.set_port(
                    value
                        .parse()
                        .map_err(|_| bad(port, value, "a port, 0 to 65535"))?,
                );
                self.report.applied.push(port.to_string());
            }
        }
        Ok(())
    }

    /// `GRPC_SERVER_USE_TLS` with `GRPC_SERVER_TLS_CERT` / `GRPC_SERVER_TLS_KEY` → TLS on the
    /// gRPC port, and `GRPC_CLIENT_TLS_CACERT` → mutual TLS, as the reference does.
    /// `GRPC_CLIENT_TLS_SAN` (accept only client certificates with that DNS name) is refused:
    /// ignoring it would accept every certificate the CA issued.
    fn grpc_tls(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
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

    /// `REDIS_URL` and its companions → `--redis-url` (and, with `REDIS_TYPE=sentinel`,
    /// `--redis-sentinel` / `--redis-sentinel-nodes`); `REDIS_POOL_SIZE` →
    /// `--redis-pool-size`; the `REDIS_TLS_*` files → `--redis-tls-*-file`.
    fn redis(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        const URL_VARS: [&str; 5] = [
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS",
        ];
        // Parse everything first: a bad value is an error even when it would be ignored.
        let socket = self
            .get("REDIS_SOCKET_TYPE")
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "tcp" => Ok(Socket::Tcp),
                "unix" => Ok(Socket::Unix),
                _ => Err(bad("REDIS_SOCKET_TYPE", v, "tcp or unix")),
            })
            .transpose()?;
        let kind = self
            .get("REDIS_TYPE")
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "single" => Ok(RedisType::Single),
                "sentinel" => Ok(RedisType::Sentinel),
                "cluster" => Ok(RedisType::Cluster),
                _ => Err(bad("REDIS_TYPE", v, "single, sentinel or cluster")),
            })
            .transpose()?;
        let tls = self.parse_bool("REDIS_TLS")?;
        let pool_size = self
            .get("REDIS_POOL_SIZE")
            .map(|v| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| bad("REDIS_POOL_SIZE", v, "a number from 1 to 1024"))
            })
            .transpose()?;

        if self.own("redis_pool_size") {
            self.override_by(&["REDIS_POOL_SIZE"], "--redis-pool-size");
        } else if let Some(size) = pool_size {
            settings.redis_pool_size = size;
            self.applied("REDIS_POOL_SIZE");
        }

        let redis = ["redis_url", "redis_sentinel", "redis_cluster"]
            .iter()
            .any(|id| self.own(id))
            || self.get("REDIS_URL").is_some();
        self.redis_tls_files(settings, redis, tls == Some(true))?;
        for (id, flag) in [
            ("redis_url", "--redis-url"),
            ("redis_sentinel", "--redis-sentinel"),
            ("redis_cluster", "--redis-cluster"),
        ] {
            if self.own(id) {
                self.override_by(&URL_VARS, flag);
                return Ok(());
            }
        }
        let Some(raw) = self.get("REDIS_URL") else {
            for name in self.present(&URL_VARS[1..]) {
                self.no_effect(name, "no REDIS_URL: the in-memory store is used");
            }
            return Ok(());
        };
        let auth = self.auth();
        if kind == Some(RedisType::Cluster) {
            // The reference's form: REDIS_URL=host1:port,host2:port (full URLs accepted too).
            if socket == Some(Socket::Unix) {
                return Err(bad(
                    "REDIS_SOCKET_TYPE",
                    "unix",
                    "tcp: Redis Cluster nodes are reached over TCP",
                ));
            }
            let seeds = raw
                .split(',')
                .map(str::trim)
                .filter(|seed| !seed.is_empty())
                .map(|seed| match seed.contains("://") {
                    true => Ok(seed.to_string()),
                    false => tcp_url(seed, tls == Some(true), auth),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if seeds.is_empty() {
                return Err(bad("REDIS_URL", raw, "host:port[,host:port...]"));
            }
            settings.redis_cluster = seeds;
            for name in self.present(&URL_VARS) {
                self.applied(name);
            }
            return Ok(());
        }
        let raw = raw.trim().to_string();
        if kind == Some(RedisType::Sentinel) {
            if socket == Some(Socket::Unix) {
                return Err(bad(
                    "REDIS_SOCKET_TYPE",
                    "unix",
                    "tcp (REDIS_TYPE=sentinel)",
                ));
            }
            return self.sentinel(settings, &raw, tls == Some(true));
        }
        if raw.contains("://") {
            // Already a URL: it says everything itself.
            for name in self.present(&["REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS"]) {
                self.no_effect(name, "REDIS_URL is a full URL");
            }
            settings.redis_url = Some(raw);
            self.applied("REDIS_URL");
            if kind.is_some() {
                self.applied("REDIS_TYPE");
            }
            return Ok(());
        }
        let address = raw;
        let socket = socket.unwrap_or(if address.starts_with('/') {
            Socket::Unix
        } else {
            Socket::Tcp
        });
        let url = match socket {
            Socket::Tcp => tcp_url(&address, tls == Some(true), auth)?,
            Socket::Unix => {
                if tls == Some(true) {
                    self.no_effect("REDIS_TLS", "no TLS over a unix socket");
                }
                let mut url = format!("redis+unix://{address}");
                if let Some((user, password)) = auth {
                    url.push_str(&format!("?pass={}", encode(password)));
                    if let Some(user) = user {
                        url.push_str(&format!("&user={}", encode(user)));
                    }
                }
                url
            }
        };
        settings.redis_url = Some(url);
        for name in self.present(&URL_VARS) {
            self.applied(name);
        }
        Ok(())
    }

    /// `REDIS_AUTH` as (user, password).
    fn auth(&self) -> Option<(Option<&'a str>, &'a str)> {
        self.get("REDIS_AUTH").map(|a| match a.split_once(':') {
            Some((user, password)) => (Some(user), password),
            None => (None, a),
        })
    }

    /// `REDIS_TYPE=sentinel`: `REDIS_URL` is `<master name>,<sentinel host:port>[,…]`, as the
    /// reference reads it. `REDIS_AUTH` and `REDIS_TLS` are the master's (the reference
    /// connects to its sentinels in plain TCP, without credentials).
    fn sentinel(
        &mut self,
        settings: &mut ServeSettings,
        raw: &str,
        tls: bool,
    ) -> Result<(), SettingsError> {
        let mut parts = raw.split(',').map(str::trim);
        let master = parts.next().unwrap_or_default();
        let nodes: Vec<String> = parts
            .filter(|n| !n.is_empty())
            .map(|node| match node {
                n if n.contains("://") => n.to_string(),
                n if n.contains(':') => format!("redis://{n}"),
                n => format!("redis://{n}:26379"),
            })
            .collect();
        if master.is_empty() || master.contains(['/', ':', '@']) || nodes.is_empty() {
            return Err(bad(
                "REDIS_URL",
                raw,
                "<master name>,<sentinel host:port>[,<sentinel host:port>…] \
                 (REDIS_TYPE=sentinel)",
            ));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        settings.redis_url = Some(format!("{scheme}://{}{master}", userinfo(self.auth())));
        settings.redis_sentinel = Some(master.to_string());
        settings.redis_sentinel_nodes = nodes;
        for name in self.present(&[
            "REDIS_URL",
            "REDIS_SOCKET_TYPE",
            "REDIS_TYPE",
            "REDIS_AUTH",
            "REDIS_TLS",
        ]) {
            self.applied(name);
        }
        Ok(())
    }

    /// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY` →
    /// `--redis-tls-ca-file`, `--redis-tls-cert-file`, `--redis-tls-key-file`; the reference
    /// reads them only with `REDIS_TLS=true`, and so does floodgate.
    fn redis_tls_files(
        &mut self,
        settings: &mut ServeSettings,
        redis: bool,
        tls: bool,
    ) -> Result<(), SettingsError> {
        if self.parse_bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? == Some(true) {
            self.no_effect(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                "floodgate always verifies the Redis host name: give the server certificate \
                 the name or IP address floodgate connects to",
            );
        }
        for (name, id, flag) in [
            (
                "REDIS_TLS_CACERT",
                "redis_tls_ca_file",
                "--redis-tls-ca-file",
            ),
            (
                "REDIS_TLS_CLIENT_CERT",
                "redis_tls_cert_file",
                "--redis-tls-cert-file",
            ),
            (
                "REDIS_TLS_CLIENT_KEY",
                "redis_tls_key_file",
                "--redis-tls-key-file",
            ),
        ] {
            let Some(path) = self.get(name) else { continue };
            if self.own(id) {
                self.override_by(&[name], flag);
            } else if !redis {
                self.no_effect(name, "no REDIS_URL: the in-memory store is used");
            } else if !tls {
                self.no_effect(name, "REDIS_TLS is not true (the reference ignores it too)");
            } else {
                let slot = match id {
                    "redis_tls_ca_file" => &mut settings.redis_tls_ca_file,
                    "redis_tls_cert_file" => &mut settings.redis_tls_cert_file,
                    _ => &mut settings.redis_tls_key_file,
                };
                *slot = Some(PathBuf::from(path));
                self.applied(name);
            }
        }
        Ok(())
    }

    /// `CACHE_KEY_PREFIX` and `LOCAL_CACHE_SIZE_IN_BYTES`.
    fn store(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        if self.own("redis_key_prefix") {
            self.override_by(&["CACHE_KEY_PREFIX"], "--redis-key-prefix");
        } else if let Some(prefix) = self.get("CACHE_KEY_PREFIX") {
            settings.redis_key_prefix = prefix.to_string();
            self.applied("CACHE_KEY_PREFIX");
        }
        let bytes = self
            .get("LOCAL_CACHE_SIZE_IN_BYTES")
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| bad("LOCAL_CACHE_SIZE_IN_BYTES", v, "a number of bytes"))
            })
            .transpose()?;
        if self.own("local_cache_size") {
            self.override_by(&["LOCAL_CACHE_SIZE_IN_BYTES"], "--local-cache-size");
        } else if let Some(bytes) = bytes {
            settings.local_cache_size = bytes.div_ceil(LOCAL_CACHE_BYTES_PER_ENTRY);
            let entries = settings.local_cache_size;
            self.applied(&format!("LOCAL_CACHE_SIZE_IN_BYTES (~{entries} entries)"));
        }
        Ok(())
    }

    /// `SHADOW_MODE`, `NEAR_LIMIT_RATIO`, the response headers, `USE_PROMETHEUS`.
    fn service(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let shadow = self.parse_bool("SHADOW_MODE")?;
        if self.own("shadow_mode") {
            self.override_by(&["SHADOW_MODE"], "--shadow-mode");
        } else if let Some(shadow) = shadow {
            settings.shadow_mode = shadow;
            self.applied("SHADOW_MODE");
        }
        if let Some(v) = self.get("NEAR_LIMIT_RATIO") {
            let ratio = v
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| bad("NEAR_LIMIT_RATIO", v, "a number from 0 to 1"))?;
            self.report.overrides.near_limit_ratio = Some(ratio);
        }
        self.report.overrides.response_headers =
            self.parse_bool("LIMIT_RESPONSE_HEADERS_ENABLED")?;
        self.report.overrides.dynamic_metadata = self.parse_bool("RESPONSE_DYNAMIC_METADATA")?;
        for name in [
            "LIMIT_LIMIT_HEADER",
            "LIMIT_REMAINING_HEADER",
            "LIMIT_RESET_HEADER",
        ] {
            let Some(v) = self.get(name) else { continue };
            if !is_header_name(v) {
                return Err(bad(name, v, "an HTTP header name"));
            }
            let slot = match name {
                "LIMIT_LIMIT_HEADER" => &mut self.report.overrides.header_limit,
                "LIMIT_REMAINING_HEADER" => &mut self.report.overrides.header_remaining,
                _ => &mut self.report.overrides.header_reset,
            };
            *slot = Some(v.to_string());
        }
        self.response(settings);
        if self.parse_bool("USE_PROMETHEUS")?.is_some() {
            self.no_effect(
                "USE_PROMETHEUS",
                "Prometheus metrics are always served at /metrics on the HTTP port",
            );
        }
        Ok(())
    }

    /// `LOG_LEVEL` (unless `RUST_LOG` is set) and `LOG_FORMAT`.
    fn logs(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        if let Some(v) = self.get("LOG_LEVEL") {
            // logrus's levels; panic and fatal are errors here.
            let level = match v.to_ascii_lowercase().as_str() {
                "panic" | "fatal" | "error" => "error",
                "warn" | "warning" => "warn",
                "info" => "info",
                "debug" => "debug",
                "trace" => "trace",
                _ => {
                    return Err(bad(
                        "LOG_LEVEL",
                        v,
                        "trace, debug, info, warn, error, fatal or panic",
                    ));
                }
            };
            if self.get("RUST_LOG").is_some() {
                self.report
                    .overridden
                    .push("LOG_LEVEL (by RUST_LOG)".into());
            } else {
                self.report.overrides.log_filter = Some(format!("{level},notify=error"));
                self.applied("LOG_LEVEL");
            }
        }
        if let Some(v) = self.get("LOG_FORMAT") {
            let format = match v.to_ascii_lowercase().as_str() {
                "json" => LogFormat::Json,
                "text" => LogFormat::Text,
                _ => return Err(bad("LOG_FORMAT", v, "json or text")),
            };
            if self.own("log_format") {
                self.override_by(&["LOG_FORMAT"], "--log-format");
            } else {
                settings.log_format = format;
                self.applied("LOG_FORMAT");
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Socket {
    Tcp,
    Unix,
}

/// `REDIS_TYPE`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

/// The URL of a TCP `host[:port]` (port 6379 by default), with the reference's `REDIS_TLS`
/// and `REDIS_AUTH` (`password` or `user:password`).
fn tcp_url(
    address: &str,
    tls: bool,
    auth: Option<(Option<&str>, &str)>,
) -> Result<String, SettingsError> {
    if address.is_empty() || address.contains('/') {
        return Err(bad(
            "REDIS_URL",
            address,
            "host:port (REDIS_SOCKET_TYPE=tcp)",
        ));
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let address = if address.contains(':') {
        address.to_string()
    } else {
        format!("{address}:6379")
    };
    Ok(format!("{scheme}://{}{address}", userinfo(auth)))
}

/// `user:password@` for a URL (each percent-encoded), or nothing without `REDIS_AUTH`.
fn userinfo(auth: Option<(Option<&str>, &str)>) -> String {
    match auth {
        Some((user, password)) => format!(
            "{}:{}@",
            user.map(encode).unwrap_or_default(),
            encode(password)
        ),
        None => String::new(),
    }
}

fn bad(name: &'static str, value: &str, expected: &str) -> SettingsError {
    let value = if name == "REDIS_AUTH" {
        "***".to_string()
    } else {
        value.to_string()
    };
    SettingsError::BadReferenceValue {
        name,
        value,
        reason: format!("expected {expected}"),
    }
}

/// Go's `strconv.ParseBool`, which the reference's settings use.
fn go_bool(name: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(bad(name, value, "true or false")),
    }
}

/// A listening host: an IP address or `localhost` (floodgate binds addresses, not names).
fn parse_host(name: &'static str, value: &str) -> Result<IpAddr, SettingsError> {
    if value.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    value
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| bad(name, value, "an IP address or localhost"))
}

/// An HTTP header name (RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Percent-encodes everything but unreserved characters, for a URL's userinfo or query.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// The runtime layout, MERGE_DOMAIN_CONFIG, QUOTA_MODE and the default algorithm: in their
// own file, `runtime.rs`.
mod runtime;

#[cfg(test)]
mod tests;
