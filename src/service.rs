//! The rate-limit service: `ShouldRateLimit` from request to response.
//!
//! [`Decider::should_rate_limit`] is the whole request path — plan against the current
//! limits, apply the plan's bucket operations in the store, build the response, count it —
//! shared by the gRPC service ([`RlsService`]) and the HTTP `POST /json` endpoint.
//! [`RequestError`] is the one error type of that path and `From<RequestError> for Status`
//! the one place it becomes a gRPC status.
//!
//! Overload: at most `max_in_flight` requests are inside the request path at once (gRPC and
//! `/json` together). One more is refused at once with [`RequestError::Overloaded`] rather
//! than queued: Envoy's rate-limit call has a short deadline (20 ms by default), so a queued
//! request would mostly time out anyway, after holding memory; an immediate
//! `RESOURCE_EXHAUSTED` lets Envoy apply its `failure_mode_deny` right away. A gRPC call is
//! admitted by [`crate::admission`] as soon as its stream opens, before its body has arrived,
//! so streams that never send one count too.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::watch;
use tokio::time::Instant as TokioInstant;
use tonic::{Request, Response, Status};

use crate::bucket::{Applied, BucketOp};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::plan::{InvalidRequest, Plan, PlanOptions};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_server::RateLimitService,
};
use crate::store::{Store, StoreError};
use crate::telemetry::metrics::{Metrics, RequestResult, ShapedEnd};
use crate::telemetry::otel::{RequestSpan, Traces};

/// Why a ShouldRateLimit call failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request is malformed; the message says exactly how.
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `max_in_flight` requests were already being answered; this one was not queued.
    #[error("overloaded: {max_in_flight} requests already in flight (--max-in-flight); not queued")]
    Overloaded {
        /// The configured bound.
        max_in_flight: usize,
    },
}

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Status {
        match error {
            RequestError::Invalid(e) => Status::invalid_argument(e.0),
            // UNAVAILABLE, not a made-up OK: Envoy then applies its own failure_mode_deny,
            // which is the operator's decision to make, not ours.
            RequestError::Store(e) => Status::unavailable(e.to_string()),
            // RESOURCE_EXHAUSTED is gRPC's code for "out of a quota or capacity"; like
            // UNAVAILABLE, it leaves the allow/deny decision to Envoy's failure_mode_deny.
            e @ RequestError::Overloaded { .. } => Status::resource_exhausted(e.to_string()),
        }
    }
}

/// The response header of a request a `max_wait` limit held: how long, in ms (rounded up).
pub const DELAYED_HEADER: &str = "x-ratelimit-delayed-ms";

/// How long before shutdown's cut a held request's turn must come for it to be served: its
/// answer still has to be written before the connections are closed.
const ANSWER_MARGIN: Duration = Duration::from_millis(250);

/// The largest `--max-in-flight` (tokio's semaphore bound, kept when the bound became one
/// atomic count): no practical limit.
pub const MAX_IN_FLIGHT: usize = usize::MAX >> 3;

/// The shared request path, which decides every request: plan it against the current
/// limits, apply its bucket operations in the store, answer it, count it. (Named for what it
/// does with a request; the algorithms it applies are [`crate::limiter`]'s.)
pub struct Decider {
    /// The limits in force; swapped whole on reload so a request sees one version.
    config: Arc<ArcSwap<Config>>,
    /// Where buckets live.
    store: Arc<dyn Store>,
    /// Shadow mode, override algorithm, request bounds.
    options: PlanOptions,
    /// Where outcomes are counted.
    metrics: Arc<Metrics>,
    /// Requests answered at once, at most.
    max_in_flight: usize,
    /// Requests being answered now (gRPC streams from their first frame): the bound's count,
    /// shown by `metrics` as `floodgate_requests_in_flight` at each exposition. Why not a
    /// semaphore: its permit (an `Arc` clone) and its release (a mutex) cost more per request
    /// than one atomic.
    in_flight: Arc<AtomicUsize>,
    /// The pod's clock, which names the window of a counter shared with reference pods (the
    /// reference takes it from its own clock, not Redis's).
    clock: Arc<dyn Clock>,
    /// Where request spans go; `None` (tracing off) costs the request path one branch.
    traces: Option<Arc<Traces>>,
    /// When shutdown cuts every call off, once it has begun (`None` before): a request a
    /// `max_wait` limit holds is served at its turn only if that comes before the cut
    /// ([`Decider::shutting_down`]).
    cut: watch::Sender<Option<TokioInstant>>,
    /// Requests with keys or values over `--max-value-bytes` or ignored `limit` overrides
    /// (which a client may send on every request) are logged at most this often.
    fixups: notice::Notice,
}

