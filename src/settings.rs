//! Command line and environment → settings.
//!
//! Every flag can also be set with an environment variable `FLOODGATE_<FLAG>` (for example
//! `--grpc-addr` ↔ `FLOODGATE_GRPC_ADDR`); a flag on the command line wins. Secrets (the Redis
//! URL's password) are redacted in `Debug` output, so settings can be logged safely.
//!
//! The reference server's own environment variables (`RUNTIME_ROOT`, `REDIS_URL`, `GRPC_PORT`,
//! …) are read too, by [`apply_reference_env`] in [`reference`](mod@reference), after parsing: they fill in
//! what floodgate's own flags and `FLOODGATE_*` variables left at their defaults.

mod bounds;
pub mod connections;
pub mod console;
pub mod counters;
mod error;
mod grpc_tls;
mod limits;
mod parse;
pub mod per_second;
pub mod reference;
mod response;
pub mod rlqs;
mod serve;
pub mod statsd;
pub mod traces;
pub mod xds;

pub use bounds::BoundsSettings;
pub use connections::GrpcConnectionSettings;
pub use counters::ReferenceCounterSettings;
pub use error::SettingsError;
pub use grpc_tls::GrpcTlsSettings;
pub use limits::{
    AlgorithmArg, AlgorithmChoice, AlgorithmFlag, CheckConfigSettings, MaxLoadRulesFlag,
};
pub use per_second::PerSecondRedisSettings;
pub use reference::{ReferenceOverrides, ReferenceReport, apply_reference_env};
pub use response::ResponseSettings;

pub use serve::{Cli, Command, LogFormat, ServeSettings};

#[cfg(test)]
mod tests;
