use super::*;

/// Demand is requests per period over the elapsed time; unknown for 0 s.
#[test]
fn demand_is_scaled_to_the_period() {
    let limit = SharedLimit {
        table: String::new(),
        rule: String::new(),
        capacity: 100,
        period_s: 60,
        burst: 100,
    };
    let secs = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    assert_eq!(demand(&limit, 10, secs(5)), Some(120));
    assert_eq!(demand(&limit, 10, secs(0)), None);
    assert_eq!(demand(&limit, 10, None), None);
}

/// A row outlives its assignment.
#[test]
fn rows_outlive_assignments() {
    let ttl = Duration::from_secs(4);
    assert_eq!(row_life(ttl), 5_000_000);
}
