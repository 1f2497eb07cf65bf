use super::*;

/// The mapping file Envoy Gateway mounts at `/etc/statsd-exporter/conf.yaml` (its
/// `statsd_conf.yaml`: the reference's default mapping without the timer's `scale`).
pub(crate) const ENVOY_GATEWAY: &str =
    include_str!("../../../../tests/data/envoy-gateway-statsd-conf.yaml");

fn series(mapped: Mapped) -> MappedSeries {
    match mapped {
        Mapped::Series(series) => series,
        Mapped::Dropped => panic!("dropped"),
    }
}

fn named(mapper: &Mapper, stat: &str, kind: StatKind) -> (String, Vec<(String, String)>) {
    let s = series(mapper.map(stat, kind));
    (s.name, s.labels)
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Envoy Gateway's file: glob rules with `$n` labels, the unanchored regex rules for deeper
/// paths, `match_metric_type`, `timer_type: histogram` with the default buckets and no scale,
/// and unmatched stats under their escaped names.
#[test]
fn envoy_gateway_file() {
    let mapper = Mapper::parse(ENVOY_GATEWAY).unwrap();
    let counter = StatKind::Counter;
    assert_eq!(
        named(
            &mapper,
            "ratelimit.service.rate_limit.d.k_v.over_limit",
            counter
        ),
        (
            "ratelimit_service_rate_limit_over_limit".into(),
            labels(&[("domain", "d"), ("key1", "k_v")])
        )
    );
    assert_eq!(
        named(
            &mapper,
            "ratelimit.service.rate_limit.d.a.b.c.total_hits",
            counter
        ),
        (
            "ratelimit_service_rate_limit_total_hits".into(),
            labels(&[("domain", "d"), ("key1", "a"), ("key2", "b")])
        )
    );
    // Unanchored: a two-key local-cache counter lands in over_limit.
    assert_eq!(
        named(
            &mapper,
            "ratelimit.service.rate_limit.d.a.b.over_limit_with_local_cache",
            counter
        )
        .0,
        "ratelimit_service_rate_limit_over_limit"
    );
    assert_eq!(
        named(
            &mapper,
            "ratelimit_server.ShouldRateLimit.total_requests",
            counter
        ),
        (
            "ratelimit_service_total_requests".into(),
            labels(&[("grpc_method", "ShouldRateLimit")])
        )
    );
    // match_metric_type: counter only.
    assert_eq!(
        named(
            &mapper,
            "ratelimit.service.config_load_success",
            StatKind::Gauge
        ),
        ("ratelimit_service_config_load_success".into(), vec![])
    );
    assert_eq!(
        named(&mapper, "ratelimit.service.config_load_error", counter),
        ("ratelimit_service_config_load_error".into(), vec![])
    );
    let timer = series(mapper.map(
        "ratelimit_server.ShouldRateLimit.response_time",
        StatKind::Observer,
    ));
    assert_eq!(timer.name, "ratelimit_service_response_time_seconds");
    assert_eq!(
        timer.observer,
        Observer::Histogram(DEFAULT_BUCKETS.to_vec())
    );
    assert_eq!(timer.scale, None);
    // An unmapped observer: the default, a summary.
    assert_eq!(
        series(mapper.map("some.timer", StatKind::Observer)).observer,
        Observer::Summary
    );
}

/// Globs: the first matching one in file order wins, even over a more literal one; with
/// `glob_disable_ordering` a literal component beats `*`, leftmost first. Globs are tried
/// before regexes wherever the regex sits in the file; `*` is one whole component.
#[test]
fn glob_precedence() {
    let file = |ordering: &str| {
        format!(
            r#"
defaults: {{glob_disable_ordering: {ordering}}}
mappings:
  - match: 'a\.(.*)'
    match_type: regex
    name: regex_$1
  - match: a.*.*
    name: first
  - match: a.b.*
    name: second
  - match: a.*.c
    name: third
"#
        )
    };
    let ordered = Mapper::parse(&file("false")).unwrap();
    assert_eq!(named(&ordered, "a.b.c", StatKind::Counter).0, "first");
    let unordered = Mapper::parse(&file("true")).unwrap();
    assert_eq!(named(&unordered, "a.b.c", StatKind::Counter).0, "second");
    assert_eq!(named(&unordered, "a.x.c", StatKind::Counter).0, "third");
    assert_eq!(named(&unordered, "a.x.y", StatKind::Counter).0, "first");
    // No glob has four components: the regex, its capture escaped.
    assert_eq!(
        named(&ordered, "a.b.c.d", StatKind::Counter).0,
        "regex_b_c_d"
    );
}

/// Regex mappings are tried in file order, unanchored, with numbered and named captures
/// (`$n`, `${n}`; `$name` in label values, as the exporter's name check allows no named
/// capture) and `match_metric_type` filters.
#[test]
fn regex_order_and_captures() {
    let mapper = Mapper::parse(
        r#"
mappings:
  - match: 'x\.(\w+)'
    match_type: regex
    match_metric_type: gauge
    name: gauge_${1}
  - match: 'x\.(?P<what>\w+)\.(\w+)'
    match_type: regex
    name: "by_$1"
    labels: {what: "$what", second: "${2}s", whole: "$0", missing: "$1x"}
  - match: 'x\.(\w+)'
    match_type: regex
    name: later_$1
"#,
    )
    .unwrap();
    assert_eq!(
        named(&mapper, "pre.x.one.two", StatKind::Counter),
        (
            "by_one".into(),
            labels(&[
                ("missing", ""),
                ("second", "twos"),
                ("what", "one"),
                ("whole", "x.one.two")
            ])
        )
    );
    assert_eq!(named(&mapper, "x.one", StatKind::Gauge).0, "gauge_one");
    assert_eq!(named(&mapper, "x.one", StatKind::Counter).0, "later_one");
}

/// Glob templates as statsd_exporter formats them: `$n` and `${n}`; a run of
/// `[a-zA-Z0-9_$]` that is not a capture number (`$1x`, `$1_$2`, `$3` of two) is nothing; a
/// bare `$` stays.
#[test]
fn glob_templates() {
    let captures = ["a", "b"];
    assert_eq!(glob_expand("p_${1}_${2}x", &captures), "p_a_bx");
    assert_eq!(glob_expand("p_$1_$2", &captures), "p_");
    assert_eq!(glob_expand("${1}x-$2", &captures), "ax-b");
    assert_eq!(glob_expand("$1x.$3.$0", &captures), "..");
    assert_eq!(glob_expand("cost $ ${}", &captures), "cost $ ${}");
}

/// `defaults`: regex as the default match type, a histogram default observer with its
/// buckets, which a mapping's own buckets replace; `timer_type` is read where
/// `observer_type` is absent; `scale` and `help` carried; `action: drop` and an empty
/// expanded name drop the stat.
#[test]
fn defaults_and_actions() {
    let mapper = Mapper::parse(
        r#"
defaults:
  match_type: regex
  observer_type: histogram
  histogram_options: {buckets: [1, 2]}
mappings:
  - match: '^t\.a$'
    name: a
  - match: '^t\.b$'
    name: b
    buckets: [5, 10]
    scale: 0.001
    help: "B time."
  - match: '^t\.c$'
    name: c
    timer_type: summary
  - match: '^t\.d$'
    name: d
    action: drop
  - match: '^t\.(e)?x$'
    name: ${1}
"#,
    )
    .unwrap();
    let a = series(mapper.map("t.a", StatKind::Observer));
    assert_eq!(a.observer, Observer::Histogram(vec![1.0, 2.0]));
    let b = series(mapper.map("t.b", StatKind::Observer));
    assert_eq!(b.observer, Observer::Histogram(vec![5.0, 10.0]));
    assert_eq!((b.scale, b.help.as_deref()), (Some(0.001), Some("B time.")));
    assert_eq!(
        series(mapper.map("t.c", StatKind::Observer)).observer,
        Observer::Summary
    );
    assert_eq!(mapper.map("t.d", StatKind::Counter), Mapped::Dropped);
    assert_eq!(mapper.map("t.x", StatKind::Counter), Mapped::Dropped);
    // Unmatched: the default observer, with the default buckets.
    assert_eq!(
        series(mapper.map("t.z", StatKind::Observer)).observer,
        Observer::Histogram(vec![1.0, 2.0])
    );
}

/// Unknown fields are ignored, scalar label values read as text and keys without a value
/// read as empty, as the exporter's decoder does; an empty file maps nothing.
#[test]
fn lenient_where_the_exporter_is() {
    let mapper = Mapper::parse(
        "unknown_top: 1\nmappings:\n  - match: a.*\n    name: a\n    ttl: 1m\n    \
         honor_labels: true\n    future_field: {x: 1}\n    labels: {version: 2, on: true}\n",
    )
    .unwrap();
    assert_eq!(
        named(&mapper, "a.b", StatKind::Counter),
        ("a".into(), labels(&[("on", "true"), ("version", "2")]))
    );
    let bare =
        Mapper::parse("defaults:\nmappings:\n  - match: b.*\n    name: b\n    labels:\n").unwrap();
    assert_eq!(named(&bare, "b.c", StatKind::Counter), ("b".into(), vec![]));
    assert!(Mapper::parse("# comments only\n").is_ok());
    assert!(Mapper::parse("mappings:\n").is_ok());
    let empty = Mapper::parse("").unwrap();
    assert_eq!(named(&empty, "9a.b-c--d", StatKind::Counter).0, "_9a_b_c_d");
}

/// A file the exporter would refuse is an error naming the mapping and the problem.
#[test]
fn bad_files_are_named() {
    let cases = [
        (
            "mappings: [{match: 'a.(', match_type: regex, name: a}]",
            "invalid regex",
        ),
        ("mappings: [{match: 'a..b', name: a}]", "invalid glob match"),
        ("mappings: [{match: 'a.b*', name: a}]", "invalid glob match"),
        (
            "mappings: [{match: 'a.b--c', name: a}]",
            "invalid glob match",
        ),
        ("mappings: [{match: 'a-.b', name: a}]", "invalid glob match"),
        ("mappings: [{match: a.b}]", "sets no metric name"),
        (
            "mappings: [{match: a.b, name: 'a-b'}]",
            "is not a metric name",
        ),
        (
            "mappings: [{match: a.b, name: a, labels: {x: y}}]",
            "invalid label key",
        ),
        (
            "mappings: [{match: a.b, name: a, match_type: fuzzy}]",
            "invalid match type",
        ),
        (
            "mappings: [{match: a.b, name: a, observer_type: gauge}]",
            "invalid observer",
        ),
        (
            "mappings: [{match: a.b, name: a, action: keep}]",
            "invalid action",
        ),
        (
            "mappings: [{match: a.b, name: a, match_metric_type: x}]",
            "match_metric_type",
        ),
        (
            "mappings: [{match: a.b, name: a, observer_type: histogram, buckets: [2, 1]}]",
            "increasing",
        ),
        (
            "mappings: [{match: a.b, name: a, observer_type: histogram, \
             summary_options: {max_age: 1m}}]",
            "cannot have summary_options",
        ),
        ("mappings: [{match: a.b, name: a, scale: -1}]", "scale"),
        (
            "mappings: [{match: a.b, name: a, observer_type: histogram, labels: {le: x}}]",
            "label le",
        ),
    ];
    for (text, expected) in cases {
        let error = Mapper::parse(text).unwrap_err();
        assert!(error.contains(expected), "{text}: {error}");
        assert!(error.starts_with("mappings[0]"), "{text}: {error}");
    }
    // A `-` between two other characters is fine, in the first component or a later one.
    assert!(Mapper::parse("mappings: [{match: a-b.1-c.*, name: a}]").is_ok());
    // `le` is only the buckets' own label on a histogram: a counter may carry one.
    assert!(
        Mapper::parse(
            "mappings: [{match: a.b, name: a, match_metric_type: counter, \
             observer_type: histogram, labels: {le: x}}]"
        )
        .is_ok()
    );
    assert!(Mapper::parse("mappings: {a: 1}").is_err());
    assert!(Mapper::parse("defaults: {match_type: x}").is_err());
    let missing = Mapper::load(Path::new("/nonexistent/conf.yaml")).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/conf.yaml"),
        "{missing}"
    );
}
