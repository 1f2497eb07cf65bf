//! The reference environment mapping, with literal maps (the process environment is never
//! touched).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches};

use super::*;
use crate::settings::serve::LogFormat;
use crate::settings::traces::OtlpProtocol;
use crate::settings::{Cli, Command};
use crate::telemetry::statsd::{Flavor, Protocol};

/// Parses `floodgate serve <args>`: the settings and the matches that say where each came from.
fn serve(args: &[&str]) -> (ServeSettings, ArgMatches) {
    let matches = Cli::command()
        .try_get_matches_from(["floodgate", "serve"].iter().chain(args))
        .unwrap();
    let Command::Serve(settings) = Cli::from_arg_matches(&matches).unwrap().command else {
        panic!("not serve");
    };
    let serve = matches.subcommand_matches("serve").unwrap().clone();
    (settings, serve)
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Applies `pairs` over `floodgate serve <args>`.
fn apply(
    args: &[&str],
    pairs: &[(&str, &str)],
) -> Result<(ServeSettings, ReferenceReport), SettingsError> {
    let (mut settings, matches) = serve(args);
    let report = apply_reference_env(&mut settings, &matches, &env(pairs))?;
    Ok((settings, report))
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

/// A reference deployment's variables alone configure the limits path, ports and Redis.
#[test]
fn reference_deployment() {
    let (s, report) = apply(
        &[],
        &[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("PORT", "9080"),
            ("GRPC_PORT", "9081"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("REDIS_POOL_SIZE", "7"),
            ("SHADOW_MODE", "true"),
            ("CACHE_KEY_PREFIX", "rl_"),
        ],
    )
    .unwrap();
    assert_eq!(s.config, Some(PathBuf::from("/data/ratelimit/config")));
    assert_eq!(s.http_addr, addr("0.0.0.0:9080"));
    assert_eq!(s.grpc_addr, addr("0.0.0.0:9081"));
    assert_eq!(s.redis_url.as_deref(), Some("redis://redis:6379"));
    assert_eq!(s.redis_pool_size, 7);
    assert!(s.shadow_mode);
    assert_eq!(s.redis_key_prefix, "rl_");
    assert!(report.no_effect.is_empty() && report.overridden.is_empty());
    assert_eq!(report.applied.len(), 9, "{:?}", report.applied);
}

/// Without any reference variable nothing changes, and `--config` is then required.
#[test]
fn defaults_untouched_and_limits_required() {
    let (s, report) = apply(&["--config", "x"], &[]).unwrap();
    let (plain, _) = serve(&["--config", "x"]);
    assert_eq!(format!("{s:?}"), format!("{plain:?}"));
    assert_eq!(report, ReferenceReport::default());
    assert!(matches!(apply(&[], &[]), Err(SettingsError::NoLimits)));
    // Empty values count as unset.
    assert!(matches!(
        apply(&[], &[("RUNTIME_ROOT", "")]),
        Err(SettingsError::NoLimits)
    ));
}

/// The runtime layout: root/subdirectory/appdirectory, with the reference's defaults.
#[test]
fn limits_directory_layout() {
    let dir = |pairs: &[(&str, &str)]| apply(&[], pairs).unwrap().0.config.unwrap();
    assert_eq!(dir(&[("RUNTIME_ROOT", "/r")]), PathBuf::from("/r/config"));
    assert_eq!(
        dir(&[("RUNTIME_SUBDIRECTORY", "rl")]),
        PathBuf::from("/srv/runtime_data/current/rl/config")
    );
    assert_eq!(
        dir(&[
            ("RUNTIME_ROOT", "/r"),
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("RUNTIME_APPDIRECTORY", "limits")
        ]),
        PathBuf::from("/r/rl/limits")
    );
}

/// floodgate's own flags win over the reference variables, which are reported as overridden.
#[test]
fn own_flags_win() {
    let (s, report) = apply(
        &[
            "--config",
            "mine",
            "--grpc-addr",
            "127.0.0.1:1",
            "--http-addr",
            "127.0.0.1:2",
            "--redis-url",
            "redis://mine",
            "--redis-pool-size",
            "3",
            "--redis-key-prefix",
            "p:",
            "--local-cache-size",
            "5",
            "--shadow-mode",
            "--log-format",
            "text",
        ],
        &[
            ("RUNTIME_ROOT", "/r"),
            ("GRPC_PORT", "9"),
            ("HOST", "10.0.0.1"),
            ("REDIS_URL", "other:6379"),
            ("REDIS_POOL_SIZE", "9"),
            ("CACHE_KEY_PREFIX", "x"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
            ("SHADOW_MODE", "false"),
            ("LOG_FORMAT", "json"),
        ],
    )
    .unwrap();
    assert_eq!(s.config, Some(PathBuf::from("mine")));
    assert_eq!(s.grpc_addr, addr("127.0.0.1:1"));
    assert_eq!(s.http_addr, addr("127.0.0.1:2"));
    assert_eq!(s.redis_url.as_deref(), Some("redis://mine"));
    assert_eq!((s.redis_pool_size, s.local_cache_size), (3, 5));
    assert_eq!(s.redis_key_prefix, "p:");
    assert!(s.shadow_mode);
    assert_eq!(s.log_format, LogFormat::Text);
    assert!(report.applied.is_empty(), "{:?}", report.applied);
    assert_eq!(report.overridden.len(), 9, "{:?}", report.overridden);
    assert!(
        report
            .overridden
            .contains(&"GRPC_PORT (by --grpc-addr)".to_string())
    );
}

/// Hosts and ports combine with floodgate's defaults, port 0 included.
#[test]
fn hosts_and_ports() {
    let (s, _) = apply(
        &["--config", "x"],
        &[
            ("HOST", "127.0.0.1"),
            ("GRPC_HOST", "::1"),
            ("GRPC_PORT", "0"),
        ],
    )
    .unwrap();
    assert_eq!(s.http_addr, addr("127.0.0.1:8080"));
    assert_eq!(s.grpc_addr, addr("[::1]:0"));
    let (s, _) = apply(&["--config", "x"], &[("GRPC_HOST", "localhost")]).unwrap();
    assert_eq!(s.grpc_addr, addr("127.0.0.1:8081"));
}

/// REDIS_URL host:port plus socket type, TLS and auth become one redis URL.
#[test]
fn redis_url_translation() {
    let url = |pairs: &[(&str, &str)]| {
        apply(&["--config", "x"], pairs)
            .unwrap()
            .0
            .redis_url
            .unwrap()
    };
    assert_eq!(url(&[("REDIS_URL", "r:6380")]), "redis://r:6380");
    assert_eq!(url(&[("REDIS_URL", "r")]), "redis://r:6379");
    assert_eq!(
        url(&[("REDIS_URL", "r:1"), ("REDIS_TLS", "true")]),
        "rediss://r:1"
    );
    assert_eq!(
        url(&[("REDIS_URL", "r:1"), ("REDIS_AUTH", "p@ss")]),
        "redis://:p%40ss@r:1"
    );
    assert_eq!(
        url(&[("REDIS_URL", "r:1"), ("REDIS_AUTH", "user:pw:d")]),
        "redis://user:pw%3Ad@r:1"
    );
    assert_eq!(
        url(&[
            ("REDIS_URL", "/run/redis.sock"),
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_AUTH", "u:p")
        ]),
        "redis+unix:///run/redis.sock?pass=p&user=u"
    );
    // The socket type is inferred when unset.
    assert_eq!(
        url(&[("REDIS_URL", "/run/redis.sock")]),
        "redis+unix:///run/redis.sock"
    );
    // A full URL is kept as it is.
    assert_eq!(
        url(&[("REDIS_URL", "rediss://h:1/2"), ("REDIS_TYPE", "SINGLE")]),
        "rediss://h:1/2"
    );
}

/// An unknown REDIS_TYPE is refused at start-up (exit 64), never approximated.
#[test]
fn unknown_redis_type_is_refused() {
    let error = apply(
        &["--config", "x"],
        &[("REDIS_URL", "a:1,b:2"), ("REDIS_TYPE", "ring")],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("REDIS_TYPE"), "{error}");
    assert!(error.contains("single, sentinel or cluster"), "{error}");
    let (s, _) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "h:1"), ("REDIS_TYPE", "single")],
    )
    .unwrap();
    assert_eq!(s.redis_url.as_deref(), Some("redis://h:1"));
    // Companions without a REDIS_URL change nothing, and say so.
    let (s, report) = apply(&["--config", "x"], &[("REDIS_TLS", "true")]).unwrap();
    assert_eq!(s.redis_url, None);
    assert_eq!(report.no_effect.len(), 1);
}

/// `REDIS_TYPE=sentinel`: `REDIS_URL` is `<master>,<sentinel>[,…]`; REDIS_AUTH and REDIS_TLS
/// are the master's; a missing sentinel port is 26379; our own flags win.
#[test]
fn sentinel_translation() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26380, s2"),
            ("REDIS_AUTH", "p@ss"),
            ("REDIS_TLS", "true"),
        ],
    )
    .unwrap();
    assert_eq!(s.redis_sentinel.as_deref(), Some("mymaster"));
    // REDIS_TLS: TLS to the sentinels too, as the reference dials them.
    assert_eq!(
        s.redis_sentinel_nodes,
        ["rediss://s1:26380", "rediss://s2:26379"]
    );
    assert_eq!(s.redis_url.as_deref(), Some("rediss://:p%40ss@mymaster"));
    assert!(
        report.applied.contains(&"REDIS_TYPE".to_string()),
        "{report:?}"
    );
    for bad in ["mymaster", ",s1:1", "a/b,s1:1"] {
        let error = apply(
            &["--config", "x"],
            &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", bad)],
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("<master name>,<sentinel host:port>"),
            "{error}"
        );
    }
    let error = apply(
        &["--config", "x"],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "m,s:1"),
            ("REDIS_SOCKET_TYPE", "unix"),
        ],
    )
    .unwrap_err();
    assert!(error.to_string().contains("REDIS_SOCKET_TYPE"), "{error}");
    let (s, report) = apply(
        &[
            "--config",
            "x",
            "--redis-sentinel",
            "own",
            "--redis-sentinel-nodes",
            "redis://o:1",
        ],
        &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "m,s:1")],
    )
    .unwrap();
    assert_eq!(s.redis_sentinel.as_deref(), Some("own"));
    assert_eq!(s.redis_url, None);
    assert_eq!(report.overridden.len(), 2, "{report:?}");
}

