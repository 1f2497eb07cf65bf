//! Sliding window: the two-counter estimate. The previous window's count is weighted by the
//! share of the sliding window (`now − period, now]` that still overlaps it, in 1/65536 steps at
//! millisecond resolution, and added to the current window's count.
//!
//! Bounds (validated params, `now ≤ 2^52`): `W_ms ≤ 2^36`, so `(W_ms − elapsed_ms) × 65536 ≤
//! 2^52`; counts ≤ 2^32, so `count × weight ≤ 2^48`; in the retry solver
//! `budget × 65536 ≤ 2^48` and `(w_max + 1) × W_ms ≤ 65537 × 2^36 < 2^53`;
//! `start + 2 × period ≤ 2^52 + 2^47`.

use super::window::{Position, plausible};
use super::{Cost, Evaluation, LimitParams, MAX_COUNT, Op, State, View, exact};

/// Fixed-point one: weights are in 1/65536.
const ONE: u64 = 65536;

/// The stored counters of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stored {
    /// Index of the window `current` counts.
    pub(super) window: i64,
    /// Hits in that window.
    pub(super) current: u64,
    /// Hits in the window before it.
    pub(super) previous: u64,
}

/// The counters as of the evaluation time, and the weight of `previous`.
#[derive(Clone, Copy, Debug)]
struct Counters {
    current: u64,
    previous: u64,
    /// Window length in ms (`W_ms`).
    window_ms: u64,
    /// Weight of `previous` in 1/65536, in `(0, 65536]`.
    weight: u64,
}

impl Counters {
    /// `ceil(previous × weight / 65536) + current`. Rounded up: a hit of the previous window
    /// still partly inside the sliding window counts whole, so the estimate never admits
    /// more than the limit (with floor, a limit of 1 per minute would admit a request 1 ms
    /// after the window boundary right after one 1 ms before it).
    fn estimate(&self) -> u64 {
        exact(self.previous * self.weight).div_ceil(ONE) + self.current
    }
}

/// `w(e) = floor((W_ms − e) × 65536 / W_ms)`: weight of the previous window at `e` whole ms
/// into the current one.
fn weight(window_ms: u64, elapsed_ms: u64) -> u64 {
    exact(window_ms.saturating_sub(elapsed_ms) * ONE) / window_ms
}

/// The first whole ms `e` into a window at which `ceil(previous × w(e) / 65536) ≤ budget`,
/// or `None` if no `e < W_ms` qualifies. Solved in integers (w(e) is non-increasing in e):
/// the condition is `w(e) ≤ w_max = floor(budget × 65536 / previous)`, and
/// `w(e) ≤ w_max ⇔ W_ms − e ≤ floor(((w_max + 1) × W_ms − 1) / 65536)`.
fn first_ms_within(previous: u64, budget: u64, window_ms: u64) -> Option<u64> {
    if previous == 0 {
        return Some(0);
    }
    let w_max = exact(budget * ONE) / previous;
    if w_max >= ONE {
        return Some(0);
    }
    let span = (exact((w_max + 1) * window_ms) - 1) / ONE;
    let e = window_ms.saturating_sub(span);
    (e < window_ms).then_some(e)
}

