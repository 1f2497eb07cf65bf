//! Leases: a hot Redis bucket answered locally from tokens debited in advance.
//!
//! One bucket is one Redis key on one shard, and every decision on it is a script call, so
//! a hot bucket (one tenant's global limit) is capped by one Redis core however large the
//! cluster. A *lease* lifts that cap without admitting past the limit:
//!
//! - **Taken like any debit.** When this replica sees steady demand on a bucket, the next request
//!   that goes to Redis for it asks for `augment` more tokens: the same script, the same
//!   all-or-nothing, one call. If the request commits, those tokens are this replica's lease; if
//!   anything denies, nothing was debited and no lease is held.
//! - **Spent locally, briefly.** Until it is empty or expires ([`LIFETIME`] after Redis answered
//!   its call; a fixed window's lease also ends with the window it was debited in), requests on the
//!   bucket take their cost from the lease with no Redis call. Because every token was debited in
//!   Redis before it is spent, admissions across replicas never exceed the limit. Once half is
//!   spent (or less than a round trip's demand is left, or in the last quarter of its lifetime,
//!   while the bucket is hot), the next request renews it in its own call, topping it up to its
//!   size (below), while the rest answers the requests arriving meanwhile; a token bucket's lease
//!   does not expire while its renewal is in flight. Under steady demand a lease never runs out or
//!   expires while its renewal is awaited.
//! - **The rest goes back.** An expired lease (found by the next request or the sweeper), a lease
//!   taken under other limit parameters (a reload changed the limit), and every lease at shutdown
//!   send their unspent tokens back as a refund: to a token bucket (never past its capacity: the
//!   store clamps refunds), to a fixed window only while the window it was debited in is current
//!   (else dropped, [`crate::limiter::evaluate_refund_of`]).
//! - **All or nothing still holds.** A request that takes tokens from a lease and sends other
//!   buckets to Redis gives the tokens back to the lease if Redis denies or fails. A lease is asked
//!   for only within what Redis last reported left beside the request, and if the ask alone is what
//!   made Redis deny, the request is sent again without it, so asking for a lease never turns an
//!   admission into a denial.
//! - **Bounded cost.** Tokens in one replica's lease are unavailable to the others until spent or
//!   returned: at most `--lease-fraction` of a bucket's capacity per replica, for at most
//!   [`LIFETIME`] (and the call renewing it). A replica that dies holding a lease loses those
//!   tokens: a token bucket refills them at its rate, a fixed window gets them back when it ends.
//!
//! Sizing: a lease holds half as much again as this replica's demand on the bucket over the last
//! lifetime, plus what that demand spends during one ask's round trip, at most `--lease-fraction` ×
//! capacity (a token bucket's burst, a fixed window's limit), at most what Redis last reported left
//! beside the request. A bucket is *hot* once that comes to [`MIN_LEASE`] tokens; a bucket whose
//! share is below that is never leased, so small limits behave exactly as without leases.
//!
//! Not leased (sent to Redis as without leases): checks and `is_negative_hits` refunds, shadow-mode
//! buckets, `overdraft` and shaped (`max_wait`) limits, counters shared with reference pods,
//! sliding windows (their estimate weights the previous window, which a returned lease would
//! distort).
//!
//! **Where it sits.** Between [`super::ResilientStore`] and the Redis store (standalone, Sentinel,
//! Cluster or split: any [`RemoteStore`]): the over-limit cache, the circuit breaker, the shedder
//! and the failure policy stay in front of it. So a Redis fault is never answered from a lease
//! beyond its tokens: a call that fails is the failure policy's to answer, and while the circuit is
//! open no request reaches the leases at all (their tokens stay debited until they expire, and the
//! sweeper's returns fail until Redis is back: under-admission, never over-admission). The memory
//! store has no leases: one process has no round trip to save. A request answered from leases alone
//! ([`RemoteStore::answer_locally`]) is answered before the shedder: it makes no call, so it
//! neither takes a place among the calls to Redis nor waits behind them for one (a queue that
//! stands in front of Redis under overload would otherwise hold up the very answers that need no
//! Redis, and their instant answers would count as calls' latencies).
//!
//! **What a lease answer reports.** `limit_remaining`: what Redis reported left when the lease was
//! taken plus what the lease has left, at most the capacity — this replica's view, at most one
//! lifetime old; other replicas may have spent some since. `duration_until_reset`: the reset Redis
//! reported when the lease was taken, counted down since.

