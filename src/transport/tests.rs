use super::*;

/// A repeated event is logged once, then again only after LOG_EVERY, with its count.
#[test]
fn throttle_logs_once_per_period_with_a_count() {
    let start = Instant::now();
    let mut throttle = Throttle::default();
    assert_eq!(throttle.tick_at(start), Some(1));
    assert_eq!(throttle.tick_at(start + Duration::from_secs(1)), None);
    assert_eq!(throttle.tick_at(start + Duration::from_secs(2)), None);
    assert_eq!(throttle.tick_at(start + LOG_EVERY), Some(3));
    assert_eq!(throttle.tick_at(start + LOG_EVERY), None);
}
