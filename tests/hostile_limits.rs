//! Hostile entries in the limits directory, against the real binary: a FIFO, a symlink to
//! `/dev/zero`, an oversized file and deeply nested flow YAML each fail the reload at once
//! (logged, counted, `floodgate_config_last_reload_success` 0, the previous limits kept),
//! later edits are still picked up, and SIGTERM completes however the directory looks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::eventually;
use support::h2raw::rss_bytes;
use support::http::metric;
use support::process::Floodgate;

fn limits(rpu: u32) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
    )
}

async fn loads(http: SocketAddr, result: &str) -> f64 {
    metric(
        http,
        &format!("floodgate_config_loads_total{{result=\"{result}\"}}"),
    )
    .await
    .unwrap_or(0.0)
}

/// Waits for one more load with `result` than `before`; returns how long it took.
async fn next_load(server: &Floodgate, result: &str, before: f64) -> Duration {
    eventually(&format!("a reload with result {result}"), || async {
        loads(server.http, result).await > before
    })
    .await
}

async fn last_success(http: SocketAddr) -> Option<f64> {
    metric(http, "floodgate_config_last_reload_success").await
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// SIGTERM; asserts exit 0 within 30 s (a guard against a hang, with room for a loaded
/// machine); returns the log.
async fn stop_quickly(server: Floodgate) -> String {
    let started = Instant::now();
    let (exit, log) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "shutdown took {:?}",
        started.elapsed()
    );
    log
}

/// A FIFO, a symlink to /dev/zero, a file over the size cap and 100,000 levels of flow
/// nesting each make the reload fail at once with a logged reason and the gauge at 0 (memory
/// flat, limits kept); removing them, a later edit loads; with the FIFO back, SIGTERM still
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_files_fail_the_reload_without_blocking_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), limits(10)).unwrap();
    let server = Floodgate::start(&["--config", dir.path().to_str().unwrap()]);
    let rss = rss_bytes(server.child.id());
    let fifo = dir.path().join("x.yaml");
    let zero = dir.path().join("z.yaml");
    let big = dir.path().join("big.yaml");
    let deep = dir.path().join("deep.yaml");
    type Make<'a> = Box<dyn Fn() + 'a>;
    let hostile: Vec<(&Path, Make<'_>, &str)> = vec![
        (&fifo, Box::new(|| mkfifo(&fifo)), "a FIFO"),
        (
            &zero,
            Box::new(|| std::os::unix::fs::symlink("/dev/zero", &zero).unwrap()),
            "a character device",
        ),
        (
            &big,
            Box::new(|| {
                let size = floodgate::sources::files::MAX_FILE_BYTES as usize + 1;
                std::fs::write(&big, "#".repeat(size)).unwrap()
            }),
            "larger than",
        ),
        (
            &deep,
            Box::new(|| std::fs::write(&deep, "[".repeat(100_000)).unwrap()),
            "nested deeper than",
        ),
    ];
    for (path, make, reason) in &hostile {
        let before = loads(server.http, "error").await;
        make();
        next_load(&server, "error", before).await;
        // Failed at once, for its own reason: a load that blocked would instead be abandoned
        // at the load deadline, saying so (not timed: a loaded machine may take seconds).
        assert_eq!(
            server.log_count("abandoned"),
            0,
            "{reason}: the load blocked"
        );
        assert_eq!(last_success(server.http).await, Some(0.0), "{reason}");
        // Logged as the load is counted; the line reaches this test through its log reader.
        eventually(&format!("{reason} logged"), || async {
            server.log_count(reason) >= 1
        })
        .await;
        std::fs::remove_file(path).unwrap();
        // Removing it reloads the good files.
        let before = loads(server.http, "success").await;
        next_load(&server, "success", before).await;
    }
    // What the four loads may leave behind is the allocator's retention of the threads each
    // load runs on (up to ~27 MiB seen on a loaded 2-core machine), not the files: the per-file
    // and per-load caps bound what a load reads, and nothing may accumulate across loads.
    let grown = rss_bytes(server.child.id()).saturating_sub(rss);
    assert!(grown < 48 << 20, "RSS grew by {grown} bytes");
    let before = loads(server.http, "success").await;
    std::fs::write(dir.path().join("a.yaml"), limits(20)).unwrap();
    next_load(&server, "success", before).await;
    assert_eq!(last_success(server.http).await, Some(1.0));
    let rlconfig = support::http::call(server.http, "GET", "/rlconfig", None).await;
    assert!(rlconfig.body.contains("20/minute"), "{}", rlconfig.body);
    mkfifo(&fifo);
    stop_quickly(server).await;
}

/// A start-up limits directory holding a FIFO exits 64 at once, naming it, instead of hanging
/// before any port is bound.
#[test]
fn fifo_at_start_up_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), limits(10)).unwrap();
    mkfifo(&dir.path().join("x.yaml"));
    let output = Command::new(env!("CARGO_BIN_EXE_floodgate"))
        .args(["serve", "--config", dir.path().to_str().unwrap()])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("x.yaml") && stderr.contains("FIFO"),
        "{stderr}"
    );
    // At once, not by the load deadline: a load that blocked on the FIFO is abandoned then,
    // saying so (not timed: a loaded machine may take seconds to start the binary).
    assert!(!stderr.contains("abandoned"), "{stderr}");
}
