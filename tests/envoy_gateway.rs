//! Envoy Gateway's global rate limits through the real Envoy: the HTTP rate-limit filter, the
//! per-route `rate_limits` and the rate-limit service's config, each built here in the shape
//! Envoy Gateway's translator emits, with floodgate started as Envoy Gateway starts the
//! rate-limit deployment (`/bin/ratelimit`, no arguments, the reference's environment). Each
//! rule admits exactly its limit.
//!
//! The shapes follow envoyproxy/gateway at commit d32f28294245e454d20f81d323d626a90e660c1e
//! (no file of theirs is copied):
//! - the filter: `createRateLimitFilter` in internal/xds/translator/ratelimit.go, as in
//!   internal/xds/translator/testdata/out/xds-ir/ratelimit.listeners.yaml (prepended to the
//!   HCM's filters, the listener's name as `domain`, `disable_x_envoy_ratelimited_header`,
//!   `enable_x_ratelimit_headers: DRAFT_VERSION_03`, `timeout` and `failure_mode_deny` from
//!   the EnvoyGateway's `rateLimit.timeout` and `rateLimit.failClosed`), and its HCM and
//!   router options; one more instance for a shared rule's domain (`buildRateLimitFilter`, as
//!   in testdata/out/xds-ir/ratelimit-global-shared.listeners.yaml);
//! - the cluster: `ratelimit_cluster` in testdata/out/xds-ir/ratelimit.clusters.yaml (HTTP/2
//!   with its window sizes; without its TLS, which tests/envoy_tls.rs covers);
//! - the routes: `buildRouteRateLimits` and the `build*RateLimitActions` functions in
//!   ratelimit.go, as in testdata/out/xds-ir/ratelimit.routes.yaml (header exact and
//!   distinct, a rule without match), ratelimit-sourceip.routes.yaml (`remote_address_match`
//!   for a CIDR, exact and distinct) and ratelimit-headers-and-cidr.routes.yaml (several rules
//!   on one route), ratelimit-global-shared.routes.yaml (a shared rule): a
//!   `RateLimitPerRoute` under `typed_per_filter_config`, every rule's actions led by the
//!   route's (or the shared rule's) `generic_key`;
//! - the rate-limit service's config: `buildRateLimitServiceDescriptors`,
//!   `addRateLimitDescriptor` and `GetRateLimitServiceConfigStr` in ratelimit.go, as in
//!   testdata/out/ratelimit-config/{distinct-match,masked-remote-address-match,
//!   distinct-remote-address-match,multiple-rules,global-shared-distinct-match}.yaml (every field of the reference's YAML
//!   descriptor written, `rate_limit: null` on the inner nodes, upper-case units);
//! - the environment: internal/infrastructure/kubernetes/ratelimit/testdata/deployments/
//!   disable-prometheus.yaml. Envoy Gateway delivers the config over xDS (tests/xds.rs covers
//!   that stream); here the same config is a file of the `RUNTIME_ROOT` layout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use support::envoy::{Bootstrap, Envoy, validate};
use support::eventually_within;
use support::process::Floodgate;
use support::redis::RedisServer;

/// The Gateway listener's name: Envoy Gateway's rate-limit domain for unshared rules.
const DOMAIN: &str = "default/eg/http";

/// The route names Envoy Gateway gives an HTTPRoute's rules, which it also uses as each
/// route's descriptor key and value.
const HEADER_EXACT: &str = "httproute/default/header-exact/rule/0/match/0/*";
const HEADER_DISTINCT: &str = "httproute/default/header-distinct/rule/0/match/0/*";
const CIDR_EXACT: &str = "httproute/default/cidr-exact/rule/0/match/0/*";
const CIDR_DISTINCT: &str = "httproute/default/cidr-distinct/rule/0/match/0/*";
const NO_MATCH: &str = "httproute/default/no-match/rule/0/match/0/*";
const TWO_RULES: &str = "httproute/default/two-rules/rule/0/match/0/*";

