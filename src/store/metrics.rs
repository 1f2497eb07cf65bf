//! The store's metrics, registered by the store into the shared registry
//! ([`Metrics::register`]) and counted by its layers: time per request, the memory store's
//! size, failures and what the failure policy did, the local over-limit cache, refunds
//! across Redis Cluster slots and across the per-second split, the bound on calls to Redis,
//! and the lease layer's counters ([`LeaseMetrics`]). Names and help strings live here only.
//!
//! Gauges read from their source (the memory store's size, the local cache's entries,
//! whether Redis is usable, the bound on calls to Redis, the host's delay) are set by
//! samplers the owner adds ([`StoreMetrics::sample`]), run before every exposition.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::{DurationHistogram, Metrics, Samplers};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The store's counters and gauges: cheap clones of the registered handles, one for each
/// layer that counts.
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    families: Arc<Families>,
    /// Where the owner's samplers go (the registry's, run before every exposition).
    samplers: Samplers,
}

impl StoreMetrics {
    /// Every store family, registered at zero in `metrics`' registry. Called once per
    /// registry (the composition root; a test that builds its own store), and the handles
    /// cloned to every layer.
    pub fn register(metrics: &Metrics) -> StoreMetrics {
        let families = metrics.register(|registry| {
            let families = Families::register_duration(registry);
            families.register_rest(registry);
            families.register_refunds(registry);
            families.register_local_cache(registry);
            families.register_shedding(registry);
            families
        });
        StoreMetrics {
            families: Arc::new(families),
            samplers: metrics.samplers(),
        }
    }

    /// Runs `sampler` before every exposition, to set a gauge read from its source. It must
    /// be cheap.
    pub fn sample(&self, sampler: impl Fn() + Send + Sync + 'static) {
        self.samplers.add(sampler);
    }
}

