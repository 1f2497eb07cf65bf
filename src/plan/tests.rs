use super::build::LINEAR_OPS;
use super::respond::{near_limit_hits, reported_reset_us};
use super::*;
use crate::bucket::BucketResult;
use crate::config::Defaults;
use crate::limiter::View;
use crate::proto::common::{RateLimitDescriptor, rate_limit_descriptor::Entry};

const LIMITS: &str = r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: b
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, name: b}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: b}]}
  - key: u
    rate_limit: {unlimited: true}
"#;

fn config() -> Config {
    Config::from_sources(
        &[("t.yaml".to_string(), LIMITS.to_string())],
        &Defaults {
            algorithm: Algorithm::TokenBucket,
            ..Defaults::default()
        },
    )
    .unwrap()
}

fn options() -> PlanOptions {
    PlanOptions::default()
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned().into(),
            value: value.to_owned().into(),
        }],
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
}

fn answer(plan: &Plan<'_>, admitted: bool, remaining: u64, reset_us: u64) -> Applied {
    Applied {
        committed: admitted,
        from_local_cache: false,
        delay_us: 0,
        buckets: plan
            .ops
            .iter()
            .map(|_| BucketResult {
                admitted,
                view: View {
                    remaining,
                    reset_us,
                },
                retry_after_us: if admitted { Some(0) } else { Some(1) },
                window: None,
                at_us: None,
            })
            .collect(),
    }
}

/// A domain with `redis_hash_tag: true` tags every key, configured and override alike;
/// another domain's keys stay untagged, byte for byte.
#[test]
fn hash_tagged_domain_tags_every_key() {
    let tagged = "domain: t\nredis_hash_tag: true\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
    let config = Config::from_sources(
        &[
            ("t.yaml".to_string(), tagged.to_string()),
            ("d.yaml".to_string(), LIMITS.to_string()),
        ],
        &Defaults {
            algorithm: Algorithm::TokenBucket,
            ..Defaults::default()
        },
    )
    .unwrap();
    let mut overridden = descriptor("z", "y");
    overridden.limit = Some(
        crate::proto::common::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 4,
            unit: 2,
        },
    );
    let mut req = request(vec![descriptor("a", "x"), overridden]);
    req.domain = "t".into();
    let plan = Plan::build(&req, &config, &options()).unwrap();
    let keys: Vec<&[u8]> = plan.ops.iter().map(|op| op.key.as_bytes()).collect();
    assert_eq!(keys, [&b"{t}:a=x|tb1"[..], b"{t}:z=y|tb60o4"]);
    let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options()).unwrap();
    assert_eq!(plan.ops[0].key.as_bytes(), b"d:a=x|tb1");
}

/// With reference counters on, exactly the fixed windows the reference could express get
/// its counter name (a `share_threshold` entry by its pattern, an override like the
/// configured limit): not token buckets, not a rule with two limits, not a
/// `unit_multiplier`, not a hash-tagged domain; off, none does.
#[test]
fn reference_counters_only_where_the_reference_counts() {
    const SHARED: &str = r#"
domain: r
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: fixed_window}
      - {unit: day, requests_per_unit: 9, algorithm: fixed_window}
  - key: multi
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: fixed_window}
"#;
    const TAGGED: &str = "domain: t\nredis_hash_tag: true\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}\n";
    let config = Config::from_sources(
        &[
            ("r.yaml".to_string(), SHARED.to_string()),
            ("t.yaml".to_string(), TAGGED.to_string()),
        ],
        &Defaults {
            algorithm: Algorithm::TokenBucket,
            ..Defaults::default()
        },
    )
    .unwrap();
    let on = PlanOptions {
        default_algorithm: Algorithm::FixedWindow,
        reference_counters: Some(ReferenceCounters {
            prefix: Arc::from(&b"rl_"[..]),
            expiry_jitter_max_secs: 0,
        }),
        ..options()
    };
    let mut overridden = descriptor("ip", "9");
    overridden.limit = Some(
        crate::proto::common::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: 2,
        },
    );
    let mut req = request(vec![
        descriptor("ip", "1.2.3.4"),
        descriptor("path", "/api/x"),
        descriptor("tb", "x"),
        descriptor("two", "x"),
        descriptor("multi", "x"),
        overridden,
    ]);
    req.domain = "r".into();
    let names = |options: &PlanOptions, req: &RateLimitRequest| -> Vec<Option<Vec<u8>>> {
        Plan::build(req, &config, options)
            .unwrap()
            .ops
            .iter()
            .map(|op| op.reference.as_ref().map(|r| r.base.as_bytes().to_vec()))
            .collect()
    };
    assert_eq!(
        names(&on, &req),
        [
            Some(b"rl_r_ip_1.2.3.4_".to_vec()),
            Some(b"rl_r_path_/api/*_".to_vec()),
            None,
            None,
            None,
            None,
            Some(b"rl_r_ip_9_".to_vec()),
        ]
    );
    assert!(names(&options(), &req).iter().all(Option::is_none));
    let mut tagged = request(vec![descriptor("a", "x")]);
    tagged.domain = "t".into();
    assert_eq!(names(&on, &tagged), [None]);
}

