//! The real Envoy as the test partner: Envoy's release binary (`.tools/bin/envoy`, installed by
//! `scripts/install-test-tools.sh`) started from a bootstrap built by the test, in front of the
//! floodgate under test.
//!
//! Every Envoy runs at `--concurrency 1` with hot restart off (no shared memory, so several
//! run at once), its admin on port 0 (the address read back from `--admin-address-path`) and
//! its front listener on port 0 (the bound port read from the admin's `/listeners`). The
//! backend is a second listener of the same Envoy, on a unix socket in the test's temporary
//! directory, that answers every request with a direct response: Envoy's HTTP rate-limit
//! filter does not rate limit a route with a direct response, so the front route forwards to
//! the `backend` cluster, and the filter's counters live under `cluster.backend.ratelimit.*`.
//! Envoy is killed on drop; its log is kept in the temporary directory and printed when the
//! test fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::eventually_within;

/// Where `scripts/install-test-tools.sh` links Envoy's binary.
pub fn binary() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/envoy");
    assert!(
        path.exists(),
        "Envoy is not installed at {}: run scripts/install-test-tools.sh envoy \
         (the Envoy tests never skip)",
        path.display()
    );
    path
}

/// Runs `envoy --mode validate -c path`: Ok, or Envoy's own words on why the config does not
/// load.
pub fn validate(path: &Path) -> Result<(), String> {
    let out = Command::new(binary())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(path)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The HTTP rate-limit filter's `typed_config` for `domain`, as deploy/envoy/envoy.yaml sets
/// it (fail open, x-ratelimit headers), with a timeout generous enough that a loaded test
/// machine never turns a slow answer into an RLS error.
pub fn ratelimit_filter(domain: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
        "domain": domain,
        "timeout": "5s",
        "failure_mode_deny": false,
        "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
        "rate_limit_service": {
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit"}}
        }
    })
}

/// An Envoy bootstrap: the front listener (`front`, port 0) routing every path to the
/// `backend` cluster, the backend listener (direct response 200), the `ratelimit` cluster
/// (HTTP/2) at the floodgate replicas given, and the HTTP filters the test adds before the
/// router. Built as JSON (YAML's subset) so a test can change any part.
pub struct Bootstrap {
    pub json: Value,
}

