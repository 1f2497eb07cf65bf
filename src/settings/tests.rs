//! Parsing `floodgate serve` and `check-config` flags: defaults, bounds, conflicts, and
//! the redaction of secrets.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::*;
use crate::plan::RequestLimits;
use crate::store::FailurePolicy;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("floodgate").chain(args.iter().copied()))
}

/// Defaults match the reference server's ports and floodgate's documented defaults.
#[test]
fn serve_defaults() {
    let Command::Serve(s) = parse(&["serve", "--config", "x.yaml"]).unwrap().command else {
        panic!("not serve");
    };
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(s.algorithm.value, AlgorithmArg::TokenBucket);
    assert!(!s.shadow_mode && s.redis_url.is_none());
    assert_eq!(s.shutdown_grace, Duration::from_secs(10));
    // Twice what the shipped Envoy health check needs to see NOT_SERVING (5 s interval +
    // 0.5 s timeout), with room for one lost check (docs/reliability.md).
    assert_eq!(s.drain_period, Duration::from_secs(15));
    assert_eq!(s.redis_timeout_ms, Duration::from_millis(10));
    assert_eq!(s.on_store_error, FailurePolicy::Error);
    assert!(s.watch_config);
    assert_eq!(s.max_in_flight, 10_000);
    // 16 copies of Envoy's largest default header (60 KiB), within a 32 MiB bytes budget.
    assert_eq!(s.grpc_max_message_bytes, 1_048_576);
    assert_eq!(s.max_in_flight_bytes, 33_554_432);
    assert_eq!(s.grpc_threads, 0);
    assert!(s.grpc_thread_count() >= 1);
    assert_eq!(s.memory_max_buckets, 1_000_000);
    assert!(!s.no_http && s.json_endpoint);
    assert_eq!(s.request_limits(), RequestLimits::default());
}

/// The request caps are flags, positive, and reach the planner's bounds.
#[test]
fn request_caps_are_flags() {
    let caps = |extra: &[&str]| match parse(&[&["serve", "--config", "x"][..], extra].concat())
        .map(|cli| cli.command)
    {
        Ok(Command::Serve(s)) => Ok(s.request_limits()),
        Ok(_) => panic!("not serve"),
        Err(e) => Err(e),
    };
    let set = caps(&[
        "--max-descriptors",
        "2",
        "--max-entries",
        "3",
        "--max-value-bytes",
        "16",
    ])
    .unwrap();
    assert_eq!(
        set,
        RequestLimits {
            max_descriptors: 2,
            max_entries: 3,
            max_value_len: 16,
        }
    );
    for flag in ["--max-descriptors", "--max-entries", "--max-value-bytes"] {
        assert!(caps(&[flag, "0"]).is_err(), "{flag} 0");
    }
}

/// `--max-in-flight` takes a positive count.
#[test]
fn max_in_flight_is_positive() {
    let Command::Serve(s) = parse(&["serve", "--config", "x", "--max-in-flight", "2"])
        .unwrap()
        .command
    else {
        panic!("not serve");
    };
    assert_eq!(s.max_in_flight, 2);
    assert!(parse(&["serve", "--config", "x", "--max-in-flight", "0"]).is_err());
}

/// `--max-in-flight-bytes` takes a positive count of bytes.
#[test]
fn max_in_flight_bytes_is_positive() {
    let bytes = |value: &str| {
        parse(&["serve", "--config", "x", "--max-in-flight-bytes", value]).map(|cli| {
            match cli.command {
                Command::Serve(s) => s.max_in_flight_bytes,
                _ => panic!("not serve"),
            }
        })
    };
    assert_eq!(bytes("8388608").unwrap(), 8_388_608);
    assert!(bytes("0").is_err());
    assert!(bytes("-1").is_err());
}

