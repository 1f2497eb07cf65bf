use super::*;

fn message(len: usize) -> Vec<u8> {
    let mut bytes = vec![0];
    bytes.extend_from_slice(&u32::try_from(len).unwrap().to_be_bytes());
    bytes.extend(std::iter::repeat_n(7, len));
    bytes
}

/// A message is whole only once its last byte arrives, however the frames cut it, and
/// its header counts with it; an empty message is whole at its header.
#[test]
fn framing_finds_whole_messages_across_any_cut() {
    let mut stream = message(300);
    stream.extend(message(0));
    stream.extend(message(10));
    for cut in [1, 2, 3, 5, 7, 64, 305, 1000] {
        let mut framing = Framing::default();
        let mut whole = Vec::new();
        for chunk in stream.chunks(cut) {
            whole.push(framing.feed(chunk));
        }
        assert_eq!(whole.iter().sum::<usize>(), 305 + 5 + 15, "cut {cut}");
        assert_eq!(framing.current, 0, "cut {cut}");
    }
    let mut framing = Framing::default();
    assert_eq!(framing.feed(&stream[..304]), 0);
    assert_eq!(framing.feed(&stream[304..306]), 305);
    assert_eq!(framing.feed(&stream[306..]), 5 + 15);
}

/// The budget refuses what would go over it, charges nothing then, and gets back what a
/// guard held.
#[test]
fn the_budget_refuses_past_its_bound_and_gets_bytes_back() {
    let budget = BodyBudget::new(100);
    let held = budget.hold(60).unwrap();
    let refused = budget.hold(41).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(refused.message().contains("--max-in-flight-bytes"));
    assert_eq!(budget.used(), 60);
    let more = budget.hold(40).unwrap();
    drop(held);
    drop(more);
    assert_eq!(budget.used(), 0);
}
