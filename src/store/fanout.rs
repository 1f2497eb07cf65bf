//! One request's bucket operations applied as several groups, each all-or-nothing on its
//! own, sent at once, and made all-or-nothing together by refunds.
//!
//! A store that cannot run every bucket of a request in one atomic script — the Redis Cluster
//! store (one script per hash slot), the per-second split ([`super::split`]: one Redis for
//! one-second buckets, another for the rest) — splits the operations into groups and hands
//! them to [`apply_groups`] with a function that runs one group:
//!
//! 1. every group runs concurrently;
//! 2. if every group committed, that is the answer;
//! 3. otherwise every group that committed is sent its refund — the same operations with the
//!    cost negated, for exactly the operations whose debit was stored (cost > 0, and admitted
//!    or overdraft, as [`crate::bucket::settle`] stores them) — concurrently, and the request
//!    is answered denied (or failed, if a group failed) with each refunded bucket's view after
//!    its refund: what a single atomic store reports for a denied request.
//!
//! Between steps 1 and 3 another request can see a debit that is then refunded (one round
//! trip); a refund that fails is logged, reported to the caller's `on_refund` (for its
//! metric), and leaves that request's cost debited until the bucket refills. The refunds run
//! in a task of their own, which the call awaits: a caller that goes away meanwhile (its
//! client cancelled, or Envoy's timeout reset the stream) leaves them running, so a denied
//! request debits nothing whether or not anyone waits for its answer (as the decider's own
//! refunds, `service::hold::refund`). Hence the group runner's futures and `on_refund` own
//! what they use (`'static`). A credit
//! (`is_negative_hits`) stored by a committed group of a denied request stays stored: taking
//! it back could over-debit a bucket the credit filled to capacity.

use std::future::Future;

use futures_util::future::join_all;

use super::StoreError;
use crate::bucket::{Applied, BucketOp, BucketResult, Undo};
use crate::limiter::View;

/// One group's answer.
pub type GroupAnswer = Result<Applied, StoreError>;

/// Applies `ops` as `groups` (indices into `ops`; each op in exactly one group):
/// `run(g, ops of group g)` for every group at once, then refunds as the module docs say.
/// `on_refund(ok)` is told the outcome of every refund sent, from the refunds' own task.
pub async fn apply_groups<F, Fut>(
    ops: &[BucketOp],
    groups: &[Vec<usize>],
    run: F,
    on_refund: impl Fn(bool) + Send + 'static,
) -> Result<Applied, StoreError>
where
    F: Fn(usize, Vec<BucketOp>) -> Fut,
    Fut: Future<Output = GroupAnswer> + Send + 'static,
{
    let Joined {
        mut buckets,
        committed,
        delay_us,
        failure,
        debited_groups,
    } = join_groups(ops, groups, &run).await;
    if !committed {
        refund(ops, groups, &debited_groups, &mut buckets, &run, on_refund).await;
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(Applied {
            committed,
            buckets,
            from_local_cache: false,
            // A refunded request is not held: it is refused.
            delay_us: if committed { delay_us } else { 0 },
        }),
    }
}

/// Sets `ops` as `groups`: `run(g, ops of group g)` for every group at once, and nothing
/// else. A set commits wherever it runs, so nothing is refunded: a group that fails fails
/// the call and the groups that ran keep their set (a set's "refund", its cost negated,
/// would fill its buckets instead of undoing the set).
pub async fn set_groups<F, Fut>(
    ops: &[BucketOp],
    groups: &[Vec<usize>],
    run: F,
) -> Result<Applied, StoreError>
where
    F: Fn(usize, Vec<BucketOp>) -> Fut,
    Fut: Future<Output = GroupAnswer>,
{
    let joined = join_groups(ops, groups, &run).await;
    match joined.failure {
        Some(error) => Err(error),
        None => Ok(Applied {
            committed: joined.committed,
            buckets: joined.buckets,
            from_local_cache: false,
            delay_us: 0,
        }),
    }
}

/// Every group's answer, put together: each op's result from its group's answer, and what
/// the groups said as a whole.
struct Joined {
    /// Each op's result; a failed group's ops keep a placeholder (the call then fails).
    buckets: Vec<BucketResult>,
    /// Every group committed.
    committed: bool,
    /// The longest delay any group asked for.
    delay_us: u64,
    /// The first group's error, if any failed.
    failure: Option<StoreError>,
    /// For each group, whether it committed (its debits are stored).
    debited_groups: Vec<bool>,
}

