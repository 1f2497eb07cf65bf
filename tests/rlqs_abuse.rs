//! The Rate Limit Quota Service under abuse, on the real binary: a flood of bucket ids stays
//! within its memory bound and is given back, silent streams and one peer cannot hold every
//! slot, an over-size message is an error, and an ended stream's share rows last as long as
//! the assignments it sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use floodgate::proto::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use support::h2raw::rss_bytes;
use support::process::Floodgate;
use support::redis::RedisServer;
use support::rlqs::{Envoy, Usage, granted, reports};
use tokio::time::Instant;
use tonic::Code;

const LIMITS: &str = "
domain: edge
descriptors:
  - key: tenant
    value: a
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    value: b
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 600}
";

/// A server on `LIMITS` with `flags`; the directory holds the limits file.
fn start(flags: &[&str]) -> (Floodgate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limits.yaml");
    std::fs::write(&path, LIMITS).unwrap();
    let path = path.display().to_string();
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(flags);
    (Floodgate::start(&args), dir)
}

/// A metric's value on `server`, 0 when absent.
async fn metric(server: &Floodgate, series: &str) -> f64 {
    support::http::metric(server.http, series)
        .await
        .unwrap_or(0.0)
}

/// A flood of 30 streams × 1,000 bucket ids of 1 KiB values, each matching a limit (share
/// rows too), stays within the subscription bound: the flooding streams end with
/// RESOURCE_EXHAUSTED, RSS grows by less than 96 MiB (the bound charges 8 MiB), an Envoy
/// subscribed before the flood keeps its share, and once the streams have ended and their
/// assignments expired every byte charged is given back.
#[tokio::test]
async fn a_flood_of_bucket_ids_is_bounded_and_given_back() {
    let (server, _dir) = start(&[
        "--rlqs-max-bucket-bytes",
        "8388608",
        "--rlqs-assignment-ttl",
        "1",
        "--rlqs-reassess-interval",
        "86400",
    ]);
    let pid = server.child.id();
    let mut envoy = Envoy::open(&server).await.unwrap();
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    assert_eq!(
        granted(&envoy.report("edge", &[(tenant, 1, 0, 0)]).await),
        100
    );
    let before = rss_bytes(pid);

    let value = "v".repeat(1024);
    let mut flood = Vec::new();
    for stream in 0..30 {
        let value = value.clone();
        let server_grpc = server.grpc;
        flood.push(tokio::spawn(async move {
            let mut client = RateLimitQuotaServiceClient::connect(format!("http://{server_grpc}"))
                .await
                .unwrap();
            let Ok(mut flooder) = Envoy::open_on(&mut client).await else {
                return None;
            };
            // 50 ids a message (about 52 KB, under the 64 KiB message bound).
            for batch in 0..20 {
                let paths: Vec<String> = (0..50)
                    .map(|i| format!("{stream}/{batch}/{i}/{value}"))
                    .collect();
                let ids: Vec<[(&str, &str); 2]> = paths
                    .iter()
                    .map(|path| [("tenant", "b"), ("path", path.as_str())])
                    .collect();
                let usages: Vec<Usage<'_>> = ids.iter().map(|id| (&id[..], 1, 0, 1)).collect();
                flooder.send(reports("edge", &usages)).await;
                match flooder.next().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return None,
                    Err(status) => return Some((status, flooder)),
                }
            }
            None
        }));
    }
    let mut refused = Vec::new();
    for task in flood {
        if let Some(ended) = task.await.unwrap() {
            refused.push(ended);
        }
    }
    let peak = rss_bytes(pid);
    let charged = metric(&server, "floodgate_rlqs_bucket_bytes").await;
    eprintln!(
        "RSS before {} MiB, at the bound {} MiB; {charged} bytes charged",
        before >> 20,
        peak >> 20
    );
    assert!(!refused.is_empty(), "no flooding stream was refused");
    for (status, _) in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("--rlqs-max-bucket"), "{status:?}");
    }
    let grown = peak.saturating_sub(before);
    assert!(grown < 96 << 20, "RSS grew by {} MiB", grown >> 20);
    assert!(charged <= 8_388_608.0, "{charged}");
    // Nothing else degraded: the earlier Envoy is answered, and its share is whole.
    assert_eq!(
        granted(&envoy.report("edge", &[(tenant, 1, 0, 0)]).await),
        100
    );
    assert!(metric(&server, "floodgate_rlqs_refused_total{reason=\"memory\"}").await >= 1.0);

    drop(refused);
    support::eventually("the flood's subscriptions given back", || async {
        metric(&server, "floodgate_rlqs_buckets").await == 1.0
    })
    .await;
    let one = metric(&server, "floodgate_rlqs_bucket_bytes").await;
    assert!(
        one > 0.0 && one < 2048.0,
        "{one} bytes charged for one bucket"
    );
    eprintln!("RSS once given back {} MiB", rss_bytes(pid) >> 20);
    server.stop().await;
}

