//! A real `redis-server` for a test: on an ephemeral loopback port, nothing persisted, killed
//! when dropped. Readiness is read from its log ("Ready to accept connections"), never slept
//! for; a port that turns out to be taken is retried with another. Variants: TLS only
//! ([`RedisServer::start_tls`]), a replica ([`RedisServer::start_replica_of`]), and a whole
//! Sentinel set-up ([`sentinel::SentinelSetup`]).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

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
}

impl TlsFiles {
    /// `redis-server` arguments serving these files (`tls-replication` aside).
    pub fn server_args(&self, auth_clients: bool) -> Vec<String> {
        let path = |p: &PathBuf| p.to_str().unwrap().to_string();
        vec![
            "--tls-cert-file".into(),
            path(&self.cert),
            "--tls-key-file".into(),
            path(&self.key),
            "--tls-ca-cert-file".into(),
            path(&self.ca),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ]
    }
}

impl RedisServer {
    /// Starts a server on a free port. Panics if `redis-server` is not installed.
    pub fn start() -> RedisServer {
        RedisServer::start_with(Vec::new(), None)
    }

    /// Starts a server that serves TLS only, with `files`; with `auth_clients`, it requires
    /// a client certificate signed by `files.ca`.
    pub fn start_tls(files: &TlsFiles, auth_clients: bool) -> RedisServer {
        RedisServer::start_with(files.server_args(auth_clients), Some(files.clone()))
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
        RedisServer::start_with(args, master.tls.clone())
    }

    fn start_with(args: Vec<String>, tls: Option<TlsFiles>) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let mut args = args;
        args.extend([
            "--dir".to_string(),
            dir.path().to_str().unwrap().to_string(),
        ]);
        for _ in 0..ATTEMPTS {
            let port = free_port();
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
        let ca = self.tls.as_ref().map(|files| files.ca.as_path());
        let client = client(&self.url(), ca);
        client.get_multiplexed_async_connection().await.ok()
    }

    /// Kills the server (no data survives: nothing is persisted) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts an empty one on the same port, for outage tests.
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

/// A client for `url`; for `rediss://`, trusting the CA file `ca`.
pub(crate) fn client(url: &str, ca: Option<&std::path::Path>) -> redis::Client {
    match ca {
        None => redis::Client::open(url).unwrap(),
        Some(ca) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(ca).unwrap()),
            },
        )
        .unwrap(),
    }
}

/// A port nobody listened on a moment ago (bind port 0, read it, release it).
pub(crate) fn free_port() -> u16 {
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
