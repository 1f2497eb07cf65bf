//! Token bucket as GCRA (generic cell rate algorithm): the whole bucket is one number, the
//! theoretical arrival time `tat`, so the Redis script reads and writes a single value and an
//! absent key is a full bucket (docs/algorithms.md).
//!
//! With `T` per token and tolerance `tau = burst × T`, the bucket's "debt" is `tat − now`
//! (clamped ≥ 0): how far ahead of the steady rate it has been spent. A cost `n` passes iff
//! `debt + n × T ≤ tau`; the debt drains at the speed of time.
//!
//! # Ticks
//!
//! The math runs in integer *ticks* of 10^-f µs, `f` (the limit's `digits`, 0 to
//! [`MAX_TAT_DIGITS`]) chosen per limit by [`Gcra::new`]: the fewest digits at which
//! `T = ceil(period × 10^f / rate)` is exact or at least [`PRECISE_INTERVAL`] ticks (so
//! rounding `T` up costs less than 10^-6 of the rate), as long as `period × 10^f ≤ 2^52` and
//! `burst × T ≤ 2^50`. A limit whose `T` is a whole number of µs, or at least a second,
//! keeps `f = 0`: whole µs, as a bucket has always been stored. `tat` is stored as a decimal
//! number of µs with `f` fraction digits ([`Tat`]); a stored `tat` with other digits (the
//! limit changed) is converted to this limit's ticks, rounding a debt up.
//!
//! Bounds (validated params, `now ≤ 2^52`): `period × 10^f ≤ 2^52`, so `T < 2^53`;
//! `tau ≤ 2^50` ticks; the stored `tat` is trusted only up to `now + 2^50` ticks, so
//! `debt ≤ 2^50`, `debt + n × T ≤ 2^51` (because `n ≤ burst` is checked first); absolute times
//! are only ever formed in µs, `now + ceil(debt / 10^f) < 2^53`.

use super::{Cost, Evaluation, LimitParams, MAX_COUNT, Op, State, Tat, View, exact};

/// Most fraction digits of a token bucket's `tat` (and of its ticks): 10^-9 µs.
pub const MAX_TAT_DIGITS: u8 = 9;

/// Largest debt and tolerance, in ticks: keeps `debt + n × T` below 2^51.
pub const MAX_DEBT_TICKS: u64 = 1 << 50;

/// A `T` of at least this many ticks is precise enough: rounding it up to a whole tick lowers
/// the rate by less than 10^-6.
pub const PRECISE_INTERVAL: u64 = 1_000_000;

/// Largest `period × 10^f`: `period × 10^f + rate − 1` (the rounded-up division) stays below
/// 2^53.
const MAX_SCALED_PERIOD: u64 = 1 << 52;

/// `T` in whole µs, `ceil(period / rate)`: what the validation bound on `burst × T` uses.
pub(super) fn emission_interval_us(period_us: u64, rate: u64) -> u64 {
    period_us.div_ceil(rate.max(1))
}

/// 10^digits (digits ≤ 18).
fn pow10(digits: u8) -> u64 {
    10u64.pow(u32::from(digits))
}

/// The GCRA constants of one limit (rate > 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Gcra {
    /// Fraction digits of the ticks: a tick is 10^-digits µs.
    digits: u8,
    /// Ticks per µs, 10^digits.
    scale: i64,
    /// `T`, ticks per token.
    interval: i64,
    /// `tau = burst × T`, ticks.
    tolerance: i64,
    /// Capacity in tokens.
    burst: i64,
    /// How far beyond `tau` a debit may reserve (`max_wait` in ticks, ≤ 2^50 − tau).
    wait: i64,
}

impl Gcra {
    /// The constants for `params`, or `None` when nothing is ever granted (rate 0).
    /// Invalid params are clamped into the validated domain (no-op for valid ones).
    pub(super) fn new(params: &LimitParams) -> Option<Self> {
        let period = super::period_us(params).unsigned_abs();
        let rate = super::limit(params);
        if rate == 0 {
            return None;
        }
        let wanted_burst = params.burst.min(MAX_COUNT);
        let max_wait = params.max_wait_us.min(super::MAX_WAIT_US);
        let (mut digits, mut scale) = (0u8, 1u64);
        let mut interval = period.div_ceil(rate);
        // Finer ticks only while T is imprecise and the finer ones keep every bound; the
        // products are compared through divisions so no step can overflow (nor, in Lua,
        // round).
        while interval < PRECISE_INTERVAL
            && !(period * scale).is_multiple_of(rate)
            && digits < MAX_TAT_DIGITS
        {
            let finer = scale * 10;
            if period > MAX_SCALED_PERIOD / finer {
                break;
            }
            let finer_interval = (period * finer).div_ceil(rate);
            if wanted_burst > MAX_DEBT_TICKS / finer_interval
                || max_wait > (MAX_DEBT_TICKS - wanted_burst * finer_interval) / finer
            {
                break;
            }
            (digits, scale, interval) = (digits + 1, finer, finer_interval);
        }
        let burst = wanted_burst.min(MAX_DEBT_TICKS / interval);
        // The wait fits what the tolerance leaves of 2^50 ticks (validated params always do).
        let wait = max_wait.min((MAX_DEBT_TICKS - burst * interval) / scale) * scale;
        // interval ≤ 2^52, scale ≤ 10^9, burst ≤ 2^32 and wait ≤ 2^50: all fit i64.
        let interval = i64::try_from(interval).ok()?;
        let burst = i64::try_from(burst).ok()?;
        Some(Gcra {
            digits,
            scale: i64::try_from(scale).ok()?,
            interval: exact(interval),
            tolerance: exact(burst * interval),
            burst,
            wait: exact(i64::try_from(wait).ok()?),
        })
    }

