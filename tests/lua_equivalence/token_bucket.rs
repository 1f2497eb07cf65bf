//! The token bucket's stored `tat`: decimal fine ticks and the edges of its numeric domain.

use super::common::*;

/// Token buckets faster than one token per µs store their `tat` as a decimal with the
/// limit's fraction digits, exactly as the specification computes it; a limit whose time per
/// token is a whole number of µs stores the same integer as ever; and a `tat` written with
/// other digits (the limit changed) reads as the specification reads it.
#[tokio::test]
async fn fine_ticks_are_stored_as_decimals() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let max = u64::from(u32::MAX);
    let limits = [
        (params(Algorithm::TokenBucket, max, 1, max), "1.000000000"),
        (
            params(Algorithm::TokenBucket, 1_000_000_000, 1, 10),
            "1.000",
        ),
        (
            params(Algorithm::TokenBucket, 4_000_000, 1, 4_000_000),
            "1.00",
        ),
        (params(Algorithm::TokenBucket, max, 7, 5), "1.00000000"),
        (params(Algorithm::TokenBucket, 3, 1, 3), "1.0"),
        (params(Algorithm::TokenBucket, 10, 1, 10), "1"),
        (params(Algorithm::TokenBucket, 1, 63_072_000, 2), "1"),
    ];
    for (i, (limit, form)) in limits.iter().enumerate() {
        let digits = form.split_once('.').map_or(0, |(_, f)| f.len());
        for (step, cost) in [3i64, 1, -1, 0, 7].into_iter().enumerate() {
            let ops = vec![op(&format!("fine{i}"), *limit, cost, true)];
            let key = &redis_keys(&ops)[0];
            let before = redis_state(&mut conn, key).await;
            let now = NOW + i64::try_from(step).unwrap();
            let got = lua_kept(&mut conn, &ops, now).await;
            assert_eq!(got, spec(&ops, &[before], now), "limit {i} step {step}");
            if let Some(State::TokenBucket { tat }) = redis_state(&mut conn, key).await {
                assert_eq!(usize::from(tat.digits), digits, "limit {i}");
                let text: Option<String> = conn.get(key).await.unwrap();
                if let Some(text) = text {
                    assert_eq!(Tat::parse(&text), Some(tat));
                }
            }
        }
    }
    // Another limit's digits (more and fewer), and a plain integer from an older version.
    let stored = [
        format!("{}.123456789", NOW + 2),
        format!("{}.5", NOW + 1),
        format!("{}", NOW + 3),
    ];
    for (i, text) in stored.iter().enumerate() {
        for (limit, _) in &limits {
            let ops = vec![op(&format!("other{i}"), *limit, 1, true)];
            let key = &redis_keys(&ops)[0];
            let () = conn.set(key, text).await.unwrap();
            let state = Some(State::TokenBucket {
                tat: Tat::parse(text).unwrap(),
            });
            assert_eq!(
                lua(&mut conn, &ops, Some(NOW)).await,
                spec(&ops, &[state], NOW)
            );
        }
    }
}

/// The token bucket at the edges of its numeric domain — the largest rates, periods and
/// tolerances, a debt at its 2^50-tick cap, `now` at 2^52, stored tats with more and fewer
/// digits — answers and stores exactly what the specification does. The script divides with a
/// plain `floor(a / b)` there (exact for every `a` below 2^53), so this is where a rounding
/// slip would show. Each case has a key of its own: a key written by an earlier case expires in
/// Redis's real time (milliseconds for the fastest rates), so reusing it would race its TTL.
#[tokio::test]
async fn token_bucket_at_its_numeric_bounds() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let max = u64::from(u32::MAX);
    let max_period_s = limiter::MAX_PERIOD_US / SECOND;
    let limits = [
        params(Algorithm::TokenBucket, max, 1, max),
        params(Algorithm::TokenBucket, max, max_period_s, max),
        params(Algorithm::TokenBucket, 1, max_period_s, 16),
        params(Algorithm::TokenBucket, 3, 7, max),
        params(Algorithm::TokenBucket, 7, 3_600, 1),
        LimitParams {
            overdraft: true,
            max_wait_us: 0,
            ..params(Algorithm::TokenBucket, 1, max_period_s, 1)
        },
    ];
    let max_now = limiter::MAX_NOW_US;
    let costs = [1, i64::from(u32::MAX), -i64::from(u32::MAX), 0, 2];
    for (i, limit) in limits.iter().enumerate() {
        for (n, now) in [NOW, max_now - 1, max_now].into_iter().enumerate() {
            let stored = [
                None,
                Some(format!("{}", now + (1 << 49))),
                Some(format!("{}.999999999", now + 12_345)),
                Some(format!("{}.5", now - 1)),
                Some(format!("{}", max_now + (1 << 50))),
            ];
            for (j, text) in stored.iter().enumerate() {
                for (k, cost) in costs.iter().enumerate() {
                    let ops = vec![op(&format!("edge{i}-{n}-{j}-{k}"), *limit, *cost, true)];
                    let key = &redis_keys(&ops)[0];
                    if let Some(text) = text {
                        let () = conn.set(key, text).await.unwrap();
                    }
                    let before = redis_state(&mut conn, key).await;
                    let (got, after) = lua_then_state(&mut conn, &ops, now, key).await;
                    let case = format!("limit {i}, now {now}, stored {text:?}, cost {cost}");
                    assert_eq!(got, spec(&ops, &[before], now), "{case}");
                    let evaluation = limiter::evaluate(limit, before.as_ref(), now, *cost);
                    let expected = match evaluation.next {
                        Some(_) if !got.committed => before,
                        None => before,
                        Some((_, 0)) => None,
                        Some((state, _)) => Some(state),
                    };
                    assert_eq!(after, expected, "{case}");
                }
            }
        }
    }
}
