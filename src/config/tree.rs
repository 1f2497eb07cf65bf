//! The compiled matching tree of one domain, and how a request descriptor walks it.
//!
//! Matching follows the reference server (`GetLimit` in envoyproxy/ratelimit): for each entry
//! of the request descriptor, at the current level, try the exact `key`+`value` node, then the
//! wildcard patterns of that key in file order, then the bare `key` node. A rule applies only at
//! the node reached by the descriptor's *last* entry; a descriptor with more entries than the
//! tree has levels, one that reaches a node without limits, or one that dead-ends at a node
//! without children before its last entry matches nothing.
//!
//! Keys and values are compared as raw bytes (Envoy may send non-UTF-8 header bytes), and key
//! and value are kept apart: the reference joins them as `key_value` for its map lookups, so
//! key `a_b` collides with key `a` + value `b` there; not here.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use super::limit::Rule;

/// The tables' hasher: foldhash, randomly seeded. A request's keys and values only look these
/// tables up, never add to them (their keys are the configuration's), so the flooding that
/// SipHash guards a growing table against cannot happen here, and foldhash costs fewer
/// instructions per lookup, the more so the longer the value.
type Hasher = foldhash::fast::RandomState;

/// The limits of one domain, compiled for matching.
#[derive(Debug)]
pub struct Domain {
    /// The domain name (`domain:` in the file, `domain` in the request).
    pub name: String,
    /// `redis_hash_tag: true`: every bucket key of the domain carries the domain as a Redis
    /// Cluster hash tag ([`crate::bucket::hash_tagged_domain`]), so one request's
    /// buckets all live in one slot and are applied by one atomic script.
    pub hash_tag: bool,
    /// The name as the `domain` label of per-rule metrics (shared: no copy per request).
    metric_label: Arc<str>,
    /// The domain as the first component of its bucket keys, escaped once here.
    key_prefix: Box<[u8]>,
    root: Children,
}

/// How one request entry matched its level of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// The node with this exact `key` and `value`.
    Exact,
    /// A node whose `value` is a `*` pattern that matched the request's value.
    Wildcard {
        /// The configured value, stars included (`files/*`).
        pattern: &'a str,
        /// `share_threshold: true`: every value matching the pattern shares one bucket, so the
        /// bucket key (and metric key) uses `pattern` instead of the request's value.
        shared: bool,
    },
    /// The node with this `key` and no value, which matches any value.
    Bare,
}

/// The rule a request descriptor matched, and how each of its entries matched.
#[derive(Clone, Debug)]
pub struct Match<'a> {
    /// The matched rule.
    pub rule: &'a Rule,
    /// One step per request entry, in order (on the stack up to four: one is built for
    /// every descriptor of every request).
    pub steps: SmallVec<[Step<'a>; 4]>,
    /// The domain name, for [`Match::metric_key`].
    domain: &'a str,
    /// `value_to_metric` of the node each entry reached; empty when no node has it set.
    value_to_metric: Vec<bool>,
}

impl<'a> Match<'a> {
    /// The reference server's stats key for this match (its `RateLimit.FullKey` after
    /// `GetLimit`), given the same entries that were passed to [`Domain::find`]:
    /// - `detailed_metric` on the rule: domain, then `key_value` with the request's value for
    ///   every entry (a `share_threshold` level keeps its pattern; when one does, an empty value
    ///   gives `key` rather than `key_`, as in the reference);
    /// - otherwise [`Rule::path`], except that a level whose node has `value_to_metric: true`
    ///   and matched bare or by an unshared wildcard shows the request's value (`key_value`, or
    ///   `key` if the value is empty).
    ///
    /// Non-UTF-8 bytes are replaced by U+FFFD. Borrows [`Rule::path`] when nothing differs
    /// (no reference count written: it is the configuration's, shared by every serving
    /// thread); only rules that opt in build a string per request.
    pub fn metric_key(&self, entries: &[(&[u8], &[u8])]) -> Cow<'a, Arc<str>> {
        if !self.rule.detailed_metric && self.value_to_metric.is_empty() {
            return Cow::Borrowed(&self.rule.path);
        }
        let any_shared = self
            .steps
            .iter()
            .any(|step| matches!(step, Step::Wildcard { shared: true, .. }));
        let mut key = String::with_capacity(self.rule.path.len() + 16);
        key.push_str(self.domain);
        for (i, (step, &(entry_key, value))) in self.steps.iter().zip(entries).enumerate() {
            key.push('.');
            key.push_str(&String::from_utf8_lossy(entry_key));
            let value_to_metric = self.value_to_metric.get(i).copied().unwrap_or(false);
            let shown: Option<Cow<'_, str>> = match *step {
                Step::Wildcard {
                    pattern,
                    shared: true,
                } => Some(Cow::Borrowed(pattern)),
                _ if self.rule.detailed_metric && !any_shared => {
                    Some(String::from_utf8_lossy(value))
                }
                Step::Exact => Some(String::from_utf8_lossy(value)),
                _ if self.rule.detailed_metric || value_to_metric => {
                    (!value.is_empty()).then(|| String::from_utf8_lossy(value))
                }
                Step::Wildcard { pattern, .. } => Some(Cow::Borrowed(pattern)),
                Step::Bare => None,
            };
            if let Some(shown) = shown {
                key.push('_');
                key.push_str(&shown);
            }
        }
        Cow::Owned(key.into())
    }
}