    /// The debt in ticks of a bucket holding `tat` at `now`: `tat − now`, at least 0 and at
    /// most 2^50 ticks (only corrupt state or a clock stepped back by years reach the cap).
    /// A `tat` with more digits than this limit's ticks is rounded up to a whole tick.
    fn debt(&self, tat: Option<Tat>, now: i64) -> i64 {
        let max_debt = MAX_DEBT_TICKS.cast_signed();
        let Some(tat) = tat else { return 0 };
        // tat.us ≤ now − 1 and the fraction is below one µs: tat < now.
        if tat.us < now {
            return 0;
        }
        // now ≥ 0, so this cannot overflow.
        let ahead_us = tat.us - now;
        if ahead_us > max_debt / self.scale {
            return max_debt;
        }
        let digits = tat.digits.min(MAX_TAT_DIGITS);
        let frac = u64::from(tat.frac).min(pow10(digits) - 1);
        let frac_ticks = if digits <= self.digits {
            frac * pow10(self.digits - digits)
        } else {
            frac.div_ceil(pow10(digits - self.digits))
        };
        exact((ahead_us * self.scale + frac_ticks.cast_signed()).min(max_debt))
    }

    /// The theoretical arrival time `debt` ticks after `now`.
    fn tat(&self, now: i64, debt: i64) -> Tat {
        Tat {
            us: exact(now + debt / self.scale),
            // < 10^9 < 2^32.
            frac: u32::try_from(debt % self.scale).unwrap_or(0),
            digits: self.digits,
        }
    }

    /// Ticks as whole µs, rounded up (times until something, so never early).
    fn micros(&self, ticks: i64) -> u64 {
        ticks
            .max(0)
            .unsigned_abs()
            .div_ceil(self.scale.unsigned_abs())
    }

    /// The bucket as seen from outside with this debt (ticks, ≥ 0).
    fn view(&self, debt: i64) -> View {
        let remaining = if debt <= self.tolerance {
            (self.tolerance - debt) / self.interval
        } else {
            0
        };
        View {
            remaining: remaining.unsigned_abs(),
            reset_us: self.micros(debt),
        }
    }
}

/// A limit's GCRA constants in ticks, as `lua/apply.lua` takes them: Redis, the resource every
/// replica shares, computes none of them per call (they depend on the limit only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticks {
    /// `T`, ticks per token (≥ 1).
    pub interval: i64,
    /// Ticks per µs: 10^digits, the precision of the stored `tat`.
    pub scale: i64,
    /// Capacity in tokens, capped so that `burst × T` ≤ 2^50.
    pub burst: i64,
    /// How far beyond `burst × T` a debit may reserve, in ticks.
    pub wait: i64,
}

/// The [`Ticks`] of `params` (clamped into the validated domain like every evaluation), or
/// `None` when nothing is ever granted (rate 0).
pub fn ticks(params: &LimitParams) -> Option<Ticks> {
    Gcra::new(params).map(|g| Ticks {
        interval: g.interval,
        scale: g.scale,
        burst: g.burst,
        wait: g.wait,
    })
}

