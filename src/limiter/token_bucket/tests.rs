use super::*;
use crate::limiter::Algorithm;
use proptest::prelude::*;

const NOW: i64 = 1_700_000_000_000_000;

fn params(rate: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams::of(Algorithm::TokenBucket, rate, period_s, burst)
}

fn tat_of(e: &Evaluation) -> Option<Tat> {
    match e.next {
        Some((State::TokenBucket { tat }, _)) => Some(tat),
        _ => None,
    }
}

/// A stored whole-µs `tat`.
fn at(us: i64) -> Option<Tat> {
    Some(Tat::from_us(us))
}

fn tb(us: i64) -> State {
    State::TokenBucket {
        tat: Tat::from_us(us),
    }
}

/// A fresh bucket admits exactly `burst` unit requests at one instant, then one more after
/// exactly T µs (and says so in retry_after).
#[test]
fn fresh_bucket_admits_burst_then_one_per_interval() {
    let p = params(10, 1, 10); // T = 100 ms
    let mut tat = None;
    for i in 0..10 {
        let e = evaluate(&p, tat, NOW, 1);
        assert!(e.admitted, "request {i}");
        assert_eq!(e.committed.remaining, 9 - i);
        tat = tat_of(&e);
    }
    let e = evaluate(&p, tat, NOW, 1);
    assert!(!e.admitted);
    assert_eq!(e.next, None);
    assert_eq!(e.retry_after_us, Some(100_000));
    assert!(!evaluate(&p, tat, NOW + 99_999, 1).admitted);
    assert!(evaluate(&p, tat, NOW + 100_000, 1).admitted);
}

/// T is rounded up to a whole tick, and the ticks get finer until T is exact or precise:
/// 3 per second is 3 333 334 ticks of 0.1 µs per token (a whole µs would be 333 334).
#[test]
fn ticks_get_finer_until_t_is_precise() {
    assert_eq!(emission_interval_us(1_000_000, 3), 333_334);
    let gcra = |rate, period_s, burst| Gcra::new(&params(rate, period_s, burst)).unwrap();
    let g = gcra(3, 1, 3);
    assert_eq!((g.digits, g.interval), (1, 3_333_334));
    let e = evaluate(&params(3, 1, 3), None, NOW, 1);
    let tat = Tat {
        us: NOW + 333_333,
        frac: 4,
        digits: 1,
    };
    assert_eq!(e.next, Some((State::TokenBucket { tat }, 333_334)));
    assert_eq!(e.committed.remaining, 2); // floor((10 000 002 − 3 333 334) / 3 333 334)
    // Exact in whole µs: unchanged, one integer per bucket as ever.
    assert_eq!(
        (gcra(10, 1, 10).digits, gcra(10, 1, 10).interval),
        (0, 100_000)
    );
    assert_eq!(gcra(1, 31_536_000, 1).interval, 31_536_000_000_000);
    // Beyond one token per µs: 4 000 000 per second is 25 ticks of 10 ns, 10^9 per
    // second 1 tick of 1 ns, both exact; u32::MAX per second 232 831 ticks of 1 fs.
    assert_eq!(
        (gcra(4_000_000, 1, 1).digits, gcra(4_000_000, 1, 1).interval),
        (2, 25)
    );
    let g = gcra(1_000_000_000, 1, 1_000_000_000);
    assert_eq!((g.digits, g.interval), (3, 1));
    let g = gcra(u32::MAX.into(), 1, u32::MAX.into());
    assert_eq!(
        (g.digits, g.interval, g.burst),
        (9, 232_831, u32::MAX.into())
    );
}