/// The reference's TLS files reach the TLS flags with REDIS_TLS=true, and are reported as
/// having no effect otherwise, as is skipping host name verification.
#[test]
fn tls_file_variables() {
    let files = [
        ("REDIS_TLS_CACERT", "/tls/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/tls/c.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/tls/c.key"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut pairs = vec![("REDIS_URL", "r:1")];
        pairs.extend_from_slice(&files);
        pairs.extend_from_slice(extra);
        apply(&["--config", "x"], &pairs).unwrap()
    };
    let (s, report) = with(&[("REDIS_TLS", "true")]);
    assert_eq!(s.redis_tls_ca_file, Some(PathBuf::from("/tls/ca.pem")));
    assert_eq!(s.redis_tls_cert_file, Some(PathBuf::from("/tls/c.pem")));
    assert_eq!(s.redis_tls_key_file, Some(PathBuf::from("/tls/c.key")));
    assert!(report.no_effect.is_empty(), "{report:?}");
    let (s, report) = with(&[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")]);
    assert_eq!(s.redis_tls_ca_file, None);
    assert_eq!(report.no_effect.len(), 4, "{report:?}");
    let (s, report) = apply(
        &["--config", "x", "--redis-tls-ca-file", "/own.pem"],
        &[("REDIS_URL", "r:1"), ("REDIS_TLS", "true"), files[0]],
    )
    .unwrap();
    assert_eq!(s.redis_tls_ca_file, Some(PathBuf::from("/own.pem")));
    assert_eq!(
        report.overridden,
        ["REDIS_TLS_CACERT (by --redis-tls-ca-file)"]
    );
}

/// `REDIS_TYPE=cluster` turns the reference's `REDIS_URL=host1:port,host2:port` into cluster
/// seeds, with `REDIS_TLS` and `REDIS_AUTH` applied to each; floodgate's own flags win.
#[test]
fn redis_cluster_from_reference_variables() {
    let seeds = |pairs: &[(&str, &str)]| {
        let (s, report) = apply(&["--config", "x"], pairs).unwrap();
        assert_eq!(s.redis_url, None);
        (s.redis_cluster, report)
    };
    let (found, report) = seeds(&[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:1, b:2,c")]);
    assert_eq!(found, ["redis://a:1", "redis://b:2", "redis://c:6379"]);
    assert!(report.applied.contains(&"REDIS_TYPE".to_string()));
    let (found, _) = seeds(&[
        ("REDIS_TYPE", "CLUSTER"),
        ("REDIS_URL", "a:1,rediss://u:p@b:2"),
        ("REDIS_TLS", "true"),
        ("REDIS_AUTH", "user:s3cret"),
    ]);
    assert_eq!(found, ["rediss://user:s3cret@a:1", "rediss://u:p@b:2"]);
    for bad in [
        vec![("REDIS_TYPE", "cluster"), ("REDIS_URL", ",")],
        vec![
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:1"),
            ("REDIS_SOCKET_TYPE", "unix"),
        ],
    ] {
        assert!(apply(&["--config", "x"], &bad).is_err(), "{bad:?}");
    }
    let (s, report) = apply(
        &["--config", "x", "--redis-cluster", "redis://own:1"],
        &[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:1")],
    )
    .unwrap();
    assert_eq!(s.redis_cluster, ["redis://own:1"]);
    assert_eq!(report.overridden.len(), 2);
    let (s, _) = apply(
        &["--config", "x", "--redis-url", "redis://own:1"],
        &[("REDIS_TYPE", "cluster"), ("REDIS_URL", "a:1")],
    )
    .unwrap();
    assert!(s.redis_cluster.is_empty());
}

/// Cache, shadow mode, logs and the values left for the response-header options.
#[test]
fn remaining_variables() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1280000"),
            ("SHADOW_MODE", "T"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
            ("LIMIT_LIMIT_HEADER", "X-Limit"),
            ("LIMIT_REMAINING_HEADER", "X-Remaining"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("LOG_LEVEL", "WARN"),
            ("LOG_FORMAT", "JSON"),
            ("USE_PROMETHEUS", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
        ],
    )
    .unwrap();
    assert_eq!(s.local_cache_size, 10_000);
    assert!(s.shadow_mode);
    assert_eq!(s.log_format, LogFormat::Json);
    assert_eq!(
        report.overrides,
        ReferenceOverrides {
            response_headers: Some(true),
            header_limit: Some("X-Limit".into()),
            header_remaining: Some("X-Remaining".into()),
            header_reset: Some("X-Reset".into()),
            near_limit_ratio: Some(0.9),
            dynamic_metadata: None,
            log_filter: Some("warn,notify=error".into()),
        }
    );
    // USE_PROMETHEUS alone: the reference's series on its default address.
    assert_eq!(
        s.statsd.reference_prometheus_addr,
        Some("0.0.0.0:9090".parse().unwrap())
    );
    assert!(report.applied.contains(&"USE_PROMETHEUS".to_string()));
    let overridden = report.overridden.join("\n");
    for name in ["RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"] {
        assert!(overridden.contains(name), "{name}: {overridden}");
    }
    // LOCAL_CACHE_SIZE_IN_BYTES=0 turns the cache off, as in the reference.
    let (s, _) = apply(&["--config", "x"], &[("LOCAL_CACHE_SIZE_IN_BYTES", "0")]).unwrap();
    assert_eq!(s.local_cache_size, 0);
    // Unset, the reference has no local cache: nor has floodgate when started from the
    // reference's environment; with its own --config, floodgate's default stays.
    let (s, _) = apply(
        &[],
        &[("RUNTIME_ROOT", "/srv"), ("RUNTIME_SUBDIRECTORY", "rl")],
    )
    .unwrap();
    assert_eq!(s.local_cache_size, 0);
    let (s, _) = apply(&["--config", "x"], &[("REDIS_URL", "r:6379")]).unwrap();
    assert_eq!(s.local_cache_size, 100_000);
    // RUST_LOG wins over LOG_LEVEL.
    let (_, report) = apply(
        &["--config", "x"],
        &[("LOG_LEVEL", "debug"), ("RUST_LOG", "trace")],
    )
    .unwrap();
    assert_eq!(report.overrides.log_filter, None);
    assert_eq!(report.overridden, ["LOG_LEVEL (by RUST_LOG)"]);
}

/// Envoy Gateway's Prometheus variables: `PROMETHEUS_MAPPER_YAML` names the mapping file
/// (read at start-up), which leaves `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` without
/// effect as in the reference; floodgate's own flag wins; its `GRPC_SERVER_TLS_CA_CERT`,
/// which the reference does not read, is reported without effect, not refused.
#[test]
fn envoy_gateway_prometheus_and_tls_variables() {
    let pairs = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ];
    let (s, report) = apply(&["--config", "x"], &pairs).unwrap();
    let prom = s.statsd.reference_prometheus().unwrap();
    assert_eq!(prom.addr, "0.0.0.0:19001".parse().unwrap());
    assert_eq!(
        prom.mapper_file,
        Some(PathBuf::from("/etc/statsd-exporter/conf.yaml"))
    );
    assert!(!prom.response_time_ms);
    assert!(
        report
            .applied
            .contains(&"PROMETHEUS_MAPPER_YAML".to_string())
    );
    let no_effect = report.no_effect.join("\n");
    assert!(
        no_effect.contains("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS (a mapping file"),
        "{no_effect}"
    );
    assert!(
        no_effect.contains("GRPC_SERVER_TLS_CA_CERT (not read by the reference"),
        "{no_effect}"
    );
    assert_eq!(s.grpc_tls.grpc_tls_client_ca_file, None);

    let (s, report) = apply(
        &[
            "--config",
            "x",
            "--reference-prometheus-mapper-file",
            "/mine.yaml",
        ],
        &pairs,
    )
    .unwrap();
    assert_eq!(
        s.statsd.reference_prometheus_mapper_file,
        Some(PathBuf::from("/mine.yaml"))
    );
    assert!(
        report
            .overridden
            .contains(&"PROMETHEUS_MAPPER_YAML (by --reference-prometheus-mapper-file)".into())
    );
}

/// Every unparsable value is an error naming the variable; secrets are not echoed.
#[test]
fn bad_values_are_errors() {
    for (name, value) in [
        ("PORT", "http"),
        ("GRPC_PORT", "70000"),
        ("HOST", "example.com"),
        ("REDIS_SOCKET_TYPE", "udp"),
        ("REDIS_TYPE", "ring"),
        ("REDIS_TLS", "yes"),
        ("REDIS_POOL_SIZE", "0"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "-1"),
        ("NEAR_LIMIT_RATIO", "1.5"),
        ("SHADOW_MODE", "on"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "enabled"),
        ("LIMIT_RESET_HEADER", "Bad Header"),
        ("LOG_LEVEL", "verbose"),
        ("LOG_FORMAT", "logfmt"),
        ("USE_PROMETHEUS", "sure"),
        ("RUNTIME_WATCH_ROOT", "maybe"),
        ("RUNTIME_IGNOREDOTFILES", "2"),
    ] {
        let error = apply(&["--config", "x"], &[(name, value)]).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains(name) && message.contains(value),
            "{message}"
        );
    }
    let error = apply(
        &["--config", "x"],
        &[
            ("REDIS_URL", "a/b:1"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_AUTH", "hunter2"),
        ],
    )
    .unwrap_err();
    assert!(error.to_string().contains("REDIS_URL"), "{error}");
    assert!(!error.to_string().contains("hunter2"));
    // A password inside an unusable REDIS_URL is not echoed either.
    for url in ["u:hunter3@a/b:1", "user:p/ss?w@rd@a/b:1"] {
        let error = apply(
            &["--config", "x"],
            &[("REDIS_URL", url), ("REDIS_SOCKET_TYPE", "tcp")],
        )
        .unwrap_err();
        let message = error.to_string();
        assert!(message.contains("REDIS_URL"), "{message}");
        assert!(
            !message.contains("hunter3") && !message.contains("ss?w"),
            "{message}"
        );
    }
}

/// The reference's response-header and near-limit variables set floodgate's flags, unless
/// floodgate's own flags are given.
#[test]
fn response_header_variables_reach_the_flags() {
    let pairs = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "X-Left"),
        ("NEAR_LIMIT_RATIO", "0.5"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
    ];
    let (settings, report) = apply(&["--config", "x"], &pairs).unwrap();
    assert!(settings.response.response_headers);
    assert_eq!(settings.response.header_remaining, "X-Left");
    assert_eq!(settings.response.header_limit, "RateLimit-Limit");
    assert_eq!(settings.response.near_limit_ratio, 0.5);
    assert!(settings.response.response_dynamic_metadata);
    assert!(report.applied.iter().any(|a| a == "LIMIT_REMAINING_HEADER"));

    let own = [
        "--config",
        "x",
        "--header-remaining",
        "Mine",
        "--near-limit-ratio",
        "0.9",
    ];
    let (settings, report) = apply(&own, &pairs).unwrap();
    assert_eq!(settings.response.header_remaining, "Mine");
    assert_eq!(settings.response.near_limit_ratio, 0.9);
    assert!(
        report
            .overridden
            .iter()
            .any(|o| o.starts_with("NEAR_LIMIT_RATIO"))
    );
}

/// The reference's gRPC TLS variables turn on TLS (and mutual TLS with a client CA); without
/// `GRPC_SERVER_USE_TLS=true` they change nothing; floodgate's own flags win.
#[test]
fn grpc_tls_variables() {
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/tls/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/tls/tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.crt"),
    ];
    let (s, report) = apply(&["--config", "x"], &tls).unwrap();
    let files = s.grpc_tls.files().unwrap();
    assert_eq!(files.cert, PathBuf::from("/tls/tls.crt"));
    assert_eq!(files.key, PathBuf::from("/tls/tls.key"));
    assert_eq!(files.client_ca, Some(PathBuf::from("/tls/ca.crt")));
    assert_eq!(report.applied.len(), 4, "{:?}", report.applied);

    let off = [("GRPC_SERVER_USE_TLS", "false"), tls[1], tls[2]];
    let (s, report) = apply(&["--config", "x"], &off).unwrap();
    assert!(s.grpc_tls.files().is_none());
    assert_eq!(report.no_effect.len(), 2, "{:?}", report.no_effect);

    let own = [
        "--config",
        "x",
        "--grpc-tls-cert-file",
        "c",
        "--grpc-tls-key-file",
        "k",
    ];
    let (s, report) = apply(&own, &tls).unwrap();
    let files = s.grpc_tls.files().unwrap();
    assert_eq!((files.cert, files.client_ca), (PathBuf::from("c"), None));
    assert_eq!(report.overridden.len(), 4, "{:?}", report.overridden);
}

/// TLS without a certificate and key, a client SAN restriction floodgate cannot enforce, and
/// a non-boolean switch are refused (exit 64) rather than served more openly than asked.
#[test]
fn grpc_tls_variables_refused() {
    let refused = |pairs: &[(&str, &str)]| match apply(&["--config", "x"], pairs) {
        Err(SettingsError::BadReferenceValue { name, .. }) => name,
        other => panic!("{pairs:?}: {other:?}"),
    };
    let on = ("GRPC_SERVER_USE_TLS", "true");
    assert_eq!(
        refused(&[on, ("GRPC_SERVER_TLS_CERT", "c")]),
        "GRPC_SERVER_USE_TLS"
    );
    assert_eq!(
        refused(&[
            on,
            ("GRPC_SERVER_TLS_CERT", "c"),
            ("GRPC_SERVER_TLS_KEY", "k"),
            ("GRPC_CLIENT_TLS_CACERT", "ca"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
        ]),
        "GRPC_CLIENT_TLS_SAN"
    );
    assert_eq!(
        refused(&[("GRPC_SERVER_USE_TLS", "yes")]),
        "GRPC_SERVER_USE_TLS"
    );
}

/// A plausible value for each reference variable, for the tests that set them all.
fn sample(name: &str) -> &'static str {
    match name {
        "HOST" | "GRPC_HOST" | "DEBUG_HOST" => "127.0.0.1",
        "PORT" | "GRPC_PORT" | "DEBUG_PORT" | "STATSD_PORT" => "1234",
        "GRPC_UDS" => "/tmp/ratelimit.sock",
        "LOG_LEVEL" => "warn",
        "LOG_FORMAT" => "json",
        "CONFIG_TYPE" => "FILE",
        "BACKEND_TYPE" => "redis",
        "REDIS_SOCKET_TYPE" | "REDIS_PERSECOND_SOCKET_TYPE" => "tcp",
        "REDIS_TYPE" | "REDIS_PERSECOND_TYPE" => "single",
        "REDIS_URL" => "redis:6379",
        "REDIS_PERSECOND_URL" => "redis-per-second:6379",
        "REDIS_POOL_SIZE" | "REDIS_PERSECOND_POOL_SIZE" => "5",
        "LOCAL_CACHE_SIZE_IN_BYTES" => "1024",
        "NEAR_LIMIT_RATIO" => "0.5",
        "LIMIT_LIMIT_HEADER" | "LIMIT_REMAINING_HEADER" | "LIMIT_RESET_HEADER" => "X-Header",
        "RUNTIME_ROOT" => "/data",
        "RUNTIME_SUBDIRECTORY" => "ratelimit",
        "RUNTIME_APPDIRECTORY" => "config",
        "CACHE_KEY_PREFIX" => "rl_",
        name if name.ends_with("_TIMEOUT")
            || name.starts_with("GRPC_MAX_CONNECTION_AGE")
            || name.ends_with("_INTERVAL")
            || name.ends_with("_WINDOW")
            || name.ends_with("_ELAPSED_TIME")
            || name.ends_with("_DURATION")
            || name.ends_with("_REFRESH") =>
        {
            "30s"
        }
        name if name.ends_with("_AUTH") => "secret",
        name if name.ends_with("_CERT")
            || name.ends_with("_KEY")
            || name.ends_with("_CACERT")
            || name.ends_with("_YAML") =>
        {
            "/etc/file.pem"
        }
        _ => "true",
    }
}

/// Every variable of the reference's settings, set, is applied, reported without effect
/// (with a reason) or refused by name: none is ignored silently.
#[test]
fn every_reference_variable_is_decided() {
    for name in REFERENCE_VARIABLES {
        // The Redis variables come with the Redis they belong to; per-second with its switch.
        let mut pairs = vec![("REDIS_URL", "redis:6379")];
        if name.starts_with("REDIS_PERSECOND") {
            pairs.push(("REDIS_PERSECOND", "true"));
            pairs.push(("REDIS_PERSECOND_URL", "redis-per-second:6379"));
        }
        pairs.push((name, sample(name)));
        match apply(&["--config", "x"], &pairs) {
            Ok((_, report)) => {
                let all: Vec<&String> = report
                    .applied
                    .iter()
                    .chain(&report.no_effect)
                    .chain(&report.overridden)
                    .collect();
                assert!(
                    all.iter()
                        .any(|entry| *entry == name || entry.starts_with(&format!("{name} "))),
                    "{name} is set but not reported: {report:?}"
                );
            }
            Err(error) => assert!(error.to_string().contains(name), "{name}: {error}"),
        }
    }
}

/// docs/migration.md's table has one row per reference variable.
#[test]
fn the_migration_table_lists_every_variable() {
    let doc = include_str!("../../../docs/migration.md");
    for name in REFERENCE_VARIABLES {
        assert!(
            doc.contains(&format!("| `{name}` |")),
            "{name} has no row in docs/migration.md"
        );
    }
}

/// Memcache is refused by name: serving from memory instead would change the answers
/// without a word.
#[test]
fn what_cannot_be_honoured_is_refused() {
    for (name, value, why) in [
        ("BACKEND_TYPE", "memcache", "no memcache store"),
        ("MEMCACHE_HOST_PORT", "memcached:11211", "no memcache store"),
        (
            "MEMCACHE_SRV",
            "_memcache._tcp.example",
            "no memcache store",
        ),
    ] {
        let error = apply(&["--config", "x"], &[(name, value)]).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, SettingsError::Refused { .. })
                && message.contains(name)
                && message.contains(why),
            "{message}"
        );
    }
    for (name, value) in [("BACKEND_TYPE", "etcd"), ("CONFIG_TYPE", "HTTP")] {
        let error = apply(&["--config", "x"], &[(name, value)]).unwrap_err();
        assert!(
            matches!(error, SettingsError::BadReferenceValue { .. }),
            "{error}"
        );
    }
    // The docker-compose example sets xDS variables with CONFIG_TYPE=FILE: no effect.
    let (_, report) = apply(
        &["--config", "x"],
        &[
            ("CONFIG_TYPE", "FILE"),
            ("CONFIG_GRPC_XDS_NODE_ID", "test-node-id"),
            ("BACKEND_TYPE", "redis"),
        ],
    )
    .unwrap();
    assert_eq!(report.applied, ["CONFIG_TYPE"]);
    assert!(report.no_effect[0].starts_with("BACKEND_TYPE (no REDIS_URL"));
    assert!(report.no_effect[1].starts_with("CONFIG_GRPC_XDS_NODE_ID (read only with"));
}

/// statsd is on exactly when the reference would send it: by default in reference mode
/// (to localhost:8125 over TCP), when USE_STATSD is true, never with DISABLE_STATS; off
/// with --config and nothing said; the reference's variables reach the flags.
#[test]
fn statsd_follows_the_reference() {
    let (s, quiet) = apply(&["--config", "x"], &[]).unwrap();
    assert!(quiet.no_effect.is_empty() && quiet.applied.is_empty());
    assert_eq!(s.statsd.config(), None);
    let (s, _) = apply(&[], &[("RUNTIME_ROOT", "/r")]).unwrap();
    let on = s.statsd.config().unwrap();
    assert_eq!(on.addr, "localhost:8125");
    assert_eq!(on.protocol, Protocol::Tcp);
    assert_eq!(on.flavor, Flavor::Statsd);
    assert_eq!(on.flush_interval, Duration::from_secs(10));
    let (s, off) = apply(&[], &[("RUNTIME_ROOT", "/r"), ("USE_STATSD", "false")]).unwrap();
    assert_eq!(s.statsd.config(), None);
    assert!(off.applied.contains(&"USE_STATSD".to_string()));
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("STATSD_PORT", "9125"),
            ("STATSD_PROTOCOL", "udp"),
            ("EXTRA_TAGS", "b:2,a:1.5"),
            ("STATS_FLUSH_INTERVAL", "250ms"),
        ],
    )
    .unwrap();
    let on = s.statsd.config().unwrap();
    assert_eq!(on.addr, "statsd:9125");
    assert_eq!(on.protocol, Protocol::Udp);
    assert_eq!(on.flush_interval, Duration::from_millis(250));
    assert_eq!(
        on.tags,
        [("a".into(), "1_5".into()), ("b".into(), "2".into())]
    );
    assert_eq!(report.applied.len(), 6, "{:?}", report.applied);
    assert!(report.no_effect.is_empty(), "{:?}", report.no_effect);
    let (s, report) = apply(
        &[],
        &[
            ("RUNTIME_ROOT", "/r"),
            ("DISABLE_STATS", "true"),
            ("STATSD_HOST", "h"),
        ],
    )
    .unwrap();
    assert_eq!(s.statsd.config(), None);
    assert!(
        report
            .no_effect
            .iter()
            .any(|e| e.starts_with("STATSD_HOST")),
        "{report:?}"
    );
    // Dogstatsd, over UDP, needs USE_STATSD=false as in the reference (which exits).
    let (s, _) = apply(
        &["--config", "x"],
        &[("USE_DOG_STATSD", "true"), ("USE_STATSD", "false")],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dog = s.statsd.config().unwrap();
    assert_eq!(
        (dog.flavor, dog.protocol),
        (Flavor::DogStatsd, Protocol::Udp)
    );
    assert!(apply(&["--config", "x"], &[("USE_DOG_STATSD", "true")]).is_err());
    // floodgate's own flag wins.
    let (s, report) = apply(
        &["--config", "x", "--statsd-addr", "127.0.0.1:1"],
        &[("STATSD_HOST", "h")],
    )
    .unwrap();
    assert_eq!(s.statsd.config().unwrap().addr, "127.0.0.1:1");
    assert_eq!(report.overridden, ["STATSD_HOST (by --statsd-addr)"]);
    for (name, value) in [
        ("USE_STATSD", "yes"),
        ("STATSD_PORT", "x"),
        ("EXTRA_TAGS", "novalue"),
        ("STATSD_PROTOCOL", "sctp"),
        ("STATS_FLUSH_INTERVAL", "0s"),
    ] {
        assert!(
            apply(&["--config", "x"], &[("USE_STATSD", "true"), (name, value)]).is_err(),
            "{name}"
        );
    }
}

