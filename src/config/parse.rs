//! Parsing limits files (their names and text, as a source read them) and merging their
//! domains; `compile` checks and compiles each file's descriptors.
//!
//! Every error is collected — every file is parsed even after one fails — each with its file,
//! its path inside the file and a reason, so an operator fixes a config in one round.

use std::collections::HashMap;

use super::compile::Builder;
use super::error::{ConfigError, ConfigErrors, error};
use super::limit::Defaults;
use super::model::FileModel;
use super::tree::{Children, Domain};
use super::typecheck::{self, Hidden};

/// Most rules one load may hold by default (`--max-load-rules`): every descriptor of every
/// file (or pushed `RateLimitConfig`), nested ones included, counted before anything is
/// compiled. A pushed configuration has no file size to bound it: a 3.4 MB protobuf
/// message carries 200,000 descriptors, and each rule costs a few KiB from the YAML it is
/// converted to up to the matching tree, so this keeps a load within a pod's memory.
pub const MAX_LOAD_RULES: usize = 20_000;

/// Parses and validates `(file name, content)` pairs into domains, sorted by name. A domain
/// in two files is an error, unless `merge_domains` (the reference's `MERGE_DOMAIN_CONFIG`):
/// then the later file's top-level descriptors join the domain's, and one composite key
/// defined twice is the error, as in the reference. `lenient`: read files as the reference
/// does (reference mode).
pub(crate) fn parse_files(
    sources: &[(String, String)],
    defaults: &Defaults,
    merge_domains: bool,
    lenient: bool,
) -> Result<Vec<Domain>, ConfigErrors> {
    let mut errors = Vec::new();
    // Name, root, hash tag, and the file that defined the domain first.
    let mut domains: Vec<(String, Children, bool, &str)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    // Rules counted so far, and the file that took the load past `max_rules`: from it on,
    // files are only parsed and counted (to name the total), never compiled.
    let mut rules = 0usize;
    let mut past_cap: Option<&str> = None;
    for (file, content) in sources {
        let (model, hidden) = parse(file, content, lenient, &mut errors);
        let Some(model) = model else {
            continue;
        };
        rules = rules.saturating_add(model.rule_count());
        if rules > defaults.max_rules {
            past_cap.get_or_insert(file);
            continue;
        }
        let name = model.domain.unwrap_or_default();
        let existing = index.get(&name).copied();
        if name.is_empty() && !hidden.covers("domain") {
            errors.push(error(
                file,
                "domain",
                "config file cannot have empty domain",
            ));
        } else if let (Some(at), false) = (existing, merge_domains) {
            let first = domains[at].3;
            let message = format!(
                "duplicate domain '{name}' (already defined in {first}){}",
                dot_directory_hint(first, file)
            );
            errors.push(error(file, "domain", message));
        }
        let mut builder = Builder {
            file,
            defaults,
            errors: &mut errors,
            hidden: &hidden,
        };
        let descriptors = model.descriptors.unwrap_or_default();
        let hash_tag = model.redis_hash_tag.unwrap_or(false);
        match existing {
            Some(at) if merge_domains && !name.is_empty() => {
                let (_, root, tagged, _) = &mut domains[at];
                builder.extend_level(root, &descriptors, "", &name);
                // One file asking for the hash tag tags the whole merged domain.
                *tagged |= hash_tag;
            }
            _ => {
                let root = builder.level(&descriptors, "", &name);
                if !name.is_empty() && existing.is_none() {
                    index.insert(name.clone(), domains.len());
                    domains.push((name, root, hash_tag, file.as_str()));
                }
            }
        }
    }
    if let Some(file) = past_cap {
        errors.push(too_many_rules(file, rules, defaults.max_rules));
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let mut domains: Vec<Domain> = domains
        .into_iter()
        .map(|(name, root, hash_tag, _)| Domain::new(name, root, hash_tag))
        .collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    for domain in &domains {
        tracing::debug!(domain = %domain.name, rules = domain.rules().len(), "loaded domain");
    }
    Ok(domains)
}

/// The error of a load holding `rules` rules, more than `max_rules`; `file` is the one that
/// took it past the cap.
pub(crate) fn too_many_rules(file: &str, rules: usize, max_rules: usize) -> ConfigError {
    error(
        file,
        "",
        format!(
            "the load holds {rules} rules (descriptors, nested ones included), more than the \
             {max_rules} one load may hold (--max-load-rules); nothing of it is loaded"
        ),
    )
}

/// A hint for a domain defined twice because a Kubernetes volume's `..<timestamp>` copy was
/// read beside the file itself (the reference's layout with `RUNTIME_IGNOREDOTFILES` false).
fn dot_directory_hint(first: &str, second: &str) -> &'static str {
    let in_dot_directory = |file: &str| {
        std::path::Path::new(file)
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with(".."))
    };
    if in_dot_directory(first) || in_dot_directory(second) {
        "; a mounted volume's `..` directory was read because RUNTIME_IGNOREDOTFILES is not \
         true: set RUNTIME_IGNOREDOTFILES=true (the reference needs it too)"
    } else {
        ""
    }
}

/// Deserializes one file. A YAML syntax error is one error with line and column, and hides
/// the rest of the file; the type errors (and unknown keys) of a valid YAML file are all
/// reported ([`typecheck`]), the first with its line and column, and what is left of the file
/// is returned for validation, with the paths whose errors are already reported. With
/// `lenient` (reference mode), a file is first read as the reference reads it
/// ([`super::lenient`]).
fn parse(
    file: &str,
    content: &str,
    lenient: bool,
    errors: &mut Vec<ConfigError>,
) -> (Option<FileModel>, Hidden) {
    if content.trim().is_empty() {
        // serde_yaml_ng reports an empty document as a type error; the reference's complaint
        // about such a file is its empty domain, which is clearer.
        return (Some(FileModel::default()), Hidden::default());
    }
    if lenient && let Some(model) = super::lenient::parse(file, content) {
        return (Some(model), Hidden::default());
    }
    let deserializer = serde_yaml_ng::Deserializer::from_str(content);
    let (first_path, first_message) =
        match serde_path_to_error::deserialize::<_, FileModel>(deserializer) {
            Ok(model) => return (Some(model), Hidden::default()),
            Err(e) => {
                let path = match e.path().to_string() {
                    root if root == "." => String::new(),
                    path => path,
                };
                let message = yaml_message(e.inner(), &path);
                (path, message)
            }
        };
    // serde stops at its first error: a file that is valid YAML is checked again key by key,
    // for the others.
    let mut value = match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(content) {
        Ok(value) => value,
        Err(_) => {
            let message = format!(
                "{first_message}; nothing else in this file is checked until it is valid YAML"
            );
            errors.push(error(file, &first_path, message));
            return (None, Hidden::default());
        }
    };
    if lenient {
        super::lenient::read_quietly(&mut value);
    }
    let checked = typecheck::check(value);
    if checked.errors.is_empty() {
        // Not expected (serde refused the file, so some key must fail alone); never lost.
        errors.push(error(file, &first_path, first_message));
        return (None, Hidden::default());
    }
    for found in checked.errors {
        // The strict parse's message has the position; the key-by-key one cannot.
        let message = if found.path == first_path {
            first_message.clone()
        } else {
            found.message
        };
        let message = match found.hides {
            "" => message,
            hides => format!("{message}; {hides}"),
        };
        errors.push(error(file, &found.path, message));
    }
    (checked.model, checked.hidden)
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
    let message = typecheck::name_structs(message);
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
