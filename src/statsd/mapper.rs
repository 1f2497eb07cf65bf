//! statsd_exporter's mapping file, as the reference reads it from `PROMETHEUS_MAPPER_YAML`
//! (Envoy Gateway always sets it): which Prometheus series, labels and observer each stat
//! becomes. [`Mapper::parse`] reads the format of statsd_exporter v0.26 (the version the
//! reference embeds); [`Mapper::map`] resolves one stat as its exporter would:
//!
//! - `mappings`, each with `match`, `match_type` (`glob`, the default, or `regex`), `name`,
//!   `labels`, `observer_type` (or the older `timer_type`), `help`, `action` (`map` or
//!   `drop`), `match_metric_type` (`counter`, `gauge`, `observer`/`timer`), `scale`,
//!   `histogram_options.buckets` (or the older `buckets`); and `defaults` with `match_type`,
//!   `observer_type`, `glob_disable_ordering` and the histogram buckets.
//! - Glob mappings are tried first: `*` matches one whole dot-separated component. The
//!   first matching glob mapping in file order wins; with `glob_disable_ordering`, the one
//!   whose components are literal furthest from the left wins (the exporter's search tree
//!   tries a literal component before `*`). Then the regex mappings, in file order, each
//!   searched unanchored as Go's `regexp` does.
//! - `$n` and `${n}` in `name` and label values are the n-th capture. In a glob mapping a
//!   reference that is not a capture number (`$1x`, `$9` with two captures) becomes
//!   nothing; in a regex mapping the expansion is Go's `Regexp.Expand` (named groups too),
//!   which the `regex` crate's `Captures::expand` follows.
//! - A stat no mapping matches keeps its own name with every character outside
//!   `[a-zA-Z0-9_]` as `_` and no labels, as the exporter names an unmapped event.
//!
//! Unknown fields are ignored, as the exporter's YAML decoder ignores them. The fields that
//! only tune the exporter's own storage (`ttl`, `summary_options`, `quantiles`,
//! `honor_labels`, native histograms) are accepted and change nothing here
//! (`docs/observability.md` says why). A file the exporter would refuse (a bad regex, a glob
//! it cannot compile, a name or label key it rejects, an unknown `match_type`, …) is an
//! error naming the mapping; so are histogram buckets that are not increasing and a
//! negative or non-finite `scale`, which the exporter would crash on or silently drop
//! everything for.

use std::path::Path;

use regex::Regex;
use serde::Deserialize;
use serde_yaml_ng::Value;

/// Prometheus' default histogram buckets (client_golang's `DefBuckets`), which the exporter
/// uses when neither the mapping nor `defaults` give any.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What an event is to the exporter (`match_metric_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    /// A counter (`|c`).
    Counter,
    /// A gauge (`|g`).
    Gauge,
    /// A timer or histogram sample (`|ms`, `|h`, `|d`).
    Observer,
}

/// How an observer stat is exposed.
#[derive(Clone, Debug, PartialEq)]
pub enum Observer {
    /// A histogram with these bucket upper bounds, increasing (`+Inf` implied).
    Histogram(Vec<f64>),
    /// A summary: `_sum` and `_count` (quantiles are not served, see `docs/observability.md`).
    Summary,
}

/// Where a stat goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Mapped {
    /// Into this series.
    Series(MappedSeries),
    /// Nowhere: an `action: drop` mapping matched it, or the mapped name came out empty
    /// (the exporter drops such an event too).
    Dropped,
}

/// A stat's series: its name, labels and how it is exposed.
#[derive(Clone, Debug, PartialEq)]
pub struct MappedSeries {
    /// The metric name, escaped as the exporter escapes it.
    pub name: String,
    /// Label names and values, sorted by name (as client_golang writes them).
    pub labels: Vec<(String, String)>,
    /// The mapping's `help`, if it has one.
    pub help: Option<String>,
    /// For an observer stat: histogram or summary.
    pub observer: Observer,
    /// The factor every value is multiplied by (`scale`), if any.
    pub scale: Option<f64>,
}