/// Rate and period are exact, or T is rounded up by less than 4 × 10^-5 of itself, for
/// every rate, the longest periods and the largest bursts validation accepts.
#[test]
fn every_rate_is_precise() {
    let rates = [
        1,
        3,
        7,
        999_999,
        1_000_001,
        4_000_000,
        123_456_789,
        1_000_000_000,
        u64::from(u32::MAX) - 1,
        u64::from(u32::MAX),
    ];
    let periods = [
        1, 60, 3_600, 86_400, 604_800, 2_592_000, 31_536_000, 63_072_000,
    ];
    for rate in rates {
        for period_s in periods {
            for burst in [1, rate, u64::from(u32::MAX)] {
                let p = params(rate, period_s, burst);
                if p.validate().is_err() {
                    continue;
                }
                let g = Gcra::new(&p).unwrap();
                let scaled = u128::from(period_s) * 1_000_000 * 10u128.pow(g.digits.into());
                let t = u128::from(g.interval.unsigned_abs());
                let over = t * u128::from(rate) - scaled;
                assert!(
                    over < u128::from(rate) && over * 25_000 < scaled,
                    "{rate} per {period_s} s, burst {burst}: {g:?}"
                );
                assert_eq!(g.burst.unsigned_abs(), burst, "burst is never clamped");
                assert!(g.tolerance.unsigned_abs() <= MAX_DEBT_TICKS);
            }
        }
    }
}

/// u32::MAX per second with a burst of u32::MAX: the whole burst at once, then a second
/// refills the rate to within 4 × 10^-5, and a µs refills about 4 295 tokens.
#[test]
fn fastest_limit_refills_at_its_rate() {
    let max = u64::from(u32::MAX);
    let p = params(max, 1, max);
    let e = evaluate(&p, None, NOW, max.cast_signed());
    assert!(e.admitted);
    assert_eq!(e.committed.remaining, 0);
    let tat = tat_of(&e);
    assert!(!evaluate(&p, tat, NOW, 1).admitted);
    let e = evaluate(&p, tat, NOW + 1, 0);
    assert_eq!(e.current.remaining, 4_294); // floor(10^9 / 232 831)
    let e = evaluate(&p, tat, NOW + 1_000_000, 0);
    assert!(e.current.remaining >= max - max / 25_000);
    assert!(e.current.remaining < max);
}

/// A stored tat with other digits than the limit's (the limit changed) is read exactly
/// when it has fewer, and rounded up to a whole tick (never less debt) when it has more.
#[test]
fn tat_of_other_digits_converts() {
    let p = params(10, 1, 10); // whole µs: digits 0
    let fine = Tat {
        us: NOW + 100_000,
        frac: 1,
        digits: 9,
    };
    let e = evaluate(&p, Some(fine), NOW, 0);
    assert_eq!(e.current.reset_us, 100_001);
    assert_eq!(e.current.remaining, 8); // debt 100 001 µs > one token of 100 000
    let p = params(3, 1, 3); // digits 1
    let e = evaluate(&p, at(NOW + 333_333), NOW, 0);
    assert_eq!(e.current.remaining, 2); // 3 333 330 ticks of debt
    let e = evaluate(&p, Some(fine), NOW, -1);
    // 1 000 001 ticks (rounded up from 1 000 000.00000001) − 3 333 334: floored at 0.
    let full = Tat {
        us: NOW,
        frac: 0,
        digits: 1,
    };
    assert_eq!(e.next, Some((State::TokenBucket { tat: full }, 0)));
}

/// The reported reset uses the configured rate: a full bucket of the default burst is
/// exactly one period, at every rate; an exact `T` is unchanged.
#[test]
fn reset_at_configured_rate_is_one_period_when_full() {
    let max = u64::from(u32::MAX);
    for (rate, period_s) in [
        (3, 1),
        (7, 60),
        (999_999, 1),
        (max, 1),
        (max - 1, 7),
        (10, 1),
    ] {
        let p = params(rate, period_s, rate);
        let full = evaluate(&p, None, NOW, rate.cast_signed());
        assert!(full.admitted);
        let reported = reset_at_configured_rate(&p, full.committed.reset_us);
        assert_eq!(reported, period_s * 1_000_000, "{rate} per {period_s} s");
    }
    assert_eq!(reset_at_configured_rate(&params(4, 1, 4), 750_000), 750_000);
    assert_eq!(reset_at_configured_rate(&params(0, 1, 4), 5), 5);
    // Not full is never reported as full.
    assert_eq!(reset_at_configured_rate(&params(3, 1, 3), 1), 1);
    assert_eq!(reset_at_configured_rate(&params(3, 1, 3), 0), 0);
}

