//! The reference server's environment variables → floodgate settings.
//!
//! envoyproxy/ratelimit is configured only through environment variables (`RUNTIME_ROOT`,
//! `REDIS_URL`, `GRPC_PORT`, …). So that an operator can swap the image and keep the
//! Deployment's `env:`, [`apply_reference_env`] reads those variables from a key→value map
//! (the process environment in `main`, a literal map in tests) and fills in every setting that
//! floodgate's own flag or `FLOODGATE_*` variable did not set: floodgate's own always win.
//!
//! Every variable of the reference's settings ([`REFERENCE_VARIABLES`]) that is set is
//! applied, or listed in the [`ReferenceReport`] as having no effect with the reason (logged
//! once at start-up), or refused: what floodgate cannot honour (a memcache store, limits from
//! xDS) and values it cannot parse are a [`SettingsError`], which `main` turns into exit code
//! 64 before any port is bound. The mappings live in `mapping` and in `redis` (both Redis: main and
//! per-second) and `serving` (listener, health, store and config kinds); `catalogue` decides
//! the variables no mapping reads. Variables set to the empty string count as unset (a
//! Kubernetes `value: ""`).

use std::collections::HashMap;

use clap::ArgMatches;

pub use super::error::SettingsError;
use super::serve::ServeSettings;
use mapping::Mapping;

/// Fills `settings` from the reference server's environment variables in `env`, wherever
/// floodgate's own flag or `FLOODGATE_*` variable did not set a value (`matches` are the
/// `serve` subcommand's, telling where each value came from). Then checks that the limits
/// path is known. Pure: reads only its arguments.
pub fn apply_reference_env(
    settings: &mut ServeSettings,
    matches: &ArgMatches,
    env: &HashMap<String, String>,
) -> Result<ReferenceReport, SettingsError> {
    let mut mapping = Mapping {
        env,
        matches,
        report: ReferenceReport::default(),
    };
    mapping.refused()?;
    mapping.runtime(settings)?;
    mapping.serving(settings)?;
    mapping.stats(settings)?;
    mapping.prometheus(settings)?;
    mapping.addresses(settings)?;
    mapping.grpc_tls(settings)?;
    mapping.redis(settings)?;
    mapping.per_second(settings)?;
    mapping.store(settings)?;
    mapping.counters(settings)?;
    mapping.service(settings)?;
    mapping.logs(settings)?;
    mapping.traces(settings)?;
    mapping.without_effect();
    if settings.config.is_none() && settings.xds.config_xds.is_none() {
        return Err(SettingsError::NoLimits);
    }
    Ok(mapping.report)
}

mod catalogue;
mod counters;
mod duration;
mod mapping;
mod redis;
mod report;
mod serving;
mod stats;
mod traces;
mod xds;

pub use catalogue::REFERENCE_VARIABLES;
pub use duration::parse_go_duration;
pub use report::{ReferenceOverrides, ReferenceReport};
// The runtime layout, MERGE_DOMAIN_CONFIG, QUOTA_MODE and the default algorithm: in their
// own file, `runtime.rs`.
mod runtime;

#[cfg(test)]
mod tests;
