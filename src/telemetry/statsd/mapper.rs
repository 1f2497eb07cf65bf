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
//!   which the `regex` crate's `Captures::expand` follows. The syntax is RE2's in both;
//!   only `\w`, `\d`, `\s` and `\b` differ, matching non-ASCII text here too.
//! - A stat no mapping matches keeps its own name with every character outside
//!   `[a-zA-Z0-9_]` as `_` and no labels, as the exporter names an unmapped event.
//!
//! Unknown fields are ignored, as the exporter's YAML decoder ignores them. The fields that
//! only tune the exporter's own storage (`ttl`, `summary_options`, `quantiles`,
//! `honor_labels`, native histograms) are accepted and change nothing here
//! (`docs/observability.md` says why). A file the exporter would refuse (a bad regex, a glob
//! it cannot compile, a name or label key it rejects, an unknown `match_type`, …) is an
//! error naming the mapping; so are histogram buckets that are not increasing, an `le`
//! label on a histogram, and a negative or non-finite `scale`, which the exporter would
//! crash on or silently drop everything for.

use std::path::Path;

use regex::Regex;

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
        file::parse(text)
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

mod file;
#[cfg(test)]
pub(crate) mod tests;
