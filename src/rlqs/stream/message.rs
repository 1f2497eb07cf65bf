//! The messages of a stream, read and written: a report's bucket id checked and sorted, its
//! demand per period, the share table request it makes, and the assignment sent back.

use std::time::Duration;

use super::StreamError;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;
use crate::proto::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::proto::rlqs::{BucketId, rate_limit_quota_response};
use crate::proto::types::RateLimitStrategy;
use crate::rlqs::quota::SharedLimit;
use crate::rlqs::share::Ask;

/// The most entries one `BucketId` may have: a bucket is a handful of request attributes.
pub const MAX_BUCKET_ENTRIES: usize = 16;

/// The id Envoy sent, from its sorted entries (a map: its order is not Envoy's to keep).
pub(super) fn bucket_id(entries: &[(String, String)]) -> BucketId {
    BucketId {
        bucket: entries.iter().cloned().collect(),
    }
}

/// The share table request of a holder of `limit`.
pub(super) fn ask(limit: &SharedLimit, demand: Option<u64>, ttl: Duration) -> Ask {
    Ask {
        capacity: limit.capacity,
        demand,
        life_us: row_life(ttl),
    }
}

/// How long a holder's row outlives its report: the assignment's time to live and a
/// quarter more, so the Envoy's assignment (which starts when it arrives) always expires
/// before the row that counts it.
pub fn row_life(ttl: Duration) -> i64 {
    i64::try_from(row_life_duration(ttl).as_micros()).unwrap_or(i64::MAX)
}

/// [`row_life`] as a duration.
pub(super) fn row_life_duration(ttl: Duration) -> Duration {
    ttl + ttl / 4
}

/// A quota assignment action.
pub(super) fn action(
    id: BucketId,
    strategy: RateLimitStrategy,
    ttl: Option<Duration>,
) -> BucketAction {
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(
            rate_limit_quota_response::bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    assignment_time_to_live: ttl.map(|ttl| prost_types::Duration {
                        seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
                        nanos: i32::try_from(ttl.subsec_nanos()).unwrap_or(0),
                    }),
                    rate_limit_strategy: Some(strategy),
                },
            ),
        ),
    }
}

/// A report's demand in tokens per period of `limit`: its requests over its elapsed time.
/// `None` when the elapsed time is 0 (Envoy's first report for a bucket says 0 s: it counts
/// whole seconds) or negative.
pub(super) fn demand(
    limit: &SharedLimit,
    requests: u64,
    elapsed: Option<prost_types::Duration>,
) -> Option<u64> {
    let elapsed = elapsed?;
    let elapsed_ns = i128::from(elapsed.seconds) * 1_000_000_000 + i128::from(elapsed.nanos);
    if elapsed_ns <= 0 {
        return None;
    }
    let period_ns = i128::from(limit.period_s) * 1_000_000_000;
    let per_period = i128::from(requests) * period_ns / elapsed_ns;
    Some(u64::try_from(per_period).unwrap_or(u64::MAX))
}

/// The sorted entries of report `index`, or why they are not a bucket id.
pub(super) fn entries(
    usage: &BucketQuotaUsage,
    index: usize,
) -> Result<Vec<(String, String)>, StreamError> {
    let invalid =
        |what: &str| StreamError::Invalid(format!("bucket_quota_usages[{index}]: {what}"));
    let Some(id) = &usage.bucket_id else {
        return Err(invalid("bucket_id is required"));
    };
    if id.bucket.is_empty() {
        return Err(invalid("bucket_id has no entries"));
    }
    if id.bucket.len() > MAX_BUCKET_ENTRIES {
        return Err(invalid(&format!(
            "bucket_id has {} entries; at most {MAX_BUCKET_ENTRIES}",
            id.bucket.len()
        )));
    }
    if let Some(key) = id
        .bucket
        .iter()
        .find(|(k, v)| k.is_empty() || v.is_empty())
        .map(|(k, _)| k)
    {
        return Err(invalid(&format!(
            "bucket_id entry '{key}' has an empty key or value"
        )));
    }
    let mut entries: Vec<(String, String)> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests;
