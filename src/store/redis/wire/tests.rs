//! The connection as its callers see it, against peers on loopback ports that play Redis:
//! replies reach their callers in order, merged script calls get their own parts, deadlines
//! fail calls and retire the connection, and a peer's broken replies close it.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, ConnectionInfo, RedisResult};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::conn::{RETIRED, lock};
use super::frame::{FrameError, Parser};
use super::*;
use crate::bucket::BucketOp;
use crate::limiter::{Algorithm, LimitParams};
use crate::store::redis::apply::{Action, ScriptCall};

/// The length of the whole command at the start of `buf` (the test peers read commands
/// with the replies' framing: both are RESP2).
fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    Parser::new().frame_len(buf, usize::MAX)
}

/// A peer on a loopback port that, once it has read `commands` commands, reports it on
/// `read` and then, when `go` says so, writes `replies` one byte at a time.
async fn peer(
    commands: usize,
    replies: &'static [u8],
) -> (ConnectionInfo, oneshot::Receiver<()>, oneshot::Sender<()>) {
    use redis::IntoConnectionInfo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let (read_tx, read) = oneshot::channel();
    let (go, go_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        let mut count = 0;
        while count < commands {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed early");
            seen.extend_from_slice(&buf[..n]);
            count = 0;
            let mut at = 0;
            while let Some(len) = frame_len(&seen[at..]).unwrap() {
                at += len;
                count += 1;
            }
        }
        read_tx.send(()).unwrap();
        go_rx.await.unwrap();
        for byte in replies {
            socket.write_all(&[*byte]).await.unwrap();
            socket.flush().await.unwrap();
        }
        // Keep the socket open until the test is done with it.
        let _ = socket.read(&mut buf).await;
    });
    (url.into_connection_info().unwrap(), read, go)
}

/// A peer on a loopback port that plays Redis one command at a time: it reports each whole
/// command it reads on the channel returned, then writes the next of `replies` once `go`
/// says so. It keeps the socket open once every reply is written.
async fn gated_peer(
    replies: &'static [&'static [u8]],
) -> (
    ConnectionInfo,
    tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    tokio::sync::mpsc::UnboundedSender<()>,
) {
    use redis::IntoConnectionInfo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let (commands, commands_rx) = tokio::sync::mpsc::unbounded_channel();
    let (go, mut go_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        for reply in replies {
            let len = loop {
                if let Some(len) = frame_len(&seen).unwrap() {
                    break len;
                }
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection closed early");
                seen.extend_from_slice(&buf[..n]);
            };
            commands.send(seen.drain(..len).collect()).unwrap();
            go_rx.recv().await.unwrap();
            socket.write_all(reply).await.unwrap();
        }
        drop(commands);
        // Keep the socket open until the test is done with it.
        let _ = socket.read(&mut buf).await;
    });
    (url.into_connection_info().unwrap(), commands_rx, go)
}

/// A [`gated_peer`] that answers each command as soon as it has read it, and the commands it
/// read, once it has answered them all.
async fn stepped_peer(
    replies: &'static [&'static [u8]],
) -> (ConnectionInfo, impl Future<Output = Vec<Vec<u8>>>) {
    let (info, mut commands, go) = gated_peer(replies).await;
    let read = async move {
        let mut read = Vec::new();
        while let Some(command) = commands.recv().await {
            read.push(command);
            let _ = go.send(());
        }
        read
    };
    (info, read)
}

fn echo(word: &'static str) -> Cmd {
    let mut cmd = redis::cmd("ECHO");
    cmd.arg(word);
    cmd
}

