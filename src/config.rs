//! Limits configuration: the reference server's YAML limits files, parsed, validated and
//! compiled into one matching tree per domain.
//!
//! Place in the request path: the service resolves the request's domain with
//! [`Config::domain`], then each request descriptor with [`Domain::find`]; the resulting
//! [`Match`] (a [`Rule`] with its [`Limit`]s, plus how each entry matched) is what the planner
//! turns into bucket operations. A [`Config`] is immutable; a reload builds a new one and swaps
//! it in only if it compiled without error.
//!
//! Pure: this module reads no file and knows no metrics. It takes what a limits source read
//! (`(file name, text)` pairs: files, or an xDS push converted to YAML) and returns a
//! [`Config`] or every error. Reading the files, following them and publishing a new
//! [`Config`] is [`crate::sources`]' job.
//!
//! - `model` — the file as written (serde, unknown keys rejected);
//! - `depth` — the nesting depth of a file's text, checked before the YAML parser sees it;
//! - `lenient` — reference mode: a file read as the reference reads it (misplaced keys);
//! - `parse` — parsing each file, error collection, counting rules, merging domains;
//! - `typecheck` — a file that serde refuses, checked key by key, so that every type error is
//!   reported and the rest of the file is still validated;
//! - `metadata` — a descriptor's `metadata:`, compiled for dynamic metadata;
//! - `compile` — semantic checks, compiling the tree;
//! - `tree` — the compiled tree and the matching walk;
//! - `limit` — [`Rule`], [`Limit`], [`Unit`], [`Defaults`];
//! - `error` — [`ConfigError`], [`ConfigErrors`].
//!
//! The format, floodgate's extensions and every error are documented in `docs/config.md`.

mod compile;
mod depth;
mod error;
mod lenient;
mod limit;
mod metadata;
mod model;
mod parse;
mod tree;
mod typecheck;

use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use depth::{MAX_FLOW_DEPTH, check_flow_depth};
pub use error::{ConfigError, ConfigErrors};
pub use limit::{Defaults, Limit, Rule, Unit, algorithm_name, format_wait, parse_wait};
pub use metadata::{Metadata, merge as merge_metadata};
pub use parse::MAX_LOAD_RULES;
pub(crate) use parse::too_many_rules;
pub use tree::{Domain, Match, Step};

/// A loaded limits configuration: every domain, by name.
#[derive(Debug, Default)]
pub struct Config {
    domains: BTreeMap<String, Domain>,
    /// How many rules the domains hold: each rule's [`Rule::index`] is below it.
    rule_count: usize,
}

impl Config {
    /// Builds a configuration from `(file name, content)` pairs; the names only label errors.
    pub fn from_sources(
        sources: &[(String, String)],
        defaults: &Defaults,
    ) -> Result<Config, ConfigErrors> {
        Config::compile(sources, defaults, false)
    }

    /// [`Config::from_sources`], merging a domain spread over several sources when
    /// `merge_domains` is set.
    pub fn compile(
        sources: &[(String, String)],
        defaults: &Defaults,
        merge_domains: bool,
    ) -> Result<Config, ConfigErrors> {
        parse::parse_files(sources, defaults, merge_domains, false).map(Config::of)
    }

    /// [`Config::compile`] in reference mode: each file is read as the reference reads it
    /// (misplaced keys, see `lenient`), for the reference's runtime layout.
    pub fn compile_lenient(
        sources: &[(String, String)],
        defaults: &Defaults,
        merge_domains: bool,
    ) -> Result<Config, ConfigErrors> {
        parse::parse_files(sources, defaults, merge_domains, true).map(Config::of)
    }

    fn of(domains: Vec<Domain>) -> Config {
        let mut domains: BTreeMap<String, Domain> =
            domains.into_iter().map(|d| (d.name.clone(), d)).collect();
        let mut rule_count = 0;
        for domain in domains.values_mut() {
            domain.number_rules(&mut rule_count);
        }
        Config {
            domains,
            rule_count,
        }
    }

    /// How many rules the configuration holds; every [`Rule::index`] is below it.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// A configuration without domains: every request is answered OK.
    pub fn empty() -> Config {
        Config::default()
    }