/// TRACING_ENABLED is applied; DEBUG_PORT opens the debug port on DEBUG_HOST's default, and
/// without either no debug port is opened.
#[test]
fn tracing_and_debug_are_applied() {
    let (s, on) = apply(
        &["--config", "x"],
        &[("TRACING_ENABLED", "true"), ("DEBUG_PORT", "6071")],
    )
    .unwrap();
    assert!(s.traces.tracing);
    assert!(on.applied.iter().any(|a| a == "TRACING_ENABLED"));
    assert_eq!(s.statsd.debug_addr, Some("0.0.0.0:6071".parse().unwrap()));
    assert!(on.applied.contains(&"DEBUG_PORT".to_string()));
    assert!(on.no_effect.is_empty(), "{:?}", on.no_effect);
    let (s, _) = apply(&["--config", "x"], &[]).unwrap();
    assert_eq!(s.statsd.debug_addr, None);
}

/// The reference's tracing variables reach the trace settings with the reference's
/// defaults (service RateLimit, HTTP, parent-based rate 1), and win over OTEL_*.
#[test]
fn reference_tracing_variables() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
            ("TRACING_SERVICE_NAMESPACE", "edge"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "ignored"),
        ],
    )
    .unwrap();
    let t = &s.traces;
    assert!(t.tracing && t.tracing_parent_based);
    assert_eq!(t.tracing_protocol, OtlpProtocol::Grpc);
    assert_eq!(t.tracing_service_name, "RateLimit");
    assert_eq!(t.tracing_service_namespace, "edge");
    assert_eq!(t.tracing_service_instance_id.as_deref(), Some("pod-1"));
    assert_eq!(t.tracing_sampling_rate, 0.25);
    assert!(report.no_effect.is_empty(), "{:?}", report.no_effect);
    // The reference clamps its ratio; a non-number is refused.
    let (s, _) = apply(
        &["--config", "x"],
        &[("TRACING_ENABLED", "1"), ("TRACING_SAMPLING_RATE", "7")],
    )
    .unwrap();
    assert_eq!(s.traces.tracing_sampling_rate, 1.0);
    assert!(
        apply(
            &["--config", "x"],
            &[
                ("TRACING_ENABLED", "1"),
                ("TRACING_EXPORTER_PROTOCOL", "udp")
            ]
        )
        .is_err()
    );
}

