use super::*;

const SECOND: u64 = 1_000_000;

fn params(algorithm: Algorithm, requests: u64, period_s: u64, burst: u64) -> LimitParams {
    LimitParams {
        algorithm,
        requests_per_period: requests,
        period_us: period_s * SECOND,
        burst,
        overdraft: false,
        max_wait_us: 0,
    }
}

fn tb(requests: u64, period_s: u64, burst: u64) -> LimitParams {
    params(Algorithm::TokenBucket, requests, period_s, burst)
}

/// A limit the reference can express (default burst, no multiplier) states exactly its
/// configuration, its remaining and its reset, under every algorithm and unit.
#[test]
fn plain_limits_state_their_configuration() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        for unit in Unit::ALL {
            let p = params(algorithm, 10, unit.seconds(), 10);
            let stated = Stated::of(&p, unit);
            assert_eq!(
                stated,
                Stated { requests: 10, unit },
                "{algorithm:?} {unit}"
            );
            assert_eq!(stated.remaining(7), 7);
            assert_eq!(stated.reset_us(&p, 7, 12_345_678), 12_345_678);
        }
    }
}

/// 10/minute with burst 50 states 10 per minute: remaining stays at 10 while the spare
/// burst lasts, and the reset is the time until 10 tokens are back (6 s per token).
#[test]
fn burst_above_the_rate_states_the_rate() {
    let p = tb(10, 60, 50);
    let stated = Stated::of(&p, Unit::Minute);
    assert_eq!(
        stated,
        Stated {
            requests: 10,
            unit: Unit::Minute
        }
    );
    // 49 tokens left: full in 6 s, and already 10 or more.
    assert_eq!(stated.remaining(49), 10);
    assert_eq!(stated.reset_us(&p, 49, 6 * SECOND), 0);
    // 4 tokens left: full in 276 s, 10 tokens in 36 s.
    assert_eq!(stated.remaining(4), 4);
    assert_eq!(stated.reset_us(&p, 4, 276 * SECOND), 36 * SECOND);
    // Empty: one whole minute until the stated quota is back, never more.
    assert_eq!(stated.reset_us(&p, 0, 300 * SECOND), 60 * SECOND);
    // A fraction of a token short of 10 (floor 9) is never reported as ready.
    assert_eq!(stated.reset_us(&p, 9, 240 * SECOND), 1);
}

/// A burst below the rate states the rate: remaining never above the burst, and the reset
/// is the time until the bucket is full.
#[test]
fn burst_below_the_rate_states_the_rate() {
    let p = tb(10, 1, 3);
    let stated = Stated::of(&p, Unit::Second);
    assert_eq!(
        stated,
        Stated {
            requests: 10,
            unit: Unit::Second
        }
    );
    assert_eq!(stated.remaining(3), 3);
    assert_eq!(stated.reset_us(&p, 0, 300_000), 300_000);
    assert_eq!(stated.reset_us(&p, 3, 0), 0);
}

/// A multiplied period is stated per the shortest unit at least as long: 3 per 5
/// minutes says 3 per hour, whose window holds every reset (at most 300 s).
#[test]
fn multiplied_periods_take_the_next_longer_unit() {
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let p = params(algorithm, 3, 300, 3);
        let stated = Stated::of(&p, Unit::Minute);
        assert_eq!(
            stated,
            Stated {
                requests: 3,
                unit: Unit::Hour
            },
            "{algorithm:?}"
        );
        assert_eq!(stated.reset_us(&p, 0, 300 * SECOND), 300 * SECOND);
    }
    for (period_s, unit) in [
        (2, Unit::Minute),
        (120, Unit::Hour),
        (2 * 3_600, Unit::Day),
        (2 * 86_400, Unit::Week),
        (14 * 86_400, Unit::Month),
        (60 * 86_400, Unit::Year),
        (2 * 365 * 86_400, Unit::Year),
    ] {
        let stated = Stated::of(
            &params(Algorithm::FixedWindow, 3, period_s, 3),
            Unit::Second,
        );
        assert_eq!(stated.unit, unit, "{period_s} s");
    }
}

/// A token bucket with a multiplier and a burst states its count per the longer unit,
/// and its reset is the time until that count is back: 100 per 5 minutes with burst 1000
/// says 100 per hour, and an empty bucket has 100 again in 300 s (3 s a token), not the
/// 3000 s until it is full. A period past a year is stated per year.
#[test]
fn multiplied_token_bucket_with_a_burst() {
    let p = tb(100, 300, 1000);
    let stated = Stated::of(&p, Unit::Minute);
    assert_eq!(
        stated,
        Stated {
            requests: 100,
            unit: Unit::Hour
        }
    );
    assert_eq!(stated.remaining(1000), 100);
    assert_eq!(stated.reset_us(&p, 0, 3_000 * SECOND), 300 * SECOND);
    let p = tb(1, 2 * 365 * 86_400, 2);
    let stated = Stated::of(&p, Unit::Year);
    assert_eq!(
        stated,
        Stated {
            requests: 1,
            unit: Unit::Year
        }
    );
    // Empty: one token of two years is back in two years, not four.
    let two_years = 2 * 365 * 86_400 * SECOND;
    assert_eq!(stated.reset_us(&p, 0, 2 * two_years), two_years);
}

/// No limit's numbers overflow the fields: the largest counts and bursts stay u32.
#[test]
fn extremes_fit() {
    let max = u64::from(u32::MAX);
    let p = tb(max, 1, max);
    let stated = Stated::of(&p, Unit::Second);
    assert_eq!(stated.requests, u32::MAX);
    assert_eq!(stated.remaining(u64::MAX), u32::MAX);
    let zero = tb(0, 60, 1);
    let stated = Stated::of(&zero, Unit::Minute);
    assert_eq!(stated.requests, 0);
    assert_eq!(stated.remaining(0), 0);
    assert_eq!(stated.reset_us(&zero, 0, 0), 0);
}
