//! A descriptor's `metadata:`: free-form YAML, compiled once into the protobuf `Struct` the
//! response's `dynamic_metadata` carries.
//!
//! The reference server accepts any YAML mapping there and converts it with
//! `structpb.NewStruct`: nulls, booleans, numbers (as doubles), strings, lists and nested
//! mappings; keys of nested mappings are written as text (`1: a` has the key `"1"`). An empty
//! mapping is no metadata at all. Anything else (a scalar or a list where the mapping should
//! be, a mapping used as a key) is a load error, as it is there.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost_types::{ListValue, NullValue, Struct, Value, value::Kind};
use serde_yaml_ng::Value as Yaml;

/// Compiled `metadata:`, shared by every response that reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Metadata(pub Arc<Struct>);

// `Struct` holds doubles, so it is only `PartialEq`. Metadata is compared only by tests and
// by `Rule`'s derived `Eq`, which never meets a NaN in practice (YAML `.nan` would be one, and
// then a rule is merely unequal to its copy).
impl Eq for Metadata {}

/// Compiles `metadata:`; `None` for an absent, null or empty mapping. The error says what is
/// wrong, for the loader to label with the file and path.
pub(crate) fn compile(yaml: &Yaml) -> Result<Option<Metadata>, String> {
    match yaml {
        Yaml::Null => Ok(None),
        Yaml::Mapping(map) if map.is_empty() => Ok(None),
        Yaml::Mapping(_) => match value(yaml)?.kind {
            Some(Kind::StructValue(fields)) => Ok(Some(Metadata(Arc::new(fields)))),
            _ => Err("metadata must be a mapping".into()),
        },
        Yaml::Tagged(tagged) => compile(&tagged.value),
        _ => Err("metadata must be a mapping of names to values".into()),
    }
}

fn value(yaml: &Yaml) -> Result<Value, String> {
    let kind = match yaml {
        Yaml::Null => Kind::NullValue(NullValue::NullValue as i32),
        Yaml::Bool(b) => Kind::BoolValue(*b),
        Yaml::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Yaml::String(s) => Kind::StringValue(s.clone()),
        Yaml::Sequence(items) => Kind::ListValue(ListValue {
            values: items.iter().map(value).collect::<Result<_, _>>()?,
        }),
        Yaml::Mapping(map) => {
            let mut fields = BTreeMap::new();
            for (key, item) in map {
                fields.insert(key_text(key)?, value(item)?);
            }
            Kind::StructValue(Struct { fields })
        }
        Yaml::Tagged(tagged) => return value(&tagged.value),
    };
    Ok(Value { kind: Some(kind) })
}

/// A mapping key as text, as Go's `fmt.Sprintf("%v", key)` writes a scalar.
fn key_text(key: &Yaml) -> Result<String, String> {
    match key {
        Yaml::String(s) => Ok(s.clone()),
        Yaml::Bool(b) => Ok(b.to_string()),
        Yaml::Number(n) => Ok(n.to_string()),
        Yaml::Null => Ok("<nil>".into()),
        Yaml::Tagged(tagged) => key_text(&tagged.value),
        Yaml::Sequence(_) | Yaml::Mapping(_) => {
            Err("error parsing metadata: a key must be a scalar, not a list or mapping".into())
        }
    }
}

/// Merges `src` into `dest` as the reference does for the descriptors a response admits: a
/// key already in `dest` keeps its value (the first admitted descriptor wins), except that two
/// mappings under one key are merged recursively.
pub fn merge(dest: &mut BTreeMap<String, Value>, src: &Struct) {
    for (key, value) in &src.fields {
        match dest.get_mut(key) {
            None => {
                dest.insert(key.clone(), value.clone());
            }
            Some(Value {
                kind: Some(Kind::StructValue(existing)),
            }) => {
                if let Some(Kind::StructValue(incoming)) = &value.kind {
                    merge(&mut existing.fields, incoming);
                }
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
