//! `floodgate serve`'s statsd options: the reference server's stats (names, counting and
//! transport as in `docs/observability.md`), off unless an address is given. In reference
//! mode the reference's variables turn them on as the reference would (`USE_STATSD`
//! defaults to true there).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::telemetry::statsd::{Flavor, Protocol, StatsdConfig, parse_tags};

/// The statsd transport, as a flag value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum StatsdProtocol {
    /// One TCP connection (the reference's default).
    #[default]
    Tcp,
    /// UDP datagrams.
    Udp,
}

/// Where the reference's statsd stats go.
#[derive(Clone, Debug, Args)]
pub struct StatsdSettings {
    /// Send the reference server's statsd stats to this `host:port`. Off by default.
    #[arg(long, env = "FLOODGATE_STATSD_ADDR", value_name = "HOST:PORT")]
    pub statsd_addr: Option<String>,

    /// Transport to the statsd host.
    #[arg(
        long,
        env = "FLOODGATE_STATSD_PROTOCOL",
        value_enum,
        default_value = "tcp"
    )]
    pub statsd_protocol: StatsdProtocol,

    /// Send counters every this many seconds (timers are sent every second).
    #[arg(long, env = "FLOODGATE_STATSD_FLUSH_INTERVAL", value_name = "SECONDS",
          value_parser = super::parse::parse_positive_seconds, default_value = "10")]
    pub statsd_flush_interval: Duration,

    /// Tags on every stat, `key1:value1,key2:value2` (the reference's `EXTRA_TAGS`).
    #[arg(long, env = "FLOODGATE_STATSD_TAGS", value_name = "KEY:VALUE,...",
          value_parser = parse_tag_list, default_value = "")]
    pub statsd_tags: TagList,

    /// Speak dogstatsd (tags as `|#key:value`) instead of plain statsd (tags in the name).
    #[arg(long, env = "FLOODGATE_STATSD_DOGSTATSD")]
    pub statsd_dogstatsd: bool,

    /// Serve the reference server's Prometheus series (its `USE_PROMETHEUS` sink: the statsd
    /// stats through its statsd_exporter mapping) on this address. Off by default;
    /// floodgate's own `floodgate_*` metrics stay on the HTTP port.
    #[arg(
        long,
        env = "FLOODGATE_REFERENCE_PROMETHEUS_ADDR",
        value_name = "HOST:PORT"
    )]
    pub reference_prometheus_addr: Option<SocketAddr>,

    /// Map those series with this statsd_exporter mapping file (`PROMETHEUS_MAPPER_YAML`)
    /// instead of the reference's default mapping. A file that cannot be read or parsed
    /// stops start-up.
    #[arg(
        long,
        env = "FLOODGATE_REFERENCE_PROMETHEUS_MAPPER_FILE",
        value_name = "FILE"
    )]
    pub reference_prometheus_mapper_file: Option<PathBuf>,

    /// The path of those series (`PROMETHEUS_PATH`).
    #[arg(
        long,
        env = "FLOODGATE_REFERENCE_PROMETHEUS_PATH",
        value_name = "PATH",
        default_value = "/metrics",
        value_parser = parse_path
    )]
    pub reference_prometheus_path: String,

    /// Serve the reference server's debug port here: `/rlconfig` in its text format and
    /// `/stats` (`name: value` lines of the reference's stats). Off by default; on in
    /// reference mode, at `DEBUG_HOST`:`DEBUG_PORT` (`0.0.0.0:6070`), as the reference.
    #[arg(long, env = "FLOODGATE_DEBUG_ADDR", value_name = "HOST:PORT")]
    pub debug_addr: Option<SocketAddr>,

    /// Observe `ratelimit_service_response_time_seconds` in milliseconds, not seconds
    /// (`PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    #[arg(long, env = "FLOODGATE_REFERENCE_PROMETHEUS_RESPONSE_TIME_MS")]
    pub reference_prometheus_response_time_ms: bool,
}

/// Where the reference's Prometheus series are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferencePrometheus {
    /// The listening address.
    pub addr: SocketAddr,
    /// The path.
    pub path: String,
    /// Response times in milliseconds (default mapping only).
    pub response_time_ms: bool,
    /// The statsd_exporter mapping file; `None`: the reference's default mapping.
    pub mapper_file: Option<PathBuf>,
}

fn parse_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') {
        Ok(text.to_string())
    } else {
        Err(format!("'{text}' does not start with /"))
    }
}

/// Parsed `key:value` tags, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TagList(pub Vec<(String, String)>);

fn parse_tag_list(text: &str) -> Result<TagList, String> {
    parse_tags(text).map(TagList)
}

impl StatsdSettings {
    /// Where the reference's Prometheus series are served, or `None` when they are not.
    pub fn reference_prometheus(&self) -> Option<ReferencePrometheus> {
        Some(ReferencePrometheus {
            addr: self.reference_prometheus_addr?,
            path: self.reference_prometheus_path.clone(),
            response_time_ms: self.reference_prometheus_response_time_ms,
            mapper_file: self.reference_prometheus_mapper_file.clone(),
        })
    }

    /// What the statsd task needs, or `None` when statsd is off.
    pub fn config(&self) -> Option<StatsdConfig> {
        Some(StatsdConfig {
            addr: self.statsd_addr.clone()?,
            protocol: match self.statsd_protocol {
                StatsdProtocol::Tcp => Protocol::Tcp,
                StatsdProtocol::Udp => Protocol::Udp,
            },
            flavor: if self.statsd_dogstatsd {
                Flavor::DogStatsd
            } else {
                Flavor::Statsd
            },
            flush_interval: self.statsd_flush_interval,
            tags: self.statsd_tags.0.clone(),
        })
    }
}
