//! `CACHE_KEY_PREFIX` and `EXPIRATION_JITTER_MAX_SECONDS` for the counters shared with
//! reference pods ([`crate::settings::counters`]).

use super::mapping::{Mapping, bad};
use crate::settings::ServeSettings;
use crate::settings::error::SettingsError;

impl Mapping<'_> {
    /// The reference counters' prefix (`CACHE_KEY_PREFIX`, the reference pods' own, even when
    /// `--redis-key-prefix` gives floodgate's keys another) and expiry jitter
    /// (`EXPIRATION_JITTER_MAX_SECONDS`, without effect when the counters are off).
    pub(super) fn counters(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        const JITTER: &str = "EXPIRATION_JITTER_MAX_SECONDS";
        if !self.own("reference_key_prefix")
            && let Some(prefix) = self.get("CACHE_KEY_PREFIX")
        {
            settings.counters.reference_key_prefix = prefix.to_string();
        }
        let Some(value) = self.get(JITTER) else {
            return Ok(());
        };
        // The reference reads an int64 and adds no jitter unless it is above 0.
        let jitter = value
            .parse::<i64>()
            .map_err(|_| bad(JITTER, value, "a whole number of seconds"))?
            .max(0)
            .unsigned_abs();
        let on = settings.counters.enabled(settings.runtime_layout.is_some());
        if self.own("reference_expiry_jitter_max") {
            self.override_by(&[JITTER], "--reference-expiry-jitter-max");
        } else if on {
            settings.counters.reference_expiry_jitter_max = jitter;
            self.applied(JITTER);
        } else {
            self.no_effect(
                JITTER,
                "reference counters are off (--reference-counters): floodgate's own keys \
                 expire when their window or bucket does",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
