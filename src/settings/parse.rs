//! The value parsers flags of several areas share: durations, ratios, fractions.

use std::time::Duration;

use crate::store::redis::redact::redact_url;

pub(super) fn parse_positive_seconds(text: &str) -> Result<Duration, String> {
    match parse_seconds(text)? {
        seconds if seconds > Duration::ZERO => Ok(seconds),
        _ => Err(format!("'{text}' is not a positive number of seconds")),
    }
}

pub(super) fn parse_ratio(text: &str) -> Result<f32, String> {
    text.parse::<f32>()
        .ok()
        .filter(|r| (0.0..=1.0).contains(r))
        .ok_or_else(|| format!("'{text}' is not a ratio between 0 and 1"))
}

/// `--lease-fraction`: a number from 0 (leases off) to 0.5. More than half a bucket in one
/// replica's hands would leave the others less than this one holds.
pub(super) fn parse_lease_fraction(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|r| (0.0..=0.5).contains(r))
        .ok_or_else(|| format!("'{text}' is not a lease fraction between 0 (off) and 0.5"))
}

pub(super) fn parse_millis(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("'{text}' is not a positive number of milliseconds"))
}

/// A `max_wait`-style duration (`50ms`, `250us`, `1s`, `0`), in µs, at most 60 s.
pub(super) fn parse_max_wait(text: &str) -> Result<u64, String> {
    let us = crate::config::parse_wait(text)?;
    if us > crate::limiter::MAX_WAIT_US {
        return Err(format!("'{text}' exceeds the longest max_wait, 60s"));
    }
    Ok(us)
}

pub(super) fn parse_seconds(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("'{text}' is not a number of seconds (0 or more)"))
}

/// Redis URLs (cluster seeds, sentinels) with their passwords redacted, for logs and `Debug`:
/// the main Redis and the per-second one alike.
pub(super) fn redact_urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redact_url(url)).collect()
}
