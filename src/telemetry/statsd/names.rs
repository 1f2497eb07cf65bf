//! The reference's fixed stat names, and its `SanitizeStatName`.

/// A stat whose name does not depend on the configuration. The scopes are the reference's:
/// `ratelimit.service` for the service's stats (`stats.NewStatManager`), `ratelimit_server`
/// for the gRPC interceptor's (`metrics.NewServerReporter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatName {
    /// A limits load (start-up or reload) succeeded.
    ConfigLoadSuccess,
    /// A limits load failed.
    ConfigLoadError,
    /// A request answered OK only because of global shadow mode.
    GlobalShadowMode,
    /// A request failed because the store (Redis) failed.
    RedisError,
    /// A request failed for another reason (malformed).
    ServiceError,
    /// A `ShouldRateLimit` gRPC call.
    TotalRequests,
    /// A `ShouldRateLimit` gRPC call's time, in milliseconds (a timer).
    ResponseTime,
}

impl StatName {
    /// How many there are.
    pub const COUNT: usize = 7;
    /// All of them.
    pub const ALL: [StatName; StatName::COUNT] = [
        StatName::ConfigLoadSuccess,
        StatName::ConfigLoadError,
        StatName::GlobalShadowMode,
        StatName::RedisError,
        StatName::ServiceError,
        StatName::TotalRequests,
        StatName::ResponseTime,
    ];

    /// The full stat name.
    pub fn name(self) -> &'static str {
        match self {
            StatName::ConfigLoadSuccess => "ratelimit.service.config_load_success",
            StatName::ConfigLoadError => "ratelimit.service.config_load_error",
            StatName::GlobalShadowMode => "ratelimit.service.global_shadow_mode",
            StatName::RedisError => "ratelimit.service.call.should_rate_limit.redis_error",
            StatName::ServiceError => "ratelimit.service.call.should_rate_limit.service_error",
            StatName::TotalRequests => "ratelimit_server.ShouldRateLimit.total_requests",
            StatName::ResponseTime => "ratelimit_server.ShouldRateLimit.response_time",
        }
    }

    /// A counter (sent as deltas at each flush), not a timer.
    pub fn is_counter(self) -> bool {
        self != StatName::ResponseTime
    }
}

/// The reference's `SanitizeStatName`: `:` and `|` (statsd's separators) become `_`, and so
/// do the dots of anything shaped like an IPv4 address (`\d{1,3}(\.\d{1,3}){3}`, leftmost
/// first), so a client address in a `detailed_metric` key stays one name segment. Also, unlike
/// the reference, line breaks: a request value holding one would otherwise end the line and
/// forge another stat.
pub fn sanitize(name: &str) -> String {
    let mut out = name.replace([':', '|', '\n', '\r'], "_").into_bytes();
    let mut i = 0;
    while i < out.len() {
        match ipv4_at(&out, i) {
            Some(end) => {
                for b in &mut out[i..end] {
                    if *b == b'.' {
                        *b = b'_';
                    }
                }
                i = end;
            }
            None => i += 1,
        }
    }
    // Only ASCII dots were replaced by ASCII underscores: still UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// The end of an IPv4-shaped match starting at `start`, as Go's regexp finds it.
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut at = start;
    for _ in 0..3 {
        // Followed by a dot, a run of digits can only match whole.
        let run = digits(at);
        if run == 0 || run > 3 || bytes.get(at + run) != Some(&b'.') {
            return None;
        }
        at += run + 1;
    }
    let run = digits(at).min(3);
    (run > 0).then_some(at + run)
}
