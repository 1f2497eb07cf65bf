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
