//! The reference's statsd stats from the real binary: a listener in the test (TCP or UDP,
//! ephemeral port) receives every line and checks its bytes: the reference's names, counter
//! deltas, `|ms` timers, `EXTRA_TAGS` in gostats' and dogstatsd's encodings; with the
//! statsd host gone, requests are answered and the lost lines counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate::proto::envoy::r#type::v3::RateLimitUnit;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::http::metric;
use support::process::Floodgate;
use support::{descriptor, eventually, request, simple, with_override};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, UdpSocket};
use tonic::transport::Channel;

const LIMITS: &str = r#"
domain: test
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 5}
"#;

/// Everything a statsd listener received, as text.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<u8>>>);

impl Received {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// Sum of the values of lines `name:<v>|kind`, and how many lines there were.
    fn sum(&self, name: &str, kind: &str) -> (u64, usize) {
        let text = self.text();
        let values: Vec<u64> = text
            .lines()
            .filter_map(|line| {
                let (n, rest) = line.split_once(':')?;
                let (v, k) = rest.split_once('|')?;
                (n == name && k == kind).then(|| v.parse().unwrap())
            })
            .collect();
        (values.iter().sum(), values.len())
    }
}

/// A TCP statsd listener on an ephemeral port, accepting every connection.
async fn tcp_listener() -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, serve_tcp(listener))
}

fn serve_tcp(listener: TcpListener) -> Received {
    let received = Received::default();
    let sink = received.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    sink.0.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    received
}

/// A UDP statsd listener; each datagram must end with a newline (whole lines only).
async fn udp_listener() -> (SocketAddr, Received) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let received = Received::default();
    let sink = received.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 65536];
        while let Ok(n) = socket.recv(&mut buf).await {
            assert!(n <= 1432 && buf[n - 1] == b'\n', "datagram of {n} bytes");
            sink.0.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (addr, received)
}

/// A `RUNTIME_ROOT` tree with [`LIMITS`], kept alive with the returned directory.
fn runtime_tree() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("test.yaml"), LIMITS).unwrap();
    let root = tmp.path().to_str().unwrap().to_string();
    (tmp, root)
}

