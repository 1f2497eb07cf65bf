//! One client against the real binary: HTTP/2 streams that never send a body, idle and
//! half-open connections on both ports, label values built to break `/metrics`, and bytes
//! that are not a request. Each attack is bounded (memory, connections, series) while
//! legitimate calls keep being answered and health, metrics and shutdown tell the truth.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::h2raw::{Attacker, rss_bytes};
use support::http::{call, metric, post_json};
use support::process::Floodgate;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest any awaited condition may take before the test fails: a guard against a hang,
/// with room for a loaded machine (100 connections admitted in rounds of a 3 s idle timeout
/// take about 10 s on an idle one).
const DEADLINE: Duration = Duration::from_secs(60);

const LIMITS: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// How long SIGTERM may take to end the process before a test fails: a guard against a hang,
/// not a timing (the default grace alone is 10 s, and a loaded machine adds to it).
const STOP: Duration = Duration::from_secs(30);

/// Starts the binary on a limits file with `args`.
fn start(args: &[&str]) -> (Floodgate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let mut all = vec!["--config", limits.to_str().unwrap()];
    all.extend_from_slice(args);
    (Floodgate::start(&all), dir)
}

/// One legitimate ShouldRateLimit call on a fresh connection; its code.
async fn legit(grpc: SocketAddr) -> Result<i32, tonic::Status> {
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    client
        .should_rate_limit(simple("d", "k", "v"))
        .await
        .map(|r| r.into_inner().overall_code)
}

/// SIGTERM; asserts exit 0 within `within`.
async fn stop_within(server: Floodgate, within: Duration) -> String {
    let started = Instant::now();
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(
        started.elapsed() < within,
        "shutdown took {:?}",
        started.elapsed()
    );
    log
}

async fn gauge(http: SocketAddr, series: &str) -> f64 {
    metric(http, series).await.unwrap_or(0.0)
}

/// The gRPC port's connections open now, and those evicted so far.
async fn grpc_open_and_evicted(http: SocketAddr) -> (f64, f64) {
    (
        gauge(http, "floodgate_connections_open{port=\"grpc\"}").await,
        gauge(http, "floodgate_connections_evicted_total{port=\"grpc\"}").await,
    )
}

/// 20,000 bodiless streams on one connection: the server holds at most its per-connection
/// bound (100), RSS grows by less than 32 MiB (unbounded, it reaches 285 MB), every one counts
/// in flight, a legitimate call on another connection is answered, the request timeout frees
/// the streams, and SIGTERM completes within the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_streams_on_one_connection_are_bounded() {
    // A request timeout longer than opening the 20,000 streams takes on a loaded machine:
    // with 2 s, the first 100 are freed before the last are refused, so the 100 held and
    // 19,900 refused are never seen together.
    let (server, _dir) = start(&["--grpc-request-timeout", "10", "--shutdown-grace", "3"]);
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    let before = rss_bytes(server.child.id());
    let mut attacker = Attacker::connect(server.grpc).await;
    attacker.open_streams(20_000).await;
    let in_flight = "floodgate_requests_in_flight";
    // The server keeps its per-connection bound and refuses every stream beyond it.
    let resets = || {
        attacker
            .seen
            .resets
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    eventually("100 streams held, 19,900 refused", || async {
        gauge(server.http, in_flight).await == 100.0 && resets() == 19_900
    })
    .await;
    let held = gauge(server.http, in_flight).await;
    assert!(held <= 100.0, "{held} streams held");
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    let after = rss_bytes(server.child.id());
    let grown = after.saturating_sub(before);
    eprintln!("RSS {before} -> {after} bytes, {held} streams held");
    assert!(grown < 32 << 20, "RSS grew by {grown} bytes");
    eventually("the request timeout frees the streams", || async {
        gauge(server.http, in_flight).await == 0.0
    })
    .await;
    let _ = attacker.open_streams(50).await;
    // The grace (3 s) ends the streams before their request timeout (10 s) does; the bound
    // guards against a hang with room for a loaded machine.
    stop_within(server, STOP).await;
}

