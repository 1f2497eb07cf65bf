//! The transport's metrics, registered once into the shared registry ([`Metrics::register`]
//! hands it over) and counted by the listeners, the connection wrapper and the gRPC port's
//! TLS: connections by port (open now, refused and evicted at the bound, closed by the
//! handshake and idle deadlines, failed accepts) and the TLS certificate's loads and failed
//! handshakes. The bounds themselves are the listeners'; these only count what they did.
//! Names and help strings live here only.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    port: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The listening port a connection metric is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port (rate-limit service, health, reflection).
    Grpc,
    /// The admin HTTP port.
    Http,
    /// The reference's Prometheus series' port (`--reference-prometheus-addr`).
    Prometheus,
    /// The reference's debug port (`--debug-addr`).
    Debug,
}

impl Port {
    /// The `port` label value.
    pub fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
            Port::Prometheus => "prometheus",
            Port::Debug => "debug",
        }
    }
}

/// Why a TLS handshake on the gRPC port failed, for `floodgate_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The handshake was refused (not TLS, no or an untrusted client certificate, …).
    Error,
    /// The client did not complete it in time.
    Timeout,
}

/// The transport's counters and gauges: cheap clones of the registered handles, one for each
/// listener, connection and TLS acceptor.
#[derive(Clone, Debug)]
pub struct TransportMetrics {
    connections: Arc<Connections>,
    tls: Arc<Tls>,
}

impl TransportMetrics {
    /// Every transport family, registered at zero in `metrics`' registry. Called once per
    /// registry, and the handles cloned to every listener.
    pub fn register(metrics: &Metrics) -> TransportMetrics {
        metrics.register(|registry| {
            let tls = Tls::register(registry);
            let connections = Connections::register(registry);
            TransportMetrics {
                connections: Arc::new(connections),
                tls: Arc::new(tls),
            }
        })
    }

    /// Counts a gRPC TLS certificate load (start-up or reload) and remembers whether the last
    /// one succeeded.
    pub fn record_tls_load(&self, ok: bool) {
        // The last load's result first: whoever sees the count go up finds it set.
        self.tls.last_ok.set(i64::from(ok));
        self.tls
            .loads
            .get_or_create(&ResultLabels {
                result: if ok { "success" } else { "error" },
            })
            .inc();
    }

    /// Counts a failed TLS handshake.
    pub fn record_tls_handshake_failure(&self, failure: HandshakeFailure) {
        let reason = match failure {
            HandshakeFailure::Error => "error",
            HandshakeFailure::Timeout => "timeout",
        };
        self.tls
            .handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// The gRPC port's TLS certificate loads and failed handshakes.
#[derive(Debug, Default)]
struct Tls {
    loads: Family<ResultLabels, Counter>,
    last_ok: Gauge,
    handshake_failures: Family<ReasonLabels, Counter>,
}

impl Tls {
    /// The TLS certificate's load and handshake families, registered in `registry`.
    fn register(registry: &mut Registry) -> Tls {
        let tls = Tls::default();
        registry.register(
            "floodgate_tls_loads",
            "gRPC TLS certificate loads (start-up and reloads) by result",
            tls.loads.clone(),
        );
        registry.register(
            "floodgate_tls_last_reload_success",
            "1 if the last gRPC TLS certificate load succeeded, 0 if it failed",
            tls.last_ok.clone(),
        );
        registry.register(
            "floodgate_tls_handshake_failures",
            "gRPC TLS handshakes that failed, by reason (error, timeout)",
            tls.handshake_failures.clone(),
        );
        tls
    }
}

/// The `floodgate_connections_*` and `floodgate_accept_errors` families.
#[derive(Debug, Default)]
struct Connections {
    open: Family<PortLabels, Gauge>,
    refused: Family<PortLabels, Counter>,
    evicted: Family<PortLabels, Counter>,
    handshake_timeouts: Family<PortLabels, Counter>,
    idle_closed: Family<PortLabels, Counter>,
    accept_errors: Family<PortLabels, Counter>,
}

impl Connections {
    /// Every connection family, registered in `registry`.
    fn register(registry: &mut Registry) -> Connections {
        let connections = Connections::default();
        registry.register(
            "floodgate_connections_open",
            "Connections open now, by port (grpc, http)",
            connections.open.clone(),
        );
        registry.register(
            "floodgate_connections_refused",
            "Connections closed at once because the port's connection limit was reached \
             and every connection had a call in flight",
            connections.refused.clone(),
        );
        registry.register(
            "floodgate_connections_evicted",
            "Idle connections closed to admit a new one because the port's connection limit \
             was reached",
            connections.evicted.clone(),
        );
        registry.register(
            "floodgate_connections_handshake_timeouts",
            "Connections closed because they had not sent their HTTP/2 preface (TLS handshake \
             included) or HTTP/1 request line within the handshake timeout",
            connections.handshake_timeouts.clone(),
        );
        registry.register(
            "floodgate_connections_idle_closed",
            "Connections closed because nothing was read from them for the idle timeout",
            connections.idle_closed.clone(),
        );
        registry.register(
            "floodgate_accept_errors",
            "Failed accepts (e.g. out of file descriptors), by port",
            connections.accept_errors.clone(),
        );
        connections
    }
}

impl TransportMetrics {
    /// The `floodgate_connections_open` gauge of `port` (connections count themselves).
    pub fn connections_open(&self, port: Port) -> Gauge {
        self.connections
            .open
            .get_or_create_owned(&PortLabels { port: port.label() })
    }

    /// Counts a connection refused because the port's limit was reached.
    pub fn record_connection_refused(&self, port: Port) {
        self.connections
            .refused
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts an idle connection closed to admit a new one at the port's limit.
    pub fn record_connection_evicted(&self, port: Port) {
        self.connections
            .evicted
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a connection closed for not sending its opening within the handshake timeout.
    pub fn record_handshake_timeout(&self, port: Port) {
        self.connections
            .handshake_timeouts
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a connection closed for being silent too long.
    pub fn record_idle_close(&self, port: Port) {
        self.connections
            .idle_closed
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }

    /// Counts a failed accept.
    pub fn record_accept_error(&self, port: Port) {
        self.connections
            .accept_errors
            .get_or_create(&PortLabels { port: port.label() })
            .inc();
    }
}
