use super::*;
use crate::bucket::KeyValue;

const LIFETIME: Duration = Duration::from_millis(50);

fn sizing() -> Sizing {
    Sizing {
        fraction: 0.1,
        lifetime: LIFETIME,
    }
}

fn params(algorithm: Algorithm, limit: u64) -> LimitParams {
    LimitParams::of(algorithm, limit, 1, limit)
}

fn key() -> BucketKey {
    BucketKey::new(
        "d",
        [(&b"k"[..], KeyValue::Value(b"v"))],
        Algorithm::TokenBucket,
        1_000_000,
    )
}

fn op(params: LimitParams, cost: i64) -> BucketOp {
    // One bucket whatever the algorithm: the ledger keys its entries by the key alone.
    BucketOp {
        key: key(),
        ..BucketOp::debit("d", "k", b"v", params, cost)
    }
}

fn result(remaining: u64, window: Option<i64>) -> BucketResult {
    BucketResult {
        admitted: true,
        view: View {
            remaining,
            reset_us: 400_000,
        },
        retry_after_us: Some(0),
        window,
    }
}

/// Routes `n` requests of cost 1 at `now`, answering each remote one as Redis would
/// with `remaining` left; returns the routes.
fn warm(entry: &mut Entry, p: LimitParams, now: Instant, n: usize, remaining: u64) -> Vec<Route> {
    let mut returns = Vec::new();
    (0..n)
        .map(|_| {
            let route = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
            if let Route::Remote { augment } = route {
                entry.answered(
                    &key(),
                    &op(p, 1),
                    augment,
                    &result(remaining, None),
                    true,
                    (now, now),
                    1,
                    &sizing(),
                    &mut returns,
                );
            }
            route
        })
        .collect()
}

/// A bucket's share is fraction × capacity; below a few tokens, or for sliding windows,
/// nothing is leased, and only plain enforcing debits are leasable.
#[test]
fn small_buckets_and_special_ops_are_never_leased() {
    let s = sizing();
    assert_eq!(s.max_lease(&params(Algorithm::TokenBucket, 1000)), 100);
    assert_eq!(s.max_lease(&params(Algorithm::FixedWindow, 1000)), 100);
    assert_eq!(s.max_lease(&params(Algorithm::SlidingWindow, 1000)), 0);
    assert_eq!(s.max_lease(&params(Algorithm::TokenBucket, 79)), 0);
    assert_eq!(s.max_lease(&params(Algorithm::TokenBucket, 80)), 8);
    let p = params(Algorithm::TokenBucket, 1000);
    assert!(s.leasable(&op(p, 1)));
    assert!(!s.leasable(&op(p, 0)), "a check");
    assert!(!s.leasable(&op(p, -1)), "a refund");
    assert!(!s.leasable(&op(p, 101)), "more than a lease");
    let shadow = BucketOp {
        enforce: false,
        ..op(p, 1)
    };
    assert!(!s.leasable(&shadow));
    let shaped = op(
        LimitParams {
            max_wait_us: 1000,
            ..p
        },
        1,
    );
    assert!(!s.leasable(&shaped));
    let off = Sizing { fraction: 0.0, ..s };
    assert!(!off.leasable(&op(p, 1)));
}

/// A cold bucket goes to Redis without a lease; once several requests arrived within a
/// lifetime, the next asks for a lease sized from that demand, within what Redis had
/// left, and only one request asks at a time.
#[test]
fn a_lease_is_asked_for_once_the_bucket_is_hot() {
    let now = Instant::now();
    let p = params(Algorithm::TokenBucket, 1000);
    let mut entry = Entry::new(now);
    let mut returns = Vec::new();
    for _ in 0..5 {
        let route = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
        assert_eq!(route, Route::Remote { augment: 0 });
        entry.answered(
            &key(),
            &op(p, 1),
            0,
            &result(990, None),
            true,
            (now, now),
            1,
            &sizing(),
            &mut returns,
        );
    }
    // Demand 6 → wants 9.
    let route = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
    assert_eq!(route, Route::Remote { augment: 9 });
    let other = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
    assert_eq!(other, Route::Remote { augment: 0 }, "one ask at a time");
    // Redis had only 5 left: a lease must fit beside the request, so none is asked.
    let mut poor = Entry::new(now);
    warm(&mut poor, p, now, 20, 5);
    let route = poor.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
    assert_eq!(route, Route::Remote { augment: 0 });
    assert!(returns.is_empty());
}