impl Bootstrap {
    /// A bootstrap with no filter but the router, its `ratelimit` cluster at `rls`.
    pub fn new(rls: &[SocketAddr]) -> Bootstrap {
        let endpoints: Vec<Value> = rls
            .iter()
            .map(|addr| {
                json!({"endpoint": {"address": {"socket_address": {
                    "address": addr.ip().to_string(), "port_value": addr.port()
                }}}})
            })
            .collect();
        let front = json!({
            "name": "front",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [hcm("front", json!({
                "name": "front",
                "virtual_hosts": [{
                    "name": "front", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "backend"}}]
                }]
            }))]}]
        });
        let backend = json!({
            "name": "backend",
            // The unix socket's path is set at start, in the Envoy's own directory.
            "address": {"pipe": {"path": ""}},
            "filter_chains": [{"filters": [hcm("backend", json!({
                "name": "backend",
                "virtual_hosts": [{
                    "name": "backend", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"},
                                "direct_response": {"status": 200, "body": {"inline_string": "ok"}}}]
                }]
            }))]}]
        });
        let json = json!({
            "static_resources": {
                "listeners": [front, backend],
                "clusters": [
                    {
                        "name": "backend",
                        "type": "STATIC",
                        "connect_timeout": "1s",
                        "load_assignment": {"cluster_name": "backend", "endpoints": [{"lb_endpoints": [
                            {"endpoint": {"address": {"pipe": {"path": ""}}}}
                        ]}]}
                    },
                    {
                        "name": "ratelimit",
                        "type": "STATIC",
                        "connect_timeout": "1s",
                        "typed_extension_protocol_options": {
                            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                                "explicit_http_config": {"http2_protocol_options": {}}
                            }
                        },
                        "load_assignment": {"cluster_name": "ratelimit", "endpoints": [{"lb_endpoints": endpoints}]}
                    }
                ]
            },
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}}
        });
        Bootstrap { json }
    }

    /// A bootstrap whose front listener runs the HTTP rate-limit filter `filter` (see
    /// [`ratelimit_filter`]) and whose front route sends the descriptors of `rate_limits`
    /// (the route's `rate_limits`, YAML).
    pub fn rls(rls: &[SocketAddr], filter: Value, rate_limits: &str) -> Bootstrap {
        let mut bootstrap = Bootstrap::new(rls);
        bootstrap.http_filter("envoy.filters.http.ratelimit", filter);
        bootstrap.front_route_action()["rate_limits"] = yaml(rate_limits);
        bootstrap
    }

    /// Adds an HTTP filter to the front listener, before those added already and the router.
    pub fn http_filter(&mut self, name: &str, typed_config: Value) -> &mut Bootstrap {
        let filters = self.front_hcm()["http_filters"].as_array_mut().unwrap();
        let router = filters.len() - 1;
        filters.insert(router, json!({"name": name, "typed_config": typed_config}));
        self
    }

    /// The front listener's one route (`match: {prefix: /}`, to the `backend` cluster).
    pub fn front_route(&mut self) -> &mut Value {
        &mut self.front_hcm()["route_config"]["virtual_hosts"][0]["routes"][0]
    }

    /// The front route's action (`cluster: backend`), where its `rate_limits` live.
    pub fn front_route_action(&mut self) -> &mut Value {
        &mut self.front_route()["route"]
    }

    /// The front listener's HTTP connection manager.
    pub fn front_hcm(&mut self) -> &mut Value {
        &mut self.listener("front")["filter_chains"][0]["filters"][0]["typed_config"]
    }

    /// The backend's virtual host (e.g. to add `response_headers_to_add`).
    pub fn backend_virtual_host(&mut self) -> &mut Value {
        &mut self.listener("backend")["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]
    }

    /// The static cluster named `name` (`ratelimit`, `backend`).
    pub fn cluster(&mut self, name: &str) -> &mut Value {
        named(&mut self.json["static_resources"]["clusters"], name)
    }

    /// The static listener named `name` (`front`, `backend`).
    pub fn listener(&mut self, name: &str) -> &mut Value {
        named(&mut self.json["static_resources"]["listeners"], name)
    }
}

/// Every fenced ```yaml block of the project's Markdown file `path` (relative to the
/// repository): (line of the fence, text).
pub fn documented_yaml(path: &str) -> Vec<(usize, String)> {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match &mut open {
            None if line.trim_start() == "```yaml" => open = Some((n + 1, String::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.push(open.take().unwrap()),
            Some((_, block)) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// YAML text as a JSON value, for the parts of a bootstrap that read best as Envoy's docs
/// write them.
pub fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("bad YAML in the test: {e}\n{text}"))
}

fn named<'a>(list: &'a mut Value, name: &str) -> &'a mut Value {
    list.as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|item| item["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in the bootstrap"))
}

/// An HTTP connection manager with `route_config` and the router as its only filter.
fn hcm(prefix: &str, route_config: Value) -> Value {
    let router = json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    });
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": prefix,
            "use_remote_address": true,
            "route_config": route_config,
            "http_filters": [router]
        }
    })
}

/// A running Envoy; killed on drop, its log printed if the test is failing.
pub struct Envoy {
    child: Child,
    /// The admin API's address.
    pub admin: SocketAddr,
    /// The front listener's bound address.
    pub front: SocketAddr,
    dir: tempfile::TempDir,
}