/// Leases are on at a tenth by default, off at 0, and a fraction outside [0, 0.5] is
/// refused with the flag's meaning.
#[test]
fn lease_fraction_defaults_and_bounds() {
    let fraction = |extra: &[&str]| {
        let args = [&["serve", "--config", "x"][..], extra].concat();
        parse(&args).map(|cli| match cli.command {
            Command::Serve(s) => s.lease_fraction,
            _ => panic!("not serve"),
        })
    };
    assert_eq!(fraction(&[]).unwrap(), 0.1);
    assert_eq!(fraction(&["--lease-fraction", "0"]).unwrap(), 0.0);
    assert_eq!(fraction(&["--lease-fraction", "0.5"]).unwrap(), 0.5);
    for bad in ["0.6", "-0.1", "NaN", "a tenth"] {
        let flag = format!("--lease-fraction={bad}");
        let error = fraction(&[&flag]).unwrap_err().to_string();
        assert!(
            error.contains("lease fraction between 0 (off) and 0.5"),
            "{bad}: {error}"
        );
    }
}

/// The admin listener can be turned off, and /json on its own.
#[test]
fn admin_http_can_be_turned_off() {
    let Command::Serve(s) = parse(&[
        "serve",
        "--config",
        "x",
        "--no-http",
        "--json-endpoint=false",
    ])
    .unwrap()
    .command
    else {
        panic!("not serve");
    };
    assert!(s.no_http && !s.json_endpoint);
}

/// `--watch-config` takes an explicit boolean, so hot reload can be turned off.
#[test]
fn watch_config_takes_a_boolean() {
    let watch = |args: &[&str]| match parse(args).map(|cli| cli.command) {
        Ok(Command::Serve(s)) => Ok(s.watch_config),
        Ok(_) => panic!("not serve"),
        Err(e) => Err(e),
    };
    let base = ["serve", "--config", "x"];
    assert!(!watch(&[&base[..], &["--watch-config=false"]].concat()).unwrap());
    assert!(!watch(&[&base[..], &["--watch-config", "false"]].concat()).unwrap());
    assert!(watch(&[&base[..], &["--watch-config=true"]].concat()).unwrap());
    assert!(watch(&[&base[..], &["--watch-config=maybe"]].concat()).is_err());
    // A bare flag is not a boolean: the value must be explicit.
    assert!(watch(&[&base[..], &["--watch-config"]].concat()).is_err());
}

/// Every flag parses, including the snake_case algorithm names.
#[test]
fn serve_flags() {
    let Command::Serve(s) = parse(&[
        "serve",
        "--config",
        "dir",
        "--grpc-addr",
        "127.0.0.1:1",
        "--http-addr",
        "127.0.0.1:2",
        "--default-algorithm",
        "fixed_window",
        "--shadow-mode",
        "--log-format",
        "json",
        "--shutdown-grace",
        "0.5",
        "--drain-period",
        "2.5",
    ])
    .unwrap()
    .command
    else {
        panic!("not serve");
    };
    assert_eq!(s.algorithm.value, AlgorithmArg::FixedWindow);
    assert!(s.shadow_mode);
    assert_eq!(s.log_format, LogFormat::Json);
    assert_eq!(s.shutdown_grace, Duration::from_millis(500));
    assert_eq!(s.drain_period, Duration::from_millis(2500));
}

/// Response flags default off (as the reference), with its header names and 0.8 ratio.
#[test]
fn response_flags() {
    let serve = |args: &[&str]| match parse(args).map(|cli| cli.command) {
        Ok(Command::Serve(s)) => Ok(s.response),
        Ok(_) => panic!("not serve"),
        Err(e) => Err(e),
    };
    let base = ["serve", "--config", "x"];
    let defaults = serve(&base).unwrap();
    assert!(defaults.header_options().is_none() && !defaults.response_dynamic_metadata);
    assert_eq!(defaults.near_limit_ratio, 0.8);
    let on = serve(
        &[
            &base[..],
            &["--response-headers", "--header-reset", "X-Reset"],
        ]
        .concat(),
    )
    .unwrap()
    .header_options()
    .unwrap();
    assert_eq!(
        (on.limit.as_str(), on.remaining.as_str(), on.reset.as_str()),
        ("RateLimit-Limit", "RateLimit-Remaining", "X-Reset")
    );
    assert!(serve(&[&base[..], &["--near-limit-ratio", "1.5"]].concat()).is_err());
}