/// How often requests the planner stood in for are logged: at most once per 10 s.
const FIXUPS_NOTICE_US: i64 = 10_000_000;

/// Which entry point a request came through, for its span's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryPoint {
    /// gRPC `ShouldRateLimit`.
    Grpc,
    /// HTTP `POST /json`.
    Json,
}

impl Decider {
    /// A decider over `config` and `store`, with no practical bound on requests in flight
    /// (see [`Decider::with_max_in_flight`]).
    pub fn new(
        config: Arc<ArcSwap<Config>>,
        store: Arc<dyn Store>,
        options: PlanOptions,
        metrics: Arc<Metrics>,
    ) -> Decider {
        let in_flight = Arc::new(AtomicUsize::new(0));
        metrics.mirror_requests_in_flight(Arc::clone(&in_flight));
        Decider {
            config,
            store,
            options,
            metrics,
            max_in_flight: MAX_IN_FLIGHT,
            in_flight,
            clock: Arc::new(SystemClock),
            traces: None,
            cut: watch::Sender::new(None),
            fixups: notice::Notice::every_us(FIXUPS_NOTICE_US),
        }
    }

    /// Names the windows of reference counters by `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Decider {
        self.clock = clock;
        self
    }

    /// Records a span per request (and per store call) in `traces`.
    pub fn with_traces(mut self, traces: Option<Arc<Traces>>) -> Decider {
        self.traces = traces;
        self
    }

    /// Answers at most `max` requests at once; more are refused with
    /// [`RequestError::Overloaded`]. `max` is clamped to 1..=[`MAX_IN_FLIGHT`].
    pub fn with_max_in_flight(mut self, max: usize) -> Decider {
        let max = max.clamp(1, MAX_IN_FLIGHT);
        self.max_in_flight = max;
        self
    }

    /// The limits currently in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The metrics this decider records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store requests are answered from (the operator console inspects and resets
    /// buckets through it, bypassing metrics and admission).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// How requests are planned.
    pub fn options(&self) -> &PlanOptions {
        &self.options
    }

    /// Names the window of every counter of `ops` shared with reference pods by the pod's
    /// clock now, with a freshly drawn expiry (`bucket::stamp_reference_counters`): what the
    /// request path does after planning, for anything else that plans (the console).
    pub fn stamp_reference_counters(&self, ops: &mut [BucketOp]) {
        if let Some(counters) = &self.options.reference_counters {
            let now_secs = u64::try_from(self.clock.now_us() / 1_000_000).unwrap_or(0);
            crate::bucket::stamp_reference_counters(
                ops,
                now_secs,
                counters.expiry_jitter_max_secs,
                jitter_roll,
            );
        }
    }

    /// Counts what the planner stood in for in `request` (keys and values over
    /// `--max-value-bytes`, known by their digest; `limit` overrides without a unit, ignored)
    /// and logs it at a bounded rate: never the bytes themselves, which a client chose.
    fn report_fixups(&self, request: &RateLimitRequest, plan: &Plan<'_>) {
        let (oversized, ignored) = (plan.oversized_values(), plan.ignored_overrides());
        self.metrics.record_request_fixups(oversized, ignored);
        if let Some(requests) = self.fixups.occurred(self.clock.now_us()) {
            tracing::warn!(
                domain = %request.domain,
                oversized_values = oversized,
                ignored_overrides = ignored,
                requests_since_last_logged = requests,
                "request limited with descriptor keys or values over --max-value-bytes \
                 (matched in full, counted under their digest) or a limit override without a \
                 unit (ignored); floodgate_oversized_values_total and \
                 floodgate_ignored_overrides_total count them"
            );
        }
    }

    /// Takes one of the `max_in_flight` places, or refuses (counted) when none is left. The
    /// place is held until the returned guard is dropped; this never waits, so overload never
    /// queues.
    pub fn admit(&self) -> Result<Admitted, RequestError> {
        // One atomic shared by every serving thread: the count never goes above the bound.
        let max = self.max_in_flight;
        let entered = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if entered.is_err() {
            self.metrics.record_request(RequestResult::Overloaded);
            tracing::debug!("overloaded: request refused");
            return Err(RequestError::Overloaded {
                max_in_flight: self.max_in_flight,
            });
        }
        Ok(Admitted {
            in_flight: Arc::clone(&self.in_flight),
        })
    }

    /// Answers one request (admitting it first: see [`Decider::admit`]).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        let _admitted = self.admit()?;
        self.answer_admitted(request).await
    }

    /// Answers one request that came through `entry` with `headers` (admitting it first),
    /// traced as a child of the caller's span found in them when tracing is on.
    pub async fn should_rate_limit_from(
        &self,
        request: &RateLimitRequest,
        entry: EntryPoint,
        headers: &http::HeaderMap,
    ) -> Result<RateLimitResponse, RequestError> {
        let _admitted = self.admit()?;
        self.answer_traced(request, entry, Some(headers)).await
    }

    /// Answers one request already holding a place from [`Decider::admit`], timed in
    /// `floodgate_request_duration_seconds` (both gRPC and `/json` come this way).
    pub async fn answer_admitted(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        self.answer_traced(request, EntryPoint::Grpc, None).await
    }

    /// Answers one admitted request that came through `entry`, timed in
    /// `floodgate_request_duration_seconds`, and a child span of the caller's trace found in
    /// `headers` when tracing is on.
    pub async fn answer_traced(
        &self,
        request: &RateLimitRequest,
        entry: EntryPoint,
        headers: Option<&http::HeaderMap>,
    ) -> Result<RateLimitResponse, RequestError> {
        let started = Instant::now();
        let span = self.traces.as_ref().map(|traces| {
            let name = match entry {
                EntryPoint::Grpc => crate::telemetry::otel::GRPC_SPAN,
                EntryPoint::Json => crate::telemetry::otel::JSON_SPAN,
            };
            traces.request(name, headers)
        });
        let answered = self.answer(request, span.as_ref()).await;
        let result = match &answered {
            Ok((_, result)) => *result,
            Err(RequestError::Invalid(_)) => RequestResult::Invalid,
            Err(RequestError::Store(_)) => RequestResult::StoreError,
            Err(RequestError::Overloaded { .. }) => RequestResult::Overloaded,
        };
        self.metrics
            .record_request_duration(result, started.elapsed());
        if let Some(span) = span {
            span.end(
                &request.domain,
                request.descriptors.len(),
                result.label(),
                self.store.name(),
                answered.as_ref().err().map(|e| e as &dyn std::fmt::Display),
            );
        }
        answered.map(|(response, _)| response)
    }

    /// The request path proper, with the response's result; `span`, when the request is traced.
    async fn answer(
        &self,
        request: &RateLimitRequest,
        span: Option<&RequestSpan<'_>>,
    ) -> Result<(RateLimitResponse, RequestResult), RequestError> {
        let config = self.config.load_full();
        let mut plan = Plan::build(request, &config, &self.options).inspect_err(|e| {
            self.metrics.record_request(RequestResult::Invalid);
            tracing::debug!(domain = %request.domain, error = %e, "invalid request");
        })?;
        if plan.oversized_values() > 0 || plan.ignored_overrides() > 0 {
            self.report_fixups(request, &plan);
        }
        // Once, before any store call: a refund must name the counter its debit did.
        self.stamp_reference_counters(&mut plan.ops);
        let applied = if plan.ops.is_empty() {
            // Nothing to count (unknown domain, no match, unlimited): no store access.
            Applied::nothing()
        } else {
            // Boxed: a span is some 300 bytes, which every request would otherwise keep, as
            // part of its state, across the store's wait, traced or not.
            let store_span =
                span.map(|span| Box::new(span.store_call(self.store.name(), plan.ops.len())));
            let started = Instant::now();
            let applied = self.store.apply(&plan.ops).await;
            self.metrics
                .record_store_duration(self.store.name(), started.elapsed());
            if let Some(store_span) = store_span {
                store_span.end(applied.as_ref().err().map(|e| e as &dyn std::fmt::Display));
            }
            applied.inspect_err(|e| {
                self.metrics.record_request(RequestResult::StoreError);
                if let Some(domain) = plan.domain_label() {
                    self.metrics.record_rule_errors(domain, plan.rule_hits());
                }
                tracing::debug!(domain = %request.domain, error = %e, "store failed");
            })?
        };
        // The two rare steps (a quota-mode refund, a `max_wait` hold) are boxed where they
        // happen: awaited inline, their futures would be part of every request's state.
        let refunds = plan.refunds(&applied);
        let applied = if refunds.is_empty() {
            applied
        } else {
            Box::pin(self.undo_quota_denial(refunds, applied)).await?
        };
        // Only a configured domain has buckets, hence a delay. Held before the response is
        // built, so that the response is not part of what a held request keeps meanwhile.
        let shaped = applied.committed && applied.delay_us > 0 && !plan.denies(&applied);
        let hold = match plan.domain_label().filter(|_| shaped) {
            Some(domain) => Some(Box::pin(self.hold(&plan, &applied, domain)).await),
            None => None,
        };
        let (applied, held) = match hold {
            Some(Hold::Served(held)) => (applied, Some(held)),
            Some(Hold::Refused(refused)) => (refused, None),
            None => (applied, None),
        };
        let mut outcome = plan.respond(&applied, &self.options);
        if outcome.domain.is_none() {
            self.metrics
                .record_domain_not_found(&request.domain, request.descriptors.len());
        }
        if let Some(held) = held {
            outcome.response.response_headers_to_add.push(HeaderValue {
                key: DELAYED_HEADER.to_string(),
                value: held.as_micros().div_ceil(1_000).to_string(),
                raw_value: Vec::new(),
            });
        }
        let over = outcome.over;
        let result = if over {
            RequestResult::OverLimit
        } else {
            RequestResult::Ok
        };
        self.metrics.record_outcome(&outcome, result);
        tracing::debug!(
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            over_limit = over,
            "answered"
        );
        Ok((outcome.response, result))
    }
}

