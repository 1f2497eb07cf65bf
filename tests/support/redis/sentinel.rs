//! A Sentinel-managed Redis for a test: one master, one replica and a few sentinels
//! (`redis-server <conf> --sentinel`), every process on an ephemeral loopback port, all killed
//! when dropped. Readiness is polled (replication link, the sentinels' view), never slept for.
//! With [`SentinelSetup::start_tls`], every one of them serves TLS only and they talk TLS to
//! each other.

use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ATTEMPTS, RedisServer, TlsFiles, client, free_port, wait_ready};

/// The master's name in the sentinels' configuration.
pub const MASTER_NAME: &str = "fgmaster";

/// How long set-up and failover may take before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// A master, its replica and the sentinels watching them.
pub struct SentinelSetup {
    /// The master at start (a replica, or dead, after a failover).
    pub master: RedisServer,
    /// The replica at start (the master after a failover).
    pub replica: RedisServer,
    sentinels: Vec<Sentinel>,
    /// The files every process serves TLS with, if they do.
    tls: Option<TlsFiles>,
}

/// A running sentinel.
struct Sentinel {
    port: u16,
    child: Child,
    /// Its configuration file's directory (a sentinel rewrites its file).
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SentinelSetup {
    /// Starts a master, a replica in sync with it, and `sentinels` sentinels that know both
    /// (quorum 1, master down after 500 ms, failover timeout 2 s): for failover tests.
    pub async fn start(sentinels: usize) -> SentinelSetup {
        SentinelSetup::start_with(sentinels, 500, None).await
    }

    /// As [`SentinelSetup::start`], but the master is only declared down after 10 s without
    /// an answer, so that a loaded test machine never causes a failover mid-test.
    pub async fn start_steady(sentinels: usize) -> SentinelSetup {
        SentinelSetup::start_with(sentinels, 10_000, None).await
    }

    /// As [`SentinelSetup::start_steady`], every process serving TLS only with `files`.
    pub async fn start_tls(sentinels: usize, files: &TlsFiles) -> SentinelSetup {
        SentinelSetup::start_with(sentinels, 10_000, Some(files.clone())).await
    }

    async fn start_with(
        sentinels: usize,
        down_after_ms: u64,
        tls: Option<TlsFiles>,
    ) -> SentinelSetup {
        let master = match &tls {
            None => RedisServer::start(),
            Some(files) => RedisServer::start_tls(files, false),
        };
        let replica = RedisServer::start_replica_of(&master);
        // Sentinels learn the replicas from the master's INFO when they connect: a replica
        // not yet attached would only be seen ten seconds later.
        poll("the replica is in sync", || async {
            info_field(&replica, "replication", "master_link_status")
                .await
                .as_deref()
                == Some("up")
        })
        .await;
        let sentinels = (0..sentinels)
            .map(|_| Sentinel::start(master.port(), down_after_ms, tls.as_ref()))
            .collect();
        let setup = SentinelSetup {
            master,
            replica,
            sentinels,
            tls,
        };
        let expected = setup.master.port();
        poll("every sentinel names the master", || async {
            let mut all = true;
            for port in setup.sentinel_ports() {
                all &= setup.master_addr_at(port).await.map(|(_, p)| p) == Some(expected);
            }
            all
        })
        .await;
        setup
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` with TLS) of every sentinel.
    pub fn node_urls(&self) -> Vec<String> {
        self.sentinel_ports()
            .map(|port| self.sentinel_url(port))
            .collect()
    }

    fn sentinel_url(&self, port: u16) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{port}")
    }

    /// A connection to the sentinel on `port`, or `None` if it does not answer.
    async fn connect(&self, port: u16) -> Option<redis::aio::MultiplexedConnection> {
        let client = client(&self.sentinel_url(port), self.tls.as_ref());
        client.get_multiplexed_async_connection().await.ok()
    }

    /// `SENTINEL get-master-addr-by-name` at the sentinel on `port`.
    async fn master_addr_at(&self, port: u16) -> Option<(String, u16)> {
        let mut conn = self.connect(port).await?;
        let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .ok()?;
        reply
    }

    /// `SENTINEL MASTER <name>` at the sentinel on `port`, as a map (empty if it cannot say).
    async fn sentinel_master(&self, port: u16) -> HashMap<String, String> {
        let Some(mut conn) = self.connect(port).await else {
            return HashMap::new();
        };
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER_NAME)
            .query_async(&mut conn)
            .await
            .unwrap_or_default()
    }

    fn sentinel_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.sentinels.iter().map(|s| s.port)
    }

    /// Waits until a failover can happen: every sentinel knows the replica and every other
    /// sentinel (they find each other through the master's hello channel, every 2 s).
    pub async fn wait_failover_ready(&self) {
        let others = (self.sentinels.len() - 1).to_string();
        poll("the sentinels know the replica and each other", || async {
            let mut ready = true;
            for port in self.sentinel_ports() {
                let info = self.sentinel_master(port).await;
                ready &= info.get("num-slaves").map(String::as_str) == Some("1")
                    && info.get("num-other-sentinels") == Some(&others);
            }
            ready
        })
        .await;
    }

    /// The master as the sentinels name it now (the first that answers).
    pub async fn current_master_port(&self) -> Option<u16> {
        for port in self.sentinel_ports() {
            if let Some((_, master)) = self.master_addr_at(port).await {
                return Some(master);
            }
        }
        None
    }
}

impl Sentinel {
    fn start(master_port: u16, down_after_ms: u64, tls: Option<&TlsFiles>) -> Sentinel {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            // With TLS: TLS only, and TLS to the master and replica it monitors.
            let listen = match tls {
                None => format!("port {port}\n"),
                Some(files) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                    files.cert.display(),
                    files.key.display(),
                    files.ca.display(),
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\nlogfile \"\"\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 1\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n\
                     sentinel failover-timeout {MASTER_NAME} 2000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.path().display(),
                ),
            )
            .unwrap();
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("redis-server not found: run scripts/install-test-tools.sh");
            let stdout = child.stdout.take().unwrap();
            // A sentinel never says "Ready to accept connections"; it has bound its port
            // once it announces the master it monitors.
            match wait_ready(stdout, "+monitor master") {
                Some(rest) => {
                    std::thread::spawn(move || rest.lines().for_each(drop));
                    return Sentinel {
                        port,
                        child,
                        _dir: dir,
                    };
                }
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        panic!("redis-server --sentinel did not start on any of {ATTEMPTS} free ports");
    }
}

/// One field of `INFO <section>` of `server`.
pub async fn info_field(server: &RedisServer, section: &str, field: &str) -> Option<String> {
    let mut conn = server.try_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn)
        .await
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_string())
}

/// Polls `check` every 50 ms until it holds; panics after [`DEADLINE`].
pub async fn poll<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
