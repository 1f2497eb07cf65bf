//! Reading limits files and parsing them; `validate` checks and compiles each file's
//! descriptors.
//!
//! Every error is collected — all files are read even after one fails — each with its file,
//! its path inside the file and a reason, so an operator fixes a config in one round.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::file::Reader;
use super::limit::Defaults;
use super::model::FileModel;
use super::tree::Domain;
use super::validate::Builder;

/// One problem in the limits configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {}{message}", path_prefix(.path))]
pub struct ConfigError {
    /// The file (as given to the loader, or the directory joined with the file name).
    pub file: String,
    /// Where in the file, like `descriptors[1].rate_limit.unit`; empty for the whole file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Every problem found while loading a configuration; never empty when returned by the loader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", lines(.0))]
pub struct ConfigErrors(pub Vec<ConfigError>);

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

fn lines(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// Reads `path`: a file, or a directory whose `*.yaml`/`*.yml` entries (not recursive, names
/// starting with `.` skipped, symlinks followed) are read in name order. Returns what could be
/// read and an error for each file that could not.
pub(crate) fn read_sources(path: &Path) -> (Vec<(String, String)>, Vec<ConfigError>) {
    let label = path.display().to_string();
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            return (
                Vec::new(),
                vec![error(&label, "", format!("cannot read: {e}"))],
            );
        }
    };
    // Regular files only, size-capped, never blocking (see `file`).
    let mut reader = Reader::default();
    if !meta.is_dir() {
        return match reader.read(path) {
            Ok(content) => (vec![(label, content)], Vec::new()),
            Err(message) => (Vec::new(), vec![error(&label, "", message)]),
        };
    }
    let mut files = match list_yaml_files(path) {
        Ok(files) => files,
        Err(e) => {
            let message = format!("cannot list directory: {e}");
            return (Vec::new(), vec![error(&label, "", message)]);
        }
    };
    files.sort();
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        let name = file.display().to_string();
        match reader.read(&file) {
            Ok(content) => sources.push((name, content)),
            Err(message) => errors.push(error(&name, "", message)),
        }
    }
    (sources, errors)
}

fn list_yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        // Kubernetes mounts a ConfigMap as `..data` and `..<timestamp>` directories plus
        // symlinks to them; only the symlinks are the files.
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        // `fs::metadata` follows symlinks; skip directories that happen to end in `.yaml`. A
        // broken symlink is kept so that reading it reports the problem.
        if fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        files.push(entry.path());
    }
    Ok(files)
}

/// Parses and validates `(file name, content)` pairs into domains, sorted by name.
pub(crate) fn compile(
    sources: &[(String, String)],
    defaults: &Defaults,
) -> Result<Vec<Domain>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut domains: Vec<Domain> = Vec::new();
    let mut domain_files: HashMap<String, &str> = HashMap::new();
    for (file, content) in sources {
        let Some(model) = parse(file, content, &mut errors) else {
            continue;
        };
        let name = model.domain.unwrap_or_default();
        if name.is_empty() {
            errors.push(error(
                file,
                "domain",
                "config file cannot have empty domain",
            ));
        } else if let Some(first) = domain_files.get(&name) {
            let message = format!("duplicate domain '{name}' (already defined in {first})");
            errors.push(error(file, "domain", message));
        }
        let mut builder = Builder {
            file,
            defaults,
            errors: &mut errors,
        };
        let descriptors = model.descriptors.unwrap_or_default();
        let root = builder.level(&descriptors, "", &name);
        if !name.is_empty() && !domain_files.contains_key(&name) {
            domain_files.insert(name.clone(), file);
            domains.push(Domain::new(
                name,
                root,
                model.redis_hash_tag.unwrap_or(false),
            ));
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    for domain in &domains {
        tracing::debug!(domain = %domain.name, rules = domain.rules().len(), "loaded domain");
    }
    Ok(domains)
}

/// Deserializes one file; a YAML syntax or type error becomes one error with line and column.
fn parse(file: &str, content: &str, errors: &mut Vec<ConfigError>) -> Option<FileModel> {
    if content.trim().is_empty() {
        // serde_yaml_ng reports an empty document as a type error; the reference's complaint
        // about such a file is its empty domain, which is clearer.
        return Some(FileModel::default());
    }
    let deserializer = serde_yaml_ng::Deserializer::from_str(content);
    match serde_path_to_error::deserialize::<_, FileModel>(deserializer) {
        Ok(model) => Some(model),
        Err(e) => {
            let path = match e.path().to_string() {
                root if root == "." => String::new(),
                path => path,
            };
            errors.push(error(file, &path, yaml_message(e.inner(), &path)));
            None
        }
    }
}

/// serde_yaml_ng's message without the path and position it embeds (we report the path
/// ourselves), followed by `(line L, column C)`. Syntax errors from the YAML parser keep their
/// own positions and get an `invalid YAML:` prefix.
fn yaml_message(e: &serde_yaml_ng::Error, path: &str) -> String {
    let message = e.to_string();
    let Some(location) = e.location() else {
        return message;
    };
    let embedded = format!(" at line {} column {}", location.line(), location.column());
    // serde_yaml_ng leaves the position out at the very start of the document.
    let at_start = (location.line(), location.column()) == (1, 1) && !message.contains(" at line ");
    let Some(message) = message
        .strip_suffix(&embedded)
        .or(at_start.then_some(message.as_str()))
    else {
        return format!("invalid YAML: {message}");
    };
    let message = message.replace(
        "struct FileModel",
        "a mapping with `domain` and `descriptors`",
    );
    let message = match message.split_once(": ") {
        // serde_yaml_ng prefixes the path it tracked, which ends where ours ends or before.
        Some((head, tail)) if !head.contains(' ') && path.starts_with(head) => tail,
        _ => &message,
    };
    format!(
        "{message} (line {}, column {})",
        location.line(),
        location.column()
    )
}

fn error(file: &str, path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        path: path.to_owned(),
        message: message.into(),
    }
}
