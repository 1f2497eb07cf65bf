//! The quota a limit states to its clients: `current_limit`, `limit_remaining` and
//! `duration_until_reset` of a descriptor's status, from which Envoy builds
//! `x-ratelimit-limit: q, q;w=W`, `x-ratelimit-remaining` and `x-ratelimit-reset`
//! (`ratelimit_headers.cc` in its HTTP rate-limit filter: `W` is the unit of
//! `current_limit` in seconds), and floodgate's own headers the same numbers.
//!
//! The three agree when a client that follows them is never refused: it may send `remaining`
//! requests now, `remaining` is never above the quota `q`, `reset` is at most the window `W`,
//! and with nothing sent `remaining` is back to its most after `reset` seconds. The RLS API
//! states a limit as one count per one unit (second … year), with no burst and no multiplier,
//! so:
//!
//! - **Quota `q`**: the limit's `requests_per_unit`, as configured.
//! - **Window `W`**: the limit's own unit when its period is one unit; for a
//!   `unit_multiplier`, the shortest unit at least as long as the period (3 per 5 minutes is
//!   stated per hour), since a client that keeps to `q` per `W ≥ period` keeps to the limit;
//!   past a year, the longest unit, a year.
//! - **Remaining**: the bucket's whole tokens, at most `q`: a token bucket's `burst` above its
//!   rate shows as `remaining` staying at `q` while the client spends the spare tokens.
//! - **Reset**: windows keep theirs (the end of the window; for the sliding window, when the
//!   counted hits are forgotten). A token bucket states the time until it holds its most
//!   stated remaining again (`q`, or its `burst` when smaller) at the configured rate, which
//!   is at most the period: not the time until a burst above the rate is full.
//!
//! A limit with the default burst and no multiplier (every limit the reference can express)
//! states exactly its configuration, remaining and reset.

use crate::config::Unit;
use crate::limiter::{Algorithm, LimitParams};

/// A limit as its status states it: `requests` per `unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stated {
    /// `current_limit.requests_per_unit`: the quota `q`.
    pub(super) requests: u32,
    /// `current_limit.unit`: the window `W`.
    pub(super) unit: Unit,
}

impl Stated {
    /// The stated quota of a limit with `params`, configured in `unit` (× its multiplier).
    pub(super) fn of(params: &LimitParams, unit: Unit) -> Stated {
        let period_s = params.period_us / 1_000_000;
        let unit = if unit.seconds() == period_s {
            unit
        } else {
            Unit::ALL
                .into_iter()
                .find(|u| u.seconds() >= period_s)
                .unwrap_or(Unit::Year)
        };
        Stated {
            requests: u32::try_from(params.requests_per_period).unwrap_or(u32::MAX),
            unit,
        }
    }

    /// `limit_remaining`: the bucket's whole tokens left, at most the stated quota.
    pub(super) fn remaining(&self, tokens: u64) -> u32 {
        u32::try_from(tokens.min(u64::from(self.requests))).unwrap_or(u32::MAX)
    }

    /// `duration_until_reset` in µs: windows' `reset_us` as it is; for a token bucket
    /// whose `reset_us` is the time until it is full at the configured rate, the time until
    /// it holds `min(q, burst)` tokens again (`tokens` whole tokens now), never 0 while it
    /// holds fewer.
    pub(super) fn reset_us(&self, params: &LimitParams, tokens: u64, reset_us: u64) -> u64 {
        if params.algorithm != Algorithm::TokenBucket || params.requests_per_period == 0 {
            return reset_us;
        }
        let spare = params.burst.saturating_sub(u64::from(self.requests));
        // Rounded down, so the time left is never understated.
        let spare_us = u128::from(spare) * u128::from(params.period_us)
            / u128::from(params.requests_per_period);
        let until = reset_us.saturating_sub(u64::try_from(spare_us).unwrap_or(u64::MAX));
        if tokens < u64::from(self.requests).min(params.burst) {
            until.max(1)
        } else {
            until
        }
    }
}

#[cfg(test)]
mod tests;