/// Off, the tracing options are reported without effect; floodgate's flags win over them.
#[test]
fn tracing_off_or_overridden() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("TRACING_ENABLED", "false"),
            ("TRACING_SAMPLING_RATE", "0.5"),
        ],
    )
    .unwrap();
    assert!(!s.traces.tracing);
    assert!(report.no_effect[0].starts_with("TRACING_SAMPLING_RATE (tracing is off"));
    let (s, report) = apply(
        &["--config", "x", "--tracing", "--tracing-service-name", "fg"],
        &[("TRACING_ENABLED", "false"), ("TRACING_SERVICE_NAME", "RL")],
    )
    .unwrap();
    assert!(s.traces.tracing);
    assert_eq!(s.traces.tracing_service_name, "fg");
    assert_eq!(report.overridden.len(), 2, "{:?}", report.overridden);
}

/// The standard OTEL_* variables choose the protocol, service name and sampler.
#[test]
fn otel_variables() {
    let (s, _) = apply(
        &["--config", "x", "--tracing"],
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "gate"),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ],
    )
    .unwrap();
    let t = &s.traces;
    assert_eq!(t.tracing_protocol, OtlpProtocol::Grpc);
    assert_eq!(t.tracing_service_name, "gate");
    assert!(!t.tracing_parent_based);
    assert_eq!(t.tracing_sampling_rate, 0.1);
    let (s, report) = apply(
        &["--config", "x", "--tracing"],
        &[("OTEL_TRACES_SAMPLER", "jaeger_remote")],
    )
    .unwrap();
    assert!(s.traces.tracing_parent_based);
    assert_eq!(s.traces.tracing_sampling_rate, 1.0);
    assert_eq!(report.no_effect.len(), 1);
    let (s, _) = apply(
        &["--config", "x"],
        &[("TRACING_ENABLED", "true"), ("OTEL_SDK_DISABLED", "true")],
    )
    .unwrap();
    assert!(!s.traces.tracing);
}