/// A committed ask becomes a lease spent locally until it is empty; then the bucket
/// goes back to Redis; a denied or failed ask holds nothing and lets the next ask.
#[test]
fn acquire_spend_and_run_out() {
    let now = Instant::now();
    let p = params(Algorithm::TokenBucket, 1000);
    let mut entry = Entry::new(now);
    let w = warm(&mut entry, p, now, 5, 990);
    let mut returns = Vec::new();
    let r = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
    let Route::Remote { augment } = r else {
        panic!("expected an ask, warmed with {w:?}, got {r:?}");
    };
    let held = entry.answered(
        &key(),
        &op(p, 1),
        augment,
        &result(980, None),
        true,
        (now, now),
        7,
        &sizing(),
        &mut returns,
    );
    assert_eq!(held, augment);
    // Spent locally until half is gone; then one request renews with its own call.
    let mut spent = 0;
    let renewal = loop {
        match entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns) {
            Route::Local(take) => {
                spent += 1;
                assert_eq!(take.lease, 7);
                assert_eq!(take.view.remaining, 980 + augment - spent);
            }
            Route::Remote { augment } => break augment,
            Route::Bypass => panic!("a tracked bucket is never bypassed"),
        }
    };
    assert!(renewal > 0, "the renewal asks for tokens");
    assert!(
        spent < augment && (augment - spent - 1) * 2 < augment,
        "renewed once half is spent, before the lease runs out"
    );
    // While the renewal is in flight the rest is spent locally, then Redis decides.
    for _ in spent..augment {
        assert!(matches!(
            entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns),
            Route::Local(_)
        ));
    }
    assert_eq!(
        entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns),
        Route::Remote { augment: 0 }
    );
    // The renewal lands: added to the lease, which keeps its id.
    let held = entry.answered(
        &key(),
        &op(p, 1),
        renewal,
        &result(900, None),
        true,
        (now, now),
        8,
        &sizing(),
        &mut returns,
    );
    assert_eq!(held, renewal);
    let lease = entry.lease().expect("a lease is held");
    assert_eq!((lease.id, lease.left), (7, renewal));
    assert!(returns.is_empty(), "a spent lease returns nothing");
    // A denied ask holds nothing, and the next request may ask again.
    let mut denied = Entry::new(now);
    warm(&mut denied, p, now, 5, 990);
    let Route::Remote { augment } = denied.route(&key(), &op(p, 1), now, &sizing(), &mut returns)
    else {
        panic!("expected an ask");
    };
    let no = BucketResult {
        admitted: false,
        ..result(3, None)
    };
    let held = denied.answered(
        &key(),
        &op(p, 1),
        augment,
        &no,
        false,
        (now, now),
        8,
        &sizing(),
        &mut returns,
    );
    assert_eq!(held, 0);
    assert!(denied.lease().is_none());
    assert_eq!(
        denied.route(&key(), &op(p, 1), now, &sizing(), &mut returns),
        Route::Remote { augment: 0 },
        "Redis had 3 left: too few for a lease"
    );
}