/// A BackendTrafficPolicy's shared rule: its own domain (the policy's namespace and name),
/// its own filter instance, the rule's name as descriptor key and value on every route it
/// applies to.
const SHARED_DOMAIN: &str = "default/shared-policy";
const SHARED_RULE: &str = "default/shared-policy/rule/0";
const SHARED_FILTER: &str = "envoy.filters.http.ratelimit/default/shared-policy";

/// The client CIDR of the address rules: 127.0.0.0 to 127.0.0.3.
const CIDR: &str = "127.0.0.0/30";

/// The route's leading action: `generic_key` with the route's name as key and value.
fn route_key(route: &str) -> Value {
    json!({"generic_key": {"descriptor_key": route, "descriptor_value": route}})
}

/// `remote_address_match` for [`CIDR`], as `buildCIDRMatchRateLimitActions` writes it: the
/// CIDR as the value (one bucket for the range), or the client's address (`distinct`).
fn cidr_action(key: &str, value: &str) -> Value {
    json!({"remote_address_match": {
        "address_matcher": {"ranges": [{"address_prefix": "127.0.0.0", "prefix_len": 30}]},
        "descriptor_key": key,
        "descriptor_value": value
    }})
}

/// Every route of the HTTPRoutes under test: name, path, the filter instance and domain its
/// `rate_limits` are for.
fn routes() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Value,
)> {
    let shared = || {
        json!([{"actions": [
            route_key(SHARED_RULE),
            {"request_headers": {"descriptor_key": "rule-0-match-0", "header_name": "x-user-id"}}
        ]}])
    };
    let listener = "envoy.filters.http.ratelimit";
    vec![
        // headers: [{name: x-user-id, value: one}], 3 an hour.
        (
            HEADER_EXACT,
            "/header-exact",
            listener,
            DOMAIN,
            json!([{"actions": [
                route_key(HEADER_EXACT),
                {"header_value_match": {
                    "descriptor_key": "rule-0-match-0",
                    "descriptor_value": "rule-0-match-0",
                    "expect_match": true,
                    "headers": [{"name": "x-user-id", "string_match": {"exact": "one"}}]
                }}
            ]}]),
        ),
        // headers: [{name: x-user-id, type: Distinct}], 3 an hour for each value.
        (
            HEADER_DISTINCT,
            "/header-distinct",
            listener,
            DOMAIN,
            json!([{"actions": [
                route_key(HEADER_DISTINCT),
                {"request_headers": {"descriptor_key": "rule-0-match-0", "header_name": "x-user-id"}}
            ]}]),
        ),
        // sourceCIDR: {type: Exact, value: 127.0.0.0/30}, 3 an hour for the range.
        (
            CIDR_EXACT,
            "/cidr-exact",
            listener,
            DOMAIN,
            json!([{"actions": [
                route_key(CIDR_EXACT),
                cidr_action("masked_remote_address", CIDR)
            ]}]),
        ),
        // sourceCIDR: {type: Distinct, value: 127.0.0.0/30}, 2 an hour for each address.
        (
            CIDR_DISTINCT,
            "/cidr-distinct",
            listener,
            DOMAIN,
            json!([{"actions": [
                route_key(CIDR_DISTINCT),
                cidr_action("masked_remote_address", CIDR),
                cidr_action("remote_address", "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%")
            ]}]),
        ),
        // No clientSelectors: 3 an hour for every request.
        (
            NO_MATCH,
            "/no-match",
            listener,
            DOMAIN,
            json!([{"actions": [
                route_key(NO_MATCH),
                {"generic_key": {"descriptor_key": "rule-0-match--1", "descriptor_value": "rule-0-match--1"}}
            ]}]),
        ),
        // Two rules: 2 an hour for each x-tenant value, and 3 an hour for the route.
        (
            TWO_RULES,
            "/two-rules",
            listener,
            DOMAIN,
            json!([
                {"actions": [
                    route_key(TWO_RULES),
                    {"request_headers": {"descriptor_key": "rule-0-match-0", "header_name": "x-tenant"}}
                ]},
                {"actions": [
                    route_key(TWO_RULES),
                    {"generic_key": {"descriptor_key": "rule-1-match--1", "descriptor_value": "rule-1-match--1"}}
                ]}
            ]),
        ),
        // One shared rule, headers: [{name: x-user-id, type: Distinct}], 3 an hour for each
        // value across both routes.
        (
            "httproute/default/shared-a/rule/0/match/0/*",
            "/shared-a",
            SHARED_FILTER,
            SHARED_DOMAIN,
            shared(),
        ),
        (
            "httproute/default/shared-b/rule/0/match/0/*",
            "/shared-b",
            SHARED_FILTER,
            SHARED_DOMAIN,
            shared(),
        ),
    ]
}

