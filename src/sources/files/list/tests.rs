use super::*;

fn layout(root: &Path, watch_root: bool, ignore_dotfiles: bool) -> RuntimeLayout {
    RuntimeLayout {
        root: root.to_path_buf(),
        subdirectory: "ratelimit".into(),
        app_directory: "config".into(),
        watch_root,
        ignore_dotfiles,
    }
}

fn names(listing: &Listing, base: &Path) -> Vec<String> {
    listing
        .files
        .iter()
        .map(|p| p.strip_prefix(base).unwrap().display().to_string())
        .collect()
}

/// A tree with a nested file, an extension-less file, a dotfile, a file beside the app
/// directory named like it, and an unrelated file.
fn tree() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let sub = tmp.path().join("ratelimit");
    fs::create_dir_all(sub.join("config/nested")).unwrap();
    for (name, text) in [
        ("config/a.yaml", "a"),
        ("config/config", "b"),
        ("config/.hidden.yaml", "c"),
        ("config/nested/deep.yml", "d"),
        ("config.extra", "e"),
        ("other.yaml", "f"),
    ] {
        fs::write(sub.join(name), text).unwrap();
    }
    tmp
}

/// RUNTIME_WATCH_ROOT=true: every file under the subdirectory whose name starts with
/// `config.`, recursively, dotfiles included unless ignored.
#[test]
fn watch_root_keeps_the_app_prefix() {
    let tmp = tree();
    let base = tmp.path().join("ratelimit");
    let listing = list_runtime(&layout(tmp.path(), true, false));
    assert_eq!(
        names(&listing, &base),
        [
            "config/.hidden.yaml",
            "config/a.yaml",
            "config/config",
            "config/nested/deep.yml",
            "config.extra",
        ]
    );
    let listing = list_runtime(&layout(tmp.path(), true, true));
    assert!(!names(&listing, &base).contains(&"config/.hidden.yaml".to_string()));
}

/// RUNTIME_WATCH_ROOT=false: everything under the app directory, nothing beside it.
#[test]
fn app_directory_walk_reads_every_file() {
    let tmp = tree();
    let base = tmp.path().join("ratelimit/config");
    let listing = list_runtime(&layout(tmp.path(), false, true));
    assert_eq!(
        names(&listing, &base),
        ["a.yaml", "config", "nested/deep.yml"]
    );
}

/// With RUNTIME_WATCH_ROOT=true and no subdirectory the reference reads nothing; so
/// does floodgate, and says why.
#[test]
fn no_subdirectory_under_watch_root_reads_nothing() {
    let tmp = tree();
    let mut layout = layout(tmp.path(), true, false);
    layout.subdirectory = String::new();
    let listing = list_runtime(&layout);
    assert!(listing.files.is_empty());
    assert!(
        listing
            .empty_because
            .unwrap()
            .contains("RUNTIME_SUBDIRECTORY")
    );
}

/// `--config DIR` loads only YAML files and names what it skipped.
#[test]
fn config_directory_names_what_it_skips() {
    let tmp = tree();
    let dir = tmp.path().join("ratelimit/config");
    let listing = list_path(&dir).unwrap();
    assert_eq!(names(&listing, &dir), ["a.yaml"]);
    let skipped: Vec<String> = listing
        .skipped
        .iter()
        .map(|(p, _)| p.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    assert_eq!(skipped, [".hidden.yaml", "config"]);
}

/// A directory of more than `MAX_FILES` entries is refused, not listed, in both layouts.
#[test]
fn too_many_entries_are_refused() {
    let tmp = tree();
    let dir = tmp.path().join("ratelimit/config");
    // The tree holds a few entries already: MAX_FILES more is past the bound.
    for i in 0..MAX_FILES {
        fs::write(dir.join(format!("f{i}.yaml")), "").unwrap();
    }
    let listing = list_path(&dir).unwrap();
    assert!(listing.files.is_empty());
    assert!(listing.refused.unwrap().contains("more than 10000 entries"));
    let listing = list_runtime(&layout(tmp.path(), false, true));
    assert!(listing.files.is_empty());
    assert!(listing.refused.unwrap().contains("more than 10000 entries"));
    // At the bound exactly, everything is listed.
    fs::remove_dir_all(&dir).unwrap();
    fs::create_dir_all(&dir).unwrap();
    for i in 0..MAX_FILES {
        fs::write(dir.join(format!("f{i}.yaml")), "").unwrap();
    }
    let listing = list_path(&dir).unwrap();
    assert_eq!((listing.files.len(), listing.refused), (MAX_FILES, None));
}

/// The reference layout's walk enters at most `MAX_WALK_DEPTH` directories below its
/// start; deeper is refused, naming the directory.
#[test]
fn too_deep_is_refused() {
    let tmp = tree();
    let base = tmp.path().join("ratelimit/config");
    let mut deep = base.clone();
    for _ in 0..MAX_WALK_DEPTH {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("limits.yaml"), "").unwrap();
    let listing = list_runtime(&layout(tmp.path(), false, true));
    assert_eq!(listing.refused, None);
    assert!(
        names(&listing, &base)
            .iter()
            .any(|n| n.ends_with("/d/limits.yaml"))
    );
    fs::create_dir(deep.join("d")).unwrap();
    let listing = list_runtime(&layout(tmp.path(), false, true));
    assert!(listing.files.is_empty());
    assert!(
        listing
            .refused
            .unwrap()
            .contains("more than 32 directories below")
    );
}
