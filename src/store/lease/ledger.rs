//! One bucket's lease accounting, with time passed in: what a replica knows of a hot bucket
//! (its recent demand, Redis's last answer, the lease it holds) and every move of a lease's
//! tokens — acquired, spent, given back, returned — so that the rules of [`super`] live in
//! one place that unit tests drive with a made-up clock.
//!
//! A lease's tokens were debited in Redis before any is spent, so nothing here can admit more
//! than Redis granted: spending takes from `left`, a denial elsewhere puts the tokens back,
//! and whatever is unspent when the lease ends becomes a refund operation ([`Entry::end`])
//! for the caller to send.

use std::time::{Duration, Instant};

use crate::bucket::{BucketKey, BucketOp, BucketResult};
use crate::limiter::{Algorithm, LimitParams, View};

/// A lease smaller than this is not worth a script call's bookkeeping, and a bucket whose
/// share (`--lease-fraction` × capacity) is smaller is never leased: small limits are
/// decided by Redis on every request, exactly as without leases.
pub const MIN_LEASE: u64 = 8;

/// How a replica sizes and times its leases.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sizing {
    /// The most of a bucket's capacity one lease may hold (`--lease-fraction`).
    pub(super) fraction: f64,
    /// How long a lease is spent before its rest goes back; also the period over which
    /// demand is measured.
    pub(super) lifetime: Duration,
}

impl Sizing {
    /// The largest lease of a bucket with `params`: `fraction` × its capacity (a token
    /// bucket's burst, a fixed window's limit), whole tokens; 0 for anything never leased.
    pub(super) fn max_lease(&self, params: &LimitParams) -> u64 {
        let capacity = match params.algorithm {
            Algorithm::TokenBucket => params.burst,
            Algorithm::FixedWindow => params.requests_per_period,
            // The sliding estimate weights the previous window's count, which a lease taken
            // in it would inflate after its tokens went back: sliding windows are not leased.
            Algorithm::SlidingWindow => return 0,
        };
        if params.requests_per_period == 0 {
            return 0;
        }
        let share = (capacity as f64 * self.fraction).floor();
        if share >= MIN_LEASE as f64 {
            share as u64
        } else {
            0
        }
    }

    /// Whether `op` may be answered from a lease. Everything else goes to Redis as it
    /// would without leases: checks and refunds (`cost <= 0`), shadow-mode buckets (they
    /// never deny, and Redis reports their state), overdraft and shaped (`max_wait`) limits
    /// (their debt and delay are Redis's to compute), counters shared with reference pods,
    /// and undo operations naming a window.
    pub(super) fn leasable(&self, op: &BucketOp) -> bool {
        op.enforce
            && op.cost > 0
            && !op.params.overdraft
            && op.params.max_wait_us == 0
            && op.reference.is_none()
            && op.debited_in.is_none()
            && op.cost.unsigned_abs() <= self.max_lease(&op.params)
    }
}

/// Tokens of a bucket held by this replica, debited in Redis, spent locally until `expires`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Lease {
    /// Tells leases of one bucket apart, so that tokens given back after the lease was
    /// replaced do not land in its successor.
    pub(super) id: u64,
    /// The limit it was taken under; a request under other parameters (a reload changed the
    /// limit) ends it.
    pub(super) params: LimitParams,
    /// Tokens not yet spent.
    pub(super) left: u64,
    /// Tokens it held when taken (or last renewed): renewed once half is spent.
    pub(super) size: u64,
    /// Spent only before this instant: the lease's lifetime from when its call was sent,
    /// and for a fixed window never past the end of the window it was debited in.
    pub(super) expires: Instant,
    /// Fixed window: the window it was debited in (refunds go back there or nowhere).
    pub(super) window: Option<i64>,
    /// The store's time of its first debit (a renewal keeps it): its returns carry it, so a
    /// set or reset of the bucket after it drops them ([`BucketOp::debited_at`]). The
    /// earliest, since tokens of any debit before a set must not come back: a renewal's
    /// own tokens are then lost too (under-admission, never over-admission).
    pub(super) debited_at: Option<i64>,
    /// When the bucket is full again (token bucket) or its window ends (fixed window), as
    /// Redis reported it, counted from when the call was sent.
    pub(super) reset_at: Instant,
    /// Whole tokens Redis reported left after the lease's debit.
    pub(super) redis_remaining: u64,
}

