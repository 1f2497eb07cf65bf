//! Flags of the operator console (`crate::console`) and of `floodgate bucket`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// Who may use the operator console on the admin port (docs/security.md).
#[derive(Args, Clone, Debug, Default)]
pub struct ConsoleSettings {
    /// A file holding the bearer token that bucket resets and set-remaining calls must carry
    /// (`Authorization: Bearer <token>`; surrounding white space is ignored). Reloaded when it
    /// changes. Without it, those calls are refused (403): nobody may change a bucket.
    #[arg(long, env = "FLOODGATE_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Whether read-only console calls (bucket inspection, the dashboard's data) need the
    /// token even without --admin-token-file (then every read is refused). With a token file
    /// they always need it: their bucket keys hold request values (client addresses).
    #[arg(long, env = "FLOODGATE_ADMIN_READ_REQUIRES_TOKEN", value_name = "BOOL",
          default_value_t = false, action = clap::ArgAction::Set)]
    pub admin_read_requires_token: bool,

    /// Host names (besides IP addresses and `localhost`) under which a browser may write to
    /// the admin port (`POST /json`, the console's buckets): the name of an ingress or
    /// proxy in front of it. A browser's write (one with `Origin`) sent to any other name is
    /// refused (403), so a page that reaches the port by DNS rebinding writes nothing.
    /// Comma-separated; clients that send no `Origin` (curl, the CLI) are not affected.
    #[arg(
        long = "admin-allowed-host",
        env = "FLOODGATE_ADMIN_ALLOWED_HOSTS",
        value_name = "HOST",
        value_delimiter = ','
    )]
    pub admin_allowed_hosts: Vec<String>,
}

/// `floodgate bucket`: inspect, reset or set a bucket through a running server's admin port.
#[derive(Args, Debug)]
pub struct BucketSettings {
    /// What to do.
    #[command(subcommand)]
    pub action: BucketAction,
    /// The server's admin HTTP address, e.g. http://127.0.0.1:8080.
    #[arg(
        long,
        global = true,
        env = "FLOODGATE_ADMIN",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub admin: String,
    /// The domain of the descriptor.
    #[arg(long, global = true, default_value = "")]
    pub domain: String,
    /// A descriptor entry `key=value` (`key` alone: an empty value), in descriptor order.
    #[arg(long = "entry", global = true, value_name = "KEY=VALUE")]
    pub entries: Vec<String>,
    /// Only the bucket with this store key (as `get` prints it), when several limits match.
    #[arg(long, global = true, value_name = "KEY")]
    pub key: Option<String>,
    /// A file holding the admin bearer token (needed for reset and set).
    #[arg(
        long,
        global = true,
        env = "FLOODGATE_ADMIN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
}

/// A `floodgate bucket` action.
#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketAction {
    /// Show every limit the descriptor matches and its bucket, debiting nothing.
    Get,
    /// Give the matched buckets their full capacity back.
    Reset,
    /// Set the matched buckets' remaining requests.
    Set {
        /// Requests (tokens) left after the call.
        #[arg(long)]
        remaining: u64,
    },
}
