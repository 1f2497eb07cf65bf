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
mod tests {
    use super::*;

    /// Go's spellings parse to the same durations; anything else is refused.
    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        for (text, expected) in [
            ("10s", ms(10_000)),
            ("0", ms(0)),
            ("0s", ms(0)),
            ("1h30m", ms(5_400_000)),
            ("1.5s", ms(1_500)),
            ("300ms", ms(300)),
            ("250us", Duration::from_micros(250)),
            ("2µs", Duration::from_micros(2)),
            ("24h", ms(86_400_000)),
            ("+5m", ms(300_000)),
            (".5s", ms(500)),
        ] {
            assert_eq!(parse_go_duration(text), Some(expected), "{text}");
        }
        for bad in [
            "",
            "10",
            "-1s",
            "1d",
            "s",
            "1..5s",
            "1.2.3s",
            "ten seconds",
            "5m x",
        ] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }
}
