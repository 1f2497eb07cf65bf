use super::*;
use crate::limiter::{Algorithm, State, View};

const MINUTE: i64 = 60_000_000;
/// A minute boundary.
const START: i64 = 1_700_000_040_000_000;

fn params(limit: u64) -> LimitParams {
    LimitParams::of(Algorithm::FixedWindow, limit, 60, 0)
}

/// Inside the named window, a counter is exactly a fixed window holding that count.
#[test]
fn inside_the_window_it_is_a_fixed_window() {
    let e = evaluate_counter(&params(5), START, Some(3), START + 10_000_000, 2);
    assert!(e.admitted);
    assert_eq!(
        e.next,
        Some((
            State::FixedWindow {
                window: START / MINUTE,
                count: 5
            },
            50_000_000
        ))
    );
    let e = evaluate_counter(&params(5), START, Some(5), START + 10_000_000, 1);
    assert!(!e.admitted && e.next.is_none());
    assert_eq!(e.retry_after_us, Some(50_000_000));
}

/// A store clock outside the named window is clamped into it: the count still applies,
/// and the reset stays within (0, window].
#[test]
fn store_clock_is_clamped_into_the_named_window() {
    let behind = evaluate_counter(&params(5), START, Some(5), START - 3_000_000, 1);
    assert!(!behind.admitted);
    assert_eq!(
        behind.current,
        View {
            remaining: 0,
            reset_us: MINUTE as u64
        }
    );
    let ahead = evaluate_counter(&params(5), START, Some(5), START + 2 * MINUTE, 1);
    assert!(!ahead.admitted);
    assert_eq!(ahead.current.reset_us, 1);
}

/// A refund to zero deletes the counter (TTL 0); a window start beyond the bounds is
/// clamped like the rest of the limiter's inputs.
#[test]
fn refund_to_zero_and_bounds() {
    let e = evaluate_counter(&params(5), START, Some(2), START, -5);
    assert_eq!(e.next.map(|(_, ttl)| ttl), Some(0));
    let e = evaluate_counter(&params(5), i64::MAX, None, 0, 1);
    assert!(e.admitted);
    let e = evaluate_counter(&params(5), -1, None, START, 1);
    assert!(e.admitted);
}