/// Two descriptors reaching one bucket make one op with the summed cost.
#[test]
fn same_bucket_is_one_op_with_summed_cost() {
    let config = config();
    let mut req = request(vec![descriptor("a", "x"), descriptor("a", "x")]);
    req.hits_addend = 2;
    let plan = Plan::build(&req, &config, &options()).unwrap();
    assert_eq!(plan.ops.len(), 1);
    assert_eq!(plan.ops[0].cost, 4);
    assert!(plan.ops[0].enforce);
}

/// Past the linear scan's reach, repeated buckets still fold into one op each.
#[test]
fn repeated_buckets_fold_beyond_the_linear_scan() {
    // More distinct buckets than the linear scan covers, each reached twice.
    let n = LINEAR_OPS + 8;
    let values: Vec<String> = (0..n).chain(0..n).map(|i| i.to_string()).collect();
    let config = config();
    let req = request(values.iter().map(|v| descriptor("a", v)).collect());
    let plan = Plan::build(&req, &config, &options()).unwrap();
    assert_eq!(plan.ops.len(), n);
    assert!(plan.ops.iter().all(|op| op.cost == 2));
    let keys: std::collections::HashSet<_> = plan.ops.iter().map(|op| &op.key).collect();
    assert_eq!(keys.len(), n);
}

/// Different values of a bare key are different buckets.
#[test]
fn distinct_values_are_distinct_buckets() {
    let config = config();
    let req = request(vec![descriptor("a", "x"), descriptor("a", "y")]);
    assert_eq!(Plan::build(&req, &config, &options()).unwrap().ops.len(), 2);
}

/// A present descriptor hits_addend wins; zero checks; negative hits refund.
#[test]
fn descriptor_hits_addend_and_negative_hits() {
    let config = config();
    let mut check = descriptor("a", "x");
    check.hits_addend = Some(0);
    let mut refund = descriptor("a", "y");
    refund.hits_addend = Some(7);
    refund.is_negative_hits = true;
    let mut req = request(vec![check, refund]);
    req.hits_addend = 5;
    let plan = Plan::build(&req, &config, &options()).unwrap();
    assert_eq!(plan.ops.iter().map(|o| o.cost).collect::<Vec<_>>(), [0, -7]);
}

/// Only an explicit descriptor hits_addend above 0 is a charge, debited with overdraft (and
/// never shaped): checks, refunds and implicit hits stay all or nothing; a bucket a charge
/// reaches is charged whole.
#[test]
fn explicit_hits_addend_is_a_charge() {
    let config = config();
    let with_hits = |value, hits, negative| RateLimitDescriptor {
        hits_addend: hits,
        is_negative_hits: negative,
        ..descriptor("a", value)
    };
    let mut req = request(vec![
        with_hits("charge", Some(37), false),
        with_hits("check", Some(0), false),
        with_hits("refund", Some(2), true),
        with_hits("implicit", None, false),
        with_hits("both", None, false),
        with_hits("both", Some(1), false),
    ]);
    req.hits_addend = 3;
    let plan = Plan::build(&req, &config, &options()).unwrap();
    let ops: Vec<_> = plan
        .ops
        .iter()
        .map(|o| (o.cost, o.params.overdraft))
        .collect();
    assert_eq!(
        ops,
        [(37, true), (0, false), (-2, false), (3, false), (4, true)]
    );
}

