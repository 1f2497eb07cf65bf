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
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::config::{ConfigError, Defaults};

    fn compiled(domain: &str) -> Config {
        let yaml = format!(
            "domain: {domain}\ndescriptors:\n  - {{key: k, rate_limit: {{unit: second, requests_per_unit: 1}}}}\n"
        );
        Config::from_sources(&[("test.yaml".into(), yaml)], &Defaults::default()).unwrap()
    }

    /// A published config is in force when the server's hook runs, and the load is recorded
    /// with what came and how many domains; a rejected load keeps the config in force and
    /// records every error on one line.
    #[test]
    fn publish_swaps_then_hooks_and_reject_keeps_the_limits() {
        let config = Snapshot::from(Config::empty()).swappable();
        let metrics = SourceMetrics::register(&Arc::new(crate::telemetry::metrics::Metrics::new()));
        let seen_by_hook = Arc::new(Mutex::new(Vec::new()));
        let in_force = config.clone();
        let seen = seen_by_hook.clone();
        let publisher = Publisher::new(config.clone(), metrics.clone()).on_publish(move |new| {
            // The hook is handed the config the request path reads from now on.
            let names = |c: &Config| c.domains().map(|d| d.name.clone()).collect::<Vec<_>>();
            seen.lock()
                .unwrap()
                .push((names(new), names(&in_force.load().config)));
        });

        assert_eq!(publisher.publish(compiled("edge"), "reloaded"), 1);
        assert!(config.load().config.domain("edge").is_some());
        assert_eq!(
            *seen_by_hook.lock().unwrap(),
            [(vec!["edge".to_string()], vec!["edge".to_string()])]
        );

        let errors = ConfigErrors(vec![
            ConfigError {
                file: "a.yaml".into(),
                path: "domain".into(),
                message: "bad".into(),
            },
            ConfigError {
                file: "b.yaml".into(),
                path: String::new(),
                message: "worse".into(),
            },
        ]);
        assert_eq!(
            publisher.reject(&errors),
            "a.yaml: domain: bad; b.yaml: worse"
        );
        publisher.reject_for("limits path disappeared; previous limits kept");
        assert!(config.load().config.domain("edge").is_some());
        assert_eq!(seen_by_hook.lock().unwrap().len(), 1);

        let loads: Vec<(bool, String)> = metrics
            .loads()
            .newest_first()
            .into_iter()
            .map(|load| (load.ok, load.detail))
            .collect();
        assert_eq!(
            loads,
            [
                (
                    false,
                    "limits path disappeared; previous limits kept".to_string()
                ),
                (false, "a.yaml: domain: bad; b.yaml: worse".to_string()),
                (true, "reloaded: 1 domain(s)".to_string()),
            ]
        );
    }
}
