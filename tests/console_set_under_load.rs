//! The operator's set-remaining under load: requests racing the set are counted before it
//! (and overwritten) or after it, so a bucket set to 0 admits afterwards only what it
//! refills — on Redis and on the memory store, against the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use floodgate::console::client::{self, Call};
use floodgate::console::{BucketEntry, BucketRequest, Inspection};
use floodgate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use floodgate::proto::rls::RateLimitRequest;
use support::load::{self, Load};
use support::process::Floodgate;
use support::redis::RedisServer;

/// 1000 an hour: a token every 3.6 s, so a bucket set to 0 admits nothing for 3.6 s.
const LIMITS: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

const TOKEN: &str = "s3cret-token";

/// Sets (to 0) made while the load runs. The red team saw the race in 3 trials of 4; at
/// even one in four, 12 trials all missing it would happen about 3 times in 100,000.
const TRIALS: usize = 12;

/// Requests answered after each set before the next one.
const AFTER_EACH: u64 = 150;

/// A server on `store_args` with the limits above and the admin token in a file.
fn start(dir: &std::path::Path, store_args: &[&str]) -> Floodgate {
    let limits = dir.join("limits.yaml");
    std::fs::write(&limits, LIMITS).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let mut args = vec![
        "--config",
        limits.to_str().unwrap(),
        "--admin-token-file",
        token.to_str().unwrap(),
    ];
    args.extend_from_slice(store_args);
    Floodgate::start(&args)
}

fn victim() -> RateLimitRequest {
    RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "victim".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// Six clients debit the bucket in closed loops while it is set to 0 [`TRIALS`] times; after
/// each set's answer, the requests sent until the next set may be admitted only by refill
/// (one per 3.6 s of the time they ran, plus one for a token due at the set), and the set
/// answers 0 remaining itself.
async fn set_to_zero_holds_under_load(server: &Floodgate) {
    let admin = format!("http://{}", server.http);
    let load = Load::start(server.grpc, 6, |_, _| victim()).await;
    load.until_answered(100).await;
    let request = BucketRequest {
        domain: "shop".into(),
        entries: vec![BucketEntry {
            key: "user".into(),
            value: "victim".into(),
        }],
        remaining: Some(0),
        ..Default::default()
    };
    let mut phases = Vec::new();
    for _ in 0..TRIALS {
        let (status, body) = client::send(&admin, Call::Set, &request, Some(TOKEN))
            .await
            .unwrap();
        let answered = Instant::now();
        assert_eq!(status, 200, "{body}");
        let inspection: Inspection = serde_json::from_str(&body).unwrap();
        assert_eq!(inspection.buckets[0].remaining, 0, "the set's own answer");
        load.until_answered(AFTER_EACH).await;
        phases.push((answered, Instant::now()));
    }
    let outcomes = load.finish().await;
    let mut allowed = 0;
    let mut admitted = 0;
    for (from, to) in phases {
        let sent_after = load::within(&outcomes, from, to);
        assert!(sent_after.iter().all(|o| o.result.is_ok()), "store errors");
        admitted += sent_after.iter().filter(|o| o.is_ok()).count();
        let refill = (to - from).as_secs_f64() / 3.6;
        allowed += 1 + refill.floor() as usize;
    }
    assert!(
        admitted <= allowed,
        "{admitted} requests admitted after sets to 0, where refill allows {allowed}"
    );
}

/// On Redis: the set is one script call, so nothing lands between a reset and a debit.
#[tokio::test]
async fn set_to_zero_holds_under_load_on_redis() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let url = redis.url();
    let server = start(
        dir.path(),
        &[
            "--redis-url",
            &url,
            // A loaded test machine must not turn a slow answer into a store error.
            "--redis-timeout-ms",
            "1000",
        ],
    );
    // Serving once Redis has answered a probe.
    let deadline = Instant::now() + support::EVENTUALLY;
    while support::http::call(server.http, "GET", "/healthcheck", None)
        .await
        .status
        != 200
    {
        assert!(Instant::now() < deadline, "Redis never usable");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set_to_zero_holds_under_load(&server).await;
    server.stop().await;
}

/// On the memory store: the set holds the buckets' shard locks as a request does.
#[tokio::test]
async fn set_to_zero_holds_under_load_on_memory() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    set_to_zero_holds_under_load(&server).await;
    server.stop().await;
}
