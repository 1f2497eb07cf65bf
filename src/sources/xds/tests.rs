use super::*;

const BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(10),
    max: Duration::from_secs(60),
    jitter: 0.5,
};

/// Delays double from the initial one up to the maximum.
#[test]
fn backoff_doubles_up_to_the_maximum() {
    let middle: Vec<u64> = (0..5).map(|a| BACKOFF.delay(a, 0.5).as_secs()).collect();
    assert_eq!(middle, [10, 20, 40, 60, 60]);
}

/// Jitter spreads a delay by ± the fraction, never past the maximum.
#[test]
fn backoff_is_jittered_within_bounds() {
    assert_eq!(BACKOFF.delay(0, 0.0), Duration::from_secs(5));
    assert_eq!(BACKOFF.delay(0, 1.0), Duration::from_secs(15));
    assert_eq!(BACKOFF.delay(9, 1.0), Duration::from_secs(60));
    assert_eq!(BACKOFF.delay(u32::MAX, 0.0), Duration::from_secs(30));
}
