//! The randomized equivalence test: random limits of every algorithm, costs and clock steps
//! applied step after step by the script and by the memory store.

use super::common::*;

/// Keys in the pool of each case.
pub(crate) const POOL: usize = 4;

/// One operation of a step: which pool key, optionally other params (same period: a config
/// reload may change the algorithm or the numbers of a bucket, never the key's period), cost,
/// and the window its debit was counted in, as an offset from the current window's index
/// (`BucketOp::debited_in`: a past window, the current one, or one ahead after the clock
/// stepped back).
#[derive(Clone, Debug)]
pub(crate) struct OpSpec {
    pub(crate) key: usize,
    pub(crate) change: Option<(Algorithm, u64, u64, bool)>,
    pub(crate) cost: i64,
    pub(crate) enforce: bool,
    pub(crate) debited_in: Option<i64>,
    /// For a refund: the time of the debit it gives back (`BucketOp::debited_at`), as an
    /// offset from now; a set since then drops it.
    pub(crate) debited_at: Option<i64>,
}

#[derive(Clone, Debug)]
pub(crate) struct Step {
    /// µs the clock moves before this step (negative: it steps back).
    pub(crate) dt: i64,
    pub(crate) ops: Vec<OpSpec>,
    /// Keep a repeated key (the planner never sends one; both stores must still agree).
    pub(crate) allow_repeat: bool,
    /// The operator's set (`Store::set`, the script's set flag) instead of a request.
    pub(crate) set: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct Case {
    /// Offset of the first step from `START_US` (day-aligned), µs.
    pub(crate) start: i64,
    pub(crate) pool: Vec<LimitParams>,
    pub(crate) steps: Vec<Step>,
}

pub(crate) fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ])
}

/// Rates from 0 to u32::MAX: small ones, round ones, and beyond one per µs of a 1 s period
/// (where the token bucket's ticks get finer than a µs).
pub(crate) fn rate() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => 0u64..=12,
        3 => prop::sample::select(vec![3u64, 7, 10, 60, 100, 1000]),
        1 => 0u64..=1_000_000,
        1 => prop::sample::select(vec![999_999u64, 1_000_001, 4_000_000, 1_000_000_000]),
        1 => 1_000_000u64..=u64::from(u32::MAX),
        1 => Just(u64::from(u32::MAX)),
    ]
}

/// Periods of every unit, with multipliers up to the longest (year × 2), mostly short ones.
pub(crate) fn period_s() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => prop::sample::select(vec![1u64, 60, 3600]),
        1 => prop::sample::select(vec![7, 86_400, 604_800, 2_592_000, 31_536_000, 63_072_000]),
    ]
}

/// Burst: the rate itself (the default), a small number, twice the rate, or the largest.
pub(crate) fn burst_for(rate: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => Just(rate),
        4 => 0u64..=20,
        2 => Just(rate.saturating_mul(2)),
        1 => Just(u64::from(u32::MAX)),
    ]
}

/// Mostly valid limits, mostly of 1 s, 1 min and 1 h; a few that config validation would
/// refuse, which both sides must clamp the same way. About a third are `overdraft`, and
/// about two in five have a `max_wait` (from 1 µs to beyond the longest accepted; with
/// `overdraft` or a window too, which validation refuses and both sides ignore).
pub(crate) fn limit_params() -> impl Strategy<Value = LimitParams> {
    let valid = (algorithm(), rate(), period_s())
        .prop_flat_map(|(a, r, p)| burst_for(r).prop_map(move |b| params(a, r, p, b)));
    let refused = (
        algorithm(),
        prop::sample::select(vec![0u64, 5, 2_000_000, u64::MAX]),
        prop::sample::select(vec![0u64, 999, 1500, 7 * SECOND, u64::MAX]),
        prop::sample::select(vec![0u64, 3, u64::MAX]),
    )
        .prop_map(|(a, r, period_us, b)| LimitParams {
            algorithm: a,
            requests_per_period: r,
            period_us,
            burst: b,
            overdraft: false,
            max_wait_us: 0,
        });
    let max_wait = prop_oneof![
        3 => Just(0u64),
        2 => prop::sample::select(vec![
            1u64,
            999,
            50_000,
            1_000_000,
            limiter::MAX_WAIT_US,
            u64::MAX
        ]),
    ];
    (
        prop_oneof![12 => valid, 1 => refused],
        prop::bool::weighted(0.35),
        max_wait,
    )
        .prop_map(|(p, overdraft, max_wait_us)| LimitParams {
            overdraft,
            max_wait_us,
            ..p
        })
}

