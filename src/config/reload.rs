//! Hot reload: watch the limits path and swap in a new [`Config`] when it changes.
//!
//! Place in the flow: beside the request path, not on it. [`spawn`] watches the path given to
//! `--config`; after a burst of file-system events has settled it loads the limits again with
//! the same loader and [`Defaults`] as at start-up and, only if that load succeeded, stores
//! the new `Arc<Config>` in the shared `ArcSwap`. A request holds the `Arc<Config>` it started
//! with, so requests in flight finish on the old limits and none fails during a reload.
//!
//! What is watched, and why:
//!
//! - A **directory** is watched itself, and any event in it counts, dot-entries included: a
//!   Kubernetes ConfigMap volume is updated by writing a new `..<timestamp>` directory and
//!   atomically renaming a `..data` symlink over the old one, which only shows up as events
//!   on those dot-entries.
//! - A **file** is watched through its parent directory (editors and ConfigMaps replace a file
//!   by renaming another over it, which a watch on the file itself would miss), counting
//!   events on that name and on `..`-prefixed names (the ConfigMap swap, when the file is a
//!   `name -> ..data/name` symlink); the file is also watched itself, so in-place edits of a
//!   symlink's target elsewhere are seen.
//! - The **parent** of a directory is watched too, for events on the directory's own name: if
//!   the directory is deleted, the previous limits stay in force (one warning is logged) and
//!   they are reloaded when it is created again.
//!
//! Opening and reading files (the loader's own reads among them) are not changes and are
//! ignored. Every watch is re-established before each load, so a replaced directory or file
//! is followed to its new inode.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::event::{AccessKind, AccessMode, EventKind, MetadataKind, ModifyKind};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Config, ConfigErrors, Defaults};
use crate::metrics::Metrics;

/// A reload waits until no relevant event has arrived for this long, so that a burst (an
/// editor's write-then-rename, a kubelet's whole ConfigMap swap) causes one load, of the end
/// state.
pub const QUIET_PERIOD: Duration = Duration::from_millis(150);

/// A reload never waits longer than this after the first event of a burst, even if events
/// keep coming.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {path}: {source}")]
pub struct WatchError {
    /// The limits path.
    pub path: String,
    /// The watcher's error (e.g. the inotify instance limit).
    pub source: notify::Error,
}

/// The running watcher: reloading stops when this is dropped.
#[derive(Debug)]
pub struct ConfigWatch {
    task: JoinHandle<()>,
}

impl Drop for ConfigWatch {
    fn drop(&mut self) {
        // The task owns the file-system watcher; aborting it drops the watcher, which stops
        // its thread.
        self.task.abort();
    }
}

/// Watches `path` and reloads it into `config` after each change, until the returned guard is
/// dropped. `on_reload` runs after each successful swap, with the new configuration (the
/// server clears the Redis over-limit cache there). Must be called inside a tokio runtime;
/// the watches are in place when it returns, so any later change is seen.
pub fn spawn(
    path: &Path,
    defaults: Defaults,
    config: Arc<ArcSwap<Config>>,
    metrics: Arc<Metrics>,
    on_reload: impl Fn(&Config) + Send + Sync + 'static,
) -> Result<ConfigWatch, WatchError> {
    // Absolute, like the paths notify reports events with, so the two compare.
    let target = Target::new(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
    let (tx, events) = mpsc::unbounded_channel();
    let filter = target.clone();
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) if filter.is_relevant(&event) => {
            let _ = tx.send(());
        }
        Ok(_) => {}
        Err(e) => {
            // Missed events are possible (e.g. a full inotify queue): reload to be sure.
            tracing::warn!(error = %e, "limits watcher error; reloading to be safe");
            let _ = tx.send(());
        }
    };
    let error = |source| WatchError {
        path: path.display().to_string(),
        source,
    };
    let mut watcher = notify::recommended_watcher(handler).map_err(error)?;
    // The path itself must be watchable at start (it was just loaded); its parent is best
    // effort.
    watcher
        .watch(&target.path, RecursiveMode::NonRecursive)
        .map_err(error)?;
    if let Some(parent) = &target.parent
        && let Err(e) = watcher.watch(parent, RecursiveMode::NonRecursive)
    {
        tracing::warn!(parent = %parent.display(), error = %e,
            "cannot watch the limits path's parent; a deleted path will not be followed");
    }
    tracing::info!(path = %path.display(), "watching limits for changes");
    let reloader = Reloader {
        target,
        path: path.to_path_buf(),
        defaults,
        config,
        metrics,
        on_reload: Box::new(on_reload),
        missing: false,
    };
    let task = tokio::spawn(reloader.run(watcher, events));
    Ok(ConfigWatch { task })
}

/// The watched path and how events relate to it.
#[derive(Clone, Debug)]
struct Target {
    /// The limits path, absolute.
    path: PathBuf,
    /// Its parent directory, if it has one.
    parent: Option<PathBuf>,
}

impl Target {
    fn new(path: PathBuf) -> Target {
        let parent = path.parent().map(Path::to_path_buf);
        Target { path, parent }
    }

    /// Whether `event` may have changed what loading the path reads.
    fn is_relevant(&self, event: &Event) -> bool {
        // Opening and reading change nothing, and the loader's own reads cause them:
        // reacting to them would reload forever.
        let read_only = match event.kind {
            EventKind::Access(kind) => kind != AccessKind::Close(AccessMode::Write),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => true,
            _ => false,
        };
        if read_only {
            return false;
        }
        // No path: the backend lost track (e.g. queue overflow, "rescan"); reload.
        event.paths.is_empty() || event.paths.iter().any(|p| self.touches(p))
    }

