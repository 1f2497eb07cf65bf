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
        at_us: None,
    }
}

/// Redis's committed answer at `now` to a one-token request on `p` that asked for `augment`
/// more tokens (`answer`: what Redis reported), as lease `id`: what [`Entry::answered`]
/// returns.
fn granted(
    entry: &mut Entry,
    p: LimitParams,
    augment: u64,
    answer: &BucketResult,
    now: Instant,
    id: u64,
    returns: &mut Vec<BucketOp>,
) -> u64 {
    entry.answered(
        &key(),
        &op(p, 1),
        augment,
        answer,
        true,
        (now, now),
        id,
        &sizing(),
        returns,
    )
}

/// Routes `n` requests of cost 1 at `now`, answering each remote one as Redis would
/// with `remaining` left; returns the routes.
fn warm(entry: &mut Entry, p: LimitParams, now: Instant, n: usize, remaining: u64) -> Vec<Route> {
    let mut returns = Vec::new();
    (0..n)
        .map(|_| {
            let route = entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns);
            if let Route::Remote { augment } = route {
                granted(
                    entry,
                    p,
                    augment,
                    &result(remaining, None),
                    now,
                    1,
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
        granted(&mut entry, p, 0, &result(990, None), now, 1, &mut returns);
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
    let held = granted(
        &mut entry,
        p,
        augment,
        &result(980, None),
        now,
        7,
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
    let held = granted(
        &mut entry,
        p,
        renewal,
        &result(900, None),
        now,
        8,
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
        granted(
            &mut entry,
            p,
            augment,
            &result(980, window),
            now,
            1,
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
    granted(&mut entry, p, augment, &ending, now, 1, &mut returns);
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
    granted(
        &mut entry,
        p,
        augment,
        &result(980, None),
        now,
        3,
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

/// What [`steady`] counted over its measured span.
#[derive(Debug, Default)]
struct Churn {
    /// Requests answered from the lease.
    local: u64,
    /// Requests that asked Redis for tokens (new lease or renewal).
    asks: u64,
    /// Requests sent to Redis with no ask while another was asking or no lease was held:
    /// each a script call a lease should have saved.
    plain: u64,
    /// Leases that ended with tokens unspent (expired before they were used).
    expired: u64,
}

/// Drives one hot bucket on a virtual clock: `per_ms(ms)` requests of cost 1 in each
/// millisecond, spread evenly, every ask answered by Redis `rtt` later (plenty left), the
/// sweeper every lifetime. Counts what happened after the first `warmup_ms`.
fn steady(per_ms: impl Fn(u64) -> u64, rtt: Duration, warmup_ms: u64, total_ms: u64) -> Churn {
    let start = Instant::now();
    let p = params(Algorithm::TokenBucket, 1_000_000);
    let s = sizing();
    let mut entry = Entry::new(start);
    let mut churn = Churn::default();
    let mut pending: Vec<(Instant, Instant, u64)> = Vec::new();
    let mut next_sweep = start + LIFETIME;
    let mut id = 0;
    for ms in 0..total_ms {
        let n = per_ms(ms);
        for i in 0..n {
            let now = start + Duration::from_micros(ms * 1_000 + i * 1_000 / n);
            let measured = ms >= warmup_ms;
            let mut returns = Vec::new();
            // Answers due by now land first, then the sweeper runs if due.
            pending.retain(|&(sent, due, augment)| {
                if due > now {
                    return true;
                }
                id += 1;
                entry.answered(
                    &key(),
                    &op(p, 1),
                    augment,
                    &result(900_000, None),
                    true,
                    (sent, due),
                    id,
                    &s,
                    &mut returns,
                );
                false
            });
            if now >= next_sweep {
                entry.sweep(&key(), now, LIFETIME, &mut returns);
                next_sweep += LIFETIME;
            }
            match entry.route(&key(), &op(p, 1), now, &s, &mut returns) {
                Route::Local(_) => churn.local += u64::from(measured),
                Route::Remote { augment: 0 } => {
                    churn.plain += u64::from(measured);
                    // Its answer only tells what Redis has left.
                    entry.answered(
                        &key(),
                        &op(p, 1),
                        0,
                        &result(900_000, None),
                        true,
                        (now, now + rtt),
                        0,
                        &s,
                        &mut returns,
                    );
                }
                Route::Remote { augment } => {
                    churn.asks += u64::from(measured);
                    pending.push((now, now + rtt, augment));
                }
                Route::Bypass => panic!("a leasable bucket is never bypassed"),
            }
            if measured {
                churn.expired += returns.len() as u64;
            }
        }
    }
    churn
}

/// Under steady demand a hot bucket's lease is renewed before it runs out or expires: after
/// the first lease, no request goes to Redis without an ask and no lease ends unspent (a
/// renewal that added a whole lease on top of the half left made a lease the demand could
/// not spend within its lifetime, so every other lease expired and the requests during the
/// next ask went to Redis one by one).
#[test]
fn steady_demand_keeps_one_lease_renewed() {
    for per_ms in [4, 20, 100] {
        for rtt in [Duration::from_micros(200), Duration::from_millis(5)] {
            let churn = steady(|_| per_ms, rtt, 200, 2_200);
            assert_eq!(
                (churn.plain, churn.expired),
                (0, 0),
                "{per_ms} requests a ms, {rtt:?} round trip: {churn:?}"
            );
            assert!(churn.local > churn.asks * 10, "{churn:?}");
        }
    }
}

/// A lease whose demand slows (requests held up elsewhere) is renewed in the last quarter of
/// its lifetime rather than left to expire while requests still come: no request goes to
/// Redis without an ask, no lease ends unspent.
#[test]
fn a_slowed_lease_is_renewed_before_it_expires() {
    // 20 requests a ms, slowed to 2 a ms for 30 ms out of every 60.
    let churn = steady(
        |ms| if ms % 60 < 30 { 20 } else { 2 },
        Duration::from_micros(500),
        200,
        2_200,
    );
    assert_eq!((churn.plain, churn.expired), (0, 0), "{churn:?}");
}

/// A renewal slower than a quarter of the lease's lifetime (a busy host's round trip) does
/// not leave a gap: the lease it renews is spent until it lands, so no request goes to Redis
/// without an ask and no lease ends unspent.
#[test]
fn a_slow_renewal_leaves_no_gap() {
    for rtt in [30, 40] {
        let churn = steady(|_| 20, Duration::from_millis(rtt), 200, 2_200);
        assert_eq!(
            (churn.plain, churn.expired),
            (0, 0),
            "{rtt} ms round trip: {churn:?}"
        );
    }
}

/// A token bucket's lease is kept past its lifetime only while its renewal is in flight:
/// once that call fails (abandoned), the next request ends it, its rest returned, and asks
/// anew — a renewal that never lands does not keep the lease, or stop the asks, for good.
#[test]
fn a_lease_kept_for_its_renewal_ends_once_the_renewal_fails() {
    let now = Instant::now();
    let p = params(Algorithm::TokenBucket, 1000);
    let mut entry = Entry::new(now);
    warm(&mut entry, p, now, 5, 990);
    let mut returns = Vec::new();
    // A lease taken, then spent until a request asks for its renewal (then in flight).
    let mut asked = false;
    for _ in 0..1000 {
        match entry.route(&key(), &op(p, 1), now, &sizing(), &mut returns) {
            Route::Remote { augment } if augment > 0 && entry.lease.is_some() => {
                asked = true;
                break;
            }
            Route::Remote { augment } if augment > 0 => {
                // The first lease: granted.
                granted(
                    &mut entry,
                    p,
                    augment,
                    &result(980, None),
                    now,
                    1,
                    &mut returns,
                );
            }
            Route::Local(_) => {}
            other => panic!("expected the lease spent, then a renewal asked for: {other:?}"),
        }
    }
    assert!(asked, "no renewal was asked for");
    // Past its lifetime (within the next, so the demand before is still known).
    let later = now + LIFETIME * 3 / 2;
    assert!(
        matches!(
            entry.route(&key(), &op(p, 1), later, &sizing(), &mut returns),
            Route::Local(_)
        ),
        "past its lifetime, the lease is spent while its renewal is in flight"
    );
    assert!(returns.is_empty());
    entry.abandon();
    let route = entry.route(&key(), &op(p, 1), later, &sizing(), &mut returns);
    assert!(
        matches!(route, Route::Remote { augment } if augment > 0),
        "{route:?}"
    );
    assert_eq!(returns.len(), 1, "the lease's rest is returned");
    assert!(entry.lease.is_none());
}
