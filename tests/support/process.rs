//! The real `floodgate` binary as a child process, on ephemeral ports read from its log.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// floodgate's drain-period variable, set to 0 for every test's server that does not set it.
const DRAIN_PERIOD_VARIABLE: &str = "FLOODGATE_DRAIN_PERIOD";

/// A running `floodgate serve`. Terminated (SIGKILL) on drop if still running.
pub struct Floodgate {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// Every log line so far (the reader thread appends until the process exits).
    lines: Arc<Mutex<Vec<String>>>,
    log: Option<JoinHandle<()>>,
}

impl Floodgate {
    /// Starts `floodgate serve` with `args` (plus ephemeral loopback ports) and waits for its
    /// "listening" log line.
    pub fn start(args: &[&str]) -> Floodgate {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command
            .arg("serve")
            .args(args)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info");
        Floodgate::spawn(command)
    }

    /// Starts `floodgate serve` with `args` and exactly the environment variables `env`
    /// (nothing inherited, no port flags: `env` must choose ephemeral ports itself).
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Floodgate {
        let mut command = Command::new(env!("CARGO_BIN_EXE_floodgate"));
        command
            .arg("serve")
            .args(args)
            .env_clear()
            .envs(env.iter().copied());
        Floodgate::spawn(command)
    }

    /// Starts the binary through a link named `ratelimit` (as the reference's image runs
    /// `/bin/ratelimit`) with no arguments and exactly the environment variables `env`.
    pub fn start_as_ratelimit(env: &[(&str, &str)]) -> (Floodgate, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_floodgate"), &link).unwrap();
        let mut command = Command::new(&link);
        command.env_clear().envs(env.iter().copied());
        (Floodgate::spawn(command), dir)
    }

    /// Starts `floodgate serve` with `args` (plus ephemeral loopback ports) under a hard and
    /// soft open-files limit of `open_files` (`prlimit`, which execs the binary in place).
    pub fn start_with_open_files(open_files: u32, args: &[&str]) -> Floodgate {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={open_files}:{open_files}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_floodgate"))
            .arg("serve")
            .args(args)
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "info");
        Floodgate::spawn(command)
    }

    fn spawn(mut command: Command) -> Floodgate {
        // SIGTERM stops a test's server at once unless the test asks for a drain period (its
        // flag wins over the variable): the drain itself is tests/shutdown.rs's.
        if !command
            .get_envs()
            .any(|(name, _)| name == DRAIN_PERIOD_VARIABLE)
        {
            command.env(DRAIN_PERIOD_VARIABLE, "0");
        }
        let mut child = command
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // A gRPC unix socket (`grpc_addr=unix:/path`) has no address: 0.0.0.0:0 stands in.
        let field = |line: &str, name: &str| -> SocketAddr {
            let start = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
            let value = line[start..].split_whitespace().next().unwrap();
            if value.starts_with("unix:") {
                return SocketAddr::from(([0, 0, 0, 0], 0));
            }
            value.parse().unwrap()
        };
        let mut seen = Vec::new();
        let (grpc, http) = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("floodgate exited before listening:\n{}", seen.join("\n"));
            };
            if line.contains("listening") {
                break (field(&line, "grpc_addr"), field(&line, "http_addr"));
            }
            seen.push(line);
        };
        let shared = Arc::new(Mutex::new(seen));
        let reader = shared.clone();
        let log = std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                reader.lock().unwrap().push(line);
            }
        });
        Floodgate {
            child,
            grpc,
            http,
            lines: shared,
            log: Some(log),
        }
    }

    /// Sends SIGTERM, waits for exit (off the async runtime), asserts it was 0, and returns
    /// the whole log.
    pub async fn stop(self) -> String {
        let (exit, log) = tokio::task::spawn_blocking(move || self.terminate())
            .await
            .unwrap();
        assert_eq!(exit.code(), Some(0), "{log}");
        log
    }

    /// Sends SIGTERM and waits for exit; returns the status and the whole log.
    pub fn terminate(self) -> (ExitStatus, String) {
        self.sigterm();
        self.wait()
    }

    /// Sends SIGTERM without waiting (see [`Floodgate::wait`]).
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`TERM`, `INT`, ...) without waiting.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for exit (blocking); returns the status and the whole log.
    pub fn wait(mut self) -> (ExitStatus, String) {
        let exit = self.child.wait().unwrap();
        self.log.take().unwrap().join().unwrap();
        let log = self.lines.lock().unwrap().join("\n");
        (exit, log)
    }

    /// The first log line so far that contains `text`.
    pub fn log_line(&self, text: &str) -> Option<String> {
        let lines = self.lines.lock().unwrap();
        lines.iter().find(|line| line.contains(text)).cloned()
    }

    /// The `addr=` of the first log line so far that contains `text` (a listener's "serving"
    /// line); panics naming `text` if there is none.
    pub fn logged_addr(&self, text: &str) -> SocketAddr {
        let line = self
            .log_line(text)
            .unwrap_or_else(|| panic!("no log line with {text:?}"));
        let start = line.find("addr=").expect("no addr= in the line") + "addr=".len();
        line[start..]
            .split_whitespace()
            .next()
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
    }

    /// How many log lines so far contain `text`.
    pub fn log_count(&self, text: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|line| line.contains(text)).count()
    }
}

impl Drop for Floodgate {
    fn drop(&mut self) {
        if self.log.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
