//! How the serving loop serves: [`RunOptions`] (drain period and shutdown grace, message
//! size, TLS, the gRPC connection age, health inputs, the console) and the [`Bounds`] that
//! keep one client from exhausting the server, both built from the settings by the
//! composition root.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::console::ConsoleOptions;
use crate::settings::BoundsSettings;
use crate::transport::ConnectionLimits;
use crate::transport::tls::GrpcTls;

/// How [`run`](super::run) serves, besides its listeners, decider and store health.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// How long, once shutdown begins, health reports NOT_SERVING while every call (new
    /// connections included) is still answered, before the listeners close.
    pub drain_period: Duration,
    /// How long in-flight requests may take to finish once the listeners have closed.
    pub grace: Duration,
    /// Largest gRPC request message accepted, in bytes (encoded protobuf); a larger one is
    /// refused by tonic before it is decoded.
    pub grpc_max_message_bytes: usize,
    /// Request bytes in flight on the gRPC port, all calls together
    /// (`--max-in-flight-bytes`); a call whose bytes would go over is refused with
    /// `RESOURCE_EXHAUSTED` (crate::admission).
    pub max_in_flight_bytes: usize,
    /// Whether the admin HTTP server answers `POST /json` (404 when not).
    pub json_endpoint: bool,
    /// TLS on the gRPC port; `None`: plaintext.
    pub tls: Option<GrpcTls>,
    /// Whether limits are loaded, with `--health-requires-limits` (false: NOT_SERVING).
    pub limits_health: Option<watch::Receiver<bool>>,
    /// gRPC connections get `GOAWAY` at this age (already jittered); `None`: never.
    pub max_connection_age: Option<Duration>,
    /// ...and are cut this long after that; `None`: they close when their calls finish.
    pub max_connection_age_grace: Option<Duration>,
    /// HTTP/2 PING interval on idle gRPC connections; `None`: every
    /// 20 s. Never longer than a third of the idle timeout.
    pub keepalive_interval: Option<Duration>,
    /// Connection and stream bounds of both ports.
    pub bounds: Bounds,
    /// Where the listeners count their connections (registered with the decider's metrics).
    pub transport: crate::transport::TransportMetrics,
    /// The operator console's token, access rules and store health.
    pub console: ConsoleOptions,
    /// The Rate Limit Quota Service, served beside the rate-limit service; `None`: not
    /// served.
    pub rlqs: Option<Arc<crate::rlqs::Rlqs>>,
}

/// The bounds that keep one client from exhausting the server (docs/security.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Connections on the gRPC port (all serving threads together).
    pub grpc: ConnectionLimits,
    /// Connections on the admin HTTP port.
    pub http: ConnectionLimits,
    /// HTTP/2 streams open at once on one gRPC connection.
    pub grpc_max_concurrent_streams: u32,
    /// Longest a gRPC call may take, its request body's arrival included.
    pub grpc_request_timeout: Duration,
}

impl Default for Bounds {
    /// The defaults of the `serve` flags.
    fn default() -> Bounds {
        Bounds {
            grpc: ConnectionLimits {
                max_connections: 1_000,
                idle_timeout: Duration::from_secs(60),
                handshake_timeout: Duration::from_secs(10),
            },
            http: ConnectionLimits {
                max_connections: 100,
                idle_timeout: Duration::from_secs(60),
                handshake_timeout: Duration::from_secs(10),
            },
            grpc_max_concurrent_streams: 100,
            grpc_request_timeout: Duration::from_secs(5),
        }
    }
}

impl Bounds {
    /// The bounds `settings` ask for.
    pub fn from_settings(settings: &BoundsSettings) -> Bounds {
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        Bounds {
            grpc: ConnectionLimits {
                max_connections: count(settings.grpc_max_connections),
                idle_timeout: settings.grpc_idle_timeout,
                handshake_timeout: settings.handshake_timeout,
            },
            http: ConnectionLimits {
                max_connections: count(settings.http_max_connections),
                idle_timeout: settings.http_idle_timeout,
                handshake_timeout: settings.handshake_timeout,
            },
            grpc_max_concurrent_streams: settings.grpc_max_concurrent_streams,
            grpc_request_timeout: settings.grpc_request_timeout,
        }
    }
}

#[cfg(test)]
mod tests;
