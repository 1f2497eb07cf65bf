//! The reference's stats variables: `USE_STATSD` (true by default there), `STATSD_HOST`,
//! `STATSD_PORT`, `STATSD_PROTOCOL` (read by its gostats sink from the environment),
//! `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL`, `DISABLE_STATS`, `USE_DOG_STATSD`,
//! `USE_DOG_STATSD_MOGRIFIERS`.
//!
//! statsd is on when the reference would send it: `DISABLE_STATS` unset or false, and
//! `USE_DOG_STATSD` true, or `USE_STATSD` true — which it is by default in reference mode
//! (limits located by `RUNTIME_*`). Outside reference mode, an unset `USE_STATSD` leaves
//! statsd off, floodgate's own default. floodgate's `--statsd-*` flags win over all of them.

use crate::settings::statsd::{StatsdProtocol, TagList};
use crate::telemetry::statsd::parse_tags;

use super::mapping::{Mapping, bad};
use crate::settings::error::SettingsError;
use crate::settings::serve::ServeSettings;

/// The reference's defaults.
const DEFAULT_HOST: &str = "localhost";
const DEFAULT_PORT: u16 = 8125;

/// Every variable of this module.
const VARS: [&str; 9] = [
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "STATSD_PROTOCOL",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
];

impl Mapping<'_> {
    /// Every variable of this module.
    pub(super) fn stats(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let use_statsd = self.parse_bool("USE_STATSD")?;
        let dog = self.parse_bool("USE_DOG_STATSD")?.unwrap_or(false);
        let disabled = self.parse_bool("DISABLE_STATS")?.unwrap_or(false);
        let prometheus = self.parse_bool("USE_PROMETHEUS")?.unwrap_or(false);
        if self.own("statsd_addr") {
            self.override_by(&VARS, "--statsd-addr");
            return Ok(());
        }
        let plain = use_statsd.unwrap_or(settings.runtime_layout.is_some() && !prometheus);
        if disabled {
            self.applied("DISABLE_STATS");
            for name in self.present(&VARS) {
                if name != "DISABLE_STATS" {
                    self.no_effect(name, "DISABLE_STATS is true: no stats are sent");
                }
            }
            return Ok(());
        }
        if dog && use_statsd.unwrap_or(true) {
            // The reference exits here too: one stats sink at a time.
            return Err(SettingsError::Refused {
                name: "USE_DOG_STATSD",
                value: "true".into(),
                why: "the reference sends to one stats sink at a time and USE_STATSD is true \
                      (its default): set USE_STATSD=false with USE_DOG_STATSD=true"
                    .into(),
            });
        }
        if !plain && !dog {
            for name in self.present(&VARS) {
                if name == "USE_STATSD" || name == "USE_DOG_STATSD" || name == "DISABLE_STATS" {
                    self.applied(name);
                } else {
                    self.no_effect(name, "statsd is off (USE_STATSD false or unset)");
                }
            }
            return Ok(());
        }
        let host = self.get("STATSD_HOST").unwrap_or(DEFAULT_HOST);
        let port = match self.get("STATSD_PORT") {
            Some(text) => text
                .parse::<u16>()
                .map_err(|_| bad("STATSD_PORT", text, "a port number"))?,
            None => DEFAULT_PORT,
        };
        let statsd = &mut settings.statsd;
        statsd.statsd_addr = Some(if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        });
        statsd.statsd_dogstatsd = dog;
        for name in ["USE_STATSD", "USE_DOG_STATSD", "STATSD_HOST", "STATSD_PORT"] {
            if self.get(name).is_some() {
                self.applied(name);
            }
        }
        if dog {
            // datadog-go's client, which the reference's dogstatsd sink uses, sends UDP.
            settings.statsd.statsd_protocol = StatsdProtocol::Udp;
            if self.get("STATSD_PROTOCOL").is_some() {
                self.no_effect(
                    "STATSD_PROTOCOL",
                    "read by the plain statsd sink only; dogstatsd is sent over UDP",
                );
            }
            if self.get("USE_DOG_STATSD_MOGRIFIERS").is_some() {
                self.no_effect(
                    "USE_DOG_STATSD_MOGRIFIERS",
                    "not supported: stats are sent under their full names, with EXTRA_TAGS \
                     as tags",
                );
            }
        } else {
            self.protocol(settings)?;
            if self.get("USE_DOG_STATSD_MOGRIFIERS").is_some() {
                self.no_effect("USE_DOG_STATSD_MOGRIFIERS", "USE_DOG_STATSD is not true");
            }
        }
        if let Some(text) = self.get("EXTRA_TAGS") {
            let tags = parse_tags(text).map_err(|why| bad("EXTRA_TAGS", text, &why))?;
            if self.own("statsd_tags") {
                self.override_by(&["EXTRA_TAGS"], "--statsd-tags");
            } else {
                settings.statsd.statsd_tags = TagList(tags);
                self.applied("EXTRA_TAGS");
            }
        }
        if let Some(interval) = self.go_duration("STATS_FLUSH_INTERVAL")? {
            if interval.is_zero() {
                let text = self.get("STATS_FLUSH_INTERVAL").unwrap_or_default();
                return Err(bad("STATS_FLUSH_INTERVAL", text, "a positive Go duration"));
            }
            if self.own("statsd_flush_interval") {
                self.override_by(&["STATS_FLUSH_INTERVAL"], "--statsd-flush-interval");
            } else {
                settings.statsd.statsd_flush_interval = interval;
                self.applied("STATS_FLUSH_INTERVAL");
            }
        }
        Ok(())
    }

    /// `STATSD_PROTOCOL`: `tcp` (gostats' default) or `udp`.
    fn protocol(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let Some(text) = self.get("STATSD_PROTOCOL") else {
            return Ok(());
        };
        let protocol = match text {
            "tcp" => StatsdProtocol::Tcp,
            "udp" => StatsdProtocol::Udp,
            _ => return Err(bad("STATSD_PROTOCOL", text, "tcp or udp")),
        };
        if self.own("statsd_protocol") {
            self.override_by(&["STATSD_PROTOCOL"], "--statsd-protocol");
        } else {
            settings.statsd.statsd_protocol = protocol;
            self.applied("STATSD_PROTOCOL");
        }
        Ok(())
    }
}

