use std::collections::HashMap;

use clap::{CommandFactory, FromArgMatches};

use crate::settings::reference::{ReferenceReport, SettingsError, apply_reference_env};
use crate::settings::{Cli, Command, ServeSettings};

/// `floodgate serve <args>` with the reference variables `pairs` applied.
fn apply(
    args: &[&str],
    pairs: &[(&str, &str)],
) -> Result<(ServeSettings, ReferenceReport), SettingsError> {
    let matches = Cli::command()
        .try_get_matches_from(["floodgate", "serve"].iter().chain(args))
        .unwrap();
    let Command::Serve(mut settings) = Cli::from_arg_matches(&matches).unwrap().command else {
        panic!("not serve");
    };
    let serve = matches.subcommand_matches("serve").unwrap().clone();
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let report = apply_reference_env(&mut settings, &serve, &env)?;
    Ok((settings, report))
}

const RUNTIME: (&str, &str) = ("RUNTIME_ROOT", "/data");

/// In reference mode the counters are on, named with CACHE_KEY_PREFIX (even when
/// --redis-key-prefix renames floodgate's own keys) and expire with the jitter asked.
#[test]
fn reference_mode_shares_counters_with_the_references_names() {
    let (s, report) = apply(
        &["--redis-key-prefix", "fg:"],
        &[
            RUNTIME,
            ("CACHE_KEY_PREFIX", "rl_"),
            ("EXPIRATION_JITTER_MAX_SECONDS", "17"),
        ],
    )
    .unwrap();
    let counters = s.counters.plan_options(s.runtime_layout.is_some()).unwrap();
    assert_eq!(&*counters.prefix, b"rl_");
    assert_eq!(counters.expiry_jitter_max_secs, 17);
    assert_eq!(s.redis_key_prefix, "fg:");
    assert!(
        report
            .applied
            .iter()
            .any(|a| a == "EXPIRATION_JITTER_MAX_SECONDS")
    );
    // The reference's defaults: no prefix, 300 s of jitter; a negative jitter is none.
    let (s, _) = apply(&[], &[RUNTIME]).unwrap();
    let counters = s.counters.plan_options(true).unwrap();
    assert_eq!(
        (&*counters.prefix, counters.expiry_jitter_max_secs),
        (&b""[..], 300)
    );
    let (s, _) = apply(&[], &[RUNTIME, ("EXPIRATION_JITTER_MAX_SECONDS", "-3")]).unwrap();
    assert_eq!(s.counters.reference_expiry_jitter_max, 0);
}

/// Counters off (switched off, or floodgate's own --config): the jitter has no effect and
/// says why; floodgate's own flag wins over the variable; a bad value is refused.
#[test]
fn jitter_without_counters_is_reported_and_bad_values_refused() {
    let jitter = ("EXPIRATION_JITTER_MAX_SECONDS", "10");
    let (s, report) = apply(&["--reference-counters=false"], &[RUNTIME, jitter]).unwrap();
    assert!(!s.counters.enabled(true));
    assert!(
        report
            .no_effect
            .iter()
            .any(|n| n.starts_with("EXPIRATION_JITTER_MAX_SECONDS (")),
        "{report:?}"
    );
    let (s, report) = apply(&["--config", "/x"], &[jitter]).unwrap();
    assert!(!s.counters.enabled(s.runtime_layout.is_some()));
    assert_eq!(report.no_effect.len(), 1, "{report:?}");
    let (s, report) = apply(&["--reference-expiry-jitter-max", "4"], &[RUNTIME, jitter]).unwrap();
    assert_eq!(s.counters.reference_expiry_jitter_max, 4);
    assert!(!report.overridden.is_empty(), "{report:?}");
    let bad = apply(&[], &[RUNTIME, ("EXPIRATION_JITTER_MAX_SECONDS", "5s")]);
    assert!(matches!(
        bad,
        Err(SettingsError::BadReferenceValue {
            name: "EXPIRATION_JITTER_MAX_SECONDS",
            ..
        })
    ));
}
