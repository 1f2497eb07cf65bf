use super::*;
use crate::limiter::Algorithm;
use proptest::prelude::*;

/// 1 700 000 000 s: a minute boundary (divisible by 60).
const NOW: i64 = 1_700_000_040_000_000;
const MINUTE: i64 = 60_000_000;
const INDEX: i64 = NOW / MINUTE;

fn params(limit: u64) -> LimitParams {
    LimitParams::of(Algorithm::FixedWindow, limit, 60, 0)
}

/// A refund into the current window, as a client's `is_negative_hits` gives it.
fn evaluate(p: &LimitParams, s: Option<(i64, u64)>, now: i64, cost: Cost) -> Evaluation {
    super::evaluate(p, s, now, cost, None)
}

fn stored(e: &Evaluation) -> Option<(i64, u64)> {
    match e.next {
        Some((State::FixedWindow { window, count }, _)) => Some((window, count)),
        _ => None,
    }
}

/// Windows are aligned to the epoch: NOW + 10 s is 10 s into window floor(now / 60 s).
#[test]
fn window_is_aligned_and_ttl_is_time_to_end() {
    let e = evaluate(&params(5), None, NOW + 10_000_000, 2);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: INDEX,
                count: 2
            },
            50_000_000
        ))
    );
    assert_eq!(
        e.current,
        View {
            remaining: 5,
            reset_us: 50_000_000
        }
    );
    assert_eq!(
        e.committed,
        View {
            remaining: 3,
            reset_us: 50_000_000
        }
    );
}

/// Admits up to the limit, then denies all-or-nothing with retry = time to window end.
#[test]
fn admits_up_to_limit_then_denies_until_next_window() {
    let p = params(5);
    let at = NOW + 1_000_000;
    let e = evaluate(&p, Some((INDEX, 3)), at, 2);
    assert_eq!(stored(&e), Some((INDEX, 5)));
    let e = evaluate(&p, Some((INDEX, 3)), at, 3);
    assert!(!e.admitted && e.next.is_none());
    assert_eq!(e.retry_after_us, Some(59_000_000));
    assert_eq!(
        e.committed,
        View {
            remaining: 2,
            reset_us: 59_000_000
        }
    );
    assert!(!evaluate(&p, Some((INDEX, 3)), NOW + MINUTE - 1, 3).admitted);
    assert!(evaluate(&p, Some((INDEX, 3)), NOW + MINUTE, 3).admitted);
}

/// Overdraft: a debit that does not fit is counted anyway (above the limit, capped at
/// MAX_COUNT), checks deny for the rest of the window and pass in the next one.
#[test]
fn overdraft_counts_past_the_limit() {
    let p = LimitParams {
        overdraft: true,
        max_wait_us: 0,
        ..params(5)
    };
    let at = NOW + 1_000_000;
    let e = evaluate(&p, Some((INDEX, 3)), at, 4);
    assert!(!e.admitted);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: INDEX,
                count: 7
            },
            59_000_000
        ))
    );
    assert_eq!(e.retry_after_us, Some(59_000_000));
    assert_eq!(e.committed.remaining, 0);
    assert!(!evaluate(&p, Some((INDEX, 7)), at, 0).admitted);
    assert!(evaluate(&p, Some((INDEX, 7)), NOW + MINUTE, 0).admitted);
    let e = evaluate(&p, Some((INDEX, 3)), at, i64::MAX);
    assert_eq!(stored(&e), Some((INDEX, MAX_COUNT)));
    assert!(evaluate(&p, Some((INDEX, 3)), at, 2).admitted);
}

/// A cost above the limit never passes; limit 0 admits no debit.
#[test]
fn cost_above_limit_never_passes() {
    let e = evaluate(&params(5), None, NOW, 6);
    assert_eq!((e.admitted, e.retry_after_us), (false, None));
    let e = evaluate(&params(0), None, NOW, 1);
    assert_eq!((e.admitted, e.retry_after_us), (false, None));
    assert_eq!(e.current.remaining, 0);
}

/// A count from an older window counts as 0.
#[test]
fn older_window_counts_zero() {
    let e = evaluate(&params(5), Some((INDEX - 1, 5)), NOW, 0);
    assert_eq!(e.current.remaining, 5);
    let e = evaluate(&params(5), Some((INDEX - 7, 5)), NOW, 1);
    assert_eq!(stored(&e), Some((INDEX, 1)));
}

