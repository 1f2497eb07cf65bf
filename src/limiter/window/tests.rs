use super::*;

/// floor_div returns the aligned window index at, just before and just after boundaries.
#[test]
fn floor_div_at_boundaries() {
    assert_eq!(floor_div(0, 60), 0);
    assert_eq!(floor_div(59, 60), 0);
    assert_eq!(floor_div(60, 60), 1);
    assert_eq!(floor_div(1_700_000_000_000_000, 1_000_000), 1_700_000_000);
    assert_eq!(floor_div(1_700_000_000_999_999, 1_000_000), 1_700_000_000);
}

/// A stored window later than now's (clock stepped back) moves the effective time to its
/// start; an earlier one leaves now alone.
#[test]
fn locate_clamps_to_stored_future_window() {
    let p = Position::locate(60, 119, Some(2));
    assert_eq!((p.index, p.start, p.effective), (2, 120, 120));
    assert_eq!(p.until_window_end(1), 61);
    let p = Position::locate(60, 130, Some(1));
    assert_eq!((p.index, p.start, p.effective), (2, 120, 130));
    assert_eq!(p.until_window_end(2), 110);
    assert_eq!(p.until(1, 5), 55);
}

/// Negative or far-future windows are implausible (corrupt) state.
#[test]
fn plausible_rejects_out_of_range_windows() {
    assert!(plausible(0, 1_000_000));
    assert!(plausible(MAX_NOW_US / 1_000_000, 1_000_000));
    assert!(!plausible(-1, 1_000_000));
    assert!(!plausible(MAX_NOW_US / 1_000_000 + 1, 1_000_000));
}
