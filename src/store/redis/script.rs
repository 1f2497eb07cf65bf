//! The Lua script that applies one request's bucket operations inside Redis (`lua/apply.lua`),
//! and the glue around it: how a call is encoded into KEYS/ARGV and how the reply is decoded
//! into an [`Applied`]. The store's [`call`] writes the command ([`write_command`]) into its
//! own connection's buffer and hands the reply's [`payload`] to [`decode`]; a Redis Cluster's
//! store sends the same command built as a redis-rs [`command`].
//!
//! The script computes what [`crate::limiter::evaluate`] and [`crate::bucket::settle`] compute
//! (a randomized equivalence test, `tests/lua_equivalence.rs`, drives both with the same
//! operations and times). Its header documents the layout; in short:
//!
//! ```text
//! KEYS   prefix + BucketKey, one per op (a reference counter: its own name, see op_key)
//! ARGV   now_us ("" = Redis TIME), then one binary string: per op, seven little-endian f64s
//!        flags (algorithm + 4·enforce + 8·overdraft + 16·reference counter + 32·set), then
//!        token bucket: interval, scale, cost, burst, wait (its GCRA constants in ticks,
//!                      limiter::Ticks; interval 0 = rate 0)
//!        windows:      requests_per_period, period_us, cost, burst (a reference counter:
//!                      its EXPIRE, s), 1 + debited_in (0 = None)
//!        then for both: 1 + debited_at (0 = None: not a refund of this server's debit)
//! reply  one binary string of little-endian f64s, each a whole number: committed,
//!        delay_us, now_us (the script's time: each result's at_us), then per op: admitted,
//!        remaining, reset_us, retry_after_us (-1 = never),
//!        window (-1 = None)
//! batch  several requests in one call: every request's KEYS, then now, then one binary
//!        string per request; the reply is theirs concatenated, and a request the script
//!        refuses answers committed -1, its error's code and the op it names (see refused)
//! ```
//!
//! Both directions are binary and the token bucket's constants come computed: the script's
//! time is Redis time every replica shares, so it does only what needs the stored state
//! (docs/performance.md measures it against a minimal GCRA script).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use std::io::Write;

use redis::{
    Cmd, ErrorKind, RedisError, RedisResult, RedisWrite, Script, ServerErrorKind, ToRedisArgs,
};

use super::wire;

use crate::bucket::{Applied, BucketKey, BucketOp, BucketResult};
use crate::limiter::{self, Algorithm, View};
use crate::store::StoreError;

/// The script's source.
pub const SOURCE: &str = include_str!("../../../lua/apply.lua");

/// Reply values per op, after the leading `committed`, `delay_us` and `now_us`.
pub const REPLY_PER_OP: usize = 5;

/// Reply values before the ops': `committed`, `delay_us`, `now_us`.
pub const REPLY_HEADER: usize = 3;

/// Bytes per reply value: a little-endian `f64`.
pub const REPLY_VALUE_BYTES: usize = 8;

