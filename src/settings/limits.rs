//! How limits are read, for `floodgate serve` and `floodgate check-config` alike: the
//! default algorithm, the rule cap of one load, and where the files are (`--config`, or the
//! reference's runtime layout).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::limiter::Algorithm;

/// Why the default algorithm (`--default-algorithm`) is the one in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AlgorithmChoice {
    /// floodgate's own default, token buckets: limits come from `--config`.
    #[default]
    Default,
    /// `--default-algorithm` or `FLOODGATE_DEFAULT_ALGORITHM` was given.
    Flag,
    /// The reference's `RUNTIME_*` variables located the limits and no algorithm was given:
    /// fixed windows, so every answer is the reference's.
    ReferenceMode,
}

impl AlgorithmChoice {
    /// The reason, for the start-up log.
    pub fn reason(self) -> &'static str {
        match self {
            AlgorithmChoice::Default => "floodgate's default (limits from --config)",
            AlgorithmChoice::Flag => "set by --default-algorithm / FLOODGATE_DEFAULT_ALGORITHM",
            AlgorithmChoice::ReferenceMode => {
                "reference mode: limits located by RUNTIME_* and no algorithm given, so \
                 answers are the reference's; FLOODGATE_DEFAULT_ALGORITHM=token_bucket \
                 chooses token buckets"
            }
        }
    }
}

/// `floodgate check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigSettings {
    /// Limits: a YAML file or a directory of them.
    #[arg(value_name = "FILE|DIR")]
    pub path: PathBuf,

    /// Algorithm for limits that do not name one.
    #[command(flatten)]
    pub algorithm: AlgorithmFlag,

    /// Most rules the limits may hold.
    #[command(flatten)]
    pub max_load_rules: MaxLoadRulesFlag,

    /// How long the clients (Envoy's rate-limit filter `timeout`, 20ms by default) wait for
    /// an answer: a limit whose `max_wait` is longer gets a warning.
    #[arg(long, value_name = "DURATION", default_value = "20ms",
          value_parser = crate::config::parse_wait)]
    pub expected_client_timeout: u64,
}

/// `--default-algorithm`, shared by `serve` and `check-config` so both read limits alike.
#[derive(Clone, Copy, Debug, Args)]
pub struct AlgorithmFlag {
    /// Algorithm for limits that do not name one (and, when serving, for limit overrides).
    #[arg(
        long = "default-algorithm",
        value_name = "ALGORITHM",
        env = "FLOODGATE_DEFAULT_ALGORITHM",
        value_enum,
        default_value_t = AlgorithmArg::TokenBucket
    )]
    pub value: AlgorithmArg,
}

/// `--max-load-rules`, shared by `serve` and `check-config` so both accept the same limits.
#[derive(Clone, Copy, Debug, Args)]
pub struct MaxLoadRulesFlag {
    /// Most rules (descriptors, nested ones included) one load of limits may hold: all the
    /// files of a reload, or all the resources of an xDS push. A load over it is refused
    /// whole before anything is compiled (at start-up exit 64, on reload the limits in force
    /// stay, an xDS push is NACKed), naming the count and this cap; it keeps a hostile or
    /// mistaken push from exhausting the pod's memory.
    #[arg(
        id = "max_load_rules",
        long = "max-load-rules",
        value_name = "N",
        env = "FLOODGATE_MAX_LOAD_RULES",
        default_value_t = crate::config::MAX_LOAD_RULES,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub value: usize,
}

/// `--default-algorithm` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AlgorithmArg {
    /// Continuous refill (GCRA).
    TokenBucket,
    /// The reference server's fixed windows.
    FixedWindow,
    /// Two-window weighted estimate.
    SlidingWindow,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(value: AlgorithmArg) -> Algorithm {
        match value {
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
        }
    }
}
