//! What Redis holds or is sent that the script did not write: garbage state read as absent
//! or clamped, and calls that break the KEYS/ARGV layout answered with an error.

use super::common::*;

/// What a corrupted key holds before the script runs.
pub(crate) enum Corrupt {
    Text(&'static str),
    Hash(&'static [(&'static str, &'static str)]),
    /// A hash `{w: <NOW's 60 s window + offset>, c: <count>}` plus these extra fields.
    Window(i64, &'static str, &'static [(&'static str, &'static str)]),
    List,
}

/// Keys of the wrong type, another algorithm's shape or unparseable values read as absent
/// (never an error), out-of-range numbers are clamped like the Rust clamps them, and the
/// write replaces whatever was there.
#[tokio::test]
async fn garbage_state_is_absent_or_clamped() {
    use Corrupt::*;
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let index = NOW / 60_000_000;
    let tb = params(Algorithm::TokenBucket, 10, 60, 10);
    let fw = params(Algorithm::FixedWindow, 10, 60, 0);
    let sw = params(Algorithm::SlidingWindow, 10, 60, 0);
    let huge_count = State::FixedWindow {
        window: index,
        count: 99_999_999_999,
    };
    let zero_fixed = State::FixedWindow {
        window: index + 1,
        count: 0,
    };
    let zero_sliding = State::SlidingWindow {
        window: index + 1,
        current: 0,
        previous: 0,
    };
    // (limit, what the key holds, the state the Rust limiter would be given)
    let cases = [
        (tb, Hash(&[("w", "1")]), None),
        (tb, Text("abc"), None),
        (tb, Text("1.5e15"), None),
        (tb, Text("5."), None),
        (tb, Text(".5"), None),
        (tb, Text("5.0000000000"), None),
        (tb, Text("5.-1"), None),
        (tb, Text("5.1.2"), None),
        (tb, Text(""), None),
        (tb, List, None),
        (
            tb,
            Text("99999999999999999999999"),
            Some(State::TokenBucket {
                tat: Tat::from_us(i64::MAX),
            }),
        ),
        (
            tb,
            Text("-99999999999999999999999"),
            Some(State::TokenBucket {
                tat: Tat::from_us(i64::MIN),
            }),
        ),
        (fw, Text("12"), None),
        (fw, List, None),
        (fw, Hash(&[("w", "x"), ("c", "1")]), None),
        (fw, Hash(&[("c", "3")]), None),
        (fw, Window(0, "99999999999", &[]), Some(huge_count)),
        (sw, Window(0, "-4", &[("p", "1")]), None),
        // Zero counters are absent even in a later window (they must not hold the clock).
        (fw, Window(1, "0", &[]), Some(zero_fixed)),
        (sw, Window(1, "0", &[("p", "0")]), Some(zero_sliding)),
        (sw, Hash(&[("w", "-1"), ("c", "4"), ("p", "1")]), None),
        (
            sw,
            Hash(&[("w", "99999999999999999999"), ("c", "4"), ("p", "1")]),
            None,
        ),
        // Another algorithm's shape is absent too (the script tells them apart by `p`).
        (sw, Window(0, "4", &[]), None),
        (fw, Window(0, "4", &[("p", "0")]), None),
    ];
    for (i, (params, corrupt, state)) in cases.into_iter().enumerate() {
        let ops = vec![op(&format!("g{i}"), params, 2, true)];
        let key = &redis_keys(&ops)[0];
        let cmd = match corrupt {
            Text(v) => redis::cmd("SET").arg(key).arg(v).to_owned(),
            Hash(fields) => redis::cmd("HSET").arg(key).arg(fields).to_owned(),
            Window(offset, count, extra) => redis::cmd("HSET")
                .arg(key)
                .arg(&[("w", (index + offset).to_string()), ("c", count.to_owned())])
                .arg(extra)
                .to_owned(),
            List => redis::cmd("RPUSH").arg(key).arg("1").to_owned(),
        };
        let () = cmd.query_async(&mut conn).await.unwrap();
        let got = lua_kept(&mut conn, &ops, NOW).await;
        assert_eq!(got, spec(&ops, &[state], NOW), "case {i}");
        let next = limiter::evaluate(&params, state.as_ref(), NOW, 2).next;
        if let Some((written, _)) = next.filter(|_| got.committed) {
            assert_eq!(redis_state(&mut conn, key).await, Some(written), "case {i}");
        }
    }
}

/// Packs one op's first six numbers as `script::command` does, seven little-endian f64s: the
/// seventh (`debited_at`) 0, none.
pub(crate) fn packed(numbers: [f64; 6]) -> Vec<u8> {
    numbers
        .iter()
        .chain(&[0.0])
        .flat_map(|n| n.to_le_bytes())
        .collect()
}

/// A call that does not follow the KEYS/ARGV layout is an error reply, not a guess, and
/// writes nothing (a batch's framing too: blobs that do not divide into its KEYS).
#[tokio::test]
async fn malformed_call_is_an_error() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    // A token bucket's (flags, interval, scale, cost, burst, wait), what the error says
    let good = [4.0, 1.0, 1e6, 1.0, 1.0, 0.0];
    let cases: [([f64; 6], &str); 12] = [
        ([4.0, 1.0, 0.0, 1.0, 1.0, 0.0], "malformed arguments"),
        ([3.0, 1.0, 1e6, 1.0, 1.0, 0.0], "unknown algorithm"),
        ([64.0, 1.0, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        (
            [20.0, 1.0, 1e6, 1.0, 1.0, 0.0],
            "a counter must be a fixed window",
        ),
        (
            [21.0, 1.0, 1e6, 1.0, 60.0, 0.0],
            "no window start in counter key",
        ),
        ([4.5, 1.0, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.5, 1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.0, -1e6, 1.0, 1.0, 0.0], "malformed arguments"),
        ([4.0, 1.0, 1e6, f64::NAN, 1.0, 0.0], "malformed arguments"),
        (
            [4.0, 1.0, 1e6, 1.0, f64::INFINITY, 0.0],
            "malformed arguments",
        ),
        ([4.0, 1.0, 1e6, 1.0, 1.0, -1.0], "malformed arguments"),
        ([4.0, 1.0, 1e6, 1.0, 1.0, 0.5], "malformed arguments"),
    ];
    let mut calls: Vec<(Vec<Vec<u8>>, &str)> = cases
        .into_iter()
        .map(|(numbers, message)| (vec![Vec::new(), packed(numbers)], message))
        .collect();
    calls.push((
        vec![Vec::new()],
        "expected 2 arguments (now, then one per request), got 1",
    ));
    // A batch whose blobs do not divide into operations, or whose operations are not #KEYS.
    calls.push((
        vec![Vec::new(), packed(good), packed(good)[..55].to_vec()],
        "request 2 has 55 bytes of operations, not a multiple of 56",
    ));
    calls.push((
        vec![Vec::new(), packed(good), packed(good)],
        "expected 2 keys for the operations of 2 requests, got 1",
    ));
    calls.push((
        vec![Vec::new(), packed(good)[..55].to_vec()],
        "expected 56 bytes of operations for 1 keys, got 55",
    ));
    // A refund's `debited_at` (the seventh number) that is not a whole number ≥ 0.
    for debited_at in [-1.0f64, 0.5] {
        let mut blob = packed([4.0, 1.0, 1e6, -1.0, 1.0, 0.0]);
        blob[48..].copy_from_slice(&debited_at.to_le_bytes());
        calls.push((vec![Vec::new(), blob], "malformed arguments"));
    }
    calls.push((vec![b"x".to_vec(), packed(good)], "now is not an integer"));
    for (args, message) in calls {
        let mut call = script::script().prepare_invoke();
        call.key("k");
        for arg in &args {
            call.arg(arg.as_slice());
        }
        let err = call
            .invoke_async::<script::Reply>(&mut conn)
            .await
            .unwrap_err();
        let err = err.to_string();
        assert!(err.contains("floodgate apply.lua"), "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err} lacks {message:?}");
    }
    let count: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(count, 0, "a malformed call wrote something");
}
