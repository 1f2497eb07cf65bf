//! The store behaviour suite: ShouldRateLimit semantics over real gRPC, written once and run
//! against every store (`memory::*`, `redis::*` on a real redis-server started per test, and
//! `sentinel::*` on a master found through a real sentinel, with its replica, and `cluster::*`
//! on a real 3-master Redis Cluster, each started per test), all driven by the same manual
//! clock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use floodgate::proto::envoy::r#type::v3::RateLimitUnit;
use floodgate::proto::rls::rate_limit_response::{Code, DescriptorStatus, rate_limit::Unit};
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use std::time::{Duration, Instant};
use support::*;
use tonic::Code as GrpcCode;

const LIMITS: &str = r#"
domain: test
descriptors:
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 7, burst: 3}
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: burst
    rate_limit: {unit: minute, requests_per_unit: 60, burst: 5}
  - key: user
    descriptors:
      - key: path
        value: "/api/admin"
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: path
        value: "/api/*"
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: multi
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 3, name: daily}
  - key: plan
    value: basic
    rate_limit: {unit: minute, requests_per_unit: 1, name: basic}
  - key: plan
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: premium
      replaces: [{name: basic}]
  - key: shared
    value: "a*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn only(response: &RateLimitResponse) -> &DescriptorStatus {
    assert_eq!(response.statuses.len(), 1, "{response:?}");
    &response.statuses[0]
}

fn remaining(response: &RateLimitResponse) -> u32 {
    only(response).limit_remaining
}

fn reset_seconds(status: &DescriptorStatus) -> i64 {
    status.duration_until_reset.as_ref().unwrap().seconds
}

async fn tb(server: &TestServer) -> RateLimitResponse {
    server.ask(simple("test", "tb", "x")).await
}

/// One status per descriptor, in request order: limited, unmatched (bare OK), unlimited.
async fn statuses_follow_request_order(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let response = server
        .ask(request(
            "test",
            vec![
                descriptor(&[("tb", "x")]),
                descriptor(&[("nothing", "here")]),
                descriptor(&[("free", "x")]),
            ],
        ))
        .await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses.len(), 3);
    let limited = &response.statuses[0];
    assert_eq!(limited.code, OK);
    let limit = limited.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (7, Unit::Minute as i32)
    );
    assert_eq!(limited.limit_remaining, 2);
    // One token of 7 per minute: 8.57 s, rounded up.
    assert_eq!(reset_seconds(limited), 9);
    assert_eq!(
        response.statuses[1],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );
    let unlimited = &response.statuses[2];
    assert_eq!(unlimited.code, OK);
    assert_eq!(unlimited.limit_remaining, u32::MAX);
    assert!(unlimited.current_limit.is_none());
    server.stop().await;
}

/// An unknown domain answers a bare OK per descriptor and touches no bucket.
async fn unknown_domain_is_bare_ok(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let response = server.ask(simple("nope", "tb", "x")).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(
        *only(&response),
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );
    assert_eq!(server.bucket_count().await, 0);
    server.stop().await;
}

/// A token bucket admits its burst at once, denies the next, and refills continuously.
async fn token_bucket_burst_deny_refill(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    for expected in [2, 1, 0] {
        let response = tb(&server).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(remaining(&response), expected);
    }
    let denied = tb(&server).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(only(&denied).code, OVER);
    assert_eq!(remaining(&denied), 0);
    // 7 per minute: one token every 8.571429 s (rounded up to the µs).
    server.clock.advance(8_571_428);
    assert_eq!(tb(&server).await.overall_code, OVER);
    server.clock.advance(1);
    let refilled = tb(&server).await;
    assert_eq!(refilled.overall_code, OK);
    assert_eq!(remaining(&refilled), 0);
    server.stop().await;
}

/// `burst` sets the token bucket's capacity independently of its rate.
async fn burst_sets_capacity(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let expected = vec![OK, OK, OK, OK, OK, OVER];
    // The bucket's key, first written with one token taken, expires one real second later.
    let value = until_answered_in_time("the burst", &expected, |value| {
        let server = &server;
        let runs = expected.len();
        async move {
            let mut codes = Vec::new();
            for _ in 0..runs {
                codes.push(
                    server
                        .ask(simple("test", "burst", &value))
                        .await
                        .overall_code,
                );
            }
            codes
        }
    })
    .await;
    // 60 per minute: one token per second.
    server.advance_ms(1000);
    assert_eq!(
        server
            .ask(simple("test", "burst", &value))
            .await
            .overall_code,
        OK
    );
    server.stop().await;
}

/// Fixed windows count per aligned window and reset at the boundary, like the reference.
async fn fixed_window_counts_per_window(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    server.advance_ms(500);
    let first = server.ask(simple("test", "fw", "x")).await;
    assert_eq!(remaining(&first), 1);
    // 59.5 s left in the window, rounded up.
    assert_eq!(reset_seconds(only(&first)), 60);
    assert_eq!(server.ask(simple("test", "fw", "x")).await.overall_code, OK);
    assert_eq!(
        server.ask(simple("test", "fw", "x")).await.overall_code,
        OVER
    );
    server.advance_ms(59_500);
    let next_window = server.ask(simple("test", "fw", "x")).await;
    assert_eq!(next_window.overall_code, OK);
    assert_eq!(remaining(&next_window), 1);
    server.stop().await;
}