mod ledger;

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use self::ledger::{Entry, Route, Sizing};
use super::{RemoteStore, Store, StoreError};
use crate::bucket::{Applied, BucketKey, BucketOp, BucketResult};
use crate::store::metrics::LeaseMetrics;

pub use ledger::MIN_LEASE;

/// `--lease-fraction`'s default: one replica holds at most a tenth of a bucket. A lease is
/// sized from demand, so the fraction binds only where one replica's demand over a lifetime
/// approaches a tenth of the bucket; below that it costs nothing. At a tenth, a bucket of
/// 1000 or more is leased in slices that save over 95% of script calls at its full rate,
/// while a replica's unspent lease never hides more than a tenth of the bucket from the
/// others, for tens of milliseconds; buckets under 80 tokens are never leased.
pub const DEFAULT_FRACTION: f64 = 0.1;

/// How long a lease is spent before its rest goes back; also the period over which demand
/// is measured. Tens of milliseconds: long enough that a hot bucket needs a few dozen
/// script calls a second per replica, short enough that tokens held by one replica are
/// soon back for the others.
pub const LIFETIME: Duration = Duration::from_millis(50);

/// Buckets tracked at once (demand, leases). Beyond it a new bucket goes to Redis untracked
/// until the sweeper has forgotten idle ones: no traffic pattern grows this without bound.
const MAX_TRACKED: usize = 65_536;

/// Shards of the tracking map, so that requests on different buckets rarely contend.
const SHARDS: usize = 16;

/// A [`RemoteStore`] whose hot buckets are answered from leases (see the module docs).
pub struct LeaseStore {
    /// The Redis store the leases are taken from.
    inner: Arc<dyn RemoteStore>,
    /// Lease sizes and lifetime.
    sizing: Sizing,
    /// What this replica knows of each leasable bucket it saw lately.
    shards: Box<[Mutex<HashMap<BucketKey, Entry>>]>,
    /// Picks a bucket's shard.
    hasher: std::collections::hash_map::RandomState,
    /// Numbers leases.
    next_id: AtomicU64,
    /// `floodgate_lease_*`.
    metrics: LeaseMetrics,
}

impl LeaseStore {
    /// Leases on `inner`'s buckets, at most `fraction` of each.
    pub fn new(inner: Arc<dyn RemoteStore>, fraction: f64, metrics: LeaseMetrics) -> LeaseStore {
        LeaseStore::with_lifetime(inner, fraction, LIFETIME, metrics)
    }

    /// [`LeaseStore::new`] with another lease lifetime.
    pub fn with_lifetime(
        inner: Arc<dyn RemoteStore>,
        fraction: f64,
        lifetime: Duration,
        metrics: LeaseMetrics,
    ) -> LeaseStore {
        LeaseStore {
            inner,
            sizing: Sizing { fraction, lifetime },
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            next_id: AtomicU64::new(1),
            metrics,
        }
    }

    /// Leases held now, and the tokens they have left (for tests and the sweeper's log).
    pub fn held(&self) -> (usize, u64) {
        let mut held = (0, 0);
        for shard in self.shards.iter() {
            for entry in lock(shard).values() {
                if let Some(lease) = entry.lease() {
                    held.0 += 1;
                    held.1 += lease.left;
                }
            }
        }
        held
    }

