//! Watching files for hot reload: the limits ([`crate::sources::files`]) and the gRPC TLS
//! certificates ([`crate::transport::tls`]) are both loaded again, off the request path, when what they
//! read from disk changes.
//!
//! [`spawn`] watches a set of paths and, after a burst of file-system events has settled, runs
//! the caller's reload on a blocking thread (it reads files). What is watched, and why:
//!
//! - A **directory** is watched itself, and any event in it counts, dot-entries included: a
//!   Kubernetes ConfigMap or Secret volume is updated by writing a new `..<timestamp>`
//!   directory and atomically renaming a `..data` symlink over the old one, which only shows
//!   up as events on those dot-entries.
//! - A **file** is watched through its parent directory (editors and the kubelet replace a
//!   file by renaming another over it, which a watch on the file itself would miss), counting
//!   events on that name and on `..`-prefixed names (the kubelet's swap, when the file is a
//!   `name -> ..data/name` symlink); the file is also watched itself, so in-place edits of a
//!   symlink's target elsewhere are seen.
//! - The **parent** of a directory is watched too, for events on the directory's own name, so
//!   a deleted directory is followed when it is created again.
//!
//! Opening and reading files (the reload's own reads among them) are not changes and are
//! ignored. Every watch is re-established before each reload, so a replaced directory or file
//! is followed to its new inode.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use notify::RecursiveMode;
use notify::event::{AccessKind, AccessMode, EventKind, MetadataKind, ModifyKind};
use notify::{Event, RecommendedWatcher, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A reload waits until no relevant event has arrived for this long, so that a burst (an
/// editor's write-then-rename, a kubelet's whole volume swap) causes one load, of the end
/// state.
pub const QUIET_PERIOD: Duration = Duration::from_millis(150);

/// A reload never waits longer than this after the first event of a burst, even if events
/// keep coming.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {path}: {source}")]
pub struct WatchError {
    /// The path that could not be watched.
    pub path: String,
    /// The watcher's error (e.g. the inotify instance limit).
    pub source: notify::Error,
}

/// A running watcher: reloading stops when this is dropped.
#[derive(Debug)]
pub struct FileWatch {
    task: JoinHandle<()>,
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        // The task owns the file-system watcher; aborting it drops the watcher, which stops
        // its thread.
        self.task.abort();
    }
}

/// Watches `paths` (files or directories, which must exist) and calls `reload` on a blocking
/// thread after each settled burst of changes, until the returned guard is dropped. `depth`:
/// `Recursive` watches the directories among `paths` with every directory below them (the
/// reference layout's walk reads nested directories), `NonRecursive` their entries only.
/// `what` names the files in log lines ("limits", "TLS"). Must be called inside a tokio
/// runtime; the watches are in place when it returns, so any later change is seen.
pub fn spawn(
    paths: &[&Path],
    depth: RecursiveMode,
    what: &'static str,
    reload: impl FnMut() + Send + 'static,
) -> Result<FileWatch, WatchError> {
    // Absolute, like the paths notify reports events with, so the two compare.
    let targets = Targets(
        paths
            .iter()
            .map(|path| Target::new(std::path::absolute(path).unwrap_or_else(|_| path.into())))
            .collect(),
        depth,
    );
    let (tx, events) = mpsc::unbounded_channel();
    let filter = targets.clone();
    let handler = move |event: notify::Result<Event>| match event {
        Ok(event) if filter.is_relevant(&event) => {
            let _ = tx.send(());
        }
        Ok(_) => {}
        Err(e) => {
            // Missed events are possible (e.g. a full inotify queue): reload to be sure.
            tracing::warn!(error = %e, "{what} watcher error; reloading to be safe");
            let _ = tx.send(());
        }
    };
    let error = |path: &Path| {
        let path = path.display().to_string();
        move |source| WatchError { path, source }
    };
    let first = paths.first().copied().unwrap_or(Path::new(""));
    let mut watcher = notify::recommended_watcher(handler).map_err(error(first))?;
    // The paths themselves must be watchable at start (they were just loaded); their parents
    // are best effort.
    for (target, path) in targets.0.iter().zip(paths) {
        watcher
            .watch(&target.path, targets.1)
            .map_err(error(path))?;
    }
    for parent in targets.parents() {
        if let Err(e) = watcher.watch(&parent, RecursiveMode::NonRecursive) {
            tracing::warn!(parent = %parent.display(), error = %e,
                "cannot watch the {what} files' directory; a replaced or deleted path will not be followed");
        }
    }
    let task = tokio::spawn(run(watcher, targets, events, reload));
    Ok(FileWatch { task })
}

async fn run(
    mut watcher: RecommendedWatcher,
    targets: Targets,
    mut events: mpsc::UnboundedReceiver<()>,
    mut reload: impl FnMut() + Send + 'static,
) {
    while events.recv().await.is_some() {
        if !settle(&mut events).await {
            return;
        }
        let again = targets.clone();
        // Watch calls and file reads block: keep them off the runtime's workers.
        let done = tokio::task::spawn_blocking(move || {
            again.rewatch(&mut watcher);
            reload();
            (watcher, reload)
        })
        .await;
        match done {
            Ok(returned) => (watcher, reload) = returned,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return,
        }
    }
}

/// Every watched path, and whether the directories among them are watched with their
/// subdirectories (their parents never are).
#[derive(Clone, Debug)]
struct Targets(Vec<Target>, RecursiveMode);

impl Targets {
    /// Whether `event` may have changed what reloading reads.
    fn is_relevant(&self, event: &Event) -> bool {
        // Opening and reading change nothing, and the reload's own reads cause them:
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
        event.paths.is_empty()
            || event
                .paths
                .iter()
                .any(|p| self.0.iter().any(|t| t.touches(p)))
    }

    /// The watched paths' parents, each once.
    fn parents(&self) -> BTreeSet<PathBuf> {
        self.0.iter().filter_map(|t| t.parent.clone()).collect()
    }

    /// Watches every path and parent afresh: any may have been replaced (a new inode under
    /// the same name) or deleted and created again since the last watch. Removing and adding
    /// a watch emits nothing; a change between the two is read by the reload that follows.
    fn rewatch(&self, watcher: &mut RecommendedWatcher) {
        let paths: BTreeSet<PathBuf> = self.0.iter().map(|t| t.path.clone()).collect();
        let parents = self.parents();
        let modes = paths
            .iter()
            .map(|p| (p, self.1))
            .chain(parents.iter().map(|p| (p, RecursiveMode::NonRecursive)));
        for (path, mode) in modes {
            // Not found is normal: the backend drops the watch of a deleted path by itself.
            let _ = watcher.unwatch(path);
            if path.exists()
                && let Err(e) = watcher.watch(path, mode)
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot watch");
            }
        }
    }
}

/// One watched path and how events relate to it.
#[derive(Clone, Debug)]
struct Target {
    /// The path, absolute.
    path: PathBuf,
    /// Its parent directory, if it has one.
    parent: Option<PathBuf>,
}

impl Target {
    fn new(path: PathBuf) -> Target {
        let parent = path.parent().map(Path::to_path_buf);
        Target { path, parent }
    }

    /// Whether a change at `changed` can affect the path: inside it (or it), or a
    /// `..`-prefixed sibling (a kubelet `..data` swap, for a file linked through it).
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

#[cfg(test)]
mod tests;
