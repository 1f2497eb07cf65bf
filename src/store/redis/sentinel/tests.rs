use super::*;

fn settings(nodes: &[&str]) -> SentinelSettings {
    SentinelSettings {
        master_name: "mymaster".into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

fn error(nodes: &[&str], master_url: &str) -> String {
    match Master::new(&settings(nodes), master_url, None) {
        Ok(_) => panic!("{nodes:?} with {master_url} was accepted"),
        Err(e) => e,
    }
}

/// Well-formed settings build a client (nothing is contacted yet).
#[test]
fn accepts_consistent_settings() {
    let nodes = ["redis://:s@127.0.0.1:26379", "redis://:s@127.0.0.1:26380"];
    assert!(Master::new(&settings(&nodes), "rediss://:pw@mymaster/2", None).is_ok());
    assert!(Master::new(&settings(&nodes[..1]), "redis://mymaster", None).is_ok());
}

/// What an operator must fix is named, and passwords never appear.
#[test]
fn refuses_inconsistent_settings() {
    let ok = ["redis://127.0.0.1:26379"];
    let cases: [(&[&str], &str, &str); 5] = [
        (
            &ok,
            "redis://:pw@10.0.0.1:6379",
            "redis://:***@10.0.0.1:6379",
        ),
        (
            &["redis://a:1", "rediss://b:2"],
            "redis://mymaster",
            "all be redis:// or all",
        ),
        (
            &["redis://:x@a:1", "redis://:y@b:2"],
            "redis://mymaster",
            "same user",
        ),
        (
            &["http://a:1"],
            "redis://mymaster",
            "invalid Redis sentinel URL",
        ),
        (
            &ok,
            "redis+unix:///tmp/r.sock",
            "redis[s]://[user:password@]mymaster[/db]",
        ),
    ];
    for (nodes, master, message) in cases {
        let err = error(nodes, master);
        assert!(err.contains(message), "{err:?} lacks {message:?}");
        assert!(!err.contains("pw@") && !err.contains(":x@"), "{err}");
    }
}
