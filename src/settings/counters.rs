//! `floodgate serve`'s counters shared with reference pods during a rolling migration.
//!
//! While a Deployment rolls from envoyproxy/ratelimit to floodgate, pods of both serve behind
//! one Service. With reference counters on, floodgate keeps every fixed-window bucket the
//! reference could express under the reference's Redis key name (`CACHE_KEY_PREFIX`, domain,
//! `_`-joined entries, window start) as the reference's plain integer, so both kinds of pod
//! debit the same counters and a client's limit holds across them. On by default only in
//! reference mode (limits located by the reference's `RUNTIME_*` variables); floodgate's own
//! settings keep floodgate's unambiguous keys unless asked. The trade-off is in
//! `docs/redis.md`.

use std::sync::Arc;

use clap::{ArgAction, Args};

use crate::plan::ReferenceCounters;

/// The reference's default `EXPIRATION_JITTER_MAX_SECONDS`.
pub const DEFAULT_EXPIRY_JITTER_MAX_SECS: u64 = 300;

/// Whether and how fixed windows are shared with reference pods.
#[derive(Clone, Debug, Args)]
pub struct ReferenceCounterSettings {
    /// Keep fixed-window counters under the reference server's Redis key names, as its plain
    /// integers, so reference and floodgate pods share them while a Deployment rolls. Default:
    /// on in reference mode (limits located by RUNTIME_*), off otherwise.
    #[arg(long, env = "FLOODGATE_REFERENCE_COUNTERS", value_name = "BOOL",
          num_args = 0..=1, default_missing_value = "true", action = ArgAction::Set)]
    pub reference_counters: Option<bool>,

    /// Prefix of the reference counters' names (the reference's CACHE_KEY_PREFIX, which
    /// sets it in reference mode). Separate from --redis-key-prefix, which floodgate's own
    /// keys keep.
    #[arg(
        long,
        env = "FLOODGATE_REFERENCE_KEY_PREFIX",
        value_name = "PREFIX",
        default_value = ""
    )]
    pub reference_key_prefix: String,

    /// A reference counter's expiry is its unit plus a random jitter below this many seconds
    /// (the reference's EXPIRATION_JITTER_MAX_SECONDS); 0: no jitter.
    #[arg(long, env = "FLOODGATE_REFERENCE_EXPIRY_JITTER_MAX", value_name = "SECONDS",
          default_value_t = DEFAULT_EXPIRY_JITTER_MAX_SECS)]
    pub reference_expiry_jitter_max: u64,
}

impl ReferenceCounterSettings {
    /// Whether reference counters are on: as asked, else on exactly in `reference_mode`.
    pub fn enabled(&self, reference_mode: bool) -> bool {
        self.reference_counters.unwrap_or(reference_mode)
    }

    /// The planner's options: `None` when off.
    pub fn plan_options(&self, reference_mode: bool) -> Option<ReferenceCounters> {
        self.enabled(reference_mode).then(|| ReferenceCounters {
            prefix: Arc::from(self.reference_key_prefix.as_bytes()),
            expiry_jitter_max_secs: self.reference_expiry_jitter_max,
        })
    }
}

#[cfg(test)]
mod tests;