impl Lease {
    /// The bucket as this replica sees it at `now`: what Redis had left when the lease was
    /// taken plus what the lease has left (at most the capacity), and the time until the
    /// reset Redis reported.
    pub(super) fn view(&self, now: Instant) -> View {
        let capacity = match self.params.algorithm {
            Algorithm::TokenBucket => self.params.burst,
            _ => self.params.requests_per_period,
        };
        View {
            remaining: self.redis_remaining.saturating_add(self.left).min(capacity),
            reset_us: u64::try_from(self.reset_at.saturating_duration_since(now).as_micros())
                .unwrap_or(u64::MAX),
        }
    }
}

/// Tokens a request took from a lease, to give back if the request is not committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Take {
    /// The lease they came from.
    pub(super) lease: u64,
    /// How many.
    pub(super) tokens: u64,
    /// The limit the lease was taken under.
    pub(super) params: LimitParams,
    /// The window the lease was debited in.
    pub(super) window: Option<i64>,
    /// The store's time of the lease's first debit ([`Lease::debited_at`]).
    pub(super) debited_at: Option<i64>,
    /// The bucket as seen after the take.
    pub(super) view: View,
}

/// Where one operation of a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Not leasable (or not tracked): to Redis, untouched.
    Bypass,
    /// Answered from the lease.
    Local(Take),
    /// To Redis with `augment` more tokens for a new lease (0: none asked).
    Remote {
        /// Extra tokens debited with the operation, held as a lease if it commits.
        augment: u64,
    },
}

/// Where [`Entry::plan`] sends an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// From the lease held.
    Local,
    /// To Redis, asking for this many tokens more as a lease (or its renewal).
    Ask(u64),
    /// To Redis without an ask.
    Plain,
}

/// What this replica knows of one leasable bucket.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// Start of the current demand period.
    period_start: Instant,
    /// Tokens asked in the current period.
    demand: u64,
    /// Tokens asked in the period before it (0 if it saw none, or was long ago).
    last_demand: u64,
    /// Last time a request touched the bucket.
    last_seen: Instant,
    /// Whole tokens Redis reported left in its last answer: a lease is sized to fit in it,
    /// so that asking for one seldom makes a request that would fit fail.
    hint: Option<u64>,
    /// A call asking for a lease is in flight: no second one until it is answered.
    acquiring: bool,
    /// How long the last ask took, sent to answered: the tokens the demand spends meanwhile
    /// must still be in the lease when a renewal is asked for.
    round_trip: Duration,
    /// The lease held, if any.
    lease: Option<Lease>,
}

impl Entry {
    /// A bucket first seen at `now`.
    pub(super) fn new(now: Instant) -> Entry {
        Entry {
            period_start: now,
            demand: 0,
            last_demand: 0,
            last_seen: now,
            hint: None,
            acquiring: false,
            round_trip: Duration::ZERO,
            lease: None,
        }
    }

