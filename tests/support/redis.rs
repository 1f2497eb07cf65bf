//! A real `redis-server` for a test: on an ephemeral loopback port, nothing persisted unless
//! the test asks ([`RedisServer::start_args`]), killed
//! when dropped. Readiness is read from its log ("Ready to accept connections"), never slept
//! for; a port that turns out to be taken is retried with another. Variants: TLS only
//! ([`RedisServer::start_tls`]), a replica ([`RedisServer::start_replica_of`]), a whole
//! Sentinel set-up ([`sentinel::SentinelSetup`]), and [`RedisCluster`]: a real Redis Cluster
//! of such servers (plain, or TLS only: [`RedisCluster::start_tls`]), created with
//! `redis-cli --cluster create`, torn down when dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub mod sentinel;

/// How many ports to try before giving up.
const ATTEMPTS: usize = 10;

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    /// Arguments besides the port's, kept for [`RedisServer::restart`].
    args: Vec<String>,
    /// Serves TLS only (`--port 0 --tls-port <port>`) with these files.
    tls: Option<TlsFiles>,
    child: Option<Child>,
    /// Its working directory: a replica writes the RDB it receives there.
    _dir: tempfile::TempDir,
}

/// Certificate files for a TLS `redis-server` (PEM).
#[derive(Clone)]
pub struct TlsFiles {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA that signs client certificates (`--tls-ca-cert-file`), and the server's.
    pub ca: PathBuf,
    /// A client certificate signed by `ca`, and its key: what the tests' own clients present,
    /// and what a server presents to the servers it connects to (replication, cluster bus),
    /// which ask for one with `tls-auth-clients yes`. The server certificate cannot stand in:
    /// its extended key usage is server authentication only, which OpenSSL refuses for a
    /// client.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// `redis-server` arguments serving these files (`tls-replication` aside).
    pub fn server_args(&self, auth_clients: bool) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            path(&self.cert),
            "--tls-key-file".into(),
            path(&self.key),
            "--tls-client-cert-file".into(),
            path(&self.client_cert),
            "--tls-client-key-file".into(),
            path(&self.client_key),
            "--tls-ca-cert-file".into(),
            path(&self.ca),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ]
    }

    /// `redis-cli` arguments to talk TLS with these files' CA and client certificate.
    pub fn cli_args(&self) -> Vec<String> {
        vec![
            "--tls".into(),
            "--cacert".into(),
            path(&self.ca),
            "--cert".into(),
            path(&self.client_cert),
            "--key".into(),
            path(&self.client_key),
        ]
    }

    /// redis-rs's form: the CA, and the client certificate.
    fn certificates(&self) -> redis::TlsCertificates {
        let read = |p: &PathBuf| std::fs::read(p).unwrap();
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&self.client_cert),
                client_key: read(&self.client_key),
            }),
            root_cert: Some(read(&self.ca)),
        }
    }
}

/// A path as an argument.
fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

impl RedisServer {
    /// Starts a server on a free port. Panics if `redis-server` is not installed.
    pub fn start() -> RedisServer {
        RedisServer::start_with(|_| Vec::new(), None)
    }

    /// Starts a server that serves TLS only, with `files`; with `auth_clients`, it requires
    /// a client certificate signed by `files.ca`.
    pub fn start_tls(files: &TlsFiles, auth_clients: bool) -> RedisServer {
        RedisServer::start_with(|_| files.server_args(auth_clients), Some(files.clone()))
    }

    /// Starts a replica of `master`, over TLS (with the master's files) if `master` is TLS.
    pub fn start_replica_of(master: &RedisServer) -> RedisServer {
        let mut args = vec![
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            master.port.to_string(),
        ];
        if let Some(files) = &master.tls {
            args.extend(files.server_args(false));
            args.extend(["--tls-replication".to_string(), "yes".to_string()]);
        }
        RedisServer::start_with(|_| args.clone(), master.tls.clone())
    }

    /// Starts a server on a free port with extra arguments (e.g. persistence options), which
    /// override the defaults (`--save "" --appendonly no`) and are kept for restarts.
    pub fn start_args(args: &[&str]) -> RedisServer {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        RedisServer::start_with(|_| args.clone(), None)
    }

