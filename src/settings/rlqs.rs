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

    /// RLQS streams open at once from one peer address (an Envoy opens one per
    /// `rate_limit_quota` filter config and RLQS server). One more is refused with
    /// RESOURCE_EXHAUSTED, so one client cannot hold every `--rlqs-max-streams` slot.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_STREAMS_PER_PEER", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_streams_per_peer: u32,

    /// Buckets one RLQS stream may subscribe to. A report that would subscribe one more ends
    /// the stream with RESOURCE_EXHAUSTED.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_BUCKETS_PER_STREAM", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_buckets_per_stream: u32,

    /// Bucket subscriptions held at once, all RLQS streams together (an ended stream's until
    /// its assignments expire). A report that would subscribe one more ends its stream with
    /// RESOURCE_EXHAUSTED; the other streams go on.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_BUCKETS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub rlqs_max_buckets: u32,

    /// Bytes the bucket subscriptions may be charged, all RLQS streams together: 1 KiB per
    /// subscription, and each distinct bucket id's keys and values (stored once, however
    /// many streams report it). Past it a report that subscribes ends its stream with
    /// RESOURCE_EXHAUSTED; the other streams go on.
    #[arg(long, env = "FLOODGATE_RLQS_MAX_BUCKET_BYTES", default_value_t = 16 << 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rlqs_max_bucket_bytes: u64,

    /// Seconds between an Envoy's usage reports: its `reporting_interval`. Envoy 1.40 reports
    /// every 5 s whatever that says, so the assignment's time to live and the report timeout
    /// are derived from the longer of this and 5 s.
    #[arg(long, env = "FLOODGATE_RLQS_REPORTING_INTERVAL", value_name = "SECONDS",
          default_value = "5", value_parser = parse_seconds)]
    pub rlqs_reporting_interval: Duration,

    /// Seconds a stream may send no usage report before it is ended with DEADLINE_EXCEEDED
    /// (Envoy opens its stream with a report, then reports at least every 5 s). Default: 3
    /// reporting periods, `3 × max(--rlqs-reporting-interval, 5 s)`.
    #[arg(long, env = "FLOODGATE_RLQS_REPORT_TIMEOUT", value_name = "SECONDS",
          value_parser = parse_seconds)]
    pub rlqs_report_timeout: Option<Duration>,

    /// Seconds an assignment holds (`assignment_time_to_live`). Default: 3 reporting
    /// periods, `3 × max(--rlqs-reporting-interval, 5 s)` (15 s), so each report extends the
    /// assignment before it expires even with a report lost. An Envoy that stops reporting
    /// loses its share of a bucket a quarter of this after its assignment expired.
    #[arg(long, env = "FLOODGATE_RLQS_ASSIGNMENT_TTL", value_name = "SECONDS",
          value_parser = parse_seconds)]
    pub rlqs_assignment_ttl: Option<Duration>,

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

/// The shortest period Envoy reports at: Envoy 1.40 reports every 5 s (a fixed 5000 ms in
/// its rate_limit_quota filter), whatever the bucket's `reporting_interval` says.
pub const ENVOY_REPORT_PERIOD: Duration = Duration::from_secs(5);

/// Reporting periods an assignment (and a silent stream) lasts by default: a report may be
/// lost or late, and the next one still extends the assignment before it expires.
const PERIODS: u32 = 3;

impl RlqsSettings {
    /// The period Envoys report at: the longer of `--rlqs-reporting-interval` and 5 s.
    pub fn report_period(&self) -> Duration {
        self.rlqs_reporting_interval.max(ENVOY_REPORT_PERIOD)
    }

    /// The service's options these flags give.
    pub fn options(&self) -> crate::rlqs::RlqsOptions {
        let derived = self.report_period() * PERIODS;
        crate::rlqs::RlqsOptions {
            max_streams: self.rlqs_max_streams,
            max_streams_per_peer: self.rlqs_max_streams_per_peer,
            max_buckets_per_stream: self.rlqs_max_buckets_per_stream,
            max_buckets: self.rlqs_max_buckets,
            max_bucket_bytes: usize::try_from(self.rlqs_max_bucket_bytes).unwrap_or(usize::MAX),
            report_timeout: self.rlqs_report_timeout.unwrap_or(derived),
            assignment_ttl: self.rlqs_assignment_ttl.unwrap_or(derived),
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
            rlqs_max_streams_per_peer: 100,
            rlqs_max_buckets_per_stream: 1_000,
            rlqs_max_buckets: 10_000,
            rlqs_max_bucket_bytes: 16 << 20,
            rlqs_reporting_interval: ENVOY_REPORT_PERIOD,
            rlqs_report_timeout: None,
            rlqs_assignment_ttl: None,
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
mod tests;