/// Bodiless streams over several connections take `--max-in-flight` places from their
/// HEADERS: past the bound they are refused at once (RESOURCE_EXHAUSTED, counted), so are
/// legitimate calls while every place is held, and closing the connections frees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodiless_streams_count_against_max_in_flight() {
    let (server, _dir) = start(&["--max-in-flight", "50", "--grpc-request-timeout", "60"]);
    let mut attackers = Vec::new();
    for _ in 0..3 {
        let mut attacker = Attacker::connect(server.grpc).await;
        attacker.open_streams(40).await;
        attackers.push(attacker);
    }
    eventually("50 places held, 70 refused", || async {
        gauge(server.http, "floodgate_requests_in_flight").await == 50.0
            && gauge(
                server.http,
                "floodgate_requests_total{result=\"overloaded\"}",
            )
            .await
                >= 70.0
    })
    .await;
    let refused = legit(server.grpc).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    drop(attackers);
    eventually("closed connections free their places", || async {
        gauge(server.http, "floodgate_requests_in_flight").await == 0.0
    })
    .await;
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    stop_within(server, STOP).await;
}

/// How long the server takes to close `stream` (reading until EOF or an error), bounded by
/// DEADLINE.
async fn time_to_close<S: tokio::io::AsyncRead + Unpin>(mut stream: S) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(DEADLINE, stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("connection still open after {DEADLINE:?}"),
        }
    }
}

/// Each port holds at most its bound of connections: past it, each new idle connection
/// closes the one idle longest (counted) without affecting the other port; idle connections,
/// a half-sent HTTP/2 preface and a partial HTTP/1 request line are closed after the idle
/// timeout; the freed port serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_per_port_and_silent_ones_closed() {
    let (server, _dir) = start(&[
        "--grpc-max-connections",
        "20",
        "--http-max-connections",
        "4",
        "--grpc-idle-timeout",
        "1",
        "--http-idle-timeout",
        "1",
    ]);
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(server.grpc).await.unwrap());
    }
    // At most 20 open: exactly 20 lasts only until the idle timeout closes them (1 s), which
    // a slow scrape can miss; the evictions say the bound was reached.
    eventually("at most 20 open, 20 evicted", || async {
        let (open, evicted) = grpc_open_and_evicted(server.http).await;
        open <= 20.0 && evicted >= 20.0
    })
    .await;
    // The admin port has its own bound: health stays reachable while gRPC is full.
    assert_eq!(
        call(server.http, "GET", "/healthcheck", None).await.status,
        200
    );
    // Every one is closed (time_to_close's DEADLINE guards against a hang); that the idle
    // timeout closed them, not the handshake timeout, is what the counters below show.
    futures_util::future::join_all(idle.into_iter().map(time_to_close)).await;
    eventually("idle connections closed and counted", || async {
        gauge(
            server.http,
            "floodgate_connections_idle_closed_total{port=\"grpc\"}",
        )
        .await
            >= 20.0
            && gauge(server.http, "floodgate_connections_open{port=\"grpc\"}").await == 0.0
    })
    .await;
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);

    let idle_closed = |port: &'static str| {
        let series = format!("floodgate_connections_idle_closed_total{{port=\"{port}\"}}");
        async move { gauge(server.http, &series).await }
    };
    eventually("the legitimate call's connection gone", || async {
        gauge(server.http, "floodgate_connections_open{port=\"grpc\"}").await == 0.0
    })
    .await;
    let (grpc_before, http_before) = (idle_closed("grpc").await, idle_closed("http").await);
    // Timed from before the connect: the server's idle timer (1 s) starts after it, so a
    // close by that timer comes later than this however slow the machine is.
    let opening = Instant::now();
    let mut preface = TcpStream::connect(server.grpc).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let mut request_line = TcpStream::connect(server.http).await.unwrap();
    request_line.write_all(b"GET /healthch").await.unwrap();
    tokio::join!(time_to_close(preface), time_to_close(request_line));
    let took = opening.elapsed();
    assert!(
        took >= Duration::from_millis(500),
        "closed after {took:?}, before the idle timeout"
    );
    // Closed by the idle timeout (1 s), not the handshake timeout (its default, 10 s): a
    // bound on elapsed time would say the same only on an unloaded machine.
    assert!(idle_closed("grpc").await > grpc_before, "half preface");
    assert!(
        idle_closed("http").await > http_before,
        "partial request line"
    );
    for port in ["grpc", "http"] {
        let series = format!("floodgate_connections_handshake_timeouts_total{{port=\"{port}\"}}");
        assert_eq!(gauge(server.http, &series).await, 0.0, "{port}");
    }
    stop_within(server, STOP).await;
}

