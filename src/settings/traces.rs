//! OpenTelemetry trace export settings: `--tracing` and its `--tracing-*` options.
//!
//! Off by default. Besides floodgate's own flags (and their `FLOODGATE_TRACING_*`
//! variables), the reference's `TRACING_*` variables and the standard OpenTelemetry ones
//! (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_EXPORTER_OTLP_PROTOCOL`, …) are read by
//! the environment mapping in [`super::reference`]; the exporter itself reads
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, `…_HEADERS` and `…_TIMEOUT` (and their `…_TRACES_…`
//! forms) when `--tracing-endpoint` is not given, as every OpenTelemetry SDK does.

use clap::{Args, ValueEnum};

use crate::telemetry::otel::{ExportConfig, Transport};

/// How spans are sent to the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (a collector's port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (a collector's port 4318, path `/v1/traces`); the
    /// reference's default.
    #[default]
    #[value(name = "http/protobuf", alias = "http")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// Parses the spellings of `OTEL_EXPORTER_OTLP_PROTOCOL` and the reference's
    /// `TRACING_EXPORTER_PROTOCOL` (`grpc`, `http`, `http/protobuf`; any case).
    pub fn parse(text: &str) -> Option<OtlpProtocol> {
        match text.to_ascii_lowercase().as_str() {
            "grpc" => Some(OtlpProtocol::Grpc),
            "http" | "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            _ => None,
        }
    }
}

/// `--tracing` and its options.
#[derive(Clone, Debug, Args)]
pub struct TraceSettings {
    /// Export an OpenTelemetry span for every ShouldRateLimit call (gRPC and /json), with a
    /// child span for the store call, joined to the caller's trace through its `traceparent`
    /// or B3 headers.
    #[arg(long, env = "FLOODGATE_TRACING")]
    pub tracing: bool,

    /// OTLP transport: `grpc` or `http/protobuf` (alias `http`).
    #[arg(
        long,
        env = "FLOODGATE_TRACING_PROTOCOL",
        value_enum,
        default_value_t = OtlpProtocol::HttpProtobuf
    )]
    pub tracing_protocol: OtlpProtocol,

    /// Collector URL (`http://host:4317` for gRPC; the full URL, `http://host:4318/v1/traces`,
    /// for HTTP). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/traces` for HTTP), else localhost.
    #[arg(long, env = "FLOODGATE_TRACING_ENDPOINT", value_name = "URL")]
    pub tracing_endpoint: Option<String>,

    /// The `service.name` resource attribute.
    #[arg(
        long,
        env = "FLOODGATE_TRACING_SERVICE_NAME",
        default_value = "floodgate"
    )]
    pub tracing_service_name: String,

    /// The `service.namespace` resource attribute (omitted when empty).
    #[arg(long, env = "FLOODGATE_TRACING_SERVICE_NAMESPACE", default_value = "")]
    pub tracing_service_namespace: String,

    /// The `service.instance.id` resource attribute; a random UUID when unset.
    #[arg(long, env = "FLOODGATE_TRACING_SERVICE_INSTANCE_ID")]
    pub tracing_service_instance_id: Option<String>,

    /// The fraction of new traces sampled, 0 to 1. A request whose caller's trace context says
    /// "sampled" (or "not sampled") follows its caller, whatever this rate (parent-based).
    #[arg(
        long,
        env = "FLOODGATE_TRACING_SAMPLING_RATE",
        default_value_t = 1.0,
        value_parser = parse_rate
    )]
    pub tracing_sampling_rate: f64,

    /// Whether a request with a caller's trace context follows the caller's sampling
    /// decision (the default, and the reference's); false only from `OTEL_TRACES_SAMPLER`
    /// `always_on`, `always_off` or `traceidratio`.
    #[arg(skip = true)]
    pub tracing_parent_based: bool,

    /// Spans waiting for export, at most; more are dropped (and counted in the log), so a
    /// slow or absent collector never holds requests or memory.
    #[arg(long, env = "FLOODGATE_TRACING_QUEUE_SIZE", default_value_t = 2048,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub tracing_queue_size: u32,
}

impl TraceSettings {
    /// What the export pipeline needs, or `None` when tracing is off.
    pub fn export(&self) -> Option<ExportConfig> {
        self.tracing.then(|| ExportConfig {
            transport: match self.tracing_protocol {
                OtlpProtocol::Grpc => Transport::Grpc,
                OtlpProtocol::HttpProtobuf => Transport::HttpProtobuf,
            },
            endpoint: self.tracing_endpoint.clone(),
            service_name: self.tracing_service_name.clone(),
            service_namespace: self.tracing_service_namespace.clone(),
            service_instance_id: self.tracing_service_instance_id.clone(),
            sampling_rate: self.tracing_sampling_rate,
            parent_based: self.tracing_parent_based,
            queue_size: self.tracing_queue_size as usize,
        })
    }
}

/// A sampling rate: a number from 0 to 1.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| format!("'{text}' is not a sampling rate between 0 and 1"))
}

#[cfg(test)]
mod tests;
