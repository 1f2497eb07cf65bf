//! Rate-limit algorithms as pure functions of `(params, state, now, cost)`.
//!
//! This module is the specification: the memory store calls it directly and the Redis Lua
//! script (`lua/`) must agree with it exactly (a randomized equivalence test drives both).
//! Hence the rules followed everywhere here:
//! - time is integer microseconds since the Unix epoch, passed in (never read from a clock);
//!   the token bucket counts in finer integer ticks of its own (see `token_bucket`);
//! - only `+`, `-`, `×` and floor division of non-negative integers, and every intermediate
//!   value stays below 2^53 so that Lua's doubles compute the very same numbers (each file
//!   notes its bounds; tests assert them through `exact`);
//! - a denied or check-only (`cost == 0`) evaluation never changes state — except a debit on
//!   an [overdraft](LimitParams::overdraft) limit, which always carries the debited state;
//! - a check-only evaluation is over only when the bucket is strictly over (overdrawn).
//!
//! The store evaluates every bucket of a request, then either commits every
//! [`Evaluation::next`] (all enforcing, non-overdraft buckets admitted) or none of them
//! (a denied request debits nothing: docs/algorithms.md), and reports [`Evaluation::committed`] or
//! [`Evaluation::current`]; see [`crate::bucket::settle`].
//!
//! Inputs outside the documented domain (a `now_us` outside `[0, 2^52]`, params that fail
//! [`LimitParams::validate`], corrupt stored state) are clamped into it, so `evaluate` never
//! panics; for valid inputs the clamps are no-ops. The operator-facing description of the math
//! is `docs/algorithms.md`.

mod counter;
mod fixed_window;
mod sliding_window;
mod token_bucket;
mod window;

pub use counter::evaluate_counter;
pub use token_bucket::{
    MAX_DEBT_TICKS, MAX_TAT_DIGITS, PRECISE_INTERVAL, Ticks, reset_at_configured_rate, ticks,
};

/// Which algorithm a limit uses (`algorithm:` in the limits file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Generic cell rate algorithm: continuous refill, capacity `burst`. The default.
    TokenBucket,
    /// The reference server's counting: one counter per aligned window.
    FixedWindow,
    /// Two-counter estimate: previous window weighted by the part still inside the window.
    SlidingWindow,
}

/// Everything the math needs to know about one bucket, resolved from config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitParams {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Requests (tokens) granted per period (`requests_per_unit`). May be 0: nothing passes.
    pub requests_per_period: u64,
    /// Period in microseconds: unit × `unit_multiplier`; always a whole number of seconds.
    pub period_us: u64,
    /// Token bucket capacity (`burst`, default `requests_per_unit`). Windows ignore it.
    pub burst: u64,
    /// `overdraft: true`: a debit is always applied, even when it does not fit — the bucket
    /// goes into debt beyond its capacity (token bucket: `tat` beyond `now + tau`, capped at
    /// `now + 2^50`; windows: the count goes above the limit, capped at [`MAX_COUNT`]) and
    /// the evaluation is not `admitted` but carries the debited `next` state. Checks then
    /// deny until refill repays the debt. Not part of the bucket's identity (key).
    pub overdraft: bool,
    /// Token bucket only (`max_wait:`; 0 = off): a debit that does not fit now but would
    /// within this many µs is admitted with its tokens reserved at once — the bucket goes
    /// into debt beyond its capacity by at most this much time, so later debits queue behind
    /// it in order — and [`Evaluation::delay_us`] says how long the caller must hold the
    /// request. Not part of the bucket's identity (key).
    pub max_wait_us: u64,
}

/// The stored state of one bucket. An absent state is a full bucket / an empty window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// GCRA theoretical arrival time.
    TokenBucket {
        /// Theoretical arrival time (µs since the epoch, with a fraction).
        tat: Tat,
    },
    /// Count of the window with index `window` (= floor(now / period)).
    FixedWindow {
        /// Window index.
        window: i64,
        /// Hits counted in that window.
        count: u64,
    },
    /// Counts of window `window` and of the one before it.
    SlidingWindow {
        /// Index of the current window.
        window: i64,
        /// Hits counted in the current window.
        current: u64,
        /// Hits counted in the previous window.
        previous: u64,
    },
}

