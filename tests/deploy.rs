//! The deployment artifacts in `deploy/` agree with each other and with floodgate: every
//! shipped limits file loads, the Kubernetes objects use the ports and names floodgate serves,
//! and the Envoy bootstrap and Istio filters call that Service with descriptors that the
//! shipped limits actually limit. (Schemas and checkov: `scripts/check-deploy.sh`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use floodgate::config::{Config, Defaults};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_floodgate");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every YAML document of a file, as JSON values.
fn yaml_docs(path: &str) -> Vec<Value> {
    let text = read(path);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

fn yaml(path: &str) -> Value {
    let mut docs = yaml_docs(path);
    assert_eq!(docs.len(), 1, "{path}: expected one document");
    docs.remove(0)
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value}"))
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no integer at {pointer} in {value}"))
}

fn array_at<'a>(value: &'a Value, pointer: &str) -> &'a Vec<Value> {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no array at {pointer} in {value}"))
}

fn load(path: &str) -> Config {
    floodgate::sources::files::load(&root().join(path), &Defaults::default())
        .unwrap_or_else(|e| panic!("{path}: {e:?}"))
}

/// Every directory named `limits` under `dir`.
fn limits_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name == "limits") {
                found.push(path.clone());
            }
            limits_dirs(&path, found);
        }
    }
}

/// The floodgate Service: its name and its `grpc` and `http` ports.
struct FloodgateService {
    name: String,
    grpc_port: u64,
    http_port: u64,
}

fn service() -> FloodgateService {
    let svc = yaml("deploy/kubernetes/base/service.yaml");
    let port = |name: &str| {
        let port = array_at(&svc, "/spec/ports")
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no port named {name}"));
        (
            u64_at(port, "/port"),
            port["appProtocol"].as_str().map(str::to_owned),
        )
    };
    let (grpc_port, grpc_protocol) = port("grpc");
    let (http_port, _) = port("http");
    assert_eq!(grpc_protocol.as_deref(), Some("grpc"));
    FloodgateService {
        name: str_at(&svc, "/metadata/name").to_owned(),
        grpc_port,
        http_port,
    }
}

/// The namespace both overlays deploy into.
fn namespace() -> String {
    let names: Vec<String> = ["redis", "memory"]
        .iter()
        .map(|overlay| {
            let k = yaml(&format!(
                "deploy/kubernetes/overlays/{overlay}/kustomization.yaml"
            ));
            str_at(&k, "/namespace").to_owned()
        })
        .collect();
    assert_eq!(names[0], names[1], "the overlays use different namespaces");
    names[0].clone()
}

/// The request descriptor one `rate_limits` entry makes Envoy send, with representative
/// values for what comes from the request.
fn descriptor(actions: &[Value]) -> Vec<(String, String)> {
    actions
        .iter()
        .map(|action| {
            if let Some(generic) = action.get("generic_key") {
                let key = generic["descriptor_key"].as_str().unwrap_or("generic_key");
                (
                    key.to_owned(),
                    str_at(generic, "/descriptor_value").to_owned(),
                )
            } else if action.get("remote_address").is_some() {
                ("remote_address".to_owned(), "203.0.113.7".to_owned())
            } else if let Some(header) = action.get("request_headers") {
                let value = match str_at(header, "/header_name") {
                    ":method" => "POST",
                    ":path" => "/login",
                    _ => "k-123",
                };
                (
                    str_at(header, "/descriptor_key").to_owned(),
                    value.to_owned(),
                )
            } else {
                panic!("action not covered by this test: {action}")
            }
        })
        .collect()
}

/// Every descriptor of `rate_limits` is limited in `domain` of the limits at `limits`;
/// returns how many were checked.
fn assert_descriptors_limited(rate_limits: &[Value], limits: &str, domain: &str) -> usize {
    let config = load(limits);
    let domain = config
        .domain(domain)
        .unwrap_or_else(|| panic!("{limits}: no domain {domain}"));
    for rate_limit in rate_limits {
        let entries = descriptor(array_at(rate_limit, "/actions"));
        let raw: Vec<(&[u8], &[u8])> = entries
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
            .collect();
        let found = domain
            .find(&raw)
            .unwrap_or_else(|| panic!("{limits}: no limit for descriptor {entries:?}"));
        assert!(!found.rule.limits.is_empty());
    }
    rate_limits.len()
}