/// Replies that arrive a byte at a time still reach their callers in order, and a caller
/// that gave up (its task dropped, as a deadline drops it) keeps its place: the callers
/// after it get their own replies, not its.
#[tokio::test]
async fn replies_reach_their_callers_in_order() {
    let (info, read, go) = peer(3, b"$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n").await;
    let conn = open(&info).await;
    let (first, second, third) = (conn.clone(), conn.clone(), conn.clone());
    let gave_up = tokio::spawn(async move { first.call(&Call::Command(&echo("a"))).await });
    // Yield until the first command is queued before the others.
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    let b = tokio::spawn(async move { second.call(&Call::Command(&echo("b"))).await });
    while lock(&conn.handle.0).waiting.len() < 2 {
        tokio::task::yield_now().await;
    }
    let c = tokio::spawn(async move { third.call(&Call::Command(&echo("c"))).await });
    read.await.unwrap();
    gave_up.abort();
    assert!(gave_up.await.unwrap_err().is_cancelled());
    go.send(()).unwrap();
    assert_eq!(b.await.unwrap().unwrap(), b"$1\r\nb\r\n");
    assert_eq!(c.await.unwrap().unwrap(), b"$1\r\nc\r\n");
    assert!(!conn.is_closed());
}

/// A script call ([`Call::Script`]) of one bucket keyed under the prefix `word`, whose reply
/// is a bulk string of `reply_bytes` bytes.
async fn script_call(conn: &Conn, word: &'static str, reply_bytes: usize) -> RedisResult<Frame> {
    let params = LimitParams::of(Algorithm::TokenBucket, 7, 60, 9);
    let ops = [BucketOp::debit("edge", "ip", b"10.0.0.1", params, 1)];
    let call = ScriptCall {
        sha: "sha",
        prefix: word.as_bytes(),
        ops: &ops,
        now_us: None,
        action: Action::Apply,
        reply_bytes,
    };
    conn.call(&Call::Script(call)).await
}

/// Script calls written together go out as one command, and its reply is split among
/// them by their reply sizes, each part a bulk string of its own.
#[tokio::test]
async fn merged_script_calls_get_their_own_parts() {
    let (info, read, go) = peer(1, b"$6\r\nabcdef\r\n").await;
    let conn = open(&info).await;
    let calls = async {
        tokio::join!(
            script_call(&conn, "a", 2),
            script_call(&conn, "b", 3),
            script_call(&conn, "c", 1)
        )
    };
    let go = async {
        read.await.unwrap();
        go.send(()).unwrap();
    };
    // Bounded, so that calls sent apart (the peer answers one command) fail the test.
    let ((a, b, c), ()) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
            .await
            .expect("the calls were not merged into one command");
    assert_eq!(a.unwrap(), b"$2\r\nab\r\n");
    assert_eq!(b.unwrap(), b"$3\r\ncde\r\n");
    assert_eq!(c.unwrap(), b"$1\r\nf\r\n");
}

/// A command written between script calls keeps its place: the calls before it go out
/// (merged) before it, the ones after it merge apart, and every reply reaches its caller.
#[tokio::test]
async fn a_command_between_script_calls_keeps_its_place() {
    let (info, commands) =
        stepped_peer(&[b"$2\r\nxx\r\n", b"$5\r\nhello\r\n", b"$4\r\nyyyz\r\n"]).await;
    let conn = open(&info).await;
    let calls = async {
        tokio::join!(
            script_call(&conn, "a", 2),
            async { conn.call(&Call::Command(&echo("hello"))).await },
            script_call(&conn, "b", 3),
            script_call(&conn, "c", 1)
        )
    };
    // Bounded, so that commands sent otherwise than as three fail the test.
    let ((a, echoed, b, c), commands) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(calls, commands)
    })
    .await
    .expect("not three commands: a, the ECHO, then b and c merged");
    assert_eq!(commands.len(), 3);
    assert_eq!(a.unwrap(), b"$2\r\nxx\r\n");
    assert_eq!(echoed.unwrap(), b"$5\r\nhello\r\n");
    assert_eq!(b.unwrap(), b"$3\r\nyyy\r\n");
    assert_eq!(c.unwrap(), b"$1\r\nz\r\n");
}