/// Views report whole tokens left and the debt as time until full; TTL equals that debt.
#[test]
fn views_and_ttl() {
    let p = params(10, 1, 10);
    let e = evaluate(&p, at(NOW + 250_000), NOW, 3);
    assert_eq!(
        e.current,
        View {
            remaining: 7,
            reset_us: 250_000
        }
    );
    assert_eq!(
        e.committed,
        View {
            remaining: 4,
            reset_us: 550_000
        }
    );
    assert_eq!(e.next, Some((tb(NOW + 550_000), 550_000)));
    let fresh = evaluate(&p, None, NOW, 0);
    assert_eq!(
        fresh.current,
        View {
            remaining: 10,
            reset_us: 0
        }
    );
}

/// A cost above burst is denied forever (retry None) and changes nothing.
#[test]
fn cost_above_burst_never_passes() {
    let e = evaluate(&params(10, 1, 5), None, NOW, 6);
    assert!(!e.admitted);
    assert_eq!((e.next, e.retry_after_us), (None, None));
    assert_eq!(e.committed, e.current);
}

/// A denied cost waits exactly new_tat − tau − now.
#[test]
fn denied_retry_after_is_exact() {
    let p = params(10, 1, 10); // tau = 1 s
    let e = evaluate(&p, at(NOW + 900_000), NOW, 3);
    assert!(!e.admitted);
    assert_eq!(e.retry_after_us, Some(200_000)); // 900k + 300k − 1 000k
    assert!(!evaluate(&p, at(NOW + 900_000), NOW + 199_999, 3).admitted);
    assert!(evaluate(&p, at(NOW + 900_000), NOW + 200_000, 3).admitted);
}

/// Check-only passes unless the bucket is overdrawn (debt > tau, e.g. after burst was
/// lowered), and never returns a state.
#[test]
fn check_only() {
    let p = params(10, 1, 10);
    let e = evaluate(&p, at(NOW + 1_000_000), NOW, 0);
    assert!(e.admitted && e.next.is_none());
    assert_eq!(e.current.remaining, 0);
    let e = evaluate(&p, at(NOW + 1_300_000), NOW, 0);
    assert!(!e.admitted && e.next.is_none());
    assert_eq!(e.retry_after_us, Some(300_000));
    assert_eq!(
        e.current,
        View {
            remaining: 0,
            reset_us: 1_300_000
        }
    );
}

/// A refund moves tat back by at most burst × T and never before now (TTL 0 = full).
#[test]
fn refund() {
    let p = params(10, 1, 10);
    let e = evaluate(&p, at(NOW + 500_000), NOW, -2);
    assert!(e.admitted);
    assert_eq!(e.next, Some((tb(NOW + 300_000), 300_000)));
    assert_eq!(e.committed.remaining, 7);
    let e = evaluate(&p, at(NOW + 500_000), NOW, -9);
    assert_eq!(e.next, Some((tb(NOW), 0)));
    // Refund clamp min(n, burst): an overdrawn bucket gets back at most a full bucket.
    let e = evaluate(&p, at(NOW + 3_000_000), NOW, i64::MIN);
    assert_eq!(tat_of(&e), at(NOW + 2_000_000));
}

/// A tat in the past is a full bucket; a clock that steps back leaves the debt as is.
#[test]
fn idle_time_is_forgotten_and_clock_steps_back() {
    let p = params(10, 1, 10);
    let e = evaluate(&p, at(NOW - 5_000_000), NOW, 1);
    assert_eq!(tat_of(&e), at(NOW + 100_000));
    let e = evaluate(&p, at(NOW + 100_000), NOW - 50_000, 0);
    assert_eq!(e.current.reset_us, 150_000);
}

