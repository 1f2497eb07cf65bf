//! Flags of the Rate Limit Quota Service (`crate::rlqs`, docs/rlqs.md).

use std::time::Duration;

use clap::Args;

/// Bounds and timings of RLQS streams.
#[derive(Args, Clone, Debug)]
pub struct RlqsSettings {
    /// RLQS streams (`StreamRateLimitQuotas`) open at once, all clients together. One more is
    /// refused with RESOURCE_EXHAUSTED; Envoy retries it.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_STREAMS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_streams: u32,

    /// Buckets one RLQS stream may subscribe to. A report that would subscribe one more ends
    /// the stream with RESOURCE_EXHAUSTED.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_BUCKETS_PER_STREAM", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_buckets_per_stream: u32,

    /// Seconds an assignment holds (`assignment_time_to_live`). Envoy reports every 5 s by
    /// default; keep this at two or three reporting intervals, so each report extends the
    /// assignment before it expires. An Envoy that stops reporting loses its share of a
    /// bucket a quarter of this after its assignment expired.
    #[arg(long, env = "FLOODGATE_RLQS_ASSIGNMENT_TTL", value_name = "SECONDS",
          default_value = "15", value_parser = parse_seconds)]
    pub rlqs_assignment_ttl: Duration,

    /// Seconds a subscribed bucket may report no requests (or not report at all) before the
    /// server abandons it (`AbandonAction`): Envoy then forgets it, and the server too.
    #[arg(long, env = "FLOODGATE_RLQS_ABANDON_AFTER", value_name = "SECONDS",
          default_value = "60", value_parser = parse_seconds)]
    pub rlqs_abandon_after: Duration,

    /// Seconds between re-evaluations of a stream's shares without a report: each bucket not
    /// reported for this long is settled again on the demands already known, and gets a new
    /// assignment if its share changed. So an Envoy that starts reporting on a bucket others
    /// hold in full gets its share within about two of these, not two reporting intervals.
    #[arg(long, env = "FLOODGATE_RLQS_REASSESS_INTERVAL", value_name = "SECONDS",
          default_value = "1", value_parser = parse_seconds)]
    pub rlqs_reassess_interval: Duration,
}

impl RlqsSettings {
    /// The service's options these flags give.
    pub fn options(&self) -> crate::rlqs::RlqsOptions {
        crate::rlqs::RlqsOptions {
            max_streams: self.rlqs_max_streams,
            max_buckets_per_stream: self.rlqs_max_buckets_per_stream,
            assignment_ttl: self.rlqs_assignment_ttl,
            abandon_after: self.rlqs_abandon_after,
            reassess_interval: self.rlqs_reassess_interval,
        }
    }
}

impl Default for RlqsSettings {
    /// The flags' defaults.
    fn default() -> RlqsSettings {
        RlqsSettings {
            rlqs_max_streams: 1_000,
            rlqs_max_buckets_per_stream: 1_000,
            rlqs_assignment_ttl: Duration::from_secs(15),
            rlqs_abandon_after: Duration::from_secs(60),
            rlqs_reassess_interval: Duration::from_secs(1),
        }
    }
}

/// A positive number of seconds (fractions allowed, at least 1 ms), at most one day.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.001 && *s <= 86_400.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("'{text}' is not a number of seconds between 0.001 and 86400"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::settings::{Cli, Command};

    /// `RlqsSettings::default()` is what the flags default to.
    #[test]
    fn default_is_the_flag_defaults() {
        let Command::Serve(settings) =
            Cli::parse_from(["floodgate", "serve", "--config", "x"]).command
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
            settings.rlqs.rlqs_abandon_after,
            defaults.rlqs_abandon_after
        );
        assert_eq!(
            settings.rlqs.rlqs_reassess_interval,
            defaults.rlqs_reassess_interval
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
}
