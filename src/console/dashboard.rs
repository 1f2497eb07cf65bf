//! `GET /console/state`: everything the dashboard shows, read when it polls.
//!
//! Counters, not rates: the page derives rates from two successive reads, so nothing is
//! computed or kept between polls, and the request path does no work for the console.
//!
//! Bounded: the limits come one page at a time (domains in name order after `after`,
//! optionally only those whose name contains `filter`), at most `limit` domains
//! ([`MAX_DOMAINS_PER_PAGE`]) and [`MAX_RULES_PER_PAGE`] rules, so one poll costs the same
//! with ten domains or ten thousand; the answer says how many domains match and where the
//! next page starts.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::{ConsoleError, ConsoleState};
use crate::config::{Limit, algorithm_name};
use crate::sources::LoadRecord;
use crate::telemetry::metrics::RuleCounts;

/// Domains on a page when the page does not ask for fewer.
pub(super) const MAX_DOMAINS_PER_PAGE: usize = 50;

/// Rules on a page, all its domains together: a page ends before the domain that would pass
/// it, and a first domain with more rules than this shows only this many of them.
pub(super) const MAX_RULES_PER_PAGE: usize = 500;

/// Which page of the limits a poll asks for.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageQuery {
    /// Start after this domain name (the `next_after` of the previous page); none: the first.
    after: Option<String>,
    /// Most domains on the page, 1 to [`MAX_DOMAINS_PER_PAGE`] (the default).
    limit: Option<usize>,
    /// Only the domains whose name contains this text.
    filter: Option<String>,
}

/// Where the page lies among the domains that match.
#[derive(Serialize)]
struct PageInfo {
    /// Domains that match the filter (all domains without one).
    domains_total: usize,
    /// Domains of those before this page.
    domains_before: usize,
    /// The `after` of the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<String>,
}

/// The dashboard's data.
#[derive(Serialize)]
struct Snapshot {
    /// The server's wall clock, ms since the Unix epoch: rates are per this clock.
    now_unix_ms: u64,
    /// The store's health.
    store: StoreStatus,
    /// ShouldRateLimit calls by result, since start.
    requests: Vec<(&'static str, u64)>,
    /// The limits in force and their counters: this page of them.
    domains: Vec<DomainStatus>,
    /// Which page `domains` is.
    page: PageInfo,
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
    /// How many rules the domain has; `rules` holds fewer when the page's rule budget ran out.
    rules_total: usize,
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
    Query(query): Query<PageQuery>,
) -> Result<axum::Json<impl Serialize>, ConsoleError> {
    state.authorize_read(&headers)?;
    let limit = query.limit.unwrap_or(MAX_DOMAINS_PER_PAGE);
    if !(1..=MAX_DOMAINS_PER_PAGE).contains(&limit) {
        return Err(ConsoleError::BadRequest(format!(
            "limit must be from 1 to {MAX_DOMAINS_PER_PAGE} (got {limit})"
        )));
    }
    let config = state.decider.config();
    let metrics = state.decider.metrics();
    let filter = query.filter.as_deref().unwrap_or("");
    let matching = || config.domains().filter(|d| d.name.contains(filter));
    let after = query.after.as_deref();
    let domains_total = matching().count();
    let domains_before = after.map_or(0, |after| {
        matching().take_while(|d| d.name.as_str() <= after).count()
    });
    let mut rules_left = MAX_RULES_PER_PAGE;
    let mut next_after = None;
    let mut domains = Vec::new();
    for domain in matching().skip(domains_before) {
        let rules = domain.rules();
        if domains.len() == limit || (!domains.is_empty() && rules.len() > rules_left) {
            next_after = domains.last().map(|d: &DomainStatus| d.name.clone());
            break;
        }
        let shown = rules.len().min(rules_left);
        rules_left -= shown;
        let label = domain.metric_label();
        // The domain's sum counts every rule, shown or not.
        let mut total = RuleCounts::default();
        let mut statuses = Vec::with_capacity(shown);
        for (i, rule) in rules.iter().enumerate() {
            let counts = metrics.rule_counts(label, &rule.path);
            add(&mut total, &counts);
            if i < shown {
                statuses.push(RuleStatus {
                    path: rule.path.to_string(),
                    shadow: rule.shadow_mode,
                    quota: rule.quota_mode,
                    detailed: rule.detailed_metric || rule.value_to_metric,
                    limits: rule.limits.iter().map(LimitStatus::of).collect(),
                    counts,
                });
            }
        }
        domains.push(DomainStatus {
            name: domain.name.clone(),
            counts: total,
            rules_total: rules.len(),
            rules: statuses,
        });
    }
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
            name: state.decider.store().name(),
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
        page: PageInfo {
            domains_total,
            domains_before,
            next_after,
        },
        loads: state.options.loads.newest_first(),
    }))
}
