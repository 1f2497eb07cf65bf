//! The decider: the one request path, from a ShouldRateLimit request to its response.
//!
//! [`Decider::decide`] plans a call against the current limits, applies the plan's bucket
//! operations in the store, builds the response and counts it; the gRPC service
//! (`service::grpc`) and the HTTP `POST /json` endpoint both ask it, each for a call that
//! already holds a [`Place`] in the bound on calls in flight ([`crate::admission`]).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio::time::Instant as TokioInstant;

use super::error::RequestError;
use super::hold::{Hold, Holder, refund};
use super::notice;
use crate::admission::{InFlight, MAX_IN_FLIGHT, Place};
use crate::bucket::{Applied, BucketOp};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::plan::{Plan, PlanOptions};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::rls::{RateLimitRequest, RateLimitResponse};
use crate::sources::Limits;
use crate::store::{Store, StoreMetrics};
use crate::telemetry::metrics::{Metrics, RequestResult};
use crate::telemetry::otel::{RequestSpan, Traces};

/// The response header of a request a `max_wait` limit held: how long, in ms (rounded up).
pub const DELAYED_HEADER: &str = "x-ratelimit-delayed-ms";

/// The shared request path, which decides every request: plan it against the current
/// limits, apply its bucket operations in the store, answer it, count it. (Named for what it
/// does with a request; the algorithms it applies are [`crate::limiter`]'s.)
pub struct Decider {
    /// The limits in force and their rules' series handles; swapped whole on reload so a
    /// request plans and counts with one version.
    limits: Limits,
    /// Where buckets live.
    store: Arc<dyn Store>,
    /// Shadow mode, override algorithm, request bounds.
    options: PlanOptions,
    /// Where outcomes are counted.
    metrics: Arc<Metrics>,
    /// Where the store's time per request is counted (`floodgate_store_duration_seconds`,
    /// the store's family); `None`: not counted, as for a decider no server composed.
    store_metrics: Option<StoreMetrics>,
    /// The bound on calls in flight, whose places the callers take before they ask.
    in_flight: InFlight,
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

/// One call as the decider is asked it: the request, the entry point it came through (its
/// span's name) and the headers that carry the caller's trace context, when it has any.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The request.
    pub request: &'a RateLimitRequest,
    /// Which entry point it came through.
    pub entry: EntryPoint,
    /// The call's headers (gRPC metadata, or `/json`'s HTTP headers), read for the caller's
    /// trace context when tracing is on; `None` for a call that carries none.
    pub headers: Option<&'a http::HeaderMap>,
}

impl<'a> Call<'a> {
    /// A gRPC call with no headers (fuzzing, tests).
    pub fn new(request: &'a RateLimitRequest) -> Call<'a> {
        Call {
            request,
            entry: EntryPoint::Grpc,
            headers: None,
        }
    }

    /// A call that came through `entry` with `headers`.
    pub fn with_headers(
        request: &'a RateLimitRequest,
        entry: EntryPoint,
        headers: &'a http::HeaderMap,
    ) -> Call<'a> {
        Call {
            request,
            entry,
            headers: Some(headers),
        }
    }
}

impl Decider {
    /// A decider over `limits` and `store`, with no practical bound on calls in flight
    /// (see [`Decider::with_max_in_flight`]).
    pub fn new(
        limits: Limits,
        store: Arc<dyn Store>,
        options: PlanOptions,
        metrics: Arc<Metrics>,
    ) -> Decider {
        let in_flight = InFlight::new(MAX_IN_FLIGHT, Arc::clone(&metrics));
        Decider {
            limits,
            store,
            options,
            metrics,
            store_metrics: None,
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

    /// Counts the store's time per request in `metrics` (the store's families, registered
    /// with the store's).
    pub fn with_store_metrics(mut self, metrics: StoreMetrics) -> Decider {
        self.store_metrics = Some(metrics);
        self
    }

    /// Records a span per request (and per store call) in `traces`.
    pub fn with_traces(mut self, traces: Option<Arc<Traces>>) -> Decider {
        self.traces = traces;
        self
    }

    /// Answers at most `max` calls at once; more are refused with
    /// [`crate::admission::Overloaded`]. `max` is clamped to 1..=[`MAX_IN_FLIGHT`].
    pub fn with_max_in_flight(mut self, max: usize) -> Decider {
        self.in_flight = self.in_flight.with_max(max);
        self
    }

    /// The bound on calls in flight: a caller takes a [`Place`] in it before it asks
    /// ([`Decider::decide`]).
    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// The limits currently in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.limits.load().config)
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

    /// Answers one call, which holds a place (taken from [`Decider::in_flight`] by the caller,
    /// and held until its answer is written): the request path. Timed in
    /// `floodgate_request_duration_seconds`, and a child span of the caller's trace found in
    /// `call.headers` when tracing is on.
    pub async fn decide(
        &self,
        _place: &Place<'_>,
        call: Call<'_>,
    ) -> Result<RateLimitResponse, RequestError> {
        let Call {
            request,
            entry,
            headers,
        } = call;
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
        // One load: the plan's rule indexes and the handles that count them belong together.
        // A guard, not a clone of the `Arc`: the clone's two atomic adds land on a count that
        // every serving thread writes. While a thread holds few guards (a request the
        // in-process store answers at once holds one, briefly) a guard is a slot of its own
        // thread's; past that (many requests of one thread waiting on Redis) arc-swap counts
        // the reference as the clone would.
        let limits = self.limits.load();
        let mut plan = Plan::build(request, &limits.config, &self.options).inspect_err(|e| {
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
            // The in-process store answers at once: no boxed future to allocate and poll.
            let applied = match self.store.apply_at_once(&plan.ops) {
                Some(applied) => Ok(applied),
                None => self.store.apply(&plan.ops).await,
            };
            if let Some(store_metrics) = &self.store_metrics {
                store_metrics.record_store_duration(self.store.name(), started.elapsed());
            }
            if let Some(store_span) = store_span {
                store_span.end(applied.as_ref().err().map(|e| e as &dyn std::fmt::Display));
            }
            applied.inspect_err(|e| {
                self.metrics.record_request(RequestResult::StoreError);
                if let Some(domain) = plan.domain_label() {
                    self.metrics
                        .record_rule_errors(domain, plan.rule_hits(), &limits.rules);
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
            Some(domain) => {
                let holder = Holder {
                    store: &self.store,
                    metrics: &self.metrics,
                    cut: &self.cut,
                };
                Some(Box::pin(holder.hold(&plan, &applied, domain)).await)
            }
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
        self.metrics.record_outcome(&outcome, &limits.rules, result);
        tracing::debug!(
            domain = %request.domain,
            descriptors = request.descriptors.len(),
            over_limit = over,
            "answered"
        );
        Ok((outcome.response, result))
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
        refund(&self.store, &refunds, &mut applied)
            .await
            .inspect_err(|e| {
                self.metrics.record_request(RequestResult::StoreError);
                tracing::warn!(error = %e, "refund after a quota-mode denial failed");
            })?;
        applied.committed = false;
        Ok(applied)
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