/// Script calls written while a script call is out wait for its reply, whatever else the
/// connection's task does meanwhile (another command's reply handed out), and then go out
/// merged into one `EVALSHA` (group commit), each caller still getting its own part.
#[tokio::test]
async fn script_calls_wait_for_the_one_out_and_go_out_together() {
    let (info, mut commands, go) =
        gated_peer(&[b"$1\r\ne\r\n", b"$2\r\nxx\r\n", b"$4\r\nyyyz\r\n"]).await;
    let conn = open(&info).await;
    let queued = |calls: usize| {
        let conn = conn.clone();
        async move {
            while lock(&conn.handle.0).waiting.len() < calls {
                tokio::task::yield_now().await;
            }
        }
    };
    let script = |word: &'static str, reply_bytes| {
        let conn = conn.clone();
        tokio::spawn(async move { script_call(&conn, word, reply_bytes).await })
    };
    let echoed = tokio::spawn({
        let conn = conn.clone();
        async move { conn.call(&Call::Command(&echo("e"))).await }
    });
    queued(1).await;
    let a = script("a", 2);
    queued(2).await;
    assert!(commands.recv().await.unwrap().ends_with(b"$1\r\ne\r\n"));
    let b = script("b", 3);
    queued(3).await;
    go.send(()).unwrap();
    assert_eq!(echoed.await.unwrap().unwrap(), b"$1\r\ne\r\n");
    // The connection's task, which handed out the ECHO's reply, runs before the test's
    // task resumes.
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        lock(&conn.handle.0).merging.calls,
        1,
        "b waits while a is out"
    );
    // EVALSHA sha 1 key_a "" blob_a
    assert!(
        commands.recv().await.unwrap().starts_with(b"*6\r\n"),
        "a alone"
    );
    let c = script("c", 1);
    queued(3).await;
    go.send(()).unwrap();
    let merged = tokio::time::timeout(Duration::from_secs(60), commands.recv())
        .await
        .expect("b and c never went out")
        .unwrap();
    // EVALSHA sha 2 key_b key_c "" blob_b blob_c
    assert!(
        merged.starts_with(b"*8\r\n"),
        "b and c merged into one call"
    );
    go.send(()).unwrap();
    assert_eq!(a.await.unwrap().unwrap(), b"$2\r\nxx\r\n");
    assert_eq!(b.await.unwrap().unwrap(), b"$3\r\nyyy\r\n");
    assert_eq!(c.await.unwrap().unwrap(), b"$1\r\nz\r\n");
}

/// A script call waiting behind the script call out keeps its deadline, though no call
/// before it has one: it fails as late at its deadline, the connection retires as after any
/// late call, and the call out still gets its reply.
#[tokio::test]
async fn a_call_waiting_behind_the_one_out_keeps_its_deadline() {
    let (info, mut commands, go) = gated_peer(&[b"$2\r\nxx\r\n"]).await;
    let conn = open(&info).await;
    let a = tokio::spawn({
        let conn = conn.clone();
        async move { script_call(&conn, "a", 2).await }
    });
    commands.recv().await.unwrap();
    let mut held = conn.clone();
    held.until(Instant::now() + Duration::from_millis(50));
    let error = tokio::time::timeout(Duration::from_secs(60), script_call(&held, "b", 3))
        .await
        .expect("the waiting call's deadline was not kept")
        .unwrap_err();
    assert!(is_late(&error), "{error}");
    assert!(conn.is_closed(), "the connection retires");
    go.send(()).unwrap();
    assert_eq!(a.await.unwrap().unwrap(), b"$2\r\nxx\r\n");
}

