use super::*;

/// A load past its deadline is abandoned: the caller gets an error naming the label
/// while the load is still running (it is held until after the error came back), and the
/// load, released, ends in the background; given time, a real load of many files succeeds.
#[test]
fn a_slow_load_is_abandoned_at_its_deadline() {
    let (release, gate) = mpsc::channel::<()>();
    let (ended_tx, ended) = mpsc::channel();
    let errors = load_within("held.yaml".into(), Duration::from_millis(1), move || {
        // Held until released, or a minute: a load_within that waited for it fails then.
        let _ = gate.recv_timeout(Duration::from_secs(60));
        let _ = ended_tx.send(());
        Err(ConfigErrors(Vec::new()))
    })
    .unwrap_err();
    assert!(
        ended.try_recv().is_err(),
        "the error came only when the load ended"
    );
    let said = errors.to_string();
    assert!(
        said.contains("abandoned") && said.contains("held.yaml"),
        "{said}"
    );
    release.send(()).unwrap();
    ended.recv().unwrap();

    let dir = tempfile::tempdir().unwrap();
    for i in 0..200 {
        let yaml = format!(
            "domain: d{i}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        std::fs::write(dir.path().join(format!("f{i:04}.yaml")), yaml).unwrap();
    }
    let loader = crate::sources::files::Loader {
        source: crate::sources::files::Source::Path(dir.path().to_path_buf()),
        defaults: crate::config::Defaults::default(),
        merge_domains: false,
    };
    let config = loader.load_within(Duration::from_secs(60)).unwrap();
    assert_eq!(config.domains().count(), 200);
}
