//! A real `redis-server` for a test: on an ephemeral loopback port, nothing persisted unless
//! the test asks ([`RedisServer::start_with`]), killed when dropped. Readiness is read from its log ("Ready to accept connections"), never slept
//! for; a port that turns out to be taken is retried with another.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStdout, Command, Stdio};

/// How many ports to try before giving up.
const ATTEMPTS: usize = 10;

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Extra `redis-server` arguments, given again on restart.
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port. Panics if `redis-server` is not installed.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server on a free port with extra arguments (e.g. persistence options), which
    /// override the defaults (`--save "" --appendonly no`) and are kept for restarts.
    pub fn start_with(args: &[&str]) -> RedisServer {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            if let Some(child) = spawn(port, &args) {
                return RedisServer {
                    port,
                    child: Some(child),
                    args,
                };
            }
        }
        panic!("redis-server did not start on any of {ATTEMPTS} free ports");
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A new multiplexed connection.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()))
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
            if let Some(child) = spawn(self.port, &self.args) {
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

/// A port nobody listened on a moment ago (bind port 0, read it, release it).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts `redis-server` on `port` and waits until it accepts connections. `None` when it
/// exits first (the port was taken in the meantime).
fn spawn(port: u16, args: &[String]) -> Option<Child> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--logfile", ""])
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
    match wait_ready(stdout) {
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

/// Reads the log until the server says it is ready (returns the rest) or the log ends.
fn wait_ready(stdout: ChildStdout) -> Option<BufReader<ChildStdout>> {
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line.contains("Ready to accept connections") => return Some(reader),
            Ok(_) => {}
        }
    }
}
