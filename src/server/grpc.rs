//! Serving gRPC: the tonic server (rate-limit service, `grpc.health.v1`, reflection, behind
//! the per-connection call count and stream admission) and the tasks that serve it on the
//! listeners [`crate::transport::bind`] bound: one per serving thread on TCP (plaintext or
//! TLS), or one on the unix socket.
//!
//! Each connection is wrapped once by the transport ([`crate::transport::Guarded`]), which
//! also cuts it at its maximum age and grace; the `GOAWAY` at the age itself is tonic's.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic_health::pb::health_server::{Health, HealthServer};

use super::error::ServerError;
use super::options::RunOptions;
use super::stop::stopped;
use crate::admission::BodyBudget;
use crate::proto::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use crate::proto::{self, rls::rate_limit_service_server::RateLimitServiceServer};
use crate::runtime;
use crate::service::{AdmissionLayer, Decider, RlsService};
use crate::transport::Port;
use crate::transport::tls::GrpcTls;
use crate::transport::{Acceptor, CallsLayer, GrpcListener, Guarded, PortBound, TcpListeners};

/// How long a gRPC connection may be quiet before the server pings it (unless
/// `--grpc-keepalive-interval` says otherwise), and how long the answer may take, each at most
/// a third of the idle timeout: a dead peer is found within their sum, and a live one is never
/// silent for the idle timeout.
const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The gRPC server of one serving thread: tonic's router behind [`CallsLayer`] (calls counted
/// per connection) and [`AdmissionLayer`].
pub(super) type GrpcRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        AdmissionLayer,
        tower::layer::util::Stack<CallsLayer, tower::layer::util::Identity>,
    >,
>;

/// The gRPC server over `decider`, serving `health` too, bounded as `options` say. Each
/// serving thread serves a clone (the services and their state are shared).
pub(super) fn router(
    decider: &Arc<Decider>,
    health: HealthServer<impl Health>,
    options: &RunOptions,
) -> Result<GrpcRouter, ServerError> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    // One message may be as large as what Envoy builds from its largest headers; what all
    // calls hold together is bounded by the bytes budget below (crate::admission).
    let rls_service = RlsService::new(decider.clone())
        .with_max_decoding_message_size(options.grpc_max_message_bytes);
    // ShouldRateLimit calls are answered by the admission layer itself
    // (crate::service::AdmissionLayer); the generated service answers the path's other
    // methods (UNIMPLEMENTED).
    let rls = RateLimitServiceServer::new(rls_service.clone())
        .max_decoding_message_size(options.grpc_max_message_bytes);
    // Usage reports: the same bound, and the same budget (the body is charged by the
    // admission layer whatever the service).
    let rlqs = options.rlqs.clone().map(|rlqs| {
        RateLimitQuotaServiceServer::new(crate::rlqs::RlqsService::new(rlqs, peer_ip))
            .max_decoding_message_size(options.grpc_max_message_bytes)
    });
    let bounds = options.bounds;
    // Pinged well within the idle timeout, a live peer is never closed as silent.
    let keepalive_interval = options
        .keepalive_interval
        .unwrap_or(GRPC_KEEPALIVE_INTERVAL)
        .min(bounds.grpc.idle_timeout / 3);
    let keepalive_timeout = GRPC_KEEPALIVE_TIMEOUT.min(bounds.grpc.idle_timeout / 3);
    let mut builder = tonic::transport::Server::builder()
        // Bounded per connection (SETTINGS_MAX_CONCURRENT_STREAMS) and in total (every
        // stream takes a --max-in-flight place from its first frame, crate::admission);
        // the request timeout frees a stream whose body never comes.
        .max_concurrent_streams(Some(bounds.grpc_max_concurrent_streams))
        .timeout(bounds.grpc_request_timeout)
        .http2_keepalive_interval(Some(keepalive_interval))
        .http2_keepalive_timeout(Some(keepalive_timeout));
    if let Some(age) = options.max_connection_age {
        // Graceful only (GOAWAY, calls finish): tonic's own grace would replace the GOAWAY
        // by a hard close, so the grace is the transport's (`Guarded::cut_after`).
        builder = builder.max_connection_age(age);
    }
    Ok(builder
        // Outermost: a call counts on its connection (busy: never evicted at the
        // connection bound) from its HEADERS, refused by admission or not.
        .layer(CallsLayer)
        .layer(AdmissionLayer::new(
            rls_service,
            BodyBudget::new(options.max_in_flight_bytes),
        ))
        .add_service(rls)
        .add_optional_service(rlqs)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// The peer address of a call on a guarded TCP connection, plaintext or TLS (none on the
/// unix socket): what `--rlqs-max-streams-per-peer` counts by.
fn peer_ip(extensions: &tonic::Extensions) -> Option<std::net::IpAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<crate::transport::GuardedInfo<TcpConnectInfo>>()
        .and_then(|info| info.inner.remote_addr())
        .or_else(|| {
            extensions
                .get::<crate::transport::GuardedInfo<TlsConnectInfo<TcpConnectInfo>>>()
                .and_then(|info| info.inner.get_ref().remote_addr())
        })
        .map(|addr| addr.ip())
}

