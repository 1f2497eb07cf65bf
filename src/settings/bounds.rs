//! `floodgate serve`'s bounds under abuse: connections, streams, deadlines and metric labels
//! (see docs/security.md).

use std::time::Duration;

use clap::Args;

use super::parse::parse_positive_seconds;

/// Bounds on connections, streams and metric labels (see docs/security.md).
#[derive(Clone, Debug, Args)]
pub struct BoundsSettings {
    /// Connections open at once on the gRPC port; at the limit, the connection idle longest
    /// (no call in flight) is closed to admit a new one, which is refused (closed at once,
    /// counted) only when every connection has a call in flight.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTIONS", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_connections: u32,

    /// Connections open at once on the admin HTTP port; at the limit, the connection idle
    /// longest is closed to admit a new one, which is refused only when every one is busy.
    #[arg(long, env = "FLOODGATE_HTTP_MAX_CONNECTIONS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,

    /// HTTP/2 streams one gRPC connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS);
    /// Envoy opens another connection when it needs more.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,

    /// Longest a gRPC call may take, its request body's arrival included, in seconds; a
    /// call still unanswered then is cancelled and its stream freed.
    #[arg(long, env = "FLOODGATE_GRPC_REQUEST_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "5")]
    pub grpc_request_timeout: Duration,

    /// A gRPC connection from which nothing was read for this long, in seconds, is closed
    /// (live HTTP/2 peers answer the server's keepalive pings, so they are never silent).
    #[arg(long, env = "FLOODGATE_GRPC_IDLE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "60")]
    pub grpc_idle_timeout: Duration,

    /// An admin HTTP connection from which nothing was read for this long, in seconds, is
    /// closed (an idle keep-alive connection, or a request line never finished).
    #[arg(long, env = "FLOODGATE_HTTP_IDLE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "60")]
    pub http_idle_timeout: Duration,

    /// A connection that has not sent its opening this many seconds after it was accepted is
    /// closed, on every port: the HTTP/2 preface on the gRPC port (the TLS handshake
    /// included), the first request line on the admin HTTP port.
    #[arg(long, env = "FLOODGATE_HANDSHAKE_TIMEOUT", value_parser = parse_positive_seconds,
          default_value = "10")]
    pub handshake_timeout: Duration,

    /// Distinct rule series carrying request values (`detailed_metric`, `value_to_metric`)
    /// in /metrics; past it, new values count under the rule label `_overflow`.
    #[arg(
        long,
        env = "FLOODGATE_METRICS_MAX_DETAILED_SERIES",
        default_value_t = 10_000
    )]
    pub metrics_max_detailed_series: u32,
}