/// The reference's environment on ephemeral ports, plus `extra`.
fn reference_env<'a>(root: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("STATSD_HOST", "127.0.0.1"),
        ("STATS_FLUSH_INTERVAL", "100ms"),
    ];
    env.extend_from_slice(extra);
    env
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// With only the reference's environment (USE_STATSD unset: on by default), the reference's
/// stat names reach a TCP statsd at STATSD_HOST:STATSD_PORT, byte-exact: counters as their
/// deltas, `detailed_metric` keys sanitized, unknown domains per descriptor, service errors,
/// and one `total_requests` count and `|ms` timer line per gRPC call.
#[tokio::test]
async fn reference_environment_sends_reference_stats_over_tcp() {
    let (addr, received) = tcp_listener().await;
    let (_tmp, root) = runtime_tree();
    let port = addr.port().to_string();
    let server = Floodgate::start_with_env(&[], &reference_env(&root, &[("STATSD_PORT", &port)]));
    let rls = client(server.grpc).await;
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    let code =
        |r: tonic::Response<floodgate::proto::rls::RateLimitResponse>| r.into_inner().overall_code;
    let ask = |req| {
        let mut rls = rls.clone();
        async move { rls.should_rate_limit(req).await }
    };
    assert_eq!(
        code(ask(simple("test", "key1", "value1")).await.unwrap()),
        ok
    );
    assert_eq!(
        code(ask(simple("test", "key1", "value1")).await.unwrap()),
        over
    );
    assert_eq!(code(ask(simple("test", "shadow", "x")).await.unwrap()), ok);
    assert_eq!(code(ask(simple("test", "shadow", "x")).await.unwrap()), ok);
    let ip = simple("test", "remote_address", "10.0.0.1");
    assert_eq!(code(ask(ip).await.unwrap()), ok);
    let unknown = request(
        "nope",
        vec![descriptor(&[("a", "b")]), descriptor(&[("c", "d")])],
    );
    assert_eq!(code(ask(unknown).await.unwrap()), ok);
    assert!(ask(request("test", vec![])).await.is_err());
    // A rule-less descriptor of a known domain: no rule stat, but a call.
    assert_eq!(code(ask(simple("test", "other", "x")).await.unwrap()), ok);
    // A descriptor limit override counts under the request's own entries, as the
    // reference's descriptorKey.
    let overridden = request(
        "test",
        vec![with_override(
            descriptor(&[("user", "u:1"), ("path", "")]),
            10,
            RateLimitUnit::Day as i32,
        )],
    );
    assert_eq!(code(ask(overridden).await.unwrap()), ok);
    let calls = 9;

    let rule = "ratelimit.service.rate_limit.test";
    let expected: BTreeMap<String, u64> = [
        ("ratelimit.service.config_load_success".to_string(), 1),
        (format!("{rule}.key1_value1.total_hits"), 2),
        (format!("{rule}.key1_value1.within_limit"), 1),
        (format!("{rule}.key1_value1.over_limit"), 1),
        // Limit 1: the near-limit threshold is floor(0.8 × 1) = 0, so the admitted hit is
        // near the limit, in the reference too.
        (format!("{rule}.key1_value1.near_limit"), 1),
        (format!("{rule}.shadow.near_limit"), 1),
        (format!("{rule}.shadow.total_hits"), 2),
        (format!("{rule}.shadow.within_limit"), 1),
        (format!("{rule}.shadow.over_limit"), 1),
        (format!("{rule}.shadow.shadow_mode"), 1),
        (format!("{rule}.remote_address_10_0_0_1.total_hits"), 1),
        (format!("{rule}.remote_address_10_0_0_1.within_limit"), 1),
        (format!("{rule}.user_u_1.path.total_hits"), 1),
        (format!("{rule}.user_u_1.path.within_limit"), 1),
        (
            "ratelimit.service.rate_limit.nope.domain_not_found".to_string(),
            2,
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error".to_string(),
            1,
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests".to_string(),
            calls,
        ),
    ]
    .into_iter()
    .collect();
    eventually("every expected counter total", || {
        std::future::ready({
            expected
                .iter()
                .all(|(name, want)| received.sum(name, "c").0 == *want)
                && received
                    .sum("ratelimit_server.ShouldRateLimit.response_time", "ms")
                    .1
                    == calls as usize
        })
    })
    .await;
    // Byte-exact: every line is `name:integer|c` or `|ms`, and no name outside the set.
    for line in received.text().lines() {
        let (name, rest) = line.split_once(':').unwrap();
        let (value, kind) = rest.split_once('|').unwrap();
        assert!(value.parse::<u64>().is_ok(), "{line}");
        match kind {
            "c" => assert!(expected.contains_key(name), "unexpected stat {line}"),
            "ms" => assert_eq!(name, "ratelimit_server.ShouldRateLimit.response_time"),
            _ => panic!("unexpected type in {line}"),
        }
    }
    assert!(received.text().ends_with('\n'));
    server.stop().await;
}

/// STATSD_PROTOCOL=udp and EXTRA_TAGS: whole lines in datagrams, tags as gostats serializes
/// them (`.__key=value`, sorted, `.` in values as `_`); with USE_DOG_STATSD (and
/// USE_STATSD=false, as the reference requires) dogstatsd's `|#key:value` over UDP.
#[tokio::test]
async fn udp_tags_and_dogstatsd() {
    let (_tmp, root) = runtime_tree();
    for (dog, want) in [
        (
            false,
            "ratelimit.service.config_load_success.__app=rl.__zone=eu_west:1|c\n",
        ),
        (
            true,
            "ratelimit.service.config_load_success:1|c|#app:rl,zone:eu_west\n",
        ),
    ] {
        let (addr, received) = udp_listener().await;
        let port = addr.port().to_string();
        let mut extra = vec![
            ("STATSD_PORT", port.as_str()),
            ("EXTRA_TAGS", "zone:eu.west,app:rl"),
        ];
        if dog {
            extra.extend([("USE_DOG_STATSD", "true"), ("USE_STATSD", "false")]);
        } else {
            extra.push(("STATSD_PROTOCOL", "udp"));
        }
        let server = Floodgate::start_with_env(&[], &reference_env(&root, &extra));
        client(server.grpc)
            .await
            .should_rate_limit(simple("test", "key1", "value1"))
            .await
            .unwrap();
        let total = if dog {
            "ratelimit.service.rate_limit.test.key1_value1.total_hits:1|c|#app:rl,zone:eu_west\n"
        } else {
            "ratelimit.service.rate_limit.test.key1_value1.total_hits.__app=rl.__zone=eu_west:1|c\n"
        };
        eventually("tagged lines", || {
            std::future::ready({
                let text = received.text();
                text.contains(want) && text.contains(total)
            })
        })
        .await;
        server.stop().await;
    }
}

