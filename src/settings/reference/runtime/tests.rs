use std::collections::HashMap;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches};

use crate::settings::reference::{ReferenceReport, apply_reference_env};
use crate::settings::{AlgorithmArg, AlgorithmChoice, Cli, Command, ServeSettings};
use crate::sources::files::RuntimeLayout;

/// `floodgate serve <args>` with the reference variables `pairs` applied.
fn apply(args: &[&str], pairs: &[(&str, &str)]) -> (ServeSettings, ReferenceReport) {
    let matches = Cli::command()
        .try_get_matches_from(["floodgate", "serve"].iter().chain(args))
        .unwrap();
    let Command::Serve(mut settings) = Cli::from_arg_matches(&matches).unwrap().command else {
        panic!("not serve");
    };
    let serve = matches.subcommand_matches("serve").unwrap();
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let report = apply_reference_env(&mut settings, serve, &env).unwrap();
    (settings, report)
}

/// The runtime variables give the layout, with the reference's defaults, and reference
/// mode counts with fixed windows.
#[test]
fn runtime_layout_and_reference_mode() {
    let (s, report) = apply(
        &[],
        &[("RUNTIME_ROOT", "/r"), ("RUNTIME_SUBDIRECTORY", "rl")],
    );
    assert_eq!(
        s.runtime_layout,
        Some(RuntimeLayout {
            root: PathBuf::from("/r"),
            subdirectory: "rl".into(),
            app_directory: "config".into(),
            watch_root: true,
            ignore_dotfiles: false,
        })
    );
    assert_eq!(s.config, Some(PathBuf::from("/r/rl/config")));
    assert_eq!(s.algorithm.value, AlgorithmArg::FixedWindow);
    assert_eq!(s.algorithm_choice, AlgorithmChoice::ReferenceMode);
    assert!(report.no_effect.is_empty(), "{report:?}");
    let (s, report) = apply(
        &[],
        &[
            ("RUNTIME_ROOT", "/r"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
        ],
    );
    let layout = s.runtime_layout.unwrap();
    assert!(!layout.watch_root && layout.ignore_dotfiles);
    assert!(report.applied.iter().any(|a| a == "RUNTIME_IGNOREDOTFILES"));
}

/// Token buckets stay one variable away in reference mode, and stay floodgate's default
/// with `--config`.
#[test]
fn algorithm_choice() {
    let (s, _) = apply(
        &["--default-algorithm", "token_bucket"],
        &[("RUNTIME_ROOT", "/r")],
    );
    assert_eq!(
        (s.algorithm.value, s.algorithm_choice),
        (AlgorithmArg::TokenBucket, AlgorithmChoice::Flag)
    );
    let (s, _) = apply(&["--config", "x"], &[]);
    assert_eq!(
        (s.algorithm.value, s.algorithm_choice),
        (AlgorithmArg::TokenBucket, AlgorithmChoice::Default)
    );
    assert!(s.runtime_layout.is_none());
    // --config wins over the layout, whose variables are then reported as overridden.
    let (s, report) = apply(
        &["--config", "x"],
        &[("RUNTIME_ROOT", "/r"), ("RUNTIME_WATCH_ROOT", "false")],
    );
    assert!(s.runtime_layout.is_none());
    assert_eq!(s.algorithm.value, AlgorithmArg::TokenBucket);
    let overridden = report.overridden.join(" ");
    assert!(overridden.contains("RUNTIME_ROOT") && overridden.contains("RUNTIME_WATCH_ROOT"));
}

/// MERGE_DOMAIN_CONFIG and QUOTA_MODE set their flags, unless the flags are given.
#[test]
fn merge_and_quota_mode() {
    let (s, report) = apply(
        &["--config", "x"],
        &[("MERGE_DOMAIN_CONFIG", "true"), ("QUOTA_MODE", "1")],
    );
    assert!(s.merge_domains && s.quota_mode);
    assert_eq!(report.applied, ["MERGE_DOMAIN_CONFIG", "QUOTA_MODE"]);
    let (s, report) = apply(
        &["--config", "x", "--quota-mode", "--merge-domains"],
        &[("MERGE_DOMAIN_CONFIG", "false"), ("QUOTA_MODE", "false")],
    );
    assert!(s.merge_domains && s.quota_mode);
    assert_eq!(report.overridden.len(), 2, "{report:?}");
}
