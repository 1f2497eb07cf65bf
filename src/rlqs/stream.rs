//! One RLQS stream: its domain, its subscriptions, and the loop that answers its reports,
//! abandons its idle buckets, re-assigns them when the limits change, re-evaluates the
//! shares of the buckets it has not reported lately (so a newcomer to a bucket is served
//! without waiting for the others' reports), and expires them at shutdown.
//!
//! One timer per stream drives the periodic work; a re-evaluation is one batched share
//! call per stream ([`super::Shares::reassess`]), never one per bucket. What a stream reads
//! from a report and writes back is in `message`; why it ends with an error, in `error`.

mod error;
mod message;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

pub use error::StreamError;
pub use message::{MAX_BUCKET_ENTRIES, row_life};
use message::{action, ask, bucket_id, demand, entries, row_life_duration};

use super::ids::{BucketKey, Subscribed};
use super::metrics::{Reassessed, Sent};
use super::quota::{Quota, SharedLimit, blanket, quota, strategy};
use super::{Rlqs, StreamSlot};
use crate::config::Config;
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::AbandonAction;
use crate::proto::rlqs::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports, rate_limit_quota_response,
};
use crate::proto::types::{RateLimitStrategy, rate_limit_strategy::BlanketRule};

/// One bucket a stream subscribes to.
struct Subscription {
    /// The id (echoed in every action), shared with every other holder, and its place in the
    /// replica's bound.
    _held: Subscribed,
    /// Its quota under `config`.
    quota: Quota,
    /// The limits the quota was computed under.
    config: Arc<Config>,
    /// The last strategy sent, to expire at shutdown.
    sent: Option<RateLimitStrategy>,
    /// When a report last counted a request (or the subscription began).
    last_traffic: Instant,
    /// When its share was last settled and sent: a report, a re-assignment, or a
    /// re-evaluation that changed it.
    settled: Instant,
}

/// The state of one stream.
struct Stream {
    rlqs: Arc<Rlqs>,
    /// This stream's name in share tables: the replica's id and the stream's number.
    holder: String,
    /// The peer whose share of the subscription bound its subscriptions take.
    peer: Option<IpAddr>,
    /// The domain from the first message.
    domain: Option<String>,
    /// Subscriptions by their id.
    buckets: HashMap<Arc<BucketKey>, Subscription>,
    /// When the shares were last re-evaluated.
    reassessed: Instant,
}

/// Serves one stream until the client ends it, sends something invalid, or the server
/// shuts down; the response messages (and a final error) go to `out`.
pub(super) async fn serve(
    rlqs: Arc<Rlqs>,
    slot: StreamSlot,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    out: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut stream = Stream {
        holder: format!("{}/{}", rlqs.replica, slot.number),
        peer: slot.peer,
        rlqs,
        domain: None,
        buckets: HashMap::new(),
        reassessed: Instant::now(),
    };
    let mut tick = tokio::time::interval(stream.rlqs.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A stream that reports nothing holds a slot for nothing: Envoy reports every bucket at
    // least every 5 s, and opens its stream with a report.
    let report_timeout = stream.rlqs.settings.report_timeout;
    let silent = tokio::time::sleep(report_timeout);
    tokio::pin!(silent);
    let ended: Result<End, StreamError> = loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(reports)) => match stream.report(reports).await {
                    Ok(actions) => {
                        silent.as_mut().reset(Instant::now() + report_timeout);
                        if !send(&out, actions).await {
                            break Ok(End::Closed);
                        }
                    }
                    Err(e) => break Err(e),
                },
                // Bytes that are not a report (the codec says INVALID_ARGUMENT): say so.
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    break Err(StreamError::Invalid(status.message().to_owned()));
                }
                // A message past the size bound (tonic's codec says OUT_OF_RANGE, or
                // RESOURCE_EXHAUSTED once decompressed): an error, never a clean end.
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
                    ) =>
                {
                    break Err(StreamError::TooLarge(status.message().to_owned()));
                }
                // The client closed its side, or the connection is gone.
                Ok(None) | Err(_) => break Ok(End::Closed),
            },
            () = &mut silent => break Err(StreamError::Silent(report_timeout)),
            _ = tick.tick() => match stream.tick().await {
                Ok(actions) => {
                    if !send(&out, actions).await {
                        break Ok(End::Closed);
                    }
                }
                Err(e) => break Err(e),
            },
            () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => {
                // Envoy applies its expired_assignment_behavior at once, rather than
                // enforcing a share the other replicas no longer count.
                let actions = stream.expire_all();
                send(&out, actions).await;
                break Ok(End::Expired);
            }
        }
    };
    let expired = matches!(ended, Ok(End::Expired));
    if let Err(e) = ended {
        stream.rlqs.metrics.refused(e.reason());
        tracing::debug!(error = %e, "RLQS stream refused");
        let _ = out.send(Err(Status::from(e))).await;
    }
    // The stream is over for the client and its slot free; its rows may have to wait.
    drop(out);
    drop(inbound);
    drop(slot);
    if !expired {
        stream.linger().await;
    }
    stream.release_all().await;
}