/// The sliding window carries the previous window's weight into the next one.
async fn sliding_window_weighs_previous_window(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    assert_eq!(server.ask(simple("test", "sw", "x")).await.overall_code, OK);
    assert_eq!(server.ask(simple("test", "sw", "x")).await.overall_code, OK);
    assert_eq!(
        server.ask(simple("test", "sw", "x")).await.overall_code,
        OVER
    );
    // Just into the next window the previous two still weigh ~2: denied.
    server.advance_ms(60_000 + 1_000);
    assert_eq!(
        server.ask(simple("test", "sw", "x")).await.overall_code,
        OVER
    );
    // Halfway through, they weigh 1: one more fits.
    server.advance_ms(29_000);
    assert_eq!(server.ask(simple("test", "sw", "x")).await.overall_code, OK);
    assert_eq!(
        server.ask(simple("test", "sw", "x")).await.overall_code,
        OVER
    );
    server.stop().await;
}

/// A denied request debits nothing: the bucket that would have admitted is left untouched.
async fn denied_request_debits_nothing(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    server.ask(simple("test", "fw", "x")).await;
    server.ask(simple("test", "fw", "x")).await;
    let both = server
        .ask(request(
            "test",
            vec![descriptor(&[("tb", "x")]), descriptor(&[("fw", "x")])],
        ))
        .await;
    assert_eq!(both.overall_code, OVER);
    assert_eq!(both.statuses[0].code, OK);
    assert_eq!(
        both.statuses[0].limit_remaining, 3,
        "tb must not be debited"
    );
    assert_eq!(both.statuses[1].code, OVER);
    assert_eq!(remaining(&tb(&server).await), 2);
    server.stop().await;
}

/// The same bucket reached by two descriptors is debited once with the summed cost.
async fn same_bucket_twice_is_debited_once_with_summed_cost(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let twice = || {
        request(
            "test",
            vec![descriptor(&[("tb", "x")]), descriptor(&[("tb", "x")])],
        )
    };
    let first = server.ask(twice()).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(first.statuses[0].limit_remaining, 1);
    assert_eq!(first.statuses[1].limit_remaining, 1);
    let second = server.ask(twice()).await;
    assert_eq!(second.overall_code, OVER);
    assert_eq!(second.statuses[0].limit_remaining, 1, "nothing debited");
    server.stop().await;
}

/// A cost above the capacity never passes and debits nothing.
async fn cost_above_capacity_never_passes(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let mut big = simple("test", "tb", "x");
    big.hits_addend = 4;
    let response = server.ask(big).await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(remaining(&response), 3);
    assert_eq!(remaining(&tb(&server).await), 2);
    server.stop().await;
}

/// hits_addend: request-level 0 means 1, N debits N; a present descriptor-level value wins,
/// present-and-zero only checks, and is_negative_hits refunds.
async fn hits_addend_rules(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let mut two = simple("test", "tb", "x");
    two.hits_addend = 2;
    assert_eq!(remaining(&server.ask(two).await), 1);

    let check = request("test", vec![with_hits(descriptor(&[("tb", "x")]), 0)]);
    let checked = server.ask(check.clone()).await;
    assert_eq!((checked.overall_code, remaining(&checked)), (OK, 1));
    assert_eq!(
        remaining(&server.ask(check).await),
        1,
        "a check debits nothing"
    );

    // Descriptor-level 1 overrides request-level 3.
    let mut overridden = request("test", vec![with_hits(descriptor(&[("tb", "x")]), 1)]);
    overridden.hits_addend = 3;
    assert_eq!(remaining(&server.ask(overridden).await), 0);

    let mut refund = with_hits(descriptor(&[("tb", "x")]), 2);
    refund.is_negative_hits = true;
    let refunded = server.ask(request("test", vec![refund])).await;
    assert_eq!((refunded.overall_code, remaining(&refunded)), (OK, 2));
    server.stop().await;
}

