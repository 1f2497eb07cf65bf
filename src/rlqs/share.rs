//! Shares of one bucket's rate among the Envoys that hold it: the pure rule ([`settle`]),
//! the [`Shares`] table every replica consults, and its in-process form ([`MemoryShares`]).
//!
//! A bucket's rate is `capacity` tokens per period. Each holder (one stream's subscription
//! to the bucket, on any replica) has a row: its demand (tokens per period, as its last
//! report measured it), the grant it was last sent, and when the row expires. A report
//! [`settle`]s the reporting holder's row:
//!
//! 1. rows past their expiry are dropped: their Envoys' assignments have expired too (the
//!    assignment's time to live is shorter than the row's life, see [`Ask::life_us`]);
//! 2. the holder's fair target is computed over the live rows: max-min fair (water-filling)
//!    on their demands, and any rate left once every demand is met split evenly among the
//!    holders *and one more*, so a newcomer finds some rate unassigned;
//! 3. its grant is `min(target, capacity - the other live rows' grants)`.
//!
//! Step 3 makes the invariant hold after every settle: the grants of the live rows sum to
//! at most `capacity`. Others' grants move towards their targets when they next report, or
//! when their stream [`reassess`]es them without a report (steps 1–3 on the demands stored),
//! which keeps the same invariant: so shares follow demand within a re-evaluation interval
//! or two.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use crate::clock::Clock;

/// One holder's row of a bucket's share table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Tokens per period the holder's Envoy saw asked for (allowed + denied), when known.
    pub demand: Option<u64>,
    /// Tokens per period it was granted.
    pub grant: u64,
    /// When the row stops counting, µs since the epoch.
    pub expires_us: i64,
}

/// What a holder's report asks of a bucket's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The bucket's rate: tokens per period, all holders together.
    pub capacity: u64,
    /// The holder's measured demand in tokens per period; `None` (no measure yet, or a
    /// re-assignment without a report) keeps the row's previous demand, and a holder whose
    /// demand was never measured counts as wanting the whole capacity.
    pub demand: Option<u64>,
    /// How long the row lives from now, µs: longer than the assignment's time to live, so an
    /// Envoy never enforces a grant the table has already forgotten.
    pub life_us: i64,
}

/// The table of one bucket: rows by holder.
pub type Table = BTreeMap<String, Row>;

/// Settles `holder`'s row of `table` at `now_us` (see the module doc) and returns its grant.
pub fn settle(table: &mut Table, holder: &str, ask: Ask, now_us: i64) -> u64 {
    table.retain(|name, row| row.expires_us > now_us || name == holder);
    let demand = ask
        .demand
        .or_else(|| table.get(holder).and_then(|row| row.demand));
    table.insert(
        holder.to_owned(),
        Row {
            demand,
            grant: 0,
            expires_us: now_us.saturating_add(ask.life_us),
        },
    );
    let target = fair_target(table, holder, ask.capacity);
    let others: u64 = table
        .iter()
        .filter(|(name, _)| name.as_str() != holder)
        .map(|(_, row)| row.grant)
        .fold(0, u64::saturating_add);
    let grant = target.min(ask.capacity.saturating_sub(others));
    if let Some(row) = table.get_mut(holder) {
        row.grant = grant;
    }
    grant
}

/// Re-evaluates `holder`'s live row of `table` at `now_us` without a report, for a bucket of
/// `capacity`: rows past their expiry are dropped, and the row's grant becomes
/// `min(fair target, capacity - the other live rows' grants)` on the demands stored, as
/// [`settle`] would make it. Returns the new grant only when it changed (the row then lives
/// `life_us` from now, as the assignment that carries it); `None` when it did not, or when
/// the holder has no live row (its assignment has expired too), and then nothing is written
/// for the holder.
pub fn reassess(
    table: &mut Table,
    holder: &str,
    capacity: u64,
    life_us: i64,
    now_us: i64,
) -> Option<u64> {
    table.retain(|_, row| row.expires_us > now_us);
    let current = table.get(holder)?.grant;
    let target = fair_target(table, holder, capacity);
    let others: u64 = table
        .iter()
        .filter(|(name, _)| name.as_str() != holder)
        .map(|(_, row)| row.grant)
        .fold(0, u64::saturating_add);
    let grant = target.min(capacity.saturating_sub(others));
    if grant == current {
        return None;
    }
    let row = table.get_mut(holder)?;
    row.grant = grant;
    row.expires_us = now_us.saturating_add(life_us);
    Some(grant)
}