/// Serves `router` on `grpc` until `stop` says true and the connections have drained: on TCP,
/// one task per serving thread under one connection bound for the port; on a unix socket,
/// one task. Each connection is cut once it is `options`' maximum age and grace old.
pub(super) fn spawn(
    grpc: GrpcListener,
    router: GrpcRouter,
    options: &RunOptions,
    stop: &watch::Receiver<bool>,
) -> Result<JoinHandle<Result<(), ServerError>>, ServerError> {
    // A connection is cut at age + grace; without a grace it lives until its calls end.
    let lifetime = options
        .max_connection_age
        .zip(options.max_connection_age_grace)
        .map(|(age, grace)| age + grace);
    match grpc {
        GrpcListener::Tcp(TcpListeners { primary, extra }) => {
            // One connection bound for the port, shared by every serving thread.
            let bound = PortBound::new(options.bounds.grpc, Port::Grpc, options.transport.clone());
            let mut threads = Vec::with_capacity(extra.len());
            for (index, listener) in extra.into_iter().enumerate() {
                let (router, tls) = (router.clone(), options.tls.clone());
                let (stop, bound) = (stop.clone(), bound.clone());
                let thread = runtime::spawn_runtime_thread(
                    format!("floodgate-grpc-{}", index + 1),
                    move || async move {
                        // Registered with this thread's runtime: its connections are served
                        // here.
                        let listener =
                            TcpListener::from_std(listener).map_err(ServerError::Http)?;
                        let acceptor = bound.acceptor(listener);
                        serve_tcp(router, acceptor, tls, lifetime, stopped(stop)).await
                    },
                )
                .map_err(ServerError::Http)?;
                threads.push(thread);
            }
            let primary = serve_tcp(
                router,
                bound.acceptor(primary),
                options.tls.clone(),
                lifetime,
                stopped(stop.clone()),
            );
            Ok(tokio::spawn(async move {
                let others =
                    futures_util::future::try_join_all(threads.into_iter().map(join_thread));
                futures_util::future::try_join(primary, others)
                    .await
                    .map(|_| ())
            }))
        }
        GrpcListener::Unix(mut socket) => {
            // serve() refuses TLS on a socket before binding; a test passing both gets
            // plaintext, as the socket's only use here.
            let Some(listener) = socket.listener.take() else {
                return Err(ServerError::Settings("unix socket already served".into()));
            };
            // No bound on a socket: its connections are wrapped for the age cut only.
            let incoming = UnixListenerStream::new(listener)
                .map(move |stream| stream.map(|s| Guarded::unbounded(s).cut_after(lifetime)));
            let serve = router.serve_with_incoming_shutdown(incoming, stopped(stop.clone()));
            Ok(tokio::spawn(async move {
                let served = serve.await;
                // The socket file goes with the server.
                drop(socket);
                served.map_err(ServerError::from)
            }))
        }
    }
}

/// Serves gRPC on a TCP `listener`, plaintext or TLS, each connection cut after `lifetime`
/// (if any), until `stopped` completes and the connections have drained.
async fn serve_tcp(
    router: GrpcRouter,
    listener: Acceptor,
    tls: Option<GrpcTls>,
    lifetime: Option<Duration>,
    stopped: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    match tls {
        None => {
            let incoming = listener
                .into_stream()
                .map(move |stream| stream.map(|s| s.cut_after(lifetime)));
            router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await?;
        }
        Some(tls) => {
            let incoming = tls
                .incoming(listener)
                .map(move |stream| stream.map(|s| s.cut_after(lifetime)));
            router
                .serve_with_incoming_shutdown(incoming, stopped)
                .await?;
        }
    }
    Ok(())
}

/// Waits, off the runtime's thread, for a gRPC serving thread to end, and hands back its
/// result.
async fn join_thread(
    thread: std::thread::JoinHandle<io::Result<Result<(), ServerError>>>,
) -> Result<(), ServerError> {
    match tokio::task::spawn_blocking(move || thread.join()).await {
        Ok(Ok(Ok(served))) => served,
        Ok(Ok(Err(runtime))) => Err(ServerError::Http(runtime)),
        // A panic in a serving thread is a defect: re-raise it rather than hide it.
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // The blocking pool is shutting down: so is the server.
        Err(_) => Ok(()),
    }
}