    /// Whether a change at `changed` can affect the path: inside it (or it), or a
    /// `..`-prefixed sibling (a ConfigMap's `..data` swap, for a file linked through it).
    fn touches(&self, changed: &Path) -> bool {
        if changed.starts_with(&self.path) {
            return true;
        }
        changed.parent() == self.parent.as_deref()
            && changed
                .file_name()
                .is_some_and(|name| name.as_encoded_bytes().starts_with(b".."))
    }
}

/// State of the reload task.
struct Reloader {
    /// What is watched.
    target: Target,
    /// The path as configured: loaded as at start-up, so errors name files alike.
    path: PathBuf,
    /// The loader settings of start-up.
    defaults: Defaults,
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
    async fn run(
        mut self,
        mut watcher: RecommendedWatcher,
        mut events: mpsc::UnboundedReceiver<()>,
    ) {
        while events.recv().await.is_some() {
            if !settle(&mut events).await {
                return;
            }
            let (target, path, defaults) = (self.target.clone(), self.path.clone(), self.defaults);
            // Watch calls and file reads block: keep them off the runtime's workers.
            let attempt = tokio::task::spawn_blocking(move || {
                rewatch(&mut watcher, &target);
                let attempt = load(&path, &defaults);
                (watcher, attempt)
            })
            .await;
            let attempt = match attempt {
                Ok((returned, attempt)) => {
                    watcher = returned;
                    attempt
                }
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return,
            };
            self.apply(attempt);
        }
    }

    fn apply(&mut self, attempt: Attempt) {
        match attempt {
            Attempt::Loaded(config) => {
                self.missing = false;
                let domains = config.domains().count();
                self.config.store(Arc::new(config));
                // After the swap: a denial cached under the old limits must not outlive them.
                (self.on_reload)(&self.config.load());
                self.metrics.record_config_load(true);
                tracing::info!(path = %self.path.display(), domains, "limits reloaded");
            }
            Attempt::Failed(errors) => {
                self.missing = false;
                self.metrics.record_config_load(false);
                let count = errors.0.len();
                // One line, however many errors: log collectors split records on newlines.
                let all: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
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
                self.metrics.record_config_load(false);
                tracing::warn!(
                    path = %self.path.display(),
                    "limits path disappeared; keeping the previous limits until it reappears"
                );
            }
        }
    }
}

/// Waits until no event has arrived for [`QUIET_PERIOD`], or [`MAX_DELAY`] has passed since
/// the call. False when the watcher is gone.
async fn settle(events: &mut mpsc::UnboundedReceiver<()>) -> bool {
    let deadline = Instant::now() + MAX_DELAY;
    loop {
        let quiet = (Instant::now() + QUIET_PERIOD).min(deadline);
        match tokio::time::timeout_at(quiet, events.recv()).await {
            Ok(Some(())) => {}
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}

/// Watches the path and its parent afresh: either may have been replaced (a new inode under
/// the same name) or deleted and created again since the last watch. Removing and adding a
/// watch emits nothing; a change between the two is read by the load that follows.
fn rewatch(watcher: &mut RecommendedWatcher, target: &Target) {
    for path in std::iter::once(&target.path).chain(&target.parent) {
        // Not found is normal: the backend drops the watch of a deleted path by itself.
        let _ = watcher.unwatch(path);
        if path.exists()
            && let Err(e) = watcher.watch(path, RecursiveMode::NonRecursive)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot watch");
        }
    }
}

fn load(path: &Path, defaults: &Defaults) -> Attempt {
    // `exists` follows symlinks: a dangling link counts as missing too.
    if !path.exists() {
        return Attempt::Missing;
    }
    match Config::load(path, defaults) {
        Ok(config) => Attempt::Loaded(config),
        Err(errors) => Attempt::Failed(errors),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, RenameMode};

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    fn modify(path: &str) -> Event {
        event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), path)
    }

    /// In a watched directory every change counts, dot-entries included; siblings do not.
    #[test]
    fn directory_relevance() {
        let t = Target::new(PathBuf::from("/etc/limits"));
        assert!(t.is_relevant(&modify("/etc/limits/a.yaml")));
        assert!(t.is_relevant(&event(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            "/etc/limits/..data"
        )));
        assert!(t.is_relevant(&event(EventKind::Create(CreateKind::Folder), "/etc/limits")));
        assert!(!t.is_relevant(&modify("/etc/limits-old/a.yaml")));
        assert!(!t.is_relevant(&modify("/etc/passwd")));
    }

    /// A watched file counts its own name and `..` siblings (a ConfigMap swap), nothing else.
    #[test]
    fn file_relevance() {
        let t = Target::new(PathBuf::from("/cm/limits.yaml"));
        assert!(t.is_relevant(&modify("/cm/limits.yaml")));
        assert!(t.is_relevant(&event(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            "/cm/..data"
        )));
        assert!(!t.is_relevant(&modify("/cm/other.yaml")));
        assert!(!t.is_relevant(&modify("/cm/.limits.yaml.swp")));
    }

    /// Opening and reading are not changes (the loader's own reads would loop); closing after
    /// a write is.
    #[test]
    fn reads_are_ignored() {
        let t = Target::new(PathBuf::from("/etc/limits"));
        let open = EventKind::Access(AccessKind::Open(AccessMode::Any));
        let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
        let written = EventKind::Access(AccessKind::Close(AccessMode::Write));
        assert!(!t.is_relevant(&event(open, "/etc/limits/a.yaml")));
        assert!(!t.is_relevant(&event(read, "/etc/limits")));
        assert!(t.is_relevant(&event(written, "/etc/limits/a.yaml")));
        // A rescan request carries no path: reload.
        assert!(t.is_relevant(&Event::new(EventKind::Other)));
    }
}
