use super::*;
use crate::limiter::Algorithm;
use crate::store::redis::apply::tests::{op, shared_counter_op};
use crate::store::redis::apply::{Action, command};

/// The length of the whole frame at the start of `buf`, parsed in one go with no cap.
fn whole(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    Parser::new().frame_len(buf, usize::MAX)
}

/// Replies floodgate's calls get, and the shapes RESP2 allows around them.
const REPLIES: [&[u8]; 12] = [
    b"+OK\r\n",
    b"+\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b":42\r\n",
    b":-1\r\n",
    b"$5\r\nhe\r\no\r\n",
    b"$0\r\n\r\n",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
    b"*3\r\n:-1\r\n:17\r\n*2\r\n+\r\n$2\r\n\r\r\r\n",
];

/// A script reply as `lua/apply.lua` sends it: a bulk string of packed doubles, which
/// hold CR and LF bytes anywhere.
fn script_reply() -> Vec<u8> {
    let payload: Vec<u8> = [1.0f64, 0.0, 1.0, 13.0, 10.0, 0.0, -1.0, 3338.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut frame = format!("${}\r\n", payload.len()).into_bytes();
    frame.extend_from_slice(&payload);
    frame.extend_from_slice(b"\r\n");
    frame
}

/// Frames are measured whole, nested arrays included, and not before their last byte;
/// the bytes after a frame are the next one's.
#[test]
fn frames_are_found_whole() {
    for frame in REPLIES.iter().map(|f| f.to_vec()).chain([script_reply()]) {
        assert_eq!(whole(&frame), Ok(Some(frame.len())), "{frame:?}");
        for cut in 0..frame.len() {
            assert_eq!(whole(&frame[..cut]), Ok(None), "{frame:?} at {cut}");
        }
        let mut two = frame.clone();
        two.extend_from_slice(b"+OK\r\n");
        assert_eq!(whole(&two), Ok(Some(frame.len())));
    }
    for bad in [
        &b"?x\r\n"[..],
        b"$x\r\n",
        b"$1\r\nab\r\n",
        b"+a\rb",
        b"\r\n",
        b"*x\r\n",
    ] {
        assert_eq!(whole(bad), Err(FrameError::Malformed), "{bad:?}");
    }
}

/// Every reply split at every byte offset, the parser resuming on the longer buffer,
/// parses as it does read at once; so does every reply read one byte at a time, and a
/// run of replies read in arbitrary cuts, each reply's length found in turn.
#[test]
fn a_resumed_parse_is_the_parse_at_once() {
    let replies: Vec<Vec<u8>> = REPLIES
        .iter()
        .map(|f| f.to_vec())
        .chain([script_reply()])
        .collect();
    for frame in &replies {
        for cut in 0..=frame.len() {
            let mut parser = Parser::new();
            let first = parser.frame_len(&frame[..cut], usize::MAX);
            let expected = if cut == frame.len() {
                Some(frame.len())
            } else {
                None
            };
            assert_eq!(first, Ok(expected), "{frame:?} cut at {cut}");
            if cut < frame.len() {
                assert_eq!(
                    parser.frame_len(frame, usize::MAX),
                    Ok(Some(frame.len())),
                    "{frame:?} resumed after {cut}"
                );
            }
            assert_eq!(parser, Parser::new(), "ready for the next reply");
        }
        let mut parser = Parser::new();
        for end in 1..frame.len() {
            assert_eq!(parser.frame_len(&frame[..end], frame.len()), Ok(None));
        }
        assert_eq!(parser.frame_len(frame, frame.len()), Ok(Some(frame.len())));
    }
    // All the replies back to back, read in cuts of every size from 1 to 13 bytes.
    let stream: Vec<u8> = replies.concat();
    for step in 1..=13 {
        let (mut parser, mut start, mut found) = (Parser::new(), 0, Vec::new());
        let mut end = 0;
        while end < stream.len() {
            end = (end + step).min(stream.len());
            while let Some(len) = parser.frame_len(&stream[start..end], usize::MAX).unwrap() {
                found.push(len);
                start += len;
            }
        }
        let lengths: Vec<usize> = replies.iter().map(Vec::len).collect();
        assert_eq!(found, lengths, "cuts of {step}");
    }
}

/// A reply of exactly its cap is whole; one byte more is refused, and the refusal comes
/// as soon as the headers tell: a bulk string announced past the cap, an array announcing
/// more elements than the bytes left could hold (every element takes 3 at least, so
/// counts that would wrap are refused too), and a line, or a run of bytes with no line
/// end at all, longer than the cap.
#[test]
fn a_reply_past_its_cap_is_refused_at_once() {
    let reply = script_reply();
    let cap = reply.len();
    assert_eq!(Parser::new().frame_len(&reply, cap), Ok(Some(cap)));
    let longer = format!("${}\r\n", cap - 5).into_bytes();
    let too_large = Err(FrameError::TooLarge { cap });
    assert_eq!(Parser::new().frame_len(&longer, cap), too_large);
    let max = i64::MAX;
    for header in [
        format!("*{}\r\n", cap / 3),
        format!("*2\r\n*{}\r\n", cap / 3),
        format!("*{max}\r\n*{max}\r\n*5\r\n:1\r\n"),
        format!("${max}\r\n"),
        "$536870912\r\n".to_string(),
        "*2147483647\r\n".to_string(),
    ] {
        assert_eq!(Parser::new().frame_len(header.as_bytes(), cap), too_large);
    }
    let fits = format!("*{}\r\n", (cap - 5) / 3);
    assert_eq!(Parser::new().frame_len(fits.as_bytes(), cap), Ok(None));
    let line = vec![b'+'; cap - 1];
    assert_eq!(Parser::new().frame_len(&line, cap), too_large);
    assert_eq!(Parser::new().frame_len(&line[..cap - 2], cap), Ok(None));
    let mut cr_last = vec![b'+'; cap - 1];
    cr_last.push(b'\r');
    assert_eq!(Parser::new().frame_len(&cr_last, cap), too_large);
}

/// A reply read a byte at a time is searched once: the parser's place only moves
/// forward, and a bulk string's payload, CR bytes included, is never searched for a line
/// end.
#[test]
fn the_search_resumes_where_it_stopped() {
    let mut parser = Parser::new();
    let line = b"+aaaaaaaa";
    for end in 1..=line.len() {
        assert_eq!(parser.frame_len(&line[..end], 64), Ok(None));
        assert_eq!(parser.scanned, end);
    }
    let mut parser = Parser::new();
    let bulk = b"$6\r\n\r\r\r\r\r\r\r\n";
    for end in 4..bulk.len() {
        assert_eq!(parser.frame_len(&bulk[..end], 64), Ok(None));
        assert_eq!(parser.scanned, 2, "resumes at the header's CR");
    }
}

/// RESP integers: digits, an optional minus, nothing else, no overflow.
#[test]
fn integers_are_checked() {
    assert_eq!(parse_int(b"42"), Some(42));
    assert_eq!(parse_int(b"-1"), Some(-1));
    for bad in [&b""[..], b"-", b"4x", b" 4", b"99999999999999999999"] {
        assert_eq!(parse_int(bad), None, "{bad:?}");
    }
}

/// A reply's cap: [`MAX_REPLY`], or a larger expected bulk string with its framing.
#[test]
fn a_reply_cap_is_the_cap_or_the_expected_reply() {
    assert_eq!(reply_cap(0), MAX_REPLY);
    assert_eq!(reply_cap(1 << 20), (1 << 20) + BULK_FRAMING);
}

/// A bulk string's payload is taken as it is, binary bytes and CR LF included.
#[test]
fn bulk_payload_is_the_bytes() {
    assert_eq!(
        bulk_payload(b"$4\r\n\r\n\0\x01\r\n"),
        Some(&b"\r\n\0\x01"[..])
    );
    assert_eq!(bulk_payload(b"$0\r\n\r\n"), Some(&b""[..]));
    assert_eq!(bulk_payload(b"$-1\r\n"), None);
    assert_eq!(bulk_payload(b"-ERR x\r\n"), None);
}

/// The RESP the store writes itself is byte for byte what redis-rs packs for
/// [`command`]: every kind of op, a reference counter, `now` given or not, no op at all.
#[test]
fn written_command_is_the_packed_command() {
    let shared = shared_counter_op();
    let mut overdraft = op(Algorithm::FixedWindow, -2, false);
    overdraft.params.overdraft = true;
    overdraft.debited_in = Some(28_333_333);
    let ops = [
        op(Algorithm::TokenBucket, 3, true),
        overdraft,
        shared,
        op(Algorithm::SlidingWindow, i64::MIN, true),
    ];
    for (ops, now) in [
        (&ops[..], None),
        (&ops[..], Some(1_750_000_000_123_456)),
        (&ops[..1], Some(-5)),
        (&[][..], None),
    ] {
        let mut written = b"leftover".to_vec();
        Call::Alone(ScriptCall::new(b"fg:", ops, now, Action::Apply)).write(&mut written);
        let mut packed = b"leftover".to_vec();
        packed.extend_from_slice(&command(b"fg:", ops, now).get_packed_command());
        assert_eq!(written, packed, "{} ops, now {now:?}", ops.len());
    }
}
