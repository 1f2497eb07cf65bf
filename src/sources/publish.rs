//! The one way new limits reach the request path, whichever source loaded them.
//!
//! A [`Publisher`] holds the [`Limits`] the service reads. A source that compiled a new
//! [`Config`] hands it to [`Publisher::publish`]: telemetry resolves its rules' series
//! handles, the two are swapped in together as one [`Snapshot`], the server's
//! `on_publish` hook runs with it (the over-limit cache cleared, readiness updated), and the
//! load is counted in `floodgate_config_loads_total` and the load history of the console.
//! A load that fails goes to [`Publisher::reject`]: counted and recorded, and the limits in
//! force stay. Each source logs its own line (the path reloaded, or the xDS version ACKed or
//! NACKed), since what happens next differs.

use crate::config::{Config, ConfigErrors};
use crate::sources::{Limits, Snapshot, SourceMetrics};

/// What the server does with each configuration published, after the swap.
pub type OnPublish = Box<dyn Fn(&Config) + Send + Sync>;

/// Swaps new limits in for the request path and records every load, successful or not.
pub struct Publisher {
    /// The limits in force, shared with the request path.
    limits: Limits,
    /// Where rules are counted (their handles resolved here) and loads are counted
    /// (`floodgate_config_loads_total`, the load history).
    metrics: SourceMetrics,
    /// Set by the server: runs after each swap, with the new configuration.
    on_publish: Option<OnPublish>,
}

impl Publisher {
    /// A publisher into `limits`, counting loads in `metrics`.
    pub fn new(limits: Limits, metrics: SourceMetrics) -> Publisher {
        Publisher {
            limits,
            metrics,
            on_publish: None,
        }
    }

    /// Runs `hook` after each swap, with the configuration just published.
    pub fn on_publish(mut self, hook: impl Fn(&Config) + Send + Sync + 'static) -> Publisher {
        self.on_publish = Some(Box::new(hook));
        self
    }

    /// Swaps `config` in and records the load as `"{what}: N domain(s)"` (`what`: how it
    /// came, `reloaded` or `xDS version 3`). Returns its number of domains, for the source's
    /// log line.
    pub fn publish(&self, config: Config, what: &str) -> usize {
        let domains = config.domains().count();
        // Per-rule telemetry handles are resolved for `config` once per load, before the
        // swap, so the first request on the new limits finds them ready.
        self.limits.store(std::sync::Arc::new(Snapshot::resolved(
            config,
            self.metrics.telemetry(),
        )));
        // After the swap: a denial cached under the old limits must not outlive them.
        if let Some(hook) = &self.on_publish {
            hook(&self.limits.load().config);
        }
        self.metrics
            .record_config_load_with(true, &format!("{what}: {domains} domain(s)"));
        domains
    }

    /// Records a load that failed with `errors`, the limits in force kept. Returns the
    /// errors on one line (log collectors split records on newlines), for the source's log.
    pub fn reject(&self, errors: &ConfigErrors) -> String {
        let all: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        let line = all.join("; ");
        self.metrics.record_config_load_with(false, &line);
        line
    }

    /// Records a load that did not happen, for `reason` (the limits path disappeared).
    pub fn reject_for(&self, reason: &str) {
        self.metrics.record_config_load_with(false, reason);
    }
}

#[cfg(test)]
mod tests;