pub(crate) fn cost() -> impl Strategy<Value = i64> {
    let max = i64::from(u32::MAX);
    prop_oneof![
        8 => -3i64..=12,
        2 => Just(0i64),
        1 => -40i64..=40,
        1 => prop::sample::select(vec![i64::MAX, i64::MIN, max, max + 1, -max, 1 << 53, 1_000_000]),
    ]
}

pub(crate) fn op_spec() -> impl Strategy<Value = OpSpec> {
    (
        0..POOL,
        prop::option::weighted(0.1, (algorithm(), rate(), 0u64..=20, any::<bool>())),
        cost(),
        prop::bool::weighted(0.85),
        prop::option::weighted(0.4, -3i64..=1),
        prop::option::weighted(0.4, -3_000_000i64..=1_000),
    )
        .prop_map(
            |(key, change, cost, enforce, debited_in, debited_at)| OpSpec {
                key,
                change,
                cost,
                enforce,
                debited_in,
                debited_at,
            },
        )
}

/// Time steps from 0 µs to 2 h (two periods of the longest limit), sometimes a little back.
pub(crate) fn dt() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        3 => 0i64..1_000,
        4 => 0i64..2_000_000,
        2 => 0i64..120_000_000,
        1 => 0i64..7_200_000_000,
        1 => -2_000_000i64..0,
    ]
}

pub(crate) fn step() -> impl Strategy<Value = Step> {
    (
        dt(),
        prop::collection::vec(op_spec(), 1..=5),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(dt, ops, allow_repeat, set)| Step {
            dt,
            ops,
            allow_repeat,
            set,
        })
}

pub(crate) fn case() -> impl Strategy<Value = Case> {
    (
        0i64..7_200_000_000,
        prop::collection::vec(limit_params(), POOL),
        prop::collection::vec(step(), 1..40),
    )
        .prop_map(|(start, pool, steps)| Case { start, pool, steps })
}

/// The bucket ops of one step at `now`.
pub(crate) fn ops_of(
    step: &Step,
    pool: &[LimitParams],
    keys: &[BucketKey],
    now: i64,
) -> Vec<BucketOp> {
    let mut seen = [false; POOL];
    let mut ops = Vec::new();
    for spec in &step.ops {
        if !step.allow_repeat && std::mem::replace(&mut seen[spec.key], true) {
            continue;
        }
        let base = pool[spec.key];
        let params = match spec.change {
            Some((algorithm, rate, burst, overdraft)) => LimitParams {
                algorithm,
                requests_per_period: rate,
                burst,
                overdraft,
                ..base
            },
            None => base,
        };
        // The window index the limiter puts `now` in (its period clamped as it clamps it).
        let period = i64::try_from(params.period_us.clamp(1000, limiter::MAX_PERIOD_US)).unwrap();
        ops.push(BucketOp {
            key: keys[spec.key].clone(),
            params,
            cost: spec.cost,
            enforce: spec.enforce,
            reference: None,
            debited_in: spec.debited_in.map(|offset| now / period + offset),
            debited_at: spec.debited_at.map(|offset| now + offset),
        });
    }
    ops
}

/// What the test saw of the script's last write of a key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Write {
    /// Fake time of the write, µs.
    pub(crate) at: i64,
    /// PTTL right after it, ms.
    pub(crate) pttl_ms: i64,
    /// Real time the transaction took, ms (rounded up): the TTL the script set lies in
    /// `[pttl_ms, pttl_ms + took_ms]`.
    pub(crate) took_ms: i64,
}

/// Compares what the memory store holds live (state, expiry) with what Redis holds.
pub(crate) fn compare_state(
    memory: Option<(State, i64)>,
    redis: Option<State>,
    write: Option<&Write>,
    now: i64,
) -> Result<(), String> {
    match (memory, redis, write) {
        (None, None, _) => Ok(()),
        (Some((state, expires_at)), Some(stored), Some(w)) => {
            let ttl_ms = (expires_at - w.at + 999).div_euclid(1000);
            if stored == state && (w.pttl_ms..=w.pttl_ms + w.took_ms).contains(&ttl_ms) {
                Ok(())
            } else {
                Err(format!(
                    "memory holds {state:?} for {ttl_ms} ms, redis {stored:?} with {w:?}"
                ))
            }
        }
        // Only a state whose own TTL (rounded up to ms) ran out by now may linger in Redis.
        (None, Some(_), Some(w)) if w.at + (w.pttl_ms - 1) * 1000 < now => Ok(()),
        (memory, redis, write) => Err(format!(
            "memory holds {memory:?}, redis {redis:?} (last write seen: {write:?})"
        )),
    }
}

