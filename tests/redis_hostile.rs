//! The Redis store against a hostile peer in place of Redis (a broken server, or a man in the
//! middle of a plaintext link), played in-process on a loopback port: replies that never end
//! (an array announcing 2^31 − 1 elements then endless elements, a bulk string announced at
//! 512 MiB, endless garbage), a legitimate reply cut into single bytes, a reply that stalls
//! past the deadline, and `NOSCRIPT` to everything. Memory, the bytes the store reads, its
//! connections and its script loads stay bounded, and every call is answered by its deadline
//! plus a margin (docs/reliability.md, "A hostile Redis").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate::bucket::{BucketKey, BucketOp, KeyValue};
use floodgate::limiter::{Algorithm, LimitParams};
use floodgate::store::redis::{RedisSettings, RedisStore, script, wire};
use floodgate::store::{Store, StoreError};
use support::h2raw::rss_bytes;
use support::redis_settings;

/// What the tests allow past a call's deadline for its answer: the connection's task
/// answers a late call on its next pass (docs/reliability.md), far less than this on an idle
/// machine; the rest is room for a loaded test machine. Without the deadline these peers
/// would hold the call for ever, so any bound proves it.
const MARGIN: Duration = Duration::from_secs(1);

/// The most the test process's memory may grow while a peer floods.
const RSS_GROWTH: u64 = 16 << 20;

/// The most bytes a flooding peer may get out before the store closes its connection: the
/// reply cap (32 KiB) and one read, plus what the loopback socket buffers hold (a few MiB).
const FLOOD_SENT: u64 = 16 << 20;

/// Where a flooding peer gives up (the test then fails on [`FLOOD_SENT`]).
const FLOOD_LIMIT: u64 = 256 << 20;

/// One debit of a token bucket of 5 a day.
fn op() -> BucketOp {
    let params = LimitParams {
        algorithm: Algorithm::TokenBucket,
        requests_per_period: 5,
        period_us: 86_400_000_000,
        burst: 5,
        overdraft: false,
        max_wait_us: 0,
    };
    BucketOp {
        key: BucketKey::new(
            "hostile",
            [(&b"k"[..], KeyValue::Value(b"v"))],
            params.algorithm,
            params.period_us,
        ),
        params,
        cost: 1,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    }
}

/// A store on the peer at `url`, with `timeout` per call.
fn store(url: &str, timeout: Duration) -> RedisStore {
    RedisStore::new(&RedisSettings {
        command_timeout: timeout,
        ..redis_settings(url)
    })
    .unwrap()
}

/// One command a client sent: its words.
fn read_command(reader: &mut impl BufRead) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut words = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut word = vec![0; len + 2];
        reader.read_exact(&mut word).ok()?;
        word.truncate(len);
        words.push(word);
    }
    Some(words)
}

/// A peer on a loopback port that answers every connection's commands with `answer` (given
/// the command's words and the socket to write to; it returns whether to go on), each
/// connection on a thread of its own. Returns the store URL.
fn peer(answer: impl Fn(&[Vec<u8>], &mut TcpStream) -> bool + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            let answer = Arc::clone(&answer);
            std::thread::spawn(move || {
                let mut writer = socket.try_clone().unwrap();
                let mut reader = BufReader::new(socket);
                while let Some(command) = read_command(&mut reader) {
                    if !answer(&command, &mut writer) {
                        return;
                    }
                }
            });
        }
    });
    url
}

/// What a flooding peer did: bytes it got out, and whether the store closed the connection
/// (its writes failed before [`FLOOD_LIMIT`]).
#[derive(Default)]
struct Flood {
    sent: AtomicU64,
    cut_off: AtomicU64,
}

/// A peer that answers the first script call with `head` and then `body` over and over, until
/// the connection is closed (or [`FLOOD_LIMIT`]); every other command is answered `+OK`.
fn flooding_peer(head: &'static [u8], body: &'static [u8]) -> (String, Arc<Flood>) {
    let flood = Arc::new(Flood::default());
    let url = peer({
        let flood = Arc::clone(&flood);
        move |command, socket| {
            if command[0] != b"EVALSHA" {
                return socket.write_all(b"+OK\r\n").is_ok();
            }
            let chunk = body.repeat(64 * 1024 / body.len());
            let mut sent = head.len() as u64;
            let mut ok = socket.write_all(head).is_ok();
            while ok && sent < FLOOD_LIMIT {
                ok = socket.write_all(&chunk).is_ok();
                sent += chunk.len() as u64;
                flood.sent.store(sent, Ordering::Relaxed);
            }
            if !ok {
                flood.cut_off.store(1, Ordering::Relaxed);
            }
            false
        }
    });
    (url, flood)
}

