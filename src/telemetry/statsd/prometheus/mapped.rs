//! The reference's Prometheus series when a statsd_exporter mapping file is given
//! (`PROMETHEUS_MAPPER_YAML`): every stat goes through [`Mapper::map`] as the reference's
//! embedded exporter sends it — rule counters, `config_load_*` and the Redis pool's counters
//! as counters, the pool's levels as gauges, `response_time` as an observer — and is served
//! under the mapped name and labels, its value times the mapping's `scale`.
//!
//! As in the exporter: stats that land in one series add up; a series whose name is already
//! served as another type is left out (the exporter drops such a conflicting event, and the
//! first type seen wins: here counters, then gauges, then the response time); counters are
//! served once they have moved. A histogram response time has the mapping's buckets,
//! counted exactly (samples are whole milliseconds, and every bucket's bound is one of the
//! recorded ones); a summary is served as its `_sum` and `_count`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::super::mapper::{Mapped, MappedSeries, Mapper, Observer, StatKind};
use super::super::{Sample, StatName, Stats};
use super::{HELP, help_text, label_text};

/// Label names and values, sorted by name.
type Labels = Vec<(String, String)>;

/// What a family is served as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    Counter,
    Gauge,
    Histogram,
    Summary,
}

impl Type {
    fn name(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
            Type::Summary => "summary",
        }
    }
}

/// One metric family: its type, help (the first mapping's), and series.
struct Family {
    kind: Type,
    help: String,
    /// Counter and gauge values.
    values: BTreeMap<Labels, f64>,
    /// For the response time: its labels, buckets and scale.
    observer: Option<(Labels, Option<Vec<f64>>, f64)>,
}

/// The millisecond bounds the response-time histogram must record so that each bucket of
/// the mapping's response-time series is counted exactly: for a bucket `le` and scale `s`,
/// the largest whole `m` with `m × s ≤ le`, computed as the exporter multiplies.
pub(crate) fn mapped_bounds_ms(mapper: &Mapper) -> Vec<u64> {
    match mapper.map(StatName::ResponseTime.name(), StatKind::Observer) {
        Mapped::Series(MappedSeries {
            observer: Observer::Histogram(buckets),
            scale,
            ..
        }) => {
            let scale = scale.unwrap_or(1.0);
            buckets
                .iter()
                .filter_map(|&le| largest_at_most(le, scale))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The largest whole `m` with `m × scale ≤ le` in floating point, if any (`scale ≥ 0`).
fn largest_at_most(le: f64, scale: f64) -> Option<u64> {
    if le.is_nan() || le < 0.0 {
        return None;
    }
    if scale == 0.0 || le.is_infinite() {
        return Some(u64::MAX);
    }
    let guess = (le / scale).floor();
    if guess >= u64::MAX as f64 {
        return Some(u64::MAX);
    }
    // The division rounds; the product decides, as the exporter compares it.
    let mut m = guess as u64;
    for _ in 0..4 {
        if m > 0 && m as f64 * scale > le {
            m -= 1;
        } else if ((m + 1) as f64) * scale <= le {
            m += 1;
        }
    }
    Some(m)
}

/// `v` as the text format writes it: integers without a fraction.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        v.to_string()
    }
}

impl Stats {
    /// The exposition through `mapper` (see the module's documentation).
    pub(super) fn encode_mapped(&self, mapper: &Mapper) -> String {
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        for (stat, value) in self.totals() {
            add(
                &mut families,
                mapper.map(&stat, StatKind::Counter),
                Type::Counter,
                value,
            );
        }
        let sampled: Vec<(String, Sample, u64)> = self
            .sampled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|s| (s.name.clone(), s.kind, (s.read)()))
            .collect();
        for (name, kind, value) in sampled {
            match kind {
                Sample::Gauge => {
                    add(
                        &mut families,
                        mapper.map(&name, StatKind::Gauge),
                        Type::Gauge,
                        value,
                    );
                }
                Sample::Counter if value != 0 => {
                    let mapped = mapper.map(&name, StatKind::Counter);
                    add(&mut families, mapped, Type::Counter, value);
                }
                Sample::Counter => {}
            }
        }
        if self.response_times.count.load(Ordering::Relaxed) != 0 {
            let mapped = mapper.map(StatName::ResponseTime.name(), StatKind::Observer);
            add_observer(&mut families, mapped);
        }
        let mut out = String::new();
        for (name, family) in &families {
            let _ = writeln!(
                out,
                "# HELP {name} {}\n# TYPE {name} {}",
                help_text(&family.help),
                family.kind.name()
            );
            for (labels, value) in &family.values {
                let _ = writeln!(out, "{name}{} {}", label_text(labels, None), number(*value));
            }
            if let Some((labels, buckets, scale)) = &family.observer {
                self.encode_observer(&mut out, name, labels, buckets.as_deref(), *scale);
            }
        }
        out
    }

    /// The response time's `_bucket`s (when `buckets`), `_sum` and `_count`.
    fn encode_observer(
        &self,
        out: &mut String,
        name: &str,
        labels: &Labels,
        buckets: Option<&[f64]>,
        scale: f64,
    ) {
        let times = &self.response_times;
        let count = times.count.load(Ordering::Relaxed);
        for &le in buckets.unwrap_or_default() {
            let below = times.at_most(|bound| bound as f64 * scale <= le);
            let le = le.to_string();
            let _ = writeln!(
                out,
                "{name}_bucket{} {below}",
                label_text(labels, Some(&le))
            );
        }
        if buckets.is_some() {
            let all = label_text(labels, Some("+Inf"));
            let _ = writeln!(out, "{name}_bucket{all} {count}");
        }
        let sum = times.sum_ms.load(Ordering::Relaxed) as f64 * scale;
        let plain = label_text(labels, None);
        let _ = writeln!(
            out,
            "{name}_sum{plain} {}\n{name}_count{plain} {count}",
            number(sum)
        );
    }
}

/// Adds a counter's or gauge's `value` to its mapped series, unless dropped or conflicting.
fn add(families: &mut BTreeMap<String, Family>, mapped: Mapped, kind: Type, value: u64) {
    let Mapped::Series(series) = mapped else {
        return;
    };
    let value = value as f64 * series.scale.unwrap_or(1.0);
    let family = families.entry(series.name).or_insert_with(|| Family {
        kind,
        help: series.help.unwrap_or_else(|| HELP.to_string()),
        values: BTreeMap::new(),
        observer: None,
    });
    if family.kind != kind {
        return;
    }
    *family.values.entry(series.labels).or_default() += value;
}

/// Adds the response time's family, unless dropped or its names are taken.
fn add_observer(families: &mut BTreeMap<String, Family>, mapped: Mapped) {
    let Mapped::Series(series) = mapped else {
        return;
    };
    let (kind, buckets) = match series.observer {
        Observer::Histogram(buckets) => (Type::Histogram, Some(buckets)),
        Observer::Summary => (Type::Summary, None),
    };
    let taken = ["", "_bucket", "_sum", "_count"]
        .iter()
        .any(|suffix| families.contains_key(&format!("{}{suffix}", series.name)));
    if taken {
        return;
    }
    families.insert(
        series.name,
        Family {
            kind,
            help: series.help.unwrap_or_else(|| HELP.to_string()),
            values: BTreeMap::new(),
            observer: Some((series.labels, buckets, series.scale.unwrap_or(1.0))),
        },
    );
}

#[cfg(test)]
mod tests;