    /// The lease held, if any.
    pub(super) fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Routes `op` (leasable, see [`Sizing::leasable`]) at `now`: counts its demand, ends a
    /// lease that expired or was taken under other limit parameters (its refund pushed to
    /// `returns`), takes the cost from the lease if it has enough, and otherwise sends the op
    /// to Redis, asking for a lease when the bucket is hot and no other request is already
    /// asking.
    pub(super) fn route(
        &mut self,
        key: &BucketKey,
        op: &BucketOp,
        now: Instant,
        sizing: &Sizing,
        returns: &mut Vec<BucketOp>,
    ) -> Route {
        self.observe(now, op.cost.unsigned_abs(), sizing.lifetime);
        if self.stale(op, now) {
            self.end(key, returns);
        }
        match self.plan(op, now, sizing) {
            Plan::Local => match self.spend(op, now) {
                Some(take) => Route::Local(take),
                None => Route::Remote { augment: 0 },
            },
            Plan::Ask(augment) => {
                self.acquiring = true;
                Route::Remote { augment }
            }
            Plan::Plain => Route::Remote { augment: 0 },
        }
    }

    /// Takes `op`'s cost from the lease at `now` if [`Entry::route`] would answer it locally
    /// (a lease held, current, enough left, no renewal due); otherwise changes nothing. Its
    /// demand is not counted: the caller counts it ([`Entry::count`]) once the whole request
    /// is answered locally, or routes it.
    pub(super) fn take(&mut self, op: &BucketOp, now: Instant, sizing: &Sizing) -> Option<Take> {
        if self.lease.is_none() || self.stale(op, now) {
            return None;
        }
        match self.plan(op, now, sizing) {
            Plan::Local => self.spend(op, now),
            Plan::Ask(_) | Plan::Plain => None,
        }
    }

    /// Counts the demand of `op`, answered locally at `now` by [`Entry::take`].
    pub(super) fn count(&mut self, op: &BucketOp, now: Instant, sizing: &Sizing) {
        self.observe(now, op.cost.unsigned_abs(), sizing.lifetime);
    }

    /// Whether the lease held must end before `op`: it expired, or was taken under other
    /// limit parameters (a reload changed the limit).
    fn stale(&self, op: &BucketOp, now: Instant) -> bool {
        self.lease
            .as_ref()
            .is_some_and(|lease| lease.params != op.params || self.expired(lease, now))
    }

    /// Whether `lease` (this entry's) has expired at `now`. A token bucket's lease whose
    /// renewal is in flight is kept until the renewal is answered (or fails): ended at its
    /// lifetime's end, the requests arriving during a slow call (a busy host's, tens of
    /// milliseconds) would go to Redis one by one while its tokens went back, only for the
    /// renewal to bring a top-up too small to last. Its tokens were debited before, so this
    /// admits nothing more; it hides them from other replicas one call longer. A fixed
    /// window's lease ends with its window whatever is in flight.
    fn expired(&self, lease: &Lease, now: Instant) -> bool {
        now >= lease.expires && !(self.acquiring && lease.window.is_none())
    }