/// Shadow rules and global shadow mode produce non-enforcing ops.
#[test]
fn shadow_ops_do_not_enforce() {
    let config = config();
    let plan = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
    assert!(!plan.ops[0].enforce);
    let mut shadow = options();
    shadow.shadow_mode = true;
    let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &shadow).unwrap();
    assert!(!plan.ops[0].enforce);
}

/// `replaces` drops the named limit only when the replacing limit also matched.
#[test]
fn replaces_needs_both_matched() {
    let config = config();
    let alone = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
    assert_eq!(alone.ops.len(), 1);
    let both = Plan::build(
        &request(vec![descriptor("b", "x"), descriptor("c", "x")]),
        &config,
        &options(),
    )
    .unwrap();
    assert_eq!(both.ops.len(), 1);
    let outcome = both.respond(&answer(&both, true, 4, 12_000_000), &options());
    assert!(outcome.response.statuses[0].current_limit.is_none());
    assert!(outcome.response.statuses[1].current_limit.is_some());
}

/// Unlimited and unmatched descriptors need no store access.
#[test]
fn unlimited_and_unmatched_make_no_ops() {
    let config = config();
    let plan = Plan::build(
        &request(vec![descriptor("u", "x"), descriptor("zzz", "x")]),
        &config,
        &options(),
    )
    .unwrap();
    assert!(plan.ops.is_empty());
    let response = plan
        .respond(&answer(&plan, true, 0, 0), &options())
        .response;
    assert_eq!(response.overall_code, Code::Ok as i32);
    assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(response.statuses[1].limit_remaining, 0);
}

/// The response reports remaining and reset (rounded up to whole seconds).
#[test]
fn response_rounds_reset_up() {
    let config = config();
    let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options()).unwrap();
    let response = plan
        .respond(&answer(&plan, true, 2, 1), &options())
        .response;
    let status = &response.statuses[0];
    assert_eq!(status.limit_remaining, 2);
    assert_eq!(status.duration_until_reset.unwrap().seconds, 1);
    // 5 per minute: 12 s per token exactly, so the raw reset is reported, rounded up.
    let plan = Plan::build(&request(vec![descriptor("c", "x")]), &config, &options()).unwrap();
    let response = plan
        .respond(&answer(&plan, false, 0, 2_000_001), &options())
        .response;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    assert_eq!(
        response.statuses[0].duration_until_reset.unwrap().seconds,
        3
    );
}

/// A shadow limit that denies is reported OK, and tallied as shadow.
#[test]
fn shadow_denial_is_ok_and_tallied() {
    let config = config();
    let plan = Plan::build(&request(vec![descriptor("b", "x")]), &config, &options()).unwrap();
    let outcome = plan.respond(&answer(&plan, false, 0, 1), &options());
    assert_eq!(outcome.response.overall_code, Code::Ok as i32);
    assert_eq!(outcome.tallies[0].verdict, Verdict::ShadowOverLimit);
    assert_eq!(&**outcome.tallies[0].rule, "d.b");
}

/// The reported reset of a non-divisible token bucket rate uses the configured rate.
#[test]
fn token_bucket_reset_is_reported_at_configured_rate() {
    let params = LimitParams {
        algorithm: Algorithm::TokenBucket,
        requests_per_period: 3,
        period_us: 1_000_000,
        burst: 3,
        overdraft: false,
        max_wait_us: 0,
    };
    // Three tokens at 3_333_334 ticks of 0.1 µs each: 1_000_001 µs of debt (rounded up),
    // reported as 1 s.
    assert_eq!(reported_reset_us(&params, 1_000_001), 1_000_000);
    let exact = LimitParams {
        requests_per_period: 4,
        burst: 4,
        ..params
    };
    assert_eq!(reported_reset_us(&exact, 750_000), 750_000);
}

fn with_headers() -> PlanOptions {
    PlanOptions {
        headers: Some(HeaderOptions::default()),
        ..PlanOptions::default()
    }
}