/// Runs every group at once and puts their answers together ([`Joined`]).
async fn join_groups<F, Fut>(ops: &[BucketOp], groups: &[Vec<usize>], run: &F) -> Joined
where
    F: Fn(usize, Vec<BucketOp>) -> Fut,
    Fut: Future<Output = GroupAnswer>,
{
    let answers: Vec<GroupAnswer> = join_all(
        groups
            .iter()
            .enumerate()
            .map(|(g, members)| run(g, members.iter().map(|&i| ops[i].clone()).collect())),
    )
    .await;
    // Each op's result from its group's answer; a failed group's ops keep a placeholder
    // (the call then fails as a whole).
    let mut buckets = vec![
        BucketResult {
            admitted: false,
            view: View {
                remaining: 0,
                reset_us: 0,
            },
            retry_after_us: None,
            window: None,
            at_us: None,
        };
        ops.len()
    ];
    let mut committed = true;
    let mut delay_us = 0;
    let mut failure = None;
    let mut debited_groups = Vec::with_capacity(groups.len());
    for (members, answer) in groups.iter().zip(answers) {
        match answer {
            Ok(applied) => {
                committed &= applied.committed;
                delay_us = delay_us.max(applied.delay_us);
                debited_groups.push(applied.committed);
                for (&i, result) in members.iter().zip(&applied.buckets) {
                    buckets[i] = *result;
                }
            }
            Err(error) => {
                committed = false;
                debited_groups.push(false);
                failure.get_or_insert(error);
            }
        }
    }
    Joined {
        buckets,
        committed,
        delay_us,
        failure,
        debited_groups,
    }
}

/// Refunds what the groups flagged in `debited_groups` (those that committed) debited, in a
/// task of its own (see the module docs), and writes each refunded bucket's view after its
/// refund into `buckets`.
async fn refund<F, Fut>(
    ops: &[BucketOp],
    groups: &[Vec<usize>],
    debited_groups: &[bool],
    buckets: &mut [BucketResult],
    run: &F,
    on_refund: impl Fn(bool) + Send + 'static,
) where
    F: Fn(usize, Vec<BucketOp>) -> Fut,
    Fut: Future<Output = GroupAnswer> + Send + 'static,
{
    let (refunds, undos): (Vec<_>, Vec<_>) = groups
        .iter()
        .enumerate()
        .zip(debited_groups)
        .filter(|(_, debited)| **debited)
        .filter_map(|((g, members), _)| {
            let (debited, undo): (Vec<usize>, Vec<BucketOp>) = members
                .iter()
                .filter_map(|&i| Some((i, ops[i].undo(&buckets[i], Undo::NotCommitted)?)))
                .unzip();
            (!debited.is_empty()).then_some(((g, debited), undo))
        })
        .unzip();
    if refunds.is_empty() {
        return;
    }
    let sizes: Vec<usize> = refunds.iter().map(|(_, debited)| debited.len()).collect();
    let runs: Vec<Fut> = refunds
        .iter()
        .zip(undos)
        .map(|((g, _), undo)| run(*g, undo))
        .collect();
    // Counted and logged in the task, so a refund whose caller left is counted too.
    let task = tokio::spawn(async move {
        let answers = join_all(runs).await;
        for (answer, size) in answers.iter().zip(sizes) {
            on_refund(answer.is_ok());
            if let Err(error) = answer {
                // The debit stays until the bucket refills: at most this request's cost.
                tracing::warn!(
                    %error,
                    buckets = size,
                    "refund failed: a denied request stays debited until its buckets refill"
                );
            }
        }
        answers
    });
    let answers = match task.await {
        Ok(answers) => answers,
        Err(error) => {
            tracing::warn!(%error, "refund task ended early: its debits stay until refilled");
            return;
        }
    };
    for ((_, debited), answer) in refunds.iter().zip(answers) {
        if let Ok(refunded) = answer {
            for (&i, after) in debited.iter().zip(&refunded.buckets) {
                buckets[i].view = after.view;
            }
        }
    }
}
