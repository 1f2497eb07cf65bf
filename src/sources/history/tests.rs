use super::*;

/// The history keeps the newest loads only, newest first, and caps long errors.
#[test]
fn keeps_the_newest_loads_and_caps_details() {
    let history = LoadHistory::default();
    for i in 0..(HISTORY_LEN as u64 + 5) {
        history.record(i, i % 2 == 0, &"x".repeat(MAX_DETAIL + 10));
    }
    let loads = history.newest_first();
    assert_eq!(loads.len(), HISTORY_LEN);
    assert_eq!(loads[0].at_unix_ms, HISTORY_LEN as u64 + 4);
    assert_eq!(loads[HISTORY_LEN - 1].at_unix_ms, 5);
    assert_eq!(loads[0].detail.chars().count(), MAX_DETAIL + 1);
}
