use super::*;
use crate::bucket::KeyValue;
use crate::limiter::Algorithm;

/// An overdraft op that does not fit never blocks the commit and is stored anyway;
/// a non-overdraft enforcing op that does not fit blocks everything.
#[test]
fn settle_overdraft_never_blocks_and_always_stores() {
    use crate::limiter::evaluate;
    let params = LimitParams {
        algorithm: Algorithm::FixedWindow,
        requests_per_period: 2,
        period_us: 60_000_000,
        burst: 2,
        overdraft: true,
        max_wait_us: 0,
    };
    let op = |name: &[u8], overdraft, cost| BucketOp {
        key: BucketKey::new(
            "d",
            [(&b"k"[..], KeyValue::Value(name))],
            Algorithm::FixedWindow,
            60_000_000,
        ),
        params: LimitParams {
            overdraft,
            max_wait_us: 0,
            ..params
        },
        cost,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    };
    let now = 1_700_000_040_000_000;
    let ops = [op(b"a", true, 5), op(b"b", false, 1)];
    let evaluations: Vec<_> = ops
        .iter()
        .map(|o| evaluate(&o.params, None, now, o.cost))
        .collect();
    let (applied, store) = settle(&ops, &evaluations);
    assert!(applied.committed);
    assert_eq!(store[..], [true, true]);
    assert!(!applied.buckets[0].admitted);
    assert_eq!(applied.buckets[0].view.remaining, 0);
    let ops = [op(b"a", true, 1), op(b"b", false, 5)];
    let evaluations: Vec<_> = ops
        .iter()
        .map(|o| evaluate(&o.params, None, now, o.cost))
        .collect();
    let (applied, store) = settle(&ops, &evaluations);
    assert!(!applied.committed);
    assert_eq!(store[..], [false, false]);
}

/// What is given back: only debits that were stored, overdraft ones only when the
/// request as a whole was not committed.
#[test]
fn undo_states_the_overdraft_rule_once() {
    let op = |overdraft, cost| BucketOp {
        key: BucketKey::new(
            "d",
            [(&b"k"[..], KeyValue::Value(b"v"))],
            Algorithm::TokenBucket,
            1_000_000,
        ),
        params: LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_period: 10,
            period_us: 1_000_000,
            burst: 10,
            overdraft,
            max_wait_us: 0,
        },
        cost,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    };
    let result = |admitted| BucketResult {
        admitted,
        view: View {
            remaining: 0,
            reset_us: 0,
        },
        retry_after_us: None,
        window: None,
        at_us: None,
    };
    let undone = |op: BucketOp, admitted, why| op.undo(&result(admitted), why).map(|u| u.cost);
    for why in [Undo::NotCommitted, Undo::Withdrawn] {
        assert_eq!(undone(op(false, 3), true, why), Some(-3));
        assert_eq!(undone(op(false, 3), false, why), None, "never stored");
        assert_eq!(undone(op(false, 0), true, why), None, "a check");
        assert_eq!(undone(op(false, -2), true, why), None, "a refund");
    }
    // An overdraft debit is stored whether it fitted or not when the request commits.
    assert_eq!(undone(op(true, 3), false, Undo::NotCommitted), Some(-3));
    assert_eq!(undone(op(true, 3), true, Undo::NotCommitted), Some(-3));
    assert_eq!(undone(op(true, 3), true, Undo::Withdrawn), None);
}

/// A window debit is given back to the window it names, and a window "debit" that names
/// none (the store's `allow` answer while it is down stores nothing) is not given back:
/// a refund of it would lower the current window's count by hits it never counted.
#[test]
fn undo_of_a_window_needs_the_window_it_was_stored_in() {
    let op = BucketOp {
        key: BucketKey::new(
            "d",
            [(&b"k"[..], KeyValue::Value(b"v"))],
            Algorithm::FixedWindow,
            1_000_000,
        ),
        params: LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_period: 10,
            period_us: 1_000_000,
            burst: 10,
            overdraft: false,
            max_wait_us: 0,
        },
        cost: 3,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    };
    let result = |window| BucketResult {
        admitted: true,
        view: View {
            remaining: 7,
            reset_us: 0,
        },
        retry_after_us: Some(0),
        window,
        at_us: None,
    };
    for why in [Undo::NotCommitted, Undo::Withdrawn] {
        let refund = op
            .undo(&result(Some(41)), why)
            .map(|u| (u.cost, u.debited_in));
        assert_eq!(refund, Some((-3, Some(41))));
        assert_eq!(op.undo(&result(None), why), None, "nothing was stored");
    }
}
