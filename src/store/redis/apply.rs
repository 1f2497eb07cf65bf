//! `lua/apply.lua` as data: its source and SHA1, one call of it described as a value
//! ([`ScriptCall`]: which buckets, what to do to them, at what time), the KEYS and ARGV that
//! call stands for, and the length of the reply it asks for.
//!
//! Below both the script's caller ([`super::script`]) and the connections ([`super::wire`]):
//! the caller describes a call and hands it down; a connection encodes it (`wire::frame`,
//! alone, or `wire::merge`, merged with the calls written with it) straight into its output
//! buffer; a Redis Cluster's store sends the same call built as a redis-rs [`Cmd`]
//! ([`command`]). Nothing here does I/O.

use std::io::Write;
use std::sync::LazyLock;

use redis::{Cmd, RedisWrite, Script, ToRedisArgs};

use crate::bucket::{BucketKey, BucketOp};
use crate::limiter::{self, Algorithm};

/// The script's source.
pub const SOURCE: &str = include_str!("../../../lua/apply.lua");

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The script, hashed once. `script::call` runs it with EVALSHA and loads it on NOSCRIPT
/// (after a Redis restart or `SCRIPT FLUSH`).
pub fn script() -> &'static Script {
    &SCRIPT
}

/// Reply values per op, after the leading `committed`, `delay_us` and `now_us`.
pub const REPLY_PER_OP: usize = 5;

/// Reply values before the ops': `committed`, `delay_us`, `now_us`.
pub const REPLY_HEADER: usize = 3;

/// Bytes per reply value: a little-endian `f64`.
pub const REPLY_VALUE_BYTES: usize = 8;

/// Bytes per op in ARGV\[2\]: seven little-endian `f64`s.
pub const OP_BYTES: usize = 56;

/// The flags value of an op: the algorithm in the low two bits, then one bit each.
const ENFORCE: u8 = 4;
const OVERDRAFT: u8 = 8;
const COUNTER: u8 = 16;
const SET: u8 = 32;

/// What a script call does with the buckets' stored states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Evaluates each op against its bucket's state ([`crate::store::Store::apply`]).
    Apply,
    /// Replaces each bucket's state with what a full bucket holds after the op's debit,
    /// whatever it held ([`crate::store::Store::set`]): the set flag on every op.
    Set,
}

/// One call of the script, as data: what goes down to a connection, which encodes it
/// (`EVALSHA sha #ops KEYS… now ops`, see [`command`]) into its own buffer. Borrowed from
/// the request: describing a call allocates nothing.
#[derive(Clone, Copy, Debug)]
pub struct ScriptCall<'a> {
    /// The script's SHA1 (calls of one script merge; [`script`]'s for the store's calls).
    pub sha: &'static str,
    /// The key prefix of floodgate's own buckets ([`full_key`]).
    pub prefix: &'a [u8],
    /// The bucket operations: one key and [`OP_BYTES`] of ARGV each.
    pub ops: &'a [BucketOp],
    /// The script's time (`None`: Redis `TIME`, the production choice; `Some` in tests).
    pub now_us: Option<i64>,
    /// What the script does with the buckets.
    pub action: Action,
    /// The bytes of the reply's payload: [`reply_len`] values of [`REPLY_VALUE_BYTES`].
    pub reply_bytes: usize,
}

impl<'a> ScriptCall<'a> {
    /// The store's script doing `action` to `ops` at `now_us`.
    pub fn new(
        prefix: &'a [u8],
        ops: &'a [BucketOp],
        now_us: Option<i64>,
        action: Action,
    ) -> ScriptCall<'a> {
        ScriptCall {
            sha: script().get_hash(),
            prefix,
            ops,
            now_us,
            action,
            reply_bytes: reply_len(ops.len()) * REPLY_VALUE_BYTES,
        }
    }
}

/// Number of values the script answers for `ops` operations.
pub fn reply_len(ops: usize) -> usize {
    REPLY_HEADER + REPLY_PER_OP * ops
}

/// The Redis key of a bucket: the configured prefix followed by the key bytes.
pub fn full_key(prefix: &[u8], key: &BucketKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.as_bytes().len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(key.as_bytes());
    out
}

/// The Redis key of an op: [`full_key`], or for a counter shared with reference pods the
/// reference's own name (its prefix is in it) with the op's window start.
pub fn op_key(prefix: &[u8], op: &BucketOp) -> Vec<u8> {
    match &op.reference {
        Some(counter) => counter.key(),
        None => full_key(prefix, &op.key),
    }
}

/// KEYS for `ops`, in order.
pub fn keys(prefix: &[u8], ops: &[BucketOp]) -> Vec<Vec<u8>> {
    ops.iter().map(|op| op_key(prefix, op)).collect()
}

/// The `KEYS` entry of one op ([`op_key`]), written straight into the command's buffer (no
/// intermediate `Vec` for floodgate's own keys).
struct FullKey<'a>(&'a [u8], &'a BucketOp);

impl ToRedisArgs for FullKey<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's Vec<u8>, which cannot fail.
        match &self.1.reference {
            Some(counter) => {
                let _ = arg.write_all(&counter.key());
            }
            None => {
                let _ = arg.write_all(self.0);
                let _ = arg.write_all(self.1.key.as_bytes());
            }
        }
    }
}

/// ARGV\[2\]: every op's numbers, packed as `lua/apply.lua` unpacks them (seven little-endian
/// `f64`s per op; a token bucket's are its [`limiter::Ticks`]), written straight into the
/// command's buffer.
struct PackedOps<'a>(&'a [BucketOp], Action);