/// The statsd host gone: requests are answered all the same, the lines lost are counted in
/// floodgate_statsd_dropped_lines_total, and once a statsd listens there again the stats
/// arrive (the sink re-dials).
#[tokio::test]
async fn statsd_host_down_costs_requests_nothing() {
    // A port nothing listens on, outside the ephemeral range: the sink's re-dials can neither
    // take it nor connect to themselves on it before the test listens there again.
    let port = support::redis::free_port();
    let tmp = tempfile::tempdir().unwrap();
    let limits = tmp.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let statsd = format!("127.0.0.1:{port}");
    let server = Floodgate::start(&[
        "--config",
        limits.to_str().unwrap(),
        "--statsd-addr",
        &statsd,
        "--statsd-flush-interval",
        "0.05",
    ]);
    let mut rls = client(server.grpc).await;
    for _ in 0..20 {
        let answer = rls
            .should_rate_limit(simple("test", "remote_address", "a"))
            .await
            .unwrap();
        assert!(answer.into_inner().overall_code > 0);
    }
    let http = server.http;
    let mut dropped = 0.0;
    let deadline = Instant::now() + support::EVENTUALLY;
    while dropped == 0.0 {
        assert!(Instant::now() < deadline, "no drop counted");
        dropped = metric(http, "floodgate_statsd_dropped_lines_total")
            .await
            .unwrap_or(0.0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The host comes back: the next stats reach it.
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let received = serve_tcp(listener);
    let mut rls2 = rls.clone();
    let deadline = Instant::now() + support::EVENTUALLY;
    while received
        .sum("ratelimit_server.ShouldRateLimit.total_requests", "c")
        .0
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "stats never arrived after reconnect"
        );
        rls2.should_rate_limit(simple("test", "remote_address", "a"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// With the reference's Redis (REDIS_URL, REDIS_POOL_SIZE), its pool stats: every connection
/// opened counted once in `ratelimit.redis_pool.cx_total` (each thread that calls Redis opens
/// its own: the probe's and each gRPC thread's that served a request), and `cx_active`, as
/// many while none closed, sent as a gauge at every flush; the rule stats of a Redis-backed request as
/// with memory.
#[tokio::test]
async fn redis_pool_stats() {
    let redis = support::redis::RedisServer::start();
    let (addr, received) = tcp_listener().await;
    let (_tmp, root) = runtime_tree();
    let port = addr.port().to_string();
    let url = redis.address();
    let server = Floodgate::start_with_env(
        // A missed deadline retires a connection (counted in cx_local_close): generous ones.
        &[
            "--redis-timeout-ms",
            "2000",
            "--redis-connect-timeout-ms",
            "2000",
        ],
        &reference_env(
            &root,
            &[
                ("STATSD_PORT", &port),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", &url),
                ("REDIS_POOL_SIZE", "2"),
            ],
        ),
    );
    let mut rls = client(server.grpc).await;
    let deadline = Instant::now() + support::EVENTUALLY;
    // Health waits for Redis: ask until answered.
    while rls
        .should_rate_limit(simple("test", "key1", "value1"))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "Redis never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually("pool stats", || {
        std::future::ready({
            let opened = received.sum("ratelimit.redis_pool.cx_total", "c").0;
            opened >= 1
                && received
                    .text()
                    .contains(&format!("\nratelimit.redis_pool.cx_active:{opened}|g\n"))
                && received
                    .sum(
                        "ratelimit.service.rate_limit.test.key1_value1.total_hits",
                        "c",
                    )
                    .0
                    == 1
        })
    })
    .await;
    assert_eq!(
        received.sum("ratelimit.redis_pool.cx_local_close", "c").0,
        0
    );
    server.stop().await;
}
