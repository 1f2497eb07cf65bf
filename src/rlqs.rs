//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): Envoy
//! reports usage per bucket on a long-lived stream, and floodgate assigns each Envoy a quota
//! that it enforces locally, off the request path. docs/rlqs.md is the operator's view.
//!
//! # The protocol, as served
//!
//! - The stream's first message names the domain (INVALID_ARGUMENT without one; a later
//!   message may repeat it, or leave it empty, but not change it).
//! - Each report's `BucketId` (a map of key to value) is matched against the domain's limits
//!   as a descriptor of its entries, tried in every order ([`quota`]): nesting, wildcards,
//!   `unlimited` and limit 0 as for `ShouldRateLimit`. The first report of a bucket
//!   subscribes the stream to it (a report is never "for a bucket not subscribed": the
//!   protocol subscribes by reporting, and re-subscribes after an abandon the same way).
//! - Every report is answered with the bucket's assignment: a matched limit gets a
//!   `TokenBucket` holding this Envoy's share of the limit; an unmatched, `unlimited` or
//!   shadow-mode bucket gets `BlanketRule` `ALLOW_ALL`, a limit of 0 `DENY_ALL`.
//!   `RequestsPerTimeUnit` is never sent (Envoy does not enforce it). Every assignment has
//!   `--rlqs-assignment-ttl`: the same strategy again extends it, a new one replaces it.
//! - A bucket whose reports count no request for `--rlqs-abandon-after` gets an
//!   `AbandonAction`, and its share goes back.
//! - When the limits change (reload, xDS), every bucket whose quota changed is re-assigned
//!   within a tick (at most a second), without waiting for its next report; so is every
//!   bucket whose share a re-evaluation changed (below).
//! - At shutdown every stream sends each of its buckets its last strategy with a time to
//!   live of 0 (Envoy falls back to its `expired_assignment_behavior` at once), then ends.
//!
//! # Shares
//!
//! Several Envoys (streams, on one replica or several) holding one bucket share its rate.
//! Each holder has a row in the bucket's share table ([`share`]): its demand, measured from
//! its reports (`num_requests_allowed + num_requests_denied` over `time_elapsed`), its
//! grant, and an expiry a quarter past its assignment's. A report settles the reporting
//! holder's row atomically: its grant becomes `min(fair target, limit - the other live
//! grants)`, the fair target being max-min fair on demand. So the fill rates of the
//! assignments Envoys enforce never sum past the limit; a holder that stops reporting drops
//! out when its row expires.
//!
//! Others' grants move to their targets at their own next report, or sooner: every
//! `--rlqs-reassess-interval` each stream re-evaluates, in one batch, the rows of the buckets
//! it has not settled within the interval ([`share::reassess`]), and pushes an assignment
//! for each whose grant changed. So a newcomer to a bucket others hold in full (granted 0,
//! `DENY_ALL`) sees the holders shrink to their fair targets within one interval and its own
//! share granted within the next, without reporting again.
//!
//! # Bounds
//!
//! - `--rlqs-max-streams` streams at once, and `--rlqs-max-streams-per-peer` of them from
//!   one peer address (one more: RESOURCE_EXHAUSTED at once), so one client cannot hold
//!   every slot;
//! - a stream that sends no report for `--rlqs-report-timeout` ends (DEADLINE_EXCEEDED): a
//!   stream that only sent its headers holds no slot for long;
//! - `--rlqs-max-buckets-per-stream` subscriptions per stream, and `--rlqs-max-buckets`
//!   subscriptions and `--rlqs-max-bucket-bytes` bytes all streams together ([`ids`]: each
//!   distinct bucket id stored once); one more ends the stream with RESOURCE_EXHAUSTED;
//! - [`stream::MAX_BUCKET_ENTRIES`] entries per bucket id, and the gRPC port's message size
//!   bound (one more byte ends the stream with RESOURCE_EXHAUSTED).
//!
//! So what clients send holds at most `--rlqs-max-bucket-bytes` of subscriptions, plus one
//! message per open stream.
//!
//! # Rows outlive their streams
//!
//! A stream that ends (the client's reset, or an error floodgate sends) keeps its share rows,
//! and its places in the bound, until the last assignment it sent has expired: Envoy enforces
//! an assignment for its whole time to live, whatever became of the stream. Only at shutdown,
//! where every assignment is first expired (time to live 0), are the rows given back at once.
//!
//! Place in the flow: beside `service::RlsService` on the gRPC port (`server::run` registers
//! it; health, TLS, the connection bounds and reflection are the port's), reading the same
//! limits (`config`) and counting into the same registry (`metrics`).

