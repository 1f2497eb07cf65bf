//! The `floodgate` binary: parse settings, set up logging, run. Everything else is the library.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use floodgate::config::{Defaults, format_wait};
use floodgate::console::{BucketEntry, BucketRequest, client};
use floodgate::server;
use floodgate::settings::console::{BucketAction, BucketSettings};
use floodgate::settings::{CheckConfigSettings, Cli, Command, LogFormat, apply_reference_env};
use mimalloc::MiMalloc;

/// mimalloc instead of glibc malloc: the request path allocates many small, short-lived
/// buffers (HTTP/2 frames, protobuf messages, keys, the Redis command), and glibc's
/// malloc/free are the largest single cost in a profile of the Redis path.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Exit code for bad flags or an unloadable configuration (EX_USAGE): nothing was started.
const EXIT_USAGE: u8 = 64;

/// The command line; invoked as `ratelimit` (the reference's `/bin/ratelimit`, which Envoy
/// Gateway and other installations name as the container's command), `serve` is implied.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as_reference = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|name| name == "ratelimit");
    if invoked_as_reference {
        args.insert(1, "serve".into());
    }
    args
}

fn main() -> ExitCode {
    let parsed = Cli::command()
        .try_get_matches_from(arguments())
        .and_then(|matches| Cli::from_arg_matches(&matches).map(|cli| (cli, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match cli.command {
        Command::CheckConfig(settings) => check_config(&settings),
        Command::Bucket(settings) => bucket(&settings),
        Command::Serve(mut settings) => {
            // The reference server's environment variables fill in what our own flags left
            // at their defaults.
            let serve_matches = matches.subcommand_matches("serve").unwrap_or(&matches);
            // Non-UTF-8 variables are none of the reference's: skipped rather than a panic.
            let env: HashMap<String, String> = std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect();
            let report = match apply_reference_env(&mut settings, serve_matches, &env) {
                Ok(report) => report,
                Err(e) => {
                    eprintln!("floodgate: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            init_tracing(settings.log_format, report.overrides.log_filter.as_deref());
            report.log();
            // Single-threaded; gRPC gets one such runtime per CPU (floodgate::runtime).
            let runtime = match floodgate::runtime::main_runtime() {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("floodgate: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // Store set-up spawns background tasks (the Redis pool), so it runs inside the
            // runtime; it binds nothing, so a bad setting still exits before any port is bound.
            let entered = runtime.enter();
            let components = match server::assemble(settings) {
                Ok(components) => components,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("floodgate: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let served = runtime.block_on(server::serve(components));
            drop(entered);
            // A limits reload still running (bounded by its own deadline) must not hold the
            // exit back: the server has drained, nothing else is left to wait for.
            runtime.shutdown_background();
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_config(settings: &CheckConfigSettings) -> ExitCode {
    let defaults = Defaults {
        algorithm: settings.algorithm.value.into(),
        max_rules: settings.max_load_rules.value,
    };
    match floodgate::sources::files::load(&settings.path, &defaults) {
        Ok(config) => {
            print!("{}", config.describe());
            for (rule, wait) in config.waits_longer_than(settings.expected_client_timeout) {
                eprintln!(
                    "warning: {}: {rule}: max_wait {} is longer than the clients wait \
                     (--expected-client-timeout {}): raise the timeout of Envoy's rate-limit \
                     filter above it, or the request fails before it is answered",
                    settings.path.display(),
                    format_wait(wait),
                    format_wait(settings.expected_client_timeout),
                );
            }
            println!("{}: valid", settings.path.display());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!(
                "{}: invalid ({} error{})",
                settings.path.display(),
                errors.0.len(),
                if errors.0.len() == 1 { "" } else { "s" }
            );
            ExitCode::FAILURE
        }
    }
}

/// `floodgate bucket get|reset|set`: one console call; prints the JSON answer. Exit 0 on
/// success, 1 when the server refused or failed, 64 for a bad argument.
fn bucket(settings: &BucketSettings) -> ExitCode {
    let (request, call) = match console_request(settings) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("floodgate: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let token = match &settings.token_file {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(token) => Some(token.trim().to_owned()),
            Err(e) => {
                eprintln!("floodgate: cannot read {}: {e}", path.display());
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => None,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("floodgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(client::send(
        &settings.admin,
        call,
        &request,
        token.as_deref(),
    )) {
        Ok((status, body)) => {
            println!("{body}");
            if (200..300).contains(&status) {
                ExitCode::SUCCESS
            } else {
                eprintln!("floodgate: the server answered HTTP {status}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("floodgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The console request the `bucket` flags describe.
fn console_request(settings: &BucketSettings) -> Result<(BucketRequest, client::Call), String> {
    let entries = settings
        .entries
        .iter()
        .map(|entry| {
            let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
            if key.is_empty() {
                return Err(format!("--entry {entry:?}: the key is empty"));
            }
            Ok(BucketEntry {
                key: key.to_owned(),
                value: value.to_owned(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (call, remaining) = match settings.action {
        BucketAction::Get => (client::Call::Get, None),
        BucketAction::Reset => (client::Call::Reset, None),
        BucketAction::Set { remaining } => (client::Call::Set, Some(remaining)),
    };
    Ok((
        BucketRequest {
            domain: settings.domain.clone(),
            entries,
            key: settings.key.clone(),
            remaining,
        },
        call,
    ))
}

/// Logs in `format`, filtered by `RUST_LOG`, else by `fallback` (from the reference's
/// `LOG_LEVEL`), else at info.
fn init_tracing(format: LogFormat, fallback: Option<&str>) {
    // notify logs its own bookkeeping when a watched directory is deleted; the reloader
    // reports that case itself, once.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(fallback.unwrap_or("info,notify=error"))
    });
    // Colour only on a terminal: log collectors read files and pipes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