/// GRPC_UDS, the connection age and grace, and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED reach
/// their flags; with a socket, GRPC_HOST/GRPC_PORT have no effect.
#[test]
fn server_variables_reach_the_flags() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("GRPC_UDS", "/run/rl.sock"),
            ("GRPC_PORT", "9000"),
            ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "10s"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ],
    )
    .unwrap();
    let connections = &s.grpc_connections;
    assert_eq!(connections.grpc_uds, Some(PathBuf::from("/run/rl.sock")));
    assert_eq!(
        connections.grpc_max_connection_age,
        Some(Duration::from_secs(5400))
    );
    assert_eq!(
        connections.grpc_max_connection_age_grace,
        Some(Duration::from_secs(10))
    );
    assert!(s.health_requires_limits);
    assert_eq!(s.grpc_addr, addr("0.0.0.0:8081"), "GRPC_PORT not applied");
    assert!(
        report
            .no_effect
            .iter()
            .any(|e| e.starts_with("GRPC_PORT ("))
    );
    // The grace alone applies to the reference's default age, 24 h.
    let (s, _) = apply(
        &["--config", "x"],
        &[("GRPC_MAX_CONNECTION_AGE_GRACE", "5m")],
    )
    .unwrap();
    assert_eq!(
        s.grpc_connections.grpc_max_connection_age,
        Some(Duration::from_secs(86_400))
    );
    // floodgate's own flag wins.
    let (s, report) = apply(
        &["--config", "x", "--grpc-max-connection-age", "60"],
        &[("GRPC_MAX_CONNECTION_AGE", "1h")],
    )
    .unwrap();
    assert_eq!(
        s.grpc_connections.grpc_max_connection_age,
        Some(Duration::from_secs(60))
    );
    assert_eq!(report.overridden.len(), 1);
    for (name, value) in [
        ("GRPC_MAX_CONNECTION_AGE", "24"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1 hour"),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "yes"),
        ("REDIS_TIMEOUT", "-1s"),
    ] {
        let error = apply(&["--config", "x"], &[(name, value)]).unwrap_err();
        assert!(error.to_string().contains(name), "{error}");
    }
}

