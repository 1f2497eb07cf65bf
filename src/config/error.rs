//! What a load that fails returns: every problem, each with its file, its path inside the
//! file and a reason (docs/config.md lists them). Shared by the parser (`compile`), the
//! checks (`validate`) and the limits sources, which add the errors of reading.

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

/// One error of `file`, at `path` (empty: the whole file).
pub(crate) fn error(file: &str, path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        path: path.to_owned(),
        message: message.into(),
    }
}
