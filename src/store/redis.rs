//! The Redis store: every bucket of a request applied by one Lua script in one round trip.
//!
//! [`apply`] describes a call of the script (`lua/apply.lua`) as data; [`script`] sends it
//! and decodes the reply; [`cluster`] runs it on a Redis Cluster, once per hash slot a
//! request touches. [`RedisStore`] runs it with `EVALSHA` over a bb8 pool of connections of
//! floodgate's own ([`wire`]: each carries many calls at once, a call encoded straight into
//! the connection's buffer and its reply decoded from the bytes read); [`script::call`] loads
//! the script on `NOSCRIPT` (Redis restart, failover, `SCRIPT FLUSH`) and sends it again.
//! The pool connects to one server (a URL) or to the master a set of sentinels names
//! ([`sentinel`]), over TLS when the URL says `rediss://` (files from [`tls`]). Each thread
//! that calls the store has a pool of its own, so a connection's I/O runs on the thread of
//! the requests it carries. Each call has one deadline (`command_timeout`) covering
//! connection checkout and the script, so a slow or absent Redis costs at most that much per
//! request — and the circuit breaker in [`crate::store::resilient`] stops even that once
//! Redis is known to be down.
//!
//! The pools and their manager are in [`pool`].

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::{Client, RedisError, TlsCertificates};
use tokio::sync::watch;

use self::errors::{classify, retires_connection};
use self::pool::{ConnectFailures, Connector, Target, ThreadPools};
use self::redact::{redact_in, redact_url};
use self::script::Action;
use super::{RemoteStore, Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp};
use crate::clock::Clock;

pub mod apply;
pub mod cluster;
mod errors;
pub mod pool;
pub mod redact;
pub mod script;
pub mod sentinel;
pub mod shared;
pub mod tls;
pub mod wire;

pub use pool::PoolCounts;
pub use sentinel::SentinelSettings;
pub use tls::RedisTls;

/// How to reach Redis.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` for TLS. With `sentinel`,
    /// the master's scheme, credentials and database: `redis[s]://[user:password@]<master
    /// name>[/db]` (see [`sentinel`]).
    pub url: String,
    /// Find the master through these sentinels instead of connecting to `url`'s address.
    pub sentinel: Option<SentinelSettings>,
    /// CA and client certificate files for TLS connections.
    pub tls: RedisTls,
    /// Prepended to every bucket key.
    pub key_prefix: String,
    /// Multiplexed connections in the pool (each carries many requests at once).
    pub pool_size: u32,
    /// Deadline to establish a connection.
    pub connect_timeout: Duration,
    /// Deadline for one request's whole store call (checkout + script).
    pub command_timeout: Duration,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("sentinel", &self.sentinel)
            .field("tls", &self.tls)
            .field("key_prefix", &self.key_prefix)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

/// A connection handle for one call: the connection (cheap to clone; many calls share it
/// concurrently) and its pooled connection's broken flag.
#[derive(Clone)]
struct Lent {
    conn: wire::Conn,
    broken: Arc<AtomicBool>,
    /// The call's timeout, which its deadline error names ([`classify_on`]).
    timeout: Duration,
}

thread_local! {
    /// The connection each store last lent this thread, reused by its next calls on this
    /// thread without a pool checkout (see [`Reused`]).
    static REUSED: RefCell<Vec<Reused>> = const { RefCell::new(Vec::new()) };
}

/// How long a thread reuses the connection a checkout lent it before asking its pool again.
///
/// A checkout costs more than the rest of the call's own client work: the thread's pool found
/// under a lock shared by every thread, the connect-failure watch cloned (a reference count
/// every thread shares), bb8's lock, clock reads and statistics, and the same again when the
/// guard is returned. Each thread multiplexes its calls over one connection anyway (the
/// pool's LIFO queue lends the most recently used), so the checkout only ever answers "the
/// same connection as before". Asking once a second still lets the pool do its work: a
/// connection it retired by age or idleness stops being used within a second, and one found
/// broken is never reused (its flag is read on every call).
const REUSE_FOR: Duration = Duration::from_secs(1);

/// A thread's reusable connection for one store.
struct Reused {
    /// Which store lent it ([`RedisStore::id`]).
    store: u64,
    /// Dead once the store is dropped: the entry is then removed, closing its connection.
    alive: Weak<()>,
    /// The connection and its broken flag.
    lent: Lent,
    /// When the pool must be asked again.
    until: Instant,
}

/// Numbers the stores, to tell their entries apart in a thread's [`REUSED`] list.
static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(0);

/// Buckets in Redis.
pub struct RedisStore {
    /// Multiplexed connections, a pool per calling thread; broken ones are replaced on return.
    pools: ThreadPools,
    /// This store's entry in each thread's [`REUSED`] list.
    id: u64,
    /// Lives as long as the store: threads drop their reused connection once it is gone.
    alive: Arc<()>,
    /// The last connect failure, published as it happens.
    connect_failures: watch::Receiver<String>,
    /// Key prefix bytes.
    prefix: Vec<u8>,
    /// Deadline per store call.
    command_timeout: Duration,
    /// The pool's size: how many broken connections a checkout may have to skip.
    pool_size: u32,
    /// Connections opened and closed.
    counts: Arc<PoolCounts>,
    /// Tests only: a clock whose time is passed to the script instead of Redis `TIME`.
    test_clock: Option<Arc<dyn Clock>>,
}