/// A merged call's caller that gave up before the reply (its future dropped, as a
/// deadline or a client that left drops it) keeps its part: the calls after it get their
/// own bytes, not its.
#[tokio::test]
async fn a_dropped_call_in_a_merged_call_keeps_its_part() {
    use futures_util::FutureExt as _;
    let (info, read, go) = peer(1, b"$6\r\nabcdef\r\n").await;
    let conn = open(&info).await;
    let mut a = Box::pin(script_call(&conn, "a", 2));
    assert!((&mut a).now_or_never().is_none());
    // Written, then dropped before the connection's task ever ran.
    assert!(script_call(&conn, "b", 3).now_or_never().is_none());
    let mut c = Box::pin(script_call(&conn, "c", 1));
    assert!((&mut c).now_or_never().is_none());
    let go = async {
        read.await.unwrap();
        go.send(()).unwrap();
    };
    let ((a, c), ()) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(async { tokio::join!(a, c) }, go)
    })
    .await
    .expect("the calls were not merged into one command");
    assert_eq!(a.unwrap(), b"$2\r\nab\r\n");
    assert_eq!(c.unwrap(), b"$1\r\nf\r\n");
}

/// More script calls than [`MERGE_CALLS`] written together go out as two commands: the
/// first [`MERGE_CALLS`] merged, the next one in a command of its own; each caller gets
/// its own byte of the first reply, the last one the second reply.
#[tokio::test]
async fn calls_past_the_cap_start_another_command() {
    let mut replies = format!("${MERGE_CALLS}\r\n").into_bytes();
    replies.extend((0..MERGE_CALLS).map(|i| b'A' + (i % 26) as u8));
    replies.extend_from_slice(b"\r\n");
    let (info, commands) =
        stepped_peer(Vec::leak(vec![&*Vec::leak(replies), b"$1\r\nZ\r\n"])).await;
    let conn = open(&info).await;
    let calls =
        futures_util::future::join_all((0..=MERGE_CALLS).map(|_| script_call(&conn, "k", 1)));
    let (answers, commands) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(calls, commands)
    })
    .await
    .expect("not two commands");
    assert_eq!(commands.len(), 2);
    for (i, answer) in answers.into_iter().enumerate() {
        let expected = if i < MERGE_CALLS {
            b'A' + (i % 26) as u8
        } else {
            b'Z'
        };
        assert_eq!(
            answer.unwrap(),
            [b'$', b'1', b'\r', b'\n', expected, b'\r', b'\n'],
            "call {i}"
        );
    }
}

/// An error reply to a merged script call reaches every call in it, as it came.
#[tokio::test]
async fn an_error_for_a_merged_call_reaches_every_call() {
    let (info, read, go) = peer(1, b"-NOSCRIPT No matching script\r\n").await;
    let conn = open(&info).await;
    let calls = async { tokio::join!(script_call(&conn, "a", 8), script_call(&conn, "b", 8)) };
    let go = async {
        read.await.unwrap();
        go.send(()).unwrap();
    };
    let ((a, b), ()) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(calls, go) })
            .await
            .expect("the calls were not merged into one command");
    for frame in [a.unwrap(), b.unwrap()] {
        assert_eq!(frame, b"-NOSCRIPT No matching script\r\n");
    }
}

/// A call whose deadline passes before its reply fails with the deadline's error, kept by
/// the connection's task (no timer of the caller's own), and keeps its place: the call
/// after it, without a deadline, still gets its own reply, not the late call's.
#[tokio::test]
async fn a_late_call_fails_at_its_deadline_and_keeps_its_place() {
    let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
    let conn = open(&info).await;
    let mut late = conn.clone();
    late.until(Instant::now() + Duration::from_millis(50));
    let late = tokio::spawn(async move { late.call(&Call::Command(&echo("a"))).await });
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    let next = tokio::spawn({
        let conn = conn.clone();
        async move { conn.call(&Call::Command(&echo("b"))).await }
    });
    read.await.unwrap();
    // Bounded, so that a deadline nobody keeps fails the test instead of hanging it.
    let error = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .expect("the late call never failed")
        .unwrap()
        .unwrap_err();
    assert!(is_late(&error), "{error}");
    go.send(()).unwrap();
    assert_eq!(next.await.unwrap().unwrap(), b"$1\r\nb\r\n");
}

