//! The reference's Prometheus series from the real binary, read through a real Prometheus
//! server: floodgate started with the reference's environment and `USE_PROMETHEUS=true` on
//! ephemeral ports, a `prometheus` process scraping it every 200 ms, and PromQL queries on
//! the reference's series names answering the expected values.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use support::process::Floodgate;
use support::{eventually, simple};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMITS: &str = r#"
domain: test
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: day, requests_per_unit: 5}
"#;

/// A `prometheus` server scraping one target; killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` at `path` every 200 ms.
    fn scraping(target: SocketAddr, path: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n\
                 scrape_configs:\n  - job_name: floodgate\n    metrics_path: {path}\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        // Prometheus logs its configured address, not a bound one: take a free port.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is not installed: run scripts/install-test-tools.sh");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The value of the single series `promql` evaluates to now, if exactly one.
    async fn query(&self, promql: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let body = get(self.addr, &path).await?;
        let json: serde_json::Value =
            serde_json::from_str(&body[body.find('{')?..=body.rfind('}')?]).ok()?;
        let result = json["data"]["result"].as_array()?;
        if result.len() != 1 {
            return None;
        }
        result[0]["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path`'s body, or `None` while nothing listens.
async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The reference's environment with `USE_PROMETHEUS=true`: floodgate serves the reference's
/// series on PROMETHEUS_ADDR + PROMETHEUS_PATH, and a real Prometheus scraping them answers
/// PromQL on the reference's names: per-rule counters with domain/key1 (and key2) labels, the
/// error counter, total requests, config loads and the response-time histogram.
#[tokio::test]
async fn prometheus_scrapes_the_reference_series() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("test.yaml"), LIMITS).unwrap();
    let root = tmp.path().to_str().unwrap();
    let server = Floodgate::start_with_env(
        &[],
        &[
            ("RUNTIME_ROOT", root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_PATH", "/reference-metrics"),
            ("LOG_LEVEL", "info"),
        ],
    );
    let target = server.logged_addr("serving the reference's Prometheus series");

    let mut rls = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let mut codes = Vec::new();
    for request in [
        simple("test", "key1", "value1"),
        simple("test", "key1", "value1"),
        support::request("test", vec![support::descriptor(&[("a", "x"), ("b", "y")])]),
    ] {
        codes.push(
            rls.should_rate_limit(request)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32, Code::Ok as i32]
    );
    assert!(
        rls.should_rate_limit(support::request("test", vec![]))
            .await
            .is_err()
    );

    let prometheus = Prometheus::scraping(target, "/reference-metrics");
    let expected = [
        (
            r#"ratelimit_service_rate_limit_over_limit{domain="test",key1="key1_value1"}"#,
            1.0,
        ),
        (
            r#"ratelimit_service_rate_limit_total_hits{domain="test",key1="key1_value1"}"#,
            2.0,
        ),
        (
            r#"ratelimit_service_rate_limit_within_limit{domain="test",key1="a",key2="b"}"#,
            1.0,
        ),
        (
            r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#,
            1.0,
        ),
        (
            r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#,
            4.0,
        ),
        ("ratelimit_service_config_load_success", 1.0),
        (
            r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"}"#,
            4.0,
        ),
        (
            r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"}"#,
            4.0,
        ),
    ];
    for (promql, value) in expected {
        eventually(&format!("{promql} == {value}"), || async {
            prometheus.query(promql).await == Some(value)
        })
        .await;
    }
    // floodgate's own series are not on the reference's port.
    assert_eq!(prometheus.query("floodgate_requests_total").await, None);
    server.stop().await;
}