    /// Where `op` goes at `now`, the lease (if any) current.
    fn plan(&self, op: &BucketOp, now: Instant, sizing: &Sizing) -> Plan {
        let cost = op.cost.unsigned_abs();
        // Sized from this replica's own demand: half as much again as one lifetime's worth,
        // so a steady stream does not run out before the lease ends. An ask tops the lease
        // up to that, counting what it holds: a renewal that added a whole lease on top of
        // the half left would make a lease that the demand cannot spend to half within its
        // lifetime, so it would expire unspent (its rest refunded, then a new ask, and the
        // requests during it sent to Redis one by one). Never more than the bucket's share
        // with what is held, nor more than Redis last had left beside this request.
        let held = self.lease.as_ref().map_or(0, |lease| lease.left);
        let demand = self.demand.max(self.last_demand);
        // What the demand spends during one ask's round trip: a renewal is asked for while
        // the lease still holds that (and a quarter more), and tops the lease up by it, so
        // that a slow round trip (a busy host's) does not leave it dry before the renewal
        // lands. At most one lifetime's demand: one stalled call (a pause of the host) does
        // not swell the next leases past what a lifetime's tokens are worth.
        let in_flight = u64::try_from(
            u128::from(demand) * self.round_trip.as_nanos() / sizing.lifetime.as_nanos().max(1),
        )
        .unwrap_or(u64::MAX)
        .min(demand);
        let wanted = demand.saturating_add(demand / 2).saturating_add(in_flight);
        let room = self.hint.unwrap_or(0).saturating_sub(cost);
        // A lease in the last quarter of its lifetime that the demand will not spend to half
        // before it ends (it slowed, or stalled behind other calls) is renewed too, with at
        // least a minimal lease's worth, so that its call starts its lifetime again: while
        // the bucket stays hot it is never left to expire with the demand still there.
        let expiring = wanted >= MIN_LEASE
            && self
                .lease
                .as_ref()
                .is_some_and(|lease| now + sizing.lifetime / 4 >= lease.expires);
        let top_up = if expiring {
            wanted.saturating_sub(held).max(MIN_LEASE)
        } else {
            wanted.saturating_sub(held)
        };
        let augment = top_up
            .min(sizing.max_lease(&op.params).saturating_sub(held))
            .min(room);
        let can_ask = !self.acquiring && augment >= MIN_LEASE;
        match &self.lease {
            // Renewed once half spent (or in its last quarter lifetime), by this request's
            // own call, while the rest still answers the requests that arrive during it.
            Some(lease) if lease.left >= cost => {
                let low = (lease.left - cost).saturating_mul(2) < lease.size
                    || lease.left - cost < in_flight.saturating_add(in_flight / 4);
                if can_ask && (low || expiring) {
                    Plan::Ask(augment)
                } else {
                    Plan::Local
                }
            }
            _ if can_ask => Plan::Ask(augment),
            _ => Plan::Plain,
        }
    }

    /// Takes `op`'s cost from the lease held (which has enough).
    fn spend(&mut self, op: &BucketOp, now: Instant) -> Option<Take> {
        let cost = op.cost.unsigned_abs();
        let lease = self.lease.as_mut().filter(|lease| lease.left >= cost)?;
        lease.left -= cost;
        Some(Take {
            lease: lease.id,
            tokens: cost,
            params: lease.params,
            window: lease.window,
            debited_at: lease.debited_at,
            view: lease.view(now),
        })
    }

