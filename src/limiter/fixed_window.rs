//! Fixed window: one counter per epoch-aligned window, the reference server's counting
//! (over limit when count > limit; a check-only request is over only when the count is already
//! strictly above) but all-or-nothing: a denied cost is not counted (docs/algorithms.md).
//!
//! Bounds (validated params, `now ≤ 2^52`): counts ≤ `MAX_COUNT` = 2^32 − 1 (a cost above the
//! limit is rejected before adding), window ends ≤ 2^52 + 2^47.

use super::window::{Position, plausible};
use super::{Cost, Evaluation, LimitParams, MAX_COUNT, Op, State, View, exact};

/// Evaluate `cost` at `now` (in `[0, MAX_NOW_US]`) against the stored `(window, count)`.
/// A refund naming the window it was debited in (`debited_in`) is given back only while that
/// window is the current one ([`super::evaluate_refund_of`]).
pub(super) fn evaluate(
    params: &LimitParams,
    stored: Option<(i64, u64)>,
    now: i64,
    cost: Cost,
    debited_in: Option<i64>,
) -> Evaluation {
    let period = super::period_us(params);
    let limit = super::limit(params);
    // A zero count is absent, so it cannot hold the clock in a later window (see `locate`).
    let stored = stored.filter(|&(window, count)| count > 0 && plausible(window, period));
    let pos = Position::locate(period, now, stored.map(|(window, _)| window));
    // A count of an older window is 0. (A later window cannot remain: `locate` moved into it.)
    let count = match stored {
        Some((window, count)) if window == pos.index => count.min(MAX_COUNT),
        _ => 0,
    };
    let until_end = pos.until_window_end(1);
    let view = |count: u64| View {
        remaining: limit.saturating_sub(count),
        reset_us: until_end,
    };
    let current = view(count);
    match Op::of(cost) {
        Op::Check if count <= limit => Evaluation::unchanged(current),
        // Over already: the next window starts at 0.
        Op::Check => Evaluation::denied(current, Some(until_end)),
        Op::Debit(n) if n <= limit && exact(count + n) <= limit => {
            let state = State::FixedWindow {
                window: pos.index,
                count: count + n,
            };
            Evaluation::commit(current, state, until_end, view(count + n))
        }
        // Overdraft: counted anyway, above the limit (capped at MAX_COUNT); checks pass again
        // in the next window.
        Op::Debit(n) if params.overdraft => {
            let count = exact(count + n.min(MAX_COUNT)).min(MAX_COUNT);
            let state = State::FixedWindow {
                window: pos.index,
                count,
            };
            Evaluation::overdrawn(current, state, until_end, view(count), until_end)
        }
        Op::Debit(n) if n > limit => Evaluation::denied(current, None),
        // n ≤ limit, so the fresh count of the next window admits it; this window never will.
        Op::Debit(_) => Evaluation::denied(current, Some(until_end)),
        // The debit's window has ended: its count is gone, and the current window never
        // counted the debit, so there is nothing to give back.
        Op::Refund(_) if debited_in.is_some_and(|window| window != pos.index) => {
            Evaluation::unchanged(current)
        }
        Op::Refund(n) => {
            let count = count - n.min(count);
            let ttl = if count == 0 { 0 } else { until_end };
            let state = State::FixedWindow {
                window: pos.index,
                count,
            };
            Evaluation::commit(current, state, ttl, view(count))
        }
    }
}

#[cfg(test)]
mod tests;
