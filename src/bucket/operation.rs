//! The store protocol: what the planner asks of a store for one request ([`BucketOp`]s), what
//! a store answers ([`Applied`]), and the all-or-nothing rule every store applies
//! ([`settle`]), shared so that no two stores can disagree.
//!
//! A request becomes a list of [`BucketOp`]s (one per distinct bucket, costs already summed);
//! a store evaluates all of them with [`crate::limiter::evaluate`] and commits all or none of
//! them, as [`settle`] decides.

use smallvec::SmallVec;

use super::{BucketKey, ReferenceCounter};
use crate::limiter::{Algorithm, Cost, Evaluation, LimitParams, State, View};

/// One bucket of one request: which bucket, how to count, and how much.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketOp {
    /// The bucket's identity.
    pub key: BucketKey,
    /// The limit's parameters.
    pub params: LimitParams,
    /// Summed cost of every descriptor of the request that reached this bucket.
    pub cost: Cost,
    /// False when every limit reaching this bucket is in shadow mode: it never denies.
    pub enforce: bool,
    /// A fixed window shared with reference pods (reference counters on): Redis keeps it
    /// under the reference's name as a plain integer; `key` stays its identity in-process.
    pub reference: Option<ReferenceCounter>,
    /// For a refund ([`BucketOp::undo`]) of a fixed or sliding window debit: the index of the
    /// window the debit was counted in ([`BucketResult::window`]), so that the refund goes
    /// back to that window or nowhere ([`crate::limiter::evaluate_refund_of`]). `None` for
    /// everything else; a client's `is_negative_hits` refunds the current window.
    pub debited_in: Option<i64>,
    /// For a refund of a debit this server made (a request's undo, a lease's return): the
    /// store's time of that debit, µs ([`BucketResult::at_us`]). A store drops the refund
    /// when the bucket was set or reset at or after that time ([`crate::store::Store::set`]):
    /// the debit it would give back is no longer in the bucket. `None` for everything else.
    pub debited_at: Option<i64>,
}

/// Why debits are given back, which decides whether an overdraft debit is given back too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undo {
    /// Part of a request that was not committed as a whole (Redis Cluster slot groups, the
    /// per-second split): everything that part stored is given back, overdraft debits
    /// included, so the request ends as one atomic store leaves a denied request — with
    /// nothing stored ([`settle`] stores an overdraft debit only when the request commits).
    NotCommitted,
    /// A request the store committed that is then not served as admitted (quota mode denies
    /// it, or its client left while a `max_wait` limit held it): the debits it was admitted
    /// with are given back, but never an overdraft debit, which records usage that already
    /// happened (the token-quota pattern charges after the response).
    Withdrawn,
}

impl BucketOp {
    /// The operation that gives back what this one debited when `result` is its store's
    /// answer, or `None` when there is nothing to give back for `why` (a check, a refund,
    /// a debit that was not stored). The one place the overdraft rule of [`Undo`] lives.
    pub fn undo(&self, result: &BucketResult, why: Undo) -> Option<BucketOp> {
        // A window debit that was stored names its window; one that names none was never
        // stored (a synthetic `allow` answer while the store is down), and a refund of it
        // would go to the current window, giving back what was never taken.
        let stored = result.window.is_some() || self.params.algorithm == Algorithm::TokenBucket;
        let debited = self.cost > 0
            && stored
            && match why {
                Undo::NotCommitted => result.admitted || self.params.overdraft,
                Undo::Withdrawn => result.admitted && !self.params.overdraft,
            };
        debited.then(|| BucketOp {
            cost: -self.cost,
            debited_in: result.window,
            debited_at: result.at_us,
            ..self.clone()
        })
    }
}

/// A store's answer for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketResult {
    /// Whether this bucket alone would admit its cost (for an overdraft bucket: whether the
    /// cost fitted; it is debited either way when the request commits).
    pub admitted: bool,
    /// The bucket as it is after the request (debited only if the request was committed).
    pub view: View,
    /// When not admitted: time until this cost could pass; `None` if it never can.
    pub retry_after_us: Option<u64>,
    /// The index of the window a fixed or sliding window operation stored its state in
    /// (where its debit was counted); `None` when nothing was stored, and for token buckets.
    /// A refund of the debit names it ([`BucketOp::debited_in`]).
    pub window: Option<i64>,
    /// The store's time (µs since the epoch) at which it evaluated the op, when a store
    /// answered it; `None` for an answer no store gave (a failure policy's, the over-limit
    /// cache's). A refund of the debit carries it ([`BucketOp::debited_at`]).
    pub at_us: Option<i64>,
}

