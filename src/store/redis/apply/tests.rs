use redis::{Cmd, Script};

use super::*;
use crate::limiter::LimitParams;

/// A debit (or check) of `edge`/`ip`=`10.0.0.1` at 7 per 60 s, burst 9: the ops these tests
/// and the framing's encode.
pub(crate) fn op(algorithm: Algorithm, cost: i64, enforce: bool) -> BucketOp {
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
pub(crate) fn shared_counter_op() -> BucketOp {
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

/// The command runs the same script as `script()` (its SHA is what EVALSHA sends).
#[test]
fn script_is_the_lua_source() {
    assert_eq!(script().get_hash(), Script::new(SOURCE).get_hash());
    assert!(SOURCE.contains("KEYS[i]") && SOURCE.contains("ARGV[2]"));
    let call = command(b"p:", &[op(Algorithm::TokenBucket, 1, true)], None);
    assert_eq!(words(&call).0[1], script().get_hash());
}