/// How a request a `max_wait` limit held ends.
enum Hold {
    /// Its turn came: answered OK, after this long.
    Served(Duration),
    /// Shutdown cuts the connections off before its turn: its debits are given back and it
    /// is answered from this, which denies it.
    Refused(Applied),
}

impl Decider {
    /// Holds a committed request for the delay its `max_wait` limits admitted it with. Its
    /// tokens are already debited, so later requests queue behind it. It is served at its
    /// turn, never earlier: when shutdown will cut the connections off before that turn
    /// (see [`Decider::shutting_down`]), its debits are given back and it is refused at
    /// once instead. If the caller drops the request while it waits (the client cancelled
    /// or timed out), its debits are given back too: the tokens go to the next request.
    async fn hold(&self, plan: &Plan<'_>, applied: &Applied, domain: &Arc<str>) -> Hold {
        let mut waiting = Waiting {
            store: &self.store,
            metrics: &self.metrics,
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
            && let Err(error) = self.refund(&refunds, &mut refused).await
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

    /// Shutdown has begun and cuts every connection off at `cut` (moved earlier when an
    /// operator cuts the drain short). A request a `max_wait` limit holds is still served
    /// at its turn if that comes before the cut; otherwise its debits are given back and it
    /// is refused at once (OVER_LIMIT), now or when it arrives. Never admitted early: its
    /// tokens are ones only its turn brings, and spending them now would admit more than
    /// the limit. A refusal rather than an RPC error, which Envoy would fail open.
    pub fn shutting_down(&self, cut: TokioInstant) {
        self.cut.send_replace(Some(cut));
    }

    /// Quota-mode buckets and explicit charges do not block the store's commit (only the
    /// request as a whole knows whether every quota-mode descriptor is over; a charge is
    /// debited fitting or not), so when either denies a committed request its other debits
    /// are refunded here (`refunds`: [`Plan::refunds`], not empty): a denied request debits
    /// nothing but its charges.
    async fn undo_quota_denial(
        &self,
        refunds: Vec<(usize, BucketOp)>,
        mut applied: Applied,
    ) -> Result<Applied, RequestError> {
        self.refund(&refunds, &mut applied).await.inspect_err(|e| {
            self.metrics.record_request(RequestResult::StoreError);
            tracing::warn!(error = %e, "refund after a quota-mode denial failed");
        })?;
        applied.committed = false;
        Ok(applied)
    }

    /// Applies `refunds` (each the index of the op it gives back, and the refund) and
    /// writes each refunded bucket's view after its refund into `applied`.
    async fn refund(
        &self,
        refunds: &[(usize, BucketOp)],
        applied: &mut Applied,
    ) -> Result<(), StoreError> {
        let ops: Vec<BucketOp> = refunds.iter().map(|(_, op)| op.clone()).collect();
        let undone = self.store.apply(&ops).await?;
        for ((index, _), result) in refunds.iter().zip(&undone.buckets) {
            if let Some(bucket) = applied.buckets.get_mut(*index) {
                bucket.view = result.view;
            }
        }
        Ok(())
    }
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

/// One of the `max_in_flight` places, held while alive (see [`Decider::admit`]).
#[derive(Debug)]
pub struct Admitted {
    /// The decider's count, given back on drop.
    in_flight: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The gRPC face of [`Decider`].
#[derive(Clone)]
pub struct RlsService {
    decider: Arc<Decider>,
    /// The largest request message decoded (tonic's 4 MiB when `None`).
    max_decoding_message_size: Option<usize>,
}

impl RlsService {
    /// Serves `decider` over gRPC.
    pub fn new(decider: Arc<Decider>) -> RlsService {
        RlsService {
            decider,
            max_decoding_message_size: None,
        }
    }

    /// Refuses request messages larger than `bytes` (`--grpc-max-message-bytes`).
    pub fn with_max_decoding_message_size(mut self, bytes: usize) -> RlsService {
        self.max_decoding_message_size = Some(bytes);
        self
    }

    /// The decider that answers the calls.
    pub fn decider(&self) -> &Arc<Decider> {
        &self.decider
    }

    /// The largest request message decoded, if bounded.
    pub fn max_decoding_message_size(&self) -> Option<usize> {
        self.max_decoding_message_size
    }

    /// Answers one call whose stream already holds a `--max-in-flight` place (taken by
    /// `crate::admission` as the stream opened, before its body arrived).
    pub fn answer_admitted(
        &self,
        request: Request<RateLimitRequest>,
    ) -> impl Future<Output = Result<Response<RateLimitResponse>, Status>> + Send + '_ {
        self.answer(request, true)
    }

    /// Answers one call, admitting it first unless `admitted`, and times it as the
    /// reference's interceptor does.
    ///
    /// Not an `async fn` (nor is [`RlsService::answer_admitted`]): one keeps its arguments
    /// apart from the body's own copy of them, so the request would be part of the call's
    /// state twice while it waits for the store; the block below only borrows it.
    // The manual form is the point: see above.
    #[allow(clippy::manual_async_fn)]
    fn answer(
        &self,
        request: Request<RateLimitRequest>,
        admitted: bool,
    ) -> impl Future<Output = Result<Response<RateLimitResponse>, Status>> + Send + '_ {
        async move {
            let started = Instant::now();
            let answered = if admitted {
                self.decider
                    .answer_traced(
                        request.get_ref(),
                        EntryPoint::Grpc,
                        Some(request.metadata().as_ref()),
                    )
                    .await
            } else {
                self.decider
                    .should_rate_limit_from(
                        request.get_ref(),
                        EntryPoint::Grpc,
                        request.metadata().as_ref(),
                    )
                    .await
            };
            // The reference's interceptor times every call that reaches the handler, errors
            // included.
            self.decider.metrics().record_grpc_call(started.elapsed());
            answered.map(Response::new).map_err(Status::from)
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    /// Behind `crate::admission`'s layer (the server's gRPC stack) a ShouldRateLimit call
    /// never comes this way: the layer admits it and answers it through
    /// [`RlsService::answer_admitted`] itself. A call that does (a service used without the
    /// layer) is admitted here.
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.answer(request, false).await
    }
}

/// A random number for a counter's expiry jitter. Its quality hardly matters (it spreads
/// expiries, as the reference's `math/rand` does), so a per-thread SplitMix64 seeded from
/// std's random hasher keys: no lock, no dependency.
fn jitter_roll() -> u64 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::collections::hash_map::RandomState::new().build_hasher().finish(),
        );
    }
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

mod notice;
#[cfg(test)]
mod tests;
