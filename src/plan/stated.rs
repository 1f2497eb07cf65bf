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
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    fn params(algorithm: Algorithm, requests: u64, period_s: u64, burst: u64) -> LimitParams {
        LimitParams {
            algorithm,
            requests_per_period: requests,
            period_us: period_s * SECOND,
            burst,
            overdraft: false,
            max_wait_us: 0,
        }
    }

    fn tb(requests: u64, period_s: u64, burst: u64) -> LimitParams {
        params(Algorithm::TokenBucket, requests, period_s, burst)
    }

    /// A limit the reference can express (default burst, no multiplier) states exactly its
    /// configuration, its remaining and its reset, under every algorithm and unit.
    #[test]
    fn plain_limits_state_their_configuration() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            for unit in Unit::ALL {
                let p = params(algorithm, 10, unit.seconds(), 10);
                let stated = Stated::of(&p, unit);
                assert_eq!(
                    stated,
                    Stated { requests: 10, unit },
                    "{algorithm:?} {unit}"
                );
                assert_eq!(stated.remaining(7), 7);
                assert_eq!(stated.reset_us(&p, 7, 12_345_678), 12_345_678);
            }
        }
    }

    /// 10/minute with burst 50 states 10 per minute: remaining stays at 10 while the spare
    /// burst lasts, and the reset is the time until 10 tokens are back (6 s per token).
    #[test]
    fn burst_above_the_rate_states_the_rate() {
        let p = tb(10, 60, 50);
        let stated = Stated::of(&p, Unit::Minute);
        assert_eq!(
            stated,
            Stated {
                requests: 10,
                unit: Unit::Minute
            }
        );
        // 49 tokens left: full in 6 s, and already 10 or more.
        assert_eq!(stated.remaining(49), 10);
        assert_eq!(stated.reset_us(&p, 49, 6 * SECOND), 0);
        // 4 tokens left: full in 276 s, 10 tokens in 36 s.
        assert_eq!(stated.remaining(4), 4);
        assert_eq!(stated.reset_us(&p, 4, 276 * SECOND), 36 * SECOND);
        // Empty: one whole minute until the stated quota is back, never more.
        assert_eq!(stated.reset_us(&p, 0, 300 * SECOND), 60 * SECOND);
        // A fraction of a token short of 10 (floor 9) is never reported as ready.
        assert_eq!(stated.reset_us(&p, 9, 240 * SECOND), 1);
    }

    /// A burst below the rate states the rate: remaining never above the burst, and the reset
    /// is the time until the bucket is full.
    #[test]
    fn burst_below_the_rate_states_the_rate() {
        let p = tb(10, 1, 3);
        let stated = Stated::of(&p, Unit::Second);
        assert_eq!(
            stated,
            Stated {
                requests: 10,
                unit: Unit::Second
            }
        );
        assert_eq!(stated.remaining(3), 3);
        assert_eq!(stated.reset_us(&p, 0, 300_000), 300_000);
        assert_eq!(stated.reset_us(&p, 3, 0), 0);
    }

    /// A multiplied period is stated per the shortest unit at least as long: 3 per 5
    /// minutes says 3 per hour, whose window holds every reset (at most 300 s).
    #[test]
    fn multiplied_periods_take_the_next_longer_unit() {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
        ] {
            let p = params(algorithm, 3, 300, 3);
            let stated = Stated::of(&p, Unit::Minute);
            assert_eq!(
                stated,
                Stated {
                    requests: 3,
                    unit: Unit::Hour
                },
                "{algorithm:?}"
            );
            assert_eq!(stated.reset_us(&p, 0, 300 * SECOND), 300 * SECOND);
        }
        for (period_s, unit) in [
            (2, Unit::Minute),
            (120, Unit::Hour),
            (2 * 3_600, Unit::Day),
            (2 * 86_400, Unit::Week),
            (14 * 86_400, Unit::Month),
            (60 * 86_400, Unit::Year),
            (2 * 365 * 86_400, Unit::Year),
        ] {
            let stated = Stated::of(
                &params(Algorithm::FixedWindow, 3, period_s, 3),
                Unit::Second,
            );
            assert_eq!(stated.unit, unit, "{period_s} s");
        }
    }

    /// A token bucket with a multiplier and a burst states its count per the longer unit,
    /// and its reset is the time until that count is back: 100 per 5 minutes with burst 1000
    /// says 100 per hour, and an empty bucket has 100 again in 300 s (3 s a token), not the
    /// 3000 s until it is full. A period past a year is stated per year.
    #[test]
    fn multiplied_token_bucket_with_a_burst() {
        let p = tb(100, 300, 1000);
        let stated = Stated::of(&p, Unit::Minute);
        assert_eq!(
            stated,
            Stated {
                requests: 100,
                unit: Unit::Hour
            }
        );
        assert_eq!(stated.remaining(1000), 100);
        assert_eq!(stated.reset_us(&p, 0, 3_000 * SECOND), 300 * SECOND);
        let p = tb(1, 2 * 365 * 86_400, 2);
        let stated = Stated::of(&p, Unit::Year);
        assert_eq!(
            stated,
            Stated {
                requests: 1,
                unit: Unit::Year
            }
        );
        // Empty: one token of two years is back in two years, not four.
        let two_years = 2 * 365 * 86_400 * SECOND;
        assert_eq!(stated.reset_us(&p, 0, 2 * two_years), two_years);
    }

    /// No limit's numbers overflow the fields: the largest counts and bursts stay u32.
    #[test]
    fn extremes_fit() {
        let max = u64::from(u32::MAX);
        let p = tb(max, 1, max);
        let stated = Stated::of(&p, Unit::Second);
        assert_eq!(stated.requests, u32::MAX);
        assert_eq!(stated.remaining(u64::MAX), u32::MAX);
        let zero = tb(0, 60, 1);
        let stated = Stated::of(&zero, Unit::Minute);
        assert_eq!(stated.requests, 0);
        assert_eq!(stated.remaining(0), 0);
        assert_eq!(stated.reset_us(&zero, 0, 0), 0);
    }
}