fn header_pairs(response: &RateLimitResponse) -> Vec<(String, String)> {
    response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// When OK, headers come from the status with the fewest remaining; none when off.
#[test]
fn headers_follow_lowest_remaining() {
    let config = config();
    let req = request(vec![descriptor("a", "x"), descriptor("c", "x")]);
    let plan = Plan::build(&req, &config, &with_headers()).unwrap();
    let mut applied = answer(&plan, true, 2, 1_000_000);
    applied.buckets[1].view = View {
        remaining: 1,
        reset_us: 24_000_000,
    };
    let response = plan.respond(&applied, &with_headers()).response;
    assert_eq!(
        header_pairs(&response),
        pairs(&[
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "1"),
            ("RateLimit-Reset", "24"),
        ])
    );
    assert!(
        plan.respond(&applied, &options())
            .response
            .response_headers_to_add
            .is_empty()
    );
}

/// On OVER_LIMIT the denying status binds and Retry-After is its retry time, rounded up.
#[test]
fn over_limit_headers_carry_retry_after() {
    let config = config();
    let req = request(vec![descriptor("a", "x"), descriptor("c", "x")]);
    let plan = Plan::build(&req, &config, &with_headers()).unwrap();
    let mut applied = answer(&plan, true, 0, 1_000_000);
    applied.committed = false;
    applied.buckets[1] = BucketResult {
        admitted: false,
        view: View {
            remaining: 0,
            reset_us: 60_000_000,
        },
        retry_after_us: Some(11_000_001),
        window: None,
        at_us: None,
    };
    let response = plan.respond(&applied, &with_headers()).response;
    assert_eq!(
        header_pairs(&response),
        pairs(&[
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "60"),
            ("Retry-After", "12"),
        ])
    );
    // A cost that can never pass: Retry-After falls back to the reset.
    applied.buckets[1].retry_after_us = None;
    let response = plan.respond(&applied, &with_headers()).response;
    assert_eq!(response.response_headers_to_add[3].value, "60");
}

/// The IETF structured fields name the policy and carry quota, window, remaining, reset.
#[test]
fn ietf_headers_are_structured_fields() {
    let config = config();
    let mut options = with_headers();
    if let Some(h) = options.headers.as_mut() {
        h.ietf = true;
    }
    let plan = Plan::build(&request(vec![descriptor("a", "x")]), &config, &options).unwrap();
    let response = plan
        .respond(&answer(&plan, true, 2, 333_334), &options)
        .response;
    let headers = header_pairs(&response);
    assert_eq!(
        headers[3..],
        pairs(&[
            ("RateLimit-Policy", "\"default\";q=3;w=1"),
            ("RateLimit", "\"default\";r=2;t=1"),
        ])
    );
}

/// A burst above the rate and a multiplied unit are stated so that limit, remaining and
/// reset agree: 10/minute with burst 50 says 10 per minute with at most 10 remaining; 3 per
/// 5 minutes says 3 per hour (the shortest unit holding the period), in the status Envoy
/// reads and in floodgate's own headers alike.
#[test]
fn burst_and_multiplier_are_stated_consistently() {
    const STATED: &str = r#"
domain: s
descriptors:
  - key: burst
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 50, name: edge}
  - key: five
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: fixed_window}
"#;
    let config = Config::from_sources(
        &[("s.yaml".to_string(), STATED.to_string())],
        &Defaults::default(),
    )
    .unwrap();
    let mut options = with_headers();
    if let Some(h) = options.headers.as_mut() {
        h.ietf = true;
    }
    let mut req = request(vec![descriptor("burst", "x")]);
    req.domain = "s".into();
    let plan = Plan::build(&req, &config, &options).unwrap();
    // 49 tokens left, full again in 6 s: ten or more are there now.
    let response = plan
        .respond(&answer(&plan, true, 49, 6_000_000), &options)
        .response;
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (10, 2));
    assert_eq!(status.limit_remaining, 10);
    assert_eq!(status.duration_until_reset.unwrap().seconds, 0);
    assert_eq!(
        header_pairs(&response),
        pairs(&[
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "10"),
            ("RateLimit-Reset", "0"),
            ("RateLimit-Policy", "\"edge\";q=10;w=60"),
            ("RateLimit", "\"edge\";r=10;t=0"),
        ])
    );
    // 4 left: full in 276 s, but ten are back in 36 s.
    let response = plan
        .respond(&answer(&plan, true, 4, 276_000_000), &options)
        .response;
    assert_eq!(response.statuses[0].limit_remaining, 4);
    assert_eq!(
        response.statuses[0].duration_until_reset.unwrap().seconds,
        36
    );
    let mut req = request(vec![descriptor("five", "x")]);
    req.domain = "s".into();
    let plan = Plan::build(&req, &config, &options).unwrap();
    let response = plan
        .respond(&answer(&plan, true, 2, 135_000_000), &options)
        .response;
    let status = &response.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 3));
    assert_eq!(status.limit_remaining, 2);
    assert_eq!(status.duration_until_reset.unwrap().seconds, 135);
    assert_eq!(
        header_pairs(&response)[3..],
        pairs(&[
            ("RateLimit-Policy", "\"default\";q=3;w=3600"),
            ("RateLimit", "\"default\";r=2;t=135"),
        ])
    );
}

