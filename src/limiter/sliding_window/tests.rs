use super::*;
use crate::limiter::Algorithm;
use proptest::prelude::*;

/// A minute boundary.
const NOW: i64 = 1_700_000_040_000_000;
const MINUTE: i64 = 60_000_000;
const INDEX: i64 = NOW / MINUTE;

fn params(limit: u64) -> LimitParams {
    LimitParams::of(Algorithm::SlidingWindow, limit, 60, 0)
}

/// A refund into the current window, as a client's `is_negative_hits` gives it.
fn evaluate(p: &LimitParams, s: Option<Stored>, now: i64, cost: Cost) -> Evaluation {
    super::evaluate(p, s, now, cost, None)
}

fn stored(window: i64, current: u64, previous: u64) -> Option<Stored> {
    Some(Stored {
        window,
        current,
        previous,
    })
}

/// 15 s into a 60 s window the previous count weighs 45/60: ceil(10 × 0.75) + 2 = 10.
#[test]
fn estimate_weights_previous_window() {
    assert_eq!(weight(60_000, 15_000), 49_152);
    let e = evaluate(&params(20), stored(INDEX, 2, 10), NOW + 15_000_999, 0);
    assert_eq!(e.current.remaining, 10);
    assert_eq!(weight(60_000, 0), ONE);
    assert_eq!(weight(60_000, 59_999), 1);
}

/// Overdraft: a debit that does not fit is counted anyway; the retry is exactly when a
/// check passes against the debited counters.
#[test]
fn overdraft_counts_past_the_limit() {
    let p = LimitParams {
        overdraft: true,
        max_wait_us: 0,
        ..params(20)
    };
    let at = NOW + 15_000_000;
    let e = evaluate(&p, stored(INDEX, 2, 10), at, 15);
    assert!(!e.admitted);
    assert_eq!(
        e.next,
        Some((
            State::SlidingWindow {
                window: INDEX,
                current: 17,
                previous: 10
            },
            105_000_000
        ))
    );
    let retry = i64::try_from(e.retry_after_us.unwrap_or(0)).unwrap_or(0);
    assert!(retry > 0);
    let debited = stored(INDEX, 17, 10);
    assert!(!evaluate(&p, debited, at + retry - 1, 0).admitted);
    assert!(evaluate(&p, debited, at + retry, 0).admitted);
    let e = evaluate(&p, stored(INDEX, 2, 10), at, i64::MAX);
    assert!(matches!(
        e.next,
        Some((
            State::SlidingWindow {
                current: MAX_COUNT,
                ..
            },
            _
        ))
    ));
}

/// Admits while estimate + n ≤ limit and stores with TTL = end of the next window.
#[test]
fn debit_stores_counters() {
    let e = evaluate(&params(20), stored(INDEX, 2, 10), NOW + 15_000_000, 10);
    assert_eq!(
        e.next,
        Some((
            State::SlidingWindow {
                window: INDEX,
                current: 12,
                previous: 10
            },
            105_000_000
        ))
    );
    assert_eq!(
        e.committed,
        View {
            remaining: 0,
            reset_us: 105_000_000
        }
    );
    let e = evaluate(&params(20), stored(INDEX, 2, 10), NOW + 15_000_000, 12);
    assert!(!e.admitted && e.next.is_none());
}

/// The stored window rolls into `previous` one window later and is forgotten after two.
#[test]
fn windows_roll() {
    let e = evaluate(&params(20), stored(INDEX - 1, 8, 3), NOW, 1);
    assert_eq!(
        e.next.map(|n| n.0),
        Some(State::SlidingWindow {
            window: INDEX,
            current: 1,
            previous: 8
        })
    );
    assert_eq!(
        e.current,
        View {
            remaining: 12,
            reset_us: MINUTE as u64
        }
    );
    let e = evaluate(&params(20), stored(INDEX - 2, 8, 3), NOW, 0);
    assert_eq!(
        e.current,
        View {
            remaining: 20,
            reset_us: 0
        }
    );
}

/// A cost above the limit never passes.
#[test]
fn cost_above_limit_never_passes() {
    let e = evaluate(&params(5), None, NOW, 6);
    assert_eq!((e.admitted, e.next, e.retry_after_us), (false, None, None));
}

/// Check-only is over only when the estimate is strictly above the limit.
#[test]
fn check_only() {
    assert!(evaluate(&params(10), stored(INDEX, 10, 0), NOW, 0).admitted);
    let e = evaluate(&params(10), stored(INDEX, 11, 0), NOW, 0);
    assert!(!e.admitted && e.next.is_none());
}

/// A refund lowers only `current`, not below 0; TTL follows what is left.
#[test]
fn refund_touches_only_current() {
    let e = evaluate(&params(10), stored(INDEX, 3, 7), NOW, -5);
    assert_eq!(
        e.next,
        Some((
            State::SlidingWindow {
                window: INDEX,
                current: 0,
                previous: 7
            },
            MINUTE as u64
        ))
    );
    let e = evaluate(&params(10), stored(INDEX - 1, 3, 7), NOW, -5);
    assert_eq!(e.next.map(|n| n.1), Some(MINUTE as u64));
    let e = evaluate(&params(10), None, NOW, -5);
    assert_eq!(e.next.map(|n| n.1), Some(0));
}

