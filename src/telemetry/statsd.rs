//! The reference server's statsd stats: the same names, counted the same way, sent the same
//! way (the reference's `lyft/gostats` store and sink, or its dogstatsd sink).
//!
//! Recording ([`Stats`]) only touches atomics: a counter is found under a shared read lock
//! (a write lock only the first time a name is seen) and added to; a timer sample goes into a
//! bounded channel with `try_send`. Nothing on the request path waits for the network. A
//! background task ([`Stats::start`]) does what gostats does:
//!
//! - every flush interval (`STATS_FLUSH_INTERVAL`, 10 s in the reference), each counter that
//!   moved is sent as its delta since the last flush (`name:delta|c`); counters that did not
//!   move send nothing;
//! - timer samples are sent as they come (gostats writes each one into its sink buffer, which
//!   its sink sends every second): here every second, `name:ms|ms`, whole milliseconds;
//! - lines go over TCP (gostats' default; `STATSD_PROTOCOL=udp` for UDP, in datagrams of at
//!   most 1432 bytes as gostats sends them), one connection, re-dialled with backoff when it
//!   breaks. While the host is gone the lines are dropped and counted
//!   (`floodgate_statsd_dropped_lines_total`), never queued without bound.
//!
//! Names: [`StatName`] holds every name the reference sends; rule paths are sanitized as the
//! reference's `SanitizeStatName` does (`:` and `|` to `_`, the dots of an IPv4 address to
//! `_`). `EXTRA_TAGS` are appended as gostats serializes tags (`.__key=value`, keys sorted),
//! or, with `USE_DOG_STATSD`, sent as dogstatsd tags (`|#key:value`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use sink::Sink;

pub mod mapper;
mod names;
pub mod prometheus;
mod sink;
pub use mapper::Mapper;
pub use names::{StatName, sanitize};

/// How lines reach the statsd host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One TCP connection (gostats' default).
    Tcp,
    /// UDP datagrams.
    Udp,
}

/// The wire dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Plain statsd, tags in the name (`name.__key=value:1|c`), as gostats' sink.
    Statsd,
    /// Datadog's, tags after the type (`name:1|c|#key:value`), as the reference's
    /// `USE_DOG_STATSD` sink.
    DogStatsd,
}

/// Where and how stats are sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsdConfig {
    /// `host:port`.
    pub addr: String,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Plain statsd or dogstatsd.
    pub flavor: Flavor,
    /// How often counters are sent.
    pub flush_interval: Duration,
    /// `EXTRA_TAGS`, sorted by key, values with `.`, `:` and `|` replaced by `_` (gostats).
    pub tags: Vec<(String, String)>,
}

/// Distinct rule and domain names kept; past it new ones are dropped (counted), so clients
/// sending ever new domains or `detailed_metric` values cannot grow memory without bound.
const MAX_NAMES: usize = 100_000;
/// Timer samples waiting for the next send; more are dropped (counted).
const TIMER_QUEUE: usize = 65_536;
/// How often timer samples are sent (gostats' sink ticker).
const TIMER_INTERVAL: Duration = Duration::from_secs(1);

/// The six counters of one rule path (the reference's `RateLimitStats`). Cumulative: the
/// statsd sink sends each one's delta since its last flush, the reference's Prometheus
/// exposition ([`prometheus`]) its total.
#[derive(Debug, Default)]
pub struct RuleCounters {
    /// The rule path, sanitized (the stat name between the scope and the counter's name).
    pub name: Box<str>,
    /// `total_hits`.
    pub total_hits: AtomicU64,
    /// `over_limit`.
    pub over_limit: AtomicU64,
    /// `near_limit`.
    pub near_limit: AtomicU64,
    /// `over_limit_with_local_cache`.
    pub over_limit_with_local_cache: AtomicU64,
    /// `within_limit`.
    pub within_limit: AtomicU64,
    /// `shadow_mode`.
    pub shadow_mode: AtomicU64,
    /// The values last sent to statsd, in [`RuleCounters::counters`] order.
    sent: [AtomicU64; 6],
}