/// Near-limit hits follow the reference: only the part above ⌊capacity × ratio⌋ counts.
#[test]
fn near_limit_counts_hits_above_threshold() {
    let op = |cost| BucketOp {
        key: BucketKey::new("d", [], Algorithm::FixedWindow, 60_000_000),
        params: LimitParams {
            algorithm: Algorithm::FixedWindow,
            requests_per_period: 10,
            period_us: 60_000_000,
            burst: 10,
            overdraft: false,
            max_wait_us: 0,
        },
        cost,
        enforce: true,
        reference: None,
        debited_in: None,
        debited_at: None,
    };
    // Threshold 8: 7 → 10 has two hits above it; 8 → 9 has one; 5 → 8 none.
    assert_eq!(near_limit_hits(&op(3), 0, 3, 0.8), 2);
    assert_eq!(near_limit_hits(&op(1), 1, 1, 0.8), 1);
    assert_eq!(near_limit_hits(&op(3), 2, 3, 0.8), 0);
    assert_eq!(near_limit_hits(&op(0), 0, 0, 0.8), 0);
}

const MODES: &str = r#"
domain: q
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata: {name: service_1, nested: {a: 1}}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
    metadata: {name: service_2, other: x, nested: {a: 2, b: 3}}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

/// Plans `keys` (one descriptor each, domain `q`) and answers with each op admitted or
/// not: (overall code, each status's code, the outcome).
/// The outcome borrows the configuration's labels, so the configuration is leaked: a test's
/// few, small.
fn modes(
    keys: &[&str],
    admitted: &[bool],
    options: &PlanOptions,
) -> (i32, Vec<i32>, Outcome<'static>) {
    let config = Config::from_sources(
        &[("q.yaml".to_string(), MODES.to_string())],
        &Defaults {
            algorithm: Algorithm::FixedWindow,
            ..Defaults::default()
        },
    )
    .unwrap();
    let config: &'static Config = Box::leak(Box::new(config));
    let mut req = request(keys.iter().map(|k| descriptor(k, "v")).collect());
    req.domain = "q".into();
    let plan = Plan::build(&req, config, options).unwrap();
    let mut applied = answer(&plan, true, 1, 1);
    for (bucket, &ok) in applied.buckets.iter_mut().zip(admitted) {
        bucket.admitted = ok;
    }
    let outcome = plan.respond(&applied, options);
    let codes = outcome.response.statuses.iter().map(|s| s.code).collect();
    (outcome.response.overall_code, codes, outcome)
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Global shadow mode keeps each descriptor's OVER_LIMIT and answers the request OK
/// (the reference's TestServiceGlobalShadowMode).
#[test]
fn global_shadow_keeps_descriptor_codes() {
    let shadow = PlanOptions {
        shadow_mode: true,
        ..options()
    };
    let (overall, codes, outcome) = modes(&["regular", "zzz"], &[false], &shadow);
    assert_eq!((overall, codes), (OK, vec![OVER, OK]));
    assert!(outcome.shadowed);
    assert!(!modes(&["regular"], &[true], &shadow).2.shadowed);
    // Quota-mode descriptors all over, under global shadow: still OK
    // (TestServiceQuotaModeWithShadowMode).
    let (overall, codes, _) = modes(&["quota", "quota2"], &[false, false], &shadow);
    assert_eq!((overall, codes), (OK, vec![OVER, OVER]));
}

/// A shadow rule over its limit says OK and is tallied as shadow; another rule over its
/// limit still denies (TestMixedRuleShadowMode).
#[test]
fn mixed_rule_shadow_mode() {
    let (overall, codes, outcome) = modes(&["shadow", "regular"], &[false, false], &options());
    assert_eq!((overall, codes), (OVER, vec![OK, OVER]));
    assert_eq!(outcome.tallies[0].verdict, Verdict::ShadowOverLimit);
    assert_eq!(outcome.tallies[1].verdict, Verdict::OverLimit);
}

/// The reference's quota_mode answers: an over quota-mode descriptor says OVER_LIMIT;
/// the request is denied by any other descriptor over, or by every quota-mode one over.
#[test]
fn quota_mode_answers() {
    let o = options();
    // TestServicePerDescriptorQuotaMode: regular over, quota within.
    let (overall, codes, _) = modes(&["regular", "quota"], &[false, true], &o);
    assert_eq!((overall, codes), (OVER, vec![OVER, OK]));
    // TestServiceMixedPerDescriptorModes: the only quota descriptor over.
    let (overall, codes, _) = modes(&["regular", "quota"], &[true, false], &o);
    assert_eq!((overall, codes), (OVER, vec![OK, OVER]));
    // TestServiceMixedPerDescriptorModesUnderLimit.
    let (overall, codes, _) = modes(&["regular", "quota"], &[true, true], &o);
    assert_eq!((overall, codes), (OK, vec![OK, OK]));
    // TestServiceQuotaModeOnlyAllOverTheLimit.
    let (overall, codes, _) = modes(&["quota", "quota2"], &[false, false], &o);
    assert_eq!((overall, codes), (OVER, vec![OVER, OVER]));
    // TestServiceQuotaModeOnlySomeOverTheLimit: OK, the over one says so.
    let (overall, codes, _) = modes(&["quota", "quota2"], &[false, true], &o);
    assert_eq!((overall, codes), (OK, vec![OVER, OK]));
}

/// Global quota mode makes every descriptor a quota-mode one, unmatched ones included
/// (TestServiceGlobalQuotaMode).
#[test]
fn global_quota_mode() {
    let quota = PlanOptions {
        quota_mode: true,
        ..options()
    };
    let (overall, codes, _) = modes(&["regular", "shadow"], &[false, true], &quota);
    assert_eq!((overall, codes), (OK, vec![OVER, OK]));
    let (overall, _, _) = modes(&["regular", "quota"], &[false, false], &quota);
    assert_eq!(overall, OVER);
    // An unmatched descriptor is a quota-mode one that passed.
    let (overall, codes, _) = modes(&["regular", "zzz"], &[false], &quota);
    assert_eq!((overall, codes), (OK, vec![OVER, OK]));
}

/// A request denied by quota mode after the store committed is refunded whole; one
/// answered OK is not.
#[test]
fn quota_denial_refunds_everything() {
    let config = Config::from_sources(
        &[("q.yaml".to_string(), MODES.to_string())],
        &Defaults::default(),
    )
    .unwrap();
    let mut req = request(vec![descriptor("regular", "v"), descriptor("quota", "v")]);
    req.domain = "q".into();
    let plan = Plan::build(&req, &config, &options()).unwrap();
    let mut applied = answer(&plan, true, 1, 1);
    assert!(plan.refunds(&applied).is_empty());
    applied.buckets[1].admitted = false;
    let refunds = plan.refunds(&applied);
    assert_eq!(refunds.len(), 1);
    assert_eq!((refunds[0].0, refunds[0].1.cost), (0, -1));
}

/// Dynamic metadata merges the `metadata:` of the descriptors answered OK, the first
/// value of a key winning and mappings merged (TestMetadataReturnedForPassedDescriptors,
/// TestOverlappingMetadataReturnsTheFirstValue); an over descriptor adds none.
#[test]
fn metadata_of_admitted_descriptors() {
    let with = PlanOptions {
        dynamic_metadata: true,
        quota_mode: true,
        ..options()
    };
    let metadata = |outcome: &Outcome| {
        let fields = &outcome.response.dynamic_metadata.as_ref().unwrap().fields;
        fields.get("metadata").map(|v| format!("{v:?}"))
    };
    let (_, _, both) = modes(&["regular", "quota"], &[true, true], &with);
    let text = metadata(&both).unwrap();
    assert!(
        text.contains("service_1") && !text.contains("service_2"),
        "{text}"
    );
    assert!(
        text.contains("\"other\"") && text.contains("\"b\""),
        "{text}"
    );
    assert!(text.contains("NumberValue(1.0)") && !text.contains("NumberValue(2.0)"));
    let (_, _, first_over) = modes(&["regular", "quota"], &[false, true], &with);
    let text = metadata(&first_over).unwrap();
    assert!(
        text.contains("service_2") && !text.contains("service_1"),
        "{text}"
    );
    let (_, _, none) = modes(&["regular", "quota"], &[false, false], &with);
    assert_eq!(metadata(&none), None);
}

/// A descriptor without entries matches nothing: OK with no limit, no bucket.
#[test]
fn empty_descriptor_is_unmatched() {
    let config = config();
    let plan = Plan::build(
        &request(vec![RateLimitDescriptor::default()]),
        &config,
        &options(),
    )
    .unwrap();
    assert!(plan.ops.is_empty());
    let response = plan
        .respond(&answer(&plan, true, 0, 0), &options())
        .response;
    assert_eq!(response.statuses[0].code, OK);
    assert!(response.statuses[0].current_limit.is_none());
}

/// A key or value over `max_value_len` is matched in full and known by its digest from then
/// on: the bucket key, the reference counter's name and the metric path are short whatever
/// its length, two long values are two buckets, and the plan counts them.
#[test]
fn oversized_values_are_matched_in_full_and_known_by_digest() {
    const LONG: &str = r#"
domain: r
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;
    let config = Config::from_sources(
        &[("r.yaml".to_string(), LONG.to_string())],
        &Defaults::default(),
    )
    .unwrap();
    let options = PlanOptions {
        reference_counters: Some(ReferenceCounters {
            prefix: Arc::from(&b"rl_"[..]),
            expiry_jitter_max_secs: 0,
        }),
        limits: RequestLimits {
            max_value_len: 16,
            ..RequestLimits::default()
        },
        ..options()
    };
    let long_ip = "1".repeat(17);
    let mut req = request(vec![
        descriptor("ip", &long_ip),
        descriptor("ip", &"2".repeat(1000)),
        descriptor("path", &format!("/api/{}", "x".repeat(1000))),
        descriptor("ip", &"3".repeat(16)),
    ]);
    req.domain = "r".into();
    let plan = Plan::build(&req, &config, &options).unwrap();
    assert_eq!(plan.oversized_values(), 3);
    assert_eq!(
        plan.ops.len(),
        4,
        "every value its own bucket, the wildcard matched"
    );
    let digest = String::from_utf8(crate::bucket::value_digest(long_ip.as_bytes())).unwrap();
    let reference = plan.ops[0].reference.as_ref().unwrap().base.as_bytes();
    assert_eq!(reference, format!("rl_r_ip_{digest}_").as_bytes());
    assert!(plan.ops.iter().all(|op| op.key.as_bytes().len() < 100));
    assert_eq!(&*plan.limits_of(0)[0].rule, format!("r.ip_{digest}"));
    assert_eq!(
        &*plan.limits_of(3)[0].rule,
        format!("r.ip_{}", "3".repeat(16))
    );
}

/// A descriptor `limit` override whose unit is none (UNKNOWN) is ignored, counted, and the
/// descriptor is limited by its configured rule instead of the request being refused.
#[test]
fn override_without_a_unit_is_ignored() {
    let config = config();
    let mut unknown = descriptor("a", "x");
    unknown.limit = Some(
        crate::proto::common::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: 0,
        },
    );
    let plan = Plan::build(&request(vec![unknown]), &config, &options()).unwrap();
    assert_eq!(plan.ignored_overrides(), 1);
    let limits = plan.limits_of(0);
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].limit.map(|l| l.requests_per_unit), Some(3));
}
