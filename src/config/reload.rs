//! Hot reload: watch the limits path and swap in a new [`Config`] when it changes.
//!
//! Place in the flow: beside the request path, not on it. [`spawn`] watches the limits path
//! (`--config`, or the reference layout's directory); after a burst of file-system events has
//! settled it loads the limits again with the same [`Loader`] as at start-up and, only if that load succeeded, stores
//! the new `Arc<Config>` in the shared `ArcSwap`. A request holds the `Arc<Config>` it started
//! with, so requests in flight finish on the old limits and none fails during a reload.
//!
//! What is watched, and how bursts of changes are settled, is [`crate::file_watch`]'s job
//! (shared with the TLS certificates): a directory and any change inside it (a ConfigMap's
//! `..data` swap included), a file through its parent and its `..` siblings, and the parent
//! of a directory, so that a deleted path is followed when it reappears. If the path is
//! deleted, the previous limits stay in force (one warning is logged) until it is back.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{Config, ConfigErrors, Loader, Source};
use crate::file_watch::{self, FileWatch, RecursiveMode, WatchError};
use crate::telemetry::metrics::Metrics;

/// Watches the limits of `loader` and reloads them into `config` after each change, until the
/// returned guard is dropped. `on_reload` runs after each successful swap, with the new configuration (the
/// server clears the Redis over-limit cache there). Must be called inside a tokio runtime;
/// the watches are in place when it returns, so any later change is seen.
pub fn spawn(
    loader: Loader,
    config: Arc<ArcSwap<Config>>,
    metrics: Arc<Metrics>,
    on_reload: impl Fn(&Config) + Send + Sync + 'static,
) -> Result<FileWatch, WatchError> {
    let path = loader.source.watch_path();
    // The reference layout's walk reads nested directories: a change in any of them counts.
    let depth = match loader.source {
        Source::Runtime(_) => RecursiveMode::Recursive,
        Source::Path(_) => RecursiveMode::NonRecursive,
    };
    let mut reloader = Reloader {
        path: path.clone(),
        loader,
        config,
        metrics,
        on_reload: Box::new(on_reload),
        missing: false,
    };
    let watch = file_watch::spawn(&[path.as_path()], depth, "limits", move || {
        let attempt = load(&reloader.path, &reloader.loader);
        reloader.apply(attempt);
    })?;
    tracing::info!(path = %path.display(), "watching limits for changes");
    Ok(watch)
}

/// State of the reload task.
struct Reloader {
    /// The watched path (whose disappearance keeps the previous limits in force).
    path: PathBuf,
    /// The loader of start-up, so errors name files alike.
    loader: Loader,
    /// The limits in force, shared with the request path.
    config: Arc<ArcSwap<Config>>,
    /// Where loads are counted.
    metrics: Arc<Metrics>,
    /// Called after each successful swap.
    on_reload: Box<dyn Fn(&Config) + Send + Sync>,
    /// Whether the path was found missing at the last attempt (so that is logged once).
    missing: bool,
}

/// What one reload attempt found.
enum Attempt {
    Loaded(Config),
    Failed(ConfigErrors),
    Missing,
}

impl Reloader {
    fn apply(&mut self, attempt: Attempt) {
        match attempt {
            Attempt::Loaded(config) => {
                self.missing = false;
                let domains = config.domains().count();
                self.metrics.resolve_rules(&config);
                self.config.store(Arc::new(config));
                // After the swap: a denial cached under the old limits must not outlive them.
                (self.on_reload)(&self.config.load());
                self.metrics
                    .record_config_load_with(true, &format!("reloaded: {domains} domain(s)"));
                tracing::info!(path = %self.path.display(), domains, "limits reloaded");
            }
            Attempt::Failed(errors) => {
                self.missing = false;
                let count = errors.0.len();
                // One line, however many errors: log collectors split records on newlines.
                let all: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
                self.metrics.record_config_load_with(false, &all.join("; "));
                tracing::error!(
                    path = %self.path.display(),
                    errors = count,
                    "limits reload failed, keeping the previous limits: {}",
                    all.join("; ")
                );
            }
            Attempt::Missing if self.missing => {
                tracing::debug!(path = %self.path.display(), "limits path still missing");
            }
            Attempt::Missing => {
                self.missing = true;
                self.metrics.record_config_load_with(
                    false,
                    "limits path disappeared; previous limits kept",
                );
                tracing::warn!(
                    path = %self.path.display(),
                    "limits path disappeared; keeping the previous limits until it reappears"
                );
            }
        }
    }
}

fn load(path: &std::path::Path, loader: &Loader) -> Attempt {
    // `exists` follows symlinks: a dangling link counts as missing too.
    if !path.exists() {
        return Attempt::Missing;
    }
    match loader.load_within(super::LOAD_DEADLINE) {
        Ok(config) => Attempt::Loaded(config),
        Err(errors) => Attempt::Failed(errors),
    }
}
