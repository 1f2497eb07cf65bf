use clap::Parser;

use crate::settings::{Cli, Command};

/// `RlqsSettings::default()` is what the flags default to.
#[test]
fn default_is_the_flag_defaults() {
    let Command::Serve(settings) = Cli::parse_from(["floodgate", "serve", "--config", "x"]).command
    else {
        panic!("not serve");
    };
    let defaults = super::RlqsSettings::default();
    assert_eq!(settings.rlqs.rlqs_max_streams, defaults.rlqs_max_streams);
    assert_eq!(
        settings.rlqs.rlqs_max_buckets_per_stream,
        defaults.rlqs_max_buckets_per_stream
    );
    assert_eq!(
        settings.rlqs.rlqs_assignment_ttl,
        defaults.rlqs_assignment_ttl
    );
    assert_eq!(
        settings.rlqs.rlqs_max_streams_per_peer,
        defaults.rlqs_max_streams_per_peer
    );
    assert_eq!(settings.rlqs.rlqs_max_buckets, defaults.rlqs_max_buckets);
    assert_eq!(
        settings.rlqs.rlqs_max_bucket_bytes,
        defaults.rlqs_max_bucket_bytes
    );
    assert_eq!(
        settings.rlqs.rlqs_reporting_interval,
        defaults.rlqs_reporting_interval
    );
    assert_eq!(
        settings.rlqs.rlqs_report_timeout,
        defaults.rlqs_report_timeout
    );
    assert_eq!(
        settings.rlqs.rlqs_abandon_after,
        defaults.rlqs_abandon_after
    );
    assert_eq!(
        settings.rlqs.rlqs_reassess_interval,
        defaults.rlqs_reassess_interval
    );
}

/// The time to live and the report timeout default to three of Envoy's report periods,
/// never fewer than 5 s each: a 1 s `reporting_interval` (which Envoy 1.40 does not
/// honour) still gets 15 s; a 20 s one gets 60 s; explicit values stand.
#[test]
fn timings_follow_envoys_report_period() {
    let with = |interval: u64| super::RlqsSettings {
        rlqs_reporting_interval: std::time::Duration::from_secs(interval),
        ..super::RlqsSettings::default()
    };
    let secs = std::time::Duration::from_secs;
    for (interval, derived) in [(1, 15), (5, 15), (20, 60)] {
        let options = with(interval).options();
        assert_eq!(options.assignment_ttl, secs(derived), "{interval}");
        assert_eq!(options.report_timeout, secs(derived), "{interval}");
    }
    let explicit = super::RlqsSettings {
        rlqs_assignment_ttl: Some(secs(4)),
        rlqs_report_timeout: Some(secs(7)),
        ..with(1)
    }
    .options();
    assert_eq!(
        (explicit.assignment_ttl, explicit.report_timeout),
        (secs(4), secs(7))
    );
}

/// Zero, negative and absurd durations are refused with the value named.
#[test]
fn bad_durations_are_refused() {
    for bad in ["0", "-1", "x", "100000"] {
        let error = super::parse_seconds(bad).unwrap_err();
        assert!(error.contains(bad), "{error}");
    }
}