/// A mapping file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum MapperError {
    /// The file cannot be read.
    #[error("cannot read the statsd_exporter mapping file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a mapping file the exporter would load.
    #[error("statsd_exporter mapping file {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, naming the mapping.
        reason: String,
    },
}

/// A loaded mapping file.
#[derive(Clone, Debug)]
pub struct Mapper {
    /// Every mapping, in file order.
    mappings: Vec<Mapping>,
    /// `defaults.glob_disable_ordering`.
    glob_disable_ordering: bool,
    /// How an observer no mapping names is exposed (`defaults`).
    default_observer: Observer,
}

/// One entry of `mappings`, compiled.
#[derive(Clone, Debug)]
struct Mapping {
    matcher: Matcher,
    /// `match_metric_type`; `None` matches every kind.
    kind: Option<StatKind>,
    /// The name template.
    name: String,
    /// Label names (sorted) and value templates.
    labels: Vec<(String, String)>,
    help: Option<String>,
    drop: bool,
    observer: Observer,
    scale: Option<f64>,
}

#[derive(Clone, Debug)]
enum Matcher {
    /// Dot-separated components: `None` is `*`.
    Glob(Vec<Option<String>>),
    Regex(Regex),
}

impl Mapper {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Mapper, MapperError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| MapperError::Read {
            path: name.clone(),
            source,
        })?;
        Mapper::parse(&text).map_err(|reason| MapperError::Invalid { path: name, reason })
    }

    /// Parses a mapping file's text; the error names what is wrong.
    pub fn parse(text: &str) -> Result<Mapper, String> {
        // An empty document is an empty mapping, as the exporter reads it.
        let file: Option<RawFile> = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let file = file.unwrap_or_default();
        let defaults = file.defaults;
        let default_match = match defaults.match_type.as_deref() {
            None => MatchType::Glob,
            Some(text) => match_type(text)?,
        };
        let default_buckets = defaults
            .histogram_options
            .and_then(|h| h.buckets)
            .filter(|b| !b.is_empty())
            .or(defaults.buckets.filter(|b| !b.is_empty()))
            .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec());
        check_buckets(&default_buckets).map_err(|e| format!("defaults: {e}"))?;
        let default_kind = observer_kind(
            defaults.observer_type.as_deref(),
            defaults.timer_type.as_deref(),
        )?;
        let default_observer = match default_kind {
            Some(ObserverKind::Histogram) => Observer::Histogram(default_buckets.clone()),
            Some(ObserverKind::Summary) | None => Observer::Summary,
        };
        let mut mappings = Vec::with_capacity(file.mappings.len());
        for (i, raw) in file.mappings.into_iter().enumerate() {
            let pattern = raw.r#match.as_ref().map_or("", |m| m.0.as_str());
            let what = format!("mappings[{i}] (match {pattern:?})");
            let mapping = compile(raw, default_match, &default_buckets, default_kind)
                .map_err(|e| format!("{what}: {e}"))?;
            mappings.push(mapping);
        }
        Ok(Mapper {
            mappings,
            glob_disable_ordering: defaults.glob_disable_ordering,
            default_observer,
        })
    }

    /// The series the exporter would put the stat `stat` of kind `kind` in.
    pub fn map(&self, stat: &str, kind: StatKind) -> Mapped {
        let applies = |m: &&Mapping| m.kind.is_none_or(|k| k == kind);
        let components: Vec<&str> = stat.split('.').collect();
        let mut glob: Option<(&Mapping, Vec<&str>)> = None;
        for mapping in self.mappings.iter().filter(applies) {
            let Matcher::Glob(pattern) = &mapping.matcher else {
                continue;
            };
            let Some(captures) = glob_match(pattern, &components) else {
                continue;
            };
            match &glob {
                // In file order: the first match wins.
                Some(_) if !self.glob_disable_ordering => {}
                // Unordered: a literal component beats `*`, leftmost first.
                Some((best, _)) if !more_literal(pattern, glob_pattern(best)) => {}
                _ => glob = Some((mapping, captures)),
            }
            if !self.glob_disable_ordering {
                break;
            }
        }
        if let Some((mapping, captures)) = glob {
            let name = glob_expand(&mapping.name, &captures);
            let labels = mapping
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), glob_expand(v, &captures)))
                .collect();
            return mapping.series(name, labels);
        }
        for mapping in self.mappings.iter().filter(applies) {
            let Matcher::Regex(regex) = &mapping.matcher else {
                continue;
            };
            let Some(captures) = regex.captures(stat) else {
                continue;
            };
            let expand = |template: &str| {
                let mut out = String::new();
                captures.expand(template, &mut out);
                out
            };
            let name = expand(&mapping.name);
            let labels = mapping
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), expand(v)))
                .collect();
            return mapping.series(name, labels);
        }
        Mapped::Series(MappedSeries {
            name: escape_name(stat),
            labels: Vec::new(),
            help: None,
            observer: self.default_observer.clone(),
            scale: None,
        })
    }
}