/// How a stream ended without an error.
enum End {
    /// The client closed its side, reset the stream, or the connection is gone: Envoy keeps
    /// enforcing what it was sent until it expires.
    Closed,
    /// At shutdown, after every assignment was sent again with a time to live of 0.
    Expired,
}

/// Sends `actions` as one response (none when empty); false once the client is gone.
async fn send(
    out: &mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    actions: Vec<BucketAction>,
) -> bool {
    if actions.is_empty() {
        return true;
    }
    out.send(Ok(RateLimitQuotaResponse {
        bucket_action: actions,
    }))
    .await
    .is_ok()
}

impl Stream {
    /// Answers one message: every bucket it reports gets its current assignment.
    async fn report(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, StreamError> {
        match (&self.domain, reports.domain.as_str()) {
            (None, "") => {
                return Err(StreamError::Invalid(
                    "the first message of an RLQS stream must name its domain".into(),
                ));
            }
            (None, domain) => self.domain = Some(domain.to_owned()),
            (Some(_), "") => {}
            (Some(domain), other) if domain != other => {
                return Err(StreamError::Invalid(format!(
                    "this stream's domain is '{domain}', not '{other}': open a new stream \
                     for another domain"
                )));
            }
            (Some(_), _) => {}
        }
        let domain = self.domain.clone().unwrap_or_default();
        let mut actions = Vec::with_capacity(reports.bucket_quota_usages.len());
        for (index, usage) in reports.bucket_quota_usages.into_iter().enumerate() {
            let key = BucketKey {
                domain: domain.clone(),
                entries: entries(&usage, index)?,
            };
            let demand_known = usage.time_elapsed.is_some();
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            if !self.buckets.contains_key(&key) {
                let max = self.rlqs.settings.max_buckets_per_stream as usize;
                if self.buckets.len() >= max {
                    return Err(StreamError::TooManyBuckets(self.buckets.len()));
                }
                self.subscribe(key.clone())?;
            }
            let Some(subscription) = self.buckets.get_mut(&key) else {
                continue;
            };
            if requests > 0 {
                subscription.last_traffic = Instant::now();
            }
            let demand = match (&subscription.quota, demand_known) {
                (Quota::Shared(limit), true) => demand(limit, requests, usage.time_elapsed),
                _ => None,
            };
            actions.push(self.assign(&key, demand).await?);
        }
        Ok(actions)
    }

    /// Starts tracking a bucket, within the replica's bound.
    fn subscribe(&mut self, key: BucketKey) -> Result<(), StreamError> {
        let held = self.rlqs.ids.subscribe(key, self.peer)?;
        let config = self.rlqs.config();
        let key = Arc::clone(held.key());
        let quota = quota(&config, &key.domain, &key.entries);
        if let Quota::Shared(limit) = &quota {
            self.rlqs.metrics.holders(&key.domain, &limit.rule, 1);
        }
        self.rlqs.metrics.buckets(1);
        self.buckets.insert(
            key,
            Subscription {
                _held: held,
                quota,
                config,
                sent: None,
                last_traffic: Instant::now(),
                settled: Instant::now(),
            },
        );
        Ok(())
    }

    /// The assignment of one subscribed bucket now, its quota recomputed if the limits
    /// changed; `demand` (tokens per period) when a report just measured it.
    async fn assign(
        &mut self,
        key: &BucketKey,
        demand: Option<u64>,
    ) -> Result<BucketAction, StreamError> {
        let current = self.rlqs.config();
        let domain = key.domain.as_str();
        let ttl = self.rlqs.settings.assignment_ttl;
        let Some(subscription) = self.buckets.get_mut(key) else {
            return Err(StreamError::Invalid("bucket not subscribed".into()));
        };
        if !Arc::ptr_eq(&subscription.config, &current) {
            let quota = quota(&current, domain, &key.entries);
            if quota != subscription.quota {
                if let Quota::Shared(old) = &subscription.quota {
                    self.rlqs.shares.release(&old.table, &self.holder).await?;
                    self.rlqs.metrics.holders(domain, &old.rule, -1);
                }
                if let Quota::Shared(new) = &quota {
                    self.rlqs.metrics.holders(domain, &new.rule, 1);
                }
                subscription.quota = quota;
            }
            subscription.config = current;
        }
        let (strategy, sent) = match &subscription.quota {
            Quota::Allow => (blanket(BlanketRule::AllowAll), Sent::AllowAll),
            Quota::Deny => (blanket(BlanketRule::DenyAll), Sent::DenyAll),
            Quota::Shared(limit) => {
                let grant = self
                    .rlqs
                    .shares
                    .settle(&limit.table, &self.holder, ask(limit, demand, ttl))
                    .await?;
                let sent = if grant == 0 {
                    Sent::DenyAll
                } else {
                    Sent::TokenBucket
                };
                (strategy(limit, grant), sent)
            }
        };
        self.rlqs.metrics.sent(sent);
        subscription.sent = Some(strategy.clone());
        subscription.settled = Instant::now();
        // Every strategy lasts the same time: a share no longer than its row, and a blanket
        // rule (nobody shares it) alike, so a reload reaches every Envoy within that time.
        Ok(action(bucket_id(&key.entries), strategy, Some(ttl)))
    }

    /// Periodic work: abandon buckets without traffic; re-assign every bucket whose quota
    /// the limits in force changed.
    async fn tick(&mut self) -> Result<Vec<BucketAction>, StreamError> {
        let abandon_after = self.rlqs.settings.abandon_after;
        let idle: Vec<Arc<BucketKey>> = self
            .buckets
            .iter()
            .filter(|(_, sub)| sub.last_traffic.elapsed() >= abandon_after)
            .map(|(key, _)| Arc::clone(key))
            .collect();
        let mut actions = Vec::new();
        for key in idle {
            if self.remove(&key).await?.is_some() {
                self.rlqs.metrics.abandoned();
                actions.push(BucketAction {
                    bucket_id: Some(bucket_id(&key.entries)),
                    bucket_action: Some(
                        rate_limit_quota_response::bucket_action::BucketAction::AbandonAction(
                            AbandonAction {},
                        ),
                    ),
                });
            }
        }
        let current = self.rlqs.config();
        let changed: Vec<Arc<BucketKey>> = self
            .buckets
            .iter()
            .filter(|(key, sub)| {
                !Arc::ptr_eq(&sub.config, &current)
                    && quota(&current, &key.domain, &key.entries) != sub.quota
            })
            .map(|(key, _)| Arc::clone(key))
            .collect();
        for key in changed {
            actions.push(self.assign(&key, None).await?);
        }
        // Timer ticks land a little after their instant: half a tick of slack keeps the
        // re-evaluations on every interval rather than every other one.
        let interval = self.rlqs.settings.reassess_interval;
        if self.reassessed.elapsed() + self.rlqs.tick() / 2 >= interval {
            self.reassessed = Instant::now();
            actions.extend(self.reassess(interval).await);
        }
        Ok(actions)
    }

    /// Re-evaluates the share of every shared bucket not settled within `interval`, in one
    /// batch, and returns an assignment for each whose grant changed: a holder over its fair
    /// target shrinks to it (a newcomer reported demand), one under it grows into what the
    /// others left. The sum of the grants stays within the limit as at a report. A table
    /// that cannot be reached skips this round: the next report meets the same error and
    /// ends the stream.
    async fn reassess(&mut self, interval: Duration) -> Vec<BucketAction> {
        let due: Vec<(Arc<BucketKey>, SharedLimit)> = self
            .buckets
            .iter()
            .filter(|(_, sub)| sub.settled.elapsed() >= interval)
            .filter_map(|(key, sub)| match &sub.quota {
                Quota::Shared(limit) => Some((Arc::clone(key), limit.clone())),
                Quota::Allow | Quota::Deny => None,
            })
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        let ttl = self.rlqs.settings.assignment_ttl;
        let tables: Vec<(String, u64)> = due
            .iter()
            .map(|(_, limit)| (limit.table.clone(), limit.capacity))
            .collect();
        let grants = match self
            .rlqs
            .shares
            .reassess(&self.holder, &tables, row_life(ttl))
            .await
        {
            Ok(grants) => grants,
            Err(e) => {
                self.rlqs.metrics.reassessed(Reassessed::Failed, due.len());
                tracing::debug!(error = %e, "RLQS shares not re-evaluated");
                return Vec::new();
            }
        };
        let mut actions = Vec::new();
        for ((key, limit), grant) in due.iter().zip(grants) {
            let (Some(grant), Some(subscription)) = (grant, self.buckets.get_mut(key)) else {
                self.rlqs.metrics.reassessed(Reassessed::Unchanged, 1);
                continue;
            };
            self.rlqs.metrics.reassessed(Reassessed::Changed, 1);
            let strategy = strategy(limit, grant);
            self.rlqs.metrics.sent(match grant {
                0 => Sent::DenyAll,
                _ => Sent::TokenBucket,
            });
            subscription.sent = Some(strategy.clone());
            subscription.settled = Instant::now();
            actions.push(action(bucket_id(&key.entries), strategy, Some(ttl)));
        }
        actions
    }

    /// The last strategy of every bucket with a time to live of 0.
    fn expire_all(&mut self) -> Vec<BucketAction> {
        self.buckets
            .iter()
            .filter_map(|(key, sub)| {
                let strategy = sub.sent.clone()?;
                self.rlqs.metrics.sent(Sent::Expire);
                Some(action(
                    bucket_id(&key.entries),
                    strategy,
                    Some(Duration::ZERO),
                ))
            })
            .collect()
    }

    /// Waits until every share assignment this stream sent has expired, so that its rows (and
    /// its places in the replica's bound) outlast what Envoy enforces: the rate they hold is
    /// not granted to another Envoy while this one may still use it.
    async fn linger(&self) {
        let life = row_life_duration(self.rlqs.settings.assignment_ttl);
        let last = self
            .buckets
            .values()
            .filter(|sub| matches!(sub.quota, Quota::Shared(_)) && sub.sent.is_some())
            .map(|sub| sub.settled + life)
            .max();
        if let Some(last) = last {
            tokio::time::sleep_until(last).await;
        }
    }

    /// Stops tracking a bucket and gives its share back.
    async fn remove(&mut self, key: &BucketKey) -> Result<Option<Subscription>, StreamError> {
        let Some(subscription) = self.buckets.remove(key) else {
            return Ok(None);
        };
        self.rlqs.metrics.buckets(-1);
        if let Quota::Shared(limit) = &subscription.quota {
            self.rlqs.metrics.holders(&key.domain, &limit.rule, -1);
            self.rlqs.shares.release(&limit.table, &self.holder).await?;
        }
        Ok(Some(subscription))
    }

    /// Gives every share back (the stream ended).
    async fn release_all(&mut self) {
        let all: Vec<Arc<BucketKey>> = self.buckets.keys().cloned().collect();
        for key in all {
            if let Err(e) = self.remove(&key).await {
                // The row expires on its own within its life.
                tracing::debug!(error = %e, "RLQS share not released");
            }
        }
        // A flood's map goes with it.
        self.buckets = HashMap::new();
    }
}