impl Domain {
    pub(crate) fn new(name: String, root: Children, hash_tag: bool) -> Domain {
        Domain {
            metric_label: name.as_str().into(),
            key_prefix: if hash_tag {
                crate::bucket::hash_tagged_domain(&name)
            } else {
                crate::bucket::encode_domain(&name)
            },
            name,
            hash_tag,
            root,
        }
    }

    /// The `domain` label of this domain's per-rule metrics.
    pub fn metric_label(&self) -> &Arc<str> {
        &self.metric_label
    }

    /// The encoded first component of this domain's bucket keys, hash-tagged when the domain
    /// asks for it
    /// (see [`crate::bucket::BucketKey::in_domain`]).
    pub fn key_prefix(&self) -> &[u8] {
        &self.key_prefix
    }

    /// Walks the tree for one request descriptor (its entries as raw `(key, value)` bytes).
    /// `None` when no rule applies, including for a descriptor without entries.
    pub fn find<'a>(&'a self, entries: &[(&[u8], &[u8])]) -> Option<Match<'a>> {
        let last = entries.len().checked_sub(1)?;
        let mut children = &self.root;
        let mut steps = SmallVec::with_capacity(entries.len());
        let mut value_to_metric = Vec::new();
        for (i, &(key, value)) in entries.iter().enumerate() {
            let (node, step) = children.lookup(key, value)?;
            steps.push(step);
            if node.value_to_metric {
                value_to_metric.resize(entries.len(), false);
                if let Some(flag) = value_to_metric.get_mut(i) {
                    *flag = true;
                }
            }
            if i == last {
                return node.rule.as_ref().map(|rule| Match {
                    rule,
                    steps,
                    domain: &self.name,
                    value_to_metric,
                });
            }
            // The reference stops descending at a node without children, even when the
            // descriptor has entries left: such a request matches nothing.
            if node.children.is_empty() {
                return None;
            }
            children = &node.children;
        }
        None
    }

    /// Gives each rule of the domain its [`Rule::index`], counting on from `next` in path
    /// order, so the same limits always number their rules the same way.
    pub(crate) fn number_rules(&mut self, next: &mut usize) {
        let mut rules = Vec::new();
        self.root.rules_mut(&mut rules);
        rules.sort_by(|a, b| a.path.cmp(&b.path));
        for rule in rules {
            rule.index = *next;
            *next += 1;
        }
    }

    /// Every rule of the domain, sorted by path.
    pub(crate) fn rules(&self) -> Vec<&Rule> {
        let mut rules = Vec::new();
        self.root.collect_rules(&mut rules);
        rules.sort_by(|a, b| a.path.cmp(&b.path));
        rules
    }
}

/// One node of the tree: a configured descriptor.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The limits, if the descriptor has any.
    pub(crate) rule: Option<Rule>,
    /// `value_to_metric` of this node.
    pub(crate) value_to_metric: bool,
    /// `share_threshold` of this node (only ever set on wildcard nodes).
    pub(crate) share_threshold: bool,
    /// Nested descriptors.
    pub(crate) children: Children,
}

/// The nodes of one level, grouped by key so a lookup is two hash probes and no allocation.
#[derive(Debug, Default)]
pub(crate) struct Children {
    by_key: HashMap<Box<[u8]>, KeyNodes, Hasher>,
}