    /// Starts a server on a free port with the arguments `extra(port)` gives (TLS only with
    /// `tls`), working in a directory of its own.
    fn start_with(extra: impl Fn(u16) -> Vec<String>, tls: Option<TlsFiles>) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            let mut args = extra(port);
            args.extend([
                "--dir".to_string(),
                dir.path().to_str().unwrap().to_string(),
            ]);
            if let Some(child) = spawn(port, tls.is_some(), &args) {
                return RedisServer {
                    port,
                    args,
                    tls,
                    child: Some(child),
                    _dir: dir,
                };
            }
        }
        panic!("redis-server did not start on any of {ATTEMPTS} free ports");
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A new blocking connection (for fixtures and assertions outside the runtime).
    pub fn blocking(&self) -> ::redis::Connection {
        client(&self.url(), self.tls.as_ref())
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()))
    }

    /// Runs one command on this server, blocking.
    pub fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> ::redis::RedisResult<T> {
        cmd.query(&mut self.blocking())
    }

    /// Whether the server is running (not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// A new multiplexed connection.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.try_connection()
            .await
            .unwrap_or_else(|| panic!("cannot connect to {}", self.url()))
    }

    /// A new multiplexed connection, or `None` if the server does not answer.
    pub async fn try_connection(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = client(&self.url(), self.tls.as_ref());
        client.get_multiplexed_async_connection().await.ok()
    }

    /// Runs one command (e.g. `CLIENT PAUSE 1000 WRITE`) on a new connection; panics on an
    /// error reply.
    pub async fn command(&self, args: &[&str]) {
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        let () = command
            .query_async(&mut self.connection().await)
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }

    /// Suspends the server (SIGSTOP): it keeps its connections and queues what arrives, but
    /// answers nothing until [`RedisServer::thaw`] — a Redis that stalls under load.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Resumes a [`RedisServer::freeze`]d server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("redis-server running");
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} redis-server");
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it to exit. Only what it
    /// had persisted (nothing, by default) survives.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port with the same arguments (empty,
    /// unless it persisted), for outage tests. Returns once it accepts connections, i.e. has
    /// loaded what it persisted.
    pub fn restart(&mut self) {
        self.stop();
        // The port was ours a moment ago; redis-server binds with SO_REUSEADDR, so only a
        // racing process could take it. Retry a few times before calling that a failure.
        for _ in 0..ATTEMPTS {
            if let Some(child) = spawn(self.port, self.tls.is_some(), &self.args) {
                self.child = Some(child);
                return;
            }
        }
        panic!("redis-server could not be restarted on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client for `url`; for `rediss://`, with the CA and client certificate of `tls`.
pub(crate) fn client(url: &str, tls: Option<&TlsFiles>) -> redis::Client {
    match tls {
        None => redis::Client::open(url).unwrap(),
        Some(files) => redis::Client::build_with_tls(url, files.certificates()).unwrap(),
    }
}

/// A port nobody listened on a moment ago (bound, then released).
///
/// Taken below the kernel's ephemeral range (where one is set as usual), never from it: no
/// client socket is ever given such a port as its own, so while the server is down (a test
/// stops or restarts it) a client's reconnect can neither take its port nor connect to
/// itself on it (TCP simultaneous open, which an ephemeral port allows when nothing
/// listens), and the restart finds the port free.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Where the ports below the ephemeral range start: clear of the usual services.
    const LOWEST: u32 = 20_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    if ephemeral > LOWEST + 1_000 {
        let span = ephemeral - LOWEST;
        // A start of this process's own, so that test binaries run side by side rarely try
        // the same ports; a port taken meanwhile makes the server's start fail, and retry.
        let start = std::process::id().wrapping_mul(7_919);
        for _ in 0..span {
            let port = LOWEST + (start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))) % span;
            let port = u16::try_from(port).unwrap();
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts `redis-server` on `port` (TLS only when `tls`) with `args` and waits until it
/// accepts connections. `None` when it exits first (the port was taken in the meantime).
fn spawn(port: u16, tls: bool, args: &[String]) -> Option<Child> {
    let port = port.to_string();
    let ports = if tls {
        vec!["--port", "0", "--tls-port", &port]
    } else {
        vec!["--port", &port]
    };
    // Diskless replication without delay: a replica is in sync in milliseconds, not after
    // the default 5 s wait for more replicas.
    let mut child = Command::new("redis-server")
        .args(ports)
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--logfile", ""])
        .args([
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])
        // Later arguments win: the test's own.
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                panic!("redis-server not found: run scripts/install-test-tools.sh")
            }
            _ => panic!("cannot run redis-server: {e}"),
        });
    let stdout = child.stdout.take().unwrap();
    match wait_ready(stdout, "Ready to accept connections") {
        Some(rest) => {
            // Keep draining the log so a chatty server never blocks on a full pipe.
            std::thread::spawn(move || rest.lines().for_each(drop));
            Some(child)
        }
        None => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// Reads the log until a line contains `ready` (returns the rest) or the log ends.
pub(crate) fn wait_ready(stdout: ChildStdout, ready: &str) -> Option<BufReader<ChildStdout>> {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line.contains(ready) => return Some(reader),
            Ok(_) => {}
        }
    }
}

