//! `lua/apply.lua` against the specification: the same bucket operations at the same fixed
//! times, applied by the script in a real `redis-server` and by the memory store (which calls
//! `limiter::evaluate` and `bucket::settle`), must give identical answers and identical state.
//!
//! Redis expires keys by real time while the memory store expires them by the test's fake
//! time, so the randomized test runs each script call in a MULTI/EXEC together with `PTTL` and
//! `PERSIST` of every key: it records the TTL the script set, then keeps Redis from expiring
//! anything (Redis does not expire keys in the middle of a transaction, but `PTTL` counts real
//! time, so the recorded TTL may be short by up to the time the transaction took, which the
//! test measures). Where the memory store holds a live state, Redis must hold the very same
//! state with the same TTL (rounded up to ms); where the memory store has none, Redis must hold
//! none or one whose own TTL had run out by the fake now (give or take that rounding) — a stale
//! state the algorithms treat as absent, which the identical answers of every later step
//! confirm.
//!
//! The cases live in `tests/lua_equivalence/`, one file per algorithm or concern, in one
//! test binary: `common` holds what they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

/// The cases, each file under `tests/lua_equivalence/`.
mod lua_equivalence {
    mod batches;
    mod calls;
    mod common;
    mod counters;
    mod garbage;
    mod random;
    mod token_bucket;
}