/// A peer flooding a reply that never ends (`head`, then `body` without end): the call is
/// answered (an outage) by its deadline plus [`MARGIN`], the store's connection is closed
/// having let through at most [`FLOOD_SENT`] bytes, and the process's memory grew by less
/// than [`RSS_GROWTH`], though the store stays alive.
async fn flood_is_bounded(head: &'static [u8], body: &'static [u8]) {
    let timeout = Duration::from_secs(1);
    let (url, flood) = flooding_peer(head, body);
    let store = store(&url, timeout);
    let before = rss_bytes(std::process::id());
    let started = Instant::now();
    let error = store.apply(&[op()]).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(took < timeout + MARGIN, "answered after {took:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while flood.cut_off.load(Ordering::Relaxed) == 0 {
        let sent = flood.sent.load(Ordering::Relaxed);
        assert!(
            sent < FLOOD_LIMIT && Instant::now() < deadline,
            "the connection still reads ({sent} bytes of {head:?} so far)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = flood.sent.load(Ordering::Relaxed);
    assert!(sent < FLOOD_SENT, "{sent} bytes of {head:?} got through");
    let grown = rss_bytes(std::process::id()).saturating_sub(before);
    assert!(grown < RSS_GROWTH, "RSS grew by {grown} bytes");
    drop(store);
}

/// `*2147483647` then endless `:1`: bounded.
#[tokio::test]
async fn an_endless_array_is_bounded() {
    flood_is_bounded(b"*2147483647\r\n", b":1\r\n").await;
}

/// An array whose count fits in the reply cap and whose elements (10 KB lines) outgrow it:
/// bounded.
#[tokio::test]
async fn an_array_outgrowing_the_cap_is_bounded() {
    let mut line = vec![b'+'];
    line.resize(10_001, b'a');
    line.extend_from_slice(b"\r\n");
    flood_is_bounded(b"*10000\r\n", Vec::leak(line)).await;
}

/// A bulk string announced at 512 MiB, then its bytes: bounded.
#[tokio::test]
async fn a_512_mib_bulk_string_is_bounded() {
    flood_is_bounded(b"$536870912\r\n", b"x").await;
}

/// Endless garbage (a line that never ends): bounded.
#[tokio::test]
async fn endless_garbage_is_bounded() {
    flood_is_bounded(b"+", b"garbage without a line end ").await;
}

/// The script's reply for one admitted debit leaving 4, packed as `lua/apply.lua` packs it.
fn admitted_reply() -> Vec<u8> {
    let payload: Vec<u8> = [
        1.0f64,
        0.0,
        1_700_000_000_000_000.0,
        1.0,
        4.0,
        17_280_000_000.0,
        0.0,
        -1.0,
    ]
    .iter()
    .flat_map(|value| value.to_le_bytes())
    .collect();
    let mut reply = format!("${}\r\n", payload.len()).into_bytes();
    reply.extend_from_slice(&payload);
    reply.extend_from_slice(b"\r\n");
    reply
}

/// A legitimate reply that arrives one byte per write (and per packet: `TCP_NODELAY`) is
/// parsed as the reply it is, each time, on a connection that stays in use.
#[tokio::test]
async fn a_reply_cut_into_single_bytes_still_parses() {
    let reply = admitted_reply();
    let url = peer(move |command, socket| {
        if command[0] != b"EVALSHA" {
            return socket.write_all(b"+OK\r\n").is_ok();
        }
        socket.set_nodelay(true).unwrap();
        reply.iter().all(|byte| {
            let ok = socket.write_all(&[*byte]).is_ok();
            std::thread::sleep(Duration::from_micros(200));
            ok
        })
    });
    let store = store(&url, Duration::from_secs(30));
    for _ in 0..3 {
        let applied = store.apply(&[op()]).await.unwrap();
        assert!(applied.committed);
        assert_eq!(applied.buckets[0].view.remaining, 4);
    }
}

/// A peer that starts a reply and stalls: the call is answered at its deadline (plus
/// [`MARGIN`]) with an outage, and the store closes the connection then, though the store
/// is alive and no other call comes: nothing is left reading a peer that missed a deadline.
#[tokio::test]
async fn a_stalled_reply_closes_the_connection_after_the_deadline() {
    let closed = Arc::new(AtomicU64::new(0));
    let url = peer({
        let closed = Arc::clone(&closed);
        move |command, socket| {
            if command[0] != b"EVALSHA" {
                return socket.write_all(b"+OK\r\n").is_ok();
            }
            socket.write_all(b"*3\r\n:1\r\n").unwrap();
            // Waits for the store to close the connection.
            let mut rest = [0; 1024];
            while matches!(socket.read(&mut rest), Ok(n) if n > 0) {}
            closed.store(1, Ordering::Relaxed);
            false
        }
    });
    let timeout = Duration::from_millis(200);
    let store = store(&url, timeout);
    let started = Instant::now();
    let error = store.apply(&[op()]).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
    assert!(
        took >= timeout && took < timeout + MARGIN,
        "answered after {took:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while closed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the connection is still open");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(store);
}

/// A peer that answers `NOSCRIPT` to every script call draws a bounded number of script
/// loads ([`wire::SCRIPT_LOADS`] per connection in any second), however many calls meet it;
/// each call is answered with an outage.
#[tokio::test]
async fn noscript_forever_draws_bounded_loads() {
    let loads = Arc::new(AtomicU64::new(0));
    let url = peer({
        let loads = Arc::clone(&loads);
        move |command, socket| {
            let reply: Vec<u8> = match command[0].as_slice() {
                b"EVALSHA" => b"-NOSCRIPT No matching script. Please use EVAL.\r\n".to_vec(),
                b"SCRIPT" => {
                    loads.fetch_add(1, Ordering::Relaxed);
                    let sha = script::script().get_hash();
                    format!("${}\r\n{sha}\r\n", sha.len()).into_bytes()
                }
                _ => b"+OK\r\n".to_vec(),
            };
            socket.write_all(&reply).is_ok()
        }
    });
    let store = Arc::new(store(&url, Duration::from_secs(5)));
    let started = Instant::now();
    let calls = (0..8).map(|_| {
        let store = Arc::clone(&store);
        async move {
            for _ in 0..50 {
                let error = store.apply(&[op()]).await.unwrap_err();
                assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
            }
        }
    });
    futures_util::future::join_all(calls).await;
    let seconds = started.elapsed().as_secs() + 1;
    let loads = loads.load(Ordering::Relaxed);
    let connections = store.pool_counts().opened.load(Ordering::Relaxed);
    let bound = connections * wire::SCRIPT_LOADS as u64 * seconds;
    assert!(
        (1..=bound).contains(&loads),
        "{loads} script loads for 400 calls on {connections} connections in {seconds} s or less"
    );
    let (_, refused) = script::load_counts();
    assert!(refused > 0);
}
