//! Aligned windows shared by the fixed and sliding window algorithms: which window `now`
//! falls in, and how a stored window index is trusted.
//!
//! Windows are aligned to the epoch like the reference server's (window start =
//! floor(now / period) × period), so every replica and the Lua script agree on boundaries.

use super::{MAX_NOW_US, exact};

/// Where the evaluation time falls among the aligned windows of one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Position {
    /// Window length, µs.
    pub(super) period: i64,
    /// The caller's time, µs.
    pub(super) now: i64,
    /// The time the math uses: `now`, or the start of the stored window when that is later
    /// (the clock stepped back across a boundary; elapsed time is clamped at ≥ 0, docs/algorithms.md).
    pub(super) effective: i64,
    /// Index of the window containing `effective`.
    pub(super) index: i64,
    /// Start of that window, µs.
    pub(super) start: i64,
}

impl Position {
    /// Locate `now` (in `[0, MAX_NOW_US]`), never earlier than the start of `stored_window`.
    ///
    /// Bounds: `stored_window` is trusted only when its start is ≤ `MAX_NOW_US` (a store only
    /// writes windows it was evaluated in), so `effective ≤ 2^52` and `start + 2 × period`
    /// stays below 2^52 + 2^47.
    pub(super) fn locate(period: i64, now: i64, stored_window: Option<i64>) -> Self {
        let stored_start = stored_window.map_or(0, |w| exact(w * period));
        let effective = now.max(stored_start);
        let index = floor_div(effective, period);
        Position {
            period,
            now,
            effective,
            index,
            start: exact(index * period),
        }
    }

    /// µs from `now` until `n` windows after the start of this one (`n = 1`: its end).
    pub(super) fn until_window_end(&self, n: i64) -> u64 {
        let at = exact(self.start + n * self.period);
        (at - self.now).unsigned_abs()
    }

    /// µs from `now` until `offset_us` after the start of the window `n` windows on.
    pub(super) fn until(&self, n: i64, offset_us: i64) -> u64 {
        let at = exact(self.start + n * self.period + offset_us);
        (at - self.now).unsigned_abs()
    }
}

/// Whether a stored window index can be real: its start lies in `[0, MAX_NOW_US]`. Anything
/// else is corrupt state and is treated as absent (keeps the arithmetic bounded).
pub(super) fn plausible(window: i64, period: i64) -> bool {
    (0..=MAX_NOW_US / period).contains(&window)
}

/// floor(a / b) for `a ≥ 0`, `b > 0`, written the way the Lua script must compute it: take the
/// quotient, then correct it until `q × b ≤ a < (q + 1) × b`. In doubles `a / b` may round to
/// an adjacent integer; in Rust the corrections never fire, but they keep both in lockstep.
pub(super) fn floor_div(a: i64, b: i64) -> i64 {
    let mut q = a / b;
    if q * b > a {
        q -= 1;
    }
    if (q + 1) * b <= a {
        q += 1;
    }
    q
}

#[cfg(test)]
mod tests;
