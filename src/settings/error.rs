//! [`SettingsError`]: a setting that cannot be used, shared by every part of the settings.

/// A setting that cannot be used; `main` exits with code 64.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A reference environment variable holds a value floodgate cannot parse.
    #[error("environment variable {name}={value:?}: {reason}")]
    BadReferenceValue {
        /// The variable.
        name: &'static str,
        /// Its value (`***` for secrets).
        value: String,
        /// What was expected.
        reason: String,
    },
    /// A reference environment variable asks for something floodgate cannot do.
    #[error("environment variable {name}={value:?} is not supported: {why}")]
    Refused {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// Neither `--config` nor the reference's `RUNTIME_*` variables say where the limits are.
    #[error(
        "no limits to load: give --config FILE|DIR (or FLOODGATE_CONFIG), or the reference \
         server's RUNTIME_ROOT / RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY"
    )]
    NoLimits,
}