/// A token bucket's theoretical arrival time: `us + frac / 10^digits` µs since the epoch.
///
/// It is a decimal number of µs with `digits` fraction digits, which is exactly how the Redis
/// script stores it (`1700000000000000` or `1700000000000000.250000000`, see [`Tat::parse`]);
/// `digits` is the precision of the limit that wrote it (0 for a limit whose time per token is a
/// whole number of µs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tat {
    /// Whole µs since the epoch.
    pub us: i64,
    /// The fraction's digits as an integer, below `10^digits`.
    pub frac: u32,
    /// Fraction digits, 0 to [`MAX_TAT_DIGITS`].
    pub digits: u8,
}

impl Tat {
    /// A whole number of µs.
    pub const fn from_us(us: i64) -> Tat {
        Tat {
            us,
            frac: 0,
            digits: 0,
        }
    }

    /// Parses the stored form: an optionally negative decimal integer, optionally followed by
    /// `.` and 1 to [`MAX_TAT_DIGITS`] digits. `None` for anything else, which the stores treat
    /// as an absent bucket (the Redis script accepts exactly the same forms). An integer part
    /// beyond `i64` saturates: far in the future (or past) either way, as the script reads it.
    pub fn parse(text: &str) -> Option<Tat> {
        let (whole, fraction) = match text.split_once('.') {
            Some((whole, fraction)) => (whole, Some(fraction)),
            None => (text, None),
        };
        let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let unsigned = whole.strip_prefix('-').unwrap_or(whole);
        if !digits_only(unsigned) {
            return None;
        }
        let saturated = if unsigned.len() == whole.len() {
            i64::MAX
        } else {
            i64::MIN
        };
        let us = whole.parse().unwrap_or(saturated);
        let Some(fraction) = fraction else {
            return Some(Tat::from_us(us));
        };
        if !digits_only(fraction) || fraction.len() > usize::from(MAX_TAT_DIGITS) {
            return None;
        }
        Some(Tat {
            us,
            frac: fraction.parse().ok()?,
            digits: u8::try_from(fraction.len()).ok()?,
        })
    }
}

impl std::fmt::Display for Tat {
    /// The stored form: `us`, or `us.frac` with exactly `digits` fraction digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.digits == 0 {
            write!(f, "{}", self.us)
        } else {
            let width = usize::from(self.digits);
            write!(f, "{}.{:0width$}", self.us, self.frac)
        }
    }
}

/// Signed cost of one bucket operation: > 0 debit, < 0 refund, 0 = check only.
///
/// Callers clamp `u64` hits into the `i64` range before calling.
pub type Cost = i64;

/// What the bucket looks like from outside: whole tokens left and time until full/reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Whole tokens (requests) that could still be admitted now (`limit_remaining`).
    pub remaining: u64,
    /// µs until the bucket is full again / the counted hits are forgotten
    /// (`duration_until_reset`, which the service rounds up to seconds).
    pub reset_us: u64,
}

/// The outcome of evaluating one cost against one bucket; see the module docs for how the
/// store combines evaluations of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evaluation {
    /// Would this cost be admitted? (Refunds and checks of a non-overdrawn bucket: true.)
    /// For an overdraft debit: whether the cost fitted (it is stored either way).
    pub admitted: bool,
    /// The state to store if the caller commits this evaluation, with its TTL in µs
    /// (time until the state is equivalent to absent). `None` = leave stored state unchanged.
    /// `Some((_, 0))` means the state equals "absent": the store may delete the key.
    /// Always `None` when cost == 0, and when !admitted unless the limit has `overdraft`
    /// (an overdraft debit always carries its state).
    pub next: Option<(State, u64)>,
    /// The view if `next` is committed (equals `current` when `next` is None).
    pub committed: View,
    /// The view if nothing is committed (state as it is now, at `now_us`).
    pub current: View,
    /// When !admitted: µs from now until this same cost could be admitted; `None` if never
    /// (cost above capacity / limit, or requests_per_period == 0). `Some(0)` when admitted.
    /// For an overdraft debit that did not fit: µs until the bucket, debited, is no longer
    /// overdrawn (a check passes again); never `None` unless requests_per_period == 0.
    /// With [`LimitParams::max_wait_us`]: until the cost could be admitted with a delay.
    pub retry_after_us: Option<u64>,
    /// µs the caller must hold an admitted debit before answering: the time until its
    /// tokens would have been there (0 when they are there now). Only a token bucket with
    /// [`LimitParams::max_wait_us`] admits a debit with a delay, never above that.
    pub delay_us: u64,
}