pub mod ids;
pub mod metrics;
pub mod quota;
pub mod redis;
pub mod share;
pub mod stream;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::Config;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use crate::sources::Limits;
pub use ids::BucketIds;
pub use metrics::RlqsMetrics;
pub use redis::RedisShares;
pub use share::{MemoryShares, Shares};

/// The bounds and timings of the service (`floodgate serve`'s `--rlqs-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlqsOptions {
    /// Streams open at once, all clients together.
    pub max_streams: u32,
    /// Streams open at once from one peer address.
    pub max_streams_per_peer: u32,
    /// Buckets one stream may subscribe to.
    pub max_buckets_per_stream: u32,
    /// Subscriptions held at once, all streams together.
    pub max_buckets: u32,
    /// Bytes the subscriptions may be charged, all streams together ([`ids`]).
    pub max_bucket_bytes: usize,
    /// How long a stream may send no report before it is ended.
    pub report_timeout: Duration,
    /// Every assignment's time to live.
    pub assignment_ttl: Duration,
    /// How long a bucket may report no request before it is abandoned.
    pub abandon_after: Duration,
    /// How often a stream re-evaluates the shares of the buckets it has not reported since.
    pub reassess_interval: Duration,
}

/// Responses queued per stream before the stream's task waits for the client to read.
const OUTBOUND_QUEUE: usize = 4;

/// What every RLQS stream of this replica shares.
pub struct Rlqs {
    /// Bounds and timings.
    settings: RlqsOptions,
    /// The limits in force (swapped whole by reload and xDS).
    limits: Limits,
    /// Where holders' shares are settled (this process, or Redis for every replica).
    shares: Arc<dyn Shares>,
    /// The RLQS metrics.
    metrics: Arc<RlqsMetrics>,
    /// This replica's name in share tables: random per process, so two replicas (or a
    /// restarted one) never take each other's rows.
    replica: String,
    /// Every subscription's bucket id, stored once, within the replica-wide bound.
    ids: Arc<BucketIds>,
    /// Streams open now.
    open: AtomicUsize,
    /// Streams open now by peer address (TCP peers only).
    peers: Mutex<HashMap<IpAddr, u32>>,
    /// The number of the next stream.
    next: AtomicU64,
    /// True once the server shuts down.
    shutdown: watch::Sender<bool>,
}

impl std::fmt::Debug for Rlqs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rlqs")
            .field("settings", &self.settings)
            .field("replica", &self.replica)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl Rlqs {
    /// The limits in force.
    fn config(&self) -> Arc<Config> {
        Arc::clone(&self.limits.load().config)
    }
}

impl Rlqs {
    /// The service's shared state over `limits` and `shares`, counting into `metrics`.
    pub fn new(
        settings: RlqsOptions,
        limits: Limits,
        shares: Arc<dyn Shares>,
        metrics: Arc<RlqsMetrics>,
    ) -> Arc<Rlqs> {
        let replica = format!(
            "{:016x}",
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        );
        // A peer's share of the subscriptions is the share of the streams it may hold.
        let max_per_peer = (u64::from(settings.max_buckets)
            * u64::from(settings.max_streams_per_peer)
            / u64::from(settings.max_streams.max(1)))
        .max(1);
        let ids = Arc::new(BucketIds::new(
            settings.max_buckets as usize,
            usize::try_from(max_per_peer).unwrap_or(usize::MAX),
            settings.max_bucket_bytes,
            Arc::clone(&metrics),
        ));
        Arc::new(Rlqs {
            settings,
            limits,
            shares,
            metrics,
            replica,
            ids,
            open: AtomicUsize::new(0),
            peers: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            shutdown: watch::Sender::new(false),
        })
    }