/// A descriptor `limit` override replaces the configured limit (in a known domain only); one
/// whose unit is none is ignored and counted, and the configured limit applies.
async fn limit_override_replaces_configured_limit(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let overridden = || {
        request(
            "test",
            vec![with_override(
                descriptor(&[("tb", "x")]),
                1,
                RateLimitUnit::Minute as i32,
            )],
        )
    };
    let first = server.ask(overridden()).await;
    let limit = only(&first).current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Minute as i32)
    );
    assert_eq!(first.overall_code, OK);
    assert_eq!(server.ask(overridden()).await.overall_code, OVER);

    // The override's bucket is its own: the configured limit is untouched.
    assert_eq!(remaining(&tb(&server).await), 2);
    // Overrides apply even where no rule matches, as in the reference.
    let unmatched = request(
        "test",
        vec![with_override(
            descriptor(&[("nothing", "x")]),
            5,
            RateLimitUnit::Hour as i32,
        )],
    );
    assert_eq!(remaining(&server.ask(unmatched).await), 4);

    let unknown_domain = request(
        "nope",
        vec![with_override(
            descriptor(&[("tb", "x")]),
            5,
            RateLimitUnit::Hour as i32,
        )],
    );
    assert!(
        only(&server.ask(unknown_domain).await)
            .current_limit
            .is_none()
    );

    let bad_unit = request(
        "test",
        vec![with_override(descriptor(&[("tb", "x")]), 5, 0)],
    );
    // An override without a unit is ignored, not refused (Envoy would fail the request
    // open): the configured limit (7 a minute, burst 3) still counts it.
    let ignored = server.ask(bad_unit).await;
    assert_eq!(
        only(&ignored)
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(7)
    );
    assert_eq!(remaining(&ignored), 1);
    assert_eq!(server.metric("floodgate_ignored_overrides_total"), 1);
    server.stop().await;
}

/// `unlimited` answers OK with 4294967295 remaining and never touches the store.
async fn unlimited_never_touches_the_store(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    for _ in 0..10 {
        let response = server.ask(simple("test", "free", "x")).await;
        assert_eq!(remaining(&response), u32::MAX);
    }
    assert_eq!(server.bucket_count().await, 0);
    server.stop().await;
}

/// A shadow-mode rule is evaluated (remaining drops) but never denies.
async fn shadow_rule_never_denies(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    for _ in 0..3 {
        let response = server.ask(simple("test", "shadow", "x")).await;
        assert_eq!(response.overall_code, OK);
        assert_eq!(remaining(&response), 0);
    }
    server.stop().await;
}

/// Global shadow mode answers every request OK, limit overrides included, while each
/// descriptor over its limit still says OVER_LIMIT (as the reference does).
async fn global_shadow_mode_never_denies(backend: Backend) {
    let mut options = options();
    options.shadow_mode = true;
    let server = TestServer::with(LIMITS)
        .on(backend)
        .options(options)
        .start()
        .await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        let response = tb(&server).await;
        assert_eq!(response.overall_code, OK);
        codes.push(only(&response).code);
    }
    assert_eq!(codes, [OK, OK, OK, OVER, OVER]);
    let overridden = || {
        request(
            "test",
            vec![with_override(
                descriptor(&[("tb", "x")]),
                1,
                RateLimitUnit::Minute as i32,
            )],
        )
    };
    for _ in 0..3 {
        assert_eq!(server.ask(overridden()).await.overall_code, OK);
    }
    server.stop().await;
}

/// A matched limit named in another matched limit's `replaces` is dropped (the scenario the
/// reference's environment runs too, `tests/reference_env.rs`).
async fn replaced_limit_is_dropped(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    support::scenarios::replaced_limit_is_dropped(&mut &server, "test", 3).await;
    server.stop().await;
}

/// Several limits on one descriptor all apply; the status reports the one that binds.
async fn several_limits_on_one_descriptor(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let multi = || simple("test", "multi", "x");
    let first = server.ask(multi()).await;
    // Per minute: 1 left; per day: 2 left → the per-minute limit is the tighter one.
    assert_eq!(
        only(&first).current_limit.as_ref().unwrap().unit,
        Unit::Minute as i32
    );
    assert_eq!(remaining(&first), 1);
    assert_eq!(server.ask(multi()).await.overall_code, OK);
    let per_minute = server.ask(multi()).await;
    assert_eq!(per_minute.overall_code, OVER);
    assert_eq!(
        only(&per_minute).current_limit.as_ref().unwrap().unit,
        Unit::Minute as i32
    );
    server.advance_ms(30_000);
    assert_eq!(server.ask(multi()).await.overall_code, OK);
    server.advance_ms(30_000);
    let daily = server.ask(multi()).await;
    assert_eq!(daily.overall_code, OVER);
    let limit = only(&daily).current_limit.clone().unwrap();
    assert_eq!(
        (limit.unit, limit.name.as_str()),
        (Unit::Day as i32, "daily")
    );
    server.stop().await;
}

/// Matching precedence per level: exact value, then wildcard, then bare key.
async fn exact_then_wildcard_then_bare_key(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let rpu = |response: RateLimitResponse| {
        only(&response)
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
    };
    let ask = |path: &'static str| {
        server.ask(request(
            "test",
            vec![descriptor(&[("user", "u"), ("path", path)])],
        ))
    };
    assert_eq!(rpu(ask("/api/admin").await), 1);
    assert_eq!(rpu(ask("/api/users").await), 2);
    assert_eq!(rpu(ask("/other").await), 5);
    // Depth must match: a descriptor stopping at `user` has no limit.
    let shallow = server.ask(simple("test", "user", "u")).await;
    assert!(only(&shallow).current_limit.is_none());
    server.stop().await;
}

/// With share_threshold, every value matching the wildcard shares one bucket.
async fn share_threshold_shares_one_bucket(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    assert_eq!(
        server
            .ask(simple("test", "shared", "abc"))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        server
            .ask(simple("test", "shared", "axy"))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        server.ask(simple("test", "shared", "a")).await.overall_code,
        OVER
    );
    server.stop().await;
}