/// `assert`s that an Envoy newly reporting on a bucket whose whole rate another Envoy held
/// until its stream ended (`end` ends it) is granted nothing before that Envoy's last
/// assignment expired, and then the whole rate: the fill rates in force never sum past the
/// limit. Re-evaluation is off, so the holder's assignment never shrinks before it goes. The
/// server runs with `flags` beside those.
async fn rows_outlive_the_stream(flags: &[&str], end: impl AsyncFnOnce(Envoy)) {
    const TTL: Duration = Duration::from_secs(3);
    let mut args = vec![
        "--rlqs-assignment-ttl",
        "3",
        "--rlqs-reassess-interval",
        "86400",
    ];
    args.extend_from_slice(flags);
    let (server, _dir) = start(&args);
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    let mut holder = Envoy::open(&server).await.unwrap();
    let mut newcomer = Envoy::open(&server).await.unwrap();
    assert_eq!(
        granted(&holder.report("edge", &[(tenant, 100, 100, 1)]).await),
        100
    );
    // The holder's assignment is valid until at least this instant.
    let held_until = Instant::now() + TTL;
    assert_eq!(
        granted(&newcomer.report("edge", &[(tenant, 100, 100, 1)]).await),
        0
    );
    end(holder).await;
    let started = Instant::now();
    loop {
        let grant = granted(&newcomer.report("edge", &[(tenant, 100, 100, 1)]).await);
        if Instant::now() < held_until {
            assert_eq!(grant, 0, "granted while the holder's 100/s was still valid");
        } else if grant == 100 {
            break;
        }
        assert!(started.elapsed() < support::EVENTUALLY, "never granted");
        // Envoy's next report, a little later: the client's pace, not a wait on the server.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await;
}

/// A stream the client resets keeps its rows until its assignments expire.
#[tokio::test]
async fn a_reset_streams_rows_outlive_its_assignments() {
    rows_outlive_the_stream(&[], async |holder| drop(holder)).await;
}

/// The same with the share table in Redis: the row stays there too.
#[tokio::test]
async fn a_reset_streams_rows_outlive_its_assignments_in_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    rows_outlive_the_stream(&["--redis-url", url.as_str()], async |holder| drop(holder)).await;
}

/// A stream floodgate ends with an error keeps its rows until its assignments expire.
#[tokio::test]
async fn an_errored_streams_rows_outlive_its_assignments() {
    rows_outlive_the_stream(&[], async |mut holder| {
        let tenant: &[(&str, &str)] = &[("tenant", "a")];
        let status = holder.refused(reports("other", &[(tenant, 1, 0, 1)])).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    })
    .await;
}

/// A client that opens streams and never reports: from one peer address it gets at most
/// `--rlqs-max-streams-per-peer` of them (the rest RESOURCE_EXHAUSTED), an Envoy from another
/// address is still served, and the silent streams end with DEADLINE_EXCEEDED after
/// `--rlqs-report-timeout`, freeing their slots.
#[tokio::test]
async fn silent_streams_and_one_peer_cannot_hold_every_slot() {
    let (server, _dir) = start(&[
        "--rlqs-max-streams",
        "20",
        "--rlqs-max-streams-per-peer",
        "5",
        "--rlqs-report-timeout",
        "2",
    ]);
    let mut silent = Vec::new();
    let mut refused = 0;
    for _ in 0..3 {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .unwrap();
        for _ in 0..5 {
            match Envoy::open_on(&mut client).await {
                Ok(envoy) => silent.push(envoy),
                Err(status) => {
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    assert!(
                        status.message().contains("--rlqs-max-streams-per-peer"),
                        "{status:?}"
                    );
                    refused += 1;
                }
            }
        }
    }
    assert_eq!((silent.len(), refused), (5, 10));

    // Another peer address (loopback is a /8).
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .local_address(Some("127.0.0.2".parse().unwrap()));
    let mut client = RateLimitQuotaServiceClient::new(endpoint.connect().await.unwrap());
    let mut envoy = Envoy::open_on(&mut client).await.unwrap();
    let tenant: &[(&str, &str)] = &[("tenant", "a")];
    assert_eq!(
        granted(&envoy.report("edge", &[(tenant, 1, 0, 0)]).await),
        100
    );

    for stream in &mut silent {
        let status = stream.next().await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(
            status.message().contains("--rlqs-report-timeout"),
            "{status:?}"
        );
    }
    support::eventually("the silent streams' slots freed", || async {
        metric(&server, "floodgate_rlqs_streams").await <= 1.0
    })
    .await;
    server.stop().await;
}

