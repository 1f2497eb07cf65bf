//! Properties every algorithm shares, and `LimitParams::validate`.

use super::*;
use proptest::prelude::*;

const NOW: i64 = 1_700_000_040_000_000;
const TWO_53: u64 = 1 << 53;

fn params(algorithm: Algorithm, rate: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams::of(algorithm, rate, period_s, burst)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ])
}

/// Small, valid params where interesting things happen within a few periods.
fn small_params() -> impl Strategy<Value = LimitParams> {
    (
        algorithm(),
        0u64..30,
        prop::sample::select(vec![1u64, 60, 3600]),
        0u64..30,
        any::<bool>(),
    )
        .prop_map(|(a, rate, period_s, burst, overdraft)| LimitParams {
            overdraft,
            max_wait_us: 0,
            ..params(a, rate, period_s, burst)
        })
}

/// A stored state near `now`, of `p`'s algorithm or (kind 3) of another one, or absent (4).
fn state_near(
    p: &LimitParams,
    now: i64,
    kind: u8,
    offset: i64,
    back: i64,
    a: u64,
    b: u64,
) -> Option<State> {
    let period = i64::try_from(p.period_us).unwrap_or(1);
    let window = now / period - back;
    match (kind, p.algorithm) {
        (4, _) => None,
        (3, Algorithm::TokenBucket) => Some(State::FixedWindow { window, count: a }),
        (3, _) | (_, Algorithm::TokenBucket) => Some(State::TokenBucket {
            tat: Tat {
                us: now + offset,
                frac: u32::try_from(b % 1_000_000_000).unwrap_or(0),
                digits: u8::try_from(a % 10).unwrap_or(0),
            },
        }),
        (_, Algorithm::FixedWindow) => Some(State::FixedWindow { window, count: a }),
        (_, Algorithm::SlidingWindow) => Some(State::SlidingWindow {
            window,
            current: a,
            previous: b,
        }),
    }
}

/// Every number an evaluation hands back is exactly representable as a double.
fn assert_lua_exact(e: &Evaluation) {
    let mut values = vec![
        e.current.remaining,
        e.current.reset_us,
        e.committed.remaining,
    ];
    values.extend([e.committed.reset_us, e.retry_after_us.unwrap_or(0)]);
    if let Some((state, ttl)) = e.next {
        values.push(ttl);
        match state {
            State::TokenBucket { tat } => values.push(tat.us.unsigned_abs()),
            State::FixedWindow { window, count } => values.extend([window.unsigned_abs(), count]),
            State::SlidingWindow {
                window,
                current,
                previous,
            } => values.extend([window.unsigned_abs(), current, previous]),
        }
    }
    for v in values {
        assert!(v < TWO_53, "{v} ≥ 2^53 in {e:?}");
    }
}

/// Typical configs pass validation.
#[test]
fn validate_accepts_typical_configs() {
    for a in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        assert_eq!(params(a, 100, 1, 100).validate(), Ok(()));
        assert_eq!(params(a, 0, 86_400, 0).validate(), Ok(()));
        assert_eq!(params(a, 1, 68_719_476, 1).validate(), Ok(()));
    }
    assert_eq!(
        params(Algorithm::FixedWindow, 2_000_000, 1, 0).validate(),
        Ok(())
    );
    // T = 1 µs, tau = u32::MAX µs.
    assert_eq!(
        params(Algorithm::TokenBucket, 1_000_000, 1, u32::MAX.into()).validate(),
        Ok(())
    );
}

/// Periods that are not whole seconds, or longer than 2^36 ms, are rejected.
#[test]
fn validate_rejects_bad_periods() {
    let mut p = params(Algorithm::FixedWindow, 1, 1, 1);
    p.period_us = 0;
    assert!(p.validate().is_err());
    p.period_us = 1_500_000;
    assert!(p.validate().is_err());
    p.period_us = 68_719_477 * 1_000_000;
    assert!(p.validate().is_err_and(|m| m.contains("795 days")));
}

/// Rates and bursts above u32::MAX are rejected.
#[test]
fn validate_rejects_huge_counts() {
    let too_many = u64::from(u32::MAX) + 1;
    assert!(
        params(Algorithm::FixedWindow, too_many, 60, 0)
            .validate()
            .is_err()
    );
    assert!(
        params(Algorithm::SlidingWindow, 1, 60, too_many)
            .validate()
            .is_err()
    );
}

