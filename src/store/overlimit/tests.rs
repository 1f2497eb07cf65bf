use super::*;
use crate::limiter::{Algorithm, LimitParams};

fn op(value: &[u8], cost: i64) -> BucketOp {
    let params = LimitParams::of(Algorithm::TokenBucket, 1, 1, 1);
    BucketOp::debit("d", "k", value, params, cost)
}

fn denied(retry_us: u64) -> Applied {
    Applied {
        committed: false,
        from_local_cache: false,
        delay_us: 0,
        buckets: vec![BucketResult {
            admitted: false,
            view: View {
                remaining: 0,
                reset_us: retry_us,
            },
            retry_after_us: Some(retry_us),
            window: None,
            at_us: None,
        }],
    }
}

/// A denial is remembered for its cost and above, until its retry time, and no longer.
#[test]
fn remembers_denial_until_retry_time() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    cache.learn(&[op(b"a", 2)], &denied(1_000), sent);
    assert!(cache.answer(&[op(b"a", 2)], sent).is_some());
    assert!(cache.answer(&[op(b"a", 3)], sent).is_some());
    assert!(
        cache.answer(&[op(b"a", 1)], sent).is_none(),
        "a smaller cost may pass"
    );
    assert!(
        cache.answer(&[op(b"b", 2)], sent).is_none(),
        "another bucket"
    );
    let later = sent + Duration::from_micros(1_000);
    assert!(
        cache.answer(&[op(b"a", 2)], later).is_none(),
        "retry time reached"
    );
}

/// A reset bucket is forgotten; the others stay known.
#[test]
fn forgets_reset_buckets_only() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    cache.learn(&[op(b"a", 1)], &denied(1_000_000), sent);
    cache.learn(&[op(b"b", 1)], &denied(1_000_000), sent);
    cache.forget(&[op(b"a", 0)]);
    assert!(cache.answer(&[op(b"a", 1)], sent).is_none());
    assert!(cache.answer(&[op(b"b", 1)], sent).is_some());
}

/// Checks, refunds and shadow ops never get a cached denial.
#[test]
fn only_enforcing_debits_are_answered() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    cache.learn(&[op(b"a", 1)], &denied(1_000_000), sent);
    assert!(cache.answer(&[op(b"a", 0)], sent).is_none());
    assert!(cache.answer(&[op(b"a", -1)], sent).is_none());
    let mut shadow = op(b"a", 1);
    shadow.enforce = false;
    assert!(cache.answer(&[shadow], sent).is_none());
}

/// Overdraft debits always reach the store: a denial is neither learned nor answered.
#[test]
fn overdraft_ops_are_never_cached() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    let mut overdraft = op(b"a", 1);
    overdraft.params.overdraft = true;
    cache.learn(std::slice::from_ref(&overdraft), &denied(1_000_000), sent);
    assert!(cache.answer(&[op(b"a", 1)], sent).is_none());
    cache.learn(&[op(b"a", 1)], &denied(1_000_000), sent);
    assert!(cache.answer(&[overdraft], sent).is_none());
}

/// A committed refund through this replica forgets the bucket.
#[test]
fn refund_invalidates() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    cache.learn(&[op(b"a", 1)], &denied(1_000_000), sent);
    let refund = Applied {
        committed: true,
        from_local_cache: false,
        delay_us: 0,
        buckets: vec![BucketResult {
            admitted: true,
            view: View {
                remaining: 1,
                reset_us: 0,
            },
            retry_after_us: Some(0),
            window: None,
            at_us: None,
        }],
    };
    cache.learn(&[op(b"a", -1)], &refund, sent);
    assert!(cache.answer(&[op(b"a", 1)], sent).is_none());
}

/// A request with a bucket not known to deny goes to the store; one whose buckets all
/// deny is answered with Redis's own retry and reset times.
#[test]
fn answers_only_when_every_bucket_is_known() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    let mut redis = denied(5_000);
    redis.buckets[0].view.reset_us = 60_000_000;
    cache.learn(&[op(b"a", 1)], &redis, sent);
    assert!(cache.answer(&[op(b"b", 1), op(b"a", 1)], sent).is_none());
    let applied = cache.answer(&[op(b"a", 1)], sent).unwrap();
    assert!(!applied.committed);
    assert_eq!(applied.buckets[0].retry_after_us, Some(5_000));
    assert_eq!(applied.buckets[0].view.reset_us, 60_000_000);
}

/// The lookup skipped once every denial's retry time has passed keeps every denial that
/// has not: a shorter denial learned after a longer one, and the longer one after the
/// shorter one's time.
#[test]
fn every_denial_is_kept_until_its_own_retry_time() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    cache.learn(&[op(b"long", 1)], &denied(10_000), sent);
    cache.learn(&[op(b"short", 1)], &denied(1_000), sent);
    let between = sent + Duration::from_micros(5_000);
    assert!(cache.answer(&[op(b"short", 1)], sent).is_some());
    assert!(cache.answer(&[op(b"short", 1)], between).is_none());
    assert!(cache.answer(&[op(b"long", 1)], between).is_some());
    let after = sent + Duration::from_micros(10_000);
    assert!(cache.answer(&[op(b"long", 1)], after).is_none());
    cache.learn(&[op(b"again", 1)], &denied(1_000), after);
    assert!(cache.answer(&[op(b"again", 1)], after).is_some());
}

/// A cost that can never pass (no retry time) teaches nothing.
#[test]
fn impossible_cost_is_not_cached() {
    let cache = OverLimitCache::new(100, None);
    let sent = Instant::now();
    let mut never = denied(0);
    never.buckets[0].retry_after_us = None;
    cache.learn(&[op(b"a", 5)], &never, sent);
    assert!(cache.answer(&[op(b"a", 5)], sent).is_none());
}