/// `reset_us` (a token bucket's time until full, as [`View::reset_us`] reports it) at the
/// configured rate rather than at `T` rounded up to a whole tick: scaled by
/// `period × 10^f / (rate × T)` (at most 1) and rounded down, so a full bucket of the
/// default burst reports exactly one period ("3 per second" says 1 s, not 2 s after the
/// rounding of `T` and of the µs), but never to 0 while the bucket is not full. Unchanged
/// when `T` is exact or the rate is 0.
pub fn reset_at_configured_rate(params: &LimitParams, reset_us: u64) -> u64 {
    // A rate that divides its period makes `T` exact at whole µs (no finer ticks, scale 1):
    // nothing to rescale, and no constants to work out for every status of every request.
    let (period, rate) = (
        super::period_us(params).unsigned_abs(),
        super::limit(params),
    );
    if rate == 0 || period.is_multiple_of(rate) {
        return reset_us;
    }
    let Some(gcra) = Gcra::new(params) else {
        return reset_us;
    };
    let period = u128::from(super::period_us(params).unsigned_abs());
    let scaled_period = period * u128::from(gcra.scale.unsigned_abs());
    let actual = u128::from(super::limit(params)) * u128::from(gcra.interval.unsigned_abs());
    if actual == scaled_period || actual == 0 {
        return reset_us;
    }
    // reset_us < 2^51 and scaled_period ≤ 2^52: the product fits u128.
    let scaled = u64::try_from(u128::from(reset_us) * scaled_period / actual).unwrap_or(reset_us);
    scaled.max(reset_us.min(1))
}

/// Evaluate `cost` at `now` (in `[0, MAX_NOW_US]`) against stored theoretical arrival time `tat`.
pub(super) fn evaluate(params: &LimitParams, tat: Option<Tat>, now: i64, cost: Cost) -> Evaluation {
    let Some(gcra) = Gcra::new(params) else {
        // requests_per_period 0: nothing passes, there is nothing to refill or refund.
        let view = View {
            remaining: 0,
            reset_us: 0,
        };
        return match Op::of(cost) {
            Op::Debit(_) => Evaluation::denied(view, None),
            Op::Check | Op::Refund(_) => Evaluation::unchanged(view),
        };
    };
    // max(tat, now) forgets idle time (and clock steps back); the upper clamp only bites on
    // corrupt state or a clock that stepped back by decades, and bounds the arithmetic.
    let max_debt = MAX_DEBT_TICKS.cast_signed();
    let debt = gcra.debt(tat, now);
    let current = gcra.view(debt);
    let commit = |new_debt: i64| {
        let state = State::TokenBucket {
            tat: gcra.tat(now, new_debt),
        };
        Evaluation::commit(current, state, gcra.micros(new_debt), gcra.view(new_debt))
    };
    match Op::of(cost) {
        Op::Check if debt <= gcra.tolerance => Evaluation::unchanged(current),
        Op::Check => Evaluation::denied(current, Some(gcra.micros(debt - gcra.tolerance))),
        Op::Debit(n) => {
            // n ≤ burst, so n × T ≤ tau ≤ 2^50 (computed only then).
            let fitting = i64::try_from(n)
                .ok()
                .filter(|&n| n <= gcra.burst)
                .map(|n| exact(debt + n * gcra.interval));
            match fitting {
                Some(new_debt) if new_debt <= gcra.tolerance => commit(new_debt),
                // Shaped: fits within max_wait. Reserved now, answered when its tokens
                // would have been there: new_debt − tau ticks from now, rounded up.
                Some(new_debt) if new_debt - gcra.tolerance <= gcra.wait && !params.overdraft => {
                    let state = State::TokenBucket {
                        tat: gcra.tat(now, new_debt),
                    };
                    let ttl = gcra.micros(new_debt);
                    let delay = gcra.micros(new_debt - gcra.tolerance);
                    Evaluation::shaped(current, state, ttl, gcra.view(new_debt), delay)
                }
                _ if params.overdraft => {
                    // Always debited: into debt beyond tau, up to the cap of 2^50 ticks. Whole
                    // tokens that fit under the cap: (2^50 − debt) / T, so n × T ≤ 2^50 − debt.
                    let room = ((max_debt - debt) / gcra.interval).unsigned_abs();
                    let new_debt = if n <= room {
                        exact(debt + n.cast_signed() * gcra.interval)
                    } else {
                        max_debt
                    };
                    let state = State::TokenBucket {
                        tat: gcra.tat(now, new_debt),
                    };
                    // Checks pass again once the debt has drained back to tau.
                    let wait = gcra.micros(new_debt - gcra.tolerance);
                    let ttl = gcra.micros(new_debt);
                    Evaluation::overdrawn(current, state, ttl, gcra.view(new_debt), wait)
                }
                // At now + r the debt is new_debt − r − n×T + n×T = tau (+ the wait): the
                // earliest pass, rounded up to the µs (time moves in whole µs).
                Some(new_debt) => Evaluation::denied(
                    current,
                    Some(gcra.micros(new_debt - gcra.tolerance - gcra.wait)),
                ),
                // More than the capacity can never pass.
                None => Evaluation::denied(current, None),
            }
        }
        Op::Refund(n) => {
            // Never give back more than a full bucket; never credit beyond full.
            let n = i64::try_from(n).unwrap_or(i64::MAX).min(gcra.burst);
            commit(exact(debt - n * gcra.interval).max(0))
        }
    }
}

#[cfg(test)]
mod tests;
