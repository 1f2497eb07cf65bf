//! Which files are limits files: floodgate's own `--config`, or the reference server's runtime
//! layout. Reading them is `read`'s job; this module only lists them.
//!
//! - [`Source::Path`] (`--config`): a file, or the `*.yaml` / `*.yml` files directly inside a
//!   directory, in name order. Anything else in the directory is skipped *and named in the
//!   log*, so a ConfigMap key without an extension never leaves the server silently empty.
//! - [`Source::Runtime`] (the reference's `RUNTIME_*` variables): every file the reference
//!   reads, found as its runtime loader (lyft/goruntime) finds them. The walk is recursive,
//!   does not follow symlinked directories, reads every file whatever its name, skips
//!   dot-entries only with `RUNTIME_IGNOREDOTFILES=true`, and names each file by its path
//!   relative to the walk's start with `/` turned into `.` (`config/a/b.yaml` →
//!   `config.a.b.yaml`). With `RUNTIME_WATCH_ROOT=true` (the reference's default) the walk
//!   starts at `<root>/<subdirectory>` and keeps the names starting with `<appdirectory>.`
//!   (so a file `<root>/<subdirectory>/config.yaml` counts too); it reads nothing at all
//!   when the subdirectory is empty. With `false` it starts at
//!   `<root>/<subdirectory>/<appdirectory>` and keeps everything.

use std::fs;
use std::path::{Path, PathBuf};

use super::read::{MAX_FILES, MAX_WALK_DEPTH};

/// Where the limits files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// floodgate's `--config`: one file, or the YAML files directly inside a directory.
    Path(PathBuf),
    /// The reference server's runtime directory layout.
    Runtime(RuntimeLayout),
}

/// The reference's `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`,
/// `RUNTIME_WATCH_ROOT` and `RUNTIME_IGNOREDOTFILES`, as their values (defaults applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeLayout {
    /// `RUNTIME_ROOT` (reference default `/srv/runtime_data/current`).
    pub root: PathBuf,
    /// `RUNTIME_SUBDIRECTORY` (reference default empty).
    pub subdirectory: String,
    /// `RUNTIME_APPDIRECTORY` (reference default `config`).
    pub app_directory: String,
    /// `RUNTIME_WATCH_ROOT` (reference default true): decides where the walk starts.
    pub watch_root: bool,
    /// `RUNTIME_IGNOREDOTFILES` (reference default false).
    pub ignore_dotfiles: bool,
}

impl RuntimeLayout {
    /// `<root>/<subdirectory>/<appdirectory>`: where the limits files are, and what hot
    /// reload watches.
    pub fn directory(&self) -> PathBuf {
        self.root.join(&self.subdirectory).join(&self.app_directory)
    }

    /// Where the walk starts and the prefix names must have; `None` when the reference reads
    /// nothing (its loader needs both halves of the path non-empty).
    fn walk(&self) -> Option<(PathBuf, Option<String>)> {
        if self.watch_root {
            if self.root.as_os_str().is_empty() || self.subdirectory.is_empty() {
                return None;
            }
            let prefix = format!("{}.", self.app_directory);
            Some((self.root.join(&self.subdirectory), Some(prefix)))
        } else {
            if self.app_directory.is_empty() {
                return None;
            }
            Some((self.directory(), None))
        }
    }
}

impl Source {
    /// The path hot reload watches: the `--config` path, or the runtime layout's directory.
    pub fn watch_path(&self) -> PathBuf {
        match self {
            Source::Path(path) => path.clone(),
            Source::Runtime(layout) => layout.directory(),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Path(path) => write!(f, "{}", path.display()),
            Source::Runtime(layout) => write!(
                f,
                "{} (reference runtime layout: RUNTIME_WATCH_ROOT={}, RUNTIME_IGNOREDOTFILES={})",
                layout.directory().display(),
                layout.watch_root,
                layout.ignore_dotfiles
            ),
        }
    }
}

/// The files of a [`Source`], and what was left out.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// The files to load, in load order.
    pub(crate) files: Vec<PathBuf>,
    /// Files left out, each with the reason, for the log.
    pub(crate) skipped: Vec<(PathBuf, &'static str)>,
    /// Why nothing could be listed at all, when that is the case and not an error.
    pub(crate) empty_because: Option<String>,
    /// Why the listing was abandoned (a bound of `read` exceeded): an error, and
    /// nothing is loaded.
    pub(crate) refused: Option<String>,
    /// Directory entries looked at so far (bounded by [`MAX_FILES`]).
    seen: usize,
}

impl Listing {
    /// Counts one more directory entry; false (and the listing refused) past [`MAX_FILES`].
    fn count(&mut self, dir: &Path) -> bool {
        self.seen += 1;
        if self.seen > MAX_FILES && self.refused.is_none() {
            self.refused = Some(format!(
                "more than {MAX_FILES} entries under {}: not a limits directory (nothing \
                 loaded)",
                dir.display()
            ));
        }
        self.refused.is_none()
    }
}

