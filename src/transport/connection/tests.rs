use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::telemetry::metrics::Metrics;
use crate::transport::ConnectionLimits;
use crate::transport::connection_bound::Taken;

fn limits(max_connections: usize, idle_timeout: Duration) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        idle_timeout,
        handshake_timeout: Duration::from_secs(600),
    }
}

fn guarded(bound: &PortBound) -> (Guarded<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
    let (place, _) = bound.connections.take().unwrap();
    let (client, server) = tokio::io::duplex(64);
    let guard = Guard::new(place, bound, Instant::now());
    (Guarded::new(server, guard), client)
}

/// A read pending on an idle connection fails as soon as a new connection takes its
/// place, with no traffic and no timer; a connection with a call in flight is never
/// chosen, so the new one is refused.
#[tokio::test]
async fn an_evicted_connection_fails_its_pending_read() {
    let limits = limits(1, Duration::from_secs(600));
    let bound = PortBound::new(
        limits,
        Port::Grpc,
        TransportMetrics::register(&Metrics::new()),
    );
    let (mut idle, _client) = guarded(&bound);
    let read = tokio::spawn(async move { idle.read(&mut [0; 1]).await });
    // The single-threaded test runtime runs the read until it is pending.
    tokio::task::yield_now().await;
    assert!(!read.is_finished());
    let (busy, _client) = guarded(&bound);
    let read = tokio::time::timeout(Duration::from_secs(10), read).await;
    let error = read.expect("the read was not woken").unwrap().unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    let _call = busy.activity().unwrap().begin_call();
    assert!(bound.connections.take().is_none());
}

/// A call that starts on a connection just chosen to make way (hyper read its HEADERS
/// before the eviction) is not cut: reads go on until the call has ended and its answer
/// has been flushed, and only then fail.
#[tokio::test]
async fn a_call_racing_its_eviction_is_answered_before_the_close() {
    use futures_util::FutureExt;
    let limits = limits(1, Duration::from_secs(600));
    let bound = PortBound::new(
        limits,
        Port::Http,
        TransportMetrics::register(&Metrics::new()),
    );
    let (mut raced, mut client) = guarded(&bound);
    let (_newcomer, taken) = bound.connections.take().unwrap();
    assert_eq!(taken, Taken::Evicted);
    let call = raced.activity().unwrap().begin_call();
    // The rest of the call's request still reaches it.
    client.write_all(b"body").await.unwrap();
    let mut buf = [0; 4];
    raced.read_exact(&mut buf).await.unwrap();
    drop(call);
    // Answered but not flushed: the read waits rather than failing.
    raced.write_all(b"answer").await.unwrap();
    assert!(raced.read(&mut buf).now_or_never().is_none());
    raced.flush().await.unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), raced.read(&mut buf))
        .await
        .expect("the read was not woken")
        .unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    let mut answer = [0; 6];
    client.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"answer");
}

/// A connection works until its lifetime is over, then its reads and writes fail; without
/// one it never does.
#[tokio::test]
async fn an_aged_connection_is_cut() {
    let (mut client, server) = tokio::io::duplex(64);
    // Long enough that a loaded machine still reads before the lifetime ends (the read
    // right below must succeed); the test waits it out once.
    let mut aged = Guarded::unbounded(server).cut_after(Some(Duration::from_secs(1)));
    client.write_all(b"hi").await.unwrap();
    let mut buf = [0; 2];
    aged.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"hi");
    // A read pending when the lifetime ends fails then, without any traffic.
    let error = aged.read(&mut buf).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    assert!(aged.write(b"x").await.is_err());
    let never = Guarded::unbounded(client).cut_after(None);
    assert!(never.guard.timer.is_none() && never.guard.cut_at.is_none());
}

/// A connection whose age cut and idle timeout are over together is closed once, by
/// its one timer, for its age: the idle close is not counted, and its writes fail too.
#[tokio::test]
async fn an_aged_idle_connection_closes_once_for_its_age() {
    let metrics = Metrics::new();
    let bound = PortBound::new(
        limits(1, Duration::ZERO),
        Port::Grpc,
        TransportMetrics::register(&metrics),
    );
    let (guarded, _client) = guarded(&bound);
    let mut guarded = guarded.cut_after(Some(Duration::ZERO));
    let mut buf = [0; 1];
    let error = guarded.read(&mut buf).await.unwrap_err();
    assert_eq!(error.to_string(), cut().to_string());
    // Closed for good: later reads give the same reason, and nothing more is counted.
    let again = guarded.read(&mut buf).await.unwrap_err();
    assert_eq!(again.to_string(), cut().to_string());
    assert!(guarded.write(b"x").await.is_err());
    let text = metrics.encode();
    assert!(
        !text.contains("floodgate_connections_idle_closed_total{port=\"grpc\"} 1"),
        "{text}"
    );
}
