//! Compiling one file's descriptors into a matching tree, checking each as it goes.
//!
//! Paths in errors are built here (`descriptors[1].rate_limits[0].burst`); the reference's
//! error messages are reused where it has one for the same mistake.

use std::collections::HashMap;

use super::error::ConfigError;
use super::limit::{self, Defaults, Limit, Rule, Unit, algorithm_name};
use super::model::{AlgorithmModel, DescriptorModel, RateLimitModel};
use super::tree::{Children, Node};
use super::typecheck::Hidden;
use crate::limiter::{Algorithm, MAX_WAIT_US};

/// Longest period the limiter accepts: its arithmetic must stay below 2^53 µs in Lua doubles.
const MAX_PERIOD_MS: u128 = 1 << 36;
/// Largest token-bucket span (emission interval × burst) the limiter accepts, in µs.
const MAX_BUCKET_SPAN_US: u128 = 1 << 50;

/// Validates one file's descriptors and compiles them, pushing every error it finds.
pub(crate) struct Builder<'a> {
    /// The file being validated, for error labels.
    pub(crate) file: &'a str,
    /// Loader defaults (algorithm).
    pub(crate) defaults: &'a Defaults,
    /// Where errors go.
    pub(crate) errors: &'a mut Vec<ConfigError>,
    /// Paths whose error the parse already reported (a key of the wrong type, dropped): an
    /// error at or below one would restate it, and is left out.
    pub(crate) hidden: &'a Hidden,
}

