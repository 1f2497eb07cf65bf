//! `GET /console/state`: everything the dashboard shows, read when it polls.
//!
//! Counters, not rates: the page derives rates from two successive reads, so nothing is
//! computed or kept between polls, and the request path does no work for the console.

use axum::extract::State;
use axum::http::HeaderMap;
use serde::Serialize;

use super::{ConsoleError, ConsoleState};
use crate::config::{Limit, Rule, algorithm_name};
use crate::metrics::{LoadRecord, RuleCounts};

/// The dashboard's data.
#[derive(Serialize)]
struct Snapshot {
    /// The server's wall clock, ms since the Unix epoch: rates are per this clock.
    now_unix_ms: u64,
    /// The store's health.
    store: StoreStatus,
    /// ShouldRateLimit calls by result, since start.
    requests: Vec<(&'static str, u64)>,
    /// The limits in force and their counters.
    domains: Vec<DomainStatus>,
    /// The last limits loads, newest first.
    loads: Vec<LoadRecord>,
}

#[derive(Serialize)]
struct StoreStatus {
    /// `memory`, `redis`, `redis_cluster`, `redis_split`.
    name: &'static str,
    /// Whether requests are answered from it now.
    available: bool,
    /// `closed`, `open`, or `none` (the memory store has no breaker).
    breaker: &'static str,
    /// The failure policy while it is unusable (`none` for the memory store).
    policy: &'static str,
}

#[derive(Serialize)]
struct DomainStatus {
    name: String,
    /// The sum of its rules' counters.
    counts: RuleCounts,
    rules: Vec<RuleStatus>,
}

#[derive(Serialize)]
struct RuleStatus {
    path: String,
    shadow: bool,
    quota: bool,
    /// Its metric path holds request values (`detailed_metric`, `value_to_metric`): its
    /// counters are per value, not shown here.
    detailed: bool,
    limits: Vec<LimitStatus>,
    counts: RuleCounts,
}

#[derive(Serialize)]
struct LimitStatus {
    name: Option<String>,
    unlimited: bool,
    requests_per_unit: u32,
    unit: &'static str,
    unit_multiplier: u32,
    algorithm: &'static str,
    burst: u32,
}

impl LimitStatus {
    fn of(limit: &Limit) -> LimitStatus {
        LimitStatus {
            name: limit.name.clone(),
            unlimited: limit.unlimited,
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit.name(),
            unit_multiplier: limit.unit_multiplier,
            algorithm: algorithm_name(limit.algorithm),
            burst: limit.burst,
        }
    }
}

fn add(total: &mut RuleCounts, counts: &RuleCounts) {
    total.hits += counts.hits;
    total.within_limit += counts.within_limit;
    total.over_limit += counts.over_limit;
    total.shadow_mode += counts.shadow_mode;
    total.errors += counts.errors;
}

pub(super) async fn state(
    State(state): State<ConsoleState>,
    headers: HeaderMap,
) -> Result<axum::Json<impl Serialize>, ConsoleError> {
    state.authorize_read(&headers)?;
    let config = state.limiter.config();
    let metrics = state.limiter.metrics();
    let domains = config
        .domains()
        .map(|domain| {
            let label = domain.metric_label();
            let mut total = RuleCounts::default();
            let rules = domain
                .rules()
                .into_iter()
                .map(|rule: &Rule| {
                    let counts = metrics.rule_counts(label, &rule.path);
                    add(&mut total, &counts);
                    RuleStatus {
                        path: rule.path.to_string(),
                        shadow: rule.shadow_mode,
                        quota: rule.quota_mode,
                        detailed: rule.detailed_metric || rule.value_to_metric,
                        limits: rule.limits.iter().map(LimitStatus::of).collect(),
                        counts,
                    }
                })
                .collect();
            DomainStatus {
                name: domain.name.clone(),
                counts: total,
                rules,
            }
        })
        .collect();
    let store = match &state.options.redis {
        Some(redis) => {
            let closed = redis.breaker_closed();
            // The breaker's own verdict: usable once a call has succeeded, until it opens.
            let available = *redis.availability().borrow();
            StoreStatus {
                name: crate::store::Store::name(redis.as_ref()),
                available,
                breaker: if closed { "closed" } else { "open" },
                policy: redis.policy().as_str(),
            }
        }
        None => StoreStatus {
            name: state.limiter.store().name(),
            available: true,
            breaker: "none",
            policy: "none",
        },
    };
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(axum::Json(Snapshot {
        now_unix_ms,
        store,
        requests: metrics.request_counts(),
        domains,
        loads: metrics.loads().newest_first(),
    }))
}