/// 60 idle HTTP/2 connections (preface sent, no stream) against `--grpc-max-connections 50`
/// do not lock out a new client: each connection past the bound closes the one idle
/// longest, so the first ones opened are closed, the later ones stay open, and a new
/// client's call is answered; the same on the admin port with idle keep-alive connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_make_way_for_a_new_client() {
    let (server, _dir) = start(&[
        "--grpc-max-connections",
        "50",
        "--http-max-connections",
        "4",
    ]);
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(Attacker::connect(server.grpc).await);
        // One at a time, so that which one is idle longest is known.
        let opened = idle.len();
        eventually("the connection admitted", || async {
            grpc_open_and_evicted(server.http).await
                == (opened.min(50) as f64, opened.saturating_sub(50) as f64)
        })
        .await;
    }
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    eventually("the 11 oldest closed", || async {
        idle[..11].iter().all(Attacker::is_closed)
    })
    .await;
    assert!(
        idle[11..].iter().all(|a| !a.is_closed()),
        "a younger one was closed"
    );
    assert_eq!(
        gauge(
            server.http,
            "floodgate_connections_refused_total{port=\"grpc\"}"
        )
        .await,
        0.0
    );

    // The admin port: idle keep-alive connections that each made one request.
    let mut kept = Vec::new();
    for _ in 0..6 {
        let mut connection = TcpStream::connect(server.http).await.unwrap();
        assert_eq!(keep_alive_health(&mut connection).await, 200);
        kept.push(connection);
    }
    assert_eq!(
        call(server.http, "GET", "/healthcheck", None).await.status,
        200
    );
    stop_within(server, STOP).await;
}

/// With the default bound (1,000), 1,100 idle TCP connections do not stop a new client's
/// call: the 100 past the bound each closed one idle longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_default_bound_make_way() {
    // The test's own 1,100 sockets, past a shell's usual soft limit of 1,024.
    let open_files = floodgate::transport::raise_fd_limit().unwrap_or(0);
    assert!(
        open_files >= 1_200,
        "this test needs 1,200 open files; the hard limit allows {open_files}"
    );
    let (server, _dir) = start(&["--grpc-idle-timeout", "600", "--handshake-timeout", "600"]);
    let mut idle = Vec::new();
    for _ in 0..1_100 {
        idle.push(TcpStream::connect(server.grpc).await.unwrap());
    }
    eventually("1,000 open, 100 evicted", || async {
        grpc_open_and_evicted(server.http).await == (1_000.0, 100.0)
    })
    .await;
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    drop(idle);
    stop_within(server, STOP).await;
}

const HELD: &str = "domain: d\ndescriptors:\n  - key: held\n    rate_limit: {unit: minute, requests_per_unit: 1, max_wait: 60s}\n";

/// A connection with a call in flight (a request held by `max_wait`) is never closed to
/// admit a new one, though it is the oldest: an idle younger one is; when every connection
/// is busy (the held call, and a stream waiting for its body), a new one is refused; and the
/// held call is answered at shutdown (refused: its turn is past the cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_connections_are_not_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, HELD).unwrap();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--grpc-max-connections",
        "2",
        "--grpc-request-timeout",
        "120",
        // The idle connection must be closed by the eviction, not by an unanswered keepalive
        // ping (20 s by default), however slowly a loaded machine runs this test.
        "--grpc-idle-timeout",
        "1800",
        "--grpc-keepalive-interval",
        "600",
    ]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let first = client.should_rate_limit(simple("d", "held", "v")).await;
    assert_eq!(first.unwrap().into_inner().overall_code, Code::Ok as i32);
    let mut holding = client.clone();
    let held = tokio::spawn(async move {
        holding
            .should_rate_limit(simple("d", "held", "v"))
            .await
            .map(|r| r.into_inner().overall_code)
    });
    let in_flight = "floodgate_requests_in_flight";
    eventually("the call held", || async {
        gauge(server.http, in_flight).await == 1.0
    })
    .await;
    let idle = Attacker::connect(server.grpc).await;
    eventually("both admitted", || async {
        gauge(server.http, "floodgate_connections_open{port=\"grpc\"}").await == 2.0
    })
    .await;
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    eventually("the idle one closed", || async { idle.is_closed() }).await;
    assert_eq!(
        gauge(
            server.http,
            "floodgate_connections_evicted_total{port=\"grpc\"}"
        )
        .await,
        1.0
    );
    assert!(!held.is_finished(), "the held call was cut");

    // Every connection busy: the held call, and a stream that never sends its body.
    let mut waiting = Attacker::connect(server.grpc).await;
    waiting.open_streams(1).await;
    eventually("two calls in flight", || async {
        gauge(server.http, in_flight).await == 2.0
    })
    .await;
    let refused = TcpStream::connect(server.grpc).await.unwrap();
    time_to_close(refused).await;
    assert_eq!(
        gauge(
            server.http,
            "floodgate_connections_refused_total{port=\"grpc\"}"
        )
        .await,
        1.0
    );
    assert!(!waiting.is_closed() && !held.is_finished());
    // Shutting down answers the held call at once: its turn, a minute away, comes after
    // the connections are cut, so it is refused rather than admitted early.
    server.sigterm();
    assert_eq!(held.await.unwrap().unwrap(), Code::OverLimit as i32);
    let (exit, log) = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
}

