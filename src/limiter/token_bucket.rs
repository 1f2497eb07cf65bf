//! Token bucket as GCRA (generic cell rate algorithm): the whole bucket is one number, the
//! theoretical arrival time `tat`, so the Redis script reads and writes a single integer and an
//! absent key is a full bucket (DESIGN §4).
//!
//! With `T` µs per token and tolerance `tau = burst × T`, the bucket's "debt" is
//! `tat − now` (clamped ≥ 0): how far ahead of the steady rate it has been spent. A cost `n`
//! passes iff `debt + n × T ≤ tau`; the debt drains by one µs per µs.
//!
//! Bounds (validated params, `now ≤ 2^52`): `T ≤ period < 2^47`, `tau ≤ 2^50` (validate), and
//! the stored `tat` is trusted only up to `now + 2^50`, so `debt ≤ 2^50`,
//! `debt + n × T ≤ 2^51` (because `n ≤ burst` is checked first) and `now + debt < 2^53`.

use super::{Cost, Evaluation, LimitParams, MAX_COUNT, MAX_TOLERANCE_US, Op, State, View, exact};

/// `T`: µs per token, `ceil(period / rate)`. Rounded up so the effective rate never exceeds the
/// configured one; exact when `rate` divides `period`. Lua: `floor((period + rate - 1) / rate)`.
pub(super) fn emission_interval_us(period_us: u64, rate: u64) -> u64 {
    period_us.div_ceil(rate.max(1))
}

/// The GCRA constants of one limit (rate > 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gcra {
    /// `T`, µs per token.
    interval: i64,
    /// `tau = burst × T`, µs.
    tolerance: i64,
    /// Capacity in tokens.
    burst: i64,
}

impl Gcra {
    /// The constants for `params`, or `None` when nothing is ever granted (rate 0).
    /// Invalid params are clamped into the validated domain (no-op for valid ones).
    fn new(params: &LimitParams) -> Option<Self> {
        let period = super::period_us(params).unsigned_abs();
        let rate = super::limit(params).min(period);
        if rate == 0 {
            return None;
        }
        let interval = emission_interval_us(period, rate);
        let burst = params.burst.min(MAX_COUNT).min(MAX_TOLERANCE_US / interval);
        // interval ≤ 2^47 and burst ≤ 2^32, both fit i64 losslessly.
        let interval = i64::try_from(interval).ok()?;
        let burst = i64::try_from(burst).ok()?;
        Some(Gcra {
            interval,
            tolerance: exact(burst * interval),
            burst,
        })
    }

    /// The bucket as seen from outside with this debt (µs, ≥ 0).
    fn view(&self, debt: i64) -> View {
        let remaining = if debt <= self.tolerance {
            (self.tolerance - debt) / self.interval
        } else {
            0
        };
        View {
            remaining: remaining.unsigned_abs(),
            reset_us: debt.unsigned_abs(),
        }
    }
}