/// How long a cluster may take to form or to fail over before a test gives up.
pub const CLUSTER_DEADLINE: Duration = Duration::from_secs(60);

/// A real Redis Cluster on loopback: masters first, then their replicas, each a
/// [`RedisServer`] in cluster mode with its cluster bus on a second free port. Formed with
/// `redis-cli --cluster create`, ready once every node reports `cluster_state:ok`.
pub struct RedisCluster {
    /// Masters (as created) first, then replicas.
    pub nodes: Vec<RedisServer>,
    masters: usize,
    /// Holds the nodes' cluster config files; removed on drop.
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until the cluster is
    /// usable. Panics (with redis-cli's output) if it cannot be formed.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, None)
    }

    /// Like [`RedisCluster::start`], every node serving TLS only with `files`, to clients,
    /// on the cluster bus (`tls-cluster`) and for replication; with `auth_clients`, every
    /// node requires a client certificate signed by `files.ca` (the nodes present
    /// `files.client_cert` to each other). The fixture's own clients use the same files.
    pub fn start_tls(
        masters: usize,
        replicas: usize,
        files: &TlsFiles,
        auth_clients: bool,
    ) -> RedisCluster {
        RedisCluster::start_with(masters, replicas, Some((files, auth_clients)))
    }

    fn start_with(masters: usize, replicas: usize, tls: Option<(&TlsFiles, bool)>) -> RedisCluster {
        let dir = tempfile::tempdir().unwrap();
        let args = |port: u16| {
            let mut args = cluster_args(dir.path(), port);
            if let Some((files, auth_clients)) = tls {
                args.extend(files.server_args(auth_clients));
                args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(String::from));
            }
            args
        };
        let files = tls.map(|(files, _)| files.clone());
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_with(args, files.clone()))
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some(files) = &files {
            create.args(files.cli_args());
        }
        create.arg("--cluster").arg("create");
        create.args(nodes.iter().map(RedisServer::address));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let output = create
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    panic!("redis-cli not found: run scripts/install-test-tools.sh")
                }
                _ => panic!("cannot run redis-cli: {e}"),
            });
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster {
            nodes,
            masters,
            _dir: dir,
        };
        cluster.wait_until(
            CLUSTER_DEADLINE,
            "every node to report cluster_state:ok",
            |c| {
                c.nodes
                    .iter()
                    .all(|node| node.is_running() && state_ok(node))
            },
        );
        cluster
    }

    /// Seed URLs: every node.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The running nodes that are masters now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .filter(|n| role(n).as_deref() == Some("master"))
            .collect()
    }

    /// How many masters the cluster was created with.
    pub fn master_count(&self) -> usize {
        self.masters
    }

    /// The running master that serves `key` now: the one that answers for it without a
    /// `MOVED` redirection.
    pub fn owner(&self, key: &[u8]) -> &RedisServer {
        let owners: Vec<&RedisServer> = self
            .masters()
            .into_iter()
            .filter(|n| n.query::<i64>(::redis::cmd("EXISTS").arg(key)).is_ok())
            .collect();
        assert_eq!(owners.len(), 1, "{} masters serve {key:?}", owners.len());
        owners[0]
    }

    /// The key's slot (`CLUSTER KEYSLOT`).
    pub fn slot(&self, key: &[u8]) -> u16 {
        self.masters()[0]
            .query(::redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .unwrap()
    }

    /// Bucket keys stored on the masters, summed.
    pub fn key_count(&self) -> usize {
        // Every key but the breaker probe's own short-lived `<prefix>probe`.
        self.masters()
            .iter()
            .map(|n| {
                let keys: Vec<String> = n.query(::redis::cmd("KEYS").arg("*")).unwrap();
                keys.iter().filter(|k| !k.ends_with("probe")).count()
            })
            .sum()
    }

    /// Moves `slot` and its keys from the master serving it to `to`, as `redis-cli --cluster
    /// reshard` does (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE on every master).
    pub fn move_slot(&self, slot: u16, to: &RedisServer) {
        let masters = self.masters();
        let from = masters
            .iter()
            .find(|n| owns(n, slot))
            .expect("a master owns the slot");
        assert_ne!(from.port(), to.port(), "slot {slot} is already there");
        let id =
            |n: &RedisServer| -> String { n.query(::redis::cmd("CLUSTER").arg("MYID")).unwrap() };
        let (from_id, to_id) = (id(from), id(to));
        let setslot = |n: &RedisServer, state: &str, node: &str| {
            n.query::<()>(
                ::redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(node),
            )
            .unwrap();
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        loop {
            let keys: Vec<Vec<u8>> = from
                .query(
                    ::redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(100),
                )
                .unwrap();
            if keys.is_empty() {
                break;
            }
            from.query::<()>(
                ::redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to.port())
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(keys),
            )
            .unwrap();
        }
        setslot(to, "NODE", &to_id);
        setslot(from, "NODE", &to_id);
        for other in &masters {
            if other.port() != from.port() && other.port() != to.port() {
                setslot(other, "NODE", &to_id);
            }
        }
    }

    /// Polls `ready` until it holds or `deadline` passes (then panics, naming `what`).
    pub fn wait_until(&self, deadline: Duration, what: &str, ready: impl Fn(&Self) -> bool) {
        let until = Instant::now() + deadline;
        while !ready(self) {
            assert!(
                Instant::now() < until,
                "gave up after {deadline:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `node` serves `slot` (it lists it in its own `CLUSTER SLOTS` ranges as master).
fn owns(node: &RedisServer, slot: u16) -> bool {
    let ranges: Vec<::redis::Value> = node.query(::redis::cmd("CLUSTER").arg("SLOTS")).unwrap();
    ranges.iter().any(|range| {
        let ::redis::Value::Array(items) = range else {
            return false;
        };
        let (Some(::redis::Value::Int(start)), Some(::redis::Value::Int(end))) =
            (items.first(), items.get(1))
        else {
            return false;
        };
        let master_port = match items.get(2) {
            Some(::redis::Value::Array(addr)) => match addr.get(1) {
                Some(::redis::Value::Int(port)) => *port,
                _ => return false,
            },
            _ => return false,
        };
        (*start..=*end).contains(&i64::from(slot)) && master_port == i64::from(node.port())
    })
}

/// `master` or `slave`, from `ROLE`.
fn role(node: &RedisServer) -> Option<String> {
    let role: Vec<::redis::Value> = node.query(&::redis::cmd("ROLE")).ok()?;
    match role.first() {
        Some(::redis::Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into()),
        Some(::redis::Value::SimpleString(text)) => Some(text.clone()),
        _ => None,
    }
}

/// Whether `node` is a replica with its link to its master up (`INFO replication`).
fn link_up(node: &RedisServer) -> bool {
    node.query::<String>(::redis::cmd("INFO").arg("replication"))
        .is_ok_and(|info| info.contains("master_link_status:up"))
}

/// Whether `node` reports `cluster_state:ok`.
fn state_ok(node: &RedisServer) -> bool {
    node.query::<String>(::redis::cmd("CLUSTER").arg("INFO"))
        .is_ok_and(|info| info.contains("cluster_state:ok"))
}

/// Cluster-mode arguments for a node on `port`: its bus on another free port, its config
/// file in `dir`, a short node timeout so failover tests finish quickly.
fn cluster_args(dir: &Path, port: u16) -> Vec<String> {
    let config = dir.join(format!("nodes-{port}.conf"));
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        config.to_str().unwrap(),
        "--cluster-node-timeout",
        "1000",
        "--cluster-port",
        &free_port().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