    /// Starts the sweeper: every lifetime, returns expired leases and forgets idle buckets.
    /// Ends when the store is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<LeaseStore> = Arc::downgrade(self);
        let every = self.sizing.lifetime;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(store) = weak.upgrade() else { return };
                let returns = store.sweep(Instant::now());
                store.send_returns(returns).await;
            }
        })
    }

    /// Ends every lease and sends their unspent tokens back, waiting for Redis's answer:
    /// at shutdown, once requests have drained, so that the tokens are the other replicas'
    /// again at once rather than after the lease's expiry.
    pub async fn return_all(&self) {
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            for (key, entry) in lock(shard).iter_mut() {
                entry.end(key, &mut returns);
            }
        }
        let tokens: u64 = returns.iter().map(|op| op.cost.unsigned_abs()).sum();
        if !returns.is_empty() {
            tracing::info!(leases = returns.len(), tokens, "returning leases");
        }
        self.send_returns(returns).await;
    }

    fn sweep(&self, now: Instant) -> Vec<BucketOp> {
        let mut returns = Vec::new();
        for shard in self.shards.iter() {
            lock(shard)
                .retain(|key, entry| entry.sweep(key, now, self.sizing.lifetime, &mut returns));
        }
        returns
    }

    fn shard(&self, key: &BucketKey) -> MutexGuard<'_, HashMap<BucketKey, Entry>> {
        lock(&self.shards[self.hasher.hash_one(key) as usize % SHARDS])
    }

    fn route(&self, op: &BucketOp, now: Instant, returns: &mut Vec<BucketOp>) -> Route {
        if !self.sizing.leasable(op) {
            return Route::Bypass;
        }
        let mut shard = self.shard(&op.key);
        if !shard.contains_key(&op.key) {
            if shard.len() >= MAX_TRACKED / SHARDS {
                return Route::Bypass;
            }
            shard.insert(op.key.clone(), Entry::new(now));
        }
        match shard.get_mut(&op.key) {
            Some(entry) => entry.route(&op.key, op, now, &self.sizing, returns),
            None => Route::Bypass,
        }
    }

    /// Sends refunds of unspent lease tokens, counting them; a failure leaves them debited
    /// (under-admission until the bucket refills or the window ends).
    async fn send_returns(&self, returns: Vec<BucketOp>) {
        if returns.is_empty() {
            return;
        }
        let tokens: u64 = returns.iter().map(|op| op.cost.unsigned_abs()).sum();
        match self.inner.apply(&returns).await {
            Ok(_) => self.metrics.record_returned(tokens, true),
            Err(error) => {
                self.metrics.record_returned(tokens, false);
                tracing::debug!(%error, tokens, "unspent lease tokens not returned");
            }
        }
    }

    /// Sends `returns` from the request path without holding the request up for them.
    fn return_later(self: &LeaseStore, returns: Vec<BucketOp>) {
        if returns.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.inner.clone();
        let metrics = self.metrics.clone();
        runtime.spawn(async move {
            let tokens: u64 = returns.iter().map(|op| op.cost.unsigned_abs()).sum();
            let ok = inner.apply(&returns).await.is_ok();
            metrics.record_returned(tokens, ok);
        });
    }

    /// Redis's answer `applied` to `sent_ops` (the remote ops of `ops`, with their augments)
    /// folded into the request's answer, leases installed, local tokens kept or given back.
    fn settle(
        &self,
        ops: &[BucketOp],
        flight: &mut Flight<'_>,
        remote: &[usize],
        applied: &Applied,
        sent: Instant,
        returns: &mut Vec<BucketOp>,
    ) -> Applied {
        let now = Instant::now();
        let mut buckets = Vec::with_capacity(ops.len());
        let mut answers = remote.iter().zip(&applied.buckets).peekable();
        for (i, op) in ops.iter().enumerate() {
            let from_redis = match answers.peek() {
                Some((j, _)) if **j == i => answers.next().map(|(_, result)| *result),
                _ => None,
            };
            let route = &mut flight.routes[i];
            let result = match (route, from_redis) {
                (Route::Local(take), _) => {
                    let mut view = take.view;
                    if !applied.committed {
                        self.shard(&op.key)
                            .get_mut(&op.key)
                            .map(|entry| entry.give_back(&op.key, take, now, returns))
                            .unwrap_or_else(|| {
                                returns.push(ledger::refund(
                                    &op.key,
                                    &take.params,
                                    take.tokens,
                                    take.window,
                                    take.debited_at,
                                ))
                            });
                        view.remaining = view.remaining.saturating_add(take.tokens);
                    }
                    BucketResult {
                        admitted: true,
                        view,
                        retry_after_us: Some(0),
                        window: take.window,
                        at_us: take.debited_at,
                    }
                }
                (Route::Remote { augment }, Some(mut result)) => {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let held = match self.shard(&op.key).get_mut(&op.key) {
                        Some(entry) => entry.answered(
                            &op.key,
                            op,
                            *augment,
                            &result,
                            applied.committed,
                            (sent, now),
                            id,
                            &self.sizing,
                            returns,
                        ),
                        None => 0,
                    };
                    if held > 0 {
                        self.metrics.record_acquired(held);
                        result.view.remaining = result.view.remaining.saturating_add(held);
                    } else if *augment > 0
                        && !result.admitted
                        && result.view.remaining >= op.cost.unsigned_abs()
                    {
                        // Denied for another bucket: this one alone would have admitted the
                        // request's own cost, whatever the lease asked beside it.
                        result.admitted = true;
                        result.retry_after_us = Some(0);
                    }
                    *augment = 0;
                    result
                }
                (Route::Bypass, Some(result)) => result,
                // Every remote op has its answer (the store answers one per op).
                (_, None) => BucketResult {
                    admitted: false,
                    view: crate::limiter::View {
                        remaining: 0,
                        reset_us: 0,
                    },
                    retry_after_us: None,
                    window: None,
                    at_us: None,
                },
            };
            buckets.push(result);
        }
        flight.settled = true;
        Applied {
            committed: applied.committed,
            buckets,
            from_local_cache: applied.from_local_cache,
            delay_us: applied.delay_us,
        }
    }
}