/// The rate-limit filter's config, checked for what both Envoy and Istio need; returns it.
fn check_ratelimit_filter(filter: &Value) -> &Value {
    assert_eq!(filter["name"], "envoy.filters.http.ratelimit");
    let config = &filter["typed_config"];
    assert_eq!(
        config["@type"],
        "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
    );
    assert_eq!(
        str_at(config, "/rate_limit_service/transport_api_version"),
        "V3"
    );
    assert!(
        config["failure_mode_deny"].is_boolean(),
        "failure_mode_deny is chosen"
    );
    assert!(str_at(config, "/timeout").ends_with('s'));
    assert_eq!(config["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
    config
}

/// The filter's `timeout` outlasts the longest `max_wait` of the limits it is served by plus
/// the Redis deadline of the shipped Deployment: `check-config --expected-client-timeout`
/// with what is left of the timeout warns about nothing.
fn check_timeout_covers_max_wait(config: &Value, limits: &str) {
    let timeout = str_at(config, "/timeout");
    let seconds: f64 = timeout.strip_suffix('s').unwrap().parse().unwrap();
    let deployment = yaml("deploy/kubernetes/base/deployment.yaml");
    let redis_ms: u64 = array_at(&deployment, "/spec/template/spec/containers/0/env")
        .iter()
        .find(|v| v["name"] == "FLOODGATE_REDIS_TIMEOUT_MS")
        .map(|v| v["value"].as_str().unwrap().parse().unwrap())
        .unwrap();
    let left_ms = (seconds * 1000.0).round() as u64 - redis_ms;
    let out = Command::new(BIN)
        .args(["check-config", &root().join(limits).to_string_lossy()])
        .args(["--expected-client-timeout", &format!("{left_ms}ms")])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "timeout {timeout}: {stderr}");
    // And the shipped limits do shape: a filter timeout of Envoy's default would not do.
    let out = Command::new(BIN)
        .args(["check-config", &root().join(limits).to_string_lossy()])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_wait 50ms"));
}

/// Every limits file shipped in deploy/ and examples/ passes `floodgate check-config`.
#[test]
fn shipped_limits_pass_check_config() {
    let mut dirs = vec![root().join("examples/limits")];
    limits_dirs(&root().join("deploy"), &mut dirs);
    assert!(dirs.len() >= 4, "{dirs:?}");
    for dir in dirs {
        let out = Command::new(BIN)
            .arg("check-config")
            .arg(&dir)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The limits next to the Envoy and Istio configurations are the ones the kustomize base
/// ships in its ConfigMap, and the ConfigMap holds every file of base/limits.
#[test]
fn limits_copies_match_the_configmap() {
    assert_eq!(
        read("deploy/envoy/limits/edge.yaml"),
        read("deploy/kubernetes/base/limits/edge.yaml")
    );
    assert_eq!(
        read("deploy/istio/limits/ingress.yaml"),
        read("deploy/kubernetes/base/limits/ingress.yaml")
    );
    let k = yaml("deploy/kubernetes/base/kustomization.yaml");
    let generator = &array_at(&k, "/configMapGenerator")[0];
    let mut listed: Vec<&str> = array_at(generator, "/files")
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut present: Vec<String> = std::fs::read_dir(root().join("deploy/kubernetes/base/limits"))
        .unwrap()
        .map(|e| format!("limits/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    present.sort_unstable();
    assert_eq!(listed, present);
    // No hash suffix, so that an update changes the mounted ConfigMap in place (hot reload).
    assert_eq!(generator["options"]["disableNameSuffixHash"], true);
}

/// The Deployment runs floodgate on the ports the Service targets, probes the gRPC health
/// service, mounts the generated ConfigMap where --config points, gives the shutdown time to
/// drain, and points at the Redis Service the component ships.
#[test]
fn kubernetes_objects_agree() {
    let svc = service();
    assert_eq!((svc.grpc_port, svc.http_port), (8081, 8080));
    let deployment = yaml("deploy/kubernetes/base/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &array_at(pod, "/containers")[0];
    let ports: Vec<(&str, u64)> = array_at(container, "/ports")
        .iter()
        .map(|p| (str_at(p, "/name"), u64_at(p, "/containerPort")))
        .collect();
    assert_eq!(ports, [("grpc", 8081), ("http", 8080)]);
    for probe in ["startupProbe", "readinessProbe"] {
        assert_eq!(u64_at(container, &format!("/{probe}/grpc/port")), 8081);
    }
    // Liveness must not depend on Redis (gRPC health does, under policy `error`).
    assert_eq!(u64_at(container, "/livenessProbe/tcpSocket/port"), 8081);
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], svc.http_port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");

    let args: Vec<&str> = array_at(container, "/args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "serve");
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("no --{name}= in {args:?}"))
    };
    let mount = &array_at(container, "/volumeMounts")[0];
    assert_eq!(str_at(mount, "/mountPath"), flag("config"));
    assert!(
        mount.get("subPath").is_none(),
        "subPath mounts never update"
    );
    let volume = array_at(pod, "/volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let k = yaml("deploy/kubernetes/base/kustomization.yaml");
    assert_eq!(
        str_at(volume, "/configMap/name"),
        str_at(&k, "/configMapGenerator/0/name")
    );
    // SIGKILL never cuts the drain or the grace (a preStop hook, if any, comes first), with
    // 5 s to spare; readiness sees NOT_SERVING within the drain.
    let grace: u64 = flag("shutdown-grace").parse().unwrap();
    let drain: u64 = flag("drain-period").parse().unwrap();
    let pre_stop = container
        .pointer("/lifecycle/preStop/sleep/seconds")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    assert!(u64_at(pod, "/terminationGracePeriodSeconds") >= pre_stop + drain + grace + 5);
    let readiness = u64_at(container, "/readinessProbe/periodSeconds")
        * u64_at(container, "/readinessProbe/failureThreshold");
    assert!(readiness <= drain, "readiness fails after {readiness} s");
    // Twice what the shipped Envoy health check needs to take the replica out: one interval
    // and one timeout (NOT_SERVING marks a host unhealthy at once).
    let envoy_needs = envoy_health_check_seconds();
    assert!(
        drain as f64 >= 2.0 * envoy_needs,
        "--drain-period={drain} is under twice Envoy's {envoy_needs} s"
    );

    let redis_url = array_at(container, "/env")
        .iter()
        .find(|e| e["name"] == "FLOODGATE_REDIS_URL")
        .map(|e| str_at(e, "/value"))
        .unwrap();
    let redis_svc = yaml("deploy/kubernetes/components/redis/service.yaml");
    assert_eq!(
        redis_url,
        format!(
            "redis://{}:{}",
            str_at(&redis_svc, "/metadata/name"),
            u64_at(&redis_svc, "/spec/ports/0/port")
        )
    );
}

/// The image runs as a non-root user, and the Deployment runs it non-root, without privilege
/// escalation or capabilities, on a read-only root filesystem (floodgate writes no file).
#[test]
fn container_runs_as_non_root_on_a_read_only_root() {
    let dockerfile = read("Dockerfile");
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = last_stage
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let uid: u64 = user.split(':').next().unwrap().trim().parse().unwrap();
    assert_ne!(uid, 0, "USER {user}");

    let deployment = yaml("deploy/kubernetes/base/deployment.yaml");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_ne!(u64_at(pod, "/securityContext/runAsUser"), 0);
    let container = &array_at(pod, "/containers")[0];
    let context = &container["securityContext"];
    assert_eq!(context["runAsNonRoot"], true);
    assert_ne!(u64_at(container, "/securityContext/runAsUser"), 0);
    assert_eq!(context["readOnlyRootFilesystem"], true);
    assert_eq!(context["allowPrivilegeEscalation"], false);
    assert_eq!(context["capabilities"]["drop"], serde_json::json!(["ALL"]));
}

/// The NetworkPolicy opens the gRPC port to every source but the admin port (where `/json`
/// can refund any bucket) only to Prometheus, and no rule opens any other port.
#[test]
fn network_policy_admits_the_admin_port_only_from_prometheus() {
    let svc = service();
    let policy = yaml("deploy/kubernetes/base/networkpolicy.yaml");
    let rules = array_at(&policy, "/spec/ingress");
    let rule_for = |port: u64| {
        let found: Vec<&Value> = rules
            .iter()
            .filter(|r| array_at(r, "/ports").iter().any(|p| p["port"] == port))
            .collect();
        assert_eq!(found.len(), 1, "one rule for port {port}");
        found[0]
    };
    assert!(rule_for(svc.grpc_port).get("from").is_none());
    let admin = rule_for(svc.http_port);
    assert_eq!(
        array_at(admin, "/ports").len(),
        1,
        "the admin rule opens 8080 only"
    );
    let from = array_at(admin, "/from");
    assert_eq!(from.len(), 1);
    assert_eq!(
        str_at(&from[0], "/podSelector/matchLabels/app.kubernetes.io~1name"),
        "prometheus"
    );
    assert!(from[0].get("namespaceSelector").is_some());
    for rule in rules {
        for port in array_at(rule, "/ports") {
            let port = u64_at(port, "/port");
            assert!([svc.grpc_port, svc.http_port].contains(&port), "{port}");
        }
    }
}

/// The gRPC TLS component names floodgate's own TLS variables, points them into the mounted
/// Secret, and moves the probes that would speak plaintext gRPC to `/healthcheck`.
#[test]
fn grpc_tls_component_agrees() {
    let patch = yaml("deploy/kubernetes/components/grpc-tls/deployment-patch.yaml");
    let pod = &patch["spec"]["template"]["spec"];
    let container = &array_at(pod, "/containers")[0];
    let mount = &array_at(container, "/volumeMounts")[0];
    let volume = array_at(pod, "/volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(str_at(volume, "/secret/secretName"), "floodgate-grpc-tls");
    assert!(
        mount.get("subPath").is_none(),
        "subPath mounts never update"
    );
    let help = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let env = array_at(container, "/env");
    for (name, file) in [
        ("FLOODGATE_GRPC_TLS_CERT_FILE", "tls.crt"),
        ("FLOODGATE_GRPC_TLS_KEY_FILE", "tls.key"),
        ("FLOODGATE_GRPC_TLS_CLIENT_CA_FILE", "ca.crt"),
    ] {
        assert!(
            help.contains(&format!("env: {name}=")),
            "{name} not in serve --help"
        );
        let value = env
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| str_at(e, "/value"))
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(value, format!("{}/{file}", str_at(mount, "/mountPath")));
    }
    let http_port = service().http_port;
    let base = yaml("deploy/kubernetes/base/deployment.yaml");
    let base_container = &array_at(&base["spec"]["template"]["spec"], "/containers")[0];
    let http_name = array_at(base_container, "/ports")
        .iter()
        .find(|p| u64_at(p, "/containerPort") == http_port)
        .map(|p| str_at(p, "/name"))
        .unwrap();
    for probe in ["startupProbe", "readinessProbe"] {
        assert!(
            container[probe]["grpc"].is_null(),
            "{probe} still uses grpc"
        );
        assert_eq!(
            str_at(container, &format!("/{probe}/httpGet/path")),
            "/healthcheck"
        );
        assert_eq!(
            str_at(container, &format!("/{probe}/httpGet/port")),
            http_name
        );
    }
    // Liveness is a TCP connect, which works with TLS: the component must not need to touch it.
    assert!(container.get("livenessProbe").is_none());
    assert_eq!(
        u64_at(base_container, "/livenessProbe/tcpSocket/port"),
        service().grpc_port
    );
}

/// Seconds the shipped Envoy's health check on floodgate takes to see a NOT_SERVING answer:
/// its longest interval (`no_traffic_interval`, 60 s unless set, times the check after the
/// first one at Envoy's start) plus its timeout.
fn envoy_health_check_seconds() -> f64 {
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let check = &array_at(&envoy, "/static_resources/clusters")
        .iter()
        .find_map(|cluster| cluster["health_checks"].as_array())
        .expect("a cluster with health checks")[0];
    assert!(check["grpc_health_check"].is_object(), "{check}");
    let seconds = |pointer: &str, default: &str| -> f64 {
        let text = check
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or(default);
        text.strip_suffix('s')
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{pointer}: {text}"))
    };
    let interval = seconds("/interval", "no interval");
    interval.max(seconds("/no_traffic_interval", "60s")) + seconds("/timeout", "no timeout")
}

/// The Envoy bootstrap calls floodgate's Service on its gRPC port over HTTP/2, in a domain the
/// ConfigMap serves, and every descriptor its routes produce is limited.
#[test]
fn envoy_bootstrap_targets_floodgate() {
    let svc = service();
    let envoy = yaml("deploy/envoy/envoy.yaml");
    let hcm = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    assert_eq!(hcm["name"], "envoy.filters.network.http_connection_manager");
    let filters = array_at(hcm, "/typed_config/http_filters");
    let config = check_ratelimit_filter(&filters[0]);
    check_timeout_covers_max_wait(config, "deploy/envoy/limits");
    assert_eq!(
        filters.last().unwrap()["name"],
        "envoy.filters.http.router",
        "the router comes last"
    );
    let domain = str_at(config, "/domain");
    assert!(
        load("deploy/kubernetes/base/limits")
            .domain(domain)
            .is_some()
    );

    let cluster_name = str_at(
        config,
        "/rate_limit_service/grpc_service/envoy_grpc/cluster_name",
    );
    let cluster = array_at(&envoy, "/static_resources/clusters")
        .iter()
        .find(|c| c["name"] == cluster_name)
        .unwrap_or_else(|| panic!("no cluster {cluster_name}"));
    let options = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(options["explicit_http_config"]["http2_protocol_options"].is_object());
    let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(str_at(address, "/address"), svc.name);
    assert_eq!(u64_at(address, "/port_value"), svc.grpc_port);

    let routes = array_at(
        &envoy,
        "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes",
    );
    let checked: usize = routes
        .iter()
        .filter_map(|r| r["route"]["rate_limits"].as_array())
        .map(|rate_limits| assert_descriptors_limited(rate_limits, "deploy/envoy/limits", domain))
        .sum();
    assert_eq!(checked, 4);
}

/// The Istio filters insert the rate-limit filter at the ingress gateway, calling Istio's
/// cluster for floodgate's gRPC Service port in the overlays' namespace, in a domain the
/// ConfigMap serves; every descriptor of the route actions is limited.
#[test]
fn istio_filters_target_floodgate() {
    let svc = service();
    let docs = yaml_docs("deploy/istio/envoyfilter-ratelimit.yaml");
    assert_eq!(docs.len(), 2);
    for doc in &docs {
        assert_eq!(doc["kind"], "EnvoyFilter");
        assert_eq!(
            doc["spec"]["workloadSelector"]["labels"]["istio"],
            "ingressgateway"
        );
        assert_eq!(
            doc["spec"]["configPatches"][0]["match"]["context"],
            "GATEWAY"
        );
    }

    let insert = &docs[0]["spec"]["configPatches"][0];
    assert_eq!(insert["applyTo"], "HTTP_FILTER");
    assert_eq!(insert["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        str_at(insert, "/match/listener/filterChain/filter/subFilter/name"),
        "envoy.filters.http.router"
    );
    let config = check_ratelimit_filter(&insert["patch"]["value"]);
    check_timeout_covers_max_wait(config, "deploy/istio/limits");
    let host = format!("{}.{}.svc.cluster.local", svc.name, namespace());
    let grpc = &config["rate_limit_service"]["grpc_service"]["envoy_grpc"];
    assert_eq!(
        str_at(grpc, "/cluster_name"),
        format!("outbound|{}||{host}", svc.grpc_port)
    );
    assert_eq!(str_at(grpc, "/authority"), host);
    let domain = str_at(config, "/domain");
    assert!(
        load("deploy/kubernetes/base/limits")
            .domain(domain)
            .is_some()
    );

    let actions = &docs[1]["spec"]["configPatches"][0];
    assert_eq!(actions["applyTo"], "VIRTUAL_HOST");
    let rate_limits = array_at(actions, "/patch/value/rate_limits");
    assert_eq!(
        assert_descriptors_limited(rate_limits, "deploy/istio/limits", domain),
        3
    );
}

/// The Envoy Gateway example is an EnvoyGateway configuration whose rate-limit deployment
/// runs floodgate's image with a Redis backend, and the image carries the command Envoy
/// Gateway runs (`/bin/ratelimit`).
#[test]
fn envoy_gateway_runs_floodgates_image() {
    let config_map = yaml("deploy/envoy-gateway/envoy-gateway-config.yaml");
    assert_eq!(
        str_at(&config_map, "/metadata/name"),
        "envoy-gateway-config"
    );
    assert_eq!(
        str_at(&config_map, "/metadata/namespace"),
        "envoy-gateway-system"
    );
    let embedded = str_at(&config_map, "/data/envoy-gateway.yaml");
    let gateway: Value = serde_yaml_ng::from_str(embedded).unwrap();
    assert_eq!(
        str_at(&gateway, "/apiVersion"),
        "gateway.envoyproxy.io/v1alpha1"
    );
    assert_eq!(str_at(&gateway, "/kind"), "EnvoyGateway");
    let image = str_at(
        &gateway,
        "/provider/kubernetes/rateLimitDeployment/container/image",
    );
    assert!(image.contains("/floodgate:"), "{image}");
    assert_eq!(str_at(&gateway, "/rateLimit/backend/type"), "Redis");
    assert!(!str_at(&gateway, "/rateLimit/backend/redis/url").is_empty());
    let dockerfile = read("Dockerfile");
    assert!(
        dockerfile.contains("COPY --from=build /out/floodgate /bin/ratelimit"),
        "the image must carry /bin/ratelimit"
    );
}

/// The Grafana dashboard is valid JSON and every PromQL expression in it names only series
/// floodgate serves: the reference's (`floodgate::telemetry::statsd::prometheus::SERIES`) or its own
/// (`floodgate_*`, as each owner's metrics file registers them).
#[test]
fn grafana_dashboard_queries_served_series() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/ratelimit.json")).unwrap();
    let own: String = [
        "src/telemetry/metrics.rs",
        "src/telemetry/metrics/requests.rs",
        "src/telemetry/metrics/rules.rs",
        "src/store/metrics.rs",
        "src/sources/metrics.rs",
        "src/transport/metrics.rs",
        "src/rlqs/metrics.rs",
    ]
    .iter()
    .map(|file| read(file))
    .collect();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut reference = 0;
    for expr in &exprs {
        let names: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| word.starts_with("ratelimit_") || word.starts_with("floodgate_"))
            .collect();
        assert!(!names.is_empty(), "{expr}");
        for name in names {
            let base = ["_bucket", "_count", "_sum", "_total"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            if name.starts_with("ratelimit_") {
                reference += 1;
                assert!(
                    floodgate::telemetry::statsd::prometheus::SERIES.contains(&base)
                        || floodgate::telemetry::statsd::prometheus::SERIES.contains(&name),
                    "{name} in {expr}"
                );
            } else {
                assert!(own.contains(&format!("\"{base}\"")), "{name} in {expr}");
            }
        }
    }
    assert!(
        reference >= 10,
        "the dashboard is built on the reference's series"
    );
}