    /// Every stream expires its assignments (time to live 0) and ends.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// How often a stream looks for idle buckets, changed limits and shares to re-evaluate.
    fn tick(&self) -> Duration {
        (self.settings.abandon_after / 4)
            .min(self.settings.reassess_interval)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// A place for one more stream from `peer`, unless `--rlqs-max-streams` are open, or
    /// `--rlqs-max-streams-per-peer` from that peer.
    fn open_stream(self: &Arc<Rlqs>, peer: Option<IpAddr>) -> Result<StreamSlot, Status> {
        let max = self.settings.max_streams as usize;
        if self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .is_err()
        {
            self.metrics.refused("streams");
            return Err(Status::resource_exhausted(format!(
                "{max} RLQS streams already open (--rlqs-max-streams)"
            )));
        }
        // Taken before the peer's check: the slot's drop gives both back.
        let mut slot = StreamSlot {
            rlqs: Arc::clone(self),
            number: self.next.fetch_add(1, Ordering::Relaxed),
            peer: None,
        };
        self.metrics.streams(1);
        if let Some(ip) = peer {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            let open = peers.entry(ip).or_insert(0);
            if *open >= self.settings.max_streams_per_peer {
                let open = *open;
                drop(peers);
                self.metrics.refused("peer");
                return Err(Status::resource_exhausted(format!(
                    "{open} RLQS streams already open from {ip} (--rlqs-max-streams-per-peer)"
                )));
            }
            *open += 1;
            slot.peer = Some(ip);
        }
        Ok(slot)
    }
}

/// One open stream's place; given back when dropped.
pub(crate) struct StreamSlot {
    rlqs: Arc<Rlqs>,
    /// The stream's number on this replica.
    number: u64,
    /// The peer whose count it takes.
    peer: Option<IpAddr>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(ip) = self.peer {
            let mut peers = self
                .rlqs
                .peers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(open) = peers.get_mut(&ip) {
                *open -= 1;
                if *open == 0 {
                    peers.remove(&ip);
                }
            }
        }
        self.rlqs.open.fetch_sub(1, Ordering::AcqRel);
        self.rlqs.metrics.streams(-1);
    }
}

/// Reads a call's peer address from what the transport put in its extensions.
pub type PeerOf = fn(&tonic::Extensions) -> Option<IpAddr>;

/// The gRPC face of [`Rlqs`].
#[derive(Clone)]
pub struct RlqsService {
    rlqs: Arc<Rlqs>,
    peer_of: PeerOf,
}

impl RlqsService {
    /// Serves `rlqs` over gRPC; `peer_of` names each call's peer for
    /// `--rlqs-max-streams-per-peer` (a call it names none of, as on a unix socket, counts
    /// against `--rlqs-max-streams` only).
    pub fn new(rlqs: Arc<Rlqs>, peer_of: PeerOf) -> RlqsService {
        RlqsService { rlqs, peer_of }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let slot = self
            .rlqs
            .open_stream((self.peer_of)(request.extensions()))?;
        let (out, responses) = mpsc::channel(OUTBOUND_QUEUE);
        let shutdown = self.rlqs.shutdown.subscribe();
        // The stream's call counts on its connection (busy, never idle) until the response
        // stream ends: the transport's counted body holds it.
        let reports = request.into_inner();
        tokio::spawn(stream::serve(
            Arc::clone(&self.rlqs),
            slot,
            reports,
            out,
            shutdown,
        ));
        Ok(Response::new(ReceiverStream::new(responses)))
    }
}