impl Builder<'_> {
    fn push(&mut self, path: &str, message: impl Into<String>) {
        if self.hidden.covers(path) {
            return;
        }
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            path: path.to_owned(),
            message: message.into(),
        });
    }

    /// One level: `prefix` is the YAML path of the parent (`descriptors[0].`), `metric` the
    /// parent's metric key (the domain at the top).
    pub(crate) fn level(
        &mut self,
        models: &[DescriptorModel],
        prefix: &str,
        metric: &str,
    ) -> Children {
        let mut children = Children::default();
        self.extend_level(&mut children, models, prefix, metric);
        children
    }

    /// Adds `models` to a level that may already hold nodes (from another file of the same
    /// domain, when domains are merged): a composite key already there is a duplicate too.
    pub(crate) fn extend_level(
        &mut self,
        children: &mut Children,
        models: &[DescriptorModel],
        prefix: &str,
        metric: &str,
    ) {
        let mut seen: HashMap<(&str, Option<&str>), usize> = HashMap::new();
        for (i, model) in models.iter().enumerate() {
            let at = format!("{prefix}descriptors[{i}]");
            let key = model.key.as_deref().unwrap_or_default();
            if key.is_empty() {
                self.push(&format!("{at}.key"), "descriptor has empty key");
            }
            let value = model.value.as_deref().filter(|v| !v.is_empty());
            let composite = match value {
                Some(value) => format!("{key}_{value}"),
                None => key.to_owned(),
            };
            let path = format!("{metric}.{composite}");
            let duplicate = seen.get(&(key, value)).copied();
            if let Some(first) = duplicate {
                let message = format!(
                    "duplicate descriptor composite key '{path}' (first defined at \
                     {prefix}descriptors[{first}])"
                );
                self.push(&at, message);
            }
            let elsewhere = duplicate.is_none() && children.contains(key, value);
            if elsewhere {
                let message = format!(
                    "duplicate descriptor composite key '{path}' (already defined in another \
                     file of the domain)"
                );
                self.push(&at, message);
            }
            // Built even when it will be dropped, to report the errors inside it too.
            let node = self.node(model, &at, &path, value);
            if key.is_empty() || duplicate.is_some() || elsewhere {
                continue;
            }
            seen.insert((key, value), i);
            children.insert(key, value, node);
        }
    }

    fn node(&mut self, model: &DescriptorModel, at: &str, path: &str, value: Option<&str>) -> Node {
        let share_threshold = model.share_threshold.unwrap_or(false);
        if share_threshold && !value.is_some_and(|v| v.contains('*')) {
            let message = "share_threshold can only be used with a wildcard value (one \
                           containing '*')";
            self.push(&format!("{at}.share_threshold"), message);
        }
        let limits = match (&model.rate_limit, &model.rate_limits) {
            (Some(_), Some(_)) => {
                self.push(
                    at,
                    "has both `rate_limit` and `rate_limits`; use one of them",
                );
                Vec::new()
            }
            (Some(one), None) => self.limits(
                std::slice::from_ref(one),
                &format!("{at}.rate_limit"),
                false,
            ),
            (None, Some(many)) if many.is_empty() => {
                self.push(&format!("{at}.rate_limits"), "must list at least one limit");
                Vec::new()
            }
            (None, Some(many)) => self.limits(many, &format!("{at}.rate_limits"), true),
            (None, None) => Vec::new(),
        };
        let metadata = match model.metadata.as_ref().map(super::metadata::compile) {
            Some(Ok(metadata)) => metadata,
            Some(Err(message)) => {
                self.push(&format!("{at}.metadata"), message);
                None
            }
            None => None,
        };
        let rule = (!limits.is_empty()).then(|| Rule {
            path: path.into(),
            limits,
            shadow_mode: model.shadow_mode.unwrap_or(false),
            detailed_metric: model.detailed_metric.unwrap_or(false),
            value_to_metric: model.value_to_metric.unwrap_or(false),
            quota_mode: model.quota_mode.unwrap_or(false),
            metadata,
            // Assigned once every domain is compiled (`Config::of`).
            index: 0,
        });
        let descriptors = model.descriptors.as_deref().unwrap_or_default();
        Node {
            rule,
            value_to_metric: model.value_to_metric.unwrap_or(false),
            share_threshold,
            children: self.level(descriptors, &format!("{at}."), path),
        }
    }

    /// Validates the limits of one node; `indexed` for `rate_limits` (paths get an index).
    /// Returns only the valid limits.
    fn limits(&mut self, models: &[RateLimitModel], at: &str, indexed: bool) -> Vec<Limit> {
        let mut limits: Vec<Limit> = Vec::new();
        let mut seen: HashMap<(Algorithm, u64), usize> = HashMap::new();
        for (i, model) in models.iter().enumerate() {
            let at = if indexed {
                format!("{at}[{i}]")
            } else {
                at.to_owned()
            };
            let Some(limit) = self.limit(model, &at) else {
                continue;
            };
            if models.len() > 1 && limit.unlimited {
                self.push(
                    &at,
                    "an unlimited limit cannot be combined with other limits",
                );
                continue;
            }
            if !limit.unlimited {
                // Same algorithm and period would mean the same bucket in the store.
                let identity = (limit.algorithm, limit.period_seconds());
                if let Some(first) = seen.insert(identity, i) {
                    let message = format!(
                        "same algorithm ({}) and period as rate_limits[{first}]; two limits on \
                         one descriptor need different periods or algorithms",
                        algorithm_name(limit.algorithm)
                    );
                    self.push(&at, message);
                    continue;
                }
            }
            limits.push(limit);
        }
        limits
    }

    fn limit(&mut self, model: &RateLimitModel, at: &str) -> Option<Limit> {
        let before = self.errors.len();
        let name = model.name.clone().filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for (j, item) in model.replaces.iter().flatten().enumerate() {
            let item_at = format!("{at}.replaces[{j}].name");
            match item.name.as_deref().unwrap_or_default() {
                "" => self.push(&item_at, "should not have an empty replaces entry"),
                n if Some(n) == name.as_deref() => {
                    self.push(
                        &item_at,
                        "replaces should not contain name of same descriptor",
                    );
                }
                n => replaces.push(n.to_owned()),
            }
        }
        let unit_text = model.unit.as_deref().filter(|u| !u.is_empty());
        if model.unlimited.unwrap_or(false) {
            self.unlimited(model, at, unit_text);
            return (self.errors.len() == before).then_some(Limit {
                name,
                unlimited: true,
                unit: Unit::Second,
                unit_multiplier: 1,
                requests_per_unit: 0,
                algorithm: self.defaults.algorithm,
                burst: 0,
                replaces,
                overdraft: false,
                max_wait_us: 0,
            });
        }
        let unit = match unit_text.map(|u| (u, Unit::from_name(u))) {
            Some((_, Some(unit))) => Some(unit),
            Some((text, None)) => {
                let message = format!(
                    "invalid rate limit unit '{text}' (expected second, minute, hour, day, week, \
                     month or year)"
                );
                self.push(&format!("{at}.unit"), message);
                None
            }
            None => {
                self.push(&format!("{at}.unit"), "missing rate limit unit");
                None
            }
        };
        if model.requests_per_unit.is_none() {
            self.push(
                &format!("{at}.requests_per_unit"),
                "missing requests_per_unit",
            );
        }
        let requests_per_unit = model.requests_per_unit.unwrap_or(0);
        let unit_multiplier = model.unit_multiplier.unwrap_or(1);
        if unit_multiplier == 0 {
            self.push(
                &format!("{at}.unit_multiplier"),
                "unit_multiplier must be at least 1",
            );
        }
        let algorithm = match model.algorithm {
            Some(AlgorithmModel::TokenBucket) => Algorithm::TokenBucket,
            Some(AlgorithmModel::FixedWindow) => Algorithm::FixedWindow,
            Some(AlgorithmModel::SlidingWindow) => Algorithm::SlidingWindow,
            None => self.defaults.algorithm,
        };
        let burst = match (algorithm, model.burst) {
            (Algorithm::TokenBucket, Some(0)) => {
                self.push(&format!("{at}.burst"), "burst must be at least 1");
                0
            }
            (Algorithm::TokenBucket, Some(burst)) => burst,
            (_, Some(_)) => {
                let message = format!(
                    "burst applies only to token_bucket; {} has no burst",
                    algorithm_name(algorithm)
                );
                self.push(&format!("{at}.burst"), message);
                requests_per_unit
            }
            (_, None) => requests_per_unit,
        };
        let overdraft = model.overdraft.unwrap_or(false);
        let max_wait_us = self.max_wait(model, at, algorithm, overdraft);
        let limit = Limit {
            name,
            unlimited: false,
            unit: unit?,
            unit_multiplier,
            requests_per_unit,
            algorithm,
            burst,
            replaces,
            overdraft,
            max_wait_us,
        };
        if self.errors.len() == before {
            self.check_bounds(&limit, at);
        }
        (self.errors.len() == before).then_some(limit)
    }

    /// `max_wait:` in µs (0 when absent), or an error at `<at>.max_wait`: a duration, on a
    /// token bucket without overdraft, at most [`MAX_WAIT_US`].
    fn max_wait(
        &mut self,
        model: &RateLimitModel,
        at: &str,
        algorithm: Algorithm,
        overdraft: bool,
    ) -> u64 {
        let Some(text) = model.max_wait.as_deref() else {
            return 0;
        };
        let field = format!("{at}.max_wait");
        let wait = match limit::parse_wait(text) {
            Ok(wait) => wait,
            Err(message) => {
                self.push(&field, message);
                return 0;
            }
        };
        if wait == 0 {
            return 0;
        }
        if algorithm != Algorithm::TokenBucket {
            let message = format!(
                "max_wait applies only to token_bucket; {} has no order to queue requests in \
                 (it could only admit the next window's requests at its boundary)",
                algorithm_name(algorithm)
            );
            self.push(&field, message);
        } else if overdraft {
            self.push(
                &field,
                "max_wait and overdraft exclude each other: an overdraft debit is always \
                 admitted at once",
            );
        } else if wait > MAX_WAIT_US {
            let message = format!(
                "max_wait {text} exceeds the longest supported, {}",
                limit::format_wait(MAX_WAIT_US)
            );
            self.push(&field, message);
        }
        wait
    }

    /// `unlimited: true` takes no rate. `requests_per_unit` is tolerated (and ignored) because
    /// the reference accepts it there; it rejects a unit, and the extensions make no sense.
    fn unlimited(&mut self, model: &RateLimitModel, at: &str, unit: Option<&str>) {
        if unit.is_some() {
            self.push(
                &format!("{at}.unit"),
                "should not specify rate limit unit when unlimited",
            );
        }
        let extensions = [
            ("algorithm", model.algorithm.is_some()),
            ("burst", model.burst.is_some()),
            ("unit_multiplier", model.unit_multiplier.is_some()),
            ("overdraft", model.overdraft.is_some()),
            ("max_wait", model.max_wait.is_some()),
        ];
        for (field, present) in extensions {
            if present {
                self.push(
                    &format!("{at}.{field}"),
                    format!("should not specify {field} when unlimited"),
                );
            }
        }
        if model.requests_per_unit.is_some() {
            tracing::warn!(
                file = self.file,
                path = at,
                "requests_per_unit ignored: the limit is unlimited"
            );
        }
    }

    /// Bounds that keep the limiter's integer arithmetic exact in Lua doubles (< 2^53).
    fn check_bounds(&mut self, limit: &Limit, at: &str) {
        let period_s = u128::from(limit.unit.seconds()) * u128::from(limit.unit_multiplier);
        if period_s * 1000 > MAX_PERIOD_MS {
            let message = format!(
                "period of {} × {} is too long: at most 2^36 ms (about 795 days)",
                limit.unit_multiplier, limit.unit
            );
            let field = if limit.unit_multiplier > 1 {
                "unit_multiplier"
            } else {
                "unit"
            };
            self.push(&format!("{at}.{field}"), message);
            return;
        }
        if limit.algorithm != Algorithm::TokenBucket || limit.requests_per_unit == 0 {
            return;
        }
        // Any rate up to u32::MAX per second is representable (the token bucket counts in
        // ticks finer than a µs when it must); only the time to refill `burst` is bounded.
        let period_us = period_s * 1_000_000;
        let rate = u128::from(limit.requests_per_unit);
        let interval_us = period_us.div_ceil(rate);
        if interval_us * u128::from(limit.burst) + u128::from(limit.max_wait_us)
            > MAX_BUCKET_SPAN_US
        {
            let message = format!(
                "burst {} × {interval_us} µs per token{} exceeds 2^50 µs (about 35 years); \
                 lower burst or raise requests_per_unit",
                limit.burst,
                if limit.max_wait_us > 0 {
                    " plus max_wait"
                } else {
                    ""
                }
            );
            // Only an explicit burst can get here: the default (requests_per_unit) spans about
            // one period, which the period bound already keeps below 2^47 µs.
            self.push(&format!("{at}.burst"), message);
        }
    }
}
