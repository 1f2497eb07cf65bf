//! The floor: a benchmark server, not a feature. It answers every `ShouldRateLimit` with a
//! fixed OK, on the same stack as floodgate, so that what floodgate costs per request above
//! it is what floodgate itself does (decode the plan, ask the store, count, answer) and not
//! what any server on tonic, hyper and h2 costs. `bench/side_by_side.sh` prints floodgate's
//! CPU per request over the floor's, and `bench/envoy_path.sh` has Envoy's rate-limit filter
//! ask it, as the best any RLS server on this stack could do.
//!
//! ```text
//! cargo build --profile production --example floor
//! target/production/examples/floor --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0
//! # floor: grpc 127.0.0.1:40123 http 127.0.0.1:40124 threads 2
//! ```
//!
//! What it shares with `floodgate serve`:
//! - **Threads**: `floodgate::runtime`'s layout. One single-threaded runtime per gRPC thread
//!   (`--grpc-threads`, or one per available CPU when 0), each with its own `SO_REUSEPORT`
//!   listener on the gRPC address (`floodgate::transport::TcpListeners`); the first runs on the
//!   main runtime, which also serves the HTTP port. Each runtime runs the same host probe.
//! - **Sockets**: every accepted gRPC connection has `TCP_NODELAY`, as floodgate's acceptor
//!   sets it.
//! - **tonic**: the server builder with floodgate's defaults (100 concurrent streams per
//!   connection, a 5 s request timeout, keepalive pings every 20 s with a 10 s timeout), and
//!   `ShouldRateLimit` answered by a tower layer in front of tonic's router with tonic's own
//!   `Grpc::unary` and floodgate's codec (`floodgate::admission::RequestCodec`), as
//!   floodgate's admission layer answers it: one boxed future per call, no router on the way.
//!   Other paths go to the router, which serves `grpc.health.v1` alone.
//! - **Allocator**: mimalloc, floodgate's global allocator.
//!
//! What it leaves out, by design: connection bounds and their per-connection timer, the
//! `--max-in-flight` and bytes budgets, the deadline, the plan, the store, per-rule metrics.
//!
//! The answer: `overall_code: OK` and one status per request descriptor. With `--statuses
//! limited` (the default) each status is what floodgate answers for an OK descriptor under
//! the benches' limits (10^6 per second: `current_limit`, `limit_remaining`,
//! `duration_until_reset`); with `--statuses bare` it is `{code: OK}` alone, as floodgate
//! answers a descriptor no limit matches (the no-store rows).
//!
//! The HTTP port serves `GET /healthcheck` (`OK`) and `GET /metrics`, whose one series,
//! `floodgate_requests_total{result="ok"}`, counts the answers as floodgate's own series of
//! that name does, so the benches count OK answers from either server the same way. The
//! bound addresses are printed on stdout as one line once both ports listen (port 0 picks
//! free ports).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use floodgate::admission::RequestCodec;
use floodgate::proto::rls::rate_limit_response::rate_limit::Unit;
use floodgate::proto::rls::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use floodgate::transport::TcpListeners;
use mimalloc::MiMalloc;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;
use tonic::codegen::{Body, StdError};
use tower::{Layer, Service};

/// floodgate's allocator: the floor's allocations cost what floodgate's do.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// The one path the floor answers itself.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The benches' limit, stated in each `limited` status: 10^6 per second.
const REQUESTS_PER_SECOND: u32 = 1_000_000;

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "The floor: a fixed-OK ShouldRateLimit server on floodgate's stack")]
struct Args {
    /// gRPC address (port 0: a free port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// HTTP address of /healthcheck and /metrics (port 0: a free port, printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Threads serving gRPC, as floodgate's flag: 0 is one per available CPU.
    #[arg(long, default_value_t = 0)]
    grpc_threads: u16,
    /// What each descriptor's status states.
    #[arg(long, value_enum, default_value_t = Statuses::Limited)]
    statuses: Statuses,
}

/// See the module comment.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Statuses {
    /// `{code: OK}`, as for a descriptor no limit matches.
    Bare,
    /// OK under a limit of 10^6 per second, as for a descriptor within the benches' limits.
    Limited,
}

/// The fixed answer and the count of answers given.
struct Answers {
    statuses: Statuses,
    ok: AtomicU64,
}

impl Answers {
    /// OK, with one status per descriptor of `request`; counted.
    fn answer(&self, request: &RateLimitRequest) -> RateLimitResponse {
        let status = match self.statuses {
            Statuses::Bare => DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            },
            Statuses::Limited => DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: REQUESTS_PER_SECOND,
                    unit: Unit::Second as i32,
                }),
                limit_remaining: REQUESTS_PER_SECOND - 1,
                duration_until_reset: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                quota: None,
            },
        };
        self.ok.fetch_add(1, Ordering::Relaxed);
        RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![status; request.descriptors.len()],
            ..Default::default()
        }
    }
}