/// Wildcard values without share_threshold get a bucket per distinct value.
async fn wildcard_without_share_threshold_is_per_value(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let ask = |path: &'static str| {
        server.ask(request(
            "test",
            vec![descriptor(&[("user", "u"), ("path", path)])],
        ))
    };
    for _ in 0..2 {
        assert_eq!(ask("/api/a").await.overall_code, OK);
    }
    assert_eq!(ask("/api/a").await.overall_code, OVER);
    assert_eq!(ask("/api/b").await.overall_code, OK);
    server.stop().await;
}

/// Raw, non-UTF-8 descriptor bytes are answered, not rejected.
async fn non_utf8_values_are_accepted(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let mut d = descriptor(&[("user", ""), ("path", "")]);
    d.entries[0].value = vec![0xff, 0xfe, b'{'].into();
    d.entries[1].value = vec![0xc3, 0x28].into();
    let response = server.ask(request("test", vec![d])).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(
        only(&response)
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    server.stop().await;
}

/// A descriptor without entries is answered OK with no limit, as the reference does; the
/// request's other descriptors are answered as usual.
async fn empty_descriptor_is_ok_without_limit(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let response = server
        .ask(request(
            "test",
            vec![descriptor(&[]), descriptor(&[("tb", "x")])],
        ))
        .await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(
        response.statuses[0],
        DescriptorStatus {
            code: OK,
            ..Default::default()
        }
    );
    assert!(response.statuses[1].current_limit.is_some());
    server.stop().await;
}

/// Malformed requests get INVALID_ARGUMENT with a precise message, and debit nothing.
async fn malformed_requests_are_invalid_argument(backend: Backend) {
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let cases: Vec<(RateLimitRequest, &str)> = vec![
        (simple("", "tb", "x"), "rate limit domain must not be empty"),
        (
            request("test", vec![]),
            "rate limit descriptor list must not be empty",
        ),
        (
            request(
                "test",
                (0..65).map(|_| descriptor(&[("tb", "x")])).collect(),
            ),
            "request has 65 descriptors; at most 64 are allowed (--max-descriptors)",
        ),
        (
            simple(&"d".repeat(4097), "tb", "x"),
            "rate limit domain is 4097 bytes long; at most 4096 are allowed (--max-value-bytes)",
        ),
    ];
    for (request, message) in cases {
        let status = server.ask_err(request).await;
        assert_eq!(status.code(), GrpcCode::InvalidArgument);
        assert_eq!(status.message(), message);
    }
    assert_eq!(server.bucket_count().await, 0);
    server.stop().await;
}

/// A descriptor value longer than `--max-value-bytes` (a client's header) is still limited:
/// matched in full (a wildcard rule finds it), counted in a bucket of its own known by a
/// digest, and counted in `floodgate_oversized_values_total`; no metric path holds its bytes.
async fn oversized_values_are_limited(backend: Backend) {
    const LONG: &str = r#"
domain: long
descriptors:
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;
    let server = TestServer::with(LONG).on(backend).start().await;
    let key = "k".repeat(5_000);
    let codes = async |value: &str, n: usize| {
        let mut codes = Vec::new();
        for _ in 0..n {
            codes.push(
                server
                    .ask(simple("long", "api_key", value))
                    .await
                    .overall_code,
            );
        }
        codes
    };
    assert_eq!(codes(&key, 3).await, [OK, OK, OVER]);
    // Another long value is another client: a bucket of its own.
    assert_eq!(codes(&"j".repeat(5_000), 1).await, [OK]);
    let path = format!("/api/{}", "p".repeat(5_000));
    let first = server.ask(simple("long", "path", &path)).await;
    assert_eq!(first.overall_code, OK);
    assert!(
        first.statuses[0].current_limit.is_some(),
        "the wildcard rule matched"
    );
    assert_eq!(
        server.ask(simple("long", "path", &path)).await.overall_code,
        OVER
    );
    assert_eq!(server.metric("floodgate_oversized_values_total"), 6);
    assert_eq!(server.bucket_count().await, 3);
    let exposition = server.metrics.encode();
    assert!(
        exposition.contains("long.api_key_#"),
        "the detailed path names the digest"
    );
    assert!(
        !exposition.contains(&"k".repeat(64)),
        "a metric holds the long value"
    );
    server.stop().await;
}

/// Health reports SERVING for the server, the rate-limit service and the reference's name.
async fn health_reports_serving(backend: Backend) {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let server = TestServer::with(LIMITS).on(backend).start().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    // "ratelimit": the name the reference server registers.
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }
    server.stop().await;
}

const QUOTA_LIMITS: &str = support::limits::QUOTA;

fn quota_options() -> floodgate::plan::PlanOptions {
    floodgate::plan::PlanOptions {
        dynamic_metadata: true,
        ..options()
    }
}

