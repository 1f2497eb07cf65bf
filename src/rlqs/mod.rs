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
//! `--rlqs-max-streams` streams at once (one more: RESOURCE_EXHAUSTED at once),
//! `--rlqs-max-buckets-per-stream` subscriptions per stream (one more: the stream ends with
//! RESOURCE_EXHAUSTED), [`stream::MAX_BUCKET_ENTRIES`] entries per bucket id, and the gRPC
//! port's message size bound: what a client sends cannot grow memory past
//! streams × buckets × message size.
//!
//! Place in the flow: beside `service::RlsService` on the gRPC port (`server::run` registers
//! it; health, TLS, the connection bounds and reflection are the port's), reading the same
//! limits (`config`) and counting into the same registry (`metrics`).

pub mod metrics;
pub mod quota;
pub mod redis;
pub mod share;
pub mod stream;

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::Config;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
pub use metrics::RlqsMetrics;
pub use redis::RedisShares;
pub use share::{MemoryShares, Shares};

/// The bounds and timings of the service (`floodgate serve`'s `--rlqs-*` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RlqsOptions {
    /// Streams open at once, all clients together.
    pub max_streams: u32,
    /// Buckets one stream may subscribe to.
    pub max_buckets_per_stream: u32,
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
    config: Arc<ArcSwap<Config>>,
    /// Where holders' shares are settled (this process, or Redis for every replica).
    shares: Arc<dyn Shares>,
    /// The RLQS metrics.
    metrics: Arc<RlqsMetrics>,
    /// This replica's name in share tables: random per process, so two replicas (or a
    /// restarted one) never take each other's rows.
    replica: String,
    /// Streams open now.
    open: AtomicUsize,
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
    /// The service's shared state over `config` and `shares`, counting into `metrics`.
    pub fn new(
        settings: RlqsOptions,
        config: Arc<ArcSwap<Config>>,
        shares: Arc<dyn Shares>,
        metrics: Arc<RlqsMetrics>,
    ) -> Arc<Rlqs> {
        let replica = format!(
            "{:016x}",
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        );
        Arc::new(Rlqs {
            settings,
            config,
            shares,
            metrics,
            replica,
            open: AtomicUsize::new(0),
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

    /// A place for one more stream, unless `--rlqs-max-streams` are open.
    fn open_stream(self: &Arc<Rlqs>) -> Option<StreamSlot> {
        let max = self.settings.max_streams as usize;
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < max).then_some(open + 1)
            })
            .ok()?;
        self.metrics.streams(1);
        Some(StreamSlot {
            rlqs: Arc::clone(self),
            number: self.next.fetch_add(1, Ordering::Relaxed),
        })
    }
}

/// One open stream's place; given back when dropped.
pub(crate) struct StreamSlot {
    rlqs: Arc<Rlqs>,
    /// The stream's number on this replica.
    number: u64,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.rlqs.open.fetch_sub(1, Ordering::AcqRel);
        self.rlqs.metrics.streams(-1);
    }
}

/// The gRPC face of [`Rlqs`].
#[derive(Clone)]
pub struct RlqsService {
    rlqs: Arc<Rlqs>,
}

impl RlqsService {
    /// Serves `rlqs` over gRPC.
    pub fn new(rlqs: Arc<Rlqs>) -> RlqsService {
        RlqsService { rlqs }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let Some(slot) = self.rlqs.open_stream() else {
            self.rlqs.metrics.refused("streams");
            return Err(Status::resource_exhausted(format!(
                "{} RLQS streams already open (--rlqs-max-streams)",
                self.rlqs.settings.max_streams
            )));
        };
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
