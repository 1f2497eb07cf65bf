//! A fixed window shared with reference pods (`--reference-counters`): the reference
//! server's plain integer count under its key name, which ends with the window start the
//! pod's clock chose (the reference names windows by its own clock, not Redis's).
//!
//! The math is the fixed window's ([`super::fixed_window`]), for the window the key names: the
//! store's `now` is clamped into that window, so it only measures how much of the window is
//! left. A pod whose clock is a little ahead of Redis's (or behind) still counts in the window
//! it named, as a reference pod would; the reported reset is then at most the window's length
//! and at least 1 µs.

use super::window::floor_div;
use super::{Cost, Evaluation, LimitParams, MAX_NOW_US, exact, fixed_window};

/// Evaluate `cost` at `now_us` against the counter of the window starting at
/// `window_start_us` (µs; from the key's window start in seconds), which holds `count`
/// (`None`: absent). The evaluation's state is `State::FixedWindow` of that window; a store
/// keeps only its count, with the reference's expiry instead of the state's TTL (a TTL of 0
/// still means "delete").
pub fn evaluate_counter(
    params: &LimitParams,
    window_start_us: i64,
    count: Option<u64>,
    now_us: i64,
    cost: Cost,
) -> Evaluation {
    let period = super::period_us(params);
    let index = floor_div(window_start_us.clamp(0, MAX_NOW_US), period);
    let start = exact(index * period);
    let now = now_us
        .max(start)
        .min(exact(start + period - 1))
        .min(MAX_NOW_US);
    // The key names the window, and `now` is clamped into it: a refund always goes back to the
    // counter its debit named, whatever the store's clock says.
    fixed_window::evaluate(params, count.map(|c| (index, c)), now, cost, None)
}

#[cfg(test)]
mod tests {
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
}
