//! Test harness: the real server on ephemeral loopback ports, with a manual clock so tests
//! move time instead of sleeping, and helpers to build requests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use floodgate::clock::ManualClock;
use floodgate::config::{Config, Defaults};
use floodgate::limiter::Algorithm;
use floodgate::metrics::Metrics;
use floodgate::plan::{PlanOptions, RequestLimits};
use floodgate::proto::common::{
    RateLimitDescriptor,
    rate_limit_descriptor::{Entry, RateLimitOverride},
};
use floodgate::proto::rls::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_client::RateLimitServiceClient,
};
use floodgate::server::{self, ServerError};
use floodgate::service::RateLimiter;
use floodgate::store::MemoryStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

pub mod http;
pub mod redis;

/// 2025-06-15T00:00:00Z in µs: aligned to the day, so windows start exactly here.
pub const START_US: i64 = 1_749_945_600_000_000;

/// A running server and handles to its insides.
pub struct TestServer {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub memory: Arc<MemoryStore>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    /// Starts a server with `yaml` as its only limits file and default options.
    pub async fn start(yaml: &str) -> TestServer {
        TestServer::start_with(yaml, options()).await
    }

    /// Starts a server with `yaml` as its only limits file.
    pub async fn start_with(yaml: &str, options: PlanOptions) -> TestServer {
        let defaults = Defaults {
            algorithm: Algorithm::TokenBucket,
        };
        let config =
            Config::from_sources(&[("limits.yaml".to_string(), yaml.to_string())], &defaults)
                .unwrap_or_else(|e| panic!("test config does not load:\n{e}"));
        let clock = Arc::new(ManualClock::new(START_US));
        let memory = Arc::new(MemoryStore::new(clock.clone()));
        let limiter = Arc::new(RateLimiter::new(
            Arc::new(ArcSwap::from_pointee(config)),
            memory.clone(),
            options,
            Metrics::shared(),
        ));
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_addr = grpc.local_addr().unwrap();
        let http_addr = http.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(
            grpc,
            http,
            limiter,
            Duration::from_secs(5),
            async move {
                let _ = rx.await;
            },
        ));
        TestServer {
            grpc_addr,
            http_addr,
            clock,
            memory,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// A connected gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .unwrap()
    }

    /// Sends one request and expects an answer.
    pub async fn ask(&self, request: RateLimitRequest) -> RateLimitResponse {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
    }

    /// Sends one request and expects an error status.
    pub async fn ask_err(&self, request: RateLimitRequest) -> tonic::Status {
        self.client()
            .await
            .should_rate_limit(request)
            .await
            .expect_err("expected an error status")
    }

    /// Moves the server's clock forward.
    pub fn advance_ms(&self, ms: i64) {
        self.clock.advance(ms * 1000);
    }

    /// Shuts the server down and re-raises any panic or error from it.
    pub async fn stop(mut self) {
        self.shutdown.take().unwrap().send(()).unwrap();
        let result = self.task.take().unwrap().await;
        match result {
            Ok(result) => result.unwrap(),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// Default plan options: no shadow mode, token bucket overrides, default request bounds.
pub fn options() -> PlanOptions {
    PlanOptions {
        shadow_mode: false,
        default_algorithm: Algorithm::TokenBucket,
        limits: RequestLimits::default(),
    }
}

/// A descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.as_bytes().to_vec(),
                value: v.as_bytes().to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with a descriptor-level `hits_addend`.
pub fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(hits);
    d
}

/// A descriptor with a limit override.
pub fn with_override(mut d: RateLimitDescriptor, rpu: u32, unit: i32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit,
    });
    d
}

/// A request for `domain` with the given descriptors.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// A request with one single-entry descriptor.
pub fn simple(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    request(domain, vec![descriptor(&[(key, value)])])
}
