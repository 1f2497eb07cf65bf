//! The reference's Redis variables → floodgate's Redis settings: the main Redis (`REDIS_*`)
//! and the per-second one (`REDIS_PERSECOND_*`), which the reference reads the same way, each
//! name with its own prefix.

use std::time::Duration;

use super::mapping::{Mapping, bad, encode};
use crate::settings::error::SettingsError;
use crate::settings::serve::ServeSettings;

/// The names of one Redis's variables.
struct RedisVars {
    url: &'static str,
    socket: &'static str,
    kind: &'static str,
    auth: &'static str,
    tls: &'static str,
    sentinel_auth: &'static str,
    pool_size: &'static str,
    timeout: &'static str,
}

impl RedisVars {
    /// The variables that together say where this Redis is.
    fn location(&self) -> [&'static str; 6] {
        [
            self.url,
            self.socket,
            self.kind,
            self.auth,
            self.tls,
            self.sentinel_auth,
        ]
    }
}

/// The main Redis.
const MAIN: RedisVars = RedisVars {
    url: "REDIS_URL",
    socket: "REDIS_SOCKET_TYPE",
    kind: "REDIS_TYPE",
    auth: "REDIS_AUTH",
    tls: "REDIS_TLS",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
    pool_size: "REDIS_POOL_SIZE",
    timeout: "REDIS_TIMEOUT",
};

/// The per-second Redis (`REDIS_PERSECOND=true`).
const PER_SECOND: RedisVars = RedisVars {
    url: "REDIS_PERSECOND_URL",
    socket: "REDIS_PERSECOND_SOCKET_TYPE",
    kind: "REDIS_PERSECOND_TYPE",
    auth: "REDIS_PERSECOND_AUTH",
    tls: "REDIS_PERSECOND_TLS",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
    pool_size: "REDIS_PERSECOND_POOL_SIZE",
    timeout: "REDIS_PERSECOND_TIMEOUT",
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Socket {
    Tcp,
    Unix,
}

/// `REDIS_TYPE`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RedisType {
    Single,
    Sentinel,
    Cluster,
}

/// One Redis's variables, parsed (each is an error if malformed, used or not).
struct Parsed {
    socket: Option<Socket>,
    kind: Option<RedisType>,
    tls: Option<bool>,
    pool_size: Option<u32>,
    timeout: Option<Duration>,
}

/// Where one Redis is, as floodgate's settings say it.
enum Target {
    /// `--redis-url`.
    Url(String),
    /// `--redis-url` (the master's scheme and credentials), `--redis-sentinel`,
    /// `--redis-sentinel-nodes`.
    Sentinel {
        url: String,
        master: String,
        nodes: Vec<String>,
    },
    /// `--redis-cluster`.
    Cluster(Vec<String>),
}

