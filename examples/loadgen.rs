//! A small load generator for floodgate's `ShouldRateLimit`, used by `bench/run.sh` where
//! h2load cannot go: h2load repeats one request body, so every request hits the same
//! buckets, while this client spreads descriptor values over many keys, uniformly or skewed.
//!
//! ```text
//! cargo run --release --example loadgen -- --addr http://127.0.0.1:8081 --domain bench \
//!     --connections 16 --streams 8 --keys 1000000 --distribution zipf --descriptors 1 \
//!     --duration 10 --warmup 2
//! ```
//!
//! - **Closed loop** (default): `connections` HTTP/2 connections × `streams` concurrent
//!   requests on each; a new request leaves as soon as one is answered. Latency is measured
//!   from send to answer.
//! - **Open loop** (`--rps R`): requests leave on a fixed schedule (R per second in all,
//!   spread over the connections) whether or not earlier ones were answered, and latency is
//!   measured from the scheduled time, so a stall shows up in the percentiles instead of
//!   silently slowing the sender (no coordinated omission).
//!
//! Descriptor `i` of a request is the single entry `(k<i>, <n>)`, `n` drawn per descriptor
//! from `0..keys`: uniformly, Zipf-like (`P(n) ∝ 1 / (n + 1)^s`, `--zipf-s`, default 1.0),
//! or `sequential` (0, 1, 2, … across all connections: with `--total keys`, every key once,
//! which is how the bench fills a store with a million buckets). Only requests sent after the
//! warm-up count; `--total N` stops after N requests. The result is one JSON line on stdout
//! (requests, req/s, p50/p99/p999 in ms of all answers, `p50_ok_ms`/`p99_ok_ms` of the OK
//! answers alone, answers by code, errors by gRPC code); a readable summary goes to stderr.
//! `--grpc-timeout-ms` sends each request with a deadline (`grpc-timeout`), as Envoy does.
//!
//! **The client is made to cost little**: it shares the machine with the server it measures,
//! so every µs it spends per request is taken from that server. It speaks gRPC over the `h2`
//! crate directly, one task per request in flight writing its stream and reading its answer
//! (HEADERS, one DATA frame, trailers), with no tower `Buffer` task or hyper dispatch task in
//! between as tonic's `Channel` has, and allocates with mimalloc. Cleartext (`http://`) only.
//! A failed call is counted by the gRPC code tonic would give it: the `grpc-status` of the
//! answer; a stream reset or a connection lost maps as tonic maps them (REFUSED_STREAM and a
//! broken connection: Unavailable).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use clap::{Parser, ValueEnum};
use floodgate::proto::common::RateLimitDescriptor;
use floodgate::proto::common::rate_limit_descriptor::Entry;
use floodgate::proto::rls::rate_limit_response::Code;
use floodgate::proto::rls::{RateLimitRequest, RateLimitResponse};
use mimalloc::MiMalloc;
use prost::Message;
use tonic::Code as GrpcCode;

/// mimalloc, as the servers it drives use (glibc's allocator cost the client about 15 % of
/// its CPU per request).
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Command line.
#[derive(Parser, Debug, Clone)]
#[command(about = "Load generator for floodgate's ShouldRateLimit (RLS v3)")]
struct Args {
    /// gRPC endpoint.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    addr: String,
    /// Rate-limit domain of every request.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Concurrent requests per connection (closed loop).
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// Open loop: requests per second in all, instead of the closed loop.
    #[arg(long)]
    rps: Option<f64>,
    /// Distinct values each descriptor's entry takes.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// How values are drawn from `0..keys`.
    #[arg(long, value_enum, default_value_t = Distribution::Uniform)]
    distribution: Distribution,
    /// Exponent of the Zipf-like distribution.
    #[arg(long, default_value_t = 1.0)]
    zipf_s: f64,
    /// Descriptors per request (descriptor i is the entry `k<i>`).
    #[arg(long, default_value_t = 1)]
    descriptors: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up, not measured.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Runtime worker threads of the load generator (h2load in bench/run.sh uses one).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Stop after this many requests (warm-up included), or at the end of the duration.
    #[arg(long)]
    total: Option<u64>,
    /// Seed of the value generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Send each request with this deadline (`grpc-timeout`, as Envoy sends its filter's
    /// timeout); none by default.
    #[arg(long)]
    grpc_timeout_ms: Option<u64>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Distribution {
    Uniform,
    Zipf,
    Sequential,
}

/// xorshift64*: fast and good enough to spread keys; no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Draws key numbers: uniform, from the Zipf-like CDF by binary search, or the next number.
enum Sampler {
    Uniform(u64),
    Zipf(Vec<f64>),
    Sequential(u64, AtomicU64),
}

impl Sampler {
    fn new(args: &Args) -> Sampler {
        let keys = args.keys.max(1);
        match args.distribution {
            Distribution::Uniform => Sampler::Uniform(keys),
            Distribution::Sequential => Sampler::Sequential(keys, AtomicU64::new(0)),
            Distribution::Zipf => {
                let mut cdf = Vec::with_capacity(keys as usize);
                let mut sum = 0.0;
                for n in 0..keys {
                    sum += 1.0 / ((n + 1) as f64).powf(args.zipf_s);
                    cdf.push(sum);
                }
                for p in &mut cdf {
                    *p /= sum;
                }
                Sampler::Zipf(cdf)
            }
        }
    }

    fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Sampler::Uniform(keys) => rng.next_u64() % keys,
            Sampler::Zipf(cdf) => {
                let u = rng.unit();
                cdf.partition_point(|&p| p < u).min(cdf.len() - 1) as u64
            }
            Sampler::Sequential(keys, next) => next.fetch_add(1, Ordering::Relaxed) % keys,
        }
    }
}

/// What one worker saw after the warm-up.
#[derive(Default)]
struct Tally {
    /// Latency of every answered or failed request, µs.
    latencies_us: Vec<u32>,
    /// Latency of the OK answers alone, µs: what a client admitted waited (a shed answer
    /// comes fast and would hide it among all answers).
    ok_latencies_us: Vec<u32>,
    /// Answers by overall code.
    answers: BTreeMap<&'static str, u64>,
    /// Failures by gRPC code.
    errors: BTreeMap<String, u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.ok_latencies_us.extend(other.ok_latencies_us);
        for (k, v) in other.answers {
            *self.answers.entry(k).or_default() += v;
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }
}

fn request(args: &Args, sampler: &Sampler, rng: &mut Rng) -> RateLimitRequest {
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: (0..args.descriptors)
            .map(|i| RateLimitDescriptor {
                entries: vec![Entry {
                    key: format!("k{i}").into(),
                    value: sampler.sample(rng).to_string().into(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Sends one request and counts it if it was sent at or after `measured_from`; latency is
/// taken from `scheduled` (the send time in the closed loop, the planned time when open).
async fn one(
    client: &mut Client,
    request: RateLimitRequest,
    scheduled: Instant,
    run: &Run,
    tally: &mut Tally,
) {
    let result = client
        .should_rate_limit(&request, run.args.grpc_timeout_ms)
        .await;
    if scheduled < run.measured_from {
        return;
    }
    let micros = u32::try_from(scheduled.elapsed().as_micros()).unwrap_or(u32::MAX);
    tally.latencies_us.push(micros);
    match result {
        Ok(response) => {
            let code = match response.overall_code() {
                Code::Ok => {
                    tally.ok_latencies_us.push(micros);
                    "ok"
                }
                Code::OverLimit => "over_limit",
                Code::Unknown => "unknown",
            };
            *tally.answers.entry(code).or_default() += 1;
        }
        Err(code) => {
            *tally.errors.entry(format!("{code:?}")).or_default() += 1;
        }
    }
}

/// Requests left to send under `--total` (shared by every worker).
struct Budget(Option<AtomicU64>);

impl Budget {
    /// Takes one request from the budget; false once it is spent.
    fn take(&self) -> bool {
        self.0.as_ref().is_none_or(|left| {
            left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        })
    }
}

/// The path of the one method called.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// One HTTP/2 connection, shared by the requests sent on it (each clone is a handle to it).
#[derive(Clone)]
struct Client {
    send: h2::client::SendRequest<Bytes>,
    uri: http::Uri,
}

impl Client {
    /// Connects to `addr` (`http://host:port`) with TCP_NODELAY, as tonic's `Endpoint` was
    /// told to, and drives the connection in a task of its own.
    async fn connect(addr: &str) -> Result<Client, Box<dyn std::error::Error>> {
        let uri: http::Uri =
            format!("{}{SHOULD_RATE_LIMIT}", addr.trim_end_matches('/')).parse()?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{addr}: only http:// (cleartext HTTP/2) is supported").into());
        }
        let authority = uri
            .authority()
            .ok_or("the address has no host:port")?
            .as_str();
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(tcp).await?;
        tokio::spawn(async move {
            // Its end (the run's, or the server's GOAWAY) fails the calls still on it.
            let _ = connection.await;
        });
        Ok(Client { send, uri })
    }

    /// One ShouldRateLimit call: the request framed as gRPC (uncompressed), then the answer's
    /// message, or the code the call failed with.
    async fn should_rate_limit(
        &mut self,
        request: &RateLimitRequest,
        timeout_ms: Option<u64>,
    ) -> Result<RateLimitResponse, GrpcCode> {
        let length = request.encoded_len();
        let mut framed = BytesMut::with_capacity(5 + length);
        framed.put_u8(0);
        framed.put_u32(u32::try_from(length).map_err(|_| GrpcCode::ResourceExhausted)?);
        request
            .encode(&mut framed)
            .map_err(|_| GrpcCode::Internal)?;
        let mut head = http::Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        if let Some(ms) = timeout_ms {
            head = head.header("grpc-timeout", grpc_timeout(ms));
        }
        let head = head.body(()).map_err(|_| GrpcCode::Internal)?;
        std::future::poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(h2_code)?;
        let (answer, mut body) = self.send.send_request(head, false).map_err(h2_code)?;
        body.send_data(framed.freeze(), true).map_err(h2_code)?;
        let (head, mut body) = answer.await.map_err(h2_code)?.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(http_code(head.status));
        }
        // Trailers-only: an error answered before any message.
        if let Some(code) = grpc_status(&head.headers) {
            return Err(if code == GrpcCode::Ok {
                GrpcCode::Internal
            } else {
                code
            });
        }
        let mut message = BytesMut::new();
        while let Some(data) = body.data().await {
            let data = data.map_err(h2_code)?;
            // Given back at once, so that the connection's window never closes.
            let _ = body.flow_control().release_capacity(data.len());
            message.extend_from_slice(&data);
        }
        let trailers = body.trailers().await.map_err(h2_code)?;
        match trailers.as_ref().and_then(grpc_status) {
            Some(GrpcCode::Ok) => {}
            Some(code) => return Err(code),
            None => return Err(GrpcCode::Internal),
        }
        // One message: no compression flag, its length, then the message.
        if message.len() < 5 || message[0] != 0 {
            return Err(GrpcCode::Internal);
        }
        let length = u32::from_be_bytes([message[1], message[2], message[3], message[4]]);
        let end = 5 + length as usize;
        if message.len() != end {
            return Err(GrpcCode::Internal);
        }
        RateLimitResponse::decode(&message[5..end]).map_err(|_| GrpcCode::Internal)
    }
}

/// A deadline of `ms` milliseconds as `grpc-timeout` states it: at most 8 digits, so in
/// seconds past 99,999,999 ms (and at most 99,999,999 s).
fn grpc_timeout(ms: u64) -> String {
    if ms <= 99_999_999 {
        format!("{ms}m")
    } else {
        format!("{}S", (ms / 1000).min(99_999_999))
    }
}

/// The `grpc-status` in `headers` (the trailers, or a trailers-only answer's headers).
fn grpc_status(headers: &http::HeaderMap) -> Option<GrpcCode> {
    let status = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(GrpcCode::from(status))
}

/// The code tonic gives a call that failed in HTTP/2: a stream reset by its reason, a
/// connection lost or refused as Unavailable.
fn h2_code(error: h2::Error) -> GrpcCode {
    match error.reason() {
        Some(h2::Reason::CANCEL) => GrpcCode::Cancelled,
        Some(h2::Reason::REFUSED_STREAM) => GrpcCode::Unavailable,
        Some(h2::Reason::ENHANCE_YOUR_CALM) => GrpcCode::ResourceExhausted,
        Some(h2::Reason::INADEQUATE_SECURITY) => GrpcCode::PermissionDenied,
        Some(_) if !error.is_go_away() && !error.is_io() => GrpcCode::Internal,
        _ => GrpcCode::Unavailable,
    }
}

/// The code gRPC gives an answer with HTTP status `status` instead of 200.
fn http_code(status: http::StatusCode) -> GrpcCode {
    match status.as_u16() {
        400 => GrpcCode::Internal,
        401 => GrpcCode::Unauthenticated,
        403 => GrpcCode::PermissionDenied,
        404 => GrpcCode::Unimplemented,
        429 | 502..=504 => GrpcCode::Unavailable,
        _ => GrpcCode::Unknown,
    }
}

/// What every worker shares.
struct Run {
    args: Args,
    sampler: Sampler,
    budget: Budget,
    /// Requests sent before this are warm-up.
    measured_from: Instant,
    /// No request is sent from this time on.
    end: Instant,
}

/// Closed loop: one request at a time, back to back, until the end.
async fn closed_worker(run: Arc<Run>, mut client: Client, seed: u64) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    while Instant::now() < run.end && run.budget.take() {
        let request = request(&run.args, &run.sampler, &mut rng);
        let sent = Instant::now();
        one(&mut client, request, sent, &run, &mut tally).await;
    }
    tally
}

/// Open loop on one connection: a request every `interval`, each in its own task.
async fn open_worker(run: Arc<Run>, client: Client, seed: u64, interval: Duration) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let mut tasks = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval_at(start, interval);
    // Late ticks fire at once, so the schedule (and the latency it measures) holds.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut n: u32 = 0;
    loop {
        ticker.tick().await;
        let scheduled = start.into_std() + interval * n;
        n += 1;
        if scheduled >= run.end || !run.budget.take() {
            break;
        }
        let request = request(&run.args, &run.sampler, &mut rng);
        let mut client = client.clone();
        let run = run.clone();
        tasks.spawn(async move {
            let mut tally = Tally::default();
            one(&mut client, request, scheduled, &run, &mut tally).await;
            tally
        });
        // Reap finished tasks as we go so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            tally.merge(done.expect("request task panicked"));
        }
    }
    while let Some(done) = tasks.join_next().await {
        tally.merge(done.expect("request task panicked"));
    }
    tally
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    f64::from(sorted[i]) / 1000.0
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut clients = Vec::with_capacity(args.connections);
    for _ in 0..args.connections.max(1) {
        clients.push(Client::connect(&args.addr).await?);
    }
    let measured_from = Instant::now() + Duration::from_secs_f64(args.warmup);
    let run = Arc::new(Run {
        sampler: Sampler::new(&args),
        budget: Budget(args.total.map(AtomicU64::new)),
        measured_from,
        end: measured_from + Duration::from_secs_f64(args.duration),
        args,
    });
    let args = &run.args;
    let mut workers = tokio::task::JoinSet::new();
    for (c, client) in clients.into_iter().enumerate() {
        let seed = args.seed ^ ((c as u64) << 32);
        match args.rps {
            Some(rps) => {
                let per_connection = rps / args.connections.max(1) as f64;
                let interval = Duration::from_secs_f64(1.0 / per_connection.max(1e-3));
                workers.spawn(open_worker(run.clone(), client, seed, interval));
            }
            None => {
                for s in 0..args.streams.max(1) {
                    workers.spawn(closed_worker(run.clone(), client.clone(), seed | s as u64));
                }
            }
        }
    }
    let mut tally = Tally::default();
    while let Some(done) = workers.join_next().await {
        tally.merge(done?);
    }
    // Requests sent in the measured window, over the window (the last answers may land a
    // little after its end), or over the time they took when `--total` ended the run early.
    let seconds = measured_from.elapsed().as_secs_f64().min(args.duration);
    tally.latencies_us.sort_unstable();
    tally.ok_latencies_us.sort_unstable();
    let requests = tally.latencies_us.len();
    let errors: u64 = tally.errors.values().sum();
    let (p50, p99, p999) = (
        percentile(&tally.latencies_us, 0.50),
        percentile(&tally.latencies_us, 0.99),
        percentile(&tally.latencies_us, 0.999),
    );
    let answers = serde_json::to_value(&tally.answers)?;
    let by_code = serde_json::to_value(&tally.errors)?;
    let line = serde_json::json!({
        "requests": requests,
        "seconds": seconds,
        "rps": requests as f64 / seconds,
        "p50_ms": p50,
        "p99_ms": p99,
        "p999_ms": p999,
        "p50_ok_ms": percentile(&tally.ok_latencies_us, 0.50),
        "p99_ok_ms": percentile(&tally.ok_latencies_us, 0.99),
        "answers": answers,
        "errors": errors,
        "errors_by_code": by_code,
        "keys": args.keys,
        "distribution": format!("{:?}", args.distribution).to_lowercase(),
        "descriptors": args.descriptors,
        "mode": if args.rps.is_some() { "open" } else { "closed" },
    });
    println!("{line}");
    eprintln!(
        "{requests} requests in {seconds} s: {:.0} req/s, p50 {p50:.2} ms, p99 {p99:.2} ms, \
         p999 {p999:.2} ms, {errors} errors {:?}, answers {:?}",
        requests as f64 / seconds,
        tally.errors,
        tally.answers
    );
    Ok(())
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("cannot start the runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("loadgen: {e}");
        std::process::exit(1);
    }
}