/// PINGs (control frames, answered by the server) do not make a connection busy: the one
/// idle longest is closed to admit a new one although it has just pinged, and the younger
/// idle one that sent nothing stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_do_not_keep_a_connection_from_being_evicted() {
    let (server, _dir) = start(&["--grpc-max-connections", "2"]);
    let mut pinging = Attacker::connect(server.grpc).await;
    eventually("the first admitted", || async {
        gauge(server.http, "floodgate_connections_open{port=\"grpc\"}").await == 1.0
    })
    .await;
    let quiet = Attacker::connect(server.grpc).await;
    eventually("both admitted", || async {
        gauge(server.http, "floodgate_connections_open{port=\"grpc\"}").await == 2.0
    })
    .await;
    for _ in 0..3 {
        assert!(pinging.ping().await);
    }
    eventually("the pings answered", || async {
        pinging
            .seen
            .ping_acks
            .load(std::sync::atomic::Ordering::SeqCst)
            == 3
    })
    .await;
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    eventually("the pinging one closed", || async { pinging.is_closed() }).await;
    assert!(!quiet.is_closed());
    stop_within(server, STOP).await;
}

/// One `GET /healthcheck` on an HTTP/1.1 keep-alive `connection`, its response read whole
/// (the connection stays open for the next); the status.
async fn keep_alive_health(connection: &mut TcpStream) -> u16 {
    connection
        .write_all(b"GET /healthcheck HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        connection.read_exact(&mut byte).await.unwrap();
        response.push(byte[0]);
    }
    let head = String::from_utf8(response).unwrap().to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |length| length.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    connection.read_exact(&mut body).await.unwrap();
    head[9..12].parse().unwrap()
}