/// REDIS_TIMEOUT is the connect timeout; the per-request deadline only gets shorter.
#[test]
fn redis_timeout_mapping() {
    let (s, report) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "r:1"), ("REDIS_TIMEOUT", "10s")],
    )
    .unwrap();
    assert_eq!(s.redis_connect_timeout_ms, Duration::from_secs(10));
    assert_eq!(s.redis_timeout_ms, Duration::from_millis(10));
    assert!(
        report
            .applied
            .iter()
            .any(|e| e.starts_with("REDIS_TIMEOUT (connect timeout 10s")),
        "{report:?}"
    );
    let (s, _) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "r:1"), ("REDIS_TIMEOUT", "5ms")],
    )
    .unwrap();
    assert_eq!(s.redis_connect_timeout_ms, Duration::from_millis(5));
    assert_eq!(s.redis_timeout_ms, Duration::from_millis(5));
    let (s, report) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "r:1"), ("REDIS_TIMEOUT", "0")],
    )
    .unwrap();
    assert_eq!(s.redis_connect_timeout_ms, Duration::from_millis(250));
    assert!(report.no_effect[0].starts_with("REDIS_TIMEOUT ("));
}

/// REDIS_SENTINEL_AUTH gives the sentinels their credentials; the master's stay REDIS_AUTH's.
#[test]
fn sentinel_auth() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26380,s2"),
            ("REDIS_AUTH", "master-pw"),
            ("REDIS_SENTINEL_AUTH", "user:sentinel pw"),
        ],
    )
    .unwrap();
    assert_eq!(
        s.redis_sentinel_nodes,
        [
            "redis://user:sentinel%20pw@s1:26380",
            "redis://user:sentinel%20pw@s2:26379"
        ]
    );
    assert_eq!(s.redis_url.as_deref(), Some("redis://:master-pw@mymaster"));
    assert!(report.applied.contains(&"REDIS_SENTINEL_AUTH".to_string()));
    assert!(!format!("{s:?}").contains("sentinel pw"));
    // Not a sentinel setup: no effect.
    let (_, report) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "r:1"), ("REDIS_SENTINEL_AUTH", "pw")],
    )
    .unwrap();
    assert!(report.no_effect[0].starts_with("REDIS_SENTINEL_AUTH (only for"));
}