/// An over quota-mode descriptor reports OVER_LIMIT while another quota-mode descriptor still
/// has room, and the request is OK (the reference's current answer); it is not debited.
async fn quota_mode_over_alone_does_not_deny(backend: Backend) {
    let server = TestServer::with(QUOTA_LIMITS)
        .on(backend)
        .options(quota_options())
        .start()
        .await;
    let both = || {
        request(
            "q",
            vec![descriptor(&[("soft", "a")]), descriptor(&[("soft", "b")])],
        )
    };
    server.ask(simple("q", "soft", "a")).await;
    let response = server.ask(both()).await;
    assert_eq!(response.overall_code, OK);
    let over = &response.statuses[0];
    assert_eq!((over.code, over.limit_remaining), (OVER, 0));
    assert!(over.current_limit.is_some());
    assert_eq!(response.statuses[1].code, OK);
    // Now both are over: every quota-mode descriptor is over, so the request is denied,
    // both report OVER_LIMIT, and nothing was debited (b had exactly one left).
    let response = server.ask(both()).await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(
        (response.statuses[0].code, response.statuses[1].code),
        (OVER, OVER)
    );
    server.stop().await;
}

/// Every quota-mode descriptor over denies the request, and the non-quota bucket that the
/// store had already debited is refunded: a denied request debits nothing.
async fn quota_mode_all_over_denies_and_debits_nothing(backend: Backend) {
    let server = TestServer::with(QUOTA_LIMITS)
        .on(backend)
        .options(quota_options())
        .start()
        .await;
    server.ask(simple("q", "soft", "a")).await;
    let mixed = || {
        request(
            "q",
            vec![descriptor(&[("soft", "a")]), descriptor(&[("hard", "h")])],
        )
    };
    let denied = server.ask(mixed()).await;
    assert_eq!(denied.overall_code, OVER);
    assert_eq!(
        (denied.statuses[0].code, denied.statuses[1].code),
        (OVER, OK)
    );
    // `hard` still has both of its hits: the denied request's debit was undone.
    assert_eq!(remaining(&server.ask(simple("q", "hard", "h")).await), 1);
    server.stop().await;
}

/// A non-quota limit that denies still denies, and the quota-mode bucket is not debited.
async fn quota_mode_non_quota_limit_still_denies(backend: Backend) {
    let server = TestServer::with(QUOTA_LIMITS)
        .on(backend)
        .options(quota_options())
        .start()
        .await;
    let hard = with_hits(descriptor(&[("hard", "h")]), 3);
    let response = server
        .ask(request("q", vec![descriptor(&[("soft", "c")]), hard]))
        .await;
    assert_eq!(response.overall_code, OVER);
    assert_eq!(response.statuses[0].code, OK);
    // `soft` c was not debited: its one request is still there.
    assert_eq!(remaining(&server.ask(simple("q", "soft", "c")).await), 0);
    assert_eq!(
        server.ask(simple("q", "soft", "c")).await.statuses[0].code,
        OVER
    );
    server.stop().await;
}

/// The token-quota pattern as Envoy runs it (check with hits_addend 0, charge on stream done):
/// with `overdraft: true` charges go into debt and checks deny until refill repays it.
async fn token_quota_pattern(backend: Backend) {
    let server = TestServer::with(QUOTA_LIMITS).on(backend).start().await;
    let ask = |key: &'static str, hits| {
        let request = request("q", vec![with_hits(descriptor(&[(key, "t")]), hits)]);
        let server = &server;
        async move { server.ask(request).await }
    };
    // Overdraft (100 tokens a minute: one every 600 ms).
    let check = ask("metered", 0).await;
    assert_eq!((check.overall_code, remaining(&check)), (OK, 100));
    assert_eq!(ask("metered", 60).await.overall_code, OK);
    assert_eq!(ask("metered", 0).await.overall_code, OK);
    // The response used 70 tokens, 40 were left: charged anyway (the answer says over,
    // which Envoy ignores on stream done); the bucket is 30 tokens in debt.
    let charge = ask("metered", 70).await;
    assert_eq!((charge.overall_code, remaining(&charge)), (OVER, 0));
    let check = ask("metered", 0).await;
    assert_eq!((check.overall_code, remaining(&check)), (OVER, 0));
    // The debt is repaid at the configured rate: 30 tokens × 600 ms = 18 s.
    server.advance_ms(17_999);
    assert_eq!(ask("metered", 0).await.overall_code, OVER);
    server.advance_ms(1);
    assert_eq!(ask("metered", 0).await.overall_code, OK);
    server.advance_ms(600);
    assert_eq!(remaining(&ask("metered", 0).await), 1);
    server.stop().await;
}

