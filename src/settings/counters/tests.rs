use super::*;

fn settings(on: Option<bool>) -> ReferenceCounterSettings {
    ReferenceCounterSettings {
        reference_counters: on,
        reference_key_prefix: "rl_".into(),
        reference_expiry_jitter_max: 5,
    }
}

/// Unset, counters follow reference mode; set, the setting wins either way.
#[test]
fn default_follows_reference_mode() {
    assert!(settings(None).enabled(true));
    assert!(!settings(None).enabled(false));
    assert!(!settings(Some(false)).enabled(true));
    assert!(settings(Some(true)).enabled(false));
    let options = settings(None).plan_options(true).unwrap();
    assert_eq!(&*options.prefix, b"rl_");
    assert_eq!(options.expiry_jitter_max_secs, 5);
    assert!(settings(None).plan_options(false).is_none());
}
