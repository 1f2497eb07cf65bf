//! Connection metrics, by port: open now, refused and evicted at the bound, closed by the
//! handshake and idle deadlines, failed accepts. The bounds themselves are the listeners';
//! these only count what they did.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;
use super::labels::{Port, PortLabels};

/// The `floodgate_connections_*` and `floodgate_accept_errors` families.
#[derive(Debug, Default)]
pub(super) struct ConnectionMetrics {
    open: Family<PortLabels, Gauge>,
    refused: Family<PortLabels, Counter>,
    evicted: Family<PortLabels, Counter>,
    handshake_timeouts: Family<PortLabels, Counter>,
    idle_closed: Family<PortLabels, Counter>,
    accept_errors: Family<PortLabels, Counter>,
}

impl ConnectionMetrics {
    /// Every connection family, registered in `registry`.
    pub(super) fn register(registry: &mut Registry) -> ConnectionMetrics {
        let connections = ConnectionMetrics::default();
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

impl Metrics {
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