/// A connection on which a call missed its deadline retires: it says it is closed at
/// once, later calls fail at once (an I/O error, which retires it from the pool), the
/// call still waiting gets its own reply, and the connection then closes, though its
/// handles are alive: a peer that missed a deadline is not read any longer.
#[tokio::test]
async fn a_connection_retires_after_a_late_call() {
    let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
    let conn = open(&info).await;
    let mut late = conn.clone();
    late.until(Instant::now() + Duration::from_millis(50));
    let late = tokio::spawn(async move { late.call(&Call::Command(&echo("a"))).await });
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    let mut next = conn.clone();
    next.until(Instant::now() + Duration::from_secs(600));
    let next = tokio::spawn(async move { next.call(&Call::Command(&echo("b"))).await });
    read.await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(60), late)
        .await
        .expect("the late call never failed")
        .unwrap()
        .unwrap_err();
    assert!(is_late(&error), "{error}");
    assert!(conn.is_closed());
    assert!(lock(&conn.handle.0).closed.is_none(), "a call still waits");
    let refused = conn.call(&Call::Command(&echo("c"))).await.unwrap_err();
    assert!(refused.is_io_error() && refused.to_string().contains(RETIRED));
    go.send(()).unwrap();
    assert_eq!(next.await.unwrap().unwrap(), b"$1\r\nb\r\n");
    closes(&conn).await;
}

/// A retiring connection whose only waiting call expires closes at that deadline, while
/// its peer stays silent and its handles stay alive.
#[tokio::test]
async fn a_connection_closes_when_its_last_waiting_call_expires() {
    let (conn, _socket) = connected().await;
    let mut late = conn.clone();
    late.until(Instant::now() + Duration::from_millis(20));
    let error = late.call(&Call::Command(&echo("a"))).await.unwrap_err();
    assert!(is_late(&error), "{error}");
    closes(&conn).await;
}

/// A connection may load a script [`SCRIPT_LOADS`] times in any [`SCRIPT_LOAD_WINDOW`].
#[tokio::test]
async fn script_loads_are_bounded_per_connection() {
    let (conn, _socket) = connected().await;
    let (now, half) = (Instant::now(), SCRIPT_LOAD_WINDOW / 2);
    assert!(conn.may_load_script(now));
    assert!(conn.may_load_script(now + half));
    assert!(!conn.may_load_script(now + half));
    assert!(!conn.may_load_script(now + SCRIPT_LOAD_WINDOW - Duration::from_millis(1)));
    assert!(conn.may_load_script(now + SCRIPT_LOAD_WINDOW));
    assert!(!conn.may_load_script(now + SCRIPT_LOAD_WINDOW));
    assert!(conn.may_load_script(now + SCRIPT_LOAD_WINDOW + half));
}

/// A call with a sooner deadline than the calls before it fails at its own deadline: the
/// connection's timer, set for the later one, is set sooner.
#[tokio::test]
async fn a_sooner_deadline_sets_the_timer_sooner() {
    let (info, read, go) = peer(2, b"$1\r\na\r\n$1\r\nb\r\n").await;
    let conn = open(&info).await;
    let mut patient = conn.clone();
    patient.until(Instant::now() + Duration::from_secs(3600));
    let patient = tokio::spawn(async move { patient.call(&Call::Command(&echo("a"))).await });
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    let mut hurried = conn.clone();
    hurried.until(Instant::now() + Duration::from_millis(50));
    let hurried = tokio::spawn(async move { hurried.call(&Call::Command(&echo("b"))).await });
    read.await.unwrap();
    // Bounded, so that a timer left at the later deadline fails the test.
    let error = tokio::time::timeout(Duration::from_secs(60), hurried)
        .await
        .expect("the sooner deadline was not kept")
        .unwrap()
        .unwrap_err();
    assert!(is_late(&error), "{error}");
    go.send(()).unwrap();
    assert_eq!(patient.await.unwrap().unwrap(), b"$1\r\na\r\n");
}