impl<'a> Mapping<'a> {
    /// One Redis's variables, parsed.
    fn parse_redis(&self, vars: &RedisVars) -> Result<Parsed, SettingsError> {
        let socket = self
            .get(vars.socket)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "tcp" => Ok(Socket::Tcp),
                "unix" => Ok(Socket::Unix),
                _ => Err(bad(vars.socket, v, "tcp or unix")),
            })
            .transpose()?;
        let kind = self
            .get(vars.kind)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "single" => Ok(RedisType::Single),
                "sentinel" => Ok(RedisType::Sentinel),
                "cluster" => Ok(RedisType::Cluster),
                _ => Err(bad(vars.kind, v, "single, sentinel or cluster")),
            })
            .transpose()?;
        let pool_size = self
            .get(vars.pool_size)
            .map(|v| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| bad(vars.pool_size, v, "a number from 1 to 1024"))
            })
            .transpose()?;
        Ok(Parsed {
            socket,
            kind,
            tls: self.parse_bool(vars.tls)?,
            pool_size,
            timeout: self.go_duration(vars.timeout)?,
        })
    }

    /// `REDIS_URL` and its companions → `--redis-url` (and, with `REDIS_TYPE=sentinel`,
    /// `--redis-sentinel` / `--redis-sentinel-nodes`; with `cluster`, `--redis-cluster`);
    /// `REDIS_POOL_SIZE` → `--redis-pool-size`; `REDIS_TIMEOUT` → the timeouts; the
    /// `REDIS_TLS_*` files → `--redis-tls-*-file`.
    pub(super) fn redis(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let parsed = self.parse_redis(&MAIN)?;
        // The reference loads the TLS files for either Redis that uses TLS.
        let per_second = self.parse_bool("REDIS_PERSECOND")? == Some(true);
        let per_second_tls = per_second && self.parse_bool(PER_SECOND.tls)? == Some(true);

        if self.own("redis_pool_size") {
            self.override_by(&[MAIN.pool_size], "--redis-pool-size");
        } else if let Some(size) = parsed.pool_size {
            settings.redis_pool_size = size;
            self.applied(MAIN.pool_size);
        }
        if let Some(timeout) = parsed.timeout {
            self.main_timeout(settings, timeout);
        }

        let redis = ["redis_url", "redis_sentinel", "redis_cluster"]
            .iter()
            .any(|id| self.own(id))
            || self.get(MAIN.url).is_some();
        self.redis_tls_files(settings, redis, parsed.tls == Some(true) || per_second_tls)?;
        for (id, flag) in [
            ("redis_url", "--redis-url"),
            ("redis_sentinel", "--redis-sentinel"),
            ("redis_cluster", "--redis-cluster"),
        ] {
            if self.own(id) {
                self.override_by(&MAIN.location(), flag);
                return Ok(());
            }
        }
        if self.get(MAIN.url).is_none() {
            for name in self.present(&MAIN.location()[1..]) {
                self.no_effect(name, "no REDIS_URL: the in-memory store is used");
            }
            return Ok(());
        }
        match self.target(&MAIN, &parsed)? {
            Target::Url(url) => settings.redis_url = Some(url),
            Target::Sentinel { url, master, nodes } => {
                settings.redis_url = Some(url);
                settings.redis_sentinel = Some(master);
                settings.redis_sentinel_nodes = nodes;
            }
            Target::Cluster(seeds) => settings.redis_cluster = seeds,
        }
        Ok(())
    }

    /// `REDIS_TIMEOUT`: the reference's one timeout for connecting and for every read and
    /// write (10 s by default). floodgate takes it as its connect timeout; its per-request
    /// deadline (10 ms, under Envoy's 20 ms RPC timeout) only ever gets shorter from it: a
    /// 10 s deadline per request would let a slow Redis hold every request for 10 s, long
    /// after Envoy gave up on it.
    fn main_timeout(&mut self, settings: &mut ServeSettings, timeout: Duration) {
        let name = MAIN.timeout;
        if timeout.is_zero() {
            self.no_effect(
                name,
                "0 means no timeout in the reference; floodgate keeps its deadlines",
            );
            return;
        }
        if self.own("redis_connect_timeout_ms") {
            self.override_by(&[name], "--redis-connect-timeout-ms");
            return;
        }
        settings.redis_connect_timeout_ms = timeout;
        if !self.own("redis_timeout_ms") && timeout < settings.redis_timeout_ms {
            settings.redis_timeout_ms = timeout;
        }
        let deadline = settings.redis_timeout_ms;
        self.applied(&format!(
            "{name} (connect timeout {timeout:?}; per-request deadline {deadline:?}, \
             see --redis-timeout-ms)"
        ));
    }

    /// `REDIS_PERSECOND=true` and the `REDIS_PERSECOND_*` variables → the
    /// `--redis-per-second-*` flags: one-second limits in their own Redis.
    pub(super) fn per_second(&mut self, settings: &mut ServeSettings) -> Result<(), SettingsError> {
        let enabled = self.parse_bool("REDIS_PERSECOND")?;
        let parsed = self.parse_redis(&PER_SECOND)?;
        let mut names = PER_SECOND.location().to_vec();
        names.extend([PER_SECOND.pool_size, PER_SECOND.timeout]);
        if [
            "redis_per_second_url",
            "redis_per_second_sentinel",
            "redis_per_second_cluster",
        ]
        .iter()
        .any(|id| self.own(id))
        {
            names.push("REDIS_PERSECOND");
            self.override_by(&names, "--redis-per-second-*");
            return Ok(());
        }
        if enabled != Some(true) {
            if enabled == Some(false) {
                self.applied("REDIS_PERSECOND");
            }
            for name in self.present(&names) {
                self.no_effect(name, "REDIS_PERSECOND is not true");
            }
            return Ok(());
        }
        if self.get(PER_SECOND.url).is_none() {
            return Err(bad(
                "REDIS_PERSECOND",
                "true",
                "REDIS_PERSECOND_URL with it (floodgate does not dial the reference's default \
                 unix socket)",
            ));
        }
        let main = settings.redis_url.is_some()
            || settings.redis_sentinel.is_some()
            || !settings.redis_cluster.is_empty();
        if !main {
            return Err(bad(
                "REDIS_PERSECOND",
                "true",
                "a main Redis too (REDIS_URL): without one the other limits would be counted \
                 per replica, in memory",
            ));
        }
        self.applied("REDIS_PERSECOND");
        let target = &mut settings.redis_per_second;
        if let Some(size) = parsed.pool_size {
            if self.own("redis_per_second_pool_size") {
                self.override_by(&[PER_SECOND.pool_size], "--redis-per-second-pool-size");
            } else {
                target.redis_per_second_pool_size = size;
                self.applied(PER_SECOND.pool_size);
            }
        }
        if let Some(timeout) = parsed.timeout {
            if timeout.is_zero() {
                self.no_effect(
                    PER_SECOND.timeout,
                    "0 means no timeout in the reference; floodgate keeps its deadlines",
                );
            } else if self.own("redis_per_second_connect_timeout_ms") {
                self.override_by(
                    &[PER_SECOND.timeout],
                    "--redis-per-second-connect-timeout-ms",
                );
            } else {
                target.redis_per_second_connect_timeout_ms = timeout;
                self.applied(&format!(
                    "{} (connect timeout {timeout:?}; the per-request deadline is \
                     --redis-timeout-ms, shared with the main Redis)",
                    PER_SECOND.timeout
                ));
            }
        }
        let location = self.target(&PER_SECOND, &parsed)?;
        let target = &mut settings.redis_per_second;
        match location {
            Target::Url(url) => target.redis_per_second_url = Some(url),
            Target::Sentinel { url, master, nodes } => {
                target.redis_per_second_url = Some(url);
                target.redis_per_second_sentinel = Some(master);
                target.redis_per_second_sentinel_nodes = nodes;
            }
            Target::Cluster(seeds) => target.redis_per_second_cluster = seeds,
        }
        Ok(())
    }

    /// Where the Redis of `vars` is, from its URL variable (which is set) and companions;
    /// reports the variables it used.
    fn target(&mut self, vars: &RedisVars, parsed: &Parsed) -> Result<Target, SettingsError> {
        let raw = self.get(vars.url).unwrap_or_default();
        let auth = self.auth(vars.auth);
        let tls = parsed.tls == Some(true);
        if parsed.kind != Some(RedisType::Sentinel) {
            for name in self.present(&[vars.sentinel_auth]) {
                self.no_effect(name, "only for REDIS_TYPE=sentinel");
            }
        }
        if parsed.kind == Some(RedisType::Cluster) {
            // The reference's form: host1:port,host2:port (full URLs accepted too).
            if parsed.socket == Some(Socket::Unix) {
                return Err(bad(
                    vars.socket,
                    "unix",
                    "tcp: Redis Cluster nodes are reached over TCP",
                ));
            }
            let seeds = raw
                .split(',')
                .map(str::trim)
                .filter(|seed| !seed.is_empty())
                .map(|seed| match seed.contains("://") {
                    true => Ok(seed.to_string()),
                    false => tcp_url(vars.url, seed, tls, auth),
                })
                .collect::<Result<Vec<_>, _>>()?;
            if seeds.is_empty() {
                return Err(bad(vars.url, raw, "host:port[,host:port...]"));
            }
            self.apply_present(&vars.location()[..5]);
            return Ok(Target::Cluster(seeds));
        }
        let raw = raw.trim();
        if parsed.kind == Some(RedisType::Sentinel) {
            if parsed.socket == Some(Socket::Unix) {
                return Err(bad(vars.socket, "unix", "tcp (REDIS_TYPE=sentinel)"));
            }
            return self.sentinel(vars, raw, tls);
        }
        if raw.contains("://") {
            // Already a URL: it says everything itself.
            for name in self.present(&[vars.socket, vars.auth, vars.tls]) {
                self.no_effect(name, "the Redis URL is a full URL");
            }
            self.applied(vars.url);
            if parsed.kind.is_some() {
                self.applied(vars.kind);
            }
            return Ok(Target::Url(raw.to_string()));
        }
        let socket = parsed.socket.unwrap_or(if raw.starts_with('/') {
            Socket::Unix
        } else {
            Socket::Tcp
        });
        let url = match socket {
            Socket::Tcp => tcp_url(vars.url, raw, tls, auth)?,
            Socket::Unix => {
                if tls {
                    self.no_effect(vars.tls, "no TLS over a unix socket");
                }
                let mut url = format!("redis+unix://{raw}");
                if let Some((user, password)) = auth {
                    url.push_str(&format!("?pass={}", encode(password)));
                    if let Some(user) = user {
                        url.push_str(&format!("&user={}", encode(user)));
                    }
                }
                url
            }
        };
        let used: Vec<&'static str> = vars.location()[..5]
            .iter()
            .copied()
            .filter(|name| !(socket == Socket::Unix && tls && *name == vars.tls))
            .collect();
        self.apply_present(&used);
        Ok(Target::Url(url))
    }

    /// Reports each of `names` that is set as applied.
    fn apply_present(&mut self, names: &[&'static str]) {
        for name in self.present(names) {
            self.applied(name);
        }
    }

    /// An `*_AUTH` variable as (user, password).
    fn auth(&self, name: &str) -> Option<(Option<&'a str>, &'a str)> {
        self.get(name).map(|a| match a.split_once(':') {
            Some((user, password)) => (Some(user), password),
            None => (None, a),
        })
    }

    /// `REDIS_TYPE=sentinel`: the URL variable is `<master name>,<sentinel host:port>[,…]`,
    /// as the reference reads it. `REDIS_AUTH` is the master's, `REDIS_SENTINEL_AUTH`
    /// (`password` or `user:password`) the sentinels'; `REDIS_TLS` applies to both, as the
    /// reference dials its sentinels with the master's TLS settings.
    fn sentinel(
        &mut self,
        vars: &RedisVars,
        raw: &str,
        tls: bool,
    ) -> Result<Target, SettingsError> {
        let sentinel_auth = userinfo(self.auth(vars.sentinel_auth));
        let scheme = if tls { "rediss" } else { "redis" };
        let mut parts = raw.split(',').map(str::trim);
        let master = parts.next().unwrap_or_default();
        let nodes: Vec<String> = parts
            .filter(|n| !n.is_empty())
            .map(|node| match node {
                n if n.contains("://") => n.to_string(),
                n if n.contains(':') => format!("{scheme}://{sentinel_auth}{n}"),
                n => format!("{scheme}://{sentinel_auth}{n}:26379"),
            })
            .collect();
        if master.is_empty() || master.contains(['/', ':', '@']) || nodes.is_empty() {
            return Err(bad(
                vars.url,
                raw,
                "<master name>,<sentinel host:port>[,<sentinel host:port>…] \
                 (REDIS_TYPE=sentinel)",
            ));
        }
        let url = format!("{scheme}://{}{master}", userinfo(self.auth(vars.auth)));
        self.apply_present(&vars.location());
        Ok(Target::Sentinel {
            url,
            master: master.to_string(),
            nodes,
        })
    }

    /// `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY` →
    /// `--redis-tls-ca-file`, `--redis-tls-cert-file`, `--redis-tls-key-file`; the reference
    /// reads them only when a Redis uses TLS, and so does floodgate.
    fn redis_tls_files(
        &mut self,
        settings: &mut ServeSettings,
        redis: bool,
        tls: bool,
    ) -> Result<(), SettingsError> {
        match self.parse_bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")? {
            Some(true) => self.no_effect(
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
                "floodgate always verifies the Redis host name: give the server certificate \
                 the name or IP address floodgate connects to",
            ),
            // What floodgate always does.
            Some(false) => self.applied("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"),
            None => {}
        }
        for (name, id, flag) in [
            (
                "REDIS_TLS_CACERT",
                "redis_tls_ca_file",
                "--redis-tls-ca-file",
            ),
            (
                "REDIS_TLS_CLIENT_CERT",
                "redis_tls_cert_file",
                "--redis-tls-cert-file",
            ),
            (
                "REDIS_TLS_CLIENT_KEY",
                "redis_tls_key_file",
                "--redis-tls-key-file",
            ),
        ] {
            let Some(path) = self.get(name) else { continue };
            if self.own(id) {
                self.override_by(&[name], flag);
            } else if !redis {
                self.no_effect(name, "no REDIS_URL: the in-memory store is used");
            } else if !tls {
                self.no_effect(name, "REDIS_TLS is not true (the reference ignores it too)");
            } else {
                let slot = match id {
                    "redis_tls_ca_file" => &mut settings.redis_tls_ca_file,
                    "redis_tls_cert_file" => &mut settings.redis_tls_cert_file,
                    _ => &mut settings.redis_tls_key_file,
                };
                *slot = Some(std::path::PathBuf::from(path));
                self.applied(name);
            }
        }
        Ok(())
    }
}

/// The URL of a TCP `host[:port]` (port 6379 by default), with TLS and `*_AUTH`
/// (`password` or `user:password`); `name` is the URL variable, for errors.
fn tcp_url(
    name: &'static str,
    address: &str,
    tls: bool,
    auth: Option<(Option<&str>, &str)>,
) -> Result<String, SettingsError> {
    if address.is_empty() || address.contains('/') {
        return Err(bad(name, address, "host:port (REDIS_SOCKET_TYPE=tcp)"));
    }
    let scheme = if tls { "rediss" } else { "redis" };
    let address = if address.contains(':') {
        address.to_string()
    } else {
        format!("{address}:6379")
    };
    Ok(format!("{scheme}://{}{address}", userinfo(auth)))
}

/// `user:password@` for a URL (each percent-encoded), or nothing without credentials.
fn userinfo(auth: Option<(Option<&str>, &str)>) -> String {
    match auth {
        Some((user, password)) => format!(
            "{}:{}@",
            user.map(encode).unwrap_or_default(),
            encode(password)
        ),
        None => String::new(),
    }
}
