//! The reference's tracing variables (`TRACING_ENABLED`, `TRACING_EXPORTER_PROTOCOL`,
//! `TRACING_SERVICE_NAME`, `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID`,
//! `TRACING_SAMPLING_RATE`) and the standard OpenTelemetry ones that choose what the
//! exporter cannot read for itself (`OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`).
//!
//! Precedence, for each setting: floodgate's own flag or `FLOODGATE_TRACING_*` variable,
//! then the reference's `TRACING_*` variable (the reference passes those to its SDK
//! explicitly, so they win over `OTEL_*` there too), then the `OTEL_*` variable, then the
//! default. Tracing enabled by `TRACING_ENABLED` names its service as the reference does
//! (`TRACING_SERVICE_NAME`, default `RateLimit`, never `OTEL_SERVICE_NAME`), so existing
//! trace queries keep matching.

use crate::settings::traces::{OtlpProtocol, TraceSettings, parse_rate};

use super::mapping::{Mapping, bad};
use crate::settings::error::SettingsError;
use crate::settings::serve::ServeSettings;

/// The reference's default `service.name`.
const REFERENCE_SERVICE_NAME: &str = "RateLimit";

/// The reference's variables of this module but `TRACING_ENABLED`.
const OPTIONS: [&str; 5] = [
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_SAMPLING_RATE",
];

impl Mapping<'_> {
    /// Every variable of this module.
    pub(super) fn traces(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let traces = &mut settings.traces;
        let reference_on = self.parse_bool("TRACING_ENABLED")?;
        let sdk_disabled = self.parse_bool("OTEL_SDK_DISABLED")?.unwrap_or(false);
        let mut by_reference = false;
        if self.own("tracing") {
            self.override_by(&["TRACING_ENABLED"], "--tracing");
        } else if let Some(on) = reference_on {
            traces.tracing = on && !sdk_disabled;
            by_reference = traces.tracing;
            self.applied("TRACING_ENABLED");
        }
        if !traces.tracing {
            for name in self.present(&OPTIONS) {
                self.no_effect(name, "tracing is off (TRACING_ENABLED false or unset)");
            }
            return Ok(());
        }
        self.trace_protocol(traces)?;
        self.trace_resource(traces, by_reference);
        self.trace_sampler(traces)
    }

    fn trace_protocol(&mut self, traces: &mut TraceSettings) -> Result<(), SettingsError> {
        if self.own("tracing_protocol") {
            self.override_by(&["TRACING_EXPORTER_PROTOCOL"], "--tracing-protocol");
            return Ok(());
        }
        for name in [
            "TRACING_EXPORTER_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(text) = self.get(name) {
                traces.tracing_protocol = OtlpProtocol::parse(text)
                    .ok_or_else(|| bad(name, text, "grpc, http or http/protobuf"))?;
                self.applied(name);
                return Ok(());
            }
        }
        Ok(())
    }

    /// `by_reference`: tracing was turned on by `TRACING_ENABLED`; then the service name
    /// is the reference's (`TRACING_SERVICE_NAME`, default `RateLimit`), which it sets
    /// explicitly, so `OTEL_SERVICE_NAME` has no effect there either.
    fn trace_resource(&mut self, traces: &mut TraceSettings, by_reference: bool) {
        if self.own("tracing_service_name") {
            self.override_by(&["TRACING_SERVICE_NAME"], "--tracing-service-name");
        } else if let Some(value) = self.get("TRACING_SERVICE_NAME") {
            traces.tracing_service_name = value.to_string();
            self.applied("TRACING_SERVICE_NAME");
        } else if by_reference {
            traces.tracing_service_name = REFERENCE_SERVICE_NAME.to_string();
        } else if let Some(value) = self.get("OTEL_SERVICE_NAME") {
            traces.tracing_service_name = value.to_string();
            self.applied("OTEL_SERVICE_NAME");
        }
        if self.own("tracing_service_namespace") {
            self.override_by(
                &["TRACING_SERVICE_NAMESPACE"],
                "--tracing-service-namespace",
            );
        } else if let Some(value) = self.get("TRACING_SERVICE_NAMESPACE") {
            traces.tracing_service_namespace = value.to_string();
            self.applied("TRACING_SERVICE_NAMESPACE");
        }
        if self.own("tracing_service_instance_id") {
            self.override_by(
                &["TRACING_SERVICE_INSTANCE_ID"],
                "--tracing-service-instance-id",
            );
        } else if let Some(value) = self.get("TRACING_SERVICE_INSTANCE_ID") {
            traces.tracing_service_instance_id = Some(value.to_string());
            self.applied("TRACING_SERVICE_INSTANCE_ID");
        }
    }

    fn trace_sampler(&mut self, traces: &mut TraceSettings) -> Result<(), SettingsError> {
        if self.own("tracing_sampling_rate") {
            self.override_by(&["TRACING_SAMPLING_RATE"], "--tracing-sampling-rate");
            return Ok(());
        }
        if let Some(text) = self.get("TRACING_SAMPLING_RATE") {
            // The reference's TraceIDRatioBased treats >= 1 as always and <= 0 as never.
            let rate = text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| !r.is_nan())
                .ok_or_else(|| bad("TRACING_SAMPLING_RATE", text, "a number"))?;
            traces.tracing_sampling_rate = rate.clamp(0.0, 1.0);
            self.applied("TRACING_SAMPLING_RATE");
            return Ok(());
        }
        let Some(sampler) = self.get("OTEL_TRACES_SAMPLER") else {
            return Ok(());
        };
        let arg = || -> Result<f64, SettingsError> {
            match self.get("OTEL_TRACES_SAMPLER_ARG") {
                Some(text) => parse_rate(text)
                    .map_err(|_| bad("OTEL_TRACES_SAMPLER_ARG", text, "a number from 0 to 1")),
                None => Ok(1.0),
            }
        };
        let (parent_based, rate) = match sampler.to_ascii_lowercase().as_str() {
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, arg()?),
            "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            "parentbased_traceidratio" => (true, arg()?),
            _ => {
                // The specification: an unknown sampler is warned about and the default kept.
                self.no_effect(
                    "OTEL_TRACES_SAMPLER",
                    "unsupported sampler: parent-based, always on, is used",
                );
                return Ok(());
            }
        };
        traces.tracing_parent_based = parent_based;
        traces.tracing_sampling_rate = rate;
        self.applied("OTEL_TRACES_SAMPLER");
        Ok(())
    }
}