/// At expiry the lease is not spent: its rest goes back as a refund (a token bucket's
/// without a window, a fixed window's to the window it was debited in).
#[test]
fn expiry_returns_the_rest() {
    let now = Instant::now();
    for (algorithm, window) in [
        (Algorithm::TokenBucket, None),
        (Algorithm::FixedWindow, Some(42)),
    ] {
        let p = params(algorithm, 1000);
        let mut entry = Entry::new(now);
        warm(&mut entry, p, now, 5, 990);
        let mut returns = Vec::new();
        let Route::Remote { augment } =
            entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns)
        else {
            panic!("expected an ask");
        };
        entry.answered(
            &key(),
            &op(p, 1),
            augment,
            &result(980, window),
            true,
            (now, now),
            1,
            &sizing(),
            &mut returns,
        );
        assert!(matches!(
            entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns),
            Route::Local(_)
        ));
        let later = now + LIFETIME;
        assert!(entry.sweep(&key(), later, LIFETIME, &mut returns));
        assert!(entry.lease().is_none());
        assert_eq!(returns.len(), 1);
        assert_eq!(returns[0].cost, -i64::try_from(augment - 1).unwrap());
        assert_eq!(returns[0].debited_in, window);
        assert!(!entry.sweep(&key(), later + LIFETIME * 2, LIFETIME, &mut returns));
    }
}

/// A fixed window's lease ends when the window Redis debited it in ends, even before its
/// lifetime: none of its tokens is spent in the next window.
#[test]
fn a_window_lease_ends_with_its_window() {
    let now = Instant::now();
    let p = params(Algorithm::FixedWindow, 1000);
    let mut entry = Entry::new(now);
    warm(&mut entry, p, now, 5, 990);
    let mut returns = Vec::new();
    let Route::Remote { augment } = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns)
    else {
        panic!("expected an ask");
    };
    let ending = BucketResult {
        view: View {
            remaining: 980,
            reset_us: 10_000,
        },
        ..result(980, Some(7))
    };
    entry.answered(
        &key(),
        &op(p, 1),
        augment,
        &ending,
        true,
        (now, now),
        1,
        &sizing(),
        &mut returns,
    );
    assert_eq!(
        entry.lease().map(|l| l.expires),
        Some(now + Duration::from_millis(10))
    );
    let after = now + Duration::from_millis(10);
    assert!(matches!(
        entry.route(&key(), &op(p, 1), after, &sizing(), &mut returns),
        Route::Remote { .. }
    ));
    assert_eq!(returns.len(), 1, "the rest goes back to window 7");
    assert_eq!(returns[0].debited_in, Some(7));
}

/// Tokens of a request denied elsewhere go back to their lease; after the lease ended
/// or was replaced, to Redis instead. A changed limit ends the lease.
#[test]
fn give_back_and_changed_limits() {
    let now = Instant::now();
    let p = params(Algorithm::TokenBucket, 1000);
    let mut entry = Entry::new(now);
    warm(&mut entry, p, now, 5, 990);
    let mut returns = Vec::new();
    let Route::Remote { augment } = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns)
    else {
        panic!("expected an ask");
    };
    entry.answered(
        &key(),
        &op(p, 1),
        augment,
        &result(980, None),
        true,
        (now, now),
        3,
        &sizing(),
        &mut returns,
    );
    let Route::Local(take) = entry.route(&key(), &op(p, 2), now, &sizing(), &mut returns) else {
        panic!("expected a local answer");
    };
    assert_eq!(entry.lease().map(|l| l.left), Some(augment - 2));
    entry.give_back(&key(), &take, now, &mut returns);
    assert_eq!(entry.lease().map(|l| l.left), Some(augment));
    assert!(returns.is_empty());
    // A reload changed the limit: the lease ends, its tokens go back, Redis decides.
    let Route::Local(take) = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns) else {
        panic!("expected a local answer");
    };
    let changed = params(Algorithm::TokenBucket, 500);
    let route = entry.route(&key(), &op(changed, 1), now, &sizing(), &mut returns);
    assert!(matches!(route, Route::Remote { .. }));
    assert_eq!(returns.len(), 1);
    assert_eq!(returns[0].cost, -i64::try_from(augment - 1).unwrap());
    assert_eq!(
        returns[0].params, p,
        "returned under the limit it was taken under"
    );
    // The earlier take's lease is gone: its tokens go to Redis.
    entry.give_back(&key(), &take, now, &mut returns);
    assert_eq!(returns.len(), 2);
    assert_eq!(returns[1].cost, -1);
}