/// With `--handshake-timeout 3` (and idle timeouts far longer than the test), connections
/// that never send their opening are closed and counted: a silent one and a half HTTP/2
/// preface on gRPC, and on the admin port a request line that trickles in without ever
/// ending. Connections that did open are untouched: an HTTP/2 one opened first, and an
/// HTTP/1 keep-alive one, which still answers its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_do_not_open_in_time_are_closed() {
    // 3 s: every client that does open (the scrapes included) sends its opening at once,
    // but a loaded machine may stall it for a while.
    let (server, _dir) = start(&[
        "--handshake-timeout",
        "3",
        "--grpc-idle-timeout",
        "600",
        "--http-idle-timeout",
        "600",
    ]);
    let opened = Attacker::connect(server.grpc).await;
    let mut keep_alive = TcpStream::connect(server.http).await.unwrap();
    assert_eq!(keep_alive_health(&mut keep_alive).await, 200);

    let silent = TcpStream::connect(server.grpc).await.unwrap();
    let mut half = TcpStream::connect(server.grpc).await.unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let trickle = TcpStream::connect(server.http).await.unwrap();
    let (mut trickle_read, mut trickle_write) = trickle.into_split();
    let trickling = tokio::spawn(async move {
        trickle_write.write_all(b"GET /").await.unwrap();
        // A byte every 100 ms: never silent, never a whole line.
        while trickle_write.write_all(b"a").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    tokio::join!(
        time_to_close(silent),
        time_to_close(half),
        time_to_close(&mut trickle_read)
    );
    trickling.abort();
    assert_eq!(
        gauge(
            server.http,
            "floodgate_connections_handshake_timeouts_total{port=\"grpc\"}"
        )
        .await,
        2.0
    );
    // At least the trickled one (on a loaded machine a scrape of its own may count too).
    assert!(
        gauge(
            server.http,
            "floodgate_connections_handshake_timeouts_total{port=\"http\"}"
        )
        .await
            >= 1.0
    );
    assert!(!opened.is_closed(), "an opened connection was closed");
    assert_eq!(keep_alive_health(&mut keep_alive).await, 200);
    stop_within(server, STOP).await;
}

/// On a TLS gRPC port (`--handshake-timeout 5`), the handshake timeout covers the TLS
/// handshake and the HTTP/2 preface together: a connection that never starts its TLS handshake and one that completes it but
/// sends no preface are both closed and counted; a TLS client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_that_do_not_open_in_time_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let ca = support::certs::Ca::new("test CA");
    let leaf = ca.server(1);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--grpc-tls-cert-file",
        cert.to_str().unwrap(),
        "--grpc-tls-key-file",
        key.to_str().unwrap(),
        // Long enough for the served client's handshake on a loaded machine.
        "--handshake-timeout",
        "5",
        "--grpc-idle-timeout",
        "600",
    ]);
    let silent = TcpStream::connect(server.grpc).await.unwrap();
    let no_preface =
        support::tls::connect(server.grpc, &[&ca], None, rustls::DEFAULT_VERSIONS).await;
    let mut client = support::tls::client(server.grpc, &ca, None).await.unwrap();
    let answer = client.should_rate_limit(simple("d", "k", "v")).await;
    assert_eq!(answer.unwrap().into_inner().overall_code, Code::Ok as i32);
    tokio::join!(time_to_close(silent), time_to_close(no_preface));
    assert_eq!(
        gauge(
            server.http,
            "floodgate_connections_handshake_timeouts_total{port=\"grpc\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        gauge(
            server.http,
            "floodgate_tls_handshake_failures_total{reason=\"timeout\"}"
        )
        .await,
        1.0
    );
    stop_within(server, STOP).await;
}

/// The open-files soft limit is raised to the hard limit at start-up, so the connection
/// bounds apply before file descriptors run out.
#[tokio::test]
async fn open_files_limit_is_raised_to_the_hard_limit() {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let hard: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|h| h.parse().ok())
        .expect("a finite hard limit");
    let (server, _dir) = start(&[]);
    let log = stop_within(server, STOP).await;
    assert!(log.contains(&format!("open_files={hard}")), "{log}");
}

/// Out of file descriptors (a hard limit of 64 that cannot be raised): start-up warns that
/// the limit is below the connection bounds; while connections exhaust the descriptors,
/// `accept` failures are counted and logged at most once per 10 s instead of every attempt,
/// and the process does not spin (under half a core meanwhile); once the idle connections
/// are closed, both ports serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_accept_loop_pauses_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let server = Floodgate::start_with_open_files(
        64,
        &[
            "--config",
            limits.to_str().unwrap(),
            "--grpc-idle-timeout",
            "3",
        ],
    );
    assert_eq!(server.log_count("below the connection limits"), 1);
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(server.grpc).await.unwrap());
    }
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", server.child.id())).unwrap();
        let fields: Vec<u64> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().unwrap())
            .collect();
        fields.iter().sum::<u64>()
    };
    let started = Instant::now();
    let cpu_before = cpu();
    eventually("accept errors counted", || async {
        // Connecting to the admin port needs a descriptor of floodgate's too: poll by log.
        server.log_count("cannot accept connections") >= 1
    })
    .await;
    // Admitted in rounds as the idle ones are closed (every 3 s) and descriptors free up;
    // each is closed within time_to_close's DEADLINE (a hang guard, not a timing).
    futures_util::future::join_all(idle.into_iter().map(time_to_close)).await;
    let ticks = (cpu() - cpu_before) as f64;
    // About 100 ticks per CPU second: far below a spinning core over this window, with two
    // ticks to spare for the counter's 10 ms grain (on a slow start the idle connections may
    // all be closed before the window opens, leaving it near zero).
    let window = started.elapsed().as_secs_f64();
    assert!(
        ticks < 2.0 + 100.0 * window * 0.5,
        "{ticks} ticks in {window:.1} s"
    );
    assert!(
        server.log_count("cannot accept connections") <= 1 + (window / 10.0) as usize,
        "logged every attempt"
    );
    assert!(
        metric(server.http, "floodgate_accept_errors_total{port=\"grpc\"}")
            .await
            .unwrap()
            >= 1.0
    );
    assert_eq!(legit(server.grpc).await.unwrap(), Code::Ok as i32);
    stop_within(server, STOP).await;
}

