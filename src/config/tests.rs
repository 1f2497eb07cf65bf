//! Loading, validation, matching and listing, driven through the public API.

mod loading;
mod matching;
mod validation;

use super::*;

pub(super) fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(name, content)| (name.to_string(), content.to_string()))
        .collect()
}

pub(super) fn config(yaml: &str) -> Config {
    match Config::from_sources(&sources(&[("test.yaml", yaml)]), &Defaults::default()) {
        Ok(config) => config,
        Err(errors) => panic!("unexpected errors:\n{errors}"),
    }
}

pub(super) fn errors(yaml: &str) -> Vec<ConfigError> {
    match Config::from_sources(&sources(&[("test.yaml", yaml)]), &Defaults::default()) {
        Ok(_) => panic!("config loaded but should not have"),
        Err(ConfigErrors(errors)) => errors,
    }
}

/// Asserts that `yaml` fails with exactly one error, at `path`, whose message contains `text`.
pub(super) fn assert_error(yaml: &str, path: &str, text: &str) {
    let errors = errors(yaml);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    assert_eq!(errors[0].file, "test.yaml");
    assert_eq!(errors[0].path, path, "{errors:#?}");
    assert!(
        errors[0].message.contains(text),
        "message {:?} lacks {text:?}",
        errors[0].message
    );
}

/// The path of the rule a descriptor matches, if any.
pub(crate) fn find(config: &Config, domain: &str, entries: &[(&str, &str)]) -> Option<String> {
    let entries: Vec<(&[u8], &[u8])> = entries
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    config
        .domain(domain)?
        .find(&entries)
        .map(|m| m.rule.path.to_string())
}

pub(super) fn steps<'a>(config: &'a Config, entries: &[(&[u8], &[u8])]) -> Vec<Step<'a>> {
    config
        .domain("d")
        .unwrap()
        .find(entries)
        .unwrap()
        .steps
        .into_vec()
}