impl RuleCounters {
    /// Each counter with its stat name's last segment.
    pub fn counters(&self) -> [(&'static str, &AtomicU64); 6] {
        [
            ("total_hits", &self.total_hits),
            ("over_limit", &self.over_limit),
            ("near_limit", &self.near_limit),
            (
                "over_limit_with_local_cache",
                &self.over_limit_with_local_cache,
            ),
            ("within_limit", &self.within_limit),
            ("shadow_mode", &self.shadow_mode),
        ]
    }
}

/// A cumulative count and the value last sent to statsd.
#[derive(Debug, Default)]
struct Tracked {
    value: AtomicU64,
    sent: AtomicU64,
}

impl Tracked {
    /// What moved since the last call (only the flush task calls it).
    fn delta(&self) -> u64 {
        let value = self.value.load(Ordering::Relaxed);
        value.saturating_sub(self.sent.swap(value, Ordering::Relaxed))
    }
}

/// Upper bounds, in whole milliseconds, that `response_time` samples are counted under:
/// every bound either default exposition needs (the statsd_exporter's default histogram
/// buckets, 5 ms to 10 s, and the same bounds read as milliseconds when
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` is set: samples are whole milliseconds, so
/// 0.005 to 2.5 are 0, 1 and 2). A mapping file's buckets add theirs
/// ([`Stats::with_mapper`]).
pub(crate) const RESPONSE_BOUNDS_MS: [u64; 14] = [
    0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000,
];

/// `ShouldRateLimit.response_time` samples as a histogram (what statsd_exporter makes of
/// the reference's timer), fine enough for every bucket the exposition serves.
#[derive(Debug)]
pub(crate) struct ResponseTimes {
    /// Upper bounds in whole milliseconds, increasing; the last is `u64::MAX`, so every
    /// sample is in a bucket.
    pub(crate) bounds: Box<[u64]>,
    /// Samples at most `bounds[i]` and above the previous bound.
    pub(crate) buckets: Box<[AtomicU64]>,
    /// Every sample.
    pub(crate) count: AtomicU64,
    /// Their sum, in milliseconds.
    pub(crate) sum_ms: AtomicU64,
}

impl ResponseTimes {
    /// Buckets at [`RESPONSE_BOUNDS_MS`] and at `extra`.
    fn new(extra: &[u64]) -> ResponseTimes {
        let mut bounds: Vec<u64> = RESPONSE_BOUNDS_MS
            .iter()
            .chain(extra)
            .copied()
            .chain([u64::MAX])
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        ResponseTimes {
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            bounds: bounds.into_boxed_slice(),
            count: AtomicU64::new(0),
            sum_ms: AtomicU64::new(0),
        }
    }

    fn observe(&self, ms: u64) {
        // The bounds end with u64::MAX: some bucket always holds the sample.
        let i = self.bounds.partition_point(|&le| le < ms);
        if let Some(bucket) = self.buckets.get(i) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Samples of at most `le_ms` milliseconds (exact when `le_ms` is one of the bounds).
    pub(crate) fn at_most(&self, le_ms: impl Fn(u64) -> bool) -> u64 {
        self.bounds
            .iter()
            .zip(self.buckets.iter())
            .filter(|&(&bound, _)| le_ms(bound))
            .map(|(_, n)| n.load(Ordering::Relaxed))
            .sum()
    }
}

/// Every stat being counted, and where samples wait to be sent.
#[derive(Debug)]
pub struct Stats {
    /// Where they are sent; `None` when they are only exposed ([`prometheus`]).
    config: Option<StatsdConfig>,
    /// Rule path (as planned, unsanitized) → its counters and sanitized name.
    rules: RwLock<HashMap<Arc<str>, Arc<RuleCounters>>>,
    /// Unknown domain (sanitized) → `domain_not_found`.
    domains: RwLock<HashMap<Box<str>, Arc<Tracked>>>,
    /// The fixed-name counters, by [`StatName`] index.
    fixed: [Tracked; StatName::COUNT],
    /// `ShouldRateLimit.response_time`, for the Prometheus exposition.
    response_times: ResponseTimes,
    /// The statsd_exporter mapping file (`PROMETHEUS_MAPPER_YAML`) the Prometheus
    /// exposition follows; `None`: the reference's default mapping.
    mapper: Option<Arc<Mapper>>,
    /// `ShouldRateLimit.response_time` samples, in milliseconds.
    timers: mpsc::Sender<u64>,
    /// Taken by [`Stats::start`].
    timer_rx: std::sync::Mutex<Option<mpsc::Receiver<u64>>>,
    /// Lines dropped (host gone, queue full, name cap), shared with `/metrics`.
    dropped: Counter,
    /// Stats read from their source at each flush (the Redis pool's), registered at
    /// start-up.
    sampled: std::sync::Mutex<Vec<Sampled>>,
}

/// How a sampled source is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    /// A cumulative count, sent as its delta since the last flush (`|c`), if not 0.
    Counter,
    /// A level, sent at every flush (`|g`), as gostats sends gauges.
    Gauge,
}

/// A stat whose value is read from its source at flush time.
struct Sampled {
    name: String,
    kind: Sample,
    read: Box<dyn Fn() -> u64 + Send + Sync>,
    /// The counter's value at the last flush.
    last: u64,
}

impl std::fmt::Debug for Sampled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sampled({}, {:?})", self.name, self.kind)
    }
}

impl Stats {
    /// Stats to be sent as `config` says (or only counted, for [`prometheus`], when `None`);
    /// `dropped` counts what could not be sent.
    pub fn new(config: Option<StatsdConfig>, dropped: Counter) -> Stats {
        let (timers, rx) = mpsc::channel(TIMER_QUEUE);
        Stats {
            config,
            rules: RwLock::default(),
            domains: RwLock::default(),
            fixed: std::array::from_fn(|_| Tracked::default()),
            response_times: ResponseTimes::new(&[]),
            mapper: None,
            timers,
            timer_rx: std::sync::Mutex::new(Some(rx)),
            dropped,
            sampled: std::sync::Mutex::default(),
        }
    }

    /// The same stats, exposed to Prometheus as `mapper` maps them instead of by the
    /// reference's default mapping; the response-time histogram gets every bucket the
    /// mapping's response-time series needs. Call before any sample is recorded.
    pub fn with_mapper(mut self, mapper: Arc<Mapper>) -> Stats {
        self.response_times = ResponseTimes::new(&prometheus::mapped_bounds_ms(&mapper));
        self.mapper = Some(mapper);
        self
    }

    /// Sends `name` at every flush with the value `read` returns then.
    pub fn sample(
        &self,
        name: impl Into<String>,
        kind: Sample,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        self.sampled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(Sampled {
                name: name.into(),
                kind,
                read: Box::new(read),
                last: 0,
            });
    }

    /// Adds `n` to a fixed-name counter.
    pub fn count(&self, name: StatName, n: u64) {
        self.fixed[name as usize]
            .value
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The counters of the rule path `rule` (`domain.key_value…`), created on first use;
    /// `None` past the name cap (the drop is counted).
    pub fn rule(&self, rule: &Arc<str>) -> Option<Arc<RuleCounters>> {
        if let Some(found) = read(&self.rules).get(rule) {
            return Some(Arc::clone(found));
        }
        let mut rules = write(&self.rules);
        if rules.len() >= MAX_NAMES && !rules.contains_key(rule) {
            self.dropped.inc();
            return None;
        }
        let entry = rules.entry(Arc::clone(rule)).or_insert_with(|| {
            Arc::new(RuleCounters {
                name: sanitize(rule).into_boxed_str(),
                ..RuleCounters::default()
            })
        });
        Some(Arc::clone(entry))
    }

    /// Counts `n` descriptors asked of `domain`, which no configuration has
    /// (`<domain>.domain_not_found`).
    pub fn domain_not_found(&self, domain: &str, n: u64) {
        let name = sanitize(domain);
        if let Some(found) = read(&self.domains).get(name.as_str()) {
            found.value.fetch_add(n, Ordering::Relaxed);
            return;
        }
        let mut domains = write(&self.domains);
        if domains.len() >= MAX_NAMES && !domains.contains_key(name.as_str()) {
            self.dropped.inc();
            return;
        }
        domains
            .entry(name.into_boxed_str())
            .or_default()
            .value
            .fetch_add(n, Ordering::Relaxed);
    }

    /// Records one `ShouldRateLimit` call: `total_requests`, and `response_time` in whole
    /// milliseconds (the reference truncates to milliseconds too).
    pub fn record_call(&self, elapsed: Duration) {
        self.count(StatName::TotalRequests, 1);
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.response_times.observe(ms);
        if self.config.is_some() && self.timers.try_send(ms).is_err() {
            self.dropped.inc();
        }
    }

    /// Starts the task that sends stats; call once, inside a Tokio runtime.
    pub fn start(self: &Arc<Stats>) {
        let Some(config) = &self.config else {
            return;
        };
        let (addr, protocol, interval) =
            (config.addr.clone(), config.protocol, config.flush_interval);
        let Some(timers) = self
            .timer_rx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let sink = Sink::new(addr, protocol);
        tokio::spawn(Arc::clone(self).run(sink, interval, timers));
    }

    async fn run(
        self: Arc<Stats>,
        mut sink: Sink,
        interval: Duration,
        mut timers: mpsc::Receiver<u64>,
    ) {
        let mut flush = tokio::time::interval(interval);
        let mut tick = tokio::time::interval(TIMER_INTERVAL.min(interval));
        // Both fire at once first: nothing to send yet, harmless.
        loop {
            let mut lines = Vec::new();
            tokio::select! {
                _ = flush.tick() => self.drain_counters(&mut lines),
                _ = tick.tick() => {}
            }
            while let Ok(ms) = timers.try_recv() {
                self.line(&mut lines, StatName::ResponseTime.name(), ms, "ms");
            }
            if !lines.is_empty() {
                let count = lines.iter().filter(|&&b| b == b'\n').count() as u64;
                if !sink.send(&lines).await {
                    self.dropped.inc_by(count);
                }
            }
        }
    }

    /// Appends every counter's delta since the last flush, skipping those that did not move.
    fn drain_counters(&self, out: &mut Vec<u8>) {
        for name in StatName::ALL {
            if name.is_counter() {
                let delta = self.fixed[name as usize].delta();
                if delta != 0 {
                    self.line(out, name.name(), delta, "c");
                }
            }
        }
        for sampled in self
            .sampled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter_mut()
        {
            let value = (sampled.read)();
            match sampled.kind {
                Sample::Gauge => self.line(out, &sampled.name, value, "g"),
                Sample::Counter => {
                    let delta = value.saturating_sub(sampled.last);
                    sampled.last = value;
                    if delta != 0 {
                        self.line(out, &sampled.name, delta, "c");
                    }
                }
            }
        }
        for (_, rule) in read(&self.rules).iter() {
            let counters = &**rule;
            let path = &counters.name;
            for ((suffix, counter), sent) in counters.counters().into_iter().zip(&counters.sent) {
                let value = counter.load(Ordering::Relaxed);
                let delta = value.saturating_sub(sent.swap(value, Ordering::Relaxed));
                if delta != 0 {
                    let name = format!("ratelimit.service.rate_limit.{path}.{suffix}");
                    self.line(out, &name, delta, "c");
                }
            }
        }
        for (domain, counter) in read(&self.domains).iter() {
            let delta = counter.delta();
            if delta != 0 {
                let name = format!("ratelimit.service.rate_limit.{domain}.domain_not_found");
                self.line(out, &name, delta, "c");
            }
        }
    }

    /// One line in the configured dialect.
    fn line(&self, out: &mut Vec<u8>, name: &str, value: u64, kind: &str) {
        if let Some(config) = &self.config {
            format_line(out, config.flavor, &config.tags, name, value, kind);
        }
    }
}

/// Appends `name:value|kind\n` with `tags` as `flavor` writes them.
pub fn format_line(
    out: &mut Vec<u8>,
    flavor: Flavor,
    tags: &[(String, String)],
    name: &str,
    value: u64,
    kind: &str,
) {
    use std::io::Write as _;
    out.extend_from_slice(name.as_bytes());
    if flavor == Flavor::Statsd {
        for (key, tag) in tags {
            let _ = write!(out, ".__{key}={tag}");
        }
    }
    let _ = write!(out, ":{value}|{kind}");
    if flavor == Flavor::DogStatsd && !tags.is_empty() {
        out.extend_from_slice(b"|#");
        for (i, (key, tag)) in tags.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = write!(out, "{key}:{tag}");
        }
    }
    out.push(b'\n');
}

/// Parses `EXTRA_TAGS` (`key1:value1,key2:value2`, as the reference's envconfig reads a map)
/// into sorted pairs, values sanitized as gostats' `NewTag` does; empty keys or values are
/// skipped, as gostats skips them.
pub fn parse_tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        if key.is_empty() || value.is_empty() {
            continue;
        }
        let value = value.replace(['.', ':', '|'], "_");
        tags.push((key.to_string(), value));
    }
    tags.sort();
    tags.dedup_by(|a, b| a.0 == b.0);
    Ok(tags)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
