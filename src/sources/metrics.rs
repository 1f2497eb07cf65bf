//! The limits sources' metrics, registered once into the shared registry
//! ([`Metrics::register`] hands it over) and counted by the [`super::Publisher`] and the
//! start-up load: limits loads by result (`floodgate_config_*`) and the last loads for the
//! console ([`LoadHistory`]). Names and help strings live here only.
//!
//! A load also counts the reference's statsd stat (`config.load_success` /
//! `config.load_error`) through telemetry's typed counter ([`Metrics::count_reference_stat`]):
//! the sources keep the telemetry handle they resolve rules' series in.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::history::LoadHistory;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::statsd::StatName;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The limits' load counters and history, with the telemetry they resolve rules in: cheap
/// clones, one for each source.
#[derive(Clone, Debug)]
pub struct SourceMetrics {
    families: Arc<Families>,
    /// The last limits loads, for the operator console.
    history: Arc<LoadHistory>,
    /// The registry: rules' series handles are resolved in it, and the reference's stats
    /// counted through it.
    telemetry: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct Families {
    config: Family<ResultLabels, Counter>,
    config_last_ok: Gauge,
}

impl SourceMetrics {
    /// The load families, registered at zero in `metrics`' registry. Called once per
    /// registry, and the handles cloned to every source.
    pub fn register(metrics: &Arc<Metrics>) -> SourceMetrics {
        let families = metrics.register(|registry: &mut Registry| {
            let loads = Families::default();
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
            loads
        });
        SourceMetrics {
            families: Arc::new(families),
            history: Arc::new(LoadHistory::default()),
            telemetry: Arc::clone(metrics),
        }
    }

    /// The registry the sources count in, where rules' series handles are resolved.
    pub fn telemetry(&self) -> &Metrics {
        &self.telemetry
    }

    /// The last limits loads, newest first.
    pub fn loads(&self) -> &LoadHistory {
        &self.history
    }

    /// The load history, shared (the operator console reads it).
    pub fn history(&self) -> Arc<LoadHistory> {
        Arc::clone(&self.history)
    }

    /// Counts a limits load like [`SourceMetrics::record_config_load`] and remembers it with
    /// `detail` (what was loaded, or why it failed) in [`SourceMetrics::loads`].
    pub fn record_config_load_with(&self, ok: bool, detail: &str) {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.history.record(at_unix_ms, ok, detail);
        self.record_config_load(ok);
    }

    /// Counts a limits configuration load (start-up or reload) and remembers whether the
    /// last one succeeded.
    pub fn record_config_load(&self, ok: bool) {
        // The last load's result first: whoever sees the count go up finds it set.
        self.families.config_last_ok.set(i64::from(ok));
        self.telemetry.count_reference_stat(if ok {
            StatName::ConfigLoadSuccess
        } else {
            StatName::ConfigLoadError
        });
        self.families
            .config
            .get_or_create(&ResultLabels {
                result: if ok { "success" } else { "error" },
            })
            .inc();
    }
}
