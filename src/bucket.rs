//! Buckets: what a store keeps per limit and identity, and how the planner and the stores
//! speak of them.
//!
//! A *bucket* here is the stored state of one limit for one identity (a domain, a
//! descriptor's entries as matched, the limit) — whatever the algorithm: a token bucket's
//! theoretical arrival time, or a fixed or sliding window's counters. This module is not the
//! token bucket algorithm (that is `limiter::token_bucket`); it holds no state and does no I/O.
//!
//! - `key`: a bucket's identity, [`BucketKey`], encoded once per request as bytes that are
//!   also its Redis key: escaped, unambiguous, free of Redis Cluster hash tags.
//! - `reference`: the reference server's counter names ([`ReferenceKey`],
//!   [`ReferenceCounter`]), for fixed windows shared with reference pods, and the stamp that
//!   fixes their window once per request ([`stamp_reference_counters`]).
//! - `operation`: the store protocol: a request's [`BucketOp`]s, a store's [`Applied`]
//!   answer, and the all-or-nothing rule every store applies ([`settle`]).

mod key;
mod operation;
mod reference;

pub use key::{
    BucketKey, KeyValue, MAX_COMPONENT, encode_domain, hash_tagged_domain, value_digest,
};
pub use operation::{Applied, BucketOp, BucketResult, Undo, settle};
pub use reference::{
    ReferenceCounter, ReferenceKey, expiry_secs, stamp_reference_counters, window_reset_secs,
    window_start,
};
