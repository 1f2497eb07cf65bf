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
mod tests;