impl Evaluation {
    /// Admitted without touching state (check-only, or nothing to change).
    fn unchanged(current: View) -> Self {
        Evaluation {
            admitted: true,
            next: None,
            committed: current,
            current,
            retry_after_us: Some(0),
            delay_us: 0,
        }
    }

    /// Not admitted: state stays as it is.
    fn denied(current: View, retry_after_us: Option<u64>) -> Self {
        Evaluation {
            admitted: false,
            next: None,
            committed: current,
            current,
            retry_after_us,
            delay_us: 0,
        }
    }

    /// Overdraft debit that did not fit: not admitted, but storing `state` for `ttl_us`
    /// anyway (the bucket goes into debt); `retry_after_us` is when it stops being overdrawn.
    fn overdrawn(
        current: View,
        state: State,
        ttl_us: u64,
        committed: View,
        retry_after_us: u64,
    ) -> Self {
        Evaluation {
            admitted: false,
            next: Some((state, ttl_us)),
            committed,
            current,
            retry_after_us: Some(retry_after_us),
            delay_us: 0,
        }
    }

    /// Admitted after `delay_us`: its tokens reserved at once in `state` (stored for `ttl_us`).
    fn shaped(current: View, state: State, ttl_us: u64, committed: View, delay_us: u64) -> Self {
        Evaluation {
            delay_us,
            ..Evaluation::commit(current, state, ttl_us, committed)
        }
    }

    /// Admitted, storing `state` for `ttl_us`, after which the bucket looks like `committed`.
    fn commit(current: View, state: State, ttl_us: u64, committed: View) -> Self {
        Evaluation {
            admitted: true,
            next: Some((state, ttl_us)),
            committed,
            current,
            retry_after_us: Some(0),
            delay_us: 0,
        }
    }
}

/// A [`Cost`] split by what it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `cost == 0`: would the bucket admit anything at all? Never changes state.
    Check,
    /// `cost > 0`: take this many tokens.
    Debit(u64),
    /// `cost < 0`: give this many tokens back (a request that was debited but not served).
    Refund(u64),
}

impl Op {
    fn of(cost: Cost) -> Self {
        match cost {
            0 => Op::Check,
            c if c > 0 => Op::Debit(c.unsigned_abs()),
            c => Op::Refund(c.unsigned_abs()),
        }
    }
}

/// Largest `now_us` the arithmetic is designed for: 2^52 µs ≈ 142 years after 1970, so
/// `now + 2 × period` and `tat + tolerance` stay below 2^53.
pub const MAX_NOW_US: i64 = 1 << 52;

/// Longest period: 2^36 ms ≈ 795 days, so the sliding window's `W_ms × 65536` stays below 2^53.
pub const MAX_PERIOD_US: u64 = (1 << 36) * 1000;

/// Largest token bucket tolerance `burst × T` accepted by [`LimitParams::validate`]: 2^50 µs
/// ≈ 35.7 years (with `T` in whole µs, rounded up), so the tolerance fits [`MAX_DEBT_TICKS`]
/// at the coarsest ticks.
pub const MAX_TOLERANCE_US: u64 = 1 << 50;

/// Longest `max_wait`: 60 s, far beyond any client's patience (Envoy's rate-limit call times
/// out after 20 ms by default).
pub const MAX_WAIT_US: u64 = 60_000_000;

