//! The limits file exactly as written: serde structs, nothing validated beyond YAML types.
//!
//! Every field is optional here so that the loader can tell "absent" from "empty" and report
//! semantic errors itself, with a path; unknown keys are rejected by serde
//! (`deny_unknown_fields`), which the reference also does (`config error, unknown key`).
//! String fields accept any YAML scalar (`value: 200` is the string `"200"`), as the reference's
//! YAML decoder does.

use serde::Deserialize;

/// One limits file: `{domain, descriptors}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileModel {
    /// The domain every descriptor of this file belongs to.
    #[serde(default)]
    pub(crate) domain: Option<String>,
    /// Top-level descriptors.
    #[serde(default)]
    pub(crate) descriptors: Option<Vec<DescriptorModel>>,
    /// Extension: every bucket key of the domain carries the domain as a Redis Cluster hash
    /// tag, so all of them live in one slot (default false).
    #[serde(default)]
    pub(crate) redis_hash_tag: Option<bool>,
}

impl FileModel {
    /// How many rules the file holds: its descriptors, nested ones included.
    pub(crate) fn rule_count(&self) -> usize {
        count(self.descriptors.as_deref())
    }
}

fn count(descriptors: Option<&[DescriptorModel]>) -> usize {
    descriptors.map_or(0, |list| {
        list.iter()
            .map(|d| 1 + count(d.descriptors.as_deref()))
            .sum()
    })
}

/// One descriptor node.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescriptorModel {
    /// Entry key; required and non-empty.
    #[serde(default)]
    pub(crate) key: Option<String>,
    /// Entry value: absent or empty matches any value; may contain `*` wildcards.
    #[serde(default)]
    pub(crate) value: Option<String>,
    /// The reference's single limit.
    #[serde(default)]
    pub(crate) rate_limit: Option<RateLimitModel>,
    /// Extension: several limits on one node (exclusive with `rate_limit`).
    #[serde(default)]
    pub(crate) rate_limits: Option<Vec<RateLimitModel>>,
    /// Nested descriptors: the next entry of a request descriptor.
    #[serde(default)]
    pub(crate) descriptors: Option<Vec<DescriptorModel>>,
    /// Never deny on this node's limits.
    #[serde(default)]
    pub(crate) shadow_mode: Option<bool>,
    /// Metric key from the request's values.
    #[serde(default)]
    pub(crate) detailed_metric: Option<bool>,
    /// Metric key carries the request's value at this level.
    #[serde(default)]
    pub(crate) value_to_metric: Option<bool>,
    /// Values matching this wildcard share one bucket.
    #[serde(default)]
    pub(crate) share_threshold: Option<bool>,
    /// Soft limit: over-limit does not deny by itself.
    #[serde(default)]
    pub(crate) quota_mode: Option<bool>,
    /// Free-form data returned in the response's dynamic metadata when this node's limit
    /// admits a request (the reference's `metadata`); any YAML mapping, checked when compiled.
    #[serde(default)]
    pub(crate) metadata: Option<serde_yaml_ng::Value>,
}

/// One limit: the reference's `rate_limit` block plus floodgate's extensions.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitModel {
    /// `second` … `year`, case-insensitive.
    #[serde(default)]
    pub(crate) unit: Option<String>,
    /// Requests per period.
    #[serde(default)]
    pub(crate) requests_per_unit: Option<u32>,
    /// Always OK.
    #[serde(default)]
    pub(crate) unlimited: Option<bool>,
    /// Name, for `replaces` and `current_limit.name`.
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// Limits this one replaces.
    #[serde(default)]
    pub(crate) replaces: Option<Vec<ReplacesModel>>,
    /// Extension: algorithm.
    #[serde(default)]
    pub(crate) algorithm: Option<AlgorithmModel>,
    /// Extension: token-bucket capacity.
    #[serde(default)]
    pub(crate) burst: Option<u32>,
    /// Extension: period = unit × multiplier.
    #[serde(default)]
    pub(crate) unit_multiplier: Option<u32>,
    /// Extension: debits always apply, into debt (default false).
    #[serde(default)]
    pub(crate) overdraft: Option<bool>,
    /// Extension: how long a token bucket may hold a request for its tokens (`50ms`).
    #[serde(default)]
    pub(crate) max_wait: Option<String>,
}

/// One `replaces` item: `{name}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplacesModel {
    /// Name of the replaced limit.
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// `algorithm:` as spelled in the file.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AlgorithmModel {
    /// `token_bucket`.
    TokenBucket,
    /// `fixed_window`.
    FixedWindow,
    /// `sliding_window`.
    SlidingWindow,
}

/// Where a mapping stands in a limits file: which keys it may hold, and which of them hold
/// mappings of their own. Shared by the readings of a file that walk it as YAML before serde
/// does (`lenient`, `typecheck`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// The file itself: [`FileModel`].
    File,
    /// A descriptor: [`DescriptorModel`].
    Descriptor,
    /// A limit: [`RateLimitModel`].
    RateLimit,
    /// A `replaces` item: [`ReplacesModel`].
    Replaces,
}

impl Level {
    /// The keys that mean something here, floodgate's extensions included.
    pub(crate) fn allows(self, key: &str) -> bool {
        let keys: &[&str] = match self {
            Level::File => &["domain", "descriptors", "redis_hash_tag"],
            Level::Descriptor => &[
                "key",
                "value",
                "rate_limit",
                "rate_limits",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "detailed_metric",
                "value_to_metric",
                "share_threshold",
                "metadata",
            ],
            Level::RateLimit => &[
                "unit",
                "requests_per_unit",
                "unlimited",
                "name",
                "replaces",
                "algorithm",
                "burst",
                "unit_multiplier",
                "overdraft",
                "max_wait",
            ],
            Level::Replaces => &["name"],
        };
        keys.contains(&key)
    }

    /// The level of the mappings under `key` here, and whether `key` holds a list of them;
    /// `None` for a key holding a scalar (or free-form `metadata`), or an unknown key.
    pub(crate) fn child(self, key: &str) -> Option<(Level, bool)> {
        match (self, key) {
            (Level::File | Level::Descriptor, "descriptors") => Some((Level::Descriptor, true)),
            (Level::Descriptor, "rate_limit") => Some((Level::RateLimit, false)),
            (Level::Descriptor, "rate_limits") => Some((Level::RateLimit, true)),
            (Level::RateLimit, "replaces") => Some((Level::Replaces, true)),
            _ => None,
        }
    }
}
