//! Concurrent load for fault tests: worker tasks loop ShouldRateLimit, each on its own
//! connection, recording every outcome with when it started and how long it took, so a test
//! can judge each request by the phase (normal, outage, recovered) it was sent in.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use floodgate::proto::rls::RateLimitRequest;
use floodgate::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// How long a wait for progress may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(30);

/// One request's fate.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The worker that sent it.
    pub worker: usize,
    /// When it was sent.
    pub started: Instant,
    /// How long until its answer or error.
    pub latency: Duration,
    /// The overall code (1 OK, 2 OVER_LIMIT), or the gRPC error code.
    pub result: Result<i32, tonic::Code>,
    /// The first status's `current_limit.requests_per_unit`, when it has one.
    pub limit: Option<u32>,
}

impl Outcome {
    /// When the answer (or error) arrived.
    pub fn ended(&self) -> Instant {
        self.started + self.latency
    }

    /// Answered OK.
    pub fn is_ok(&self) -> bool {
        self.result == Ok(1)
    }
}

/// Running workers.
pub struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    /// Per worker: when its outstanding request was sent, in ns after `base` plus 1; 0 while
    /// it has none.
    pending: Arc<Vec<AtomicU64>>,
    base: Instant,
    /// Workers send only while this is true.
    gate: tokio::sync::watch::Sender<bool>,
    workers: Vec<JoinHandle<Vec<Outcome>>>,
}

impl Load {
    /// Starts `workers` tasks against `addr`; worker `w` sends `request(w, i)` as its `i`-th
    /// request, the next one as soon as the previous is answered (closed loop).
    pub async fn start(
        addr: SocketAddr,
        workers: usize,
        request: impl Fn(usize, u64) -> RateLimitRequest + Send + Sync + 'static,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let request = Arc::new(request);
        let pending: Arc<Vec<AtomicU64>> =
            Arc::new((0..workers).map(|_| AtomicU64::new(0)).collect());
        let base = Instant::now();
        let gate = tokio::sync::watch::Sender::new(true);
        let mut handles = Vec::new();
        for worker in 0..workers {
            // One connection per worker: a channel is one HTTP/2 connection.
            let channel = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = RateLimitServiceClient::new(channel);
            let (stop, answered, request) = (stop.clone(), answered.clone(), request.clone());
            let pending = pending.clone();
            let mut open = gate.subscribe();
            handles.push(tokio::spawn(async move {
                let mut outcomes = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    // Never closed while the Load lives: the sender is in it.
                    let _ = open.wait_for(|open| *open).await;
                    let message = request(worker, i);
                    let started = Instant::now();
                    let since = started.duration_since(base).as_nanos() as u64 + 1;
                    pending[worker].store(since, Ordering::SeqCst);
                    let result = client.should_rate_limit(message).await;
                    let latency = started.elapsed();
                    pending[worker].store(0, Ordering::SeqCst);
                    let (result, limit) = match result {
                        Ok(response) => {
                            let response = response.into_inner();
                            let limit = response
                                .statuses
                                .first()
                                .and_then(|s| s.current_limit.as_ref())
                                .map(|l| l.requests_per_unit);
                            (Ok(response.overall_code), limit)
                        }
                        Err(status) => (Err(status.code()), None),
                    };
                    outcomes.push(Outcome {
                        worker,
                        started,
                        latency,
                        result,
                        limit,
                    });
                    answered.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                    // A refused connection fails in µs: let the test's own tasks run.
                    tokio::task::yield_now().await;
                }
                outcomes
            }));
        }
        Load {
            stop,
            answered,
            pending,
            base,
            gate,
            workers: handles,
        }
    }

    /// Requests answered (or failed) so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }

    /// Workers send no new request until [`Load::resume`]; returns once none is outstanding.
    pub async fn hold(&self) {
        self.gate.send_replace(false);
        let deadline = Instant::now() + DEADLINE;
        while self.pending.iter().any(|p| p.load(Ordering::SeqCst) != 0) {
            assert!(Instant::now() < deadline, "a request never ended");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Workers send again.
    pub fn resume(&self) {
        self.gate.send_replace(true);
    }

    /// True when every worker has a request outstanding that it sent at or after `t`.
    pub fn all_pending_since(&self, t: Instant) -> bool {
        let since = t.saturating_duration_since(self.base).as_nanos() as u64 + 1;
        self.pending
            .iter()
            .all(|p| p.load(Ordering::SeqCst) >= since)
    }

    /// Waits until `n` more requests have been answered (or failed) than now.
    pub async fn until_answered(&self, n: u64) {
        let target = self.answered() + n;
        let deadline = Instant::now() + DEADLINE;
        while self.answered() < target {
            assert!(
                Instant::now() < deadline,
                "load stalled at {} answers, waiting for {target}",
                self.answered()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the workers and returns every outcome, in the order they were sent.
    pub async fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        self.resume();
        let mut all = Vec::new();
        for worker in self.workers {
            all.extend(worker.await.unwrap());
        }
        all.sort_by_key(|o| o.started);
        all
    }
}

/// The outcomes sent at or after `from` and answered by `to`.
pub fn within(outcomes: &[Outcome], from: Instant, to: Instant) -> Vec<&Outcome> {
    outcomes
        .iter()
        .filter(|o| o.started >= from && o.ended() <= to)
        .collect()
}

/// Latency figures of `outcomes` in ms: (p99, max); zeros when empty.
pub fn latency_ms<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> (f64, f64) {
    let mut ms: Vec<f64> = outcomes
        .into_iter()
        .map(|o| o.latency.as_secs_f64() * 1e3)
        .collect();
    if ms.is_empty() {
        return (0.0, 0.0);
    }
    ms.sort_by(f64::total_cmp);
    let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
    (p99, ms[ms.len() - 1])
}

/// Prints one machine-readable line for scripts/reliability.sh: `RELIABILITY {json}`.
pub fn report(figures: serde_json::Value) {
    println!("RELIABILITY {figures}");
}

/// Milliseconds between two instants, for reports.
pub fn ms(from: Instant, to: Instant) -> f64 {
    (to.saturating_duration_since(from).as_secs_f64() * 1e4).round() / 10.0
}