/// Without `overdraft` in the limit (Envoy Gateway's rate-limit config cannot carry it), an
/// explicit descriptor `hits_addend` is a charge that applies whether it fits or not, while
/// the same cost as implicit hits (request-level `hits_addend`) stays all or nothing.
async fn explicit_charge_always_applies(backend: Backend) {
    let server = TestServer::with(QUOTA_LIMITS).on(backend).start().await;
    let ask = |value: &'static str, hits| {
        let request = request("q", vec![with_hits(descriptor(&[("tokens", value)]), hits)]);
        let server = &server;
        async move { server.ask(request).await }
    };
    // Implicit hits: 70 do not fit in the 40 left, so nothing is debited.
    assert_eq!(ask("implicit", 60).await.overall_code, OK);
    let mut implicit = simple("q", "tokens", "implicit");
    implicit.hits_addend = 70;
    assert_eq!(server.ask(implicit).await.overall_code, OVER);
    let check = ask("implicit", 0).await;
    assert_eq!((check.overall_code, remaining(&check)), (OK, 40));

    // An explicit charge of 70 with 40 left: applied anyway (the bucket is 30 tokens in
    // debt), so every check is refused until refill repays it (30 × 600 ms = 18 s).
    assert_eq!(ask("charged", 60).await.overall_code, OK);
    let charge = ask("charged", 70).await;
    assert_eq!((charge.overall_code, remaining(&charge)), (OVER, 0));
    let check = ask("charged", 0).await;
    assert_eq!((check.overall_code, remaining(&check)), (OVER, 0));
    server.advance_ms(17_999);
    assert_eq!(ask("charged", 0).await.overall_code, OVER);
    server.advance_ms(1);
    assert_eq!(ask("charged", 0).await.overall_code, OK);

    // A charge never blocks the store's commit of the request's other buckets; one that
    // does not fit answers the request OVER_LIMIT, so its implicit debit (`hard`, 2 a minute)
    // is given back while the charge is kept.
    let both = request(
        "q",
        vec![
            with_hits(descriptor(&[("tokens", "charged")]), 50),
            descriptor(&[("hard", "h")]),
        ],
    );
    let answer = server.ask(both).await;
    assert_eq!(answer.overall_code, OVER);
    assert_eq!(
        (answer.statuses[0].code, answer.statuses[1].code),
        (OVER, OK)
    );
    assert_eq!(remaining(&server.ask(simple("q", "hard", "h")).await), 1);
    server.advance_ms(18_000);
    assert_eq!(
        ask("charged", 0).await.overall_code,
        OVER,
        "the charge was kept"
    );
    server.stop().await;
}

/// Envoy Gateway's usage-based limit in reference mode (fixed windows, the reference's
/// counters): 100 tokens a minute, each request a `hits_addend: 0` check then a
/// `hits_addend: 37` charge; exactly 3 checks pass (37, 74, 111 > 100), as the reference
/// answers, then every check of the window is refused.
async fn usage_limit_in_reference_mode(backend: Backend) {
    const LIMITS: &str = r#"
domain: envoy-gateway
descriptors:
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
"#;
    let options = floodgate::plan::PlanOptions {
        default_algorithm: floodgate::limiter::Algorithm::FixedWindow,
        reference_counters: Some(floodgate::plan::ReferenceCounters {
            prefix: std::sync::Arc::from(&b"rl_"[..]),
            expiry_jitter_max_secs: 0,
        }),
        ..options()
    };
    let server = TestServer::with(LIMITS)
        .on(backend)
        .options(options)
        .start()
        .await;
    let ask = |hits| {
        let request = request(
            "envoy-gateway",
            vec![with_hits(descriptor(&[("tokens", "client")]), hits)],
        );
        let server = &server;
        async move { server.ask(request).await }
    };
    // Redis names a reference counter's window by the wall clock (the pod's, as the
    // reference does): keep the eight requests inside one minute.
    away_from_minute_edge().await;
    let mut admitted = Vec::new();
    for _ in 0..8 {
        let check = ask(0).await;
        admitted.push(check.overall_code == OK);
        if check.overall_code == OK {
            // Envoy ignores the answer to the charge it sends when the stream is done.
            ask(37).await;
        }
        server.advance_ms(1_000);
    }
    assert_eq!(
        admitted,
        [true, true, true, false, false, false, false, false],
        "the reference admits the first 3 of 8"
    );
    server.stop().await;
}

/// Waits (on the wall clock) until the current minute has more than 10 s left.
async fn away_from_minute_edge() {
    let second_of_minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            % 60
    };
    eventually_within(
        "a minute with 10 s left",
        Duration::from_secs(15),
        || async { second_of_minute() < 50 },
    )
    .await;
}

/// Limits at the extremes of every algorithm: the fastest (`requests_per_unit` u32::MAX per
/// second), the "practically unlimited" 10^9 per second, and the slowest (1 per year, 1 per
/// `year × 2`), with bursts and `unit_multiplier`.
const EXTREMES: &str = r#"
domain: extremes
descriptors:
  - key: fastest_tb
    rate_limit: {unit: second, requests_per_unit: 4294967295}
  - key: fastest_fw
    rate_limit: {unit: second, requests_per_unit: 4294967295, algorithm: fixed_window}
  - key: fastest_sw
    rate_limit: {unit: second, requests_per_unit: 4294967295, algorithm: sliding_window}
  - key: billion
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: fast_small_burst
    rate_limit: {unit: second, unit_multiplier: 7, requests_per_unit: 4294967295, burst: 5}
  - key: yearly_tb
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: yearly_fw
    rate_limit: {unit: year, requests_per_unit: 1, algorithm: fixed_window}
  - key: yearly_sw
    rate_limit: {unit: year, requests_per_unit: 1, algorithm: sliding_window}
  - key: two_years_tb
    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 1, burst: 2}
  - key: two_years_fw
    rate_limit:
      {unit: year, unit_multiplier: 2, requests_per_unit: 4294967295, algorithm: fixed_window}
  - key: two_years_sw
    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 3, algorithm: sliding_window}
