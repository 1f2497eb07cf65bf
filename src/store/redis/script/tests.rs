use super::*;

/// A request the script refused in a batch (committed -1, the error's code and the
/// operation) is `Failed` naming both, not a malformed reply.
#[test]
fn decode_refused_request() {
    let reply = packed(&[-1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    let err = decode(&reply, 1).unwrap_err();
    assert!(!err.is_transient());
    assert_eq!(
        err.to_string(),
        StoreError::Failed(
            "apply.lua refused the request: unknown algorithm for operation 3 (code 2)".into()
        )
        .to_string()
    );
}

/// A reply as the script packs it: little-endian f64s.
fn packed(values: &[f64]) -> Reply {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A well-formed reply decodes into the results settle() would give.
#[test]
fn decode_reply() {
    let reply = packed(&[
        0.0,
        0.0,
        1_700_000_000_000_000.0,
        1.0,
        4.0,
        1_500.0,
        0.0,
        28_333_333.0,
        0.0,
        0.0,
        6e7,
        5.9e7,
        -1.0,
        0.0,
        2.0,
        0.0,
        -1.0,
        -1.0,
    ]);
    let applied = decode(&reply, 3).unwrap();
    assert_eq!(
        applied,
        Applied {
            committed: false,
            from_local_cache: false,
            delay_us: 0,
            buckets: vec![
                BucketResult {
                    admitted: true,
                    view: View {
                        remaining: 4,
                        reset_us: 1_500
                    },
                    retry_after_us: Some(0),
                    window: Some(28_333_333),
                    at_us: Some(1_700_000_000_000_000),
                },
                BucketResult {
                    admitted: false,
                    view: View {
                        remaining: 0,
                        reset_us: 60_000_000
                    },
                    retry_after_us: Some(59_000_000),
                    window: None,
                    at_us: Some(1_700_000_000_000_000),
                },
                BucketResult {
                    admitted: false,
                    view: View {
                        remaining: 2,
                        reset_us: 0
                    },
                    retry_after_us: None,
                    window: None,
                    at_us: Some(1_700_000_000_000_000),
                },
            ],
        }
    );
    assert_eq!(
        decode(&packed(&[1.0, 0.0, 5.0]), 0).unwrap(),
        Applied {
            committed: true,
            buckets: vec![],
            from_local_cache: false,
            delay_us: 0,
        }
    );
}

/// Replies the script cannot produce are `Failed` (not transient) with a clear message.
#[test]
fn decode_rejects_malformed_replies() {
    let cases: [(&[f64], usize, &str); 16] = [
        (
            &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0],
            1,
            "56 bytes for 1 bucket operations, expected 8 values of 8",
        ),
        (&[1.0], 1, "8 bytes"),
        (
            &[1.0, 0.0, -5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
            1,
            "now_us is -5",
        ),
        (
            &[2.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
            1,
            "committed is 2",
        ),
        (
            &[1.0, 0.0, 5.0, 3.0, 0.0, 0.0, 0.0, -1.0],
            1,
            "admitted is 3",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, -1.0, 0.0, 0.0, -1.0],
            1,
            "remaining of operation 0 is negative",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 5.0, -1.0],
            1,
            "retry_after_us of operation 0 is 5 while admitted is true",
        ),
        (
            &[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, -2.0, -1.0],
            1,
            "retry_after_us of operation 0 is -2",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, 0.0, 0.0, 0.0, -2.0],
            1,
            "window of operation 0 is -2",
        ),
        (
            &[1.0, -1.0, 5.0, 1.0, 0.0, 0.0, 0.0, -1.0],
            1,
            "delay_us is -1",
        ),
        (
            &[0.0, 5.0, 5.0, 0.0, 0.0, 0.0, 7.0, -1.0],
            1,
            "delay_us is 5 (committed: false)",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, 0.5, 0.0, 0.0, -1.0],
            1,
            "value 4 is 0.5, not a whole number",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, f64::NAN, 0.0, 0.0, -1.0],
            1,
            "value 4 is NaN",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, f64::INFINITY, 0.0, 0.0, -1.0],
            1,
            "value 4 is inf",
        ),
        (
            &[1.0, 0.0, 5.0, 1.0, 0.0, -1.5, 0.0, -1.0],
            1,
            "value 5 is -1.5, not a whole number",
        ),
        (
            &[
                1.0,
                0.0,
                5.0,
                1.0,
                1_152_921_504_606_846_976.0,
                0.0,
                0.0,
                -1.0,
            ],
            1,
            "value 4 is 1152921504606847000, not a whole number",
        ),
    ];
    for (reply, ops, message) in cases {
        let err = decode(&packed(reply), ops).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.to_string().contains(message), "{err} lacks {message:?}");
    }
}
