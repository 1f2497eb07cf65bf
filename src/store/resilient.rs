//! Redis with a failure policy: what floodgate answers when Redis cannot.
//!
//! A request goes, in order, to:
//! 1. the local over-limit cache — a bucket Redis recently said is empty answers OVER_LIMIT
//!    with no Redis call;
//! 2. the circuit breaker — while open, Redis is not called at all;
//!    then a request that this replica's leases answer alone ([`super::lease`]) is answered,
//!    with no call and so no place among the calls in flight;
//! 3. the shedder ([`super::shed`]) — an adaptive bound on the calls in flight to Redis, with a
//!    queue in front of it: past what Redis answers in time, a call waits for a place while it
//!    can still be answered by its deadline (its client's `grpc-timeout`, else the Redis
//!    deadline), and is shed (not sent) when none comes by then;
//! 4. Redis, within the command timeout.
//!
//! When Redis cannot answer (breaker open, timeout, connection failure, or the call was shed),
//! the policy decides:
//! - `error` (default): the store error, so the gRPC answer is `UNAVAILABLE` and Envoy's
//!   `failure_mode_deny` decides; health reports NOT_SERVING meanwhile.
//! - `allow`: every bucket admits (OK), remaining reported as the full limit.
//! - `deny`: every enforcing bucket denies (OVER_LIMIT), nothing debited anywhere.
//! - `local`: an in-process memory store stands in, per replica, until Redis is back.
//!
//! A background probe ([`RemoteStore::probe`]: the script with no bucket, so a Redis that answers
//! `PING` but holds scripts counts as down) runs while the breaker is open, or while nothing
//! has succeeded for the quiet period: it closes the breaker on the first success and counts
//! failures like requests do, so neither recovery nor noticing an outage (Redis down at
//! start-up, an idle replica) needs traffic — a pod marked not-ready gets none.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::ValueEnum;

use super::breaker::CircuitBreaker;
use super::overlimit::OverLimitCache;
use super::shed::Shedder;
use super::{MemoryStore, RemoteStore, Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp, BucketResult};
use crate::limiter::{LimitParams, View};
use crate::store::metrics::StoreMetrics;

/// Defects (store errors that are not outages) are logged at most this often: each request
/// meets the same one, and a log line per request would flood the log.
const DEFECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// What to answer when the store cannot (`--on-store-error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FailurePolicy {
    /// gRPC UNAVAILABLE: Envoy's `failure_mode_deny` decides.
    Error,
    /// Answer OK.
    Allow,
    /// Answer OVER_LIMIT.
    Deny,
    /// Count in process memory until Redis is back.
    Local,
}

impl FailurePolicy {
    /// The label used in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Error => "error",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
            FailurePolicy::Local => "local",
        }
    }
}

/// Redis behind the local cache, the circuit breaker and the failure policy.
pub struct ResilientStore {
    /// The shared store: standalone Redis or Redis Cluster.
    redis: Arc<dyn RemoteStore>,
    /// Opens after consecutive transient failures.
    breaker: CircuitBreaker,
    /// Buckets known to deny for a while; `None` when disabled. Shared with the metrics
    /// sampler that publishes its size.
    cache: Option<Arc<OverLimitCache>>,
    /// The answer while Redis is unusable.
    policy: FailurePolicy,
    /// Early shedding while a queue stands in front of Redis; `None` when disabled.
    shedder: Option<Shedder>,
    /// The stand-in store for policy `local`.
    fallback: Option<Arc<MemoryStore>>,
    /// Store errors, cache hits and availability are counted here.
    metrics: StoreMetrics,
    /// When a defect was last logged, and how many went unlogged since: defects are logged
    /// at most every [`DEFECT_LOG_EVERY`], whatever their text.
    defect_log: std::sync::Mutex<(Option<Instant>, u64)>,
}

/// How [`ResilientStore`] behaves around Redis.
#[derive(Clone, Copy, Debug)]
pub struct Resilience {
    /// The answer while Redis is unusable.
    pub policy: FailurePolicy,
    /// Local over-limit cache entries (0 disables it).
    pub cache_capacity: u64,
    /// Consecutive failures that open the circuit breaker...
    pub failure_threshold: u32,
    /// ...once no call has succeeded for this long (1 s in `serve`).
    pub quiet_period: Duration,
    /// The Redis command deadline, to shed calls that would run out of it while a queue
    /// stands in front of Redis (`None`: never shed).
    pub shed_deadline: Option<Duration>,
}