/// A store's answer for a whole request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// True when the request's debits were stored (every enforcing bucket admitted).
    pub committed: bool,
    /// One result per [`BucketOp`], in the same order.
    pub buckets: Vec<BucketResult>,
    /// True when the answer came from the local over-limit cache, without a store call.
    pub from_local_cache: bool,
    /// µs to hold the request before answering it OK: the longest delay of its enforcing
    /// buckets that admitted it with one ([`LimitParams::max_wait_us`]); 0 when not
    /// committed, and when every token was there.
    ///
    /// [`LimitParams::max_wait_us`]: crate::limiter::LimitParams::max_wait_us
    pub delay_us: u64,
}

impl Applied {
    /// The answer for a request with no bucket operations (unknown domain, nothing matched,
    /// unlimited): committed, nothing stored, nothing to wait for.
    pub fn nothing() -> Applied {
        Applied {
            committed: true,
            buckets: Vec::new(),
            from_local_cache: false,
            delay_us: 0,
        }
    }
}

/// Decides all-or-nothing for evaluations of `ops` (same order): commit when every enforcing
/// bucket admits. A shadow bucket that does not admit is never debited, but does not block.
/// An overdraft bucket ([`LimitParams::overdraft`]) never blocks either, and when the request
/// commits its debit is stored whether it fitted or not (its `admitted` stays as evaluated).
///
/// Returns the answer and, for each op, whether its `next` state must be stored (on the
/// stack up to eight ops).
pub fn settle(ops: &[BucketOp], evaluations: &[Evaluation]) -> (Applied, SmallVec<[bool; 8]>) {
    let committed = ops
        .iter()
        .zip(evaluations)
        .all(|(op, e)| e.admitted || !op.enforce || op.params.overdraft);
    let mut store = SmallVec::with_capacity(ops.len());
    let delay_us = ops
        .iter()
        .zip(evaluations)
        .filter(|(op, e)| committed && op.enforce && e.admitted)
        .map(|(_, e)| e.delay_us)
        .max()
        .unwrap_or(0);
    let buckets = ops
        .iter()
        .zip(evaluations)
        .map(|(op, e)| {
            let applies = committed && (e.admitted || op.params.overdraft);
            let stored = applies && e.next.is_some();
            store.push(stored);
            let window = match e.next {
                Some((State::FixedWindow { window, .. }, _))
                | Some((State::SlidingWindow { window, .. }, _))
                    if stored =>
                {
                    Some(window)
                }
                _ => None,
            };
            BucketResult {
                window,
                at_us: None,
                admitted: e.admitted,
                view: if applies { e.committed } else { e.current },
                retry_after_us: if e.admitted {
                    Some(0)
                } else {
                    e.retry_after_us
                },
            }
        })
        .collect();
    (
        Applied {
            committed,
            buckets,
            from_local_cache: false,
            delay_us,
        },
        store,
    )
}

/// The store operations unit tests write: one constructor, so a field added to [`BucketOp`] is
/// given its neutral value in one place.
#[cfg(test)]
impl BucketOp {
    /// An enforced debit of `cost` (a refund when negative) on the bucket of `domain` whose one
    /// descriptor entry is `key` = `value`, counted by `params` (the key follows its algorithm
    /// and period, as the planner's keys do).
    pub(crate) fn debit(
        domain: &str,
        key: &str,
        value: &[u8],
        params: LimitParams,
        cost: Cost,
    ) -> Self {
        BucketOp {
            key: BucketKey::new(
                domain,
                [(key.as_bytes(), super::KeyValue::Value(value))],
                params.algorithm,
                params.period_us,
            ),
            params,
            cost,
            enforce: true,
            reference: None,
            debited_in: None,
            debited_at: None,
        }
    }
}

#[cfg(test)]
mod tests;