/// One descriptor as `GetRateLimitServiceConfigStr` writes it: every field of the reference's
/// YAML descriptor, `rate_limit: null` on a node without a limit, the unit in upper case.
fn node(key: &str, value: &str, limit: Option<u32>, children: Vec<Value>) -> Value {
    let rate_limit = limit.map_or(Value::Null, |requests| {
        json!({"requests_per_unit": requests, "unit": "HOUR", "unlimited": false,
               "name": "", "replaces": []})
    });
    json!({
        "key": key, "value": value, "rate_limit": rate_limit, "descriptors": children,
        "shadow_mode": false, "quota_mode": false, "detailed_metric": false,
        "value_to_metric": false, "share_threshold": false
    })
}

/// The rate-limit service's config for [`routes`]' listener domain: one descriptor per route
/// (its name as key and value), under it each rule's chain of match descriptors, the limit on
/// the last.
fn limits() -> String {
    let config = json!({
        "name": DOMAIN,
        "domain": DOMAIN,
        "descriptors": [
            node(HEADER_EXACT, HEADER_EXACT, None, vec![
                node("rule-0-match-0", "rule-0-match-0", Some(3), vec![])
            ]),
            node(HEADER_DISTINCT, HEADER_DISTINCT, None, vec![
                node("rule-0-match-0", "", Some(3), vec![])
            ]),
            node(CIDR_EXACT, CIDR_EXACT, None, vec![
                node("masked_remote_address", CIDR, Some(3), vec![])
            ]),
            node(CIDR_DISTINCT, CIDR_DISTINCT, None, vec![
                node("masked_remote_address", CIDR, None, vec![
                    node("remote_address", "", Some(2), vec![])
                ])
            ]),
            node(NO_MATCH, NO_MATCH, None, vec![
                node("rule-0-match--1", "rule-0-match--1", Some(3), vec![])
            ]),
            node(TWO_RULES, TWO_RULES, None, vec![
                node("rule-0-match-0", "", Some(2), vec![]),
                node("rule-1-match--1", "rule-1-match--1", Some(3), vec![])
            ]),
        ]
    });
    serde_yaml_ng::to_string(&config).unwrap()
}

/// The shared policy's domain: one descriptor for the rule (its name as key and value), once,
/// however many routes it applies to.
fn shared_limits() -> String {
    let config = json!({
        "name": SHARED_DOMAIN,
        "domain": SHARED_DOMAIN,
        "descriptors": [
            node(SHARED_RULE, SHARED_RULE, None, vec![
                node("rule-0-match-0", "", Some(3), vec![])
            ]),
        ]
    });
    serde_yaml_ng::to_string(&config).unwrap()
}

