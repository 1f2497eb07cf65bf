//! Limits from an xDS control plane: an ADS stream (state of the world) subscribed to
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, each push loaded like a reload of files.
//!
//! Place in the flow: beside the request path, like [`super::files`]. Each push holds every
//! `RateLimitConfig` of the node; they are converted to limits-file YAML ([`to_source`]) and
//! compiled by [`crate::config`] as files are, under the same deadline. A push that loads is
//! published ([`Publisher`]: swapped into the `ArcSwap` the request path reads, counted in
//! `floodgate_config_loads_total`) and ACKed; one that does not is counted as a failed load
//! and NACKed with the loader's errors as `error_detail`, and the previous limits stay in
//! force.
//!
//! The stream is the whole client state: when it breaks, the limits in force stay (a control
//! plane that is away never empties them), and after a jittered exponential backoff
//! ([`Backoff`]) a new stream starts with the last accepted version and the last nonce seen,
//! so the control plane knows what this node already holds.

mod convert;

use std::time::Duration;

use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::transport::Endpoint;

pub use convert::{rule_count, to_source};

use super::{LOAD_DEADLINE, Publisher};
use crate::config::{Config, ConfigError, ConfigErrors, Defaults};
use crate::proto::discovery::DiscoveryRequest;
use crate::proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::envoy::config::core::v3::Node;
use crate::proto::google::rpc::Status as RpcStatus;
use crate::proto::rls_conf::RateLimitConfig;

/// The resource type floodgate subscribes to (the reference's).
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `google.rpc.Code.INVALID_ARGUMENT`: what a NACK's `error_detail` carries.
const INVALID_ARGUMENT: i32 = 3;

/// How to reach the control plane and what to tell it.
#[derive(Clone, Debug)]
pub struct XdsOptions {
    /// The management server (TLS, timeouts and all).
    pub endpoint: Endpoint,
    /// Who this server is.
    pub node: Node,
    /// Extra gRPC headers of the stream.
    pub headers: MetadataMap,
    /// Largest response accepted (0: tonic's default).
    pub max_message_bytes: usize,
    /// Delays between reconnections.
    pub backoff: Backoff,
    /// Loader settings, as for files.
    pub defaults: Defaults,
    /// The reference's `MERGE_DOMAIN_CONFIG`.
    pub merge_domains: bool,
}

/// Exponential backoff with jitter between reconnections.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    /// First delay.
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
    /// Each delay is drawn within ± this fraction of itself (0 to 1).
    pub jitter: f64,
}

impl Backoff {
    /// The delay before reconnection number `attempt` (0 first), with `random` in [0, 1]:
    /// `initial × 2^attempt`, capped at `max`, spread by ± `jitter`, and never above `max`.
    pub fn delay(&self, attempt: u32, random: f64) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let factor = 1.0 + jitter * (2.0 * random.clamp(0.0, 1.0) - 1.0);
        base.mul_f64(factor).min(self.max)
    }
}

/// Where the stream resumes after a reconnection.
#[derive(Debug, Default)]
struct Resume {
    /// The last version accepted (ACKed).
    version: String,
    /// The nonce of the last response seen.
    nonce: String,
}

/// Follows the control plane until the returned task is aborted: every push that loads is
/// published. Must be called inside a tokio runtime.
pub fn spawn(options: XdsOptions, publisher: Publisher) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut resume = Resume::default();
        let mut attempt = 0;
        loop {
            let mut pushes = 0u64;
            let ended = session(&options, &mut resume, &mut pushes, &publisher).await;
            // A stream that delivered something was healthy: start the backoff over.
            if pushes > 0 {
                attempt = 0;
            }
            let delay = options.backoff.delay(attempt, random());
            attempt = attempt.saturating_add(1);
            match ended {
                Ok(()) => tracing::warn!(
                    ?delay,
                    "xDS stream closed by the management server; keeping the limits in force, reconnecting"
                ),
                Err(e) => {
                    tracing::warn!(?delay, error = %e, "xDS management server unreachable; keeping the limits in force, reconnecting")
                }
            }
            tokio::time::sleep(delay).await;
        }
    })
}

/// A number in [0, 1], different at each call (std's hasher keys are random).
fn random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    bits as f64 / u64::MAX as f64
}

