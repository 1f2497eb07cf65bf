use super::*;
use crate::limiter::{Algorithm, LimitParams};

/// The NOSCRIPT fallback is the same call with the script's source instead of its SHA.
#[test]
fn eval_fallback_keeps_keys_and_arguments() {
    let ops = [op("10.0.0.1"), op("10.0.0.2")];
    let evalsha = script::command(b"fg:", &ops, Some(5));
    let eval = eval(&evalsha);
    let words = |cmd: &Cmd| -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("only plain arguments in a script call"),
            })
            .collect()
    };
    let (a, b) = (words(&evalsha), words(&eval));
    assert_eq!(a[0], b"EVALSHA");
    assert_eq!(b[0], b"EVAL");
    assert_eq!(b[1], script::SOURCE.as_bytes());
    assert_eq!(a[2..], b[2..]);
}

fn op(value: &str) -> BucketOp {
    let params = LimitParams::of(Algorithm::TokenBucket, 7, 60, 7);
    BucketOp::debit("edge", "ip", value.as_bytes(), params, 1)
}

/// Ops are grouped by the slot of prefix + key, in order of first appearance, and every
/// op lands in exactly one group.
#[test]
fn groups_follow_slots() {
    let ops: Vec<BucketOp> = (0..40).map(|i| op(&format!("10.0.0.{i}"))).collect();
    let groups = slot_groups(b"fg:", &ops);
    assert!(groups.len() > 1, "40 keys in one slot: {groups:?}");
    let mut seen: Vec<usize> = groups.iter().flat_map(|(_, m)| m.clone()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
    for (slot, members) in &groups {
        for &i in members {
            assert_eq!(Slot::for_key(script::full_key(b"fg:", &ops[i].key)), *slot);
        }
    }
    assert_eq!(groups[0].1[0], 0);
    assert!(slot_groups(b"fg:", &[]).is_empty());
}

/// Seeds' passwords never reach Debug output.
#[test]
fn seeds_are_redacted() {
    let settings = ClusterSettings {
        seeds: vec!["redis://:s3cret@a:1".into(), "rediss://u:pw@b:2".into()],
        key_prefix: "fg:".into(),
        connect_timeout: Duration::from_millis(1),
        command_timeout: Duration::from_millis(1),
    };
    let debug = format!("{settings:?}");
    assert!(
        !debug.contains("s3cret") && !debug.contains("pw@"),
        "{debug}"
    );
}