/// The store's families and handles.
#[derive(Debug)]
struct Families {
    duration: Family<StoreLabels, DurationHistogram>,
    /// The `duration` series of the first store recorded: a process has one store,
    /// so its requests record without looking the series up.
    duration_first: OnceLock<(&'static str, DurationHistogram)>,
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

impl Families {
    /// The store's time per request, registered in `registry`.
    fn register_duration(registry: &mut Registry) -> Families {
        let store = Families {
            // 50 µs … ~0.8 s: the memory store sits at the bottom, a Redis round trip in the
            // middle.
            duration: Family::<StoreLabels, DurationHistogram>::new_with_constructor(
                (|| DurationHistogram::new(exponential_buckets(0.000_05, 2.0, 15)))
                    as fn() -> DurationHistogram,
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
    fn register_rest(&self, registry: &mut Registry) {
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
    fn register_refunds(&self, registry: &mut Registry) {
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
    fn register_local_cache(&self, registry: &mut Registry) {
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
    fn register_shedding(&self, registry: &mut Registry) {
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

impl StoreMetrics {
    /// Records the time one request spent in the store.
    pub fn record_store_duration(&self, store: &'static str, elapsed: Duration) {
        let (first, histogram) = self.families.duration_first.get_or_init(|| {
            (
                store,
                self.families
                    .duration
                    .get_or_create_owned(&StoreLabels { store }),
            )
        });
        if *first == store {
            histogram.observe(elapsed);
        } else {
            self.families
                .duration
                .get_or_create(&StoreLabels { store })
                .observe(elapsed);
        }
    }

    /// Sets the number of buckets held by the memory store.
    pub fn set_memory_buckets(&self, buckets: usize) {
        self.families
            .memory_buckets
            .set(i64::try_from(buckets).unwrap_or(i64::MAX));
    }

    /// Counts buckets the memory store evicted to stay within its bound.
    pub fn record_memory_evictions(&self, evicted: u64) {
        self.families.memory_evictions.inc_by(evicted);
    }

    /// Counts a store failure by kind (`StoreError::kind`).
    pub fn record_store_error(&self, kind: &'static str) {
        self.families
            .errors
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// Counts a request answered by the failure policy.
    pub fn record_degraded(&self, policy: &'static str) {
        self.families
            .degraded
            .get_or_create(&PolicyLabels { policy })
            .inc();
    }

    /// Counts a request decided by the local buckets of policy `local`, and why Redis did not
    /// decide it (`shed`, `circuit_open`, `store_error`).
    pub fn record_local_decision(&self, reason: &'static str) {
        self.families
            .local_decisions
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sets the adaptive bound on calls to Redis and the calls waiting for a place.
    pub fn set_redis_calls_bound(&self, bound: u64, waiting: u64) {
        self.families
            .shed_limit
            .set(i64::try_from(bound).unwrap_or(i64::MAX));
        self.families
            .shed_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// Sets the runtime threads' largest scheduling delay (the host's probe).
    pub fn set_host_delay(&self, delay: Duration) {
        self.families.host_delay.set(delay.as_secs_f64());
    }

    /// Sets whether the store is usable.
    pub fn set_store_available(&self, available: bool) {
        self.families.available.set(i64::from(available));
    }

    /// Counts a request denied by the local over-limit cache.
    pub fn record_local_cache_hit(&self) {
        self.families.local_cache_over_limit.inc();
    }

    /// Counts a Redis Cluster refund call (one slot group's debits undone), by whether it
    /// succeeded.
    pub fn record_cluster_refund(&self, ok: bool) {
        self.families
            .cluster_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Counts one refund across the per-second split (`ok` or `failed`).
    pub fn record_per_second_refund(&self, ok: bool) {
        self.families
            .per_second_refunds
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Sets the number of buckets the local over-limit cache holds.
    pub fn set_local_cache_entries(&self, entries: u64) {
        self.families
            .local_cache_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Counts entries the local over-limit cache dropped to stay within its bound.
    pub fn record_local_cache_evictions(&self, evicted: u64) {
        self.families.local_cache_evictions.inc_by(evicted);
    }
}

/// The counters of the lease layer ([`crate::store::lease`]): cheap clones of the registered
/// handles.
#[derive(Clone, Debug, Default)]
pub struct LeaseMetrics {
    acquired: Counter,
    tokens_leased: Counter,
    tokens_returned: Counter,
    return_failures: Counter,
    local_answers: Counter,
}

impl LeaseMetrics {
    /// The lease families, registered at zero in `metrics`' registry.
    pub fn register(metrics: &Metrics) -> LeaseMetrics {
        metrics.register(LeaseMetrics::register_in)
    }

    fn register_in(registry: &mut Registry) -> LeaseMetrics {
        let leases = LeaseMetrics::default();
        registry.register(
            "floodgate_lease_acquired",
            "Leases taken on hot Redis buckets (one script call debits a slice of a bucket)",
            leases.acquired.clone(),
        );
        registry.register(
            "floodgate_lease_tokens",
            "Tokens debited in Redis as leases",
            leases.tokens_leased.clone(),
        );
        registry.register(
            "floodgate_lease_tokens_returned",
            "Unspent lease tokens sent back to their bucket (expiry, a changed limit, shutdown)",
            leases.tokens_returned.clone(),
        );
        registry.register(
            "floodgate_lease_return_failures",
            "Returns of unspent lease tokens that failed: those tokens stay debited until \
             their bucket refills or their window ends",
            leases.return_failures.clone(),
        );
        registry.register(
            "floodgate_lease_local_answers",
            "Requests answered from this replica's leases alone, without a Redis call",
            leases.local_answers.clone(),
        );
        leases
    }

    /// A lease of `tokens` was debited in Redis.
    pub fn record_acquired(&self, tokens: u64) {
        self.acquired.inc();
        self.tokens_leased.inc_by(tokens);
    }

    /// A return of `tokens` unspent tokens ended: sent (`ok`) or failed.
    pub fn record_returned(&self, tokens: u64, ok: bool) {
        if ok {
            self.tokens_returned.inc_by(tokens);
        } else {
            self.return_failures.inc();
        }
    }

    /// A request was answered from leases alone.
    pub fn record_local_answer(&self) {
        self.local_answers.inc();
    }
}