/// A refund naming its debit's window gives back to that window's counter: `current`
/// while it is current, `previous` once it is the previous one, nothing once forgotten.
#[test]
fn refund_goes_back_to_its_own_slot() {
    let refund = |s, now, window| super::evaluate(&params(10), s, now, -5, Some(window));
    let counts = |e: &Evaluation| match e.next {
        Some((
            State::SlidingWindow {
                current, previous, ..
            },
            _,
        )) => Some((current, previous)),
        _ => None,
    };
    assert_eq!(
        counts(&refund(stored(INDEX, 6, 7), NOW, INDEX)),
        Some((1, 7))
    );
    assert_eq!(
        counts(&refund(stored(INDEX, 6, 7), NOW, INDEX - 1)),
        Some((6, 2))
    );
    // The stored window rolled: the debit's window is the previous one now.
    let e = refund(stored(INDEX - 1, 6, 7), NOW, INDEX - 1);
    assert_eq!(counts(&e), Some((0, 1)));
    let e = refund(stored(INDEX, 6, 7), NOW, INDEX - 2);
    assert!(
        e.admitted && e.next.is_none(),
        "forgotten: nothing to give back"
    );
    assert!(
        refund(stored(INDEX - 2, 6, 7), NOW, INDEX - 2)
            .next
            .is_none()
    );
}

/// Denied at 15 s with previous 10, current 2, limit 10, cost 2: it needs
/// ceil(10 × w / 65536) ≤ 6, first true at 24 000 ms into the window.
#[test]
fn retry_after_solves_within_window() {
    let p = params(10);
    let s = stored(INDEX, 2, 10);
    let e = evaluate(&p, s, NOW + 15_000_000, 2);
    assert!(!e.admitted);
    // w ≤ floor(6 × 65536 / 10) = 39321 ⇔ 60000 − e ≤ 36000 ⇔ e ≥ 24000 ms.
    assert_eq!(e.retry_after_us, Some(9_000_000));
    assert!(evaluate(&p, s, NOW + 24_000_000, 2).admitted);
    assert!(!evaluate(&p, s, NOW + 23_999_999, 2).admitted);
}

/// When this window can never fit the cost, the retry lands in the next window.
#[test]
fn retry_after_moves_to_next_window() {
    let p = params(10);
    let s = stored(INDEX, 9, 0);
    let e = evaluate(&p, s, NOW, 5);
    // Next window: ceil(9 × w / 65536) ≤ 5 ⇔ w ≤ 36408 ⇔ e ≥ 26667 ms.
    assert_eq!(e.retry_after_us, Some(60_000_000 + 26_667_000));
}

/// When even the last ms of the next window is too heavy, the retry is two windows on.
#[test]
fn retry_after_falls_back_to_window_after_next() {
    let p = LimitParams {
        period_us: 1_000_000,
        ..params(5000)
    };
    let index = NOW / 1_000_000;
    let s = stored(index, 5000, 0);
    let e = evaluate(&p, s, NOW, 5000);
    assert_eq!(e.retry_after_us, Some(2_000_000));
    assert!(!evaluate(&p, s, NOW + 1_999_999, 5000).admitted);
}

proptest! {
    /// retry_after is exact: the same cost passes at now + retry and not one µs earlier.
    #[test]
    fn retry_after_is_exact(
        limit in prop_oneof![0u64..40, 0u64..=MAX_COUNT],
        period_s in prop::sample::select(vec![1u64, 7, 60, 3600, 100_000]),
        current in prop_oneof![0u64..50, 0u64..=MAX_COUNT],
        previous in prop_oneof![0u64..50, 0u64..=MAX_COUNT],
        back in 0i64..2,
        offset_permille in 0i64..1000,
        cost in prop_oneof![0i64..45, 0i64..=i64::from(u32::MAX)],
    ) {
        let p = LimitParams { period_us: period_s * 1_000_000, ..params(limit) };
        let period = i64::try_from(p.period_us).unwrap_or(1);
        let index = NOW / period;
        let s = stored(index - back, current, previous);
        let now = index * period + period / 1000 * offset_permille;
        let e = evaluate(&p, s, now, cost);
        if let (false, Some(r)) = (e.admitted, e.retry_after_us) {
            let r = i64::try_from(r).unwrap_or(i64::MAX);
            prop_assert!(r > 0);
            prop_assert!(evaluate(&p, s, now + r, cost).admitted);
            prop_assert!(!evaluate(&p, s, now + r - 1, cost).admitted);
        }
    }

    /// No window's own counter ever exceeds the limit through admitted debits.
    #[test]
    fn current_never_exceeds_limit(
        limit in 0u64..20,
        steps in prop::collection::vec((0i64..20_000_000, -3i64..8), 1..80),
    ) {
        let p = params(limit);
        let mut state = None;
        let mut now = NOW;
        for (dt, cost) in steps {
            now += dt;
            let e = evaluate(&p, state, now, cost);
            if let Some((State::SlidingWindow { window, current, previous }, _)) = e.next {
                prop_assert!(current <= limit);
                state = stored(window, current, previous);
            }
        }
    }
}