/// The Envoy bootstrap: the front listener's HCM, rate-limit filter, router and routes as
/// Envoy Gateway's translator writes them, every route to the `backend` cluster, the
/// rate-limit service as `ratelimit_cluster`.
fn bootstrap(rls: std::net::SocketAddr) -> Bootstrap {
    let mut bootstrap = Bootstrap::new(&[rls]);
    let cluster = bootstrap.cluster("ratelimit");
    cluster["name"] = json!("ratelimit_cluster");
    cluster["load_assignment"]["cluster_name"] = json!("ratelimit_cluster");
    cluster["connect_timeout"] = json!("10s");
    cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        ["explicit_http_config"]["http2_protocol_options"] =
        json!({"initial_connection_window_size": 1048576, "initial_stream_window_size": 65536});
    let hcm = bootstrap.front_hcm();
    hcm["common_http_protocol_options"] =
        json!({"headers_with_underscores_action": "REJECT_REQUEST"});
    hcm["merge_slashes"] = json!(true);
    hcm["normalize_path"] = json!(true);
    hcm["path_with_escaped_slashes_action"] = json!("UNESCAPE_AND_REDIRECT");
    hcm["server_header_transformation"] = json!("PASS_THROUGH");
    hcm["http_filters"][0]["typed_config"]["suppress_envoy_headers"] = json!(true);
    // Envoy Gateway prepends one filter per domain, sorted by domain: the listener's, then
    // each shared policy's, named after it.
    let filter = |domain: &str| {
        json!({
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": domain,
            // EnvoyGateway `rateLimit.timeout: 5s`: Envoy's 20 ms default would turn a slow
            // answer on a loaded test machine into an error.
            "timeout": "5s",
            // EnvoyGateway `rateLimit.failClosed: true`: an RLS error is a 500, never a
            // request admitted uncounted.
            "failure_mode_deny": true,
            "disable_x_envoy_ratelimited_header": true,
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "ratelimit_cluster"}}
            }
        })
    };
    bootstrap.http_filter("envoy.filters.http.ratelimit", filter(DOMAIN));
    bootstrap.http_filter(SHARED_FILTER, filter(SHARED_DOMAIN));
    let routes: Vec<Value> = routes()
        .into_iter()
        .map(|(name, path, filter, domain, rate_limits)| {
            json!({
                "name": name,
                "match": {"path": path},
                "route": {"cluster": "backend", "upgrade_configs": [{"upgrade_type": "websocket"}]},
                "typed_per_filter_config": {filter: {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
                    "domain": domain,
                    "rate_limits": rate_limits
                }}
            })
        })
        .collect();
    bootstrap.front_hcm()["route_config"]["virtual_hosts"][0]["routes"] = json!(routes);
    bootstrap
}

/// Redis, floodgate as Envoy Gateway's rate-limit deployment, and Envoy in front.
struct Gateway {
    envoy: Envoy,
    server: Floodgate,
    _link: tempfile::TempDir,
    _runtime: tempfile::TempDir,
    _redis: RedisServer,
}

