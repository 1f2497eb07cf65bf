//! The store's metrics: time per request, the memory store's size, failures and what the
//! failure policy did, the local over-limit cache, refunds across Redis Cluster slots and
//! across the per-second split.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::Metrics;
use super::labels::{KindLabels, PolicyLabels, ReasonLabels, ResultLabels, StoreLabels};

/// The store's families and handles.
#[derive(Debug)]
pub(super) struct StoreMetrics {
    duration: Family<StoreLabels, Histogram>,
    /// The `duration` series of the first store recorded: a process has one store,
    /// so its requests record without looking the series up.
    duration_first: OnceLock<(&'static str, Histogram)>,
    memory_buckets: Gauge,
    memory_evictions: Counter,
    errors: Family<KindLabels, Counter>,
    degraded: Family<PolicyLabels, Counter>,
    local_decisions: Family<ReasonLabels, Counter>,
    available: Gauge,
    local_cache_over_limit: Counter,
    cluster_refunds: Family<ResultLabels, Counter>,
    per_second_refunds: Family<ResultLabels, Counter>,
    local_cache_entries: Gauge,
    local_cache_evictions: Counter,
    shed_limit: Gauge,
    shed_waiting: Gauge,
    /// The runtime threads' largest scheduling delay, seconds.
    host_delay: Gauge<f64, AtomicU64>,
}

impl StoreMetrics {
    /// The store's time per request, registered in `registry` (first, as it always was: the
    /// store's other metrics follow the limits' loads).
    pub(super) fn register_duration(registry: &mut Registry) -> StoreMetrics {
        let store = StoreMetrics {
            // 50 µs … ~0.8 s: the memory store sits at the bottom, a Redis round trip in the
            // middle.
            duration: Family::<StoreLabels, Histogram>::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.000_05, 2.0, 15))) as fn() -> Histogram,
            ),
            duration_first: OnceLock::new(),
            memory_buckets: Gauge::default(),
            memory_evictions: Counter::default(),
            errors: Family::default(),
            degraded: Family::default(),
            local_decisions: Family::default(),
            available: Gauge::default(),
            local_cache_over_limit: Counter::default(),
            cluster_refunds: Family::default(),
            per_second_refunds: Family::default(),
            local_cache_entries: Gauge::default(),
            local_cache_evictions: Counter::default(),
            shed_limit: Gauge::default(),
            shed_waiting: Gauge::default(),
            host_delay: Gauge::default(),
        };
        registry.register(
            "floodgate_store_duration_seconds",
            "Time spent in the store per request",
            store.duration.clone(),
        );
        store
    }

    /// The store's other metrics, registered in `registry`.
    pub(super) fn register_rest(&self, registry: &mut Registry) {
        let store = self;
        registry.register(
            "floodgate_memory_buckets",
            "Buckets held by the memory store",
            store.memory_buckets.clone(),
        );
        registry.register(
            "floodgate_memory_evictions",
            "Buckets the memory store evicted to stay within its bound",
            store.memory_evictions.clone(),
        );
        registry.register(
            "floodgate_store_errors",
            "Store failures by kind (unavailable: outage; failed: defect)",
            store.errors.clone(),
        );
        registry.register(
            "floodgate_store_degraded",
            "Requests answered by the failure policy because the store was unusable",
            store.degraded.clone(),
        );
        registry.register(
            "floodgate_local_decisions",
            "Requests decided by this replica's in-memory buckets (policy local) because Redis \
             could not answer, by reason (shed, circuit_open, store_error)",
            store.local_decisions.clone(),
        );
        registry.register(
            "floodgate_store_available",
            "1 while the store is usable (circuit closed), else 0",
            store.available.clone(),
        );
        registry.register(
            "floodgate_local_cache_over_limit",
            "Requests denied by the local over-limit cache without a store call",
            store.local_cache_over_limit.clone(),
        );
    }

    /// The refund and local-cache metrics, registered in `registry`.
    pub(super) fn register_refunds(&self, registry: &mut Registry) {
        let store = self;
        registry.register(
            "floodgate_cluster_refunds",
            "Redis Cluster refunds of a slot group's debits after another group denied or failed, \
             by result (failed: the debit stays until the bucket refills)",
            store.cluster_refunds.clone(),
        );
        registry.register(
            "floodgate_per_second_refunds",
            "Refunds of one Redis's debits after the other (per-second or main) denied or \
             failed, by result (failed: the debit stays until the bucket refills)",
            store.per_second_refunds.clone(),
        );
    }

    /// The local over-limit cache's size metrics, registered in `registry`.
    pub(super) fn register_local_cache(&self, registry: &mut Registry) {
        let store = self;
        registry.register(
            "floodgate_local_cache_entries",
            "Buckets the local over-limit cache holds",
            store.local_cache_entries.clone(),
        );
        registry.register(
            "floodgate_local_cache_evictions",
            "Entries the local over-limit cache dropped to stay within its bound",
            store.local_cache_evictions.clone(),
        );
    }

    /// The adaptive bound on calls to Redis (`--redis-shedding`), registered in `registry`.
    pub(super) fn register_shedding(&self, registry: &mut Registry) {
        registry.register(
            "floodgate_redis_calls_bound",
            "Calls to Redis allowed in flight now by the adaptive bound (0: no bound)",
            self.shed_limit.clone(),
        );
        registry.register(
            "floodgate_redis_calls_waiting",
            "Calls waiting in front of Redis for a place under the bound",
            self.shed_waiting.clone(),
        );
        registry.register(
            "floodgate_host_delay_seconds",
            "How long a ready task waits for its runtime thread, smoothed, on the thread where \
             it is longest (the host's CPU, not Redis, delaying answers); 0 while no thread \
             calls Redis (the probes are parked)",
            self.host_delay.clone(),
        );
    }
}

