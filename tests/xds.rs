//! Limits from an xDS control plane: a test ADS management server (tonic, ephemeral port,
//! the real protocol) pushes configurations to the real binary, which answers real
//! ShouldRateLimit calls with the limits each push put in force.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use floodgate::proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use floodgate::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use floodgate::proto::rls::RateLimitResponse;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use floodgate::proto::rls_conf::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use floodgate::sources::xds::TYPE_URL;
use prost::Message;
use support::certs::{Ca, Pki, arg};
use support::http::call;
use support::process::Floodgate;
use support::redis::RedisServer;
use support::simple;
use support::tls;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

const DEADLINE: Duration = Duration::from_secs(30);

/// What the test control plane holds: the snapshot to push, and every request seen.
#[derive(Default)]
struct Shared {
    /// `(version, configurations)` pushed to every stream, now and on each change.
    snapshot: Mutex<Option<(String, Vec<RateLimitConfig>)>>,
    /// Every request received, in order, and the stream it came on.
    seen: Mutex<Vec<(u64, DiscoveryRequest)>>,
    /// Streams opened so far.
    streams: Mutex<u64>,
    /// Nonces handed out so far.
    nonces: Mutex<u64>,
}

/// A management server: a snapshot pushed to every ADS stream.
#[derive(Clone)]
struct ControlPlane {
    shared: Arc<Shared>,
    /// (changes, streams ended so far by `kill_streams`).
    epoch: watch::Sender<(u64, u64)>,
}

impl ControlPlane {
    fn new() -> ControlPlane {
        let (epoch, _) = watch::channel((0, 0));
        ControlPlane {
            shared: Arc::new(Shared::default()),
            epoch,
        }
    }

    /// Serves ADS on `addr` (port 0: an ephemeral one), with TLS when `tls` is given.
    async fn serve(&self, addr: SocketAddr, tls: Option<&Pki>) -> (SocketAddr, JoinHandle<()>) {
        let tls = tls.map(|pki| {
            ServerTlsConfig::new().identity(Identity::from_pem(
                std::fs::read(&pki.server_cert).unwrap(),
                std::fs::read(&pki.server_key).unwrap(),
            ))
        });
        self.serve_with(addr, tls).await
    }