/// Answers ShouldRateLimit in front of tonic's router (see [`Floor`]).
#[derive(Clone)]
struct FloorLayer(Arc<Answers>);

impl<S> Layer<S> for FloorLayer {
    type Service = Floor<S>;

    fn layer(&self, inner: S) -> Floor<S> {
        Floor {
            inner,
            answers: Arc::clone(&self.0),
        }
    }
}

/// A ShouldRateLimit call is decoded, answered and encoded here by tonic's `Grpc::unary`, as
/// floodgate's admission layer does it; any other call goes on to the router.
#[derive(Clone)]
struct Floor<S> {
    inner: S,
    answers: Arc<Answers>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Floor<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<tonic::body::Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == SHOULD_RATE_LIMIT {
            let answers = Arc::clone(&self.answers);
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(RequestCodec::default());
                Ok(grpc.unary(Fixed(answers), request).await)
            });
        }
        // The service that was polled ready serves this call; the clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(inner.call(request))
    }
}

/// The unary handler: the fixed answer, ready at once.
struct Fixed(Arc<Answers>);

impl Service<tonic::Request<RateLimitRequest>> for Fixed {
    type Response = tonic::Response<RateLimitResponse>;
    type Error = Status;
    type Future = std::future::Ready<Result<tonic::Response<RateLimitResponse>, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(self.0.answer(request.get_ref()))))
    }
}

/// The gRPC server of one thread, built as floodgate's `server::grpc::router` builds its own
/// (its default bounds and keepalive).
fn grpc_server(
    answers: &Arc<Answers>,
) -> tonic::transport::server::Router<
    tower::layer::util::Stack<FloorLayer, tower::layer::util::Identity>,
> {
    let (_, health) = tonic_health::server::health_reporter();
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(100))
        .timeout(Duration::from_secs(5))
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .layer(FloorLayer(Arc::clone(answers)))
        .add_service(health)
}

/// Serves gRPC on `listener` (on the calling thread's runtime) until the process ends.
async fn serve_grpc(answers: Arc<Answers>, listener: TcpListener) -> Result<(), StdError> {
    let incoming = TcpListenerStream::new(listener).map(|stream| {
        stream.inspect(|s| {
            // floodgate's acceptor does the same: many small answers, each sent at once.
            let _ = s.set_nodelay(true);
        })
    });
    grpc_server(&answers).serve_with_incoming(incoming).await?;
    Ok(())
}

/// `GET /metrics`: the OK answers, as floodgate's series of the same name counts them.
async fn metrics(answers: Arc<Answers>) -> String {
    format!(
        "# TYPE floodgate_requests_total counter\nfloodgate_requests_total{{result=\"ok\"}} {}\n",
        answers.ok.load(Ordering::Relaxed)
    )
}

async fn serve(args: Args) -> Result<(), StdError> {
    let threads = match args.grpc_threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => usize::from(n),
    };
    let answers = Arc::new(Answers {
        statuses: args.statuses,
        ok: AtomicU64::new(0),
    });
    let TcpListeners { primary, extra } = TcpListeners::bind(args.grpc_addr, threads).await?;
    let grpc_addr = primary.local_addr()?;
    let http = TcpListener::bind(args.http_addr).await?;
    let http_addr = http.local_addr()?;
    for (index, listener) in extra.into_iter().enumerate() {
        let answers = Arc::clone(&answers);
        // Detached: the threads serve until the process ends.
        floodgate::runtime::spawn_runtime_thread(
            format!("floor-grpc-{}", index + 1),
            move || async move {
                let served = match TcpListener::from_std(listener) {
                    Ok(listener) => serve_grpc(answers, listener).await,
                    Err(e) => Err(e.into()),
                };
                if let Err(e) = served {
                    eprintln!("floor: a gRPC thread stopped: {e}");
                    std::process::exit(1);
                }
            },
        )?;
    }
    let admin = {
        let answers = Arc::clone(&answers);
        axum::Router::new()
            .route("/healthcheck", axum::routing::get(|| async { "OK" }))
            .route(
                "/metrics",
                axum::routing::get(move || metrics(Arc::clone(&answers))),
            )
    };
    println!("floor: grpc {grpc_addr} http {http_addr} threads {threads}");
    let grpc = serve_grpc(answers, primary);
    let http = async move {
        axum::serve(http, admin).await?;
        Ok::<(), StdError>(())
    };
    tokio::try_join!(grpc, http)?;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match floodgate::runtime::main_runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("floor: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::FAILURE
        }
    }
}