impl Metrics {
    /// Records the time one request spent in the store.
    pub fn record_store_duration(&self, store: &'static str, elapsed: Duration) {
        let (first, histogram) = self.store.duration_first.get_or_init(|| {
            (
                store,
                self.store
                    .duration
                    .get_or_create_owned(&StoreLabels { store }),
            )
        });
        if *first == store {
            histogram.observe(elapsed.as_secs_f64());
        } else {
            self.store
                .duration
                .get_or_create(&StoreLabels { store })
                .observe(elapsed.as_secs_f64());
        }
    }

    /// Sets the number of buckets held by the memory store.
    pub fn set_memory_buckets(&self, buckets: usize) {
        self.store
            .memory_buckets
            .set(i64::try_from(buckets).unwrap_or(i64::MAX));
    }

    /// Counts buckets the memory store evicted to stay within its bound.
    pub fn record_memory_evictions(&self, evicted: u64) {
        self.store.memory_evictions.inc_by(evicted);
    }

    /// Counts a store failure by kind (`StoreError::kind`).
    pub fn record_store_error(&self, kind: &'static str) {
        self.store.errors.get_or_create(&KindLabels { kind }).inc();
    }

    /// Counts a request answered by the failure policy.
    pub fn record_degraded(&self, policy: &'static str) {
        self.store
            .degraded
            .get_or_create(&PolicyLabels { policy })
            .inc();
    }

    /// Counts a request decided by the local buckets of policy `local`, and why Redis did not
    /// decide it (`shed`, `circuit_open`, `store_error`).
    pub fn record_local_decision(&self, reason: &'static str) {
        self.store
            .local_decisions
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sets the adaptive bound on calls to Redis and the calls waiting for a place.
    pub fn set_redis_calls_bound(&self, bound: u64, waiting: u64) {
        self.store
            .shed_limit
            .set(i64::try_from(bound).unwrap_or(i64::MAX));
        self.store
            .shed_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Sets the runtime threads' largest scheduling delay (the host's probe).
    pub fn set_host_delay(&self, delay: Duration) {
        self.store.host_delay.set(delay.as_secs_f64());
    }

    /// Sets whether the store is usable.
    pub fn set_store_available(&self, available: bool) {
        self.store.available.set(i64::from(available));
    }

    /// Counts a request denied by the local over-limit cache.
    pub fn record_local_cache_hit(&self) {
        self.store.local_cache_over_limit.inc();
    }

    /// Counts a Redis Cluster refund call (one slot group's debits undone), by whether it
    /// succeeded.
    pub fn record_cluster_refund(&self, ok: bool) {
        self.store
            .cluster_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Counts one refund across the per-second split (`ok` or `failed`).
    pub fn record_per_second_refund(&self, ok: bool) {
        self.store
            .per_second_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Sets the number of buckets the local over-limit cache holds.
    pub fn set_local_cache_entries(&self, entries: u64) {
        self.store
            .local_cache_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Counts entries the local over-limit cache dropped to stay within its bound.
    pub fn record_local_cache_evictions(&self, evicted: u64) {
        self.store.local_cache_evictions.inc_by(evicted);
    }
}