impl Gateway {
    /// Starts the three, after `envoy --mode validate` has accepted the bootstrap.
    async fn start() -> Gateway {
        let redis = RedisServer::start();
        let runtime = tempfile::tempdir().unwrap();
        let config = runtime.path().join("ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("default-eg-http.yaml"), limits()).unwrap();
        std::fs::write(config.join("default-shared-policy.yaml"), shared_limits()).unwrap();
        let redis_url = format!("127.0.0.1:{}", redis.port());
        let (server, link) = Floodgate::start_as_ratelimit(&[
            ("RUNTIME_ROOT", runtime.path().to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            // Ephemeral loopback ports instead of the deployment's 8080 and 8081.
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("DEBUG_PORT", "0"),
            // The counts are under test, not the Redis deadline: a loaded test machine must
            // not turn an answer into an error.
            ("FLOODGATE_REDIS_TIMEOUT_MS", "1000"),
        ]);
        let bootstrap = bootstrap(server.grpc);
        let checked = tempfile::tempdir().unwrap();
        let mut copy = Bootstrap {
            json: bootstrap.json.clone(),
        };
        let pipe = json!({"path": checked.path().join("backend.sock").to_str().unwrap()});
        copy.listener("backend")["address"]["pipe"] = pipe.clone();
        copy.cluster("backend")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            ["address"]["pipe"] = pipe;
        let path = checked.path().join("envoy.json");
        std::fs::write(&path, serde_json::to_string_pretty(&copy.json).unwrap()).unwrap();
        if let Err(why) = validate(&path) {
            panic!("Envoy refuses the bootstrap: {why}");
        }
        away_from_the_hours_edge().await;
        let envoy = Envoy::start(&bootstrap).await;
        Gateway {
            envoy,
            server,
            _link: link,
            _runtime: runtime,
            _redis: redis,
        }
    }

    /// The statuses of `n` requests for `path` with `headers`, from the loopback address
    /// `from`, one after the other.
    async fn statuses(
        &self,
        n: usize,
        path: &str,
        headers: &[(&str, &str)],
        from: &str,
    ) -> Vec<u16> {
        let from: IpAddr = from.parse().unwrap();
        let mut statuses = Vec::new();
        for _ in 0..n {
            let response = self.envoy.get_from(from, path, headers).await;
            if response.status == 429 {
                // Envoy Gateway turns Envoy's own header off and the draft-03 headers on.
                assert_eq!(response.header("x-envoy-ratelimited"), None, "{response:?}");
                assert!(
                    response.header("x-ratelimit-limit").is_some(),
                    "{response:?}"
                );
            }
            statuses.push(response.status);
        }
        statuses
    }

    /// Checks that Envoy saw no RLS error, and stops.
    async fn stop(self) {
        assert_eq!(self.envoy.ratelimit_stat("error").await, 0, "RLS errors");
        drop(self.envoy);
        self.server.stop().await;
    }
}

/// Waits until the wall clock is at least a minute from the next hour, so that a test's
/// requests fall in one fixed window of the hourly limits.
async fn away_from_the_hours_edge() {
    eventually_within(
        "the wall clock is away from an hour's edge",
        Duration::from_secs(90),
        || async {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            now.as_secs() % 3600 < 3540
        },
    )
    .await;
}

const ADMITTED_3: [u16; 4] = [200, 200, 200, 429];

/// A header rule with an exact value (3 an hour) limits requests with that value alone;
/// requests with another value or none are not counted.
#[tokio::test]
async fn a_header_value_rule_limits_only_that_value() {
    let gateway = Gateway::start().await;
    let one = [("x-user-id", "one")];
    let two = [("x-user-id", "two")];
    let g = &gateway;
    assert_eq!(
        g.statuses(4, "/header-exact", &one, "127.0.0.1").await,
        ADMITTED_3
    );
    assert_eq!(
        g.statuses(5, "/header-exact", &two, "127.0.0.1").await,
        [200; 5]
    );
    assert_eq!(
        g.statuses(5, "/header-exact", &[], "127.0.0.1").await,
        [200; 5]
    );
    assert_eq!(
        g.statuses(1, "/header-exact", &one, "127.0.0.2").await,
        [429]
    );
    gateway.stop().await;
}

/// A distinct header rule (3 an hour) gives each value its own count; a request without the
/// header is not counted.
#[tokio::test]
async fn a_distinct_header_rule_limits_each_value() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    let alice = [("x-user-id", "alice")];
    let bob = [("x-user-id", "bob")];
    assert_eq!(
        g.statuses(4, "/header-distinct", &alice, "127.0.0.1").await,
        ADMITTED_3
    );
    assert_eq!(
        g.statuses(4, "/header-distinct", &bob, "127.0.0.1").await,
        ADMITTED_3
    );
    assert_eq!(
        g.statuses(5, "/header-distinct", &[], "127.0.0.1").await,
        [200; 5]
    );
    gateway.stop().await;
}

/// An exact client-CIDR rule (3 an hour for 127.0.0.0/30) counts the range's clients
/// together; a client outside the range is not counted.
#[tokio::test]
async fn a_cidr_rule_limits_the_range_together() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    assert_eq!(
        g.statuses(2, "/cidr-exact", &[], "127.0.0.1").await,
        [200, 200]
    );
    assert_eq!(g.statuses(1, "/cidr-exact", &[], "127.0.0.2").await, [200]);
    assert_eq!(g.statuses(1, "/cidr-exact", &[], "127.0.0.3").await, [429]);
    assert_eq!(g.statuses(1, "/cidr-exact", &[], "127.0.0.1").await, [429]);
    assert_eq!(
        g.statuses(5, "/cidr-exact", &[], "127.0.0.9").await,
        [200; 5]
    );
    gateway.stop().await;
}