/// Check-only is over only when the count is strictly above the limit (reference).
#[test]
fn check_only_over_when_strictly_above() {
    let e = evaluate(&params(5), Some((INDEX, 5)), NOW, 0);
    assert!(e.admitted && e.next.is_none());
    assert_eq!(e.current.remaining, 0);
    let e = evaluate(&params(5), Some((INDEX, 6)), NOW, 0);
    assert!(!e.admitted && e.next.is_none());
    assert_eq!(e.retry_after_us, Some(60_000_000));
}

/// A refund lowers the count but not below 0; a zero count stores with TTL 0.
#[test]
fn refund() {
    let e = evaluate(&params(5), Some((INDEX, 4)), NOW, -3);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: INDEX,
                count: 1
            },
            MINUTE as u64
        ))
    );
    assert_eq!(e.committed.remaining, 4);
    let e = evaluate(&params(5), Some((INDEX, 4)), NOW, -9);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: INDEX,
                count: 0
            },
            0
        ))
    );
}

/// A clock that steps back across a boundary keeps counting in the stored (later) window.
#[test]
fn clock_step_back_stays_in_stored_window() {
    let e = evaluate(&params(5), Some((INDEX, 5)), NOW - 1_000, 1);
    assert!(!e.admitted);
    assert_eq!(e.retry_after_us, Some(MINUTE as u64 + 1_000));
}

/// A stored window with count 0 is absent, even a later one (so a refund to 0 may be
/// deleted: TTL 0 really means "equivalent to absent").
#[test]
fn empty_window_is_absent() {
    let e = evaluate(&params(5), Some((INDEX + 1, 0)), NOW, -1);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: INDEX,
                count: 0
            },
            0
        ))
    );
    assert_eq!(e, evaluate(&params(5), None, NOW, -1));
}

/// A refund naming its debit's window gives back into that window while it is current,
/// and nothing once it has ended: the next window never counted that debit.
#[test]
fn refund_goes_back_to_its_own_window_only() {
    let e = super::evaluate(&params(5), Some((INDEX, 4)), NOW, -3, Some(INDEX));
    assert_eq!(stored(&e), Some((INDEX, 1)));
    let e = super::evaluate(&params(5), Some((INDEX, 4)), NOW + MINUTE, -3, Some(INDEX));
    assert!(e.admitted && e.next.is_none());
    assert_eq!(e.current.remaining, 5);
    let e = super::evaluate(
        &params(5),
        Some((INDEX + 1, 5)),
        NOW + MINUTE,
        -3,
        Some(INDEX),
    );
    assert!(
        e.admitted && e.next.is_none(),
        "the later window keeps its count"
    );
    assert_eq!(e.committed.remaining, 0);
}

proptest! {
    /// However costs and times are drawn, no window ever admits more than the limit.
    #[test]
    fn never_more_than_limit_per_window(
        limit in 0u64..20,
        steps in prop::collection::vec((0i64..20_000_000, -3i64..8), 1..80),
    ) {
        let p = params(limit);
        let mut state = None;
        let mut now = NOW;
        let mut net: std::collections::HashMap<i64, i64> = Default::default();
        for (dt, cost) in steps {
            now += dt;
            let e = evaluate(&p, state, now, cost);
            if let Some(next) = stored(&e) {
                let was = state.filter(|s| s.0 == next.0).map_or(0, |s| s.1);
                *net.entry(next.0).or_default() += i64::try_from(next.1).unwrap_or(0)
                    - i64::try_from(was).unwrap_or(0);
                if cost > 0 {
                    prop_assert_eq!(next.1, was + cost.unsigned_abs());
                }
                state = Some(next);
            }
        }
        for (window, admitted) in net {
            prop_assert!(admitted <= i64::try_from(limit).unwrap_or(0), "window {}", window);
        }
    }

    /// retry_after is exact: the same cost passes at now + retry and not one µs earlier.
    #[test]
    fn retry_after_is_exact(
        limit in 0u64..20,
        count in 0u64..30,
        offset in 0i64..MINUTE,
        cost in 0i64..25,
    ) {
        let p = params(limit);
        let s = Some((INDEX, count));
        let e = evaluate(&p, s, NOW + offset, cost);
        if let (false, Some(r)) = (e.admitted, e.retry_after_us) {
            let r = i64::try_from(r).unwrap_or(i64::MAX);
            prop_assert!(evaluate(&p, s, NOW + offset + r, cost).admitted);
            prop_assert!(!evaluate(&p, s, NOW + offset + r - 1, cost).admitted);
        }
    }
}
