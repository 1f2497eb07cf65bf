//! Reference mode's tolerance: a limits file the reference loads must load here too, with the
//! same meaning.
//!
//! The reference checks only that every key of a file is one of its known keys, wherever it
//! stands, and then ignores a known key in the wrong place (`shadow_mode` inside
//! `rate_limit`, say); a `rate_limit` without `requests_per_unit` is 0 per unit there, denying
//! everything. floodgate's own `--config` refuses both, to surface the mistake. In reference
//! mode (limits from the `RUNTIME_*` layout) such a file is rewritten as the reference reads
//! it — the misplaced key dropped, the missing count made 0 — with one warning per change,
//! naming the file and the path.

use serde_yaml_ng::{Mapping, Value};

use super::model::{FileModel, Level};

/// The reference's known keys (`validKeys` in its config loader): accepted anywhere.
const REFERENCE_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The file as the reference reads it, when that differs from what it says; `None` when
/// nothing needed rewriting or the rewritten file still does not parse (the strict parse
/// then reports the error, with its position).
pub(crate) fn parse(file: &str, content: &str) -> Option<FileModel> {
    let mut value: Value = serde_yaml_ng::from_str(content).ok()?;
    let mut changes = Vec::new();
    rewrite(&mut value, Level::File, "", &mut changes);
    if changes.is_empty() {
        return None;
    }
    let model = serde_yaml_ng::from_value(value).ok()?;
    for change in changes {
        tracing::warn!(file, "{change}");
    }
    Some(model)
}

/// `value` rewritten as the reference reads it, without logging the changes: for a file that
/// fails to load anyway, so that its other errors are those of the file the reference reads.
pub(crate) fn read_quietly(value: &mut Value) {
    rewrite(value, Level::File, "", &mut Vec::new());
}

/// Drops misplaced reference keys under `value` and gives every limit a count, recording each
/// change. `at` is the YAML path of `value`, with a trailing `.` unless empty.
fn rewrite(value: &mut Value, level: Level, at: &str, changes: &mut Vec<String>) {
    let Value::Mapping(map) = value else {
        return;
    };
    let misplaced: Vec<String> = map
        .keys()
        .filter_map(Value::as_str)
        .filter(|key| REFERENCE_KEYS.contains(key) && !level.allows(key))
        .map(str::to_owned)
        .collect();
    for key in misplaced {
        map.remove(key.as_str());
        changes.push(format!(
            "{at}{key}: ignored, as the reference ignores it (it has no meaning here)"
        ));
    }
    if matches!(level, Level::RateLimit) {
        give_a_count(map, at, changes);
    }
    for (key, child) in map.iter_mut() {
        let Some(key) = key.as_str() else { continue };
        let Some((child_level, list)) = level.child(key) else {
            continue;
        };
        match child {
            Value::Sequence(items) if list => {
                for (i, item) in items.iter_mut().enumerate() {
                    rewrite(item, child_level, &format!("{at}{key}[{i}]."), changes);
                }
            }
            _ if !list => rewrite(child, child_level, &format!("{at}{key}."), changes),
            _ => {}
        }
    }
}

/// A limit without `requests_per_unit` (and not `unlimited`) is 0 per unit, as the reference
/// reads it.
fn give_a_count(map: &mut Mapping, at: &str, changes: &mut Vec<String>) {
    let unlimited = map.get("unlimited").and_then(Value::as_bool) == Some(true);
    let counted = map
        .get("requests_per_unit")
        .is_some_and(|count| !count.is_null());
    if !unlimited && !counted {
        map.insert(Value::from("requests_per_unit"), Value::from(0));
        changes.push(format!(
            "{at}requests_per_unit: missing, read as 0 (every request over the limit), as \
             the reference reads it"
        ));
    }
}

#[cfg(test)]
mod tests;
