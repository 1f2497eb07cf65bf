//! What a matched rule carries: [`Rule`], its [`Limit`]s and their [`Unit`].

use std::fmt;
use std::sync::Arc;

use crate::limiter::{Algorithm, LimitParams};

/// Loader settings that are not in the limits files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// Algorithm of every limit that does not name one (`algorithm:`).
    pub algorithm: Algorithm,
    /// Most rules (descriptors, nested ones included) one load may hold, all its files or
    /// pushed resources together (`--max-load-rules`); a load over it is refused whole,
    /// before anything is compiled.
    pub max_rules: usize,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            algorithm: Algorithm::TokenBucket,
            max_rules: super::MAX_LOAD_RULES,
        }
    }
}

/// A time unit of a limit, as spelled in the limits file (case-insensitive).
///
/// Lengths follow the reference server: a month is 30 days and a year 365 days, so windows are
/// fixed-length rather than calendar-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days (604 800 s).
    Week,
    /// 30 days (2 592 000 s).
    Month,
    /// 365 days (31 536 000 s).
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length of the unit in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// Lower-case name, as written in the limits file (`"minute"`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a unit name case-insensitively, like the reference (`SECOND`, `Minute`, `day`).
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(name))
    }

    /// Converts an `envoy.type.v3.RateLimitUnit` (a descriptor's `limit` override): SECOND 1 …
    /// DAY 4, MONTH 5, YEAR 6. That enum has no WEEK; UNKNOWN (0) and others give `None`.
    pub fn from_proto(v: i32) -> Option<Unit> {
        match v {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            _ => None,
        }
    }

    /// The `RateLimitResponse.RateLimit.Unit` value: SECOND 1 … YEAR 6, and WEEK 7 (appended to
    /// that enum later, hence out of order).
    pub fn to_response_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `snake_case` name of an algorithm, as written in the limits file.
pub fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::TokenBucket => "token_bucket",
        Algorithm::FixedWindow => "fixed_window",
        Algorithm::SlidingWindow => "sliding_window",
    }
}

/// One limit of a rule (`rate_limit:`, or one item of the `rate_limits:` extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// `name:`, reported to Envoy in `current_limit.name` and the target of other limits'
    /// `replaces`. An empty name is `None`.
    pub name: Option<String>,
    /// `unlimited: true`: always OK, never touches the store. The fields below are then
    /// placeholders (second, 0 requests) and [`Limit::params`] is meaningless.
    pub unlimited: bool,
    /// The time unit.
    pub unit: Unit,
    /// Extension: the period is `unit × unit_multiplier` (default 1, always ≥ 1).
    pub unit_multiplier: u32,
    /// Requests granted per period. 0 lets nothing through.
    pub requests_per_unit: u32,
    /// Extension: the algorithm (default from [`Defaults`]).
    pub algorithm: Algorithm,
    /// Extension: token-bucket capacity (default `requests_per_unit`). Equal to
    /// `requests_per_unit` for window algorithms, which have no burst.
    pub burst: u32,
    /// Names of limits this one replaces when both match one request (`replaces: [{name}]`).
    pub replaces: Vec<String>,
    /// Extension `overdraft: true`: a debit is always applied, even past the capacity (the
    /// bucket goes into debt, and checks deny until refill repays it); it never blocks the
    /// request by itself. See [`LimitParams::overdraft`] and docs/algorithms.md.
    pub overdraft: bool,
    /// Extension `max_wait: 50ms` (token bucket only; 0 = off): a request whose tokens
    /// arrive within this time is held until then and answered OK instead of refused. See
    /// [`LimitParams::max_wait_us`] and docs/algorithms.md.
    pub max_wait_us: u64,
}

/// A `max_wait` as written: a whole number followed by `us` (or `µs`), `ms` or `s`
/// (`0` alone is off). Returns µs.
pub fn parse_wait(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    let invalid = || format!("invalid duration '{text}' (expected e.g. 50ms, 250us or 1s)");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let scale = match unit {
        "us" | "µs" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        _ => return Err(invalid()),
    };
    number.checked_mul(scale).ok_or_else(invalid)
}

/// A µs duration as `max_wait` is written back (`50ms`, `1s`, `250us`).
pub fn format_wait(us: u64) -> String {
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1_000) {
        format!("{}ms", us / 1_000)
    } else {
        format!("{us}us")
    }
}

impl Limit {
    /// The period in seconds: `unit × unit_multiplier`.
    pub fn period_seconds(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier)
    }

    /// What the algorithms need. The loader guarantees the period fits the limiter's bounds.
    pub fn params(&self) -> LimitParams {
        LimitParams {
            algorithm: self.algorithm,
            requests_per_period: u64::from(self.requests_per_unit),
            period_us: self.period_seconds() * 1_000_000,
            burst: u64::from(self.burst),
            overdraft: self.overdraft,
            max_wait_us: self.max_wait_us,
        }
    }

    /// The limit as `10/second`, `20/5 minutes` or `unlimited`.
    pub(crate) fn rate(&self) -> String {
        if self.unlimited {
            "unlimited".to_owned()
        } else if self.unit_multiplier == 1 {
            format!("{}/{}", self.requests_per_unit, self.unit)
        } else {
            format!(
                "{}/{} {}s",
                self.requests_per_unit, self.unit_multiplier, self.unit
            )
        }
    }
}

/// The limits configured on one descriptor node, with that node's flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Reference-style metric key: domain, then each level's `key` or `key_value`, joined by
    /// dots (`edge.key1_value1.key2`); wildcard levels keep their pattern (`edge.path_/api/*`).
    /// Shared, so each request's metric labels are a reference count, not a copy.
    pub path: Arc<str>,
    /// The limits, in file order. Never empty: a node without limits is not a rule.
    pub limits: Vec<Limit>,
    /// `shadow_mode`: evaluated and counted, never denies.
    pub shadow_mode: bool,
    /// `detailed_metric`: the metric key uses the request's values, not the configured ones
    /// (see [`super::Match::metric_key`]).
    pub detailed_metric: bool,
    /// `value_to_metric` of this node (other levels' flags are in the match).
    pub value_to_metric: bool,
    /// `quota_mode`: an over-limit status does not deny by itself (see docs/config.md).
    pub quota_mode: bool,
    /// `metadata`: reported in the response's dynamic metadata when this rule admits a
    /// request (with `--response-dynamic-metadata`).
    pub metadata: Option<super::Metadata>,
    /// The rule's place among its configuration's rules (`0..Config::rule_count`), assigned
    /// when the configuration is assembled: telemetry keeps the rule's series handles at this
    /// index, beside the configuration, so counting a tally indexes them without a hash.
    pub index: usize,
}
