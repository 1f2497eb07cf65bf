//! Redis Sentinel: the sentinels name the current master; the pool connects to it.
//!
//! Every new pooled connection starts with a lookup (redis-rs `SentinelClient`): ask the
//! sentinels, in the configured order, for the master called `master_name`, skip one they
//! flag as down, and check with `ROLE` that the node named really is a master. After a
//! failover the old master's connections fail — dropped (the master died, or Sentinel's
//! `CLIENT KILL` when it demotes one) or answered `READONLY` (a demoted master still
//! reachable) — and the store retires them (see `classify` in [`super`]); their replacements are looked up
//! again and land on the new master. The script is loaded there on the first `NOSCRIPT`.
//!
//! Addresses and credentials:
//! - sentinels: `redis://[user:password@]host:port` (or `rediss://` for TLS), all with the
//!   same credentials (redis-rs uses one set for every sentinel);
//! - master: `redis[s]://[user:password@]<master name>[/db]` — the scheme, credentials and
//!   database of the master; its host must be the master name, because the address comes
//!   from the sentinels, never from the URL.

use std::fmt;
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, RedisResult,
    TlsCertificates, TlsMode,
};
use tokio::sync::Mutex;

use super::redact::{redact_in, redact_url};

/// Which master, through which sentinels.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The master's name in the sentinels' configuration (`sentinel monitor <name> …`).
    pub master_name: String,
    /// The sentinels, as `redis://[user:password@]host:port` (or `rediss://`) URLs.
    pub nodes: Vec<String>,
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("SentinelSettings")
            .field("master_name", &self.master_name)
            .field("nodes", &nodes)
            .finish()
    }
}

/// The master of a Sentinel-managed Redis, found anew for every connection.
pub struct Master {
    /// redis-rs's client; its lookups need `&mut`, and run one at a time.
    client: Mutex<SentinelClient>,
    /// The master's name, for messages.
    name: String,
    /// The address last connected to, to log a change of master once.
    last: std::sync::Mutex<Option<String>>,
}

impl Master {
    /// A master looked up through `settings.nodes`, connected to with the scheme,
    /// credentials and database of `master_url`, and with `certs` on every TLS connection
    /// (master and sentinels). Fails on anything an operator must fix.
    pub fn new(
        settings: &SentinelSettings,
        master_url: &str,
        certs: Option<&TlsCertificates>,
    ) -> Result<Master, String> {
        let master = parse(master_url, "master URL")?;
        match master.addr() {
            ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. }
                if *host == settings.master_name => {}
            _ => {
                return Err(format!(
                    "with --redis-sentinel {name}, --redis-url gives the master's scheme, \
                     credentials and database as redis[s]://[user:password@]{name}[/db] \
                     (its address comes from the sentinels), not {url}",
                    name = settings.master_name,
                    url = redact_url(master_url),
                ));
            }
        }
        let nodes = settings
            .nodes
            .iter()
            .map(|node| parse(node, "sentinel URL"))
            .collect::<Result<Vec<_>, _>>()?;
        let first = nodes
            .first()
            .ok_or("--redis-sentinel-nodes names no sentinel")?;
        let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if nodes
            .iter()
            .any(|n| matches!(n.addr(), ConnectionAddr::Unix(_)))
        {
            return Err("sentinel URLs must be redis:// or rediss:// (TCP)".into());
        }
        if nodes.iter().any(|n| tls(n) != tls(first)) {
            return Err("sentinel URLs must all be redis:// or all rediss://".into());
        }
        if nodes.iter().any(|n| credentials(n) != credentials(first)) {
            return Err("sentinel URLs must all carry the same user and password".into());
        }
        if certs.is_some() && !tls(&master) && !tls(first) {
            return Err(
                "Redis TLS files are set, but neither --redis-url nor the sentinel \
                        URLs use rediss://"
                    .into(),
            );
        }

        let addrs = nodes.iter().map(|n| n.addr().clone());
        let mut builder =
            SentinelClientBuilder::new(addrs, &settings.master_name, SentinelServerType::Master)
                .map_err(|e| format!("Redis Sentinel settings: {e}"))?;
        let redis = master.redis_settings();
        builder = builder.set_client_to_redis_db(redis.db());
        if let Some(user) = redis.username() {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = redis.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let ConnectionAddr::TcpTls { insecure, .. } = master.addr() {
            let mode = if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            };
            builder = builder.set_client_to_redis_tls_mode(mode);
            if let Some(certs) = certs {
                builder = builder.set_client_to_redis_certificates(certs.clone());
            }
        }
        let (user, password) = credentials(first);
        if let Some(user) = user {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if let (true, Some(certs)) = (tls(first), certs) {
            builder = builder.set_client_to_sentinel_certificates(certs.clone());
        }
        let client = builder
            .build()
            .map_err(|e| format!("Redis Sentinel settings: {e}"))?;
        Ok(Master {
            client: Mutex::new(client),
            name: settings.master_name.clone(),
            last: std::sync::Mutex::new(None),
        })
    }

    /// A client for the current master, as the sentinels name it now; fails after
    /// `timeout` (every sentinel unreachable or slow, or none naming a live master).
    pub async fn client(&self, timeout: Duration) -> RedisResult<Client> {
        let lookup = async { self.client.lock().await.async_get_client().await };
        let client = tokio::time::timeout(timeout, lookup).await.map_err(|_| {
            RedisError::from((
                ErrorKind::Io,
                "Redis Sentinel lookup timed out",
                format!("no master {:?} named within {timeout:?}", self.name),
            ))
        })??;
        self.note(client.get_connection_info().addr().to_string());
        Ok(client)
    }

    /// Logs the master's address the first time and whenever it changes (a failover).
    fn note(&self, addr: String) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.as_deref() != Some(addr.as_str()) {
            tracing::info!(master = %self.name, address = %addr, previous = ?last.as_deref(),
                "Redis Sentinel: connecting to the master");
            *last = Some(addr);
        }
    }
}

/// The user and password a URL carries.
fn credentials(info: &ConnectionInfo) -> (Option<&str>, Option<&str>) {
    let redis = info.redis_settings();
    (redis.username(), redis.password())
}

fn parse(url: &str, what: &str) -> Result<ConnectionInfo, String> {
    url.into_connection_info().map_err(|e| {
        redact_in(
            &format!("invalid Redis {what} {}: {e}", redact_url(url)),
            url,
        )
    })
}

#[cfg(test)]
mod tests;