/// A tat beyond now + 2^50 (corrupt state) is treated as exactly 2^50 ahead.
#[test]
fn debt_is_capped() {
    let e = evaluate(&params(10, 1, 10), at(i64::MAX), NOW, 0);
    assert_eq!(e.current.reset_us, MAX_DEBT_TICKS);
    // At 1 ns ticks the cap is 2^50 ns.
    let e = evaluate(&params(1_000_000_000, 1, 10), at(i64::MAX), NOW, 0);
    assert_eq!(e.current.reset_us, MAX_DEBT_TICKS.div_ceil(1_000));
}

/// requests_per_period 0: debits never pass, checks and refunds pass, nothing is stored.
#[test]
fn zero_rate() {
    let p = params(0, 1, 10);
    let e = evaluate(&p, None, NOW, 1);
    assert!(!e.admitted);
    assert_eq!(e.retry_after_us, None);
    assert_eq!(
        e.current,
        View {
            remaining: 0,
            reset_us: 0
        }
    );
    assert!(evaluate(&p, None, NOW, 0).admitted);
    let refund = evaluate(&p, None, NOW, -1);
    assert!(refund.admitted && refund.next.is_none());
}

fn overdraft(rate: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams {
        overdraft: true,
        max_wait_us: 0,
        ..params(rate, period_s, burst)
    }
}

/// Overdraft: a debit that does not fit is not admitted but stored, into debt beyond tau;
/// checks deny until the debt drains back to tau, then pass.
#[test]
fn overdraft_goes_into_debt() {
    let p = overdraft(10, 1, 10); // T = 100 ms, tau = 1 s
    let e = evaluate(&p, at(NOW + 600_000), NOW, 7);
    assert!(!e.admitted);
    assert_eq!(e.next, Some((tb(NOW + 1_300_000), 1_300_000)));
    assert_eq!(e.retry_after_us, Some(300_000));
    assert_eq!(
        e.committed,
        View {
            remaining: 0,
            reset_us: 1_300_000
        }
    );
    let tat = tat_of(&e);
    assert!(!evaluate(&p, tat, NOW + 299_999, 0).admitted);
    assert!(evaluate(&p, tat, NOW + 300_000, 0).admitted);
    // A fitting debit is an ordinary commit.
    assert!(evaluate(&p, None, NOW, 10).admitted);
}

/// Overdraft: a cost above burst is stored too, and the debt is capped at 2^50 ticks.
#[test]
fn overdraft_above_burst_and_debt_cap() {
    let p = overdraft(10, 1, 5);
    let e = evaluate(&p, None, NOW, 6);
    assert!(!e.admitted);
    assert_eq!(tat_of(&e), at(NOW + 600_000));
    assert_eq!(e.retry_after_us, Some(100_000));
    let max = MAX_DEBT_TICKS.cast_signed(); // whole µs for 10 per second
    let e = evaluate(&p, None, NOW, i64::MAX);
    assert_eq!(tat_of(&e), at(NOW + max));
    let e = evaluate(&p, at(NOW + max - 50_000), NOW, 1);
    assert_eq!(tat_of(&e), at(NOW + max));
    // Rate 0: nothing would ever repay a debt, so nothing is stored.
    assert_eq!(evaluate(&overdraft(0, 1, 5), None, NOW, 3).next, None);
}

/// One step of a random sequence: time advance (µs) and cost.
fn steps() -> impl Strategy<Value = Vec<(i64, i64)>> {
    prop::collection::vec((0i64..400_000, -3i64..14), 1..60)
}

