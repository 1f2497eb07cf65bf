//! Limits from files: list and read them safely, compile them, and follow them (hot reload).
//!
//! Place in the flow: beside the request path, not on it. At start-up the server loads the
//! limits with a [`Loader`] (under [`LOAD_DEADLINE`](super::LOAD_DEADLINE)). [`spawn`] then
//! watches the limits path (`--config`, or the reference layout's directory); after a burst
//! of file-system events has settled it loads the limits again with the same [`Loader`] and,
//! only if that load succeeded, publishes the new [`Config`] ([`Publisher`]: the shared
//! `ArcSwap` the request path reads). A request holds the `Arc<Config>` it started with, so
//! requests in flight finish on the old limits and none fails during a reload.
//!
//! - `list` — which files are limits files ([`Source`]: `--config`, or the reference's
//!   runtime layout), bounded in entries and depth;
//! - `read` — opening and reading one file safely (regular files only, size caps, the
//!   nesting depth of its text);
//! - here — reading a listing into `(file name, text)` pairs for [`crate::config`] to
//!   compile, and the reload task.
//!
//! What is watched, and how bursts of changes are settled, is [`crate::file_watch`]'s job
//! (shared with the TLS certificates): a directory and any change inside it (a ConfigMap's
//! `..data` swap included), a file through its parent and its `..` siblings, and the parent
//! of a directory, so that a deleted path is followed when it reappears. If the path is
//! deleted, the previous limits stay in force (one warning is logged) until it is back.

mod list;
mod read;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use list::{RuntimeLayout, Source};
pub use read::{MAX_FILE_BYTES, MAX_FILES, MAX_LOAD_BYTES, MAX_WALK_DEPTH};

use super::Publisher;
use crate::config::{Config, ConfigError, ConfigErrors, Defaults};
use crate::file_watch::{self, FileWatch, RecursiveMode, WatchError};
use read::Reader;

/// How limits are loaded, identical at start-up and on every reload: where the files are,
/// the loader defaults, and whether a domain may span several files.
#[derive(Clone, Debug)]
pub struct Loader {
    /// Where the limits files are.
    pub source: Source,
    /// Settings not in the files (the default algorithm).
    pub defaults: Defaults,
    /// The reference's `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
}

impl Loader {
    /// Reads and compiles the limits files of the source: a file, or every `*.yaml`/`*.yml`
    /// file directly inside a directory (names starting with `.` skipped, and every skipped
    /// file named in the log; symlinks followed, read in name order), or the reference's
    /// runtime layout (see [`Source`]). An empty directory gives a configuration without
    /// domains, which loads but is logged as a warning: every request would then be answered
    /// OK. Every error of every file is returned.
    pub fn load(&self) -> Result<Config, ConfigErrors> {
        let config = self.read_and_compile()?;
        if config.is_empty() {
            tracing::warn!(
                limits = %self.source,
                "no domain loaded: every request is answered OK until limits are added"
            );
        }
        Ok(config)
    }

    /// Reads and compiles the files, every error of every file returned.
    fn read_and_compile(&self) -> Result<Config, ConfigErrors> {
        let (sources, mut errors) = read_source(&self.source);
        // Reference mode reads every file as the reference does (see `config::compile_lenient`).
        let compiled = match self.source {
            Source::Runtime(_) => {
                Config::compile_lenient(&sources, &self.defaults, self.merge_domains)
            }
            Source::Path(_) => Config::compile(&sources, &self.defaults, self.merge_domains),
        };
        match compiled {
            Ok(config) if errors.is_empty() => Ok(config),
            Ok(_) => Err(ConfigErrors(errors)),
            Err(ConfigErrors(more)) => {
                errors.extend(more);
                Err(ConfigErrors(errors))
            }
        }
    }

    /// [`Loader::load`] on its own thread, abandoned after `deadline` (an error): whatever a
    /// limits file holds, the caller (start-up, reload, and so shutdown) waits no longer.
    pub fn load_within(&self, deadline: Duration) -> Result<Config, ConfigErrors> {
        let loader = self.clone();
        super::load_within(self.source.to_string(), deadline, move || loader.load())
    }
}