/// `holder`'s fair share of `capacity` among the rows of `table`: max-min fair on demands
/// (unknown demand: the whole capacity), plus an even split, among the holders and one
/// more, of whatever every demand leaves over.
pub fn fair_target(table: &Table, holder: &str, capacity: u64) -> u64 {
    let want = |row: &Row| row.demand.unwrap_or(capacity).min(capacity);
    let mut demands: Vec<u64> = table.values().map(want).collect();
    demands.sort_unstable();
    let count = demands.len() as u64;
    let mut remaining = capacity;
    // The water level: each holder in ascending demand takes its demand or an even share of
    // what is left, whichever is smaller.
    let mut level = 0;
    for (i, demand) in demands.iter().enumerate() {
        let even = remaining / (count - i as u64);
        let take = (*demand).min(even);
        remaining -= take;
        level = level.max(take);
    }
    let own = table.get(holder).map_or(0, |row| want(row).min(level));
    own + remaining / (count + 1)
}

/// Where every replica's holders of every bucket are, and the one operation on them.
#[async_trait]
pub trait Shares: Send + Sync + 'static {
    /// Settles `holder`'s row in the table of `bucket` ([`settle`], atomically) and returns
    /// its grant in tokens per period.
    async fn settle(&self, bucket: &str, holder: &str, ask: Ask) -> Result<u64, ShareError>;

    /// Removes `holder`'s row of `bucket` (the bucket was abandoned, or its stream ended),
    /// so its rate goes to the others at their next report.
    async fn release(&self, bucket: &str, holder: &str) -> Result<(), ShareError>;

    /// [`reassess`]es `holder`'s row in each of `buckets` (table name, capacity), each row
    /// living `life_us` from now if its grant changes; the new grants, in order (`None`:
    /// unchanged or gone). One batch per stream: a call per bucket would cost a round trip
    /// each.
    async fn reassess(
        &self,
        holder: &str,
        buckets: &[(String, u64)],
        life_us: i64,
    ) -> Result<Vec<Option<u64>>, ShareError>;
}

/// The share table could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("share table unavailable: {0}")]
pub struct ShareError(pub String);

/// The share tables of one replica, in its memory: every stream of this replica shares
/// through it (the embedded store; several replicas share through Redis).
pub struct MemoryShares {
    tables: Mutex<HashMap<String, Table>>,
    clock: Arc<dyn Clock>,
}

impl MemoryShares {
    /// Empty tables on `clock`'s time.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryShares {
        MemoryShares {
            tables: Mutex::new(HashMap::new()),
            clock,
        }
    }

    /// Holders of `bucket` whose rows are live now; for tests and metrics.
    pub fn holders(&self, bucket: &str) -> usize {
        let now = self.clock.now_us();
        let tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        tables.get(bucket).map_or(0, |table| {
            table.values().filter(|row| row.expires_us > now).count()
        })
    }
}

#[async_trait]
impl Shares for MemoryShares {
    async fn settle(&self, bucket: &str, holder: &str, ask: Ask) -> Result<u64, ShareError> {
        let now = self.clock.now_us();
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        let table = tables.entry(bucket.to_owned()).or_default();
        Ok(settle(table, holder, ask, now))
    }

    async fn release(&self, bucket: &str, holder: &str) -> Result<(), ShareError> {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(table) = tables.get_mut(bucket) {
            table.remove(holder);
            // Every row belongs to a live subscription or is removed with it, so the tables
            // hold at most streams × buckets per stream rows; an empty table goes too.
            if table.is_empty() {
                tables.remove(bucket);
                // The map's table, grown by a flood of buckets, shrinks with it.
                if tables.capacity() > 64 && tables.len() < tables.capacity() / 4 {
                    let keep = tables.len() * 2;
                    tables.shrink_to(keep);
                }
            }
        }
        Ok(())
    }

    async fn reassess(
        &self,
        holder: &str,
        buckets: &[(String, u64)],
        life_us: i64,
    ) -> Result<Vec<Option<u64>>, ShareError> {
        let now = self.clock.now_us();
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(buckets
            .iter()
            .map(|(bucket, capacity)| {
                let table = tables.get_mut(bucket)?;
                reassess(table, holder, *capacity, life_us, now)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