impl ResilientStore {
    /// Wraps `redis`. `fallback` is required for [`FailurePolicy::Local`].
    pub fn new(
        redis: Arc<dyn RemoteStore>,
        resilience: Resilience,
        fallback: Option<Arc<MemoryStore>>,
        metrics: StoreMetrics,
    ) -> ResilientStore {
        let breaker = CircuitBreaker::new(resilience.failure_threshold, resilience.quiet_period);
        // Read from the breaker at every scrape: set at call sites, a request that succeeded
        // as the breaker opened could close it again and leave the gauge at 0 for good.
        let available = breaker.subscribe();
        let gauges = metrics.clone();
        metrics.sample(move || gauges.set_store_available(*available.borrow()));
        let cache = (resilience.cache_capacity > 0).then(|| {
            let cache = Arc::new(OverLimitCache::new(
                resilience.cache_capacity,
                Some(metrics.clone()),
            ));
            let weak = Arc::downgrade(&cache);
            let gauges = metrics.clone();
            metrics.sample(move || {
                if let Some(cache) = weak.upgrade() {
                    gauges.set_local_cache_entries(cache.len());
                }
            });
            cache
        });
        ResilientStore {
            redis,
            breaker,
            cache,
            policy: resilience.policy,
            shedder: resilience.shed_deadline.map(Shedder::new),
            fallback,
            metrics,
            defect_log: std::sync::Mutex::new((None, 0)),
        }
    }

    /// Availability updates (true = Redis usable).
    pub fn availability(&self) -> tokio::sync::watch::Receiver<bool> {
        self.breaker.subscribe()
    }

    /// True while requests go to Redis (the circuit breaker is closed).
    pub fn breaker_closed(&self) -> bool {
        self.breaker.is_closed()
    }

    /// The failure policy answering while Redis is unusable.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// The adaptive bound on calls to Redis now and the calls waiting for a place under it
    /// (`None` with `--redis-shedding false`).
    pub fn calls_bound(&self) -> Option<(u64, u64)> {
        self.shedder
            .as_ref()
            .map(|shedder| (shedder.limit(), shedder.waiting()))
    }

    /// Forgets cached denials (the limits changed).
    pub fn clear_cache(&self) {
        if let Some(cache) = &self.cache {
            cache.clear();
        }
    }

    /// Starts the recovery probe: every `interval`, while the breaker is open, probe Redis and
    /// close the breaker on success. Ends when the store is dropped.
    pub fn spawn_probe(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<ResilientStore> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(store) = weak.upgrade() else { return };
                if store.breaker.is_closed() && !store.breaker.is_idle() {
                    continue;
                }
                match store.redis.probe().await {
                    Ok(()) => store.breaker.record_success(),
                    Err(error) => store.breaker.record_failure(&error),
                }
            }
        })
    }

    fn log_defect(&self, error: &StoreError) {
        let mut log = self
            .defect_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (last, unlogged) = &mut *log;
        if last.is_some_and(|at| at.elapsed() < DEFECT_LOG_EVERY) {
            *unlogged += 1;
            return;
        }
        // Store errors carry no request data (see store::redis::describe).
        tracing::warn!(error = %error, similar_since_last_line = *unlogged,
            "Redis call failed (not an outage: answering UNAVAILABLE)");
        *last = Some(Instant::now());
        *unlogged = 0;
    }

    fn degraded(
        &self,
        ops: &[BucketOp],
        error: StoreError,
        reason: LocalReason,
    ) -> DegradedAnswer<'_> {
        self.metrics.record_degraded(self.policy.as_str());
        match self.policy {
            FailurePolicy::Error => DegradedAnswer::Ready(Err(error)),
            FailurePolicy::Allow => DegradedAnswer::Ready(Ok(answer_all(ops, true))),
            FailurePolicy::Deny => DegradedAnswer::Ready(Ok(answer_all(ops, false))),
            FailurePolicy::Local => match &self.fallback {
                Some(memory) => {
                    self.metrics.record_local_decision(reason.label());
                    DegradedAnswer::Local(memory)
                }
                None => DegradedAnswer::Ready(Err(error)),
            },
        }
    }

    /// Under policy `local`, debits what Redis committed from this replica's local buckets
    /// too, so that they count every admission of this replica, not only their own: when
    /// Redis cannot answer (calls shed under overload, an outage), a local bucket admits only
    /// what is left of the rate after what Redis admitted here, and a limit keeps its rate
    /// per replica instead of gaining a second one. Overdraft debits, never refused: Redis
    /// decided. Costs one in-process update per request, under `local` only.
    async fn mirror(&self, ops: &[BucketOp], applied: &Applied) {
        let Some(memory) = self.fallback.as_ref().filter(|_| applied.committed) else {
            return;
        };
        if self.policy != FailurePolicy::Local {
            return;
        }
        let debits: Vec<BucketOp> = ops
            .iter()
            .zip(&applied.buckets)
            .filter(|(op, result)| op.cost != 0 && (result.admitted || op.params.overdraft))
            .map(|(op, _)| BucketOp {
                enforce: false,
                params: LimitParams {
                    overdraft: true,
                    max_wait_us: 0,
                    ..op.params
                },
                ..op.clone()
            })
            .collect();
        if debits.is_empty() {
            return;
        }
        // The in-process store fails only on a defect; Redis's answer stands either way.
        if let Err(error) = memory.apply(&debits).await {
            tracing::debug!(%error, "local buckets not updated with Redis's debits");
        }
    }
}

