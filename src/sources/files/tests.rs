//! The file source on disk: directories laid out like a ConfigMap mount, single files,
//! missing paths, every error of a directory, and the shipped examples.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::load;
use crate::config::tests::find;
use crate::config::{Config, ConfigErrors, Defaults};

const LIMITS: &str =
    "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n";

fn load_path(path: &Path) -> Result<Config, ConfigErrors> {
    load(path, &Defaults::default())
}

/// A directory loads its `*.yaml`/`*.yml` files only, skipping dotfiles, other extensions and
/// subdirectories, and follows symlinks the way a Kubernetes ConfigMap mount lays them out.
#[test]
fn directory_like_a_configmap_mount() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2024_01_01_00_00_00.1");
    fs::create_dir(&data).unwrap();
    fs::write(
        data.join("edge.yaml"),
        LIMITS.replace("domain: d", "domain: edge"),
    )
    .unwrap();
    fs::write(
        data.join("api.yml"),
        LIMITS.replace("domain: d", "domain: api"),
    )
    .unwrap();
    symlink("..2024_01_01_00_00_00.1", dir.path().join("..data")).unwrap();
    symlink("..data/edge.yaml", dir.path().join("edge.yaml")).unwrap();
    symlink("..data/api.yml", dir.path().join("api.yml")).unwrap();
    // None of these is loaded: a hidden file, another extension, a directory named *.yaml.
    fs::write(dir.path().join(".hidden.yaml"), "not: [valid").unwrap();
    fs::write(dir.path().join("notes.txt"), "not yaml").unwrap();
    fs::create_dir(dir.path().join("nested.yaml")).unwrap();
    fs::write(dir.path().join("nested.yaml").join("x.yaml"), "bad").unwrap();

    let config = load_path(dir.path()).unwrap();
    let names: Vec<&str> = config.domains().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["api", "edge"]);
}

/// An empty directory is a valid configuration without domains.
#[test]
fn empty_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = load_path(dir.path()).unwrap();
    assert!(config.is_empty());
    assert!(Config::empty().is_empty());
    assert_eq!(config.describe(), "");
}

/// A path to a file loads that file whatever its extension; a missing path is an error.
#[test]
fn single_file_and_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limits.conf");
    fs::write(&file, LIMITS).unwrap();
    assert!(load_path(&file).unwrap().domain("d").is_some());

    let missing = dir.path().join("nope");
    let ConfigErrors(errors) = load_path(&missing).unwrap_err();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, missing.display().to_string());
    assert!(errors[0].message.starts_with("cannot read:"), "{errors:?}");
}

/// Errors from several files of a directory are all reported, labelled with their paths, and
/// a broken symlink is an error rather than a silently missing file.
#[test]
fn directory_errors_collected() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors: [{key: ''}]\n",
    )
    .unwrap();
    fs::write(dir.path().join("b.yaml"), "domain: [\n").unwrap();
    symlink("gone.yaml", dir.path().join("c.yaml")).unwrap();
    let ConfigErrors(errors) = load_path(dir.path()).unwrap_err();
    let files: Vec<String> = errors.iter().map(|e| e.file.clone()).collect();
    let expected: Vec<String> = ["c.yaml", "a.yaml", "b.yaml"]
        .iter()
        .map(|f| dir.path().join(f).display().to_string())
        .collect();
    assert_eq!(files, expected, "{errors:#?}");
}

/// The shipped examples load and match what their comments promise.
#[test]
fn examples_load() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/limits");
    let config = match load_path(&path) {
        Ok(config) => config,
        Err(errors) => panic!("{errors}"),
    };
    assert_eq!(
        find(&config, "edge", &[("remote_address", "192.0.2.10")]).unwrap(),
        "edge.remote_address_192.0.2.10"
    );
    assert_eq!(
        find(&config, "edge", &[("path", "/api/v1/files/a.pdf")]).unwrap(),
        "edge.path_/api/v1/files/*"
    );
    assert_eq!(
        find(
            &config,
            "edge",
            &[("path", "/api/orders"), ("method", "POST")]
        )
        .unwrap(),
        "edge.path_/api/*.method_POST"
    );
    assert_eq!(
        find(&config, "api", &[("plan", "free"), ("api_key", "k1")]).unwrap(),
        "api.plan_free.api_key"
    );
    assert_eq!(
        find(&config, "api", &[("tenant", "t-42-prod")]).unwrap(),
        "api.tenant_t-*-prod"
    );
}