/// Lists the runtime layout's files as the reference's loader does (see the module doc).
pub(crate) fn list_runtime(layout: &RuntimeLayout) -> Listing {
    let mut listing = Listing::default();
    let Some((start, prefix)) = layout.walk() else {
        listing.empty_because = Some(
            "RUNTIME_WATCH_ROOT is true (the reference's default) and RUNTIME_SUBDIRECTORY is \
             empty: the reference reads no limits file in this layout; set \
             RUNTIME_SUBDIRECTORY, or RUNTIME_WATCH_ROOT=false"
                .into(),
        );
        return listing;
    };
    // Like Go's filepath.Walk, the start is not followed if it is a symlink.
    match fs::symlink_metadata(&start) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            listing.empty_because = Some(format!(
                "{} is not a directory (a symlink to one is not followed, as in the \
                 reference)",
                start.display()
            ));
            return listing;
        }
        Err(e) => {
            listing.empty_because = Some(format!("cannot read {}: {e}", start.display()));
            return listing;
        }
    }
    let mut found = Vec::new();
    walk(
        &start,
        &start,
        0,
        layout.ignore_dotfiles,
        &mut found,
        &mut listing,
    );
    if listing.refused.is_some() {
        return listing;
    }
    for (name, path) in found {
        match &prefix {
            Some(prefix) if !name.starts_with(prefix.as_str()) => {
                tracing::debug!(file = %path.display(), "outside the app directory: not a limits file");
            }
            _ => listing.files.push(path),
        }
    }
    listing
}

/// Depth-first, entries in byte order of their names, as Go's `filepath.Walk`: directories
/// are entered (not through symlinks), everything else is a file named by its path relative
/// to `start` with `/` turned into `.`. Stops, the listing refused, past [`MAX_FILES`]
/// entries or [`MAX_WALK_DEPTH`] directories below `start`.
fn walk(
    dir: &Path,
    start: &Path,
    depth: usize,
    ignore_dotfiles: bool,
    found: &mut Vec<(String, PathBuf)>,
    listing: &mut Listing,
) {
    let mut entries: Vec<_> = match fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(Result::ok).collect(),
        Err(_) => {
            listing
                .skipped
                .push((dir.to_path_buf(), "directory cannot be listed"));
            return;
        }
    };
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        if !listing.count(dir) {
            return;
        }
        let path = entry.path();
        let dot = entry.file_name().to_string_lossy().starts_with('.');
        let Ok(meta) = fs::symlink_metadata(&path) else {
            listing.skipped.push((path, "cannot be read"));
            continue;
        };
        if meta.is_dir() {
            if ignore_dotfiles && dot {
                continue;
            }
            if depth >= MAX_WALK_DEPTH {
                listing.refused = Some(format!(
                    "{} is more than {MAX_WALK_DEPTH} directories below {}: not a limits \
                     directory (nothing loaded)",
                    path.display(),
                    start.display()
                ));
                return;
            }
            walk(&path, start, depth + 1, ignore_dotfiles, found, listing);
            if listing.refused.is_some() {
                return;
            }
            continue;
        }
        if ignore_dotfiles && dot {
            continue;
        }
        // A symlink to a directory is neither walked nor readable, in the reference too
        // (the kubelet's `..data` when dotfiles are not ignored).
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            if !dot {
                listing
                    .skipped
                    .push((path, "a symlink to a directory, which is not followed"));
            }
            continue;
        }
        let name = path
            .strip_prefix(start)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace(std::path::MAIN_SEPARATOR, ".");
        found.push((name, path));
    }
}

/// Lists `--config`: the file itself, or the `*.yaml` / `*.yml` entries directly inside the
/// directory (names starting with `.` skipped, symlinks followed), in name order. Files that
/// are left out are listed with the reason; directories and the kubelet's `..` entries are
/// not files and are not listed.
pub(crate) fn list_path(path: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    if !fs::metadata(path)?.is_dir() {
        listing.files.push(path.to_path_buf());
        return Ok(listing);
    }
    for entry in fs::read_dir(path)? {
        let entry = entry?;
        if !listing.count(path) {
            listing.files.clear();
            return Ok(listing);
        }
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        // `fs::metadata` follows symlinks; a directory (even one named `x.yaml`, or the
        // kubelet's `..data`) is not a file. A broken symlink is kept so that reading it
        // reports the problem.
        if fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        if name.starts_with("..") {
            // The kubelet's own bookkeeping in a mounted volume.
            continue;
        }
        if name.starts_with('.') {
            listing.skipped.push((entry.path(), "a dotfile"));
        } else if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            listing.skipped.push((
                entry.path(),
                "not named *.yaml or *.yml (the reference's RUNTIME_* layout loads every file)",
            ));
        } else {
            listing.files.push(entry.path());
        }
    }
    listing.files.sort();
    listing.skipped.sort();
    Ok(listing)
}

#[cfg(test)]
mod tests;