/// A poisoned shard is still consistent (every update is a few field writes): use it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A request's routes while its Redis call is in flight. If the request is dropped before
/// it settles (its client left), its local tokens go back to their leases and its asks for
/// a lease are abandoned, so the next request may ask.
struct Flight<'a> {
    store: &'a LeaseStore,
    ops: &'a [BucketOp],
    routes: Vec<Route>,
    settled: bool,
}

impl Flight<'_> {
    /// Undoes the routes not yet settled: local tokens back, asks abandoned.
    fn unwind(&mut self, returns: &mut Vec<BucketOp>) {
        let now = Instant::now();
        for (op, route) in self.ops.iter().zip(&mut self.routes) {
            match route {
                Route::Local(take) => {
                    match self.store.shard(&op.key).get_mut(&op.key) {
                        Some(entry) => entry.give_back(&op.key, take, now, returns),
                        None => returns.push(ledger::refund(
                            &op.key,
                            &take.params,
                            take.tokens,
                            take.window,
                            take.debited_at,
                        )),
                    }
                    *route = Route::Bypass;
                }
                Route::Remote { augment } if *augment > 0 => {
                    if let Some(entry) = self.store.shard(&op.key).get_mut(&op.key) {
                        entry.abandon();
                    }
                    *augment = 0;
                }
                _ => {}
            }
        }
        self.settled = true;
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let mut returns = Vec::new();
            self.unwind(&mut returns);
            self.store.return_later(returns);
        }
    }
}

/// Whether Redis denied only because of the leases asked beside the request: every enforcing
/// bucket that did not admit asked for a lease, and has room for the request's own cost.
fn denied_for_the_ask(
    ops: &[BucketOp],
    routes: &[Route],
    remote: &[usize],
    applied: &Applied,
) -> bool {
    !applied.committed
        && remote.iter().zip(&applied.buckets).all(|(&i, result)| {
            let op = &ops[i];
            result.admitted
                || !op.enforce
                || op.params.overdraft
                || matches!(routes[i], Route::Remote { augment } if augment > 0
                    && result.view.remaining >= op.cost.unsigned_abs())
        })
}

