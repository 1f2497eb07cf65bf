//! The store's connections lent to another service that keeps its own state in the same
//! Redis (the RLQS share tables, `crate::rlqs`): [`RedisStore::run_script`] and
//! `ClusterStore::run_script` run a caller's script through the topology the store reaches
//! (one server, the master the sentinels name, or a cluster's slot owner), with its TLS,
//! credentials, deadline and error handling, so that service has no second copy of them.
//!
//! Not for the request path: the store's own script has its faster call ([`super::script`]).

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, ServerErrorKind};

use super::{RedisStore, classify_on};
use crate::store::StoreError;

/// A Lua script of another service, with its SHA1 computed once.
#[derive(Clone, Debug)]
pub struct Script {
    source: &'static str,
    sha: String,
}

impl Script {
    /// The script of `source`.
    pub fn new(source: &'static str) -> Script {
        Script {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// Runs `script` with `keys` and `args` on `conn`: `EVALSHA`, and on `NOSCRIPT` (a restart,
/// a failover, a node added) the same call as `EVAL` with the source, which also caches it
/// there. Keyed like any command, so a cluster routes both to the keys' slot.
pub(super) async fn eval<T: FromRedisValue>(
    conn: &mut impl ConnectionLike,
    script: &Script,
    keys: &[String],
    args: &[String],
) -> RedisResult<T> {
    let call = |verb: &str, body: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    };
    let evalsha: Cmd = call("EVALSHA", &script.sha);
    match evalsha.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            call("EVAL", script.source).query_async(conn).await
        }
        reply => reply,
    }
}

impl RedisStore {
    /// Runs `script` with `keys` and `args` on one of this store's connections, within its
    /// command timeout: a transport failure or `READONLY` retires the connection, so under
    /// Sentinel the next call reaches the master named after a failover.
    pub async fn run_script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, StoreError> {
        self.on_connection(|lent| async move {
            let mut conn = lent.conn.clone();
            eval(&mut conn, script, keys, args)
                .await
                .map_err(|e| classify_on(&lent, e))
        })
        .await
    }
}