/// Why Redis did not decide a request (the `reason` of `floodgate_local_decisions_total`).
#[derive(Clone, Copy, Debug)]
enum LocalReason {
    /// The call was shed before Redis (overload).
    Shed,
    /// The circuit breaker is open (outage).
    CircuitOpen,
    /// The call failed or timed out.
    StoreError,
}

impl LocalReason {
    fn label(self) -> &'static str {
        match self {
            LocalReason::Shed => "shed",
            LocalReason::CircuitOpen => "circuit_open",
            LocalReason::StoreError => "store_error",
        }
    }
}

enum DegradedAnswer<'a> {
    Ready(Result<Applied, StoreError>),
    Local(&'a Arc<MemoryStore>),
}

impl DegradedAnswer<'_> {
    async fn resolve(self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        match self {
            DegradedAnswer::Ready(result) => result,
            DegradedAnswer::Local(memory) => memory.apply(ops).await,
        }
    }
}

/// The synthetic answer of policies `allow` (every bucket admits, full limit remaining) and
/// `deny` (every enforcing bucket denies; nothing is debited, retry unknown).
fn answer_all(ops: &[BucketOp], admit: bool) -> Applied {
    Applied {
        committed: admit,
        from_local_cache: false,
        delay_us: 0,
        buckets: ops
            .iter()
            .map(|op| {
                let admitted = admit || !op.enforce;
                BucketResult {
                    admitted,
                    view: View {
                        remaining: if admit {
                            op.params.requests_per_period
                        } else {
                            0
                        },
                        reset_us: 0,
                    },
                    retry_after_us: if admitted { Some(0) } else { None },
                    window: None,
                    at_us: None,
                }
            })
            .collect(),
    }
}

#[async_trait]
impl Store for ResilientStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let sent = Instant::now();
        if let Some(cache) = &self.cache
            && let Some(applied) = cache.answer(ops, sent)
        {
            self.metrics.record_local_cache_hit();
            return Ok(applied);
        }
        if !self.breaker.is_closed() {
            let open = StoreError::Unavailable("Redis unavailable (circuit open)".into());
            return self
                .degraded(ops, open, LocalReason::CircuitOpen)
                .resolve(ops)
                .await;
        }
        // Answered from this replica's leases alone: no call, so no place among the calls.
        if let Some(applied) = self.redis.answer_locally(ops) {
            self.mirror(ops, &applied).await;
            return Ok(applied);
        }
        // A place among the calls in flight (perhaps after a short wait), held until Redis
        // answers or the request is dropped; none: the call is shed.
        let call = match &self.shedder {
            Some(shedder) => match shedder.admit().await {
                Some(call) => Some(call),
                None => {
                    self.metrics.record_store_error("shed");
                    let shed = "Redis is saturated: call shed before its deadline";
                    return self
                        .degraded(ops, StoreError::Unavailable(shed.into()), LocalReason::Shed)
                        .resolve(ops)
                        .await;
                }
            },
            None => None,
        };
        let answer = self.redis.apply(ops).await;
        if let Some(call) = call {
            call.end(answer.as_ref().is_err_and(StoreError::is_transient));
        }
        match answer {
            Ok(applied) => {
                self.breaker.record_success();
                if let Some(cache) = &self.cache {
                    cache.learn(ops, &applied, sent);
                }
                self.mirror(ops, &applied).await;
                Ok(applied)
            }
            Err(error) if error.is_transient() => {
                self.metrics.record_store_error(error.kind());
                self.breaker.record_failure(&error);
                self.degraded(ops, error, LocalReason::StoreError)
                    .resolve(ops)
                    .await
            }
            Err(error) => {
                // Not an outage: a defect (bad script reply, missing ACL permission).
                // Report it, once per distinct error at warn level; masking it with a
                // policy answer would hide it.
                self.metrics.record_store_error(error.kind());
                self.log_defect(&error);
                Err(error)
            }
        }
    }
    /// Sets the buckets in Redis (its answer is the set's), and forgets what this replica
    /// cached about them: a cached denial would otherwise outlive a reset until it expired.
    /// The local fallback buckets are set too, so an outage after the set starts from it.
    /// Other replicas' caches are not reached (docs/console.md). Not behind the breaker: an
    /// operator acting during an outage gets Redis's own error, never a policy's answer.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        if let Some(cache) = &self.cache {
            cache.forget(ops);
        }
        if let Some(fallback) = &self.fallback {
            fallback.set(ops).await?;
        }
        self.redis.set(ops).await
    }

    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        self.redis.stored_key(key)
    }

    fn name(&self) -> &'static str {
        self.redis.name()
    }
}