/// A peer flooding a reply that never ends closes the connection as soon as the reply
/// cannot fit in what its call can take: an array announcing 2^31 − 1 elements, a bulk
/// string announced at 512 MiB (both refused at their header), an array within the cap
/// whose elements outgrow it, and bytes with no line end. The waiting call fails at once
/// with an I/O error, long before its deadline, and the peer is cut off having sent at
/// most what the cap and the sockets' buffers hold (loopback buffers take a few MiB).
#[tokio::test]
async fn a_reply_that_cannot_fit_closes_the_connection() {
    use redis::IntoConnectionInfo;
    use std::io::{Read, Write};
    for (head, flood) in [
        ("*2147483647\r\n", ":1\r\n"),
        ("$536870912\r\n", "x"),
        ("*8000\r\n", ":1000000\r\n"),
        ("+", "garbage"),
    ] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let info = format!("redis://{}/", listener.local_addr().unwrap())
            .into_connection_info()
            .unwrap();
        // Reads the command, then floods until the connection is closed; returns the
        // bytes it got out.
        let peer = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let _ = socket.read(&mut [0; 1024]).unwrap();
            let mut sent = head.len() as u64;
            socket.write_all(head.as_bytes()).unwrap();
            let chunk = flood.repeat(64 * 1024 / flood.len());
            while socket.write_all(chunk.as_bytes()).is_ok() {
                sent += chunk.len() as u64;
                assert!(sent < 1 << 30, "the connection read 1 GiB of {head:?}");
            }
            sent
        });
        let mut conn = open(&info).await;
        conn.until(Instant::now() + Duration::from_secs(600));
        let error = tokio::time::timeout(
            Duration::from_secs(60),
            conn.call(&Call::Command(&echo("a"))),
        )
        .await
        .expect("the call never failed")
        .unwrap_err();
        assert!(error.is_io_error() && !is_late(&error), "{head:?}: {error}");
        assert!(conn.is_closed());
        let sent = tokio::task::spawn_blocking(move || peer.join().unwrap())
            .await
            .unwrap();
        assert!(sent < 16 << 20, "{head:?}: the peer got {sent} bytes out");
    }
}