impl Mapping {
    fn series(&self, name: String, labels: Vec<(String, String)>) -> Mapped {
        if self.drop || name.is_empty() {
            return Mapped::Dropped;
        }
        Mapped::Series(MappedSeries {
            name: escape_name(&name),
            labels,
            help: self.help.clone(),
            observer: self.observer.clone(),
            scale: self.scale,
        })
    }
}

fn glob_pattern(mapping: &Mapping) -> &[Option<String>] {
    match &mapping.matcher {
        Matcher::Glob(pattern) => pattern,
        Matcher::Regex(_) => &[],
    }
}

/// Whether `a` has a literal component where `b` has `*`, at the first place they differ so.
fn more_literal(a: &[Option<String>], b: &[Option<String>]) -> bool {
    a.iter()
        .zip(b)
        .find(|(x, y)| x.is_some() != y.is_some())
        .is_some_and(|(x, _)| x.is_some())
}

/// The components `*` matched, if `pattern` matches `components`.
fn glob_match<'s>(pattern: &[Option<String>], components: &[&'s str]) -> Option<Vec<&'s str>> {
    if pattern.len() != components.len() {
        return None;
    }
    let mut captures = Vec::new();
    for (field, component) in pattern.iter().zip(components) {
        match field {
            None => captures.push(*component),
            Some(literal) if literal == component => {}
            Some(_) => return None,
        }
    }
    Some(captures)
}

/// statsd_exporter's glob template: `$`, an optional `{`, a run of `[a-zA-Z0-9_$]`, an
/// optional `}`. A run that is a capture number (1 to the number of captures) is that
/// capture; any other run is replaced by nothing; a `$` without a run stays.
fn glob_expand(template: &str, captures: &[&str]) -> String {
    let bytes = template.as_bytes();
    let is_run = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'$';
    let run_end = |from: usize| {
        let mut end = from;
        while end < bytes.len() && is_run(bytes[end]) {
            end += 1;
        }
        end
    };
    let mut out = String::with_capacity(template.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            let next = template[i..]
                .find('$')
                .map_or(template.len(), |offset| i + offset);
            out.push_str(&template[i..next]);
            i = next;
            continue;
        }
        // `\{?` first tries to take the brace; the run must then be non-empty.
        let mut start = i + 1;
        if bytes.get(start) == Some(&b'{') && run_end(start + 1) > start + 1 {
            start += 1;
        }
        let end = run_end(start);
        if end == start {
            out.push('$');
            i += 1;
            continue;
        }
        let run = &template[start..end];
        let mut next = end;
        if bytes.get(next) == Some(&b'}') {
            next += 1;
        }
        if let Ok(n) = run.parse::<usize>()
            && (1..=captures.len()).contains(&n)
        {
            out.push_str(captures[n - 1]);
        }
        i = next;
    }
    out
}

