//! Loads of what the server reads at start-up and again while it runs: the limits
//! (`floodgate_config_*`, and the last loads for the console: [`super::history`]) and the
//! gRPC port's TLS certificate (`floodgate_tls_*`, handshake failures included).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::history::LoadHistory;
use super::labels::{HandshakeFailure, ReasonLabels, ResultLabels};
use crate::telemetry::statsd::StatName;

/// The limits' and the TLS certificate's load counters.
#[derive(Debug, Default)]
pub(super) struct LoadMetrics {
    config: Family<ResultLabels, Counter>,
    config_last_ok: Gauge,
    tls: Family<ResultLabels, Counter>,
    tls_last_ok: Gauge,
    tls_handshake_failures: Family<ReasonLabels, Counter>,
    /// The last limits loads, for the operator console.
    history: LoadHistory,
}

impl LoadMetrics {
    /// The limits' load metrics, registered in `registry`.
    pub(super) fn register_config(registry: &mut Registry, loads: &LoadMetrics) {
        registry.register(
            "floodgate_config_loads",
            "Limits configuration loads by result",
            loads.config.clone(),
        );
        registry.register(
            "floodgate_config_last_reload_success",
            "1 if the last limits load (start-up or reload) succeeded, 0 if it failed",
            loads.config_last_ok.clone(),
        );
    }

    /// The TLS certificate's load and handshake metrics, registered in `registry`.
    pub(super) fn register_tls(registry: &mut Registry, loads: &LoadMetrics) {
        registry.register(
            "floodgate_tls_loads",
            "gRPC TLS certificate loads (start-up and reloads) by result",
            loads.tls.clone(),
        );
        registry.register(
            "floodgate_tls_last_reload_success",
            "1 if the last gRPC TLS certificate load succeeded, 0 if it failed",
            loads.tls_last_ok.clone(),
        );
        registry.register(
            "floodgate_tls_handshake_failures",
            "gRPC TLS handshakes that failed, by reason (error, timeout)",
            loads.tls_handshake_failures.clone(),
        );
    }
}

impl Metrics {
    /// The last limits loads, newest first.
    pub fn loads(&self) -> &LoadHistory {
        &self.loads.history
    }

    /// Counts a limits load like [`Metrics::record_config_load`] and remembers it with
    /// `detail` (what was loaded, or why it failed) in [`Metrics::loads`].
    pub fn record_config_load_with(&self, ok: bool, detail: &str) {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.loads.history.record(at_unix_ms, ok, detail);
        self.record_config_load(ok);
    }

    /// Counts a limits configuration load (start-up or reload) and remembers whether the
    /// last one succeeded.
    pub fn record_config_load(&self, ok: bool) {
        self.stat(
            if ok {
                StatName::ConfigLoadSuccess
            } else {
                StatName::ConfigLoadError
            },
            1,
        );
        record_load(&self.loads.config, &self.loads.config_last_ok, ok);
    }

    /// Counts a gRPC TLS certificate load (start-up or reload) and remembers whether the last
    /// one succeeded.
    pub fn record_tls_load(&self, ok: bool) {
        record_load(&self.loads.tls, &self.loads.tls_last_ok, ok);
    }

    /// Counts a failed TLS handshake.
    pub fn record_tls_handshake_failure(&self, failure: HandshakeFailure) {
        let reason = match failure {
            HandshakeFailure::Error => "error",
            HandshakeFailure::Timeout => "timeout",
        };
        self.loads
            .tls_handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// Counts a load in `loads` by result and sets `last_ok` to whether it succeeded.
fn record_load(loads: &Family<ResultLabels, Counter>, last_ok: &Gauge, ok: bool) {
    loads
        .get_or_create(&ResultLabels {
            result: if ok { "success" } else { "error" },
        })
        .inc();
    last_ok.set(i64::from(ok));
}