/// A response through Envoy: status and headers (names lower-cased).
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl Envoy {
    /// Starts Envoy on `bootstrap` and waits until it is ready (admin `/ready` is 200) with
    /// its front listener bound.
    pub async fn start(bootstrap: &Bootstrap) -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let mut own = Bootstrap {
            json: bootstrap.json.clone(),
        };
        let pipe = dir.path().join("backend.sock");
        let pipe = json!({"path": pipe.to_str().unwrap()});
        own.listener("backend")["address"]["pipe"] = pipe.clone();
        own.cluster("backend")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["pipe"] = pipe;
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, serde_json::to_string_pretty(&own.json).unwrap()).unwrap();
        let admin_path = dir.path().join("admin.txt");
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(binary())
            .args(["--concurrency", "1", "--disable-hot-restart", "-l", "info"])
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut envoy = Envoy {
            child,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            front: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir,
        };
        let within = Duration::from_secs(60);
        eventually_within("Envoy writes its admin address", within, || {
            let text = std::fs::read_to_string(&admin_path).unwrap_or_default();
            envoy.exited_early();
            let parsed = text.trim().parse::<SocketAddr>();
            if let Ok(addr) = parsed {
                envoy.admin = addr;
            }
            async move { parsed.is_ok() }
        })
        .await;
        let admin = envoy.admin;
        eventually_within("Envoy is ready", within, || async move {
            admin_get(admin, "/ready").await.0 == 200
        })
        .await;
        envoy.front = envoy.listener("front").await;
        envoy
    }

    /// The bound address of the listener named `name`, from the admin's `/listeners`.
    pub async fn listener(&self, name: &str) -> SocketAddr {
        let (_, body) = admin_get(self.admin, "/listeners?format=json").await;
        let listeners: Value = serde_json::from_str(&body).unwrap();
        let status = listeners["listener_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no listener {name}: {listeners}"));
        let socket = &status["local_address"]["socket_address"];
        SocketAddr::new(
            socket["address"].as_str().unwrap().parse().unwrap(),
            socket["port_value"].as_u64().unwrap() as u16,
        )
    }

    /// `GET path` through the front listener with `headers` (besides Host).
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let headers: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(name, value)| (*name, value.as_bytes()))
            .collect();
        self.get_bytes(path, &headers).await
    }

    /// `GET path` through the front listener with header values given as raw bytes (any
    /// byte HTTP/1.1 lets through, UTF-8 or not), on a connection of its own.
    pub async fn get_bytes(&self, path: &str, headers: &[(&str, &[u8])]) -> Response {
        let stream = tokio::net::TcpStream::connect(self.front).await.unwrap();
        self.request(stream, path, headers).await
    }

    /// `GET path` through the front listener with `headers`, from the loopback address
    /// `source` (any 127.0.0.0/8 address), so that Envoy sees that client address.
    pub async fn get_from(
        &self,
        source: std::net::IpAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Response {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(source, 0)).unwrap();
        let stream = socket.connect(self.front).await.unwrap();
        let headers: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(name, value)| (*name, value.as_bytes()))
            .collect();
        self.request(stream, path, &headers).await
    }

    /// Sends `GET path` on `stream` and reads the response to the end.
    async fn request(
        &self,
        mut stream: tokio::net::TcpStream,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> Response {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.front
        )
        .into_bytes();
        for (name, value) in headers {
            request.extend_from_slice(name.as_bytes());
            request.extend_from_slice(b": ");
            request.extend_from_slice(value);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        stream.write_all(&request).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP response from Envoy: {text:?}"));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status from Envoy: {head:?}"));
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Response {
            status,
            headers,
            body: body.to_string(),
        }
    }

    /// The value of the counter or gauge `name` (e.g. `cluster.backend.ratelimit.error`); 0
    /// while Envoy has not created it (its counters appear at their first increment).
    pub async fn stat(&self, name: &str) -> u64 {
        let (_, body) = admin_get(self.admin, "/stats?format=json").await;
        let stats: Value = serde_json::from_str(&body).unwrap();
        stats["stats"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["value"].as_u64())
            .unwrap_or(0)
    }

    /// The HTTP rate-limit filter's counters on the front route (`cluster.backend.ratelimit.*`).
    pub async fn ratelimit_stat(&self, name: &str) -> u64 {
        self.stat(&format!("cluster.backend.ratelimit.{name}"))
            .await
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// Panics with the log if Envoy has exited (a config it refused, a crash).
    fn exited_early(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "Envoy exited ({status}) before it was ready:\n{}",
                self.log()
            );
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- Envoy's log ----\n{}\n---- end of Envoy's log ----",
                self.log()
            );
        }
    }
}

/// `GET path` on Envoy's admin API: status and body; status 0 while it does not answer.
pub async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(admin).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut raw = Vec::new();
    if stream.read_to_end(&mut raw).await.is_err() {
        return (0, String::new());
    }
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, String::new());
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // The admin streams large bodies in chunks.
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_vec()
    };
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..line])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let after = &rest[line + 2..];
        match size {
            Some(size) if size > 0 && after.len() >= size => {
                out.extend_from_slice(&after[..size]);
                rest = after[size..]
                    .strip_prefix(b"\r\n")
                    .unwrap_or(&after[size..]);
            }
            _ => break,
        }
    }
    out
}