/// Reads and compiles the limits at `path` (a file, or a directory of them) as `--config`
/// does, without merging domains and without the warning of an empty load: what
/// `floodgate check-config` and the tests load.
pub fn load(path: &Path, defaults: &Defaults) -> Result<Config, ConfigErrors> {
    Loader {
        source: Source::Path(path.to_path_buf()),
        defaults: *defaults,
        merge_domains: false,
    }
    .read_and_compile()
}

/// Reads the files of `source` (listed by `list`), logging the files it leaves
/// out. Returns what could be read and an error for each file that could not.
fn read_source(source: &Source) -> (Vec<(String, String)>, Vec<ConfigError>) {
    let listing = match source {
        Source::Path(path) => match list::list_path(path) {
            Ok(listing) => listing,
            Err(e) => {
                let label = path.display().to_string();
                return (
                    Vec::new(),
                    vec![error(&label, "", format!("cannot read: {e}"))],
                );
            }
        },
        Source::Runtime(layout) => list::list_runtime(layout),
    };
    // Named, so that a file an operator expected to be loaded is never skipped silently.
    for (file, reason) in &listing.skipped {
        tracing::warn!(file = %file.display(), "not loaded as a limits file: {reason}");
    }
    if let Some(why) = &listing.empty_because {
        tracing::warn!("no limits file read: {why}");
    }
    if let Some(why) = listing.refused {
        let label = source.watch_path().display().to_string();
        return (Vec::new(), vec![error(&label, "", why)]);
    }
    read_files(&listing.files)
}

/// Reads `files` in order: what could be read, and an error for each file that could not.
fn read_files(files: &[PathBuf]) -> (Vec<(String, String)>, Vec<ConfigError>) {
    // Regular files only, size-capped, never blocking (see `read`).
    let mut reader = Reader::default();
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        let name = file.display().to_string();
        match reader.read(file) {
            Ok(content) => sources.push((name, content)),
            Err(message) => errors.push(error(&name, "", message)),
        }
    }
    (sources, errors)
}

/// An error of the whole file (or directory) `file`.
fn error(file: &str, path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Watches the limits of `loader` and publishes them again after each change, until the
/// returned guard is dropped. Must be called inside a tokio runtime; the watches are in place
/// when it returns, so any later change is seen.
pub fn spawn(loader: Loader, publisher: Publisher) -> Result<FileWatch, WatchError> {
    let path = loader.source.watch_path();
    // The reference layout's walk reads nested directories: a change in any of them counts.
    let depth = match loader.source {
        Source::Runtime(_) => RecursiveMode::Recursive,
        Source::Path(_) => RecursiveMode::NonRecursive,
    };
    let mut reloader = Reloader {
        path: path.clone(),
        loader,
        publisher,
        missing: false,
    };
    let watch = file_watch::spawn(&[path.as_path()], depth, "limits", move || {
        let attempt = attempt(&reloader.path, &reloader.loader);
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
    /// Where new limits go.
    publisher: Publisher,
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
                let domains = self.publisher.publish(config, "reloaded");
                tracing::info!(path = %self.path.display(), domains, "limits reloaded");
            }
            Attempt::Failed(errors) => {
                self.missing = false;
                let count = errors.0.len();
                let all = self.publisher.reject(&errors);
                tracing::error!(
                    path = %self.path.display(),
                    errors = count,
                    "limits reload failed, keeping the previous limits: {all}"
                );
            }
            Attempt::Missing if self.missing => {
                tracing::debug!(path = %self.path.display(), "limits path still missing");
            }
            Attempt::Missing => {
                self.missing = true;
                self.publisher
                    .reject_for("limits path disappeared; previous limits kept");
                tracing::warn!(
                    path = %self.path.display(),
                    "limits path disappeared; keeping the previous limits until it reappears"
                );
            }
        }
    }
}

fn attempt(path: &Path, loader: &Loader) -> Attempt {
    // `exists` follows symlinks: a dangling link counts as missing too.
    if !path.exists() {
        return Attempt::Missing;
    }
    match loader.load_within(super::LOAD_DEADLINE) {
        Ok(config) => Attempt::Loaded(config),
        Err(errors) => Attempt::Failed(errors),
    }
}

#[cfg(test)]
mod tests;
