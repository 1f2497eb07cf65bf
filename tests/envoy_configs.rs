//! Every Envoy config the project ships or documents loads in the real Envoy
//! (`envoy --mode validate`): deploy/envoy/envoy.yaml, the Envoy configs in README.md and
//! docs/*.md, and the Envoy config the Istio patches carry. Where a document shows only a part
//! of a config, the test puts that part into the shipped bootstrap and says so.
//! (deploy/envoy-gateway/ holds Envoy Gateway's own configuration, not Envoy's: Envoy Gateway
//! writes the Envoy config itself, so there is nothing of ours for Envoy to load there.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::certs::Pki;
use support::envoy::validate;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parse(text: &str, what: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{what} is not YAML: {e}"))
}

/// Writes `config` (JSON, YAML's subset) to a temporary file and has Envoy validate it;
/// fails the test with Envoy's words and `what`.
fn assert_loads(config: &Value, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.json");
    std::fs::write(&path, serde_json::to_string_pretty(config).unwrap()).unwrap();
    if let Err(why) = validate(&path) {
        panic!("Envoy refuses {what}:\n{why}");
    }
}

/// The shipped bootstrap, as a value the tests put documented parts into.
fn shipped() -> Value {
    parse(&read("deploy/envoy/envoy.yaml"), "deploy/envoy/envoy.yaml")
}

/// The shipped bootstrap's HTTP connection manager.
fn hcm(bootstrap: &mut Value) -> &mut Value {
    &mut bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    })
}

/// Every fenced ```yaml block of a Markdown file: (line of the fence, text).
fn yaml_blocks(path: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (n, line) in read(path).lines().enumerate() {
        match &mut open {
            None if line.trim_start() == "```yaml" => open = Some((n + 1, String::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.push(open.take().unwrap()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    blocks
}

/// The Markdown files that document floodgate.
fn documents() -> Vec<String> {
    let mut docs = vec!["README.md".to_string(), "deploy/README.md".to_string()];
    let mut listed: Vec<String> = std::fs::read_dir(repo("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    listed.sort();
    docs.extend(listed);
    docs
}

/// The bootstrap shipped in deploy/envoy/ loads as it is.
#[test]
fn shipped_bootstrap_loads() {
    if let Err(why) = validate(&repo("deploy/envoy/envoy.yaml")) {
        panic!("Envoy refuses deploy/envoy/envoy.yaml:\n{why}");
    }
}

/// Every Envoy config shown in README.md, deploy/README.md and docs/*.md loads: a whole
/// bootstrap as it is, a part in the shipped bootstrap where it belongs. A block that names
/// Envoy's types but is none of the known parts fails the test, so a new one is not missed.
#[test]
fn documented_configs_load() {
    let pki = Pki::generate();
    let mut checked = Vec::new();
    for doc in documents() {
        for (line, text) in yaml_blocks(&doc) {
            let what = format!("the block at {doc}:{line}");
            let block = parse(&text, &what);
            let config = if block.get("static_resources").is_some() {
                // A whole bootstrap (docs/rlqs.md).
                block
            } else if let Some(filters) = block.get("http_filters") {
                // The HTTP filters alone (README.md): the document elides the listener, the
                // router and the `floodgate` cluster; the shipped bootstrap has them.
                let mut bootstrap = shipped();
                let mut filters = filters.as_array().unwrap().clone();
                if filters.last().map(|f| &f["name"]) != Some(&router()["name"]) {
                    filters.push(router());
                }
                hcm(&mut bootstrap)["http_filters"] = Value::Array(filters);
                bootstrap
            } else if let Some(socket) = block.get("transport_socket") {
                // The `floodgate` cluster's TLS (docs/deploy.md): put on the shipped cluster,
                // with the certificate files the document mounts at /etc/envoy/floodgate/
                // generated by the test (Envoy reads them while validating).
                let mut socket = serde_json::to_string(socket).unwrap();
                for (mounted, generated) in [
                    ("/etc/envoy/floodgate/ca.crt", &pki.ca),
                    ("/etc/envoy/floodgate/client.crt", &pki.client_cert),
                    ("/etc/envoy/floodgate/client.key", &pki.client_key),
                ] {
                    socket = socket.replace(mounted, generated.to_str().unwrap());
                }
                let mut bootstrap = shipped();
                let clusters = bootstrap["static_resources"]["clusters"]
                    .as_array_mut()
                    .unwrap();
                let cluster = clusters
                    .iter_mut()
                    .find(|c| c["name"] == "floodgate")
                    .unwrap();
                cluster["transport_socket"] = serde_json::from_str(&socket).unwrap();
                bootstrap
            } else {
                assert!(
                    !text.contains("type.googleapis.com/envoy") && !text.contains("envoy.filters"),
                    "{what} holds Envoy config this test does not know how to load:\n{text}"
                );
                continue;
            };
            assert_loads(&config, &what);
            checked.push(what);
        }
    }
    // README's filters, docs/deploy.md's TLS, docs/rlqs.md's bootstrap at least.
    assert!(
        checked.len() >= 3,
        "too few Envoy configs found: {checked:?}"
    );
}

/// The Envoy config that deploy/istio's two EnvoyFilter patches carry loads: the HTTP filter
/// inserted before the router, the rate_limits merged into the virtual host. Istio generates
/// the listener and the `outbound|8081||…` cluster itself; the test takes them from the
/// shipped bootstrap (listener) and adds the cluster under Istio's name.
#[test]
fn istio_patches_load() {
    let text = read("deploy/istio/envoyfilter-ratelimit.yaml");
    let patches: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .flat_map(|filter: Value| filter["spec"]["configPatches"].as_array().unwrap().clone())
        .collect();
    let mut bootstrap = shipped();
    let mut applied = Vec::new();
    for patch in &patches {
        let value = patch["patch"]["value"].clone();
        match (
            patch["applyTo"].as_str().unwrap(),
            patch["patch"]["operation"].as_str().unwrap(),
        ) {
            ("HTTP_FILTER", "INSERT_BEFORE") => {
                hcm(&mut bootstrap)["http_filters"] = json!([value, router()]);
            }
            ("VIRTUAL_HOST", "MERGE") => {
                let vhost = &mut hcm(&mut bootstrap)["route_config"]["virtual_hosts"][0];
                // The shipped routes carry their own rate_limits; Istio's gateway routes carry
                // none, so only the virtual host's (the patch's) are sent.
                for route in vhost["routes"].as_array_mut().unwrap() {
                    route["route"]
                        .as_object_mut()
                        .unwrap()
                        .remove("rate_limits");
                }
                for (key, field) in value.as_object().unwrap() {
                    vhost[key] = field.clone();
                }
            }
            other => panic!("a patch this test does not apply: {other:?}"),
        }
        applied.push(patch["applyTo"].clone());
    }
    assert_eq!(applied, [json!("HTTP_FILTER"), json!("VIRTUAL_HOST")]);
    let filter = &hcm(&mut bootstrap)["http_filters"][0]["typed_config"];
    let cluster_name = filter["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap()
        .to_string();
    let mut istio_cluster = bootstrap["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "floodgate")
        .unwrap()
        .clone();
    istio_cluster["name"] = json!(cluster_name);
    istio_cluster["load_assignment"]["cluster_name"] = json!(cluster_name);
    bootstrap["static_resources"]["clusters"]
        .as_array_mut()
        .unwrap()
        .push(istio_cluster);
    assert_loads(
        &bootstrap,
        "deploy/istio/envoyfilter-ratelimit.yaml's patches",
    );
}