"#;

/// The answer to `hits` on the single descriptor `key=value` of the `extremes` domain:
/// overall code and `limit_remaining`.
async fn extreme_on(server: &TestServer, key: &str, value: &str, hits: u64) -> (i32, u32) {
    // Implicit hits (all or nothing); 0 is a check, which only a descriptor can ask.
    let mut request = request("extremes", vec![descriptor(&[(key, value)])]);
    match hits {
        0 => request.descriptors[0].hits_addend = Some(0),
        hits => request.hits_addend = u32::try_from(hits).unwrap(),
    }
    let response = server.ask(request).await;
    (response.overall_code, remaining(&response))
}

async fn extreme(server: &TestServer, key: &str, hits: u64) -> (i32, u32) {
    extreme_on(server, key, "x", hits).await
}

/// One step of [`fastest_answers`]: µs the test clock moves first, descriptor key, hits.
type Step = (i64, &'static str, u64);

/// The fastest limits' steps and the answers they must get, in order: the whole limit at
/// once in every algorithm, then nothing; a µs later the token bucket has 10^9 / 232 831
/// (fs per token) = 4 294 tokens while the windows still deny; 10^9 per second refills
/// exactly 1 000 per µs; the fixed window's next second admits the whole limit again.
const FASTEST: [(Step, (i32, u32)); 15] = {
    const MAX: u64 = u32::MAX as u64;
    [
        ((0, "fastest_tb", MAX), (OK, 0)),
        ((0, "fastest_tb", 1), (OVER, 0)),
        ((0, "fastest_fw", MAX), (OK, 0)),
        ((0, "fastest_fw", 1), (OVER, 0)),
        ((0, "fastest_sw", MAX), (OK, 0)),
        ((0, "fastest_sw", 1), (OVER, 0)),
        ((1, "fastest_tb", 4_295), (OVER, 4_294)),
        ((0, "fastest_tb", 4_294), (OK, 0)),
        ((0, "fastest_fw", 1), (OVER, 0)),
        ((0, "fastest_sw", 1), (OVER, 0)),
        ((0, "billion", 1_000_000_000), (OK, 0)),
        ((1, "billion", 0), (OK, 1_000)),
        ((0, "billion", 1_001), (OVER, 1_000)),
        ((0, "billion", 1_000), (OK, 0)),
        ((1_000_000, "fastest_fw", MAX), (OK, 0)),
    ]
};

/// Runs [`FASTEST`] with descriptor value `value`; returns the answers and the real time the
/// run took.
async fn fastest_answers(server: &TestServer, value: &str) -> Vec<(i32, u32)> {
    let mut answers = Vec::new();
    for ((advance, key, hits), _) in FASTEST {
        server.clock.advance(advance);
        answers.push(extreme_on(server, key, value, hits).await);
    }
    answers
}

/// Runs `run` on fresh descriptor values (`x0`, `x1`, …) until it answers `expected`, and
/// returns the value of that run. The test clock is manual but Redis expires keys in real
/// time (a bucket's key one real second after it was emptied), so a run slower than that (a
/// stalled machine) that answered otherwise is run again; one that answered as expected
/// passes however long it took (an expiry only ever refills a bucket, which would show), and
/// one that answered otherwise within 900 ms fails.
async fn until_answered_in_time<T, F, Fut>(what: &str, expected: &T, mut run: F) -> String
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    for attempt in 0..20 {
        let value = format!("x{attempt}");
        let started = Instant::now();
        let answers = run(value.clone()).await;
        if answers == *expected {
            return value;
        }
        if started.elapsed() < Duration::from_millis(900) {
            assert_eq!(answers, *expected);
        }
    }
    panic!("every run of {what} took over 900 ms");
}

