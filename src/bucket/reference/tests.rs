use super::*;

/// The reference's key text for a two-entry descriptor, one entry shared by a wildcard.
#[test]
fn key_text_matches_the_reference() {
    let key = ReferenceKey::new(
        b"ratelimit_",
        "edge",
        [
            (&b"remote_address"[..], &b"10.0.0.1"[..]),
            (&b"path"[..], &b"/api/*"[..]),
        ],
    );
    assert_eq!(
        key.at(1_700_000_123, 60),
        b"ratelimit_edge_remote_address_10.0.0.1_path_/api/*_1700000100".to_vec()
    );
}

/// An empty prefix and a one-second unit give the reference's plainest key.
#[test]
fn no_prefix_per_second() {
    let key = ReferenceKey::new(b"", "d", [(&b"k"[..], &b"v"[..])]);
    assert_eq!(key.at(1_700_000_123, 1), b"d_k_v_1700000123".to_vec());
}

/// Windows use the unit's plain length: a month is 30 days, a year 365 (`UnitToDivider`).
#[test]
fn window_start_uses_the_units_length() {
    let month = 30 * 86_400;
    assert_eq!(window_start(month * 7 + 5, month), month * 7);
    assert_eq!(window_start(59, 60), 0);
    assert_eq!(window_start(60, 60), 60);
    assert_eq!(window_start(5, 0), 5);
}

/// The reset is the rest of the window, a full unit at its first second (`CalculateReset`).
#[test]
fn reset_is_the_rest_of_the_window() {
    assert_eq!(window_reset_secs(120, 60), 60);
    assert_eq!(window_reset_secs(179, 60), 1);
}

/// The expiry is the unit plus a jitter strictly below the maximum, none when it is 0.
#[test]
fn expiry_adds_jitter_below_the_maximum() {
    assert_eq!(expiry_secs(60, 0, 12345), 60);
    assert_eq!(expiry_secs(60, 10, 9), 69);
    assert_eq!(expiry_secs(60, 10, 10), 60);
    for roll in [0, 1, u64::MAX] {
        let e = expiry_secs(3600, 300, roll);
        assert!((3600..3900).contains(&e));
    }
}

/// The reference's keys are ambiguous: two different identities give one name (the
/// documented trade-off; floodgate's own encoding keeps them apart).
#[test]
fn underscore_joined_keys_collide() {
    let a = ReferenceKey::new(b"", "a_b", [(&b"c"[..], &b"d"[..])]);
    let b = ReferenceKey::new(b"", "a", [(&b"b_c"[..], &b"d"[..])]);
    assert_eq!(a, b);
}

/// A stamp fixes the window from the pod's clock and the expiry in [unit, unit + jitter);
/// the key is the base followed by the window start.
#[test]
fn stamp_names_the_window_and_expiry() {
    let mut counter =
        ReferenceCounter::new(ReferenceKey::new(b"rl_", "d", [(&b"k"[..], &b"v"[..])]));
    counter.stamp(1_700_000_123, 60, 300, 7);
    assert_eq!(counter.window_start_secs, 1_700_000_100);
    assert_eq!(counter.expiry_secs, 67);
    assert_eq!(counter.key(), b"rl_d_k_v_1700000100".to_vec());
    counter.stamp(1_700_000_123, 60, 0, 7);
    assert_eq!(counter.expiry_secs, 60);
}
