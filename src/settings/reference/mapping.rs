//! The mapping of the reference's variables: the state one [`super::apply_reference_env`]
//! call carries (the environment, where each flag's value came from, the report), and the
//! value checks every mapping file shares.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use clap::ArgMatches;
use clap::parser::ValueSource;

use super::report::ReferenceReport;
use crate::settings::error::SettingsError;
use crate::settings::serve::{LogFormat, ServeSettings};

/// Approximate bytes one entry of the reference's local cache (freecache) takes: a Redis key
/// of ~100 bytes plus freecache's entry header and slack. `LOCAL_CACHE_SIZE_IN_BYTES` is
/// divided by it to size floodgate's cache, which counts entries.
const LOCAL_CACHE_BYTES_PER_ENTRY: u64 = 128;

/// The state of one [`apply_reference_env`] call.
pub(super) struct Mapping<'a> {
    pub(super) env: &'a HashMap<String, String>,
    pub(super) matches: &'a ArgMatches,
    pub(super) report: ReferenceReport,
}

impl<'a> Mapping<'a> {
    /// The variable's value; empty counts as unset.
    pub(super) fn get(&self, name: &str) -> Option<&'a str> {
        let env: &'a HashMap<String, String> = self.env;
        env.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// Whether floodgate's own flag or `FLOODGATE_*` variable set the argument `id`.
    pub(super) fn own(&self, id: &str) -> bool {
        matches!(
            self.matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    }

    /// Which of `names` are set.
    pub(super) fn present(&self, names: &[&'static str]) -> Vec<&'static str> {
        names
            .iter()
            .copied()
            .filter(|n| self.get(n).is_some())
            .collect()
    }

    /// Records `names` (those set) as overridden by floodgate's `flag`.
    pub(super) fn override_by(&mut self, names: &[&'static str], flag: &str) {
        for name in self.present(names) {
            self.report.overridden.push(format!("{name} (by {flag})"));
        }
    }

    /// The value of `name` unless floodgate's own argument `id` (flag `--<id>`) set one: then
    /// `name` is recorded as overridden and `None` returned, as when it is unset.
    pub(super) fn unless_own(&mut self, name: &'static str, id: &str) -> Option<&'a str> {
        let value = self.get(name)?;
        if self.own(id) {
            self.override_by(&[name], &format!("--{}", id.replace('_', "-")));
            return None;
        }
        Some(value)
    }

    pub(super) fn no_effect(&mut self, name: &str, why: &str) {
        self.report.no_effect.push(format!("{name} ({why})"));
    }

    pub(super) fn applied(&mut self, name: &str) {
        self.report.applied.push(name.to_string());
    }

    pub(super) fn parse_bool(&self, name: &'static str) -> Result<Option<bool>, SettingsError> {
        self.get(name).map(|v| go_bool(name, v)).transpose()
    }

    /// The recorded response-header and near-limit values → their flags, unless floodgate's
    /// own flag or variable set them.
    pub(super) fn response(&mut self, settings: &mut ServeSettings) {
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
    pub(super) fn addresses(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        for (id, flag, host, port) in [
            ("http_addr", "--http-addr", "HOST", "PORT"),
            ("grpc_addr", "--grpc-addr", "GRPC_HOST", "GRPC_PORT"),
        ] {
            if self.own(id) {
                self.override_by(&[host, port], flag);
                continue;
            }
            if id == "grpc_addr" && settings.grpc_connections.grpc_uds.is_some() {
                for name in self.present(&[host, port]) {
                    self.no_effect(name, "gRPC is served on the GRPC_UDS socket");
                }
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
        self.debug(settings)
    }

    /// `DEBUG_HOST` / `DEBUG_PORT`: the debug port (`/rlconfig`, `/stats`) is opened when
    /// either is set (the other defaults as in the reference: `0.0.0.0`, `6070`). Unlike the
    /// reference, an environment naming neither opens no debug port: a fixed well-known port
    /// nobody asked for is one more listener to secure, and one more reason to fail to start.
    pub(super) fn debug(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        const VARS: [&str; 2] = ["DEBUG_HOST", "DEBUG_PORT"];
        if self.own("debug_addr") {
            self.override_by(&VARS, "--debug-addr");
            return Ok(());
        }
        if self.present(&VARS).is_empty() {
            return Ok(());
        }
        let mut addr = std::net::SocketAddr::from(([0, 0, 0, 0], 6070));
        if let Some(value) = self.get("DEBUG_HOST") {
            addr.set_ip(parse_host("DEBUG_HOST", value)?);
            self.applied("DEBUG_HOST");
        }
        if let Some(value) = self.get("DEBUG_PORT") {
            addr.set_port(
                value
                    .parse()
                    .map_err(|_| bad("DEBUG_PORT", value, "a port, 0 to 65535"))?,
            );
            self.applied("DEBUG_PORT");
        }
        settings.statsd.debug_addr = Some(addr);
        Ok(())
    }

    /// `CACHE_KEY_PREFIX` and `LOCAL_CACHE_SIZE_IN_BYTES`.
    pub(super) fn store(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
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
        } else if settings.runtime_layout.is_some() {
            // Started from the reference's environment: its default (no local cache) holds.
            // A cached denial outlives a counter lowered by hand in Redis, or by a reference
            // pod's refund; without the variable the reference never answers from one.
            settings.local_cache_size = 0;
        }
        Ok(())
    }

    /// `SHADOW_MODE`, `NEAR_LIMIT_RATIO`, the response headers.
    pub(super) fn service(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
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
        Ok(())
    }

    /// `LOG_LEVEL` (unless `RUST_LOG` is set) and `LOG_FORMAT`.
    pub(super) fn logs(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
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

pub(super) fn bad(name: &'static str, value: &str, expected: &str) -> SettingsError {
    // REDIS_AUTH, REDIS_SENTINEL_AUTH and their per-second twins hold passwords; a Redis URL
    // (REDIS_URL, REDIS_PERSECOND_URL) may carry one.
    let value = if name.ends_with("_AUTH") {
        "***".to_string()
    } else if name.ends_with("_URL") {
        match value.contains("://") {
            true => crate::store::redis::redact::redact_url(value),
            // `user:password@host:port`, which no parser accepted: hide all before the host.
            false => match value.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => value.to_string(),
            },
        }
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
pub(super) fn go_bool(name: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(bad(name, value, "true or false")),
    }
}

/// A listening host: an IP address or `localhost` (floodgate binds addresses, not names).
pub(super) fn parse_host(name: &'static str, value: &str) -> Result<IpAddr, SettingsError> {
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
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Percent-encodes everything but unreserved characters, for a URL's userinfo or query.
pub(super) fn encode(text: &str) -> String {
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
