//! The Rate Limit Quota Service's metrics: registered once into the shared registry
//! ([`crate::telemetry::metrics::Metrics::register`] hands it over), updated by the streams.
//! Names and help strings live here only.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::telemetry::metrics::Metrics;

/// What an assignment told an Envoy to do, as the `strategy` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// A token bucket (a share of a limit).
    TokenBucket,
    /// `BlanketRule` `ALLOW_ALL`.
    AllowAll,
    /// `BlanketRule` `DENY_ALL`.
    DenyAll,
    /// The current assignment with a time to live of 0 (shutdown).
    Expire,
}

impl Sent {
    fn label(self) -> &'static str {
        match self {
            Sent::TokenBucket => "token_bucket",
            Sent::AllowAll => "allow_all",
            Sent::DenyAll => "deny_all",
            Sent::Expire => "expire",
        }
    }
}

/// What a re-evaluation of a bucket's share without a report found, as the `result` label
/// says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reassessed {
    /// The share changed: a new assignment was sent.
    Changed,
    /// The share stands (or the holder's row is gone): nothing sent.
    Unchanged,
    /// The share table could not be reached: skipped until the next round.
    Failed,
}

impl Reassessed {
    fn label(self) -> &'static str {
        match self {
            Reassessed::Changed => "changed",
            Reassessed::Unchanged => "unchanged",
            Reassessed::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StrategyLabels {
    strategy: &'static str,
}

/// Labels of a configured rule: bounded by the limits, never by what clients send.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// RLQS's families as the registry encodes them, each with its name and help (written as
/// given: it ends with a period like the registry's), whether it has series or not.
struct Families(
    Vec<(
        &'static str,
        &'static str,
        Box<dyn EncodeMetric + Send + Sync>,
    )>,
);

impl std::fmt::Debug for Families {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Families({})", self.0.len())
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, metric) in &self.0 {
            let family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(family)?;
        }
        Ok(())
    }
}

/// Handles to every RLQS metric.
#[derive(Clone, Debug, Default)]
pub struct RlqsMetrics {
    streams: Gauge,
    buckets: Gauge,
    bucket_bytes: Gauge,
    assignments: Family<StrategyLabels, Counter>,
    abandons: Counter,
    holders: Family<RuleLabels, Gauge>,
    refused: Family<ReasonLabels, Counter>,
    reassessed: Family<ResultLabels, Counter>,
}

impl RlqsMetrics {
    /// Registers every family, at zero, into `metrics`' registry.
    pub fn register(metrics: &Metrics) -> Arc<RlqsMetrics> {
        Arc::new(metrics.register(RlqsMetrics::register_in))
    }

    /// Every family, at zero, registered in `registry`.
    fn register_in(registry: &mut Registry) -> RlqsMetrics {
        let own = RlqsMetrics::default();
        for sent in [
            Sent::TokenBucket,
            Sent::AllowAll,
            Sent::DenyAll,
            Sent::Expire,
        ] {
            let _ = own.assignments.get_or_create(&StrategyLabels {
                strategy: sent.label(),
            });
        }
        for result in [
            Reassessed::Changed,
            Reassessed::Unchanged,
            Reassessed::Failed,
        ] {
            let _ = own.reassessed.get_or_create(&ResultLabels {
                result: result.label(),
            });
        }
        // A collector, not `Registry::register`: the registry leaves out a family with no
        // series yet, while RLQS's families are listed from the start, descriptors and all.
        registry.register_collector(Box::new(Families(vec![
            (
                "floodgate_rlqs_streams",
                "RLQS streams (StreamRateLimitQuotas) open now.",
                Box::new(own.streams.clone()),
            ),
            (
                "floodgate_rlqs_buckets",
                "Buckets the open RLQS streams subscribe to.",
                Box::new(own.buckets.clone()),
            ),
            (
                "floodgate_rlqs_bucket_bytes",
                "Bytes the RLQS subscriptions are charged against --rlqs-max-bucket-bytes (ended streams' subscriptions included until their assignments expire).",
                Box::new(own.bucket_bytes.clone()),
            ),
            (
                "floodgate_rlqs_assignments",
                "Bucket assignments sent to Envoys, by strategy (expire: time to live 0 at shutdown).",
                Box::new(own.assignments.clone()),
            ),
            (
                "floodgate_rlqs_abandons",
                "Buckets abandoned (AbandonAction) after reporting no requests for --rlqs-abandon-after.",
                Box::new(own.abandons.clone()),
            ),
            (
                "floodgate_rlqs_holders",
                "Subscriptions on this replica holding a share of a rule's buckets.",
                Box::new(own.holders.clone()),
            ),
            (
                "floodgate_rlqs_refused",
                "RLQS streams ended with an error status, by reason.",
                Box::new(own.refused.clone()),
            ),
            (
                "floodgate_rlqs_reassessments",
                "Buckets whose share a stream re-evaluated without a report, by result (changed: a new assignment was sent).",
                Box::new(own.reassessed.clone()),
            ),
        ])));
        own
    }

    /// A stream opened (`+1`) or ended (`-1`).
    pub fn streams(&self, delta: i64) {
        self.streams.inc_by(delta);
    }

    /// Subscriptions added or removed.
    pub fn buckets(&self, delta: i64) {
        self.buckets.inc_by(delta);
    }

    /// The bytes subscriptions are charged now.
    pub fn bucket_bytes(&self, bytes: usize) {
        self.bucket_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// One assignment sent.
    pub fn sent(&self, sent: Sent) {
        self.assignments
            .get_or_create(&StrategyLabels {
                strategy: sent.label(),
            })
            .inc();
    }

    /// One bucket abandoned.
    pub fn abandoned(&self) {
        self.abandons.inc();
    }

    /// A subscription took (`+1`) or gave up (`-1`) a share of `domain`'s rule `rule`.
    pub fn holders(&self, domain: &str, rule: &str, delta: i64) {
        self.holders
            .get_or_create(&RuleLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
            })
            .inc_by(delta);
    }

    /// `buckets` shares re-evaluated without a report, with `result`.
    pub fn reassessed(&self, result: Reassessed, buckets: usize) {
        self.reassessed
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc_by(u64::try_from(buckets).unwrap_or(u64::MAX));
    }

    /// A stream refused or ended with an error: `invalid` (INVALID_ARGUMENT), `streams`,
    /// `peer`, `buckets`, `memory` or `too_large` (RESOURCE_EXHAUSTED), `silent`
    /// (DEADLINE_EXCEEDED), `shares` (UNAVAILABLE).
    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}