/// Every `requests_per_unit` up to u32::MAX with every unit loads and counts exactly under
/// every algorithm: u32::MAX hits per second pass at once and one more is over, the token
/// bucket refills at its rate to the fs ([`FASTEST`]); a burst of 5 at u32::MAX per 7 s;
/// 1 per year (and per two years) admits its burst and then waits a whole period per token.
async fn extreme_limits_every_algorithm(backend: Backend) {
    let server = TestServer::with(EXTREMES).on(backend).start().await;
    let expected: Vec<(i32, u32)> = FASTEST.iter().map(|(_, answer)| *answer).collect();
    // These buckets are full again (their keys expire) one real second after they were
    // emptied.
    until_answered_in_time("the fastest limits", &expected, |value| {
        let server = &server;
        async move { fastest_answers(server, &value).await }
    })
    .await;

    // Emptied at once, the fastest buckets report one second until full (the configured
    // rate's, not the rounded ticks'); a descriptor `limit` override of u32::MAX per minute
    // one minute.
    for key in ["fastest_tb", "billion"] {
        let hits = if key == "billion" {
            1_000_000_000
        } else {
            u64::from(u32::MAX)
        };
        let mut request = request("extremes", vec![descriptor(&[(key, "r")])]);
        request.hits_addend = u32::try_from(hits).unwrap();
        let emptied = server.ask(request).await;
        assert_eq!(
            (emptied.overall_code, remaining(&emptied)),
            (OK, 0),
            "{key}"
        );
        assert_eq!(reset_seconds(only(&emptied)), 1, "{key}");
    }
    let overridden = with_override(
        descriptor(&[("yearly_tb", "o")]),
        u32::MAX,
        RateLimitUnit::Minute as i32,
    );
    let mut overridden = request("extremes", vec![overridden]);
    overridden.hits_addend = u32::MAX;
    let response = server.ask(overridden).await;
    assert_eq!((response.overall_code, remaining(&response)), (OK, 0));
    assert_eq!(reset_seconds(only(&response)), 60);

    // u32::MAX per 7 s with a burst of 5: 5 at once, never 6, and a µs refills the burst.
    assert_eq!(extreme(&server, "fast_small_burst", 5).await, (OK, 0));
    assert_eq!(extreme(&server, "fast_small_burst", 6).await.0, OVER);
    server.clock.advance(1);
    assert_eq!(extreme(&server, "fast_small_burst", 0).await, (OK, 5));

    // Slowest: one a year, in every algorithm; the token bucket is full again in a year.
    for key in ["yearly_tb", "yearly_fw", "yearly_sw"] {
        assert_eq!(extreme(&server, key, 1).await, (OK, 0), "{key}");
        assert_eq!(extreme(&server, key, 1).await.0, OVER, "{key}");
    }
    let yearly = server.ask(simple("extremes", "yearly_tb", "x")).await;
    assert_eq!(reset_seconds(only(&yearly)), 31_536_000);

    // Two years: a burst of 2, a fixed window of u32::MAX, a sliding window of 3.
    let max = u64::from(u32::MAX);
    assert_eq!(extreme(&server, "two_years_tb", 2).await, (OK, 0));
    let third = server.ask(simple("extremes", "two_years_tb", "x")).await;
    assert_eq!(third.overall_code, OVER);
    // Stated as 1 per year (the longest unit), its reset is when that one token is back,
    // two years, not when the burst of two is full again.
    assert_eq!(reset_seconds(only(&third)), 63_072_000);
    assert_eq!(extreme(&server, "two_years_fw", max).await, (OK, 0));
    assert_eq!(extreme(&server, "two_years_fw", 1).await.0, OVER);
    assert_eq!(extreme(&server, "two_years_sw", 3).await, (OK, 0));
    assert_eq!(extreme(&server, "two_years_sw", 1).await.0, OVER);
    // Two years later one token is back, and only one.
    server.clock.advance(63_072_000 * 1_000_000 - 1);
    assert_eq!(extreme(&server, "two_years_tb", 1).await.0, OVER);
    server.clock.advance(1);
    assert_eq!(extreme(&server, "two_years_tb", 1).await, (OK, 0));
    assert_eq!(extreme(&server, "two_years_tb", 1).await.0, OVER);
    server.stop().await;
}

/// Instantiates every scenario above once per store.
macro_rules! behaviour_suite {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on the memory store.")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Memory).await
                }
            )*
        }
        mod redis {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on a real redis-server.")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Redis).await
                }
            )*
        }
        mod sentinel {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on a master found through a real sentinel.")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Sentinel).await
                }
            )*
        }
        mod cluster {
            $(
                #[doc = concat!("`", stringify!($scenario), "` on a real Redis Cluster (3 masters).")]
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Cluster).await
                }
            )*
        }
    };
}

behaviour_suite!(
    statuses_follow_request_order,
    unknown_domain_is_bare_ok,
    token_bucket_burst_deny_refill,
    burst_sets_capacity,
    fixed_window_counts_per_window,
    sliding_window_weighs_previous_window,
    denied_request_debits_nothing,
    same_bucket_twice_is_debited_once_with_summed_cost,
    cost_above_capacity_never_passes,
    hits_addend_rules,
    limit_override_replaces_configured_limit,
    unlimited_never_touches_the_store,
    shadow_rule_never_denies,
    global_shadow_mode_never_denies,
    replaced_limit_is_dropped,
    several_limits_on_one_descriptor,
    exact_then_wildcard_then_bare_key,
    share_threshold_shares_one_bucket,
    wildcard_without_share_threshold_is_per_value,
    non_utf8_values_are_accepted,
    malformed_requests_are_invalid_argument,
    oversized_values_are_limited,
    empty_descriptor_is_ok_without_limit,
    health_reports_serving,
    quota_mode_over_alone_does_not_deny,
    quota_mode_all_over_denies_and_debits_nothing,
    quota_mode_non_quota_limit_still_denies,
    token_quota_pattern,
    explicit_charge_always_applies,
    usage_limit_in_reference_mode,
    extreme_limits_every_algorithm,
);
