//! The reference server's Redis key names and counter expiry, for sharing fixed-window
//! counters with reference pods while a Deployment rolls from one server to the other.
//!
//! The reference (envoyproxy/ratelimit, `src/limiter/cache_key.go`) names a fixed-window
//! counter `CACHE_KEY_PREFIX` + domain + `_` + (key `_` value `_`)… + window start, where a
//! `share_threshold` entry writes its wildcard pattern instead of the value and the window start
//! is `floor(now / unit) × unit` in seconds of the pod's own clock (`time.Now().Unix()`, not
//! Redis `TIME`), with the unit's plain length (`utils.UnitToDivider`: a month is 30 days, a
//! year 365). It stores a plain integer with `INCRBY` and sets `EXPIRE` to the unit's length
//! plus a random `[0, EXPIRATION_JITTER_MAX_SECONDS)` (`src/redis/fixed_cache_impl.go`).
//!
//! The trade-off, written in `docs/redis.md`: these keys are ambiguous — nothing is escaped,
//! so domain `a_b` with entry `c=d` and domain `a` with entry `b_c=d` share a counter, and a
//! `{`…`}` in a value picks the Redis Cluster slot — and they carry no unit, so two limits of
//! one descriptor would collide. [`super::BucketKey`]'s own encoding has none of these faults,
//! which is why floodgate uses it unless asked to share the reference's counters.

use super::BucketOp;
use super::key::push_decimal;

/// A reference counter's name without its window start: built once per bucket by the planner;
/// a store appends the window start from its clock with [`ReferenceKey::at`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReferenceKey(Box<[u8]>);

impl ReferenceKey {
    /// The reference's key base: `prefix` + `domain` + `_` + (key `_` value `_`)…, each value
    /// being the request's value or, for a `share_threshold` entry, the wildcard pattern. Bytes
    /// are copied as they are: the reference escapes nothing, and the names must be its names.
    pub fn new<'a>(
        prefix: &[u8],
        domain: &str,
        entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> ReferenceKey {
        let mut out = Vec::with_capacity(prefix.len() + domain.len() + 48);
        out.extend_from_slice(prefix);
        out.extend_from_slice(domain.as_bytes());
        out.push(b'_');
        for (key, value) in entries {
            out.extend_from_slice(key);
            out.push(b'_');
            out.extend_from_slice(value);
            out.push(b'_');
        }
        ReferenceKey(out.into_boxed_slice())
    }

    /// The counter's full name at `now_secs` (Unix seconds) for a window of `unit_secs`
    /// seconds: the base followed by the window start, `floor(now / unit) × unit`, in decimal.
    pub fn at(&self, now_secs: u64, unit_secs: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() + 20);
        out.extend_from_slice(&self.0);
        out.extend_from_slice(window_start(now_secs, unit_secs).to_string().as_bytes());
        out
    }

    /// The base, without a window start.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for ReferenceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReferenceKey({})", String::from_utf8_lossy(&self.0))
    }
}

/// A bucket shared with reference pods: the counter's name and expiry, carried by its
/// [`super::BucketOp`] so that every store call for the op — its debit, and any refund of it
/// (across Redis Cluster slots, the per-second split, quota mode) — names the same counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceCounter {
    /// The name without its window start (the planner builds it).
    pub base: ReferenceKey,
    /// Start of the window, Unix seconds of the pod's clock, as the reference takes it
    /// (`time.Now().Unix()` when the request is answered); set by [`ReferenceCounter::stamp`].
    pub window_start_secs: u64,
    /// The `EXPIRE` written with every debit: the unit plus the jitter drawn for this
    /// request ([`expiry_secs`]); set by [`ReferenceCounter::stamp`].
    pub expiry_secs: u64,
}

impl ReferenceCounter {
    /// A counter named `base`, not yet stamped.
    pub fn new(base: ReferenceKey) -> ReferenceCounter {
        ReferenceCounter {
            base,
            window_start_secs: 0,
            expiry_secs: 0,
        }
    }

    /// Fixes the window (`now_secs` of the pod's clock) and the expiry (`jitter_max_secs`,
    /// `roll` as [`expiry_secs`] takes them) for a limit of `unit_secs` seconds.
    pub fn stamp(&mut self, now_secs: u64, unit_secs: u64, jitter_max_secs: u64, roll: u64) {
        self.window_start_secs = window_start(now_secs, unit_secs);
        self.expiry_secs = expiry_secs(unit_secs.max(1), jitter_max_secs, roll);
    }

    /// The counter's full Redis key: the base, then the window start in decimal.
    pub fn key(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.base.0.len() + 20);
        self.write_key(&mut out);
        out
    }

    /// Appends [`ReferenceCounter::key`] to `out` (a command's buffer).
    pub fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.base.0);
        push_decimal(out, self.window_start_secs);
    }
}

/// Stamps every reference counter of `ops` with the window of `now_secs` (the pod's clock,
/// as the reference takes it) and an expiry of its unit plus a jitter below
/// `jitter_max_secs`, each drawn by `roll`. Done once per request, before the first store
/// call, so refunds name the very counters the debits did.
pub fn stamp_reference_counters(
    ops: &mut [BucketOp],
    now_secs: u64,
    jitter_max_secs: u64,
    mut roll: impl FnMut() -> u64,
) {
    for op in ops {
        if let Some(counter) = &mut op.reference {
            let unit_secs = op.params.period_us / 1_000_000;
            counter.stamp(now_secs, unit_secs, jitter_max_secs, roll());
        }
    }
}

/// Start of the fixed window holding `now_secs`, as the reference computes it; a zero unit
/// (never configured) is read as one second rather than dividing by zero.
pub fn window_start(now_secs: u64, unit_secs: u64) -> u64 {
    let unit = unit_secs.max(1);
    now_secs / unit * unit
}

/// Seconds until the reference's counter in this window resets (`utils.CalculateReset`).
pub fn window_reset_secs(now_secs: u64, unit_secs: u64) -> u64 {
    let unit = unit_secs.max(1);
    unit - now_secs % unit
}

/// The `EXPIRE` the reference sets on a counter: the unit's length plus `roll` reduced into
/// `[0, jitter_max_secs)` (`roll` is any random number; the caller draws it, so this stays pure).
/// No jitter when `jitter_max_secs` is 0, as in the reference.
pub fn expiry_secs(unit_secs: u64, jitter_max_secs: u64, roll: u64) -> u64 {
    let jitter = if jitter_max_secs == 0 {
        0
    } else {
        roll % jitter_max_secs
    };
    unit_secs.saturating_add(jitter)
}

#[cfg(test)]
mod tests;
