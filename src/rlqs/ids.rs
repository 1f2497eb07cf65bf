//! The bucket ids every stream of this replica subscribes to, each stored once, and the
//! replica-wide bound on subscriptions (`--rlqs-max-buckets`, `--rlqs-max-bucket-bytes`).
//!
//! Envoys that put the same requests into the same buckets report the same ids, so a
//! subscription holds a shared, interned [`BucketKey`] (its domain and sorted entries): a
//! thousand streams on one bucket keep its bytes once. Each subscription is charged
//! [`SUBSCRIPTION_BYTES`] (its state on the stream, its share table row and name), and each
//! distinct id its own length plus [`ID_BYTES`]; a subscription that would take either count
//! past its bound is refused, and the stream ends with RESOURCE_EXHAUSTED. Dropping the
//! [`Subscribed`] guard gives the charge back, and the id's bytes with its last holder, so
//! nothing a client subscribed outlives its streams (and their rows, which wait for their
//! assignments to expire).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use super::metrics::RlqsMetrics;

/// What one subscription costs beside its id's bytes: its state on the stream, its row and
/// the table's name (hashed past [`super::quota::MAX_TABLE_PART`] bytes a part), and the map
/// slots holding them. A round figure above what they take on a 64-bit target.
pub const SUBSCRIPTION_BYTES: usize = 1024;

/// What one distinct id costs beside its keys and values: its map slot, reference count and
/// string headers.
pub const ID_BYTES: usize = 128;

/// Each entry's two string headers and its tuple.
const ENTRY_BYTES: usize = 48;

/// One bucket id in one domain: what Envoys report, in a canonical form (entries sorted).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct BucketKey {
    /// The stream's domain.
    pub domain: String,
    /// The id's entries, sorted by key.
    pub entries: Vec<(String, String)>,
}

impl BucketKey {
    /// The bytes this id is charged once, however many streams hold it.
    pub fn bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|(k, v)| k.len() + v.len() + ENTRY_BYTES)
            .sum::<usize>()
            + self.domain.len()
            + ID_BYTES
    }
}

/// Why a subscription was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// `--rlqs-max-buckets` subscriptions are held, all streams together.
    #[error(
        "this replica already holds {0} RLQS bucket subscriptions, all streams together \
         (--rlqs-max-buckets)"
    )]
    Buckets(usize),
    /// The subscriptions' bytes would pass `--rlqs-max-bucket-bytes`.
    #[error(
        "RLQS bucket subscriptions hold {0} bytes on this replica, all streams together \
         (--rlqs-max-bucket-bytes)"
    )]
    Bytes(usize),
    /// One peer's subscriptions, its ended streams' lingering ones included, would pass its
    /// share of `--rlqs-max-buckets` (the share `--rlqs-max-streams-per-peer` gives it of
    /// `--rlqs-max-streams`).
    #[error(
        "this peer already holds {0} RLQS bucket subscriptions on this replica, its share of \
         --rlqs-max-buckets (--rlqs-max-streams-per-peer of --rlqs-max-streams)"
    )]
    Peer(usize),
}

/// The interned ids and the counts of the bound.
#[derive(Default)]
struct Held {
    /// Each distinct id, with the number of subscriptions holding it.
    ids: HashMap<Arc<BucketKey>, usize>,
    /// Subscriptions held.
    buckets: usize,
    /// Bytes charged.
    bytes: usize,
    /// Subscriptions held per peer address (streams from a unix socket have none).
    peers: HashMap<IpAddr, usize>,
}

/// Every subscription of this replica: the ids, stored once, and the bound.
pub struct BucketIds {
    max_buckets: usize,
    max_bytes: usize,
    /// Subscriptions one peer may hold: its share of `max_buckets`, so that one client
    /// cannot fill the bound for every other Envoy, even with streams it has ended.
    max_per_peer: usize,
    held: Mutex<Held>,
    metrics: Arc<RlqsMetrics>,
}

impl BucketIds {
    /// At most `max_buckets` subscriptions (`max_per_peer` of them for one peer) and
    /// `max_bytes` bytes, counted into `metrics`.
    pub fn new(
        max_buckets: usize,
        max_per_peer: usize,
        max_bytes: usize,
        metrics: Arc<RlqsMetrics>,
    ) -> BucketIds {
        BucketIds {
            max_buckets,
            max_per_peer,
            max_bytes,
            held: Mutex::new(Held::default()),
            metrics,
        }
    }

    /// A subscription to `key` for a stream from `peer`, sharing its id with every other
    /// holder; refused past the bound.
    pub fn subscribe(
        self: &Arc<Self>,
        key: BucketKey,
        peer: Option<IpAddr>,
    ) -> Result<Subscribed, Full> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.buckets >= self.max_buckets {
            return Err(Full::Buckets(held.buckets));
        }
        if let Some(ip) = peer {
            let of_peer = held.peers.get(&ip).copied().unwrap_or(0);
            if of_peer >= self.max_per_peer {
                return Err(Full::Peer(of_peer));
            }
        }
        let existing = held.ids.get_key_value(&key).map(|(k, _)| Arc::clone(k));
        let cost = SUBSCRIPTION_BYTES + existing.as_ref().map_or_else(|| key.bytes(), |_| 0);
        if held.bytes.saturating_add(cost) > self.max_bytes {
            return Err(Full::Bytes(held.bytes));
        }
        let key = existing.unwrap_or_else(|| Arc::new(key));
        *held.ids.entry(Arc::clone(&key)).or_insert(0) += 1;
        held.buckets += 1;
        held.bytes += cost;
        if let Some(ip) = peer {
            *held.peers.entry(ip).or_insert(0) += 1;
        }
        self.metrics.bucket_bytes(held.bytes);
        Ok(Subscribed {
            key,
            peer,
            ids: Arc::clone(self),
        })
    }

    /// Subscriptions held now, all streams together (ended streams' lingering rows included).
    pub fn held(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        (held.buckets, held.bytes)
    }

    fn give_back(&self, key: &Arc<BucketKey>, peer: Option<IpAddr>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ip) = peer
            && let Some(of_peer) = held.peers.get_mut(&ip)
        {
            *of_peer -= 1;
            if *of_peer == 0 {
                held.peers.remove(&ip);
            }
        }
        let mut freed = SUBSCRIPTION_BYTES;
        if let Some(count) = held.ids.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                held.ids.remove(key);
                freed += key.bytes();
            }
        }
        held.buckets = held.buckets.saturating_sub(1);
        held.bytes = held.bytes.saturating_sub(freed);
        // The map's table, grown by a flood, shrinks with it.
        if held.ids.capacity() > 64 && held.ids.len() < held.ids.capacity() / 4 {
            let keep = held.ids.len() * 2;
            held.ids.shrink_to(keep);
        }
        self.metrics.bucket_bytes(held.bytes);
    }
}

/// One subscription's place in the bound and its shared id; given back when dropped.
pub struct Subscribed {
    key: Arc<BucketKey>,
    /// The peer whose share it takes.
    peer: Option<IpAddr>,
    ids: Arc<BucketIds>,
}

impl Subscribed {
    /// The id.
    pub fn key(&self) -> &Arc<BucketKey> {
        &self.key
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.ids.give_back(&self.key, self.peer);
    }
}

#[cfg(test)]
mod tests;