/// Evaluate `cost` at `now` (in `[0, MAX_NOW_US]`) against the stored counters. A refund
/// naming the window it was debited in (`debited_in`) goes back to that window's counter
/// ([`super::evaluate_refund_of`]).
pub(super) fn evaluate(
    params: &LimitParams,
    stored: Option<Stored>,
    now: i64,
    cost: Cost,
    debited_in: Option<i64>,
) -> Evaluation {
    let period = super::period_us(params);
    let limit = super::limit(params);
    // Zero counters are absent, so they cannot hold the clock in a later window (see `locate`).
    let stored =
        stored.filter(|s| (s.current > 0 || s.previous > 0) && plausible(s.window, period));
    let pos = Position::locate(period, now, stored.map(|s| s.window));
    // The stored window rolls: one window back becomes `previous`, older is forgotten.
    let (current, previous) = match stored {
        Some(s) if s.window == pos.index => (s.current, s.previous),
        Some(s) if s.window == pos.index - 1 => (0, s.current),
        _ => (0, 0),
    };
    let window_ms = (period / 1000).unsigned_abs();
    let elapsed_ms = ((pos.effective - pos.start) / 1000).unsigned_abs();
    let at = |current: u64, previous: u64| Counters {
        current: current.min(MAX_COUNT),
        previous: previous.min(MAX_COUNT),
        window_ms,
        weight: weight(window_ms, elapsed_ms),
    };
    let counters = at(current, previous);
    let view = |c: &Counters| View {
        remaining: limit.saturating_sub(c.estimate()),
        reset_us: forgotten_in(&pos, c),
    };
    let current_view = view(&counters);
    let estimate = counters.estimate();
    let commit = |next: Counters| {
        let state = State::SlidingWindow {
            window: pos.index,
            current: next.current,
            previous: next.previous,
        };
        Evaluation::commit(current_view, state, forgotten_in(&pos, &next), view(&next))
    };
    match Op::of(cost) {
        Op::Check if estimate <= limit => Evaluation::unchanged(current_view),
        Op::Check => Evaluation::denied(current_view, Some(retry_after(&pos, &counters, limit, 0))),
        Op::Debit(n) if n <= limit && exact(estimate + n) <= limit => {
            commit(at(counters.current + n, counters.previous))
        }
        // Overdraft: counted anyway, above the limit (`at` caps at MAX_COUNT); the wait is
        // until a check passes against the debited counters.
        Op::Debit(n) if params.overdraft => {
            let next = at(
                exact(counters.current + n.min(MAX_COUNT)),
                counters.previous,
            );
            let state = State::SlidingWindow {
                window: pos.index,
                current: next.current,
                previous: next.previous,
            };
            let ttl = forgotten_in(&pos, &next);
            let wait = retry_after(&pos, &next, limit, 0);
            Evaluation::overdrawn(current_view, state, ttl, view(&next), wait)
        }
        Op::Debit(n) if n > limit => Evaluation::denied(current_view, None),
        Op::Debit(n) => {
            Evaluation::denied(current_view, Some(retry_after(&pos, &counters, limit, n)))
        }
        // A debit counted in the previous window is given back to `previous`, which the
        // estimate still weighs; one counted earlier is forgotten already.
        Op::Refund(n) if debited_in.is_some_and(|window| window == pos.index - 1) => commit(at(
            counters.current,
            counters.previous - n.min(counters.previous),
        )),
        Op::Refund(_) if debited_in.is_some_and(|window| window != pos.index) => {
            Evaluation::unchanged(current_view)
        }
        // A refund into the current window (its own, or a client's `is_negative_hits`).
        Op::Refund(n) => commit(at(
            counters.current - n.min(counters.current),
            counters.previous,
        )),
    }
}

/// µs until the counters are forgotten (equivalent to absent): the end of the next window if
/// `current > 0`, else the end of this one if `previous > 0`, else 0. This is both the view's
/// `reset_us` and the TTL to store the counters with.
fn forgotten_in(pos: &Position, c: &Counters) -> u64 {
    if c.current > 0 {
        pos.until_window_end(2)
    } else if c.previous > 0 {
        pos.until_window_end(1)
    } else {
        0
    }
}

/// µs from now until `estimate + n ≤ limit` with no other traffic, for `n ≤ limit`: first
/// within this window (if `current + n ≤ limit`), else within the next one (where `current`
/// has become `previous`), else at the start of the one after (both counters forgotten).
/// Exact because the estimate never increases while no traffic arrives.
fn retry_after(pos: &Position, c: &Counters, limit: u64, n: u64) -> u64 {
    let ms = |e: u64| i64::try_from(e).unwrap_or(i64::MAX / 2) * 1000;
    if let Some(budget) = limit.checked_sub(c.current + n)
        && let Some(e) = first_ms_within(c.previous, budget, c.window_ms)
    {
        // e lies after the current ms (the cost is denied now), but stay safe.
        let offset = ms(e).max(pos.effective - pos.start);
        return pos.until(0, offset);
    }
    if let Some(e) = first_ms_within(c.current, limit.saturating_sub(n), c.window_ms) {
        return pos.until(1, ms(e));
    }
    pos.until_window_end(2)
}

#[cfg(test)]
mod tests;
