use super::*;

fn labels(s: &Series) -> Vec<(&str, &str)> {
    s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Each stat lands in the series the reference's `default_mapper.yaml` gives it.
#[test]
fn maps_like_the_default_mapper() {
    let s = series("ratelimit.service.rate_limit.d.k_v.over_limit");
    assert_eq!(s.name, "ratelimit_service_rate_limit_over_limit");
    assert_eq!(labels(&s), [("domain", "d"), ("key1", "k_v")]);
    let s = series("ratelimit.service.rate_limit.d.a_1.b_2.c_3.total_hits");
    assert_eq!(s.name, "ratelimit_service_rate_limit_total_hits");
    assert_eq!(
        labels(&s),
        [("domain", "d"), ("key1", "a_1"), ("key2", "b_2")]
    );
    // The unanchored regex: a two-key path's local-cache counter joins over_limit.
    let s = series("ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache");
    assert_eq!(s.name, "ratelimit_service_rate_limit_over_limit");
    // A one-key path's is unmapped: escaped.
    let s = series("ratelimit.service.rate_limit.d.a.over_limit_with_local_cache");
    assert_eq!(
        s.name,
        "ratelimit_service_rate_limit_d_a_over_limit_with_local_cache"
    );
    assert!(s.labels.is_empty());
    let s = series("ratelimit.service.call.should_rate_limit.redis_error");
    assert_eq!(s.name, "ratelimit_service_should_rate_limit_error");
    assert_eq!(labels(&s), [("err_type", "redis_error")]);
    let s = series("ratelimit_server.ShouldRateLimit.total_requests");
    assert_eq!(s.name, "ratelimit_service_total_requests");
    assert_eq!(labels(&s), [("grpc_method", "ShouldRateLimit")]);
    assert_eq!(
        series("ratelimit.service.config_load_success").name,
        "ratelimit_service_config_load_success"
    );
    assert_eq!(
        series("ratelimit.service.rate_limit.nope.domain_not_found").name,
        "ratelimit_service_rate_limit_nope_domain_not_found"
    );
    assert_eq!(escape_name("9a.b-c--d"), "_9a_b_c_d");
}

/// The exposition: totals (not deltas), summed per series, and the response-time
/// histogram in seconds or milliseconds.
#[test]
fn exposition_has_totals_and_the_histogram() {
    let stats = Stats::new(
        None,
        prometheus_client::metrics::counter::Counter::default(),
    );
    for rule in ["d.a_1.b_1.c_1", "d.a_1.b_1.c_2"] {
        let counters = stats.rule(&rule.into()).unwrap();
        counters.over_limit.fetch_add(2, Ordering::Relaxed);
    }
    stats.record_call(std::time::Duration::from_millis(3));
    let text = stats.encode_prometheus(false);
    assert!(text.contains("# TYPE ratelimit_service_rate_limit_over_limit counter\n"));
    assert!(text.contains(
        "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"a_1\",key2=\"b_1\"} 4\n"
    ));
    assert!(text.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1\n"));
    let bucket = "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\"";
    assert!(
        text.contains(&format!("{bucket},le=\"0.005\"}} 1\n")),
        "{text}"
    );
    assert!(!text.contains("total_hits"));
    let text = stats.encode_prometheus(true);
    assert!(
        text.contains(&format!("{bucket},le=\"2.5\"}} 0\n")),
        "{text}"
    );
    assert!(text.contains(&format!("{bucket},le=\"5\"}} 1\n")), "{text}");
}