/// Token bucket: every rate up to u32::MAX per second is valid; a tolerance above 2^50 µs is
/// rejected with a message that says what to do.
#[test]
fn validate_token_bucket_limits() {
    for rate in [2_000_000, 1_000_000_000, u64::from(u32::MAX)] {
        for burst in [1, rate, u64::from(u32::MAX)] {
            assert_eq!(
                params(Algorithm::TokenBucket, rate, 1, burst).validate(),
                Ok(())
            );
        }
    }
    // 1 per 795 days with a burst of 2^32 − 1: tau ≈ 2^78 µs.
    let err = params(Algorithm::TokenBucket, 1, 68_719_476, u32::MAX.into()).validate();
    assert!(err.is_err_and(|m| m.contains("lower burst")));
    // T = 2^20 µs exactly fits burst 2^30 (tau = 2^50), not one more.
    let mut p = params(Algorithm::TokenBucket, 1, 1, 1 << 30);
    p.period_us = 1 << 20;
    assert!(p.validate().is_err(), "not whole seconds");
    let p = params(Algorithm::TokenBucket, 15_625, 16, 1 << 30); // T = 1024 µs
    assert_eq!(p.validate(), Ok(()));
    let p = params(Algorithm::TokenBucket, 15_625, 16, (1 << 40) + 1);
    assert!(p.validate().is_err());
}

/// A stored state of another algorithm is treated as absent.
#[test]
fn other_algorithms_state_is_absent() {
    let p = params(Algorithm::FixedWindow, 5, 60, 5);
    let foreign = State::TokenBucket {
        tat: Tat::from_us(NOW + 1),
    };
    assert_eq!(
        evaluate(&p, Some(&foreign), NOW, 1),
        evaluate(&p, None, NOW, 1)
    );
    let p = params(Algorithm::TokenBucket, 5, 60, 5);
    let foreign = State::SlidingWindow {
        window: NOW / 60_000_000,
        current: 5,
        previous: 5,
    };
    assert_eq!(
        evaluate(&p, Some(&foreign), NOW, 1),
        evaluate(&p, None, NOW, 1)
    );
}

