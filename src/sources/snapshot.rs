//! What a limits source publishes and the request path reads: the compiled [`Config`] and,
//! beside it, telemetry's handles of each configured rule's series, swapped together.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::telemetry::metrics::{ConfiguredRule, Metrics, RuleHandles};

/// The limits in force, shared between the publisher that swaps them and every reader.
pub type Limits = Arc<ArcSwap<Snapshot>>;

/// One published version of the limits. A request loads one `Arc<Snapshot>` and plans and
/// counts with it, so its rules and their series handles always belong together.
#[derive(Debug)]
pub struct Snapshot {
    /// The compiled limits.
    pub config: Arc<Config>,
    /// Telemetry's handles of each configured rule's series, by [`crate::config::Rule::index`]
    /// (empty when no registry resolved them: tallies then look their series up).
    pub rules: RuleHandles,
}

impl Snapshot {
    /// `config` with its rules' series handles resolved in `metrics`: requests count them
    /// with atomic adds alone.
    pub fn resolved(config: Config, metrics: &Metrics) -> Snapshot {
        let rules = metrics.resolve_rules(config.domains().flat_map(|domain| {
            domain.rules().into_iter().map(move |rule| ConfiguredRule {
                index: rule.index,
                domain: domain.metric_label(),
                path: &rule.path,
                detailed: rule.detailed_metric,
            })
        }));
        Snapshot {
            config: Arc::new(config),
            rules,
        }
    }

    /// This snapshot as the limits in force, for a publisher to swap and readers to load.
    pub fn swappable(self) -> Limits {
        Arc::new(ArcSwap::from_pointee(self))
    }
}

/// `config` without resolved handles (its tallies look their series up): limits no
/// registry counts, such as a test's.
impl From<Config> for Snapshot {
    fn from(config: Config) -> Snapshot {
        Snapshot {
            config: Arc::new(config),
            rules: RuleHandles::default(),
        }
    }
}