    /// Redis answered `op` (sent with `augment` more tokens at `sent`, answered at `now`)
    /// with `result`, the request as a whole `committed` or not: remembers what Redis has
    /// left and, when the lease's debit was stored, holds it as this bucket's lease (`id`),
    /// the previous lease's rest pushed to `returns`. Returns the tokens held as a new lease.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn answered(
        &mut self,
        key: &BucketKey,
        op: &BucketOp,
        augment: u64,
        result: &BucketResult,
        committed: bool,
        (sent, now): (Instant, Instant),
        id: u64,
        sizing: &Sizing,
        returns: &mut Vec<BucketOp>,
    ) -> u64 {
        self.hint = Some(result.view.remaining);
        if augment == 0 {
            return 0;
        }
        self.acquiring = false;
        self.round_trip = now.saturating_duration_since(sent);
        let windowed = op.params.algorithm == Algorithm::FixedWindow;
        // A fixed window's debit that names no window was not stored; nothing to hold.
        if !committed || !result.admitted || (windowed && result.window.is_none()) {
            return 0;
        }
        let reset_at = sent + Duration::from_micros(result.view.reset_us);
        // The lifetime counts from the answer: a lease that arrived after a slow call still
        // serves its lifetime. Every token of it was debited before it is spent, whenever
        // that is, so for a token bucket this only shifts admissions later by the call's
        // latency.
        let mut expires = now + sizing.lifetime;
        if windowed {
            // Redis's clock put the debit in a window ending `reset_us` after it evaluated,
            // which was after `sent`: ending the lease `reset_us` after `sent` ends it before
            // that window does, so no token of it is spent in the next window.
            expires = expires.min(reset_at);
        }
        // A renewal of the lease held (same limit, same window) adds to it, keeping its id
        // so that tokens given back by requests in flight still land in it.
        // A token bucket's lease past its lifetime is still here only because this renewal
        // was in flight (see `expired`).
        if let Some(lease) = self.lease.as_mut().filter(|lease| {
            lease.params == op.params
                && lease.window == result.window
                && (now < lease.expires || lease.window.is_none())
        }) {
            lease.left += augment;
            lease.size = lease.left;
            lease.expires = expires;
            lease.reset_at = reset_at;
            lease.redis_remaining = result.view.remaining;
            return augment;
        }
        self.end(key, returns);
        self.lease = Some(Lease {
            id,
            size: augment,
            params: op.params,
            left: augment,
            expires,
            window: result.window,
            debited_at: result.at_us,
            reset_at,
            redis_remaining: result.view.remaining,
        });
        augment
    }

    /// A request that asked for a lease ended without an answer (failed, or dropped): another
    /// request may ask.
    pub(super) fn abandon(&mut self) {
        self.acquiring = false;
    }

    /// Gives back tokens taken by a request that was not committed: to their lease while it
    /// is still held and unexpired, else to Redis (a refund pushed to `returns`).
    pub(super) fn give_back(
        &mut self,
        key: &BucketKey,
        take: &Take,
        now: Instant,
        returns: &mut Vec<BucketOp>,
    ) {
        match self
            .lease
            .as_mut()
            .filter(|lease| lease.id == take.lease && now < lease.expires)
        {
            Some(lease) => lease.left += take.tokens,
            None => returns.push(refund(
                key,
                &take.params,
                take.tokens,
                take.window,
                take.debited_at,
            )),
        }
    }

    /// Ends the lease held (if any): its unspent tokens become a refund pushed to `returns`.
    pub(super) fn end(&mut self, key: &BucketKey, returns: &mut Vec<BucketOp>) {
        if let Some(lease) = self.lease.take()
            && lease.left > 0
        {
            returns.push(refund(
                key,
                &lease.params,
                lease.left,
                lease.window,
                lease.debited_at,
            ));
        }
    }

    /// The sweep at `now`: ends an expired lease (refund to `returns`). Returns whether the
    /// entry is worth keeping: a lease held, a lease being asked for, or a request seen
    /// within the last two lifetimes.
    pub(super) fn sweep(
        &mut self,
        key: &BucketKey,
        now: Instant,
        lifetime: Duration,
        returns: &mut Vec<BucketOp>,
    ) -> bool {
        if self
            .lease
            .as_ref()
            .is_some_and(|lease| self.expired(lease, now))
        {
            self.end(key, returns);
        }
        self.lease.is_some()
            || self.acquiring
            || now.saturating_duration_since(self.last_seen) < lifetime * 2
    }

    /// Counts `cost` tokens of demand at `now`, in periods of `lifetime`.
    fn observe(&mut self, now: Instant, cost: u64, lifetime: Duration) {
        let since = now.saturating_duration_since(self.period_start);
        if since >= lifetime {
            self.last_demand = if since < lifetime * 2 { self.demand } else { 0 };
            self.demand = 0;
            self.period_start = now;
        }
        self.demand = self.demand.saturating_add(cost);
        self.last_seen = now;
    }
}

/// The operation that gives `tokens` back to `key`'s bucket: a token bucket's refund (the
/// store never fills a bucket past its capacity), or a fixed window's refund to the window
/// they were debited in, dropped by the store if that window has ended; either dropped if the
/// bucket was set after `debited_at`.
pub(super) fn refund(
    key: &BucketKey,
    params: &LimitParams,
    tokens: u64,
    window: Option<i64>,
    debited_at: Option<i64>,
) -> BucketOp {
    BucketOp {
        key: key.clone(),
        params: *params,
        cost: -i64::try_from(tokens).unwrap_or(i64::MAX),
        enforce: true,
        reference: None,
        debited_in: window,
        debited_at,
    }
}

#[cfg(test)]
mod tests;