/// Largest `requests_per_period`, `burst` and stored counter (`u32::MAX`, what Envoy's
/// `requests_per_unit` can carry); keeps `count × 65536` below 2^48.
pub const MAX_COUNT: u64 = u32::MAX as u64;

/// Evaluate `cost` against a bucket. `state` None = absent (full bucket / empty windows).
/// A state of another algorithm than `params.algorithm` is treated as absent.
///
/// A refund here goes to the window `now_us` falls in (a client's `is_negative_hits`); a
/// refund of a debit this server made names its window with [`evaluate_refund_of`].
///
/// `now_us` is clamped to `[0, MAX_NOW_US]`; see the module docs for the other clamps.
pub fn evaluate(
    params: &LimitParams,
    state: Option<&State>,
    now_us: i64,
    cost: Cost,
) -> Evaluation {
    evaluate_refund_of(params, state, now_us, cost, None)
}

/// [`evaluate`], where a refund (`cost < 0`) of a fixed or sliding window gives back a debit
/// counted in the window with index `debited_in` (the `window` of the state the debit stored):
/// a fixed window's count only while that window is the current one; a sliding window's
/// current count, or its previous one once the debit's window has become the previous; and
/// nothing once the debit's window is forgotten, so a debit can never be refunded into a
/// window it was not counted in. `None` refunds into the current window, as [`evaluate`].
/// Token buckets ignore `debited_in`: their refund is exact whenever it comes.
pub fn evaluate_refund_of(
    params: &LimitParams,
    state: Option<&State>,
    now_us: i64,
    cost: Cost,
    debited_in: Option<i64>,
) -> Evaluation {
    let now = now_us.clamp(0, MAX_NOW_US);
    match params.algorithm {
        Algorithm::TokenBucket => {
            let tat = match state {
                Some(State::TokenBucket { tat }) => Some(*tat),
                _ => None,
            };
            token_bucket::evaluate(params, tat, now, cost)
        }
        Algorithm::FixedWindow => {
            let stored = match state {
                Some(State::FixedWindow { window, count }) => Some((*window, *count)),
                _ => None,
            };
            fixed_window::evaluate(params, stored, now, cost, debited_in)
        }
        Algorithm::SlidingWindow => {
            let stored = match state {
                Some(State::SlidingWindow {
                    window,
                    current,
                    previous,
                }) => Some(sliding_window::Stored {
                    window: *window,
                    current: *current,
                    previous: *previous,
                }),
                _ => None,
            };
            sliding_window::evaluate(params, stored, now, cost, debited_in)
        }
    }
}

/// How long a bucket's set (or reset) is remembered, µs: the longest a debit made before it
/// can still be given back into the bucket, so that such a refund is dropped
/// ([`crate::bucket::BucketOp::debited_at`]) rather than credited after the set. A token
/// bucket's debit stays in it until a full bucket's worth has refilled (`burst × T`), and a
/// held (`max_wait`) one may be refunded up to [`MAX_WAIT_US`] after it; a window's debit is
/// refunded only into its own window, or (sliding) the next one: two periods. 0 for a rate
/// of 0, which nothing is debited from. A refund later than this would credit a debit that
/// refill has given back anyway, as it would without the set.
pub fn set_memory_us(params: &LimitParams) -> u64 {
    match params.algorithm {
        Algorithm::TokenBucket => match ticks(params) {
            Some(t) => {
                let tolerance = (t.burst * t.interval).unsigned_abs();
                tolerance.div_ceil(t.scale.unsigned_abs()) + MAX_WAIT_US
            }
            None => 0,
        },
        Algorithm::FixedWindow | Algorithm::SlidingWindow => 2 * period_us(params).unsigned_abs(),
    }
}

