use super::*;
use crate::store::redis::wire::frame::MAX_REPLY;

/// The merged calls' command is `EVALSHA sha K keys… "" blob_1 … blob_N`, and one call
/// alone is exactly its own `EVALSHA sha k keys… "" blob`; the first caller of a merged
/// call is marked as sharing the reply with the others, and the call is counted out.
#[test]
fn merged_calls_are_one_evalsha() {
    let mut state = State::new();
    for (calls, expected) in [
        (&[("k1", "b1")][..], &["k1", "", "b1"][..]),
        (
            &[("k1", "b1"), ("k2", "b2"), ("k3", "b3")][..],
            &["k1", "k2", "k3", "", "b1", "b2", "b3"][..],
        ),
    ] {
        for (key, blob) in calls {
            let m = &mut state.merging;
            m.sha = "sha";
            m.keys
                .extend_from_slice(format!("$2\r\n{key}\r\n").as_bytes());
            m.key_count += 1;
            m.blobs
                .extend_from_slice(format!("$2\r\n{blob}\r\n").as_bytes());
            m.calls += 1;
            state.waiting.push_back(Waiting {
                reply: None,
                deadline: None,
                shares: 0,
                part: 8,
                most: MAX_REPLY,
                script: false,
            });
        }
        state.write_merged();
        let mut command = redis::cmd("EVALSHA");
        command.arg("sha").arg(calls.len()).arg(expected);
        assert_eq!(state.out, command.get_packed_command());
        let shares = if calls.len() > 1 { calls.len() } else { 0 };
        assert_eq!(state.waiting[0].shares, shares);
        assert!(state.waiting[0].script);
        assert_eq!(state.scripts_out, 1);
        assert_eq!(state.merging.calls, 0);
        state.scripts_out = 0;
        state.out.clear();
        state.waiting.clear();
    }
}
