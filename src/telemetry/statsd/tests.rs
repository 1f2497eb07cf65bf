use super::*;

/// `SanitizeStatName`: separators and IPv4 dots become `_`, other dots stay.
#[test]
fn sanitize_like_the_reference() {
    assert_eq!(sanitize("d.k_v"), "d.k_v");
    assert_eq!(sanitize("d.a:b|c"), "d.a_b_c");
    assert_eq!(
        sanitize("d.remote_address_10.0.0.1.path"),
        "d.remote_address_10_0_0_1.path"
    );
    assert_eq!(sanitize("d.x_1234.5.6.7"), "d.x_1234_5_6_7");
    assert_eq!(sanitize("d.x_1.2.3.4567"), "d.x_1_2_3_4567");
    assert_eq!(sanitize("d.1.2.3"), "d.1.2.3");
    // A request value cannot end the line and forge a stat.
    assert_eq!(sanitize("d.v_x:1|c\nforged:9|c"), "d.v_x_1_c_forged_9_c");
}

/// gostats' tag serialization and dogstatsd's, byte for byte.
#[test]
fn lines_in_both_dialects() {
    let tags = parse_tags("zone:eu.west,app:rl,empty:").unwrap();
    assert_eq!(
        tags,
        [
            ("app".into(), "rl".into()),
            ("zone".into(), "eu_west".into())
        ]
    );
    let mut out = Vec::new();
    format_line(&mut out, Flavor::Statsd, &tags, "a.b", 3, "c");
    format_line(&mut out, Flavor::Statsd, &[], "a.t", 12, "ms");
    format_line(&mut out, Flavor::DogStatsd, &tags, "a.b", 3, "c");
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "a.b.__app=rl.__zone=eu_west:3|c\na.t:12|ms\na.b:3|c|#app:rl,zone:eu_west\n"
    );
    assert!(parse_tags("novalue").is_err());
}

/// Counters go out as deltas, only those that moved; names are sanitized and capped.
#[test]
fn counters_flush_as_deltas() {
    let stats = Stats::new(
        Some(StatsdConfig {
            addr: "127.0.0.1:1".into(),
            protocol: Protocol::Tcp,
            flavor: Flavor::Statsd,
            flush_interval: Duration::from_secs(1),
            tags: Vec::new(),
        }),
        Counter::default(),
    );
    let rule: Arc<str> = "d.ip_1.2.3.4".into();
    let counters = stats.rule(&rule).unwrap();
    counters.total_hits.fetch_add(2, Ordering::Relaxed);
    stats.count(StatName::ConfigLoadSuccess, 1);
    stats.domain_not_found("nope", 2);
    let mut out = Vec::new();
    stats.drain_counters(&mut out);
    let text = String::from_utf8(out).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "ratelimit.service.config_load_success:1|c",
            "ratelimit.service.rate_limit.d.ip_1_2_3_4.total_hits:2|c",
            "ratelimit.service.rate_limit.nope.domain_not_found:2|c",
        ]
    );
    let mut again = Vec::new();
    stats.drain_counters(&mut again);
    assert!(again.is_empty());
}