/// One ADS stream, from connection to its end.
async fn session(
    options: &XdsOptions,
    resume: &mut Resume,
    pushes: &mut u64,
    publisher: &Publisher,
) -> Result<(), tonic::Status> {
    let channel = options
        .endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if options.max_message_bytes > 0 {
        client = client.max_decoding_message_size(options.max_message_bytes);
    }
    // Room for the first request and one answer: the loop sends at most one per response.
    let (requests, outgoing) = mpsc::channel(2);
    let first = request(options, &resume.version, &resume.nonce, None);
    let _ = requests.send(first).await;
    let mut call = tonic::Request::new(ReceiverStream::new(outgoing));
    *call.metadata_mut() = options.headers.clone();
    let mut responses = client.stream_aggregated_resources(call).await?.into_inner();
    tracing::info!(version = %resume.version, "xDS stream open");
    while let Some(mut response) = responses.message().await? {
        *pushes += 1;
        resume.nonce.clone_from(&response.nonce);
        if response.type_url != TYPE_URL {
            tracing::debug!(type_url = %response.type_url, "xDS response of another type ignored");
            continue;
        }
        let resources = std::mem::take(&mut response.resources);
        let answer = match load(&response.version_info, resources, options).await {
            Ok(loaded) => {
                let what = format!("xDS version {}", response.version_info);
                let domains = publisher.publish(loaded, &what);
                resume.version.clone_from(&response.version_info);
                tracing::info!(version = %response.version_info, domains, "limits from xDS loaded (ACK)");
                request(options, &resume.version, &response.nonce, None)
            }
            Err(errors) => {
                let all = publisher.reject(&errors);
                tracing::error!(version = %response.version_info, errors = errors.0.len(),
                    "limits from xDS rejected (NACK), keeping the previous limits: {all}");
                let detail = RpcStatus {
                    code: INVALID_ARGUMENT,
                    message: errors.to_string(),
                    details: Vec::new(),
                };
                request(options, &resume.version, &response.nonce, Some(detail))
            }
        };
        if requests.send(answer).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// A subscription request: the first of a stream, an ACK, or (with `error`) a NACK.
fn request(
    options: &XdsOptions,
    version: &str,
    nonce: &str,
    error: Option<RpcStatus>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_string(),
        node: Some(options.node.clone()),
        resource_names: Vec::new(),
        type_url: TYPE_URL.to_string(),
        response_nonce: nonce.to_string(),
        error_detail: error,
    }
}

/// Decodes, converts and loads every resource of push `version`, all of it off the runtime
/// (on the loader's thread, within its deadline) as a reload of files is: a push of many
/// rules costs memory and CPU there, never the threads that answer requests.
async fn load(
    version: &str,
    resources: Vec<prost_types::Any>,
    options: &XdsOptions,
) -> Result<Config, ConfigErrors> {
    let (defaults, merge) = (options.defaults, options.merge_domains);
    let label = format!("xds version {version}");
    let compile = move || {
        let sources = sources(resources, defaults.max_rules)?;
        Config::compile(&sources, &defaults, merge)
    };
    tokio::task::spawn_blocking(move || super::load_within(label, LOAD_DEADLINE, compile))
        .await
        .unwrap_or_else(|e| {
            Err(ConfigErrors(vec![error(
                "xds".into(),
                format!("load failed: {e}"),
            )]))
        })
}

/// The `(file name, YAML)` sources of a push's resources, or every reason it cannot load.
/// Rules are counted on each decoded resource before it is converted: once the push is past
/// `max_rules`, the rest is only decoded and counted (one resource at a time, to name the
/// total), so a push over the cap costs no more memory than its largest resource.
fn sources(
    resources: Vec<prost_types::Any>,
    max_rules: usize,
) -> Result<Vec<(String, String)>, ConfigErrors> {
    let mut sources = Vec::with_capacity(resources.len());
    let mut errors = Vec::new();
    let mut rules = 0usize;
    let mut past_cap = None;
    for (i, any) in resources.into_iter().enumerate() {
        let label = format!("xds:resources[{i}]");
        if any.type_url != TYPE_URL {
            errors.push(error(
                label,
                format!("resource of type '{}', expected {TYPE_URL}", any.type_url),
            ));
            continue;
        }
        match RateLimitConfig::decode(any.value.as_slice()) {
            Ok(config) => {
                rules = rules.saturating_add(rule_count(&config));
                if rules > max_rules {
                    past_cap.get_or_insert_with(|| format!("xds:{}", config.name));
                } else if past_cap.is_none() {
                    sources.push(to_source(&config));
                }
            }
            Err(e) => errors.push(error(label, format!("cannot decode: {e}"))),
        }
    }
    if let Some(file) = past_cap {
        sources.clear();
        errors.push(crate::config::too_many_rules(&file, rules, max_rules));
    }
    if errors.is_empty() {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn error(file: String, message: String) -> ConfigError {
    ConfigError {
        file,
        path: String::new(),
        message,
    }
}

/// An error with its sources, on one line (tonic's transport errors hide the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests;