/// The script's raw reply: [`reply_len`] values packed as little-endian `f64`s.
pub type Reply = Vec<u8>;

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

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The script, hashed once. [`call`] runs it with EVALSHA and loads it on NOSCRIPT (after a
/// Redis restart or `SCRIPT FLUSH`).
pub fn script() -> &'static Script {
    &SCRIPT
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

/// The seven numbers of one op in ARGV\[2\] (see [`PackedOps`]).
fn op_numbers(op: &BucketOp, action: Action) -> [f64; 7] {
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
    // double, exactly as the script's tonumber rounded the decimal string it once got.
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
/// `EVALSHA <sha> <#ops> KEYS… now ops`, sent with [`call`], then [`decode`]d.
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
/// own op count; each part [`decode`]s alone. One request is exactly [`command`].
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

/// Writes the script call for `ops` as [`command`] builds it, but as RESP straight into
/// `out` (a connection's output buffer, [`wire::Conn::request`]): no `Cmd`, no second copy.
pub fn write_command(
    out: &mut Vec<u8>,
    prefix: &[u8],
    ops: &[BucketOp],
    now_us: Option<i64>,
    action: Action,
) {
    let mut number = Number::default();
    out.push(b'*');
    out.extend_from_slice(number.of(5 + ops.len() as u64));
    out.extend_from_slice(b"\r\n$7\r\nEVALSHA\r\n$40\r\n");
    out.extend_from_slice(script().get_hash().as_bytes());
    out.extend_from_slice(b"\r\n");
    bulk(out, number.of(ops.len() as u64));
    write_keys(out, prefix, ops);
    match now_us {
        Some(now) => bulk(out, now.to_string().as_bytes()),
        None => bulk(out, b""),
    }
    write_blob(out, ops, action);
}

/// The KEYS of `ops` ([`op_key`]), as RESP bulk strings.
fn write_keys(out: &mut Vec<u8>, prefix: &[u8], ops: &[BucketOp]) {
    for op in ops {
        match &op.reference {
            Some(counter) => bulk(out, &counter.key()),
            None => {
                let key = op.key.as_bytes();
                bulk_header(out, (prefix.len() + key.len()) as u64);
                out.extend_from_slice(prefix);
                out.extend_from_slice(key);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// Every op's numbers ([`PackedOps`]), as one RESP bulk string.
fn write_blob(out: &mut Vec<u8>, ops: &[BucketOp], action: Action) {
    bulk_header(out, (ops.len() * OP_BYTES) as u64);
    for op in ops {
        for value in op_numbers(op, action) {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// A RESP bulk string.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    bulk_header(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A RESP bulk string's `$<len>\r\n`.
fn bulk_header(out: &mut Vec<u8>, len: u64) {
    out.push(b'$');
    out.extend_from_slice(Number::default().of(len));
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of a number, without `fmt`'s machinery.
#[derive(Default)]
struct Number([u8; 20]);

impl Number {
    fn of(&mut self, mut n: u64) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &self.0[at..];
            }
        }
    }
}

/// Runs the script for `ops` on `conn` and returns its reply's frame; the script's packed
/// values are its bulk payload ([`payload`]). With Redis `TIME` (`now_us` `None`, production)
/// the call is a [`wire::Conn::script_call`]: the calls written together on the connection go
/// out as one `EVALSHA` (the script's batch convention), each still answered with its own
/// reply; a fixed `now` (tests) is a command of its own ([`write_command`]). Like redis-rs's
/// `ScriptInvocation`, a `NOSCRIPT` answer (after a Redis restart, failover or `SCRIPT
/// FLUSH`) loads the script and sends the call once more; an `OOM` or `READONLY` answer
/// sends it once more alone, not merged (a merged call's is the first write's, perhaps
/// another request's: nothing was written, and a request that writes nothing is answered
/// alone). Any other error reply becomes redis-rs's error for it, so the store classifies it
/// as before.
pub async fn call(
    conn: &wire::Conn,
    prefix: &[u8],
    ops: &[BucketOp],
    now_us: Option<i64>,
) -> RedisResult<wire::Frame> {
    call_doing(conn, prefix, ops, now_us, Action::Apply).await
}

/// [`call`], or a set of `ops`' buckets ([`Action::Set`]).
pub async fn call_doing(
    conn: &wire::Conn,
    prefix: &[u8],
    ops: &[BucketOp],
    now_us: Option<i64>,
    action: Action,
) -> RedisResult<wire::Frame> {
    let reply_bytes = reply_len(ops.len()) * REPLY_VALUE_BYTES;
    let send = || async move {
        match now_us {
            None => {
                conn.script_call(
                    script().get_hash(),
                    ops.len(),
                    reply_bytes,
                    |out| write_keys(out, prefix, ops),
                    |out| write_blob(out, ops, action),
                )
                .await
            }
            Some(_) => {
                conn.request_sized(reply_bytes, |out| {
                    write_command(out, prefix, ops, now_us, action)
                })
                .await
            }
        }
    };
    // After `NOSCRIPT`, loaded (once between the calls that met it together) and sent again;
    // twice at most, for a load another call made on another server (two stores, a
    // failover in between) that left this one's without it. A load the bounds refuse
    // ([`load_once`]) leaves the call with its `NOSCRIPT`, an outage (`errors::classify`).
    let mut loads = 0;
    let reply = loop {
        let seen = LOADS.load(Ordering::Acquire);
        match checked(send().await?) {
            Err(e) if is_noscript(&e) && loads < 2 => {
                if !load_once(conn, seen).await? {
                    break Err(e);
                }
                loads += 1;
            }
            reply => break reply,
        }
    };
    match reply {
        // `OOM` (`maxmemory` under `noeviction`) and `READONLY` (a master demoted by a
        // failover) refuse a script's first write, so nothing was written; merged, they
        // also failed the requests that write nothing (a denied debit, a check), which
        // alone are answered. Sent again alone, each request gets what a call of its own
        // gets: its answer, or the error of its own write.
        Err(e) if now_us.is_none() && matches!(e.code(), Some("OOM" | "READONLY")) => checked(
            conn.request_sized(reply_bytes, |out| {
                write_command(out, prefix, ops, now_us, action)
            })
            .await?,
        ),
        reply => reply,
    }
}

/// `frame` if it is the script's one bulk string, else the error it carries.
fn checked(frame: wire::Frame) -> RedisResult<wire::Frame> {
    if frame.first() == Some(&b'$') {
        return Ok(frame);
    }
    // Rare (an error, or a reply the script cannot give): redis-rs parses it.
    let value = redis::parse_redis_value(&frame)?.extract_error()?;
    Err(RedisError::from((
        ErrorKind::Parse,
        "apply.lua answered something other than a bulk string",
        format!("{value:?}"),
    )))
}

/// The script's packed values in a reply [`call`] returned (empty for a nil reply, which
/// [`decode`] then rejects by its length).
pub fn payload(frame: &[u8]) -> &[u8] {
    wire::bulk_payload(frame).unwrap_or_default()
}

/// Number of values the script answers for `ops` operations.
pub fn reply_len(ops: usize) -> usize {
    REPLY_HEADER + REPLY_PER_OP * ops
}

/// Decodes the script's reply for `ops` operations. Anything the script cannot have produced
/// is [`StoreError::Failed`]: a script/binary mismatch, not an outage.
pub fn decode(reply: &[u8], ops: usize) -> Result<Applied, StoreError> {
    let malformed = |what: String| StoreError::Failed(format!("malformed apply.lua reply: {what}"));
    if reply.len() != reply_len(ops) * REPLY_VALUE_BYTES {
        return Err(malformed(format!(
            "{} bytes for {ops} bucket operations, expected {} values of {REPLY_VALUE_BYTES}",
            reply.len(),
            reply_len(ops)
        )));
    }
    // Every value is a whole number of magnitude below 2^53 (the script computes in doubles):
    // checked for all of them first, then read in place (no intermediate vector of values).
    let at = |i: usize| {
        let mut le = [0u8; REPLY_VALUE_BYTES];
        le.copy_from_slice(&reply[i * REPLY_VALUE_BYTES..(i + 1) * REPLY_VALUE_BYTES]);
        f64::from_le_bytes(le)
    };
    for i in 0..reply_len(ops) {
        let value = at(i);
        if !(value.fract() == 0.0 && value.abs() <= 2f64.powi(53)) {
            return Err(malformed(format!(
                "value {i} is {value}, not a whole number of magnitude at most 2^53"
            )));
        }
    }
    let value = |i: usize| at(i) as i64;
    let flag = |value: i64, name: &str| match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(malformed(format!("{name} is {other}, expected 0 or 1"))),
    };
    let count = |value: i64, name: &str, i: usize| {
        u64::try_from(value)
            .map_err(|_| malformed(format!("{name} of operation {i} is negative ({value})")))
    };
    if value(0) == -1 {
        return Err(refused(value(1), value(2)));
    }
    let committed = flag(value(0), "committed")?;
    let delay_us = u64::try_from(value(1))
        .ok()
        .filter(|&d| d == 0 || committed)
        .ok_or_else(|| malformed(format!("delay_us is {} (committed: {committed})", value(1))))?;
    let now_us = Some(value(2)).filter(|now| (0..=limiter::MAX_NOW_US).contains(now));
    let now_us = now_us.ok_or_else(|| malformed(format!("now_us is {}", value(2))))?;
    let buckets = (0..ops)
        .map(|i| {
            let base = REPLY_HEADER + i * REPLY_PER_OP;
            let values: [i64; REPLY_PER_OP] = std::array::from_fn(|k| value(base + k));
            let admitted = flag(values[0], "admitted")?;
            let view = View {
                remaining: count(values[1], "remaining", i)?,
                reset_us: count(values[2], "reset_us", i)?,
            };
            let retry_after_us = match values[3] {
                -1 if !admitted => None,
                0 if admitted => Some(0),
                r if !admitted && r >= 0 => Some(r.unsigned_abs()),
                r => {
                    return Err(malformed(format!(
                        "retry_after_us of operation {i} is {r} while admitted is {admitted}"
                    )));
                }
            };
            let window = match values[4] {
                -1 => None,
                w if w >= 0 => Some(w),
                w => return Err(malformed(format!("window of operation {i} is {w}"))),
            };
            Ok(BucketResult {
                admitted,
                view,
                retry_after_us,
                window,
                at_us: Some(now_us),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Applied {
        committed,
        buckets,
        from_local_cache: false,
        delay_us,
    })
}

/// Script loads after `NOSCRIPT` so far, and the turn to make one: the calls that met
/// `NOSCRIPT` together (a restart, a failover, `SCRIPT FLUSH`: up to 64 merged into one
/// `EVALSHA`, on every connection of every thread) load the script once between them rather
/// than each sending its ~40 KB, which after a failover would be a burst of loads from every
/// replica. One load is in flight at a time in the process; the turn holds when a refusal
/// was last logged.
static LOADS: AtomicU64 = AtomicU64::new(0);
static LOADING: tokio::sync::Mutex<Option<Instant>> = tokio::sync::Mutex::const_new(None);

/// Loads refused so far: the connection had made [`wire::SCRIPT_LOADS`] within
/// [`wire::SCRIPT_LOAD_WINDOW`] ([`load_once`]).
static REFUSED_LOADS: AtomicU64 = AtomicU64::new(0);

/// Script loads so far: made, and refused by the bound per connection
/// ([`wire::SCRIPT_LOADS`] in any [`wire::SCRIPT_LOAD_WINDOW`]). Each load is logged (info),
/// refusals at most once a second (warn).
pub fn load_counts() -> (u64, u64) {
    (
        LOADS.load(Ordering::Relaxed),
        REFUSED_LOADS.load(Ordering::Relaxed),
    )
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Loads the script unless a load has completed since `seen` (the count read before the
/// call that met `NOSCRIPT` was sent); returns whether the call may be sent again: `false`
/// when the connection may not load now ([`wire::Conn::may_load_script`]: a Redis that
/// keeps forgetting the script, or a peer answering `NOSCRIPT` to everything).
async fn load_once(conn: &wire::Conn, seen: u64) -> RedisResult<bool> {
    let mut logged = LOADING.lock().await;
    if LOADS.load(Ordering::Acquire) != seen {
        return Ok(true);
    }
    let now = Instant::now();
    if !conn.may_load_script(now) {
        let refused = REFUSED_LOADS.fetch_add(1, Ordering::Relaxed) + 1;
        if logged.is_none_or(|at| now >= at + Duration::from_secs(1)) {
            *logged = Some(now);
            tracing::warn!(
                refused,
                "Redis keeps losing floodgate's script: a connection loads it at most {} \
                 times a second, the calls meeting NOSCRIPT meanwhile fail as an outage",
                wire::SCRIPT_LOADS
            );
        }
        return Ok(false);
    }
    script().load_async(&mut conn.clone()).await?;
    let loads = LOADS.fetch_add(1, Ordering::Release) + 1;
    tracing::info!(
        loads,
        "Redis did not have floodgate's script (a restart, failover or SCRIPT FLUSH): loaded it"
    );
    Ok(true)
}

/// The error of a request the script refused in a batch (its reply's `committed` is -1, then
/// the error's `code` and the operation it names, from 1): what the script says of it alone.
fn refused(code: i64, operation: i64) -> StoreError {
    let what = match code {
        1 => "malformed arguments",
        2 => "unknown algorithm",
        3 => "a counter that is not a fixed window",
        4 => "a counter key without a window start",
        _ => "an unknown error",
    };
    StoreError::Failed(format!(
        "apply.lua refused the request: {what} for operation {operation} (code {code})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimitParams;

    fn op(algorithm: Algorithm, cost: i64, enforce: bool) -> BucketOp {
        let params = LimitParams::of(algorithm, 7, 60, 9);
        BucketOp {
            enforce,
            ..BucketOp::debit("edge", "ip", b"10.0.0.1", params, cost)
        }
    }

    /// KEYS are the prefix followed by the bucket key bytes, one per op, in order.
    #[test]
    fn keys_are_prefix_then_bucket_key() {
        let ops = [
            op(Algorithm::TokenBucket, 1, true),
            op(Algorithm::SlidingWindow, 1, true),
        ];
        assert_eq!(
            keys(b"fg:", &ops),
            vec![
                b"fg:edge:ip=10.0.0.1|tb60".to_vec(),
                b"fg:edge:ip=10.0.0.1|sw60".to_vec()
            ]
        );
        assert_eq!(full_key(b"", &ops[0].key), ops[0].key.as_bytes());
    }

    /// The command's words as strings, except the last (the packed ops), returned apart.
    fn words(cmd: &Cmd) -> (Vec<String>, Vec<u8>) {
        let mut words: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("only plain arguments in a script call"),
            })
            .collect();
        let packed = words.pop().unwrap();
        let words = words
            .into_iter()
            .map(|w| String::from_utf8(w).unwrap())
            .collect();
        (words, packed)
    }

    /// The packed ops, decoded as the script's `struct.unpack('<dddddd')` does.
    fn unpack(packed: &[u8]) -> Vec<[f64; 6]> {
        packed
            .chunks_exact(OP_BYTES)
            .map(|op| {
                let mut numbers = [0.0; 6];
                for (n, bytes) in numbers.iter_mut().zip(op.chunks_exact(8)) {
                    *n = f64::from_le_bytes(bytes.try_into().unwrap());
                }
                numbers
            })
            .collect()
    }

    /// `EVALSHA <sha> <#keys>`, the KEYS (prefix + bucket key), then ARGV: now (empty = Redis
    /// TIME) and the packed ops: flags, then a token bucket's interval, scale, cost, burst
    /// and wait in ticks, a window's rate, period, cost, burst and 1 + debited_in.
    #[test]
    fn command_layout() {
        let mut overdraft = op(Algorithm::FixedWindow, -2, false);
        overdraft.params.overdraft = true;
        overdraft.debited_in = Some(28_333_333);
        let ops = [
            op(Algorithm::TokenBucket, 3, true),
            overdraft,
            op(Algorithm::SlidingWindow, i64::MIN, true),
        ];
        let sha = script().get_hash().to_owned();
        let keys: Vec<String> = keys(b"fg:", &ops)
            .into_iter()
            .map(|k| String::from_utf8(k).unwrap())
            .collect();
        let mut whole = vec!["EVALSHA".to_owned(), sha.clone(), "3".to_owned()];
        whole.extend(keys.iter().cloned());
        whole.push(String::new());
        let (words_now, packed) = words(&command(b"fg:", &ops, None));
        assert_eq!(words_now, whole);
        assert_eq!(
            unpack(&packed),
            [
                // token bucket (0) + enforce (4): T = ceil(60 s / 7) in whole µs (precise
                // enough: no finer ticks), scale 1, burst 9, no wait
                [4.0, 8_571_429.0, 1.0, 3.0, 9.0, 0.0],
                // fixed window (1) + overdraft (8), shadow; a refund of window 28333333
                [9.0, 7.0, 60_000_000.0, -2.0, 9.0, 28_333_334.0],
                // sliding window (2) + enforce (4); i64::MIN is a power of two, exact
                [
                    6.0,
                    7.0,
                    60_000_000.0,
                    -9_223_372_036_854_775_808.0,
                    9.0,
                    0.0
                ],
            ]
        );
        assert_eq!(keys[0], "fg:edge:ip=10.0.0.1|tb60");
        assert_eq!(
            words(&command(b"fg:", &ops, Some(1_750_000_000_123_456))).0[6],
            "1750000000123456"
        );
        let (empty, packed) = words(&command(b"", &[], Some(5)));
        assert_eq!(empty, ["EVALSHA", &sha, "0", "5"]);
        assert!(packed.is_empty());
    }

    /// A fixed window of cost 2 on a counter shared with reference pods (`rl_edge_ip_…`,
    /// stamped in the minute starting at 1_700_000_100).
    fn shared_counter_op() -> BucketOp {
        use crate::bucket::{ReferenceCounter, ReferenceKey};
        let mut counter = ReferenceCounter::new(ReferenceKey::new(
            b"rl_",
            "edge",
            [(&b"ip"[..], &b"10.0.0.1"[..])],
        ));
        counter.stamp(1_700_000_123, 60, 0, 0);
        let mut shared = op(Algorithm::FixedWindow, 2, true);
        shared.reference = Some(counter);
        shared
    }

    /// A reference counter's KEYS entry is its own name (the store's prefix is not added)
    /// ending with the stamped window start, and its numbers carry flag 16 and its EXPIRE in
    /// the burst slot.
    #[test]
    fn reference_counter_layout() {
        let shared = shared_counter_op();
        let ops = [shared, op(Algorithm::FixedWindow, 1, false)];
        assert_eq!(
            keys(b"fg:", &ops),
            vec![
                b"rl_edge_ip_10.0.0.1_1700000100".to_vec(),
                b"fg:edge:ip=10.0.0.1|fw60".to_vec()
            ]
        );
        let (words, packed) = words(&command(b"fg:", &ops, None));
        assert_eq!(words[3], "rl_edge_ip_10.0.0.1_1700000100");
        assert_eq!(
            unpack(&packed),
            [
                // fixed window (1) + enforce (4) + counter (16); EXPIRE 60 s
                [21.0, 7.0, 60_000_000.0, 2.0, 60.0, 0.0],
                [1.0, 7.0, 60_000_000.0, 1.0, 9.0, 0.0],
            ]
        );
    }

    /// The RESP the store writes itself is byte for byte what redis-rs packs for
    /// [`command`]: every kind of op, a reference counter, `now` given or not, no op at all.
    #[test]
    fn written_command_is_the_packed_command() {
        let shared = shared_counter_op();
        let mut overdraft = op(Algorithm::FixedWindow, -2, false);
        overdraft.params.overdraft = true;
        overdraft.debited_in = Some(28_333_333);
        let ops = [
            op(Algorithm::TokenBucket, 3, true),
            overdraft,
            shared,
            op(Algorithm::SlidingWindow, i64::MIN, true),
        ];
        for (ops, now) in [
            (&ops[..], None),
            (&ops[..], Some(1_750_000_000_123_456)),
            (&ops[..1], Some(-5)),
            (&[][..], None),
        ] {
            let mut written = b"leftover".to_vec();
            write_command(&mut written, b"fg:", ops, now, Action::Apply);
            let mut packed = b"leftover".to_vec();
            packed.extend_from_slice(&command(b"fg:", ops, now).get_packed_command());
            assert_eq!(written, packed, "{} ops, now {now:?}", ops.len());
        }
    }

    /// A batch of one request is exactly that request's own call; a batch of several has
    /// every request's keys in order, then `now`, then one packed blob per request.
    #[test]
    fn batch_command_layout() {
        let first = [op(Algorithm::TokenBucket, 3, true), shared_counter_op()];
        let second = [op(Algorithm::SlidingWindow, 1, false)];
        for now in [None, Some(1_750_000_000_123_456)] {
            assert_eq!(
                batch_command(b"fg:", &[&first], now).get_packed_command(),
                command(b"fg:", &first, now).get_packed_command()
            );
        }
        let args: Vec<Vec<u8>> = batch_command(b"fg:", &[&first, &second], None)
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("only plain arguments in a script call"),
            })
            .collect();
        let text: Vec<&[u8]> = vec![
            b"EVALSHA",
            script().get_hash().as_bytes(),
            b"3",
            b"fg:edge:ip=10.0.0.1|tb60",
            b"rl_edge_ip_10.0.0.1_1700000100",
            b"fg:edge:ip=10.0.0.1|sw60",
            b"",
        ];
        assert_eq!(args[..7], text);
        assert_eq!(args.len(), 9);
        assert_eq!(args[7], words(&command(b"fg:", &first, None)).1);
        assert_eq!(args[8], words(&command(b"fg:", &second, None)).1);
    }

    /// A request the script refused in a batch (committed -1, the error's code and the
    /// operation) is `Failed` naming both, not a malformed reply.
    #[test]
    fn decode_refused_request() {
        let reply = packed(&[-1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let err = decode(&reply, 1).unwrap_err();
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            StoreError::Failed(
                "apply.lua refused the request: unknown algorithm for operation 3 (code 2)".into()
            )
            .to_string()
        );
    }

    /// The command runs the same script as `script()` (its SHA is what EVALSHA sends).
    #[test]
    fn script_is_the_lua_source() {
        assert_eq!(script().get_hash(), Script::new(SOURCE).get_hash());
        assert!(SOURCE.contains("KEYS[i]") && SOURCE.contains("ARGV[2]"));
        let call = command(b"p:", &[op(Algorithm::TokenBucket, 1, true)], None);
        assert_eq!(words(&call).0[1], script().get_hash());
    }

    /// A reply as the script packs it: little-endian f64s.
    fn packed(values: &[f64]) -> Reply {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A well-formed reply decodes into the results settle() would give.
    #[test]
    fn decode_reply() {
        let reply = packed(&[
            0.0,
            0.0,
            1_700_000_000_000_000.0,
            1.0,
            4.0,
            1_500.0,
            0.0,
            28_333_333.0,
            0.0,
            0.0,
            6e7,
            5.9e7,
            -1.0,
            0.0,
            2.0,
            0.0,
            -1.0,
            -1.0,
        ]);
        let applied = decode(&reply, 3).unwrap();
        assert_eq!(
            applied,
            Applied {
                committed: false,
                from_local_cache: false,
                delay_us: 0,
                buckets: vec![
                    BucketResult {
                        admitted: true,
                        view: View {
                            remaining: 4,
                            reset_us: 1_500
                        },
                        retry_after_us: Some(0),
                        window: Some(28_333_333),
                        at_us: Some(1_700_000_000_000_000),
                    },
                    BucketResult {
                        admitted: false,
                        view: View {
                            remaining: 0,
                            reset_us: 60_000_000
                        },
                        retry_after_us: Some(59_000_000),
                        window: None,
                        at_us: Some(1_700_000_000_000_000),
                    },
                    BucketResult {
                        admitted: false,
                        view: View {
                            remaining: 2,
                            reset_us: 0
                        },
                        retry_after_us: None,
                        window: None,
                        at_us: Some(1_700_000_000_000_000),
                    },
                ],
            }
        );
        assert_eq!(
            decode(&packed(&[1.0, 0.0, 5.0]), 0).unwrap(),
            Applied {
                committed: true,
                buckets: vec![],
                from_local_cache: false,
                delay_us: 0,
            }
        );
    }

    /// Replies the script cannot produce are `Failed` (not transient) with a clear message.
    #[test]
    fn decode_rejects_malformed_replies() {
        let cases: [(&[f64], usize, &str); 14] = [
            (
                &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0],
                1,
                "56 bytes for 1 bucket operations, expected 8 values of 8",
            ),
            (&[1.0], 1, "8 bytes"),
            (
                &[1.0, 0.0, -5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
                1,
                "now_us is -5",
            ),
            (
                &[2.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
                1,
                "committed is 2",
            ),
            (
                &[1.0, 0.0, 5.0, 3.0, 0.0, 0.0, 0.0, -1.0],
                1,
                "admitted is 3",
            ),
            (
                &[1.0, 0.0, 5.0, 1.0, -1.0, 0.0, 0.0, -1.0],
                1,
                "remaining of operation 0 is negative",
            ),
            (
                &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 5.0, -1.0],
                1,
                "retry_after_us of operation 0 is 5 while admitted is true",
            ),
            (
                &[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, -2.0, -1.0],
                1,
                "retry_after_us of operation 0 is -2",
            ),
            (
                &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0, -2.0],
                1,
                "window of operation 0 is -2",
            ),
            (
                &[1.0, -1.0, 5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
                1,
                "delay_us is -1",
            ),
            (
                &[0.0, 5.0, 5.0, 0.0, 0.0, 0.0, 7.0, -1.0],
                1,
                "delay_us is 5 (committed: false)",
            ),
            (
                &[1.0, 0.0, 5.0, 1.0, 0.5, 0.0, 0.0, -1.0],
                1,
                "value 4 is 0.5, not a whole number",
            ),
            (
                &[1.0, 0.0, 5.0, 1.0, f64::NAN, 0.0, 0.0, -1.0],
                1,
                "value 4 is NaN",
            ),
            (
                &[
                    1.0,
                    0.0,
                    5.0,
                    1.0,
                    1_152_921_504_606_846_976.0,
                    0.0,
                    0.0,
                    -1.0,
                ],
                1,
                "value 4 is 1152921504606847000, not a whole number",
            ),
        ];
        for (reply, ops, message) in cases {
            let err = decode(&packed(reply), ops).unwrap_err();
            assert!(!err.is_transient());
            assert!(err.to_string().contains(message), "{err} lacks {message:?}");
        }
    }

    /// `wire::LARGEST_MERGED_REPLY` (which fits in `wire::MAX_REPLY`, checked at compile
    /// time) is this script's reply format at the merge caps, framed as a bulk string.
    #[test]
    fn the_largest_merged_reply_fits_the_cap() {
        use super::super::wire::{LARGEST_MERGED_REPLY, MERGE_CALLS, MERGE_KEYS};
        let payload = MERGE_CALLS * reply_len(0) * REPLY_VALUE_BYTES
            + (reply_len(MERGE_KEYS) - reply_len(0)) * REPLY_VALUE_BYTES;
        let framed = format!("${payload}\r\n").len() + payload + 2;
        assert!(framed <= LARGEST_MERGED_REPLY, "{framed}");
    }
}