proptest! {
    /// Over any interval [t_i, t_j] the net admitted tokens (debits minus credited refunds)
    /// never exceed burst + floor((t_j − t_i) / T), from any starting state.
    #[test]
    fn never_admits_more_than_burst_plus_rate(
        rate in 1u64..50,
        burst in 0u64..12,
        start_debt in 0i64..3_000_000,
        steps in steps(),
    ) {
        let p = params(rate, 1, burst);
        let g = Gcra::new(&p).unwrap();
        let mut tat = at(NOW + start_debt);
        let mut now = NOW;
        let mut log: Vec<(i64, i64)> = Vec::new(); // (time, net tokens)
        for (dt, cost) in steps {
            now += dt;
            let e = evaluate(&p, tat, now, cost);
            if let Some((State::TokenBucket { tat: next }, _)) = e.next {
                tat = Some(next);
                let credited = if cost < 0 { -(-cost).min(i64::try_from(burst).unwrap_or(0)) } else { cost };
                log.push((now, credited));
            }
        }
        for i in 0..log.len() {
            let mut net = 0;
            for j in i..log.len() {
                net += log[j].1;
                let elapsed = (log[j].0 - log[i].0) * g.scale;
                let bound = i64::try_from(burst).unwrap_or(0) + elapsed / g.interval;
                prop_assert!(net <= bound, "net {net} > bound {bound} over [{i}, {j}]");
            }
        }
    }

    /// Overdraft: every debit is stored (debt grows by exactly cost × T, below the cap),
    /// and the debt is repaid at the configured rate: checks pass again exactly when the
    /// debt has drained back to tau, i.e. after debt − tau (rounded up to the µs).
    #[test]
    fn overdraft_debits_always_apply_and_debt_repays_at_rate(
        rate in 1u64..1000,
        period_s in 1u64..100,
        burst in 1u64..50,
        debt in 0i64..200_000_000,
        cost in 1i64..500,
    ) {
        let p = overdraft(rate, period_s, burst);
        let g = Gcra::new(&p).unwrap();
        let e = evaluate(&p, at(NOW + debt), NOW, cost);
        let new_debt = debt * g.scale + cost * g.interval;
        let new_tat = g.tat(NOW, new_debt);
        prop_assert_eq!(tat_of(&e), Some(new_tat));
        prop_assert_eq!(e.admitted, new_debt <= g.tolerance);
        let over = i64::try_from(g.micros(new_debt - g.tolerance)).unwrap_or(i64::MAX);
        if over > 0 {
            prop_assert_eq!(e.retry_after_us, Some(over.unsigned_abs()));
            prop_assert!(!evaluate(&p, Some(new_tat), NOW + over - 1, 0).admitted);
        }
        prop_assert!(evaluate(&p, Some(new_tat), NOW + over, 0).admitted);
        // Fully repaid (a full bucket) once the whole debt has drained.
        let paid = NOW + i64::try_from(g.micros(new_debt)).unwrap_or(i64::MAX);
        let full = evaluate(&p, Some(new_tat), paid, 0);
        prop_assert_eq!(full.current.remaining, burst);
    }

    /// retry_after is exact: the same cost passes at now + retry and not one µs earlier,
    /// at every rate (the ticks of fast limits are finer than a µs), for any debt below
    /// the cap of 2^50 ticks (a debt beyond it can only come from another limit's state).
    #[test]
    fn retry_after_is_exact(
        rate in prop_oneof![1u64..1000, 1_000_000u64..=u64::from(u32::MAX)],
        period_s in 1u64..100,
        burst in 1u64..50,
        debt in 0i64..200_000_000,
        cost in 0i64..50,
    ) {
        let p = params(rate, period_s, burst);
        let g = Gcra::new(&p).unwrap();
        let debt = debt.min(MAX_DEBT_TICKS.cast_signed() / g.scale);
        let e = evaluate(&p, at(NOW + debt), NOW, cost);
        if let (false, Some(r)) = (e.admitted, e.retry_after_us) {
            let r = i64::try_from(r).unwrap_or(i64::MAX);
            prop_assert!(r > 0);
            prop_assert!(evaluate(&p, at(NOW + debt), NOW + r, cost).admitted);
            prop_assert!(!evaluate(&p, at(NOW + debt), NOW + r - 1, cost).admitted);
        }
    }
}