impl LimitParams {
    /// Validates Lua-safety bounds; returns a human message on failure (used by config loading).
    ///
    /// The bounds keep every value the Redis script computes below 2^53 (see the constants).
    pub fn validate(&self) -> Result<(), String> {
        let period = self.period_us;
        if period == 0 || !period.is_multiple_of(1_000_000) {
            return Err(format!(
                "the period must be a positive whole number of seconds (got {period} µs)"
            ));
        }
        if period > MAX_PERIOD_US {
            return Err(format!(
                "the period ({} s) exceeds the longest supported period, 2^36 ms (about 795 \
                 days)",
                period / 1_000_000
            ));
        }
        if self.requests_per_period > MAX_COUNT {
            return Err(format!(
                "requests_per_unit {} exceeds the maximum {MAX_COUNT}",
                self.requests_per_period
            ));
        }
        if self.burst > MAX_COUNT {
            return Err(format!(
                "burst {} exceeds the maximum {MAX_COUNT}",
                self.burst
            ));
        }
        if self.max_wait_us > 0 {
            if self.algorithm != Algorithm::TokenBucket {
                return Err(
                    "max_wait applies to token_bucket limits only: a window has no \
                            order to queue requests in (all it could do is admit the next \
                            window's requests at its boundary)"
                        .to_owned(),
                );
            }
            if self.overdraft {
                return Err(
                    "max_wait and overdraft exclude each other: an overdraft debit \
                            is always admitted at once"
                        .to_owned(),
                );
            }
            if self.max_wait_us > MAX_WAIT_US {
                return Err(format!(
                    "max_wait {} ms exceeds the longest supported, {} ms",
                    self.max_wait_us / 1000,
                    MAX_WAIT_US / 1000
                ));
            }
        }
        if self.algorithm == Algorithm::TokenBucket && self.requests_per_period > 0 {
            // Any rate is representable (the token bucket's ticks get finer); only the time
            // to refill `burst`, plus `max_wait`, is bounded.
            let rate = self.requests_per_period;
            let tolerance = u128::from(token_bucket::emission_interval_us(period, rate))
                * u128::from(self.burst)
                + u128::from(self.max_wait_us);
            if tolerance > u128::from(MAX_TOLERANCE_US) {
                return Err(format!(
                    "token_bucket burst {} at requests_per_unit {rate} per {} takes {} s to \
                     refill, more than the supported 2^50 µs (about 35 years); lower burst",
                    self.burst,
                    describe_period(period),
                    tolerance / 1_000_000
                ));
            }
        }
        Ok(())
    }
}

/// "second" or "N seconds", for messages.
fn describe_period(period_us: u64) -> String {
    match period_us / 1_000_000 {
        1 => "second".to_owned(),
        s => format!("{s} seconds"),
    }
}

/// Period used by the math: validated params pass through; others are clamped to
/// `[1 ms, MAX_PERIOD_US]` so no division by zero or overflow can happen.
fn period_us(params: &LimitParams) -> i64 {
    // MAX_PERIOD_US < 2^47, so the conversion cannot fail.
    i64::try_from(params.period_us.clamp(1000, MAX_PERIOD_US)).unwrap_or(i64::MAX)
}

/// `requests_per_period` used by the math (clamped to [`MAX_COUNT`]).
fn limit(params: &LimitParams) -> u64 {
    params.requests_per_period.min(MAX_COUNT)
}

/// Marks a value the Lua script computes as a double. Under `cfg(test)` it asserts the value is
/// exactly representable (|x| < 2^53); otherwise it is the identity.
fn exact<T: Into<i128> + Copy>(value: T) -> T {
    #[cfg(test)]
    assert!(
        value.into().unsigned_abs() < 1 << 53,
        "value {} would lose precision in Lua",
        value.into()
    );
    value
}

/// The limits unit tests write: one constructor, so a field added to [`LimitParams`] is
/// given its neutral value in one place.
#[cfg(test)]
impl LimitParams {
    /// `rate` per `period_s` seconds with capacity `burst`, no overdraft and no waiting (a
    /// limits file's rule with only `requests_per_unit`, `unit` and `burst`).
    pub(crate) fn of(algorithm: Algorithm, rate: u64, period_s: u64, burst: u64) -> Self {
        LimitParams {
            algorithm,
            requests_per_period: rate,
            period_us: period_s * 1_000_000,
            burst,
            overdraft: false,
            max_wait_us: 0,
        }
    }
}

#[cfg(test)]
mod tests;