impl RedisStore {
    /// A store for `settings`. Connects in the background: a Redis that is down at start-up
    /// is an outage like any other, handled by the failure policy, not a start-up failure.
    /// Fails (before anything is contacted) on a setting an operator must fix: a malformed
    /// URL, an unreadable TLS file, inconsistent Sentinel settings.
    pub fn new(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        let certs =
            tls::certificates(&settings.tls).map_err(|e| StoreError::Failed(e.to_string()))?;
        let tls_config =
            tls::client_config(&settings.tls).map_err(|e| StoreError::Failed(e.to_string()))?;
        let target = match &settings.sentinel {
            None => Target::Standalone(open(&settings.url, certs)?),
            Some(sentinel) => Target::Sentinel(
                sentinel::Master::new(sentinel, &settings.url, certs.as_ref())
                    .map_err(StoreError::Failed)?,
            ),
        };
        // No timeout of the connection's own per call: every call already has the store's
        // deadline (`RedisStore::on_connection`). The connect timeout covers a new
        // connection's setup commands (AUTH, SELECT).
        let (failures, connect_failures) = watch::channel(String::new());
        let counts = Arc::new(PoolCounts::default());
        let connector = Connector {
            target: Arc::new(target),
            tls: tls_config,
            connect_timeout: settings.connect_timeout,
            counts: Arc::clone(&counts),
        };
        Ok(RedisStore {
            pools: ThreadPools::new(
                connector,
                ConnectFailures(Arc::new(failures)),
                settings.pool_size.max(1),
                settings.connect_timeout,
            ),
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            connect_failures,
            prefix: settings.key_prefix.clone().into_bytes(),
            command_timeout: settings.command_timeout,
            pool_size: settings.pool_size.max(1),
            counts,
            test_clock: None,
        })
    }

    /// Connections this store's pool opened and closed so far.
    pub fn pool_counts(&self) -> Arc<PoolCounts> {
        Arc::clone(&self.counts)
    }

    /// For tests only: evaluate at `clock`'s time instead of Redis `TIME`, so one behaviour
    /// suite can drive this store and the memory store with the same manual clock. Never use
    /// it in production: replicas would disagree on time.
    pub fn with_test_clock(mut self, clock: Arc<dyn Clock>) -> RedisStore {
        self.test_clock = Some(clock);
        self
    }

    /// A handle on a live connection: the one this thread was lent last, while it is neither
    /// broken, closed nor older than [`REUSE_FOR`], else a new checkout
    /// ([`Self::check_out_live`]).
    async fn lend(&self) -> Result<Lent, StoreError> {
        let reused = REUSED.with_borrow_mut(|kept| {
            let at = kept.iter().position(|entry| entry.store == self.id)?;
            let entry = &kept[at];
            if entry.lent.broken.load(Ordering::Relaxed)
                || entry.lent.conn.is_closed()
                || Instant::now() >= entry.until
            {
                kept.swap_remove(at);
                return None;
            }
            Some(entry.lent.clone())
        });
        if let Some(lent) = reused {
            return Ok(lent);
        }
        let lent = self.check_out_live().await?;
        let until = Instant::now() + REUSE_FOR;
        REUSED.with_borrow_mut(|kept| {
            // Entries of dropped stores go here, with their connections.
            kept.retain(|entry| entry.store != self.id && entry.alive.strong_count() > 0);
            kept.push(Reused {
                store: self.id,
                alive: Arc::downgrade(&self.alive),
                lent: lent.clone(),
                until,
            });
        });
        Ok(lent)
    }

    /// A handle on a live pooled connection, with the pool's guard already returned: bb8
    /// lends connections exclusively, but a multiplexed connection carries many concurrent
    /// calls, so holding the guard across a call would cap in-flight calls at the pool size.
    /// A connection found broken is handed back (bb8 then discards it) and another is taken.
    async fn check_out_live(&self) -> Result<Lent, StoreError> {
        // Bounded by the configured size, not `pool.state()`, which takes the pool's lock.
        for _ in 0..=self.pool_size {
            let pooled = self.checkout().await?;
            // Closed: Redis closed it while it sat idle (a restart, its `timeout`).
            if pooled.broken.load(Ordering::Relaxed) || pooled.inner.is_closed() {
                continue;
            }
            return Ok(Lent {
                conn: pooled.inner.clone(),
                broken: pooled.broken.clone(),
                timeout: self.command_timeout,
            });
        }
        Err(StoreError::Unavailable(
            "every pooled Redis connection is broken".into(),
        ))
    }