/// With `max_wait`, debits that do not fit are admitted while their tokens arrive within
/// it — each reserved at once, so the next one waits one interval longer — and refused
/// beyond it, changing nothing; the retry-after is when the wait would fit again.
#[test]
fn max_wait_shapes_debits_in_order_and_refuses_beyond_it() {
    let p = LimitParams {
        max_wait_us: 250_000,
        ..params(10, 1, 2) // T = 100 ms, tau = 200 ms
    };
    let mut tat = None;
    let mut delays = Vec::new();
    for _ in 0..4 {
        let e = evaluate(&p, tat, NOW, 1);
        assert!(e.admitted);
        delays.push(e.delay_us);
        tat = tat_of(&e);
    }
    assert_eq!(delays, [0, 0, 100_000, 200_000]);
    let e = evaluate(&p, tat, NOW, 1);
    assert_eq!((e.admitted, e.next, e.delay_us), (false, None, 0));
    // debt 400 ms, debit to 500 ms: 300 ms beyond tau, 50 ms more than the wait.
    assert_eq!(e.retry_after_us, Some(50_000));
    let later = evaluate(&p, tat, NOW + 50_000, 1);
    assert_eq!((later.admitted, later.delay_us), (true, 250_000));
    assert_eq!(later.committed.remaining, 0);
    assert_eq!(later.committed.reset_us, 450_000);
    // A check is unchanged by max_wait: the bucket is over its capacity, so it denies.
    assert!(!evaluate(&p, tat, NOW, 0).admitted);
    // More than the capacity never passes, wait or not.
    assert_eq!(evaluate(&p, None, NOW, 3).retry_after_us, None);
}

/// A refund gives a shaped debit's tokens back: the bucket is as before the debit.
#[test]
fn a_refund_returns_a_shaped_reservation() {
    let p = LimitParams {
        max_wait_us: 1_000_000,
        ..params(10, 1, 1)
    };
    let first = tat_of(&evaluate(&p, None, NOW, 1));
    let shaped = evaluate(&p, first, NOW, 1);
    assert_eq!(shaped.delay_us, 100_000);
    let refunded = evaluate(&p, tat_of(&shaped), NOW, -1);
    assert_eq!(tat_of(&refunded), first);
}

/// max_wait is refused where it has no meaning, and bounded.
#[test]
fn max_wait_is_validated() {
    let tb = LimitParams {
        max_wait_us: 50_000,
        ..params(10, 1, 10)
    };
    assert_eq!(tb.validate(), Ok(()));
    let window = LimitParams {
        algorithm: Algorithm::FixedWindow,
        ..tb
    };
    assert!(
        window
            .validate()
            .unwrap_err()
            .contains("token_bucket limits only")
    );
    let overdraft = LimitParams {
        overdraft: true,
        ..tb
    };
    assert!(
        overdraft
            .validate()
            .unwrap_err()
            .contains("exclude each other")
    );
    let long = LimitParams {
        max_wait_us: crate::limiter::MAX_WAIT_US + 1,
        ..tb
    };
    assert!(long.validate().unwrap_err().contains("exceeds the longest"));
}

/// Finer ticks leave room for the wait: a fast limit with a long wait keeps every value
/// below 2^50 ticks, and still shapes.
#[test]
fn fine_ticks_leave_room_for_the_wait() {
    let p = LimitParams {
        max_wait_us: crate::limiter::MAX_WAIT_US,
        ..params(3_000_000, 1, 3_000_000)
    };
    let g = Gcra::new(&p).unwrap();
    assert!(g.tolerance + g.wait <= MAX_DEBT_TICKS.cast_signed());
    assert!(g.wait > 0);
    let full = State::TokenBucket {
        tat: g.tat(NOW, g.tolerance),
    };
    let State::TokenBucket { tat } = full else {
        unreachable!()
    };
    let e = evaluate(&p, Some(tat), NOW, 1);
    assert!(e.admitted && e.delay_us > 0, "{e:?}");
}