/// The key of each limit of a case's pool, named by its index.
pub(crate) fn pool_keys(pool: &[LimitParams]) -> Vec<BucketKey> {
    pool.iter()
        .enumerate()
        .map(|(i, p)| key(&i.to_string(), p.algorithm, p.period_us))
        .collect()
}

/// Drives one case through both stores; `Err` describes the first divergence.
pub(crate) async fn run_case(conn: &mut MultiplexedConnection, case: &Case) -> Result<(), String> {
    flush(conn).await;
    let keys = pool_keys(&case.pool);
    let redis_keys: Vec<Vec<u8>> = keys.iter().map(|k| script::full_key(PREFIX, k)).collect();
    // The set marker of a key without braces (lua/apply.lua's header): `key{key}~set`.
    let markers: Vec<Vec<u8>> = redis_keys
        .iter()
        .map(|k| [k.as_slice(), b"{", k.as_slice(), b"}~set"].concat())
        .collect();
    let clock = Arc::new(ManualClock::new(START_US + case.start));
    let memory = MemoryStore::new(clock.clone());
    let mut written: HashMap<usize, Write> = HashMap::new();
    for (n, step) in case.steps.iter().enumerate() {
        clock.advance(step.dt);
        let now = clock.now_us();
        let ops = ops_of(step, &case.pool, &keys, now);
        let (expected, command) = if step.set {
            let expected = memory.set(&ops).await;
            (expected, script::set_command(PREFIX, &ops, Some(now)))
        } else {
            let expected = memory.apply(&ops).await;
            (expected, script::command(PREFIX, &ops, Some(now)))
        };
        let expected = expected.map_err(|e| e.to_string())?;

        let mut pipe = redis::pipe();
        pipe.atomic().add_command(command);
        for key in &redis_keys {
            pipe.cmd("PTTL").arg(key).cmd("PERSIST").arg(key).ignore();
        }
        // The sets' markers are judged by the script's `now`, not their PX: kept like the keys.
        for marker in &markers {
            pipe.cmd("PERSIST").arg(marker).ignore();
        }
        let sent = Instant::now();
        let mut results: Vec<Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
        let took_ms = i64::try_from(sent.elapsed().as_millis()).unwrap_or(i64::MAX) + 1;
        let ttls: Vec<i64> = results
            .split_off(1)
            .into_iter()
            .map(|v| redis::from_redis_value(v).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let reply: script::Reply =
            redis::from_redis_value(results.remove(0)).map_err(|e| e.to_string())?;
        let got = script::decode(&reply, ops.len()).map_err(|e| e.to_string())?;
        let context = || format!("step {n} at now {now} with ops {ops:#?}");
        if got != expected {
            return Err(format!(
                "answers differ at {}:\n lua    {got:?}\n memory {expected:?}",
                context()
            ));
        }

        for (i, key) in keys.iter().enumerate() {
            match ttls[i] {
                // PTTL ≥ 0: written by this very call (PTTL counts real time, so it may
                // have reached 0; expiry itself waits until the transaction is over).
                pttl_ms if pttl_ms >= 0 => {
                    let write = Write {
                        at: now,
                        pttl_ms,
                        took_ms,
                    };
                    written.insert(i, write);
                }
                -2 => {
                    written.remove(&i);
                }
                _ => {}
            }
            let stored = redis_state(conn, &redis_keys[i]).await;
            compare_state(memory.state_of(key), stored, written.get(&i), now)
                .map_err(|e| format!("key {i} at {}: {e}", context()))?;
        }
    }
    Ok(())
}

/// For random batches, limits, costs and times, the script answers and stores exactly what
/// the memory store (the Rust specification) does, step after step.
#[test]
fn script_matches_memory_store() {
    check_against_redis(150, case(), |mut conn, case| {
        Box::pin(async move { run_case(&mut conn, &case).await })
    });
}