    /// The domain with this name.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, sorted by name.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// Whether there is no domain at all.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Human-readable listing, one line per limit, domains by name and rules by path:
    ///
    /// ```text
    /// edge.remote_address: 10/second token_bucket burst=20 shadow_mode=false
    /// edge.path_/api/*: 100/5 minutes fixed_window name=api shadow_mode=true quota_mode
    /// edge.user: unlimited shadow_mode=false
    /// internal: no limits
    /// ```
    ///
    /// After the rule path: the rate (or `unlimited`), the algorithm, `burst=` for token
    /// buckets, `overdraft` when set, `name=` and `replaces=a,b` when set, `shadow_mode=`, then the flags
    /// `quota_mode`, `detailed_metric`, `value_to_metric` only when set. A domain without any
    /// limit gets a `<domain>: no limits` line, one with `redis_hash_tag: true` a
    /// `<domain>: redis_hash_tag` line first.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for domain in self.domains() {
            if domain.hash_tag {
                let _ = writeln!(out, "{}: redis_hash_tag", domain.name);
            }
            let rules = domain.rules();
            if rules.is_empty() {
                let _ = writeln!(out, "{}: no limits", domain.name);
            }
            for rule in rules {
                for limit in &rule.limits {
                    let _ = writeln!(out, "{}", describe_limit(rule, limit));
                }
            }
        }
        out
    }
}

impl Config {
    /// Every limit whose `max_wait` is longer than `client_timeout_us`, as (rule path,
    /// max_wait µs): a client that gives up first sees an error, not the shaped OK.
    pub fn waits_longer_than(&self, client_timeout_us: u64) -> Vec<(std::sync::Arc<str>, u64)> {
        self.domains()
            .flat_map(|domain| domain.rules())
            .flat_map(|rule| rule.limits.iter().map(move |limit| (rule, limit)))
            .filter(|(_, limit)| limit.max_wait_us > client_timeout_us)
            .map(|(rule, limit)| (std::sync::Arc::clone(&rule.path), limit.max_wait_us))
            .collect()
    }

    /// The limits in the reference's debug-port `/rlconfig` text (its config `Dump`): one
    /// `<domain.key_value…>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>,
    /// quota_mode: <bool>` line per limit, domains in order and rules sorted by path (the
    /// reference's order is Go map order, which varies). Unlimited is `unit=UNKNOWN requests_per_unit=0`, as the
    /// reference holds it; floodgate's extensions (several limits on one descriptor,
    /// `unit_multiplier`, algorithms) show only as their base unit, one line per limit.
    pub fn dump_reference(&self) -> String {
        let mut out = String::new();
        for domain in self.domains() {
            for rule in domain.rules() {
                for limit in &rule.limits {
                    let (unit, rpu) = if limit.unlimited {
                        ("UNKNOWN".to_string(), 0)
                    } else {
                        (
                            limit.unit.name().to_ascii_uppercase(),
                            limit.requests_per_unit,
                        )
                    };
                    let _ = writeln!(
                        out,
                        "{}: unit={unit} requests_per_unit={rpu}, shadow_mode: {}, \
                         quota_mode: {}",
                        rule.path, rule.shadow_mode, rule.quota_mode
                    );
                }
            }
        }
        out
    }
}

fn describe_limit(rule: &Rule, limit: &Limit) -> String {
    let mut line = format!("{}: {}", rule.path, limit.rate());
    if !limit.unlimited {
        let _ = write!(line, " {}", limit::algorithm_name(limit.algorithm));
        if limit.algorithm == crate::limiter::Algorithm::TokenBucket {
            let _ = write!(line, " burst={}", limit.burst);
        }
        if limit.overdraft {
            line.push_str(" overdraft");
        }
        if limit.max_wait_us > 0 {
            let _ = write!(line, " max_wait={}", limit::format_wait(limit.max_wait_us));
        }
    }
    if let Some(name) = &limit.name {
        let _ = write!(line, " name={name}");
    }
    if !limit.replaces.is_empty() {
        let _ = write!(line, " replaces={}", limit.replaces.join(","));
    }
    let _ = write!(line, " shadow_mode={}", rule.shadow_mode);
    for (flag, set) in [
        ("quota_mode", rule.quota_mode),
        ("detailed_metric", rule.detailed_metric),
        ("value_to_metric", rule.value_to_metric),
    ] {
        if set {
            let _ = write!(line, " {flag}");
        }
    }
    line
}

#[cfg(test)]
pub(crate) mod tests;
