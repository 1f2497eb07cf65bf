//! The reference's limits layout and the switches that shape its answers: `RUNTIME_ROOT`,
//! `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`, `RUNTIME_WATCH_ROOT`,
//! `RUNTIME_IGNOREDOTFILES`, `MERGE_DOMAIN_CONFIG`, `QUOTA_MODE`, and the default algorithm
//! that follows from them.
//!
//! When the `RUNTIME_*` variables locate the limits (and `--config` does not), floodgate is in
//! *reference mode*: it reads every file the reference would read
//! ([`crate::sources::files::Source::Runtime`]) and, unless an algorithm is given, counts with fixed
//! windows so that every answer is the reference's.

use std::path::PathBuf;

use super::mapping::Mapping;
use crate::settings::error::SettingsError;
use crate::settings::{AlgorithmArg, AlgorithmChoice, ServeSettings};
use crate::sources::files::RuntimeLayout;

/// The reference's `RUNTIME_ROOT` default, used when only the subdirectory or app directory
/// is given (as the reference does).
const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";

/// The reference's `RUNTIME_APPDIRECTORY` default: limits live in `<root>/<sub>/config/`.
const DEFAULT_APP_DIRECTORY: &str = "config";

/// The variables that locate the limits.
const PATH_VARS: [&str; 3] = [
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
];

/// The variables that choose, inside the layout, which files are read.
const FILE_VARS: [&str; 2] = ["RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"];

impl Mapping<'_> {
    /// The runtime layout → `--config` and the files to read; `MERGE_DOMAIN_CONFIG` →
    /// `--merge-domains`; `QUOTA_MODE` → `--quota-mode`; then the default algorithm.
    pub(super) fn runtime(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let watch_root = self.parse_bool("RUNTIME_WATCH_ROOT")?;
        let ignore_dotfiles = self.parse_bool("RUNTIME_IGNOREDOTFILES")?;
        if self.own("config") {
            self.override_by(&PATH_VARS, "--config");
            self.override_by(&FILE_VARS, "--config");
        } else if !self.present(&PATH_VARS).is_empty() {
            let layout = RuntimeLayout {
                root: PathBuf::from(self.get("RUNTIME_ROOT").unwrap_or(DEFAULT_RUNTIME_ROOT)),
                subdirectory: self
                    .get("RUNTIME_SUBDIRECTORY")
                    .unwrap_or_default()
                    .to_string(),
                app_directory: self
                    .get("RUNTIME_APPDIRECTORY")
                    .unwrap_or(DEFAULT_APP_DIRECTORY)
                    .to_string(),
                // The reference's defaults.
                watch_root: watch_root.unwrap_or(true),
                ignore_dotfiles: ignore_dotfiles.unwrap_or(false),
            };
            settings.config = Some(layout.directory());
            settings.runtime_layout = Some(layout);
            for name in self.present(&PATH_VARS) {
                self.applied(name);
            }
            for name in self.present(&FILE_VARS) {
                self.applied(name);
            }
        } else {
            for name in self.present(&FILE_VARS) {
                self.no_effect(
                    name,
                    "no RUNTIME_ROOT / RUNTIME_SUBDIRECTORY: no runtime layout",
                );
            }
        }

        let merge = self.parse_bool("MERGE_DOMAIN_CONFIG")?;
        if self.own("merge_domains") {
            self.override_by(&["MERGE_DOMAIN_CONFIG"], "--merge-domains");
        } else if let Some(merge) = merge {
            settings.merge_domains = merge;
            self.applied("MERGE_DOMAIN_CONFIG");
        }
        let quota = self.parse_bool("QUOTA_MODE")?;
        if self.own("quota_mode") {
            self.override_by(&["QUOTA_MODE"], "--quota-mode");
        } else if let Some(quota) = quota {
            settings.quota_mode = quota;
            self.applied("QUOTA_MODE");
        }

        // `value` is the id of `--default-algorithm` (the flattened AlgorithmFlag's field).
        settings.algorithm_choice = if self.own("value") {
            AlgorithmChoice::Flag
        } else if settings.runtime_layout.is_some() {
            settings.algorithm.value = AlgorithmArg::FixedWindow;
            AlgorithmChoice::ReferenceMode
        } else {
            AlgorithmChoice::Default
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests;