    async fn checkout(&self) -> Result<bb8::PooledConnection<'static, Connector>, StoreError> {
        let mut failures = self.connect_failures.clone();
        failures.mark_unchanged();
        let pool = self.pools.current();
        tokio::select! {
            conn = pool.get_owned() => conn.map_err(|e| match e {
                bb8::RunError::User(e) => {
                    StoreError::Unavailable(format!("cannot connect to Redis: {e}"))
                }
                bb8::RunError::TimedOut => {
                    StoreError::Unavailable("no Redis connection available in time".into())
                }
            }),
            Ok(()) = failures.changed() => Err(StoreError::Unavailable(format!(
                "cannot connect to Redis: {}",
                *failures.borrow()
            ))),
        }
    }

    /// Runs `work` on a lent connection within the command timeout: the call's one deadline,
    /// checkout included. A call that runs out of time retires the connection it was on, as
    /// a transport failure does: a connection that stopped answering (a peer gone without a
    /// reset, a network partition) is not lent again, and its replacement is looked up anew
    /// (through the sentinels, or the name resolved again).
    ///
    /// The deadline is the connection's to keep ([`wire::Conn::until`]: one timer for all its
    /// calls) once the connection is lent; only a checkout that has to wait for the pool
    /// waits on a timer of its own (a lend from the thread's reused connection is ready at
    /// once, and the timer is then never registered).
    async fn on_connection<T, Fut>(&self, work: impl FnOnce(Lent) -> Fut) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let deadline = tokio::time::Instant::now() + self.command_timeout;
        let mut lent = tokio::time::timeout_at(deadline, self.lend())
            .await
            .unwrap_or_else(|_| Err(late(self.command_timeout)))?;
        lent.conn.until(deadline);
        work(lent).await
    }
}

impl RedisStore {
    /// Runs the script for `ops` doing `action`, on a lent connection within the command
    /// timeout.
    async fn run(&self, ops: &[BucketOp], action: Action) -> Result<Applied, StoreError> {
        let now = self.test_clock.as_ref().map(|clock| clock.now_us());
        let prefix = &self.prefix;
        self.on_connection(|lent| async move {
            let reply = script::call_doing(&lent.conn, prefix, ops, now, action).await;
            let reply = reply.map_err(|e| classify_on(&lent, e))?;
            script::decode(script::payload(&reply), ops.len())
        })
        .await
    }
}

/// A client for the server at `url`, with `certs` for its TLS connections.
fn open(url: &str, certs: Option<TlsCertificates>) -> Result<Client, StoreError> {
    let client = match certs {
        None => Client::open(url),
        Some(certs) => Client::build_with_tls(url, certs),
    };
    // redis-rs may quote the URL, or the part it choked on, in its error.
    client.map_err(|e| {
        StoreError::Failed(redact_in(
            &format!("invalid Redis URL {}: {e}", redact_url(url)),
            url,
        ))
    })
}

/// The key the probe writes, after the prefix: it cannot collide with a bucket key (those
/// start with an encoded domain and hold `|`, see [`crate::bucket`]).
pub const PROBE_KEY: &[u8] = b"probe";

/// The probe key's lifetime: it never accumulates.
pub(crate) const PROBE_KEY_TTL_MS: u64 = 1_000;

/// Runs `work` within `timeout`; running out of time is an outage ([`StoreError::Unavailable`]).
async fn deadline<T>(
    timeout: Duration,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(late(timeout)))
}

/// The error of a call that ran out of its `timeout`: an outage.
fn late(timeout: Duration) -> StoreError {
    StoreError::Unavailable(format!("Redis did not answer within {timeout:?}"))
}

/// [`classify`], and retire the pooled connection (the pool replaces it) when the error says
/// it is unusable ([`retires_connection`]). A call whose deadline passed is the outage
/// [`late`] names, and retires its connection too.
fn classify_on(conn: &Lent, error: RedisError) -> StoreError {
    if wire::is_late(&error) {
        conn.broken.store(true, Ordering::Relaxed);
        return late(conn.timeout);
    }
    if retires_connection(&error) {
        conn.broken.store(true, Ordering::Relaxed);
    }
    classify(&error)
}

#[async_trait]
impl Store for RedisStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        self.run(ops, Action::Apply).await
    }

    /// One script call with the set flag on every op: each bucket read and replaced in one
    /// atomic step, so nothing lands between.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        self.run(ops, Action::Set).await
    }

    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        script::full_key(&self.prefix, key)
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

#[async_trait]
impl RemoteStore for RedisStore {
    /// Runs the script with no bucket, then writes one short-lived key under the prefix:
    /// what a request needs (see [`RemoteStore::probe`]). The script alone writes nothing
    /// without buckets, so a Redis at `maxmemory` under `noeviction`, or an ACL user that
    /// may not touch the prefix, would pass it while failing every request.
    async fn probe(&self) -> Result<(), StoreError> {
        self.apply(&[]).await?;
        let mut key = self.prefix.clone();
        key.extend_from_slice(PROBE_KEY);
        self.on_connection(|lent| async move {
            let mut conn = lent.conn.clone();
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("PX")
                .arg(PROBE_KEY_TTL_MS)
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| classify_on(&lent, e))
        })
        .await
    }
}

#[cfg(test)]
mod tests;