/// The reference's Prometheus sink variables.
const PROMETHEUS_VARS: [&str; 5] = [
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
];

impl Mapping<'_> {
    /// `USE_PROMETHEUS` and its `PROMETHEUS_*`: the reference's series served on their own
    /// port exactly when the reference's runner picks its Prometheus sink: `DISABLE_STATS`
    /// not true and `USE_PROMETHEUS` true; with `USE_STATSD` or `USE_DOG_STATSD` also true
    /// the reference exits, and so does floodgate (64). `USE_STATSD` unset counts as false
    /// here (statsd is then off, `super::stats`), although the reference's default true
    /// would make it exit.
    pub(super) fn prometheus(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let on = self.parse_bool("USE_PROMETHEUS")?.unwrap_or(false);
        let ms = self.parse_bool("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")?;
        if self.own("reference_prometheus_addr") {
            self.override_by(&PROMETHEUS_VARS, "--reference-prometheus-addr");
            return Ok(());
        }
        let why_off = if !on {
            Some("USE_PROMETHEUS is not true")
        } else if self.parse_bool("DISABLE_STATS")?.unwrap_or(false) {
            Some("DISABLE_STATS is true: no stats are kept")
        } else {
            None
        };
        if let Some(why) = why_off {
            for name in self.present(&PROMETHEUS_VARS) {
                if name == "USE_PROMETHEUS" {
                    self.applied(name);
                } else {
                    self.no_effect(name, why);
                }
            }
            return Ok(());
        }
        for other in ["USE_STATSD", "USE_DOG_STATSD"] {
            if self.parse_bool(other)? == Some(true) {
                // The reference's runner exits here: one stats sink at a time.
                return Err(SettingsError::Refused {
                    name: "USE_PROMETHEUS",
                    value: "true".into(),
                    why: format!(
                        "the reference sends to one stats sink at a time and {other} is true: \
                         set {other}=false with USE_PROMETHEUS=true"
                    ),
                });
            }
        }
        if let Some(path) = self.get("PROMETHEUS_MAPPER_YAML") {
            // Read and checked at start-up (server::compose): a file that cannot be used
            // stops it there, named.
            if self.own("reference_prometheus_mapper_file") {
                self.override_by(
                    &["PROMETHEUS_MAPPER_YAML"],
                    "--reference-prometheus-mapper-file",
                );
            } else {
                settings.statsd.reference_prometheus_mapper_file = Some(path.into());
                self.applied("PROMETHEUS_MAPPER_YAML");
            }
        }
        let text = self.get("PROMETHEUS_ADDR").unwrap_or(":9090");
        let addr = listen_addr(text).ok_or_else(|| bad("PROMETHEUS_ADDR", text, "host:port"))?;
        settings.statsd.reference_prometheus_addr = Some(addr);
        if let Some(path) = self.get("PROMETHEUS_PATH") {
            if !path.starts_with('/') {
                return Err(bad("PROMETHEUS_PATH", path, "a path starting with /"));
            }
            if self.own("reference_prometheus_path") {
                self.override_by(&["PROMETHEUS_PATH"], "--reference-prometheus-path");
            } else {
                settings.statsd.reference_prometheus_path = path.to_string();
                self.applied("PROMETHEUS_PATH");
            }
        }
        if ms.is_some() && settings.statsd.reference_prometheus_mapper_file.is_some() {
            // As in the reference: the flag edits its default mapping only.
            self.no_effect(
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
                "a mapping file is given (PROMETHEUS_MAPPER_YAML): its scale decides",
            );
        } else if let Some(ms) = ms {
            if self.own("reference_prometheus_response_time_ms") {
                self.override_by(
                    &["PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"],
                    "--reference-prometheus-response-time-ms",
                );
            } else {
                settings.statsd.reference_prometheus_response_time_ms = ms;
                self.applied("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS");
            }
        }
        for name in self.present(&["USE_PROMETHEUS", "PROMETHEUS_ADDR"]) {
            self.applied(name);
        }
        Ok(())
    }
}

/// A Go listen address: `:port` is every interface, as Go's `net.Listen` reads it;
/// `localhost` is loopback.
fn listen_addr(text: &str) -> Option<std::net::SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match host {
        "" => std::net::IpAddr::from([0, 0, 0, 0]),
        "localhost" => std::net::IpAddr::from([127, 0, 0, 1]),
        host => host.parse().ok()?,
    };
    Some(std::net::SocketAddr::new(ip, port))
}