/// Evaluate `cost` at `now` (in `[0, MAX_NOW_US]`) against stored theoretical arrival time `tat`.
pub(super) fn evaluate(params: &LimitParams, tat: Option<i64>, now: i64, cost: Cost) -> Evaluation {
    let Some(gcra) = Gcra::new(params) else {
        // requests_per_period 0: nothing passes, there is nothing to refill or refund.
        let view = View {
            remaining: 0,
            reset_us: 0,
        };
        return match Op::of(cost) {
            Op::Debit(_) => Evaluation::denied(view, None),
            Op::Check | Op::Refund(_) => Evaluation::unchanged(view),
        };
    };
    // max(tat, now) forgets idle time (and clock steps back); the upper clamp only bites on
    // corrupt state or a clock that stepped back by decades, and bounds the arithmetic.
    let max_debt = i64::try_from(MAX_TOLERANCE_US).unwrap_or(i64::MAX);
    let debt = exact(tat.unwrap_or(now).clamp(now, now + max_debt) - now);
    let current = gcra.view(debt);
    let commit = |new_debt: i64| {
        let state = State::TokenBucket {
            tat_us: exact(now + new_debt),
        };
        Evaluation::commit(current, state, new_debt.unsigned_abs(), gcra.view(new_debt))
    };
    match Op::of(cost) {
        Op::Check if debt <= gcra.tolerance => Evaluation::unchanged(current),
        Op::Check => Evaluation::denied(current, Some((debt - gcra.tolerance).unsigned_abs())),
        Op::Debit(n) => {
            // n ≤ burst, so n × T ≤ tau ≤ 2^50 (computed only then).
            let fitting = i64::try_from(n)
                .ok()
                .filter(|&n| n <= gcra.burst)
                .map(|n| exact(debt + n * gcra.interval));
            match fitting {
                Some(new_debt) if new_debt <= gcra.tolerance => commit(new_debt),
                _ if params.overdraft => {
                    // Always debited: into debt beyond tau, up to the cap of 2^50 µs. Whole
                    // tokens that fit under the cap: (2^50 − debt) / T, so n × T ≤ 2^50 − debt.
                    let room = ((max_debt - debt) / gcra.interval).unsigned_abs();
                    let new_debt = if n <= room {
                        exact(debt + n.cast_signed() * gcra.interval)
                    } else {
                        max_debt
                    };
                    let state = State::TokenBucket {
                        tat_us: exact(now + new_debt),
                    };
                    // Checks pass again once the debt has drained back to tau.
                    let wait = (new_debt - gcra.tolerance).max(0).unsigned_abs();
                    let ttl = new_debt.unsigned_abs();
                    Evaluation::overdrawn(current, state, ttl, gcra.view(new_debt), wait)
                }
                // At now + r the debt is new_debt − r − n×T + n×T = tau: the earliest pass.
                Some(new_debt) => {
                    let wait = new_debt - gcra.tolerance;
                    Evaluation::denied(current, Some(wait.unsigned_abs()))
                }
                // More than the capacity can never pass.
                None => Evaluation::denied(current, None),
            }
        }
        Op::Refund(n) => {
            // Never give back more than a full bucket; never credit beyond full.
            let n = i64::try_from(n).unwrap_or(i64::MAX).min(gcra.burst);
            commit(exact(debt - n * gcra.interval).max(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use proptest::prelude::*;

    const NOW: i64 = 1_700_000_000_000_000;

    fn params(rate: u64, period_s: u64, burst: u64) -> LimitParams {
        LimitParams {
            algorithm: Algorithm::TokenBucket,
            requests_per_period: rate,
            period_us: period_s * 1_000_000,
            burst,
            overdraft: false,
        }
    }

    fn tat_of(e: &Evaluation) -> Option<i64> {
        match e.next {
            Some((State::TokenBucket { tat_us }, _)) => Some(tat_us),
            _ => None,
        }
    }

    /// A fresh bucket admits exactly `burst` unit requests at one instant, then one more after
    /// exactly T µs (and says so in retry_after).
    #[test]
    fn fresh_bucket_admits_burst_then_one_per_interval() {
        let p = params(10, 1, 10); // T = 100 ms
        let mut tat = None;
        for i in 0..10 {
            let e = evaluate(&p, tat, NOW, 1);
            assert!(e.admitted, "request {i}");
            assert_eq!(e.committed.remaining, 9 - i);
            tat = tat_of(&e);
        }
        let e = evaluate(&p, tat, NOW, 1);
        assert!(!e.admitted);
        assert_eq!(e.next, None);
        assert_eq!(e.retry_after_us, Some(100_000));
        assert!(!evaluate(&p, tat, NOW + 99_999, 1).admitted);
        assert!(evaluate(&p, tat, NOW + 100_000, 1).admitted);
    }

    /// T is rounded up to a whole µs: 3 per second gives 333 334 µs per token.
    #[test]
    fn interval_rounds_up() {
        assert_eq!(emission_interval_us(1_000_000, 3), 333_334);
        assert_eq!(emission_interval_us(1_000_000, 4), 250_000);
        let e = evaluate(&params(3, 1, 3), None, NOW, 1);
        assert_eq!(
            e.next,
            Some((
                State::TokenBucket {
                    tat_us: NOW + 333_334
                },
                333_334
            ))
        );
        assert_eq!(e.committed.remaining, 2); // floor((1 000 002 − 333 334) / 333 334)
    }

    /// Views report whole tokens left and the debt as time until full; TTL equals that debt.
    #[test]
    fn views_and_ttl() {
        let p = params(10, 1, 10);
        let e = evaluate(&p, Some(NOW + 250_000), NOW, 3);
        assert_eq!(
            e.current,
            View {
                remaining: 7,
                reset_us: 250_000
            }
        );
        assert_eq!(
            e.committed,
            View {
                remaining: 4,
                reset_us: 550_000
            }
        );
        assert_eq!(
            e.next,
            Some((
                State::TokenBucket {
                    tat_us: NOW + 550_000
                },
                550_000
            ))
        );
        let fresh = evaluate(&p, None, NOW, 0);
        assert_eq!(
            fresh.current,
            View {
                remaining: 10,
                reset_us: 0
            }
        );
    }

    /// A cost above burst is denied forever (retry None) and changes nothing.
    #[test]
    fn cost_above_burst_never_passes() {
        let e = evaluate(&params(10, 1, 5), None, NOW, 6);
        assert!(!e.admitted);
        assert_eq!((e.next, e.retry_after_us), (None, None));
        assert_eq!(e.committed, e.current);
    }

    /// A denied cost waits exactly new_tat − tau − now.
    #[test]
    fn denied_retry_after_is_exact() {
        let p = params(10, 1, 10); // tau = 1 s
        let e = evaluate(&p, Some(NOW + 900_000), NOW, 3);
        assert!(!e.admitted);
        assert_eq!(e.retry_after_us, Some(200_000)); // 900k + 300k − 1 000k
        assert!(!evaluate(&p, Some(NOW + 900_000), NOW + 199_999, 3).admitted);
        assert!(evaluate(&p, Some(NOW + 900_000), NOW + 200_000, 3).admitted);
    }

    /// Check-only passes unless the bucket is overdrawn (debt > tau, e.g. after burst was
    /// lowered), and never returns a state.
    #[test]
    fn check_only() {
        let p = params(10, 1, 10);
        let e = evaluate(&p, Some(NOW + 1_000_000), NOW, 0);
        assert!(e.admitted && e.next.is_none());
        assert_eq!(e.current.remaining, 0);
        let e = evaluate(&p, Some(NOW + 1_300_000), NOW, 0);
        assert!(!e.admitted && e.next.is_none());
        assert_eq!(e.retry_after_us, Some(300_000));
        assert_eq!(
            e.current,
            View {
                remaining: 0,
                reset_us: 1_300_000
            }
        );
    }

    /// A refund moves tat back by at most burst × T and never before now (TTL 0 = full).
    #[test]
    fn refund() {
        let p = params(10, 1, 10);
        let e = evaluate(&p, Some(NOW + 500_000), NOW, -2);
        assert!(e.admitted);
        assert_eq!(
            e.next,
            Some((
                State::TokenBucket {
                    tat_us: NOW + 300_000
                },
                300_000
            ))
        );
        assert_eq!(e.committed.remaining, 7);
        let e = evaluate(&p, Some(NOW + 500_000), NOW, -9);
        assert_eq!(e.next, Some((State::TokenBucket { tat_us: NOW }, 0)));
        // Refund clamp min(n, burst): an overdrawn bucket gets back at most a full bucket.
        let e = evaluate(&p, Some(NOW + 3_000_000), NOW, i64::MIN);
        assert_eq!(tat_of(&e), Some(NOW + 2_000_000));
    }

    /// A tat in the past is a full bucket; a clock that steps back leaves the debt as is.
    #[test]
    fn idle_time_is_forgotten_and_clock_steps_back() {
        let p = params(10, 1, 10);
        let e = evaluate(&p, Some(NOW - 5_000_000), NOW, 1);
        assert_eq!(tat_of(&e), Some(NOW + 100_000));
        let e = evaluate(&p, Some(NOW + 100_000), NOW - 50_000, 0);
        assert_eq!(e.current.reset_us, 150_000);
    }

    /// A tat beyond now + 2^50 (corrupt state) is treated as exactly 2^50 ahead.
    #[test]
    fn debt_is_capped() {
        let e = evaluate(&params(10, 1, 10), Some(i64::MAX), NOW, 0);
        assert_eq!(e.current.reset_us, MAX_TOLERANCE_US);
    }

    /// requests_per_period 0: debits never pass, checks and refunds pass, nothing is stored.
    #[test]
    fn zero_rate() {
        let p = params(0, 1, 10);
        let e = evaluate(&p, None, NOW, 1);
        assert!(!e.admitted);
        assert_eq!(e.retry_after_us, None);
        assert_eq!(
            e.current,
            View {
                remaining: 0,
                reset_us: 0
            }
        );
        assert!(evaluate(&p, None, NOW, 0).admitted);
        let refund = evaluate(&p, None, NOW, -1);
        assert!(refund.admitted && refund.next.is_none());
    }

    fn overdraft(rate: u64, period_s: u64, burst: u64) -> LimitParams {
        LimitParams {
            overdraft: true,
            ..params(rate, period_s, burst)
        }
    }

    /// Overdraft: a debit that does not fit is not admitted but stored, into debt beyond tau;
    /// checks deny until the debt drains back to tau, then pass.
    #[test]
    fn overdraft_goes_into_debt() {
        let p = overdraft(10, 1, 10); // T = 100 ms, tau = 1 s
        let e = evaluate(&p, Some(NOW + 600_000), NOW, 7);
        assert!(!e.admitted);
        assert_eq!(
            e.next,
            Some((
                State::TokenBucket {
                    tat_us: NOW + 1_300_000
                },
                1_300_000
            ))
        );
        assert_eq!(e.retry_after_us, Some(300_000));
        assert_eq!(
            e.committed,
            View {
                remaining: 0,
                reset_us: 1_300_000
            }
        );
        let tat = tat_of(&e);
        assert!(!evaluate(&p, tat, NOW + 299_999, 0).admitted);
        assert!(evaluate(&p, tat, NOW + 300_000, 0).admitted);
        // A fitting debit is an ordinary commit.
        assert!(evaluate(&p, None, NOW, 10).admitted);
    }

    /// Overdraft: a cost above burst is stored too, and the debt is capped at 2^50 µs.
    #[test]
    fn overdraft_above_burst_and_debt_cap() {
        let p = overdraft(10, 1, 5);
        let e = evaluate(&p, None, NOW, 6);
        assert!(!e.admitted);
        assert_eq!(tat_of(&e), Some(NOW + 600_000));
        assert_eq!(e.retry_after_us, Some(100_000));
        let max = i64::try_from(MAX_TOLERANCE_US).unwrap_or(i64::MAX);
        let e = evaluate(&p, None, NOW, i64::MAX);
        assert_eq!(tat_of(&e), Some(NOW + max));
        let e = evaluate(&p, Some(NOW + max - 50_000), NOW, 1);
        assert_eq!(tat_of(&e), Some(NOW + max));
        // Rate 0: nothing would ever repay a debt, so nothing is stored.
        assert_eq!(evaluate(&overdraft(0, 1, 5), None, NOW, 3).next, None);
    }

    /// One step of a random sequence: time advance (µs) and cost.
    fn steps() -> impl Strategy<Value = Vec<(i64, i64)>> {
        prop::collection::vec((0i64..400_000, -3i64..14), 1..60)
    }

    proptest! {
        /// Over any interval [t_i, t_j] the net admitted tokens (debits minus credited refunds)
        /// never exceed burst + floor((t_j − t_i) / T), from any starting state.
        #[test]
        fn never_admits_more_than_burst_plus_rate(
            rate in 1u64..50,
            burst in 0u64..12,
            start_debt in 0i64..3_000_000,
            steps in steps(),
        ) {
            let p = params(rate, 1, burst);
            let interval = i64::try_from(emission_interval_us(1_000_000, rate)).unwrap_or(1);
            let mut tat = Some(NOW + start_debt);
            let mut now = NOW;
            let mut log: Vec<(i64, i64)> = Vec::new(); // (time, net tokens)
            for (dt, cost) in steps {
                now += dt;
                let e = evaluate(&p, tat, now, cost);
                if let Some((State::TokenBucket { tat_us }, _)) = e.next {
                    tat = Some(tat_us);
                    let credited = if cost < 0 { -(-cost).min(i64::try_from(burst).unwrap_or(0)) } else { cost };
                    log.push((now, credited));
                }
            }
            for i in 0..log.len() {
                let mut net = 0;
                for j in i..log.len() {
                    net += log[j].1;
                    let bound = i64::try_from(burst).unwrap_or(0) + (log[j].0 - log[i].0) / interval;
                    prop_assert!(net <= bound, "net {net} > bound {bound} over [{i}, {j}]");
                }
            }
        }

        /// Overdraft: every debit is stored (debt grows by exactly cost × T, below the cap),
        /// and the debt is repaid at the configured rate: checks pass again exactly when the
        /// debt has drained back to tau, i.e. after debt − tau µs.
        #[test]
        fn overdraft_debits_always_apply_and_debt_repays_at_rate(
            rate in 1u64..1000,
            period_s in 1u64..100,
            burst in 1u64..50,
            debt in 0i64..200_000_000,
            cost in 1i64..500,
        ) {
            let p = overdraft(rate, period_s, burst);
            let interval = i64::try_from(emission_interval_us(period_s * 1_000_000, rate)).unwrap_or(1);
            let tau = interval * i64::try_from(burst).unwrap_or(0);
            let e = evaluate(&p, Some(NOW + debt), NOW, cost);
            let new_tat = NOW + debt.max(0) + cost * interval;
            prop_assert_eq!(tat_of(&e), Some(new_tat));
            prop_assert_eq!(e.admitted, debt + cost * interval <= tau);
            let over = new_tat - NOW - tau;
            if over > 0 {
                prop_assert_eq!(e.retry_after_us, Some(over.unsigned_abs()));
                prop_assert!(!evaluate(&p, Some(new_tat), NOW + over - 1, 0).admitted);
            }
            prop_assert!(evaluate(&p, Some(new_tat), NOW + over.max(0), 0).admitted);
            // Fully repaid (a full bucket) once the whole debt has drained.
            let full = evaluate(&p, Some(new_tat), new_tat, 0);
            prop_assert_eq!(full.current.remaining, burst);
        }

        /// retry_after is exact: the same cost passes at now + retry and not one µs earlier.
        #[test]
        fn retry_after_is_exact(
            rate in 1u64..1000,
            period_s in 1u64..100,
            burst in 1u64..50,
            debt in 0i64..200_000_000,
            cost in 0i64..50,
        ) {
            let p = params(rate, period_s, burst);
            let e = evaluate(&p, Some(NOW + debt), NOW, cost);
            if let (false, Some(r)) = (e.admitted, e.retry_after_us) {
                let r = i64::try_from(r).unwrap_or(i64::MAX);
                prop_assert!(r > 0);
                prop_assert!(evaluate(&p, Some(NOW + debt), NOW + r, cost).admitted);
                prop_assert!(!evaluate(&p, Some(NOW + debt), NOW + r - 1, cost).admitted);
            }
        }
    }
}
