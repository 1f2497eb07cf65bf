//! The binary's command line: check-config, and start-up failures exiting 64.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_floodgate");

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("RUST_LOG");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn bad_limits() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        "domain: b\ndescriptors:\n  - key: k\n    bogus: 1\n",
    )
    .unwrap();
    dir
}

/// check-config on the shipped examples exits 0 and prints every domain's limits.
#[test]
fn check_config_accepts_examples() {
    let out = run(
        &[
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/limits"),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("valid"));
}

/// check-config reports every error with file, path and reason, and exits 1.
#[test]
fn check_config_reports_every_error() {
    let dir = bad_limits();
    let out = run(&["check-config", dir.path().to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("a.yaml: descriptors[0].rate_limit.unit"),
        "{stderr}"
    );
    assert!(stderr.contains("fortnight"), "{stderr}");
    assert!(stderr.contains("b.yaml: descriptors[0]"), "{stderr}");
    assert!(stderr.contains("bogus"), "{stderr}");
    assert!(stderr.contains("invalid (2 errors)"), "{stderr}");
}

/// check-config reports every error of every file, a wrong YAML type (`requests_per_unit:
/// -1`) hiding none of its file's other errors, and says where a YAML syntax error hides the
/// rest of its file.
#[test]
fn check_config_reports_type_errors_and_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n  \
         - key: j\n    shadow_mode: maybe\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n  \
         - key: ''\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        "domain: b\ndescriptors:\n  - key: k\n   value: x\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("c.yaml"),
        "domain: a\ndescriptors: {key: x}\n",
    )
    .unwrap();
    let out = run(&["check-config", dir.path().to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    for expected in [
        "a.yaml: descriptors[0].rate_limit.requests_per_unit: invalid type: integer `-1`, \
         expected u32 (line 4, column 51)",
        "a.yaml: descriptors[1].shadow_mode: invalid type: string \"maybe\", expected a boolean",
        "a.yaml: descriptors[1].rate_limit.unit: invalid rate limit unit 'fortnight'",
        "a.yaml: descriptors[2].key: descriptor has empty key",
        "b.yaml: descriptors: invalid YAML",
        "nothing else in this file is checked until it is valid YAML",
        "c.yaml: descriptors: invalid type: map, expected a sequence (line 2, column 14); \
         nothing inside it is checked",
        "c.yaml: domain: duplicate domain 'a'",
        "invalid (7 errors)",
    ] {
        assert!(
            stderr.contains(expected),
            "{expected:?} missing from:\n{stderr}"
        );
    }
    assert!(!stderr.contains("missing requests_per_unit"), "{stderr}");
}

/// check-config prints a limit's max_wait and warns when it outlasts the clients' timeout.
#[test]
fn check_config_warns_of_max_wait_beyond_the_client_timeout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("shaped.yaml"),
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: \
         {unit: second, requests_per_unit: 10, max_wait: 50ms}\n",
    )
    .unwrap();
    let path = dir.path().to_str().unwrap();
    let out = run(&["check-config", path], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("max_wait=50ms"),
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("warning:"), "{stderr}");
    assert!(stderr.contains("max_wait 50ms"), "{stderr}");
    assert!(
        stderr.contains("--expected-client-timeout 20ms"),
        "{stderr}"
    );

    let out = run(
        &["check-config", path, "--expected-client-timeout", "100ms"],
        &[],
    );
    assert!(out.status.success());
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
}

/// serve with an unloadable config exits 64 with the errors, before binding anything.
#[test]
fn serve_with_bad_config_exits_64() {
    let dir = bad_limits();
    let out = run(
        &[
            "serve",
            "--config",
            dir.path().to_str().unwrap(),
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("cannot load limits"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
    assert!(!text(&out.stdout).contains("listening"));
}

/// FLOODGATE_* environment variables stand in for flags.
#[test]
fn environment_variables_set_flags() {
    let dir = bad_limits();
    let out = run(
        &["serve"],
        &[("FLOODGATE_CONFIG", dir.path().to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("fortnight"));
}

/// Bad flags exit 64 with clap's message.
#[test]
fn bad_flags_exit_64() {
    let out = run(
        &["serve", "--config", "x", "--grpc-addr", "not-an-address"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("--grpc-addr"));
    let out = run(
        &["serve", "--config", "x", "--default-algorithm", "leaky"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
}

/// A missing config path is an unloadable config: exit 64.
#[test]
fn missing_config_exits_64() {
    let out = run(&["serve", "--config", "/nonexistent/limits"], &[]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("/nonexistent/limits"));
}

/// Without --config and without the reference's RUNTIME_* variables, serve exits 64 and says
/// how to name the limits.
#[test]
fn serve_without_limits_exits_64() {
    let out = run(&["serve"], &[]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--config") && stderr.contains("RUNTIME_ROOT"),
        "{stderr}"
    );
}

/// A reference environment variable floodgate cannot parse exits 64, naming the variable.
#[test]
fn bad_reference_variable_exits_64() {
    let out = run(&["serve", "--config", "x"], &[("GRPC_PORT", "grpc")]);
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("GRPC_PORT=\"grpc\""), "{stderr}");
}

/// A statsd_exporter mapping file (`PROMETHEUS_MAPPER_YAML`) that cannot be read or parsed
/// stops start-up with exit 64, naming the file and what is wrong, before anything listens.
#[test]
fn unusable_mapping_file_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, "domain: d\ndescriptors:\n  - key: k\n").unwrap();
    let bad = dir.path().join("conf.yaml");
    std::fs::write(
        &bad,
        "mappings:\n  - match: 'ratelimit\\.(['\n    match_type: regex\n    name: x\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.yaml");
    for (file, reason) in [
        (
            &bad,
            "mappings[0] (match \"ratelimit\\\\.([\"): invalid regex",
        ),
        (&missing, "cannot read"),
    ] {
        let out = run(
            &[
                "serve",
                "--config",
                limits.to_str().unwrap(),
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ],
            &[
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", "127.0.0.1:0"),
                ("PROMETHEUS_MAPPER_YAML", file.to_str().unwrap()),
            ],
        );
        assert_eq!(out.status.code(), Some(64));
        let stderr = text(&out.stderr);
        assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
        assert!(stderr.contains(reason), "{reason}: {stderr}");
        assert!(!text(&out.stdout).contains("listening"));
    }
}
