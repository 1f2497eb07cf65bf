//! A limits file's YAML types checked key by key, so that one wrong type does not hide the
//! file's other errors.
//!
//! serde stops at the first error of a document. When the strict parse of a file fails but
//! the file is valid YAML, `load` hands its YAML value to [`check`]: each key is deserialized
//! on its own, as a one-key mapping into its level's struct of `model` (so the accepted types
//! and the messages are serde's, exactly as in the strict parse), the mappings under
//! `descriptors`, `rate_limit`, `rate_limits` and `replaces` are walked the same way, and
//! every key that does not deserialize is reported and dropped. What is left deserializes, and
//! is validated like any file. A validation error at or below a dropped key is not reported
//! ([`Hidden`]): it would only restate the type error (a wrong-typed `requests_per_unit` is
//! not also "missing").

use serde::de::DeserializeOwned;
use serde_yaml_ng::{Mapping, Value};

use super::model::{DescriptorModel, FileModel, Level, RateLimitModel, ReplacesModel};

/// Paths whose error is already reported: a validation error at or below one of them is left
/// out.
#[derive(Debug, Default)]
pub(crate) struct Hidden(Vec<String>);

impl Hidden {
    /// Whether an error at `path` would restate one already reported.
    pub(crate) fn covers(&self, path: &str) -> bool {
        self.0.iter().any(|hidden| {
            path.strip_prefix(hidden.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('.') || rest.starts_with('[')
            })
        })
    }
}

/// One key whose value has the wrong type (or an unknown key).
#[derive(Debug)]
pub(crate) struct TypeError {
    /// Where in the file, as the strict parse names it (`descriptors[0].rate_limit.unit`).
    pub(crate) path: String,
    /// serde's message, without position (a YAML value has none).
    pub(crate) message: String,
    /// What this error keeps from being checked, when anything: appended to the message.
    pub(crate) hides: &'static str,
}

/// What [`check`] found in one file.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// The file without its ill-typed keys; `None` when not even that deserializes (the file
    /// is not a mapping).
    pub(crate) model: Option<FileModel>,
    /// Every ill-typed or unknown key, in the file's order.
    pub(crate) errors: Vec<TypeError>,
    /// The paths of those errors, and of the limits they leave unchecked.
    pub(crate) hidden: Hidden,
}

/// Appended to an error whose key held mappings: nothing inside it was looked at.
const HIDES_CONTENT: &str = "nothing inside it is checked";
/// Appended to an error in `unlimited` or `algorithm`: the limit's other checks depend on it.
const HIDES_LIMIT: &str = "the limit's other fields are not checked, as they depend on it";

/// Checks every key of `value` (one limits file) against the model; see the module doc.
pub(crate) fn check(mut value: Value) -> Checked {
    let mut checked = Checked::default();
    match &mut value {
        Value::Mapping(map) => walk(map, Level::File, "", &mut checked),
        other => {
            if let Err((_, message)) = deserialize::<FileModel>(other.clone()) {
                checked.errors.push(TypeError {
                    path: String::new(),
                    message,
                    hides: HIDES_CONTENT,
                });
                return checked;
            }
        }
    }
    match deserialize::<FileModel>(value) {
        Ok(model) => checked.model = Some(model),
        // Not expected once every key deserialized on its own; reported rather than lost.
        Err((path, message)) => checked.errors.push(TypeError {
            path,
            message,
            hides: HIDES_CONTENT,
        }),
    }
    checked
}

/// Checks the keys of one mapping at `level`, whose path is `at` (empty, or ending in `.`),
/// dropping those that do not deserialize.
fn walk(map: &mut Mapping, level: Level, at: &str, checked: &mut Checked) {
    for (key, mut child) in std::mem::take(map) {
        let nested = key.as_str().and_then(|name| level.child(name));
        let name = key.as_str().unwrap_or_default();
        match (nested, &mut child) {
            (Some((items, true)), Value::Sequence(list)) => {
                for (i, item) in list.iter_mut().enumerate() {
                    item_of(item, items, &format!("{at}{name}[{i}]"), checked);
                }
            }
            (Some((inner, false)), Value::Mapping(inner_map)) => {
                walk(inner_map, inner, &format!("{at}{name}."), checked);
            }
            _ => {
                if let Err((path, message)) = one_key(level, &key, &child) {
                    let path = format!("{at}{path}");
                    let hides = if nested.is_some() {
                        HIDES_CONTENT
                    } else if level == Level::RateLimit && matches!(name, "unlimited" | "algorithm")
                    {
                        checked.hidden.0.push(at.trim_end_matches('.').to_owned());
                        HIDES_LIMIT
                    } else {
                        ""
                    };
                    checked.hidden.0.push(path.clone());
                    checked.errors.push(TypeError {
                        path,
                        message,
                        hides,
                    });
                    continue;
                }
            }
        }
        map.insert(key, child);
    }
}

/// Checks one item of a list of `level` mappings, at `at`; an item that is not one is
/// reported and replaced by an empty mapping, whose own errors are hidden.
fn item_of(item: &mut Value, level: Level, at: &str, checked: &mut Checked) {
    if let Value::Mapping(map) = item {
        walk(map, level, &format!("{at}."), checked);
        return;
    }
    let result = match level {
        Level::File => deserialize::<FileModel>(item.clone()).map(drop),
        Level::Descriptor => deserialize::<DescriptorModel>(item.clone()).map(drop),
        Level::RateLimit => deserialize::<RateLimitModel>(item.clone()).map(drop),
        Level::Replaces => deserialize::<ReplacesModel>(item.clone()).map(drop),
    };
    if let Err((_, message)) = result {
        checked.hidden.0.push(at.to_owned());
        checked.errors.push(TypeError {
            path: at.to_owned(),
            message,
            hides: "",
        });
        *item = Value::Mapping(Mapping::new());
    }
}

/// Deserializes `{key: value}` into the struct of `level`: the key's own error (its path
/// relative to the mapping, and the message), if any.
fn one_key(level: Level, key: &Value, value: &Value) -> Result<(), (String, String)> {
    let mut map = Mapping::new();
    map.insert(key.clone(), value.clone());
    let map = Value::Mapping(map);
    match level {
        Level::File => deserialize::<FileModel>(map).map(drop),
        Level::Descriptor => deserialize::<DescriptorModel>(map).map(drop),
        Level::RateLimit => deserialize::<RateLimitModel>(map).map(drop),
        Level::Replaces => deserialize::<ReplacesModel>(map).map(drop),
    }
}

/// `T` from `value`, or the path (empty at the top) and message of the first error.
fn deserialize<T: DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = match e.path().to_string() {
            root if root == "." => String::new(),
            path => path,
        };
        (path, name_structs(&e.inner().to_string()))
    })
}

/// serde's message with the model's struct names replaced by what they are in the file.
pub(crate) fn name_structs(message: &str) -> String {
    message
        .replace(
            "struct FileModel",
            "a mapping with `domain` and `descriptors`",
        )
        .replace(
            "struct DescriptorModel",
            "a descriptor (a mapping with `key`)",
        )
        .replace(
            "struct RateLimitModel",
            "a limit (a mapping with `unit` and `requests_per_unit`)",
        )
        .replace("struct ReplacesModel", "a mapping with `name`")
}

#[cfg(test)]
mod tests;