/// A distinct client-CIDR rule (2 an hour for each address of 127.0.0.0/30) counts each
/// client address apart; a client outside the range is not counted.
#[tokio::test]
async fn a_distinct_cidr_rule_limits_each_address() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    let admitted_2 = [200, 200, 429];
    assert_eq!(
        g.statuses(3, "/cidr-distinct", &[], "127.0.0.1").await,
        admitted_2
    );
    assert_eq!(
        g.statuses(3, "/cidr-distinct", &[], "127.0.0.2").await,
        admitted_2
    );
    assert_eq!(
        g.statuses(5, "/cidr-distinct", &[], "127.0.0.9").await,
        [200; 5]
    );
    gateway.stop().await;
}

/// A rule without a match (3 an hour) counts every request of the route, whatever its
/// headers and client.
#[tokio::test]
async fn a_rule_without_match_counts_every_request() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    assert_eq!(g.statuses(1, "/no-match", &[], "127.0.0.1").await, [200]);
    let one = [("x-user-id", "one")];
    assert_eq!(g.statuses(1, "/no-match", &one, "127.0.0.9").await, [200]);
    assert_eq!(
        g.statuses(2, "/no-match", &[], "127.0.0.2").await,
        [200, 429]
    );
    assert_eq!(g.statuses(1, "/no-match", &one, "127.0.0.1").await, [429]);
    gateway.stop().await;
}

/// Two rules on one route (2 an hour for each `x-tenant`, 3 an hour for the route) apply
/// together: a tenant stops at its own limit, and every request, with or without a tenant,
/// stops at the route's.
#[tokio::test]
async fn two_rules_on_one_route_apply_together() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    let a = [("x-tenant", "a")];
    let b = [("x-tenant", "b")];
    assert_eq!(
        g.statuses(2, "/two-rules", &b, "127.0.0.1").await,
        [200, 200]
    );
    assert_eq!(g.statuses(1, "/two-rules", &a, "127.0.0.1").await, [200]);
    // The route's 3 are spent: tenant a, under its own limit, is refused by the route's.
    assert_eq!(g.statuses(1, "/two-rules", &a, "127.0.0.1").await, [429]);
    assert_eq!(g.statuses(1, "/two-rules", &b, "127.0.0.1").await, [429]);
    assert_eq!(
        g.statuses(2, "/two-rules", &[], "127.0.0.1").await,
        [429, 429]
    );
    gateway.stop().await;
}

/// A shared rule (3 an hour for each `x-user-id`, across two routes) counts a value's requests
/// on both routes together, in its own domain, through its own filter instance.
#[tokio::test]
async fn a_shared_rule_counts_its_routes_together() {
    let gateway = Gateway::start().await;
    let g = &gateway;
    let alice = [("x-user-id", "alice")];
    let bob = [("x-user-id", "bob")];
    assert_eq!(
        g.statuses(2, "/shared-a", &alice, "127.0.0.1").await,
        [200, 200]
    );
    assert_eq!(
        g.statuses(2, "/shared-b", &alice, "127.0.0.1").await,
        [200, 429]
    );
    assert_eq!(g.statuses(1, "/shared-a", &alice, "127.0.0.1").await, [429]);
    assert_eq!(g.statuses(1, "/shared-b", &bob, "127.0.0.1").await, [200]);
    gateway.stop().await;
}