#[async_trait]
impl Store for LeaseStore {
    async fn apply(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        let now = Instant::now();
        let mut returns = Vec::new();
        let routes: Vec<Route> = ops
            .iter()
            .map(|op| self.route(op, now, &mut returns))
            .collect();
        let mut flight = Flight {
            store: self,
            ops,
            routes,
            settled: false,
        };
        // A fixed window's lease that ended here (expired, or a changed limit) goes back
        // before the request is sent: sent after it, the request could be denied, and the
        // over-limit cache hold the bucket as empty until the window ends while the returned
        // tokens sit in Redis. A token bucket's denial is cached only until its retry time:
        // its return need not hold the request up.
        let (windowed, other): (Vec<_>, Vec<_>) = std::mem::take(&mut returns)
            .into_iter()
            .partition(|op| op.debited_in.is_some());
        self.return_later(other);
        self.send_returns(windowed).await;
        let remote: Vec<usize> = (0..ops.len())
            .filter(|&i| !matches!(flight.routes[i], Route::Local(_)))
            .collect();
        if remote.is_empty() {
            let nothing = Applied::nothing();
            let applied = self.settle(ops, &mut flight, &remote, &nothing, now, &mut returns);
            self.metrics.record_local_answer();
            self.return_later(returns);
            return Ok(applied);
        }
        // What goes to Redis: the ops not answered from a lease, each with its ask. A request
        // with no op answered locally and no ask (every cold bucket) goes as it came, with no
        // copy of its ops.
        let request = |with_ask: bool, routes: &[Route]| -> Cow<'_, [BucketOp]> {
            let ask = |i: usize| match routes[i] {
                Route::Remote { augment } if with_ask && augment > 0 => augment,
                _ => 0,
            };
            if remote.len() == ops.len() && remote.iter().all(|&i| ask(i) == 0) {
                return Cow::Borrowed(ops);
            }
            remote
                .iter()
                .map(|&i| {
                    let op = &ops[i];
                    match ask(i) {
                        0 => op.clone(),
                        augment => BucketOp {
                            cost: op
                                .cost
                                .saturating_add(i64::try_from(augment).unwrap_or(i64::MAX)),
                            ..op.clone()
                        },
                    }
                })
                .collect()
        };
        let asked = flight
            .routes
            .iter()
            .any(|r| matches!(r, Route::Remote { augment } if *augment > 0));
        let mut sent = Instant::now();
        let mut answer = self.inner.apply(&request(true, &flight.routes)).await;
        if asked
            && let Ok(applied) = &answer
            && denied_for_the_ask(ops, &flight.routes, &remote, applied)
        {
            // The ask made Redis deny a request that fits on its own: forget the ask and send
            // the request as it is (nothing was debited by the denied call).
            for (op, route) in ops.iter().zip(flight.routes.iter_mut()) {
                if let Route::Remote { augment } = route
                    && *augment > 0
                {
                    if let Some(entry) = self.shard(&op.key).get_mut(&op.key) {
                        entry.abandon();
                    }
                    *augment = 0;
                }
            }
            sent = Instant::now();
            answer = self.inner.apply(&request(false, &flight.routes)).await;
        }
        match answer {
            Ok(applied) => {
                let applied = self.settle(ops, &mut flight, &remote, &applied, sent, &mut returns);
                self.return_later(returns);
                Ok(applied)
            }
            Err(error) => {
                flight.unwind(&mut returns);
                self.return_later(returns);
                Err(error)
            }
        }
    }

    /// Forgets this replica's leases of the buckets (their tokens are not returned: the set
    /// decides what the bucket holds), then sets them in Redis.
    async fn set(&self, ops: &[BucketOp]) -> Result<Applied, StoreError> {
        for op in ops {
            self.shard(&op.key).remove(&op.key);
        }
        self.inner.set(ops).await
    }

    fn stored_key(&self, key: &BucketKey) -> Vec<u8> {
        self.inner.stored_key(key)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

#[async_trait]
impl RemoteStore for LeaseStore {
    async fn probe(&self) -> Result<(), StoreError> {
        self.inner.probe().await
    }

    /// Every op taken from a current lease with no renewal due, or none: the request is then
    /// [`Store::apply`]'s, as if this had not been asked.
    fn answer_locally(&self, ops: &[BucketOp]) -> Option<Applied> {
        if ops.is_empty() || !ops.iter().all(|op| self.sizing.leasable(op)) {
            return None;
        }
        let now = Instant::now();
        let mut flight = Flight {
            store: self,
            ops,
            routes: Vec::with_capacity(ops.len()),
            settled: false,
        };
        for op in ops {
            // An op that cannot be taken ends the attempt: dropping the flight gives the
            // tokens already taken back to their leases.
            let take = {
                let mut shard = self.shard(&op.key);
                shard
                    .get_mut(&op.key)
                    .and_then(|entry| entry.take(op, now, &self.sizing))
            };
            flight.routes.push(Route::Local(take?));
        }
        for op in ops {
            if let Some(entry) = self.shard(&op.key).get_mut(&op.key) {
                entry.count(op, now, &self.sizing);
            }
        }
        let mut returns = Vec::new();
        let applied = self.settle(
            ops,
            &mut flight,
            &[],
            &Applied::nothing(),
            now,
            &mut returns,
        );
        self.metrics.record_local_answer();
        self.return_later(returns);
        Some(applied)
    }
}

#[cfg(test)]
mod tests;