/// REDIS_PERSECOND=true with its own variables configures the per-second Redis, in any
/// topology; without the switch they have no effect; the switch needs both URLs.
#[test]
fn per_second_redis() {
    let (s, report) = apply(
        &["--config", "x"],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "persecond:6380"),
            ("REDIS_PERSECOND_AUTH", "pw"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_PERSECOND_POOL_SIZE", "3"),
            ("REDIS_PERSECOND_TIMEOUT", "2s"),
        ],
    )
    .unwrap();
    let per_second = &s.redis_per_second;
    assert_eq!(s.redis_url.as_deref(), Some("redis://main:6379"));
    assert_eq!(
        per_second.redis_per_second_url.as_deref(),
        Some("rediss://:pw@persecond:6380")
    );
    assert_eq!(per_second.redis_per_second_pool_size, 3);
    assert_eq!(
        per_second.redis_per_second_connect_timeout_ms,
        Duration::from_secs(2)
    );
    assert!(report.no_effect.is_empty(), "{report:?}");
    assert_eq!(report.applied.len(), 8, "{:?}", report.applied);

    // Cluster and sentinel per-second stores.
    let (s, _) = apply(
        &["--config", "x"],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("REDIS_PERSECOND_URL", "a:1,b:2"),
        ],
    )
    .unwrap();
    assert_eq!(
        s.redis_per_second.redis_per_second_cluster,
        ["redis://a:1", "redis://b:2"]
    );
    let (s, _) = apply(
        &["--config", "x"],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "sentinel"),
            ("REDIS_PERSECOND_URL", "ps,s1:26379"),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "spw"),
        ],
    )
    .unwrap();
    let per_second = &s.redis_per_second;
    assert_eq!(per_second.redis_per_second_sentinel.as_deref(), Some("ps"));
    assert_eq!(
        per_second.redis_per_second_sentinel_nodes,
        ["redis://:spw@s1:26379"]
    );

    // Without the switch: no effect, named.
    let (s, report) = apply(
        &["--config", "x"],
        &[("REDIS_URL", "main:6379"), ("REDIS_PERSECOND_URL", "p:1")],
    )
    .unwrap();
    assert!(!s.redis_per_second.is_set());
    assert_eq!(
        report.no_effect,
        ["REDIS_PERSECOND_URL (REDIS_PERSECOND is not true)"]
    );
    // The switch without a per-second URL, or without a main Redis, is refused.
    for pairs in [
        &[("REDIS_URL", "main:6379"), ("REDIS_PERSECOND", "true")][..],
        &[("REDIS_PERSECOND", "true"), ("REDIS_PERSECOND_URL", "p:1")][..],
    ] {
        let error = apply(&["--config", "x"], pairs).unwrap_err();
        assert!(error.to_string().contains("REDIS_PERSECOND"), "{error}");
    }
    // Secrets stay out of errors.
    let error = apply(
        &["--config", "x"],
        &[
            ("REDIS_URL", "main:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "a/b:1"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_AUTH", "hunter2"),
        ],
    )
    .unwrap_err();
    assert!(!error.to_string().contains("hunter2"), "{error}");
}