/// statsd_exporter's `EscapeMetricName`: characters outside `[a-zA-Z0-9_]` become `_` (a run
/// of `-` one `_`), and a leading digit gets a `_` before it.
pub fn escape_name(stat: &str) -> String {
    let mut out = String::with_capacity(stat.len() + 1);
    if stat.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = None;
    for c in stat.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == Some('-')) {
            out.push('_');
        }
        previous = Some(c);
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MatchType {
    Glob,
    Regex,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObserverKind {
    Histogram,
    Summary,
}

fn match_type(text: &str) -> Result<MatchType, String> {
    match text {
        "glob" | "" => Ok(MatchType::Glob),
        "regex" => Ok(MatchType::Regex),
        _ => Err(format!("invalid match type {text:?} (glob or regex)")),
    }
}

/// `observer_type`, or the older `timer_type` when it is absent; `None`: neither.
fn observer_kind(
    observer: Option<&str>,
    timer: Option<&str>,
) -> Result<Option<ObserverKind>, String> {
    let Some(text) = observer.or(timer) else {
        return Ok(None);
    };
    match text {
        "histogram" => Ok(Some(ObserverKind::Histogram)),
        "summary" | "" => Ok(Some(ObserverKind::Summary)),
        _ => Err(format!(
            "invalid observer type {text:?} (histogram or summary)"
        )),
    }
}

fn metric_kind(text: &str) -> Result<StatKind, String> {
    match text {
        "counter" => Ok(StatKind::Counter),
        "gauge" => Ok(StatKind::Gauge),
        "observer" | "timer" => Ok(StatKind::Observer),
        _ => Err(format!(
            "invalid match_metric_type {text:?} (counter, gauge or observer)"
        )),
    }
}

fn check_buckets(buckets: &[f64]) -> Result<(), String> {
    if buckets.iter().any(|b| b.is_nan()) || buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "histogram buckets {buckets:?} are not in increasing order"
        ));
    }
    Ok(())
}

fn compile(
    raw: RawMapping,
    default_match: MatchType,
    default_buckets: &[f64],
    default_observer: Option<ObserverKind>,
) -> Result<Mapping, String> {
    let name = raw.name.map(|n| n.0).unwrap_or_default();
    if name.is_empty() {
        return Err("the mapping sets no metric name".into());
    }
    if !valid_name_template(&name) {
        return Err(format!(
            "metric name {name:?} is not a metric name ([a-zA-Z_][a-zA-Z0-9_]*, with $n or \
             ${{n}} captures)"
        ));
    }
    let mut labels = Vec::with_capacity(raw.labels.len());
    for (key, value) in raw.labels {
        if !valid_label_key(&key) {
            return Err(format!(
                "invalid label key {key:?} ([a-zA-Z_][a-zA-Z0-9_]+)"
            ));
        }
        labels.push((key, value.0));
    }
    labels.sort();
    let pattern = raw.r#match.map(|m| m.0).unwrap_or_default();
    let matcher = match raw
        .match_type
        .as_deref()
        .map(match_type)
        .transpose()?
        .unwrap_or(default_match)
    {
        MatchType::Glob => glob(&pattern)?,
        MatchType::Regex => Matcher::Regex(
            Regex::new(&pattern).map_err(|e| format!("invalid regex {pattern:?}: {e}"))?,
        ),
    };
    let kind = raw
        .match_metric_type
        .as_deref()
        .map(metric_kind)
        .transpose()?;
    let drop = match raw.action.as_deref() {
        None | Some("map" | "") => false,
        Some("drop") => true,
        Some(other) => return Err(format!("invalid action {other:?} (map or drop)")),
    };
    let histogram_buckets = raw
        .histogram_options
        .as_ref()
        .and_then(|h| h.buckets.clone());
    // A mapping that names no observer type takes the default's, with its own buckets.
    let observer = match observer_kind(raw.observer_type.as_deref(), raw.timer_type.as_deref())?
        .or(default_observer)
    {
        None => Observer::Summary,
        Some(ObserverKind::Summary) => {
            if raw.histogram_options.is_some() {
                return Err("a summary observer cannot have histogram_options".into());
            }
            Observer::Summary
        }
        Some(ObserverKind::Histogram) => {
            if raw.summary_options.is_some() {
                return Err("a histogram observer cannot have summary_options".into());
            }
            if histogram_buckets.is_some() && raw.buckets.is_some() {
                return Err(
                    "buckets are given both at the top level and in histogram_options".into(),
                );
            }
            let buckets = histogram_buckets
                .filter(|b| !b.is_empty())
                .or(raw.buckets.filter(|b| !b.is_empty()))
                .unwrap_or_else(|| default_buckets.to_vec());
            check_buckets(&buckets)?;
            Observer::Histogram(buckets)
        }
    };
    if raw.summary_options.is_some() && raw.quantiles.is_some() {
        return Err("quantiles are given both at the top level and in summary_options".into());
    }
    if let Some(scale) = raw.scale
        && !(scale.is_finite() && scale >= 0.0)
    {
        return Err(format!("scale {scale} is not a finite number ≥ 0"));
    }
    Ok(Mapping {
        matcher,
        kind,
        name,
        labels,
        help: raw.help.map(|h| h.0).filter(|h| !h.is_empty()),
        drop,
        observer,
        scale: raw.scale,
    })
}

