//! The Lua script that applies one request's bucket operations inside Redis (`lua/apply.lua`),
//! and the glue around it: how a call is sent (loading the script where Redis lacks it) and
//! how the reply is decoded into an [`Applied`]. The store's [`call`] hands its connection the call as data
//! ([`ScriptCall`], from [`super::apply`]), which the connection encodes into its own buffer,
//! and hands the reply's [`payload`] to [`decode`]; a Redis Cluster's store sends the same
//! command built as a redis-rs [`command`].
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::time::Instant;

use super::wire::{self, Call};

pub use super::apply::{
    Action, OP_BYTES, REPLY_HEADER, REPLY_PER_OP, REPLY_VALUE_BYTES, SOURCE, ScriptCall,
    batch_command, command, command_doing, full_key, keys, op_key, reply_len, script, set_command,
};
use crate::bucket::{Applied, BucketOp, BucketResult};
use crate::limiter::{self, View};
use crate::store::StoreError;

/// The script's raw reply: [`reply_len`] values packed as little-endian `f64`s.
pub type Reply = Vec<u8>;

/// Runs the script for `ops` on `conn` and returns its reply's frame; the script's packed
/// values are its bulk payload ([`payload`]). The call goes down as data ([`ScriptCall`]),
/// which the connection encodes into its own buffer. With Redis `TIME` (`now_us` `None`,
/// production) it is a [`Call::Script`]: the calls written together on the connection go out
/// as one `EVALSHA` (the script's batch convention), each still answered with its own
/// reply; a fixed `now` (tests) is a command of its own ([`Call::Alone`]). Like redis-rs's
/// `ScriptInvocation`, a `NOSCRIPT` answer (after a Redis restart, failover or `SCRIPT
/// FLUSH`) loads the script and sends the call once more; an `OOM` or `READONLY` answer
/// sends it once more alone, not merged (a merged call's is the first write's, perhaps
/// another request's: nothing was written, and a request that writes nothing is answered
/// alone). Any other error reply becomes redis-rs's error for it, which the store classifies
/// (`errors::classify`).
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
    let script_call = ScriptCall::new(prefix, ops, now_us, action);
    let first = match now_us {
        None => Call::Script(script_call),
        Some(_) => Call::Alone(script_call),
    };
    // After `NOSCRIPT`, loaded (once between the calls that met it together) and sent again;
    // twice at most, for a load another call made on another server (two stores, a
    // failover in between) that left this one's without it. A load the bounds refuse
    // ([`load_once`]) leaves the call with its `NOSCRIPT`, an outage (`errors::classify`).
    let mut loads = 0;
    let reply = loop {
        let seen = LOADS.load(Ordering::Acquire);
        match checked(conn.call(&first).await?) {
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
        Err(e) if now_us.is_none() && matches!(e.code(), Some("OOM" | "READONLY")) => {
            checked(conn.call(&Call::Alone(script_call)).await?)
        }
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
    // Whole: equal to its conversion to i64 and back, exact in that range (NaN and the
    // infinities fail the magnitude test first); cheaper than `fract`, a call to libm's
    // `trunc` per value on baseline x86-64.
    let at = |i: usize| {
        let mut le = [0u8; REPLY_VALUE_BYTES];
        le.copy_from_slice(&reply[i * REPLY_VALUE_BYTES..(i + 1) * REPLY_VALUE_BYTES]);
        f64::from_le_bytes(le)
    };
    for i in 0..reply_len(ops) {
        let value = at(i);
        if !(value.abs() <= 2f64.powi(53) && value == value as i64 as f64) {
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
mod tests;
