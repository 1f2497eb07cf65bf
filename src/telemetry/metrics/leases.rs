//! The lease layer's counters ([`crate::store::lease`]): leases taken, tokens leased and
//! returned, requests answered from leases alone.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::Metrics;

/// The counters of the lease layer ([`crate::store::lease`]): cheap clones of the registered
/// handles, so the layer records without going through [`Metrics`].
#[derive(Clone, Debug, Default)]
pub struct LeaseMetrics {
    acquired: Counter,
    tokens_leased: Counter,
    tokens_returned: Counter,
    return_failures: Counter,
    local_answers: Counter,
}

impl LeaseMetrics {
    pub(super) fn register(registry: &mut Registry) -> LeaseMetrics {
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

impl Metrics {
    /// The lease layer's counters, for [`crate::store::lease`] to keep a handle to.
    pub fn leases(&self) -> &LeaseMetrics {
        &self.leases
    }
}