proptest! {
    /// Denied and check-only evaluations never change state (but an overdraft debit always
    /// does), and whenever nothing is stored `committed` equals `current`; retry_after is
    /// Some(0) exactly when admitted.
    #[test]
    fn denied_and_checks_leave_state_alone(
        p in small_params(),
        kind in 0u8..5, offset in -100_000_000i64..4_000_000_000, back in -1i64..3,
        a in 0u64..40, b in 0u64..40,
        cost in -5i64..35,
    ) {
        let state = state_near(&p, NOW, kind, offset, back, a, b);
        let e = evaluate(&p, state.as_ref(), NOW, cost);
        let always_debited = p.overdraft
            && cost > 0
            && !(p.algorithm == Algorithm::TokenBucket && p.requests_per_period == 0);
        if always_debited {
            prop_assert!(e.next.is_some());
        } else if !e.admitted || cost == 0 {
            prop_assert_eq!(e.next, None);
        }
        if e.next.is_none() {
            prop_assert_eq!(e.committed, e.current);
        }
        prop_assert_eq!(e.admitted, e.retry_after_us == Some(0));
        if cost < 0 {
            prop_assert!(e.admitted);
        }
    }

    /// The TTL is exact: at now + ttl the stored state behaves exactly like an absent one, and
    /// one µs earlier it does not (so the store may expire keys on it).
    #[test]
    fn ttl_is_when_state_becomes_absent(
        p in small_params(),
        kind in 0u8..5, offset in -100_000_000i64..4_000_000_000, back in -1i64..3,
        a in 0u64..40, b in 0u64..40,
        cost in -5i64..35,
        probe in -2i64..3,
    ) {
        let state = state_near(&p, NOW, kind, offset, back, a, b);
        let e = evaluate(&p, state.as_ref(), NOW, cost);
        if let Some((next, ttl)) = e.next {
            let at = NOW + i64::try_from(ttl).unwrap_or(i64::MAX);
            prop_assert_eq!(evaluate(&p, Some(&next), at, probe), evaluate(&p, None, at, probe));
            if ttl > 0 {
                prop_assert_ne!(
                    evaluate(&p, Some(&next), at - 1, 0),
                    evaluate(&p, None, at - 1, 0)
                );
            }
        }
    }

    /// For any params that pass validate() and any time in [1.6e15, 4e15], every value stays
    /// below 2^53 (intermediates are asserted inside by `exact`, outputs here).
    #[test]
    fn arithmetic_stays_below_2_pow_53(
        a in algorithm(),
        rate in prop_oneof![0u64..3, 0u64..=u64::from(u32::MAX), Just(u64::from(u32::MAX))],
        period_s in prop_oneof![1u64..3, 1u64..=MAX_PERIOD_US / 1_000_000, Just(MAX_PERIOD_US / 1_000_000)],
        burst in prop_oneof![0u64..3, 0u64..=u64::from(u32::MAX), Just(u64::from(u32::MAX))],
        overdraft in any::<bool>(),
        max_wait in prop_oneof![Just(0u64), 0u64..100_000, Just(crate::limiter::MAX_WAIT_US)],
        start in 1_600_000_000_000_000i64..4_000_000_000_000_000,
        steps in prop::collection::vec(
            (prop_oneof![0i64..1000, 0i64..100_000_000_000_000, -1_000_000i64..0],
             prop_oneof![-3i64..5, any::<i64>()]),
            1..30),
    ) {
        let mut p = LimitParams { overdraft, ..params(a, rate, period_s, burst) };
        if a == Algorithm::TokenBucket && !overdraft {
            p.max_wait_us = max_wait;
        }
        if a == Algorithm::TokenBucket && rate > 0 {
            // Bring the draw into the validated domain instead of rejecting most of them (any
            // rate is valid; only burst × T + max_wait is bounded).
            let interval = token_bucket::emission_interval_us(p.period_us, p.requests_per_period);
            p.burst = burst.min((MAX_TOLERANCE_US - p.max_wait_us) / interval);
        }
        prop_assert_eq!(p.validate(), Ok(()));
        let mut state = None;
        let mut now = start;
        for (dt, cost) in steps {
            now = (now + dt).clamp(1_600_000_000_000_000, 4_000_000_000_000_000);
            let e = evaluate(&p, state.as_ref(), now, cost);
            assert_lua_exact(&e);
            if let Some((next, _)) = e.next {
                state = Some(next);
            }
        }
    }

    /// Arbitrary (even invalid or corrupt) inputs never panic, and `exact` holds for them too.
    #[test]
    fn never_panics(
        a in algorithm(),
        rate in any::<u64>(), period_us in any::<u64>(), burst in any::<u64>(),
        x in any::<i64>(), y in any::<u64>(), z in any::<u64>(), kind in 0u8..4,
        now in any::<i64>(), cost in any::<i64>(), overdraft in any::<bool>(),
        max_wait_us in any::<u64>(),
    ) {
        let p = LimitParams { algorithm: a, requests_per_period: rate, period_us, burst, overdraft, max_wait_us };
        let state = match kind {
            0 => None,
            1 => Some(State::TokenBucket { tat: Tat { us: x, frac: y as u32, digits: (z % 12) as u8 } }),
            2 => Some(State::FixedWindow { window: x, count: y }),
            _ => Some(State::SlidingWindow { window: x, current: y, previous: z }),
        };
        assert_lua_exact(&evaluate(&p, state.as_ref(), now, cost));
    }
}

/// The stored form of a `tat` round-trips, and anything else is refused (read as absent).
#[test]
fn tat_stored_form() {
    for (text, tat) in [
        ("1700000000000000", Tat::from_us(1_700_000_000_000_000)),
        ("-5", Tat::from_us(-5)),
        (
            "1700000000000000.000000250",
            Tat {
                us: 1_700_000_000_000_000,
                frac: 250,
                digits: 9,
            },
        ),
        (
            "12.5",
            Tat {
                us: 12,
                frac: 5,
                digits: 1,
            },
        ),
    ] {
        assert_eq!(Tat::parse(text), Some(tat), "{text}");
        assert_eq!(tat.to_string(), text);
    }
    for junk in [
        "",
        "-",
        ".5",
        "5.",
        "5.0000000000",
        "1e5",
        "+5",
        "5.-1",
        "5.1.2",
        " 5",
        "x",
    ] {
        assert_eq!(Tat::parse(junk), None, "{junk:?}");
    }
    let far = Tat::parse("99999999999999999999.5").map(|t| t.us);
    assert_eq!(far, Some(i64::MAX));
    assert_eq!(
        Tat::parse("-99999999999999999999").map(|t| t.us),
        Some(i64::MIN)
    );
}
