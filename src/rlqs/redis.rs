//! The share tables in Redis, for replicas sharing one (standalone) Redis: one hash per
//! bucket, settled by one script call (`lua/rlqs_share.lua`, the twin of
//! [`super::share::settle`]) on Redis's clock, so every replica's holders count against the
//! same rate.
//!
//! Its own multiplexed connection, not the rate-limit store's pool: share settles come once
//! per bucket per reporting interval (seconds), not per request, and keeping them apart
//! means a report never waits behind the request path, nor the other way round. A broken
//! connection is dropped and opened again on the next call.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use tokio::sync::Mutex;

use super::share::{Ask, ShareError, Shares};
use crate::store::redis::redact::{redact_in, redact_url};

/// The script (see its header for KEYS, ARGV and the reply).
pub const SCRIPT: &str = include_str!("../../lua/rlqs_share.lua");

/// Share tables in one Redis.
pub struct RedisShares {
    client: redis::Client,
    /// The URL, to redact from errors.
    url: String,
    /// The connection in use; `None` until the first call and after a failure.
    connection: Mutex<Option<MultiplexedConnection>>,
    script: redis::Script,
    /// The configured key prefix, then `rlqs:`.
    prefix: String,
    /// The bound of one call, connecting included.
    timeout: Duration,
}

impl RedisShares {
    /// Tables in the Redis at `url`, under `key_prefix`; each call bounded by `timeout`.
    /// Fails on a URL that is not one (nothing is contacted yet).
    pub fn new(url: &str, key_prefix: &str, timeout: Duration) -> Result<RedisShares, ShareError> {
        let client = redis::Client::open(url).map_err(|e| {
            ShareError(redact_in(
                &format!("invalid Redis URL {}: {e}", redact_url(url)),
                url,
            ))
        })?;
        Ok(RedisShares {
            client,
            url: url.to_owned(),
            connection: Mutex::new(None),
            script: redis::Script::new(SCRIPT),
            prefix: format!("{key_prefix}rlqs:"),
            timeout,
        })
    }

    async fn call(&self, bucket: &str, args: &[String]) -> Result<u64, ShareError> {
        let key = format!("{}{bucket}", self.prefix);
        let run = async {
            let mut connection = {
                let mut held = self.connection.lock().await;
                match &*held {
                    Some(connection) => connection.clone(),
                    None => {
                        let connection = self.client.get_multiplexed_async_connection().await?;
                        *held = Some(connection.clone());
                        connection
                    }
                }
            };
            let mut invocation = self.script.key(key);
            for arg in args {
                invocation.arg(arg);
            }
            invocation.invoke_async::<u64>(&mut connection).await
        };
        match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(grant)) => Ok(grant),
            Ok(Err(e)) => {
                *self.connection.lock().await = None;
                Err(ShareError(redact_in(&format!("Redis: {e}"), &self.url)))
            }
            Err(_) => {
                *self.connection.lock().await = None;
                Err(ShareError(format!(
                    "Redis: no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }
}

#[async_trait]
impl Shares for RedisShares {
    async fn settle(&self, bucket: &str, holder: &str, ask: Ask) -> Result<u64, ShareError> {
        let demand = match ask.demand {
            Some(demand) => demand.min(ask.capacity).to_string(),
            None => "-1".to_owned(),
        };
        self.call(
            bucket,
            &[
                holder.to_owned(),
                "settle".to_owned(),
                ask.capacity.to_string(),
                demand,
                ask.life_us.max(1).to_string(),
            ],
        )
        .await
    }

    async fn release(&self, bucket: &str, holder: &str) -> Result<(), ShareError> {
        self.call(bucket, &[holder.to_owned(), "release".to_owned()])
            .await
            .map(|_| ())
    }
}
