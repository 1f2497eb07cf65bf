//! `floodgate serve`'s gRPC listener options beyond its address: a unix socket instead of
//! TCP, and how long a client connection may live.
//!
//! Envoy keeps its gRPC connections to the rate-limit service open for as long as it can, so
//! a replica added by an autoscaler gets no traffic until something closes the old
//! connections. A maximum connection age makes the server send HTTP/2 `GOAWAY` after that
//! long: the client finishes its in-flight calls on the old connection and opens a new one,
//! which the Service then balances onto any replica, the new ones included.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// How gRPC is listened on and how long its connections live.
#[derive(Clone, Debug, Default, Args)]
pub struct GrpcConnectionSettings {
    /// Serve gRPC on this unix domain socket instead of --grpc-addr (a stale socket file left
    /// by an earlier run is replaced; the file is removed at exit).
    #[arg(
        long,
        env = "FLOODGATE_GRPC_UDS",
        value_name = "PATH",
        conflicts_with = "grpc_addr"
    )]
    pub grpc_uds: Option<PathBuf>,

    /// Close each gRPC connection gracefully (HTTP/2 GOAWAY, in-flight calls finish) once it
    /// is this many seconds old, so clients reconnect and spread over new replicas. The age
    /// varies by up to ±10% per process, so replicas started together do not close their
    /// connections all at once. Off by default.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTION_AGE", value_name = "SECONDS",
          value_parser = parse_age)]
    pub grpc_max_connection_age: Option<Duration>,

    /// Once a connection has been asked to close (--grpc-max-connection-age), how many more
    /// seconds it may stay open before it is cut, calls still in flight included. Without
    /// it, an old connection stays open until its calls finish.
    #[arg(long, env = "FLOODGATE_GRPC_MAX_CONNECTION_AGE_GRACE", value_name = "SECONDS",
          value_parser = parse_age, requires = "grpc_max_connection_age")]
    pub grpc_max_connection_age_grace: Option<Duration>,

    /// Send an HTTP/2 PING on each quiet gRPC connection every this many seconds and close
    /// it if the PING is not answered within 10 s: a peer that vanished without closing the
    /// connection (a node lost, a NAT entry expired) is noticed. Default 20 s; never more
    /// than a third of `--grpc-idle-timeout` (nor the 10 s), so a live peer, which answers,
    /// is never closed as silent.
    #[arg(long, env = "FLOODGATE_GRPC_KEEPALIVE_INTERVAL", value_name = "SECONDS",
          value_parser = parse_age)]
    pub grpc_keepalive_interval: Option<Duration>,
}

impl GrpcConnectionSettings {
    /// The connection age to configure: `grpc_max_connection_age` spread by `jitter` in
    /// [-1, 1] (±10% at the extremes), as gRPC servers do so that connections opened
    /// together are not all closed together.
    pub fn jittered_max_age(&self, jitter: f64) -> Option<Duration> {
        let age = self.grpc_max_connection_age?;
        let factor = 1.0 + 0.1 * jitter.clamp(-1.0, 1.0);
        Some(age.mul_f64(factor))
    }
}

/// A positive number of seconds (fractions allowed), at most ten years.
fn parse_age(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0 && *s <= 315_360_000.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("'{text}' is not a positive number of seconds"))
}

#[cfg(test)]
mod tests;