/// Waits (a minute at most) until `conn`'s task has closed it.
async fn closes(conn: &Conn) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lock(&conn.handle.0).closed.is_none() {
        assert!(Instant::now() < deadline, "never closed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A connection to a loopback port, and the socket its peer accepted (the test plays
/// Redis on it).
async fn connected() -> (Conn, TcpStream) {
    use redis::IntoConnectionInfo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let info = format!("redis://{}/", listener.local_addr().unwrap())
        .into_connection_info()
        .unwrap();
    let (conn, accepted) = tokio::join!(open(&info), listener.accept());
    (conn, accepted.unwrap().0)
}

/// A plain connection to `info` (the default TLS settings, unused without TLS).
async fn open(info: &ConnectionInfo) -> Conn {
    let tls = super::super::tls::client_config(&Default::default()).unwrap();
    connect(info, &tls, Duration::from_secs(10)).await.unwrap()
}

/// A connection the peer closes fails the calls waiting on it and every later one, with
/// an I/O error (which retires it from the pool), and says it is closed.
#[tokio::test]
async fn a_closed_connection_fails_every_call() {
    let (conn, socket) = connected().await;
    let waiting = tokio::spawn({
        let conn = conn.clone();
        async move { conn.call(&Call::Command(&echo("a"))).await }
    });
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    drop(socket);
    let error = waiting.await.unwrap().unwrap_err();
    assert!(error.is_io_error(), "{error}");
    assert!(conn.is_closed());
    let later = conn.call(&Call::Command(&echo("b"))).await.unwrap_err();
    assert!(later.is_io_error(), "{later}");
}

/// A connection whose task is gone without finishing (its runtime shut down; a panic
/// drops it the same way) is closed: the call waiting on it fails, and so does every
/// later one, instead of waiting for replies nothing will ever read.
#[test]
fn a_connection_whose_task_is_gone_is_closed() {
    use redis::IntoConnectionInfo;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let info = format!("redis://{}/", listener.local_addr().unwrap())
        .into_connection_info()
        .unwrap();
    let tls = super::super::tls::client_config(&Default::default()).unwrap();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let (first, second) = (runtime(), runtime());
    let conn = first
        .block_on(connect(&info, &tls, Duration::from_secs(10)))
        .unwrap();
    let waiting = second.spawn({
        let conn = conn.clone();
        async move { conn.call(&Call::Command(&echo("a"))).await }
    });
    second.block_on(async {
        while lock(&conn.handle.0).waiting.is_empty() {
            tokio::task::yield_now().await;
        }
    });
    drop(first);
    assert!(conn.is_closed());
    let error = second.block_on(waiting).unwrap().unwrap_err();
    assert!(error.is_io_error(), "{error}");
    let later = second
        .block_on(conn.call(&Call::Command(&echo("b"))))
        .unwrap_err();
    assert!(later.is_io_error(), "{later}");
}

/// An error Redis sends before any command (at `maxclients`, just before it closes the
/// connection) closes the connection, and the calls made on it then say what Redis said.
#[tokio::test]
async fn an_error_nobody_asked_for_is_told() {
    use tokio::io::AsyncWriteExt;
    let (conn, mut socket) = connected().await;
    socket
        .write_all(b"-ERR max number of clients reached\r\n")
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !conn.is_closed() {
        assert!(tokio::time::Instant::now() < deadline, "never closed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let error = conn.call(&Call::Command(&echo("a"))).await.unwrap_err();
    assert!(error.is_io_error(), "{error}");
    assert!(
        error
            .to_string()
            .contains("ERR max number of clients reached"),
        "{error}"
    );
}

/// Over TLS, a peer that ends its session (`close_notify`) in the middle of a reply
/// fails the call waiting for it with an I/O error and closes the connection; the whole
/// reply before it still reaches its caller.
#[tokio::test]
async fn a_tls_session_closed_mid_reply_fails_the_waiting_call() {
    use redis::IntoConnectionInfo;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = crate::pem::tests::pair();
    let ca = crate::pem::tests::write(&dir, "ca.pem", &cert);
    let tls = super::super::tls::client_config(&super::super::RedisTls {
        ca_file: Some(ca),
        cert_file: None,
        key_file: None,
    })
    .unwrap();
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let mut session = acceptor.accept(socket).await.unwrap();
        let (mut seen, mut buf) = (Vec::new(), [0u8; 1024]);
        let mut count = 0;
        while count < 2 {
            let n = session.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed early");
            seen.extend_from_slice(&buf[..n]);
            let mut at = 0;
            count = 0;
            while let Some(len) = frame_len(&seen[at..]).unwrap() {
                at += len;
                count += 1;
            }
        }
        session.write_all(b"$1\r\na\r\n$5\r\nhe").await.unwrap();
        session.shutdown().await.unwrap();
        // The TCP connection stays open: only the TLS session ended.
        let _ = session.get_mut().0.read(&mut buf).await;
    });
    let info = format!("rediss://localhost:{port}/")
        .into_connection_info()
        .unwrap();
    let conn = connect(&info, &tls, Duration::from_secs(10)).await.unwrap();
    let first = tokio::spawn({
        let conn = conn.clone();
        async move { conn.call(&Call::Command(&echo("a"))).await }
    });
    while lock(&conn.handle.0).waiting.is_empty() {
        tokio::task::yield_now().await;
    }
    // Bounded, so that a connection that missed the end fails the test, not hangs it.
    let cut = tokio::time::timeout(
        Duration::from_secs(60),
        conn.call(&Call::Command(&echo("hello"))),
    )
    .await
    .expect("the call on the ended session never ended")
    .unwrap_err();
    assert_eq!(first.await.unwrap().unwrap(), b"$1\r\na\r\n");
    assert!(cut.is_io_error(), "{cut}");
    assert!(conn.is_closed());
}