    /// Serves ADS on `addr` with the TLS configuration `tls`, if any.
    async fn serve_with(
        &self,
        addr: SocketAddr,
        tls: Option<ServerTlsConfig>,
    ) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let router = builder.add_service(AggregatedDiscoveryServiceServer::new(self.clone()));
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (addr, task)
    }

    /// Pushes `configs` as `version` to every stream.
    fn push(&self, version: &str, configs: Vec<RateLimitConfig>) {
        *self.shared.snapshot.lock().unwrap() = Some((version.to_string(), configs));
        self.epoch.send_modify(|(n, _)| *n += 1);
    }

    /// Ends every open stream with UNAVAILABLE (as a control plane going away does).
    fn kill_streams(&self) {
        self.epoch.send_modify(|(n, kills)| {
            *n += 1;
            *kills += 1;
        });
    }

    /// The request that answers the response with `nonce`, once it has arrived.
    async fn answer_to(&self, nonce: &str) -> DiscoveryRequest {
        self.until(|seen| {
            seen.iter()
                .map(|(_, r)| r)
                .find(|r| r.response_nonce == nonce)
                .cloned()
        })
        .await
    }

    /// The last nonce handed out.
    fn last_nonce(&self) -> String {
        self.shared.nonces.lock().unwrap().to_string()
    }

    /// Polls the requests seen until `found` returns something.
    async fn until<T>(&self, found: impl Fn(&[(u64, DiscoveryRequest)]) -> Option<T>) -> T {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(t) = found(&self.shared.seen.lock().unwrap()) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "control plane: not seen in {:?}",
                self.shared.seen.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let shared = self.shared.clone();
        let mut epoch = self.epoch.subscribe();
        let kills = epoch.borrow().1;
        let stream = {
            let mut streams = shared.streams.lock().unwrap();
            *streams += 1;
            *streams
        };
        tokio::spawn(async move {
            // The first request subscribes; the snapshot in place follows it.
            match incoming.message().await {
                Ok(Some(first)) => shared.seen.lock().unwrap().push((stream, first)),
                _ => return,
            }
            epoch.mark_changed();
            loop {
                tokio::select! {
                    message = incoming.message() => match message {
                        Ok(Some(r)) => shared.seen.lock().unwrap().push((stream, r)),
                        _ => return,
                    },
                    changed = epoch.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if epoch.borrow_and_update().1 != kills {
                            let _ = tx.send(Err(Status::unavailable("control plane going away"))).await;
                            return;
                        }
                        let snapshot = shared.snapshot.lock().unwrap().clone();
                        let Some((version, configs)) = snapshot else { continue };
                        let nonce = {
                            let mut nonces = shared.nonces.lock().unwrap();
                            *nonces += 1;
                            nonces.to_string()
                        };
                        let response = DiscoveryResponse {
                            version_info: version,
                            resources: configs.iter().map(|c| prost_types::Any {
                                type_url: TYPE_URL.into(),
                                value: c.encode_to_vec(),
                            }).collect(),
                            canary: false,
                            type_url: TYPE_URL.into(),
                            nonce,
                        };
                        if tx.send(Ok(response)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Domain `edge`: `k=v` limited to `rpu` per hour (`unit` overrides the unit).
fn edge(rpu: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "k".into(),
            value: "v".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

async fn ask(server: &Floodgate) -> RateLimitResponse {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    client
        .should_rate_limit(simple("edge", "k", "v"))
        .await
        .unwrap()
        .into_inner()
}

/// The configured requests per unit of `edge`'s `k=v` (None: no limit matched).
async fn limit(server: &Floodgate) -> Option<u32> {
    ask(server).await.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

async fn until_limit(server: &Floodgate, expected: u32) {
    let deadline = Instant::now() + DEADLINE;
    while limit(server).await != Some(expected) {
        assert!(Instant::now() < deadline, "limit never became {expected}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn healthcheck(server: &Floodgate) -> u16 {
    call(server.http, "GET", "/healthcheck", None).await.status
}

/// Waits for `/healthcheck` to answer 200: readiness follows a first load through the
/// health task, a moment after the limits are in force.
async fn until_ready(server: &Floodgate) {
    support::eventually("/healthcheck 200", || async {
        healthcheck(server).await == 200
    })
    .await;
}

fn start(url: &str, extra: &[&str]) -> Floodgate {
    let mut args = vec![
        "--config-xds",
        url,
        "--xds-node-id",
        "test-node",
        "--xds-node-metadata",
        "zone:a",
        "--xds-headers",
        "x-tenant:blue",
        "--xds-backoff-initial",
        "0.05",
        "--xds-backoff-max",
        "0.2",
    ];
    args.extend_from_slice(extra);
    Floodgate::start(&args)
}

/// A push is ACKed and enforced, a bad push is NACKed with the loader's error while the old
/// limits stay enforced, an update takes over, and after the control plane restarts the
/// stream resumes with the last version and nonce while the limits in force keep answering.
#[tokio::test]
async fn push_nack_update_and_restart() {
    let plane = ControlPlane::new();
    plane.push("v1", vec![edge(2, RateLimitUnit::Hour)]);
    let (addr, task) = plane.serve("127.0.0.1:0".parse().unwrap(), None).await;
    let server = start(&addr.to_string(), &[]);

    // v1: ACKed (version echoed, no error), and the node says who it is.
    until_limit(&server, 2).await;
    let ack = plane.answer_to("1").await;
    assert_eq!(ack.version_info, "v1");
    assert!(ack.error_detail.is_none());
    let node = ack.node.unwrap();
    assert_eq!(node.id, "test-node");
    assert_eq!(
        node.metadata.unwrap().fields["zone"].kind,
        Some(prost_types::value::Kind::StringValue("a".into()))
    );
    assert_eq!(ack.type_url, TYPE_URL);
    until_ready(&server).await;

    // v2 does not load: NACKed with the loader's error, v1 stays in force.
    plane.push("v2", vec![edge(5, RateLimitUnit::Unknown)]);
    let nack = plane.answer_to("2").await;
    assert_eq!(
        nack.version_info, "v1",
        "a NACK names the version still in force"
    );
    let detail = nack.error_detail.unwrap();
    assert!(
        detail
            .message
            .contains("xds:edge: descriptors[0].rate_limit"),
        "{}",
        detail.message
    );
    // The second of two per hour passes, the third is over the limit: v1 enforced.
    let second = ask(&server).await;
    assert_eq!(second.overall_code, 1);
    assert_eq!(
        second.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        2
    );
    assert_eq!(
        ask(&server).await.overall_code,
        2,
        "v1's limit is enforced after the NACK"
    );
    let metrics = call(server.http, "GET", "/metrics", None).await.body;
    assert!(
        metrics.contains("floodgate_config_loads_total{result=\"error\"} 1"),
        "{metrics}"
    );

    // v3: an update, ACKed and in force.
    plane.push("v3", vec![edge(50, RateLimitUnit::Minute)]);
    until_limit(&server, 50).await;
    assert_eq!(plane.answer_to("3").await.version_info, "v3");

    // The control plane goes away: the limits in force keep answering.
    plane.kill_streams();
    task.abort();
    let _ = task.await;
    assert_eq!(limit(&server).await, Some(50));
    assert_eq!(
        healthcheck(&server).await,
        200,
        "still ready without a control plane"
    );

    // It comes back on the same address: the new stream resumes from v3 and its nonce.
    let last_nonce = plane.last_nonce();
    let (_, task) = plane.serve(addr, None).await;
    let resumed = plane
        .until(|seen| {
            seen.iter()
                .find(|(stream, _)| *stream > 1)
                .map(|(_, r)| r.clone())
        })
        .await;
    assert_eq!(resumed.version_info, "v3");
    assert_eq!(resumed.response_nonce, last_nonce);
    plane.push("v4", vec![edge(7, RateLimitUnit::Minute)]);
    until_limit(&server, 7).await;
    server.stop().await;
    task.abort();
}

/// Domain `bulk`: `n` rules `k=v<i>`, each its own per-minute limit (the smallest encoding a
/// rule has: a few bytes each, so a push of many stays within the gRPC message limit).
fn bulk(n: usize) -> RateLimitConfig {
    RateLimitConfig {
        name: "bulk".into(),
        domain: "bulk".into(),
        descriptors: (0..n)
            .map(|i| RateLimitDescriptor {
                key: "k".into(),
                value: format!("v{i}"),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Minute as i32,
                    requests_per_unit: 10,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    }
}

/// The process's peak resident set (`VmHWM`), in MiB.
fn peak_rss_mib(server: &Floodgate) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kib / 1024
}

/// The memory limit of the shipped manifests (deploy/kubernetes/base/deployment.yaml).
const POD_MEMORY_LIMIT_MIB: u64 = 256;

/// A push over the rule cap (200,000 rules in a 2 MB message) is NACKed naming the count and
/// the cap, before anything is converted, and the limits in force stay; a push at the cap is
/// accepted; and either way the process's peak memory stays within the manifests' limit.
#[tokio::test]
async fn pushes_are_bounded_by_the_rule_cap() {
    let plane = ControlPlane::new();
    plane.push("v1", vec![edge(2, RateLimitUnit::Hour)]);
    let (addr, task) = plane.serve("127.0.0.1:0".parse().unwrap(), None).await;
    let server = start(&addr.to_string(), &[]);
    until_limit(&server, 2).await;

    let huge = bulk(200_000);
    assert!(huge.encoded_len() < 4 << 20, "within tonic's message limit");
    plane.push("v2", vec![edge(5, RateLimitUnit::Hour), huge]);
    let nack = plane.answer_to("2").await;
    assert_eq!(nack.version_info, "v1");
    let message = nack.error_detail.unwrap().message;
    let cap = floodgate::config::MAX_LOAD_RULES;
    for expected in [
        "xds:bulk".to_owned(),
        "200001 rules".to_owned(),
        format!("more than the {cap} one load may hold (--max-load-rules)"),
    ] {
        assert!(message.contains(&expected), "{expected}: {message}");
    }
    assert_eq!(limit(&server).await, Some(2), "the limits in force stay");
    let peak = peak_rss_mib(&server);
    assert!(peak < POD_MEMORY_LIMIT_MIB, "peak RSS {peak} MiB");
    eprintln!("peak RSS after the refused push: {peak} MiB");
    server.stop().await;
    task.abort();

    // A push of as many rules as the cap allows is accepted and enforced, within the limit
    // too: measured on a fresh process (the peak only ever grows), after the other one is
    // gone, so that the two loads do not compete for the loader's deadline.
    let mut at_cap = bulk(cap - 1);
    at_cap
        .descriptors
        .push(edge(9, RateLimitUnit::Hour).descriptors.remove(0));
    at_cap.domain = "edge".into();
    let plane = ControlPlane::new();
    plane.push("v1", vec![at_cap]);
    let (addr, task) = plane.serve("127.0.0.1:0".parse().unwrap(), None).await;
    let server = start(&addr.to_string(), &[]);
    let ack = plane.answer_to("1").await;
    assert!(ack.error_detail.is_none(), "{:?}", ack.error_detail);
    until_limit(&server, 9).await;
    let peak = peak_rss_mib(&server);
    assert!(peak < POD_MEMORY_LIMIT_MIB, "peak RSS {peak} MiB");
    eprintln!("peak RSS after the accepted push of {cap} rules: {peak} MiB");
    server.stop().await;
    task.abort();
}

/// Until a first configuration has loaded the server is not ready, and `/healthcheck` says
/// why; after it, it is ready.
#[tokio::test]
async fn not_ready_until_first_config() {
    let plane = ControlPlane::new();
    let (addr, task) = plane.serve("127.0.0.1:0".parse().unwrap(), None).await;
    let server = start(&addr.to_string(), &[]);
    // Subscribed, nothing pushed yet: NOT_SERVING.
    plane.until(|seen| seen.first().cloned()).await;
    let reply = call(server.http, "GET", "/healthcheck", None).await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.body.starts_with("NOT_SERVING: no limits loaded yet"),
        "{}",
        reply.body
    );
    assert_eq!(support::health(server.grpc).await, 2);
    plane.push("v1", vec![edge(3, RateLimitUnit::Second)]);
    until_limit(&server, 3).await;
    until_ready(&server).await;
    server.stop().await;
    task.abort();
}

/// With --xds-force-start the server is ready (answering OK) before any configuration.
#[tokio::test]
async fn force_start_serves_before_first_config() {
    let plane = ControlPlane::new();
    let (addr, task) = plane.serve("127.0.0.1:0".parse().unwrap(), None).await;
    let server = start(&addr.to_string(), &["--xds-force-start"]);
    plane.until(|seen| seen.first().cloned()).await;
    assert_eq!(healthcheck(&server).await, 200);
    assert_eq!(limit(&server).await, None);
    server.stop().await;
    task.abort();
}

/// The ADS stream runs over TLS, verifying the control plane against the given CA.
#[tokio::test]
async fn over_tls() {
    let pki = Pki::generate();
    let plane = ControlPlane::new();
    plane.push("v1", vec![edge(4, RateLimitUnit::Hour)]);
    let (addr, task) = plane
        .serve("127.0.0.1:0".parse().unwrap(), Some(&pki))
        .await;
    let server = start(
        &format!("localhost:{}", addr.port()),
        &["--xds-tls", "--xds-tls-ca", arg(&pki.ca)],
    );
    until_limit(&server, 4).await;
    server.stop().await;
    task.abort();
}

/// The mapping file Envoy Gateway mounts at `/etc/statsd-exporter/conf.yaml` (its
/// `statsd_conf.yaml`; the mapper's unit tests read it too).
const EG_MAPPER: &str = include_str!("data/envoy-gateway-statsd-conf.yaml");

/// A mapping of the per-policy kind a mapping file adds: a glob for one domain, with labels
/// of its own, ahead of the generic ones.
const EG_POLICY_MAPPING: &str = r#"  - match: "ratelimit.service.rate_limit.edge.*.over_limit"
    name: "eg_policy_over_limit"
    labels:
      policy: "edge-policy"
      key: "$1"
"#;

/// Started as Envoy Gateway starts the reference (`/bin/ratelimit`, no arguments, every
/// variable its rate-limit Deployment sets, files where it mounts them but under a temporary
/// root): floodgate subscribes to a management server over mutual TLS with the gateway's CA
/// and ACKs, answers Envoy over TLS without asking it for a certificate
/// (`GRPC_SERVER_TLS_CA_CERT` is not the reference's), counts in Redis, and serves on
/// PROMETHEUS_ADDR the names and labels of the PROMETHEUS_MAPPER_YAML file.
#[tokio::test]
async fn envoy_gateway_environment() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let write = |relative: &str, text: &str| -> String {
        let path = dir.path().join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    // Envoy Gateway's one secret: its CA, and a certificate that serves gRPC and
    // authenticates to the xDS server.
    let ca = Ca::new("envoy-gateway");
    let own = ca.server_and_client("envoy-ratelimit");
    let ca_file = write("certs/ca.crt", &ca.pem);
    let cert_file = write("certs/tls.crt", &own.cert_pem);
    let key_file = write("certs/tls.key", &own.key_pem);
    let mapper = EG_MAPPER.replacen("mappings:\n", &format!("mappings:\n{EG_POLICY_MAPPING}"), 1);
    let mapper_file = write("etc/statsd-exporter/conf.yaml", &mapper);
    // The management server presents a certificate of the same CA and requires one.
    let plane = ControlPlane::new();
    plane.push("v1", vec![edge(1, RateLimitUnit::Day)]);
    let control = ca.server(2);
    let mutual = ServerTlsConfig::new()
        .identity(Identity::from_pem(&control.cert_pem, &control.key_pem))
        .client_ca_root(Certificate::from_pem(&ca.pem));
    let (addr, task) = plane
        .serve_with("127.0.0.1:0".parse().unwrap(), Some(mutual))
        .await;
    let xds_url = format!("localhost:{}", addr.port());
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let (server, _link) = Floodgate::start_as_ratelimit(&[
        // internal/infrastructure/kubernetes/ratelimit/resource.go, in its order.
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", &xds_url),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert_file),
        ("GRPC_SERVER_TLS_KEY", &key_file),
        ("GRPC_SERVER_TLS_CA_CERT", &ca_file),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &cert_file),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &key_file),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca_file),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", &redis_url),
        ("USE_PROMETHEUS", "true"),
        // Envoy Gateway's is ":19001": ephemeral and loopback here, as every port below.
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_MAPPER_YAML", &mapper_file),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        // A loaded test machine must not turn the first Redis call into a deadline miss.
        ("FLOODGATE_REDIS_TIMEOUT_MS", "1000"),
    ]);

    // Subscribed over mutual TLS (the server requires the client certificate) and ACKed.
    let ack = plane.answer_to("1").await;
    assert_eq!(ack.version_info, "v1");
    assert!(ack.error_detail.is_none(), "{ack:?}");
    assert_eq!(ack.node.unwrap().id, "envoy-ratelimit");

    // Envoy over TLS, trusting the gateway's CA, with no certificate of its own.
    let mut rls = tls::client(server.grpc, &ca, None).await.unwrap();
    support::eventually("the pushed limit in force", || {
        let mut rls = rls.clone();
        async move {
            // Until the push is applied the descriptor matches nothing (a bare OK); the first
            // request the limit counts is the one it allows per day.
            rls.should_rate_limit(simple("edge", "k", "v"))
                .await
                .is_ok_and(|r| r.into_inner().statuses[0].current_limit.is_some())
        }
    })
    .await;
    let second = rls
        .should_rate_limit(simple("edge", "k", "v"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.overall_code, 2, "one per day: the second is over");

    // A scrape of PROMETHEUS_ADDR: the file's names and labels.
    let target = server.logged_addr("serving the reference's Prometheus series");
    let scrape = call(target, "GET", "/metrics", None).await;
    assert_eq!(scrape.status, 200);
    let text = scrape.body;
    for expected in [
        "eg_policy_over_limit{key=\"k_v\",policy=\"edge-policy\"} 1\n",
        "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"k_v\"} 2\n",
        "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"k_v\"} 1\n",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} ",
        "# TYPE ratelimit_service_response_time_seconds histogram\n",
        "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"} ",
    ] {
        assert!(text.contains(expected), "{expected} not in:\n{text}");
    }
    // The policy's mapping, first in the file, took the domain's over_limit.
    assert!(
        !text.contains("ratelimit_service_rate_limit_over_limit{domain=\"edge\""),
        "{text}"
    );
    let log = server.stop().await;
    assert!(
        log.contains("GRPC_SERVER_TLS_CA_CERT (not read by the reference"),
        "{log}"
    );
    task.abort();
}
