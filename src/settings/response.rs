//! What `floodgate serve` adds to a response besides its statuses: rate-limit headers,
//! dynamic metadata, and the near-limit metric's threshold.

use clap::Args;

use super::parse::parse_ratio;

/// What a response carries besides its statuses, and the near-limit metric's threshold.
#[derive(Clone, Debug, Args)]
pub struct ResponseSettings {
    /// Add RateLimit-Limit / -Remaining / -Reset (and Retry-After on OVER_LIMIT) from the
    /// most constrained descriptor, as the reference's LIMIT_RESPONSE_HEADERS_ENABLED does.
    #[arg(long, env = "FLOODGATE_RESPONSE_HEADERS")]
    pub response_headers: bool,

    /// Name of the limit header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_LIMIT",
        default_value = "RateLimit-Limit"
    )]
    pub header_limit: String,

    /// Name of the remaining header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_REMAINING",
        default_value = "RateLimit-Remaining"
    )]
    pub header_remaining: String,

    /// Name of the reset header.
    #[arg(
        long,
        env = "FLOODGATE_HEADER_RESET",
        default_value = "RateLimit-Reset"
    )]
    pub header_reset: String,

    /// With --response-headers, also add the IETF `RateLimit-Policy` and `RateLimit`
    /// structured fields.
    #[arg(long, env = "FLOODGATE_IETF_HEADERS")]
    pub ietf_headers: bool,

    /// Admitted hits above this fraction of a limit's capacity count as near the limit.
    #[arg(long, env = "FLOODGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub near_limit_ratio: f32,

    /// Report the request and the `metadata:` of the rules that admitted it in the
    /// response's dynamic metadata, as the reference's RESPONSE_DYNAMIC_METADATA does.
    #[arg(long, env = "FLOODGATE_RESPONSE_DYNAMIC_METADATA")]
    pub response_dynamic_metadata: bool,
}

impl ResponseSettings {
    /// The header options for the planner; `None` when headers are off.
    pub fn header_options(&self) -> Option<crate::plan::HeaderOptions> {
        self.response_headers.then(|| crate::plan::HeaderOptions {
            limit: self.header_limit.clone(),
            remaining: self.header_remaining.clone(),
            reset: self.header_reset.clone(),
            ietf: self.ietf_headers,
        })
    }
}
