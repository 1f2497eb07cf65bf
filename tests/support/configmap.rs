//! Limits on disk as operators change them: files replaced by rename and invalid edits (a
//! ConfigMap volume's swaps are [`super::volume::Volume`]).

use std::fs;
use std::path::Path;

/// A limits file: domain `domain`, key `k` limited to `rpu` per minute.
pub fn limits(domain: &str, rpu: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
    )
}

/// Valid YAML that fails validation (an unknown key), carrying a limit that must never show.
pub fn invalid(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    bogus: 1\n    rate_limit: {{unit: minute, requests_per_unit: 7777}}\n"
    )
}

/// Replaces `path` atomically, as editors and `kubectl cp`-style tools do: write a temporary
/// dotfile beside it (skipped by the loader), then rename it over.
pub fn replace(path: &Path, content: &str) {
    let name = path.file_name().unwrap().to_str().unwrap();
    let temp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&temp, content).unwrap();
    fs::rename(&temp, path).unwrap();
}
