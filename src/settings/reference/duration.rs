//! Go's duration syntax (`time.ParseDuration`), in which the reference's duration variables
//! are written: `10s`, `1h30m`, `1.5s`, `300ms`, `0`.

use std::time::Duration;

/// Parses a non-negative Go duration; `None` if `text` is not one.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total_ns += value * scale;
        rest = tail;
    }
    // Go's limit: about 292 years.
    (total_ns <= i64::MAX as f64).then(|| Duration::from_nanos(total_ns.round() as u64))
}

#[cfg(test)]
mod tests;
