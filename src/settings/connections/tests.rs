use super::*;

/// The jitter stays within ±10% of the configured age; no age, no jitter.
#[test]
fn jitter_is_ten_percent_at_most() {
    let settings = GrpcConnectionSettings {
        grpc_max_connection_age: Some(Duration::from_secs(100)),
        ..Default::default()
    };
    assert_eq!(
        settings.jittered_max_age(0.0),
        Some(Duration::from_secs(100))
    );
    assert_eq!(
        settings.jittered_max_age(1.0),
        Some(Duration::from_secs(110))
    );
    assert_eq!(
        settings.jittered_max_age(-1.0),
        Some(Duration::from_secs(90))
    );
    assert_eq!(
        settings.jittered_max_age(7.0),
        Some(Duration::from_secs(110))
    );
    assert_eq!(
        GrpcConnectionSettings::default().jittered_max_age(0.5),
        None
    );
}

/// Ages are positive seconds.
#[test]
fn ages_are_positive_seconds() {
    assert_eq!(parse_age("1.5"), Ok(Duration::from_millis(1500)));
    for bad in ["0", "-1", "NaN", "1e30", "24h"] {
        assert!(parse_age(bad).is_err(), "{bad}");
    }
}
