//! The mapping file's YAML, read as statsd_exporter's Go decoder reads it (unknown fields
//! ignored, scalars read as text), and each mapping checked and compiled as the exporter
//! checks it when it loads the file.

use regex::Regex;
use serde::Deserialize;
use serde_yaml_ng::Value;

use super::{DEFAULT_BUCKETS, Mapper, Mapping, Matcher, Observer, StatKind};

/// The whole file, compiled.
pub(super) fn parse(text: &str) -> Result<Mapper, String> {
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
    // The exposition would carry `le` twice on every bucket, and Prometheus refuses the whole
    // scrape for it (the exporter panics on such an event).
    if matches!(observer, Observer::Histogram(_))
        && kind.is_none_or(|k| k == StatKind::Observer)
        && labels.iter().any(|(key, _)| key == "le")
    {
        return Err("label le is reserved for a histogram's buckets".into());
    }
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
/// `[a-zA-Z_](-?[a-zA-Z0-9_])*`, the others `*` or `[a-zA-Z0-9_](-?[a-zA-Z0-9_])*` (a `-`
/// only between two other characters).
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
        let dashes_ok = !field.ends_with('-') && !field.contains("--");
        if !first_ok
            || !dashes_ok
            || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
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
