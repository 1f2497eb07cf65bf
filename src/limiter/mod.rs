//! Rate-limit algorithms as pure functions of `(params, state, now, cost)`.
//!
//! This module is the specification: the memory store calls it directly and the Redis Lua
//! script (`lua/`) must agree with it exactly (a randomized equivalence test drives both).
//! Hence the rules followed everywhere here:
//! - time is integer microseconds since the Unix epoch, passed in (never read from a clock);
//! - only integer arithmetic, and every intermediate value stays below 2^53 so that Lua's
//!   doubles compute the very same numbers;
//! - a denied or check-only (`cost == 0`) evaluation never changes state.
//!
//! Placeholder: the algorithms land with the limiter change; the types below are the contract.

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
}

/// The stored state of one bucket. An absent state is a full bucket / an empty window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// GCRA theoretical arrival time, in µs.
    TokenBucket {
        /// Theoretical arrival time (µs since the epoch).
        tat_us: i64,
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