/// TLS needs both a certificate and a key; a client CA needs them too.
#[test]
fn grpc_tls_flags() {
    let tls = |extra: &[&str]| match parse(&[&["serve", "--config", "x"][..], extra].concat())
        .map(|cli| cli.command)
    {
        Ok(Command::Serve(s)) => Ok(s.grpc_tls.files()),
        Ok(_) => panic!("not serve"),
        Err(e) => Err(e.kind()),
    };
    assert_eq!(tls(&[]), Ok(None));
    let files = tls(&[
        "--grpc-tls-cert-file",
        "c.pem",
        "--grpc-tls-key-file",
        "k.pem",
        "--grpc-tls-client-ca-file",
        "ca.pem",
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        (files.cert, files.key, files.client_ca),
        ("c.pem".into(), "k.pem".into(), Some("ca.pem".into()))
    );
    let missing = Err(clap::error::ErrorKind::MissingRequiredArgument);
    assert_eq!(tls(&["--grpc-tls-cert-file", "c.pem"]), missing);
    assert_eq!(tls(&["--grpc-tls-key-file", "k.pem"]), missing);
    assert_eq!(tls(&["--grpc-tls-client-ca-file", "ca.pem"]), missing);
}

/// Out-of-range durations are parse errors (exit 64), not panics.
#[test]
fn bad_durations_are_rejected() {
    for bad in ["1e30", "-1", "NaN", "soon"] {
        assert!(
            parse(&["serve", "--config", "x", "--shutdown-grace", bad]).is_err(),
            "{bad}"
        );
        assert!(
            parse(&["serve", "--config", "x", "--drain-period", bad]).is_err(),
            "{bad}"
        );
    }
    assert!(parse(&["serve", "--config", "x", "--redis-timeout-ms", "0"]).is_err());
}

/// A malformed address is a parse error, not a panic later.
#[test]
fn bad_address_is_rejected() {
    assert!(parse(&["serve", "--config", "x", "--grpc-addr", "nope"]).is_err());
}

/// Sentinel takes a master name and a comma-separated list of sentinels, each needing
/// the other; TLS files are paths. Sentinel passwords never reach Debug output.
#[test]
fn sentinel_and_tls_flags() {
    let Command::Serve(s) = parse(&[
        "serve",
        "--config",
        "x",
        "--redis-sentinel",
        "mymaster",
        "--redis-sentinel-nodes",
        "redis://:sentinelpw@10.0.0.1:26379,redis://10.0.0.2:26379",
        "--redis-tls-ca-file",
        "/etc/ca.pem",
    ])
    .unwrap()
    .command
    else {
        panic!("not serve");
    };
    assert_eq!(s.redis_sentinel.as_deref(), Some("mymaster"));
    assert_eq!(
        s.redis_sentinel_nodes,
        [
            "redis://:sentinelpw@10.0.0.1:26379",
            "redis://10.0.0.2:26379"
        ]
    );
    assert_eq!(s.redis_tls_ca_file, Some(PathBuf::from("/etc/ca.pem")));
    assert!(!format!("{s:?}").contains("sentinelpw"));
    assert!(parse(&["serve", "--config", "x", "--redis-sentinel", "m"]).is_err());
    assert!(
        parse(&[
            "serve",
            "--config",
            "x",
            "--redis-sentinel-nodes",
            "redis://a:1"
        ])
        .is_err()
    );
}

/// Passwords never reach Debug output.
#[test]
fn redis_password_is_redacted() {
    let Command::Serve(s) = parse(&["serve", "--config", "x", "--redis-url", "redis://:pw@h"])
        .unwrap()
        .command
    else {
        panic!("not serve");
    };
    assert!(!format!("{s:?}").contains("pw@"));
}

/// `--redis-cluster` takes comma-separated seeds, redacted in Debug, and excludes
/// `--redis-url`.
#[test]
fn redis_cluster_seeds() {
    let Command::Serve(s) = parse(&[
        "serve",
        "--config",
        "x",
        "--redis-cluster",
        "redis://:pw@a:1,rediss://b:2",
    ])
    .unwrap()
    .command
    else {
        panic!("not serve");
    };
    assert_eq!(s.redis_cluster, ["redis://:pw@a:1", "rediss://b:2"]);
    assert!(!format!("{s:?}").contains("pw@"));
    let both = parse(&[
        "serve",
        "--config",
        "x",
        "--redis-cluster",
        "redis://a:1",
        "--redis-url",
        "redis://b:2",
    ]);
    assert!(both.is_err());
}
