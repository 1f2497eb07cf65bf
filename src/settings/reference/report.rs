//! What the reference's environment did to floodgate's settings: the values for options
//! configured elsewhere, and the report logged at start-up.

/// Reference settings that belong to the response-header and metrics options (their flags
/// live elsewhere): recorded here, for those options to take when their own flags are unset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceOverrides {
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub response_headers: Option<bool>,
    /// `LIMIT_LIMIT_HEADER` (reference default `RateLimit-Limit`).
    pub header_limit: Option<String>,
    /// `LIMIT_REMAINING_HEADER` (reference default `RateLimit-Remaining`).
    pub header_remaining: Option<String>,
    /// `LIMIT_RESET_HEADER` (reference default `RateLimit-Reset`).
    pub header_reset: Option<String>,
    /// `NEAR_LIMIT_RATIO` (reference default 0.8), in `[0, 1]`.
    pub near_limit_ratio: Option<f64>,
    /// `RESPONSE_DYNAMIC_METADATA` (reference default false).
    pub dynamic_metadata: Option<bool>,
    /// The tracing filter from `LOG_LEVEL`, when `RUST_LOG` is unset.
    pub log_filter: Option<String>,
}

/// What [`super::apply_reference_env`] did, for the start-up log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReferenceReport {
    /// Reference variables that set something (names, with a note where the mapping is
    /// approximate).
    pub applied: Vec<String>,
    /// Reference variables ignored because floodgate's own flag or variable is set.
    pub overridden: Vec<String>,
    /// Reference variables accepted that change nothing, each with the reason.
    pub no_effect: Vec<String>,
    /// Values for settings configured elsewhere (response headers, near-limit ratio, logs).
    pub overrides: ReferenceOverrides,
}

impl ReferenceReport {
    /// Logs the report: one info line for what was applied, one warning for what was not.
    pub fn log(&self) {
        if !self.applied.is_empty() {
            tracing::info!(applied = %self.applied.join(", "), "reference environment variables");
        }
        if !self.no_effect.is_empty() || !self.overridden.is_empty() {
            tracing::warn!(
                no_effect = %self.no_effect.join("; "),
                overridden = %self.overridden.join("; "),
                "reference environment variables accepted without effect"
            );
        }
    }
}
