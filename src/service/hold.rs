//! Holding a request that a `max_wait` limit admitted with a delay (shaping): served at its
//! turn, refused at once when shutdown's cut comes first, and refunded when its caller goes
//! away mid-wait; and the refund of a request's debits, which the decider also uses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::time::Instant as TokioInstant;

use crate::bucket::{Applied, BucketOp};
use crate::plan::Plan;
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::{Metrics, ShapedEnd};

/// How long before shutdown's cut a held request's turn must come for it to be served: its
/// answer still has to be written before the connections are closed.
const ANSWER_MARGIN: Duration = Duration::from_millis(250);

/// How a request a `max_wait` limit held ends.
pub(super) enum Hold {
    /// Its turn came: answered OK, after this long.
    Served(Duration),
    /// Shutdown cuts the connections off before its turn: its debits are given back and it
    /// is answered from this, which denies it.
    Refused(Applied),
}

/// What a hold uses of the decider: the store (for refunds), the metrics (how each hold
/// ends) and shutdown's cut.
pub(super) struct Holder<'a> {
    /// Where the held request's buckets live.
    pub(super) store: &'a Arc<dyn Store>,
    /// Where each hold's end is counted.
    pub(super) metrics: &'a Arc<Metrics>,
    /// When shutdown cuts every call off, once it has begun.
    pub(super) cut: &'a watch::Sender<Option<TokioInstant>>,
}

impl Holder<'_> {
    /// Holds a committed request for the delay its `max_wait` limits admitted it with. Its
    /// tokens are already debited, so later requests queue behind it. It is served at its
    /// turn, never earlier: when shutdown will cut the connections off before that turn
    /// (see [`crate::service::Decider::shutting_down`]), its debits are given back and it is
    /// refused at once instead. If the caller drops the request while it waits (the client
    /// cancelled or timed out), its debits are given back too: the tokens go to the next
    /// request.
    pub(super) async fn hold(&self, plan: &Plan<'_>, applied: &Applied, domain: &Arc<str>) -> Hold {
        let mut waiting = Waiting {
            store: self.store,
            metrics: self.metrics,
            domain,
            plan,
            applied,
            answered: false,
            started: Instant::now(),
        };
        let due = TokioInstant::now() + Duration::from_micros(applied.delay_us);
        let mut cut = self.cut.subscribe();
        let end = loop {
            if cut
                .borrow_and_update()
                .is_some_and(|cut| due + ANSWER_MARGIN > cut)
            {
                break ShapedEnd::Refused;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => break ShapedEnd::Served,
                // Only the decider's drop closes the channel; the turn still comes then.
                Ok(()) = cut.changed() => {}
            }
        };
        waiting.answered = true;
        let held = waiting.started.elapsed();
        if end == ShapedEnd::Served {
            self.metrics.record_shaped(domain, end, held);
            // A sleep never ends early: served, this is at least the delay.
            return Hold::Served(held);
        }
        let refused = self.refuse_held(plan, applied, due).await;
        // Counted once the refund is done, so a reader of the metric sees it applied.
        self.metrics.record_shaped(domain, end, held);
        Hold::Refused(refused)
    }

    /// Gives back the debits of a held request that shutdown refuses, and the answer that
    /// refuses it: its `max_wait` limits report OVER_LIMIT, with the time until its turn as
    /// the retry delay and the buckets as the refund left them. Refused even if the refund
    /// fails: admitting it now would spend tokens that only its turn brings.
    async fn refuse_held(&self, plan: &Plan<'_>, applied: &Applied, due: TokioInstant) -> Applied {
        let refunds = plan.undo(applied);
        let mut refused = applied.clone();
        refused.committed = false;
        refused.delay_us = 0;
        if !refunds.is_empty()
            && let Err(error) = refund(self.store, &refunds, &mut refused).await
        {
            tracing::warn!(
                %error,
                "refund of a held request refused at shutdown failed: its tokens stay \
                 debited until the buckets refill"
            );
        }
        let until_turn = due.saturating_duration_since(TokioInstant::now());
        let retry_after_us = u64::try_from(until_turn.as_micros()).unwrap_or(u64::MAX);
        for (op, bucket) in plan.ops.iter().zip(&mut refused.buckets) {
            if op.enforce && op.params.max_wait_us > 0 && bucket.admitted {
                bucket.admitted = false;
                bucket.retry_after_us = Some(retry_after_us);
            }
        }
        refused
    }
}

/// Applies `refunds` (each the index of the op it gives back, and the refund) and
/// writes each refunded bucket's view after its refund into `applied`.
///
/// The store call runs as a task of its own, which the caller awaits: a caller that goes
/// away mid-refund (the client cancelled, or Envoy's timeout reset the stream) would
/// otherwise drop the call with it, and the debits it gives back, already stored, would stay
/// until the buckets refill. Only these rare steps (a quota-mode denial, a held request
/// refused at shutdown) pay for the task.
pub(super) async fn refund(
    store: &Arc<dyn Store>,
    refunds: &[(usize, BucketOp)],
    applied: &mut Applied,
) -> Result<(), StoreError> {
    let ops: Vec<BucketOp> = refunds.iter().map(|(_, op)| op.clone()).collect();
    let store = Arc::clone(store);
    let undone = tokio::spawn(async move { store.apply(&ops).await })
        .await
        .map_err(|error| StoreError::Failed(format!("the refund's task ended early: {error}")))??;
    for ((index, _), result) in refunds.iter().zip(&undone.buckets) {
        if let Some(bucket) = applied.buckets.get_mut(*index) {
            bucket.view = result.view;
        }
    }
    Ok(())
}

/// A request held by a `max_wait` limit: if it is dropped before it is answered (the caller
/// went away mid-wait), it refunds its debits from a task of its own and counts the request
/// as cancelled.
struct Waiting<'a> {
    store: &'a Arc<dyn Store>,
    metrics: &'a Arc<Metrics>,
    domain: &'a Arc<str>,
    /// The request and the store's answer: its refund is built from them only if it is
    /// cancelled, so a request served in turn copies nothing.
    plan: &'a Plan<'a>,
    applied: &'a Applied,
    /// Set once the request is answered: nothing to give back then.
    answered: bool,
    started: Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let held = self.started.elapsed();
        let ops: Vec<BucketOp> = self
            .plan
            .undo(self.applied)
            .into_iter()
            .map(|(_, op)| op)
            .collect();
        if ops.is_empty() {
            self.metrics
                .record_shaped(self.domain, ShapedEnd::Cancelled, held);
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("a cancelled shaped request could not be refunded: no runtime");
            self.metrics
                .record_shaped(self.domain, ShapedEnd::Cancelled, held);
            return;
        };
        let (store, metrics) = (Arc::clone(self.store), Arc::clone(self.metrics));
        let domain = Arc::clone(self.domain);
        runtime.spawn(async move {
            if let Err(error) = store.apply(&ops).await {
                tracing::warn!(
                    %error,
                    "refund of a cancelled shaped request failed: its tokens stay debited \
                     until the buckets refill"
                );
            }
            // Counted once the refund is done, so a reader of the metric sees it applied.
            metrics.record_shaped(&domain, ShapedEnd::Cancelled, held);
        });
    }
}