/// Checks one Prometheus text line: `name{label="value",...} number`, with only the escapes
/// the format allows inside values.
fn well_formed(line: &str) -> bool {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return false;
    }
    let mut rest = &line[name_end..];
    if let Some(labels) = rest.strip_prefix('{') {
        let mut chars = labels.char_indices();
        loop {
            // label name up to '='
            let mut saw_name = false;
            let eq = loop {
                match chars.next() {
                    Some((_, '=')) if saw_name => break true,
                    Some((_, c)) if c.is_ascii_alphanumeric() || c == '_' => saw_name = true,
                    _ => break false,
                }
            };
            if !eq || chars.next().map(|(_, c)| c) != Some('"') {
                return false;
            }
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\' | '"' | 'n')) => {}
                        _ => return false,
                    },
                    Some((_, '"')) => break,
                    Some((_, '\n')) | None => return false,
                    Some(_) => {}
                }
            }
            match chars.next() {
                Some((_, ',')) => continue,
                Some((at, '}')) => {
                    rest = &labels[at + 1..];
                    break;
                }
                _ => return false,
            }
        }
    }
    rest.strip_prefix(' ')
        .is_some_and(|value| value.parse::<f64>().is_ok() || value == "+Inf")
}

/// Request values with quotes, backslashes and newlines in a `detailed_metric` rule are
/// escaped (`/metrics` stays parseable, no series can be forged), and past
/// `--metrics-max-detailed-series` new values share the `_overflow` series, counted.
#[tokio::test]
async fn metric_labels_are_escaped_and_capped() {
    let (server, _dir) = start(&["--metrics-max-detailed-series", "10"]);
    let json = |value: &str| {
        serde_json::json!({
            "domain": "d",
            "descriptors": [{"entries": [{"key": "user", "value": value}]}]
        })
        .to_string()
    };
    for value in ["user\"1", "a\nforged_series 1", "back\\slash"] {
        assert_eq!(post_json(server.http, &json(value)).await.status, 200);
    }
    for i in 0..50 {
        assert_eq!(
            post_json(server.http, &json(&format!("u{i}"))).await.status,
            200
        );
    }
    let body = call(server.http, "GET", "/metrics", None).await.body;
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(well_formed(line), "malformed line: {line:?}");
    }
    assert!(!body.lines().any(|l| l.starts_with("forged_series")));
    assert!(body.contains(r#"rule="d.user_user\"1""#), "{body}");
    let detailed: std::collections::BTreeSet<&str> = body
        .lines()
        .filter(|l| l.starts_with("floodgate_rule_hits_total{"))
        .filter_map(|l| l.split("rule=\"").nth(1))
        .collect();
    assert_eq!(detailed.len(), 11, "{detailed:?}");
    assert!(body.contains("rule=\"_overflow\""), "{body}");
    assert_eq!(
        metric(server.http, "floodgate_rule_series_overflow_total").await,
        Some(43.0)
    );
    stop_within(server, STOP).await;
}

/// Bytes that are not a RateLimitRequest are INVALID_ARGUMENT (a client error, not INTERNAL)
/// and counted as invalid.
#[tokio::test]
async fn undecodable_request_is_invalid_argument() {
    let (server, _dir) = start(&[]);
    // One uncompressed gRPC message of 3 bytes that no protobuf decoder accepts.
    let status = support::h2raw::grpc_status_of(
        server.grpc,
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        &[0, 0, 0, 0, 3, 0xff, 0xff, 0xff],
        true,
    )
    .await;
    assert_eq!(status, (tonic::Code::InvalidArgument as i32).to_string());
    assert_eq!(
        metric(server.http, "floodgate_requests_total{result=\"invalid\"}").await,
        Some(1.0)
    );
    stop_within(server, STOP).await;
}
