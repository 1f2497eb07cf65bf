//! Pushed `RateLimitConfig`s → limits-file YAML, so that they go through the very loader and
//! validation that files go through (same model, same errors, same checks).
//!
//! Each resource becomes one "file" named `xds:<resource name>`; its descriptors are written
//! with the limits file's keys. Proto3 defaults (an empty value, `false`, no `rate_limit`) are
//! left out, exactly as an operator would leave the key out of a file.

use prost_types::value::Kind;
use serde_yaml_ng::{Mapping, Value as Yaml};

use crate::proto::rls_conf::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// How many rules a pushed configuration holds: its descriptors, nested ones included (what
/// [`Defaults::max_rules`](crate::config::Defaults::max_rules) bounds, counted before any conversion).
pub fn rule_count(config: &RateLimitConfig) -> usize {
    count(&config.descriptors)
}

fn count(list: &[RateLimitDescriptor]) -> usize {
    list.iter().map(|d| 1 + count(&d.descriptors)).sum()
}

/// The `(file name, YAML)` source of one pushed configuration.
pub fn to_source(config: &RateLimitConfig) -> (String, String) {
    let mut file = Mapping::new();
    file.insert("domain".into(), config.domain.clone().into());
    file.insert("descriptors".into(), descriptors(&config.descriptors));
    let name = format!("xds:{}", config.name);
    // A Mapping of strings, bools and numbers always serializes.
    let yaml = serde_yaml_ng::to_string(&Yaml::Mapping(file)).unwrap_or_default();
    (name, yaml)
}

fn descriptors(list: &[RateLimitDescriptor]) -> Yaml {
    Yaml::Sequence(list.iter().map(descriptor).collect())
}

fn descriptor(d: &RateLimitDescriptor) -> Yaml {
    let mut m = Mapping::new();
    m.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        m.insert("value".into(), d.value.clone().into());
    }
    if let Some(policy) = &d.rate_limit {
        m.insert("rate_limit".into(), rate_limit(policy));
    }
    if !d.descriptors.is_empty() {
        m.insert("descriptors".into(), descriptors(&d.descriptors));
    }
    for (key, set) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if set {
            m.insert(key.into(), true.into());
        }
    }
    if let Some(metadata) = &d.metadata {
        m.insert("metadata".into(), structure(metadata));
    }
    Yaml::Mapping(m)
}

fn rate_limit(p: &RateLimitPolicy) -> Yaml {
    let mut m = Mapping::new();
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    } else {
        // An unknown number is spelled so that validation names it.
        let unit = RateLimitUnit::try_from(p.unit).map_or_else(
            |_| p.unit.to_string(),
            |u| u.as_str_name().to_ascii_lowercase(),
        );
        m.insert("unit".into(), unit.into());
        m.insert("requests_per_unit".into(), p.requests_per_unit.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        let replaces = p
            .replaces
            .iter()
            .map(|r| {
                let mut m = Mapping::new();
                m.insert("name".into(), r.name.clone().into());
                Yaml::Mapping(m)
            })
            .collect();
        m.insert("replaces".into(), Yaml::Sequence(replaces));
    }
    Yaml::Mapping(m)
}

fn structure(s: &prost_types::Struct) -> Yaml {
    let mut m = Mapping::new();
    for (k, v) in &s.fields {
        m.insert(k.clone().into(), value(v));
    }
    Yaml::Mapping(m)
}

fn value(v: &prost_types::Value) -> Yaml {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Yaml::Null,
        Some(Kind::NumberValue(n)) => (*n).into(),
        Some(Kind::StringValue(s)) => s.clone().into(),
        Some(Kind::BoolValue(b)) => (*b).into(),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Yaml::Sequence(l.values.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests;