/// A message past `--grpc-max-message-bytes` ends the stream with RESOURCE_EXHAUSTED, never
/// a clean end (grpc-status 0), and is counted.
#[tokio::test]
async fn an_oversize_message_is_resource_exhausted() {
    let (server, _dir) = start(&[]);
    // A gRPC message header announcing 16 MiB, past the 1 MiB bound.
    let status = support::h2raw::grpc_status_of(
        server.grpc,
        "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
        &[0, 1, 0, 0, 0, 0, 0, 0, 0],
        false,
    )
    .await;
    assert_eq!(status, (Code::ResourceExhausted as i32).to_string());
    assert_eq!(
        metric(
            &server,
            "floodgate_rlqs_refused_total{reason=\"too_large\"}"
        )
        .await,
        1.0
    );
    server.stop().await;
}

/// 40 streams reporting the same 10 bucket ids of 4 KiB values are charged each id's bytes
/// once: the bytes charged stay under what one copy per stream would take (40 × 10 × 4 KiB).
#[tokio::test]
async fn identical_bucket_ids_are_stored_once() {
    let (server, _dir) = start(&[]);
    let value = "v".repeat(4096);
    let paths: Vec<String> = (0..10).map(|i| format!("{i}/{value}")).collect();
    let ids: Vec<[(&str, &str); 2]> = paths
        .iter()
        .map(|path| [("tenant", "b"), ("path", path.as_str())])
        .collect();
    let usages: Vec<Usage<'_>> = ids.iter().map(|id| (&id[..], 1, 0, 0)).collect();
    let mut streams = Vec::new();
    for _ in 0..40 {
        let mut envoy = Envoy::open(&server).await.unwrap();
        envoy.report("edge", &usages).await;
        streams.push(envoy);
    }
    assert_eq!(metric(&server, "floodgate_rlqs_buckets").await, 400.0);
    let charged = metric(&server, "floodgate_rlqs_bucket_bytes").await;
    // 400 subscriptions at 1 KiB each, and the 10 ids once: about 0.45 MB.
    assert!(charged < 600_000.0, "{charged} bytes charged");
    assert!(
        charged > 400.0 * 1024.0 + 10.0 * 4096.0,
        "{charged} bytes charged"
    );
    server.stop().await;
}

/// One peer holds at most its share of `--rlqs-max-buckets` (here 20 × 5 / 10 = 10),
/// the subscriptions of its ended streams included while their rows linger: opening,
/// subscribing and ending streams cannot fill the replica's bound, and another peer still
/// subscribes.
#[tokio::test]
async fn one_peer_cannot_fill_the_subscription_bound_with_ended_streams() {
    let (server, _dir) = start(&[
        "--rlqs-max-buckets",
        "20",
        "--rlqs-max-streams",
        "10",
        "--rlqs-max-streams-per-peer",
        "5",
    ]);
    // Each bucket matches a limit (a share row, which lingers after its stream).
    let paths: Vec<String> = (0..11).map(|i| format!("/p{i}")).collect();
    let entries: Vec<[(&str, &str); 2]> = paths
        .iter()
        .map(|path| [("tenant", "b"), ("path", path.as_str())])
        .collect();
    let usages: Vec<Usage<'_>> = entries.iter().map(|e| (&e[..], 1, 0, 0)).collect();
    // Ten subscriptions, then the stream ends: its rows (and places) linger.
    let mut first = Envoy::open(&server).await.unwrap();
    first.report("edge", &usages[..10]).await;
    drop(first);
    // The same peer's next stream is refused its eleventh subscription.
    let mut second = Envoy::open(&server).await.unwrap();
    let status = second.refused(reports("edge", &usages[10..])).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("its share of --rlqs-max-buckets"),
        "{status:?}"
    );
    // Another peer address (loopback is a /8) still subscribes.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .local_address(Some("127.0.0.2".parse().unwrap()));
    let mut client = RateLimitQuotaServiceClient::new(endpoint.connect().await.unwrap());
    let mut other = Envoy::open_on(&mut client).await.unwrap();
    let response = other.report("edge", &usages[10..]).await;
    assert_eq!(response.bucket_action.len(), 1);
    server.stop().await;
}
