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