/// The nodes of one level that share a key.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<Box<[u8]>, Node, Hasher>,
    /// In file order: the first matching pattern wins.
    wildcards: Vec<(Pattern, Node)>,
    bare: Option<Box<Node>>,
}

impl Children {
    /// Adds a node. The loader has already rejected duplicate `(key, value)` pairs.
    pub(crate) fn insert(&mut self, key: &str, value: Option<&str>, node: Node) {
        let nodes = self.by_key.entry(Box::from(key.as_bytes())).or_default();
        match value {
            None => nodes.bare = Some(Box::new(node)),
            Some(value) if value.contains('*') => {
                nodes.wildcards.push((Pattern::new(value), node));
            }
            Some(value) => {
                nodes.exact.insert(Box::from(value.as_bytes()), node);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether a node with exactly this `key` and `value` (a pattern compared as written) is
    /// at this level.
    pub(crate) fn contains(&self, key: &str, value: Option<&str>) -> bool {
        let Some(nodes) = self.by_key.get(key.as_bytes()) else {
            return false;
        };
        match value {
            None => nodes.bare.is_some(),
            Some(value) if value.contains('*') => nodes
                .wildcards
                .iter()
                .any(|(pattern, _)| pattern.text == value),
            Some(value) => nodes.exact.contains_key(value.as_bytes()),
        }
    }

    fn lookup<'a>(&'a self, key: &[u8], value: &[u8]) -> Option<(&'a Node, Step<'a>)> {
        let nodes = self.by_key.get(key)?;
        if let Some(node) = nodes.exact.get(value) {
            return Some((node, Step::Exact));
        }
        for (pattern, node) in &nodes.wildcards {
            if pattern.matches(value) {
                let step = Step::Wildcard {
                    pattern: &pattern.text,
                    shared: node.share_threshold,
                };
                return Some((node, step));
            }
        }
        nodes.bare.as_deref().map(|node| (node, Step::Bare))
    }

    fn rules_mut<'a>(&'a mut self, rules: &mut Vec<&'a mut Rule>) {
        for nodes in self.by_key.values_mut() {
            let wildcards = nodes.wildcards.iter_mut().map(|(_, node)| node);
            let all = nodes
                .exact
                .values_mut()
                .chain(wildcards)
                .chain(nodes.bare.as_deref_mut());
            for node in all {
                rules.extend(node.rule.as_mut());
                node.children.rules_mut(rules);
            }
        }
    }

    fn collect_rules<'a>(&'a self, rules: &mut Vec<&'a Rule>) {
        for nodes in self.by_key.values() {
            let wildcards = nodes.wildcards.iter().map(|(_, node)| node);
            let all = nodes
                .exact
                .values()
                .chain(wildcards)
                .chain(nodes.bare.as_deref());
            for node in all {
                rules.extend(node.rule.as_ref());
                node.children.collect_rules(rules);
            }
        }
    }
}

/// A configured value containing `*`: each star matches any byte sequence, including none.
#[derive(Debug)]
struct Pattern {
    text: String,
    /// Bytes before the first star.
    prefix: Box<[u8]>,
    /// Non-empty pieces between stars, in order.
    middle: Vec<Box<[u8]>>,
    /// Bytes after the last star.
    suffix: Box<[u8]>,
}

impl Pattern {
    fn new(text: &str) -> Pattern {
        let mut pieces = text.as_bytes().split(|&b| b == b'*');
        let prefix = Box::from(pieces.next().unwrap_or_default());
        let mut rest: Vec<&[u8]> = pieces.collect();
        let suffix = Box::from(rest.pop().unwrap_or_default());
        let middle = rest.into_iter().filter(|p| !p.is_empty()).map(Box::from);
        Pattern {
            text: text.to_owned(),
            prefix,
            middle: middle.collect(),
            suffix,
        }
    }

    /// Glob match with `*` only. Taking the leftmost occurrence of each middle piece is
    /// optimal: it leaves the most room for the pieces after it.
    fn matches(&self, value: &[u8]) -> bool {
        let Some(inner_len) = value
            .len()
            .checked_sub(self.prefix.len() + self.suffix.len())
        else {
            return false;
        };
        if !value.starts_with(&self.prefix) || !value.ends_with(&self.suffix) {
            return false;
        }
        let mut rest = &value[self.prefix.len()..self.prefix.len() + inner_len];
        for piece in &self.middle {
            match rest.windows(piece.len()).position(|w| w == &piece[..]) {
                Some(at) => rest = &rest[at + piece.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