impl ToRedisArgs for PackedOps<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for op in self.0 {
            for number in op_numbers(op, self.1) {
                // Writes into the command's Vec<u8>, which cannot fail.
                let _ = arg.write_all(&number.to_le_bytes());
            }
        }
    }
}

/// The seven numbers of one op in ARGV\[2\], as `lua/apply.lua` unpacks them.
pub fn op_numbers(op: &BucketOp, action: Action) -> [f64; 7] {
    let params = &op.params;
    let flags = match params.algorithm {
        Algorithm::TokenBucket => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
    } | if op.enforce { ENFORCE } else { 0 }
        | if params.overdraft { OVERDRAFT } else { 0 }
        | if op.reference.is_some() { COUNTER } else { 0 }
        | if action == Action::Set { SET } else { 0 };
    // A refund of this server's own debit names the debit's time (plus one: 0 is none), so
    // the script drops it when the bucket was set since.
    let debited_at = op
        .debited_at
        .filter(|_| op.cost < 0)
        .map_or(0, |at| at.clamp(0, limiter::MAX_NOW_US) + 1) as f64;
    // Lua 5.1 numbers are doubles: `as f64` rounds a value above 2^53 to the nearest
    // double, exactly as Lua's `tonumber` rounds the same value written in decimal.
    match (params.algorithm, &op.reference) {
        // The GCRA constants, computed here rather than in Redis on every call; all
        // are below 2^53. Rate 0 (nothing passes) is an interval of 0.
        (Algorithm::TokenBucket, None) => {
            let ticks = limiter::ticks(params).unwrap_or(limiter::Ticks {
                interval: 0,
                scale: 1,
                burst: 0,
                wait: 0,
            });
            [
                f64::from(flags),
                ticks.interval as f64,
                ticks.scale as f64,
                op.cost as f64,
                ticks.burst as f64,
                ticks.wait as f64,
                debited_at,
            ]
        }
        // A reference counter has no burst; its slot carries the counter's EXPIRE.
        // A window has no max_wait (validation refuses it); its slot carries the
        // window a refund's debit was counted in, plus one (0: the current window).
        (_, reference) => [
            f64::from(flags),
            params.requests_per_period as f64,
            params.period_us as f64,
            op.cost as f64,
            reference.as_ref().map_or(params.burst, |c| c.expiry_secs) as f64,
            op.debited_in.map_or(0, |w| w.max(0) + 1) as f64,
            debited_at,
        ],
    }
}

/// The script call for `ops` (all of which must live in one Redis Cluster slot):
/// `EVALSHA <sha> <#ops> KEYS… now ops`, as a redis-rs [`Cmd`] (a Redis Cluster's store sends
/// it; a [`ScriptCall`] is the same call, which a connection of floodgate's own writes), its
/// reply then [`super::script::decode`]d.
///
/// ARGV is `now_us` (`None` = empty: let Redis `TIME` decide, the production choice so
/// replicas agree; `Some` only for tests), then every op's numbers packed into one binary
/// string ([`OP_BYTES`] per op; the layout is documented in `lua/apply.lua`): the script
/// decodes each op with one `struct.unpack` instead of parsing a decimal string per value.
/// Everything is written once into the command's single buffer, with no per-value allocation.
pub fn command(prefix: &[u8], ops: &[BucketOp], now_us: Option<i64>) -> Cmd {
    command_doing(prefix, ops, now_us, Action::Apply)
}

/// The script call that sets `ops`' buckets ([`Action::Set`]), built as [`command`] builds
/// an ordinary one.
pub fn set_command(prefix: &[u8], ops: &[BucketOp], now_us: Option<i64>) -> Cmd {
    command_doing(prefix, ops, now_us, Action::Set)
}

/// [`command`] or [`set_command`].
pub fn command_doing(prefix: &[u8], ops: &[BucketOp], now_us: Option<i64>, action: Action) -> Cmd {
    let bytes: usize = ops
        .iter()
        .map(|op| prefix.len() + op.key.as_bytes().len() + 20 + OP_BYTES)
        .sum();
    let mut cmd = Cmd::with_capacity(5 + ops.len(), 80 + bytes);
    cmd.arg("EVALSHA").arg(script().get_hash()).arg(ops.len());
    for op in ops {
        cmd.arg(FullKey(prefix, op));
    }
    match now_us {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    cmd.arg(PackedOps(ops, action));
    cmd
}

/// One script call for several requests (`lua/apply.lua`'s batch convention): `EVALSHA <sha>
/// <K> KEYS… now blob_1 … blob_N`, the requests' keys concatenated and one packed blob per
/// request. Its reply is the requests' replies concatenated, request j's [`reply_len`] of its
/// own op count; each part [`super::script::decode`]s alone. One request is exactly [`command`].
pub fn batch_command(prefix: &[u8], requests: &[&[BucketOp]], now_us: Option<i64>) -> Cmd {
    let ops: usize = requests.iter().map(|ops| ops.len()).sum();
    let mut cmd = Cmd::new();
    cmd.arg("EVALSHA").arg(script().get_hash()).arg(ops);
    for op in requests.iter().flat_map(|ops| ops.iter()) {
        cmd.arg(FullKey(prefix, op));
    }
    match now_us {
        Some(now) => cmd.arg(now),
        None => cmd.arg(""),
    };
    for ops in requests {
        cmd.arg(PackedOps(ops, Action::Apply));
    }
    cmd
}

#[cfg(test)]
pub(crate) mod tests;
