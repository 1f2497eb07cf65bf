//! Serving the HTTP ports: the admin port (`/healthcheck`, `/json`, `/metrics`, the
//! console), and, when asked for, the reference's Prometheus port and its debug port. Each
//! accepts through the transport within the HTTP connection bounds, on its own bound.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::compose::Components;
use super::error::ServerError;
use super::options::{Bounds, RunOptions};
use super::stop::stopped;
use crate::http::{self, AdminState, Readiness};
use crate::service::Decider;
use crate::transport::Port;
use crate::transport::{Acceptor, CountAdminCalls, PeerAddr};

/// Serves the admin port on `listener` (none: a task that only ends with the server, which
/// keeps the shutdown logic one) until `stop` says true and its requests have drained.
pub(super) fn spawn(
    listener: Option<TcpListener>,
    decider: Arc<Decider>,
    serving: Arc<Readiness>,
    options: &RunOptions,
    stop: watch::Receiver<bool>,
) -> JoinHandle<Result<(), ServerError>> {
    let Some(listener) = listener else {
        return tokio::spawn(async move {
            stopped(stop).await;
            Ok(())
        });
    };
    let admin = http::router(AdminState {
        decider,
        serving,
        json_endpoint: options.json_endpoint,
        console: options.console.clone(),
    });
    let acceptor = Acceptor::new(
        listener,
        options.bounds.http,
        Port::Http,
        options.transport.clone(),
    );
    // With the peer's address: the console logs who changed a bucket. Each request counts as
    // a call on its connection: busy connections never make way for new ones.
    let server = axum::serve(
        acceptor,
        CountAdminCalls(admin.into_make_service_with_connect_info::<PeerAddr>()),
    )
    .with_graceful_shutdown(stopped(stop));
    tokio::spawn(async move { server.await.map_err(ServerError::Http) })
}

/// Binds and serves the reference's Prometheus series when asked to, within the HTTP port's
/// connection bounds. The task lives as long as the process: a scrape is read-only and
/// needs no draining.
pub(super) async fn serve_reference_prometheus(
    components: &Components,
    bounds: &Bounds,
) -> Result<(), ServerError> {
    let Some(prom) = components.settings.statsd.reference_prometheus() else {
        return Ok(());
    };
    let metrics = components.decider.metrics();
    let Some(stats) = metrics.reference_stats() else {
        return Ok(());
    };
    let listener = TcpListener::bind(prom.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: prom.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServerError::Http)?;
    let router =
        http::reference_prometheus_router(Arc::clone(stats), &prom.path, prom.response_time_ms);
    let acceptor = Acceptor::new(
        listener,
        bounds.http,
        Port::Prometheus,
        components.transport.clone(),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(acceptor, CountAdminCalls(router)).await {
            tracing::error!(error = %e, "the reference's Prometheus listener failed");
        }
    });
    tracing::info!(%addr, path = %prom.path, "serving the reference's Prometheus series");
    Ok(())
}

/// Binds and serves the reference's debug port when asked to (`--debug-addr`), within the
/// HTTP port's connection bounds; like the Prometheus one, it lives as long as the process.
pub(super) async fn serve_debug(
    components: &Components,
    bounds: &Bounds,
) -> Result<(), ServerError> {
    let Some(addr) = components.settings.statsd.debug_addr else {
        return Ok(());
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(ServerError::Http)?;
    let router = http::debug_router(Arc::clone(&components.decider));
    let acceptor = Acceptor::new(
        listener,
        bounds.http,
        Port::Debug,
        components.transport.clone(),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(acceptor, CountAdminCalls(router)).await {
            tracing::error!(error = %e, "the debug listener failed");
        }
    });
    tracing::info!(addr = %bound, "serving the debug port (/rlconfig, /stats)");
    Ok(())
}