/// `CONFIG_TYPE=GRPC_XDS_SOTW` takes the limits from the control plane the reference's
/// variables name, with the reference's defaults, and needs no limits path.
#[test]
fn xds_variables_reach_the_xds_settings() {
    let (s, report) = apply(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "a:1"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "2s"),
            ("XDS_CLIENT_BACKOFF_JITTER", "false"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    )
    .unwrap();
    assert_eq!(s.xds.config_xds.as_deref(), Some("envoy-gateway:18001"));
    assert_eq!(s.xds.xds_node_id, "ratelimit");
    assert_eq!(s.xds.xds_node_metadata, "a:1");
    assert!(s.xds.xds_tls && s.xds.xds_force_start);
    assert_eq!(s.xds.xds_tls_ca, Some(PathBuf::from("/certs/ca.crt")));
    assert_eq!(s.xds.xds_tls_key, Some(PathBuf::from("/certs/tls.key")));
    assert_eq!(s.xds.xds_backoff_initial, std::time::Duration::from_secs(2));
    assert_eq!(s.xds.xds_backoff_jitter, 0.0);
    assert!(report.no_effect.is_empty(), "{:?}", report.no_effect);
    // The reference's default server.
    let (s, _) = apply(&[], &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap();
    assert_eq!(s.xds.config_xds.as_deref(), Some("localhost:18000"));
}
