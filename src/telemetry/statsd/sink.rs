//! The connection to the statsd host: dialled (TCP or UDP) on the first flush, re-dialled
//! with backoff while the host is unreachable, lines packed into datagrams as gostats (the
//! reference's stats library) packs them. What is not sent is dropped, never queued.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use super::Protocol;

/// gostats' UDP buffer: a datagram that an MTU of 1500 does not fragment.
const UDP_DATAGRAM: usize = 1432;
/// gostats' dial timeout (half its 3 s retry interval) and write timeout.
const DIAL_TIMEOUT: Duration = Duration::from_millis(1500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Reconnect backoff bounds (gostats retries every 3 s).
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(3);

/// The connection to the statsd host, re-dialled with backoff.
pub(super) struct Sink {
    addr: String,
    protocol: Protocol,
    tcp: Option<TcpStream>,
    udp: Option<UdpSocket>,
    /// Not before this instant is a new dial tried.
    retry_at: tokio::time::Instant,
    backoff: Duration,
}

impl Sink {
    pub(super) fn new(addr: String, protocol: Protocol) -> Sink {
        Sink {
            addr,
            protocol,
            tcp: None,
            udp: None,
            retry_at: tokio::time::Instant::now(),
            backoff: BACKOFF_MIN,
        }
    }

    /// Sends `lines`; false when they were dropped (no connection, or it broke).
    pub(super) async fn send(&mut self, lines: &[u8]) -> bool {
        if !self.connected() && !self.connect().await {
            return false;
        }
        let sent = match self.protocol {
            Protocol::Tcp => self.send_tcp(lines).await,
            Protocol::Udp => self.send_udp(lines).await,
        };
        if sent {
            self.backoff = BACKOFF_MIN;
        } else {
            self.tcp = None;
            self.udp = None;
        }
        sent
    }

    fn connected(&self) -> bool {
        self.tcp.is_some() || self.udp.is_some()
    }

    async fn connect(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now < self.retry_at {
            return false;
        }
        let dialled = match self.protocol {
            Protocol::Tcp => tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(&self.addr))
                .await
                .map_err(std::io::Error::from)
                .and_then(|r| r)
                .map(|s| self.tcp = Some(s)),
            Protocol::Udp => {
                let bind = if self.addr.starts_with('[') {
                    "[::]:0"
                } else {
                    "0.0.0.0:0"
                };
                match UdpSocket::bind(bind).await {
                    Ok(socket) => socket.connect(&self.addr).await.map(|()| {
                        self.udp = Some(socket);
                    }),
                    Err(e) => Err(e),
                }
            }
        };
        match dialled {
            Ok(()) => true,
            Err(e) => {
                // Once per outage, not once per retry.
                if self.backoff == BACKOFF_MIN {
                    tracing::warn!(addr = %self.addr, error = %e,
                                   "statsd: cannot connect; stats dropped until it answers");
                } else {
                    tracing::debug!(addr = %self.addr, error = %e, "statsd: still unreachable");
                }
                self.retry_at = now + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
    }

    async fn send_tcp(&mut self, lines: &[u8]) -> bool {
        let Some(stream) = self.tcp.as_mut() else {
            return false;
        };
        matches!(
            tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(lines)).await,
            Ok(Ok(()))
        )
    }

    /// Whole lines per datagram, at most [`UDP_DATAGRAM`] bytes each (a longer line alone).
    async fn send_udp(&mut self, lines: &[u8]) -> bool {
        let Some(socket) = self.udp.as_ref() else {
            return false;
        };
        let mut start = 0;
        let mut end = 0;
        for line in lines.split_inclusive(|&b| b == b'\n') {
            if end > start && end - start + line.len() > UDP_DATAGRAM {
                if socket.send(&lines[start..end]).await.is_err() {
                    return false;
                }
                start = end;
            }
            end += line.len();
        }
        end == start || socket.send(&lines[start..end]).await.is_ok()
    }
}