/// A glob `match`, checked as the exporter checks it: the first component `*` or
/// `[a-zA-Z_][a-zA-Z0-9_-]*`, the others `*` or `[a-zA-Z0-9_][a-zA-Z0-9_-]*`.
fn glob(pattern: &str) -> Result<Matcher, String> {
    let mut fields = Vec::new();
    for (i, field) in pattern.split('.').enumerate() {
        if field == "*" {
            fields.push(None);
            continue;
        }
        let mut chars = field.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()));
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(format!(
                "invalid glob match {pattern:?}: components are * or [a-zA-Z0-9_-] names"
            ));
        }
        fields.push(Some(field.to_string()));
    }
    Ok(Matcher::Glob(fields))
}

/// The exporter's name check: `[a-zA-Z_]` or a capture, then `[a-zA-Z0-9_]` or captures,
/// a capture being `$`, an optional `{`, digits, an optional `}`.
fn valid_name_template(name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let mut j = i + 1;
            if bytes.get(j) == Some(&b'{') {
                j += 1;
            }
            let digits = j;
            while j < bytes.len() && bytes[j].is_ascii_digit() {
                j += 1;
            }
            if j == digits {
                return false;
            }
            if bytes.get(j) == Some(&b'}') {
                j += 1;
            }
            i = j;
            continue;
        }
        let c = bytes[i];
        let ok = c.is_ascii_alphabetic() || c == b'_' || (i > 0 && c.is_ascii_digit());
        if !ok {
            return false;
        }
        i += 1;
    }
    !name.is_empty()
}

/// The exporter's label key check, `[a-zA-Z_][a-zA-Z0-9_]+` (two characters at least).
fn valid_label_key(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A YAML scalar read as text, as the exporter's Go decoder reads a scalar into a string
/// (`version: 2` is the label value `2`).
#[derive(Clone, Debug, Default, PartialEq)]
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(s) => Ok(Text(s)),
            Value::Number(n) => Ok(Text(n.to_string())),
            Value::Bool(b) => Ok(Text(b.to_string())),
            Value::Null => Ok(Text(String::new())),
            other => Err(serde::de::Error::custom(format!(
                "expected text, found {}",
                kind_of(&other)
            ))),
        }
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        _ => "a tagged value",
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawFile {
    defaults: RawDefaults,
    mappings: Vec<RawMapping>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawDefaults {
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    match_type: Option<String>,
    glob_disable_ordering: bool,
    histogram_options: Option<RawHistogramOptions>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawHistogramOptions {
    buckets: Option<Vec<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawMapping {
    r#match: Option<Text>,
    name: Option<Text>,
    labels: std::collections::BTreeMap<String, Text>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    quantiles: Option<Value>,
    match_type: Option<String>,
    help: Option<Text>,
    action: Option<String>,
    match_metric_type: Option<String>,
    summary_options: Option<Value>,
    histogram_options: Option<RawHistogramOptions>,
    scale: Option<f64>,
}

#[cfg(test)]
pub(crate) mod tests;
