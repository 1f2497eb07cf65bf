use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn fed(opening: Opening, chunks: &[&[u8]]) -> Progress {
    let mut progress = Progress::new(opening);
    for chunk in chunks {
        progress.advance(chunk);
    }
    progress
}

/// The HTTP/2 opening is the magic and one whole frame, however the bytes are split.
#[test]
fn preface_is_the_magic_and_a_whole_frame() {
    // An empty SETTINGS frame: length 0.
    let empty: Vec<u8> = [PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat();
    // SETTINGS with one setting: length 6 (0x000006), then 6 payload bytes.
    let one: Vec<u8> = [PREFACE, &[0, 0, 6, 4, 0, 0, 0, 0, 0], &[0, 3, 0, 0, 0, 100]].concat();
    for message in [&empty, &one] {
        assert!(fed(Opening::Http2Preface, &[message]).is_done());
        assert!(!fed(Opening::Http2Preface, &[&message[..message.len() - 1]]).is_done());
        for split in 0..message.len() {
            let (a, b) = message.split_at(split);
            assert!(
                fed(Opening::Http2Preface, &[a, b]).is_done(),
                "split {split}"
            );
            let bytes: Vec<&[u8]> = message.chunks(1).collect();
            assert!(fed(Opening::Http2Preface, &bytes).is_done());
        }
    }
    assert!(!fed(Opening::Http2Preface, &[PREFACE]).is_done());
    // A large length is read as such: 0x010000 bytes of payload still to come.
    let large: Vec<u8> = [PREFACE, &[1, 0, 0, 4, 0, 0, 0, 0, 0]].concat();
    assert!(!fed(Opening::Http2Preface, &[&large, &[0; 0xffff]]).is_done());
    assert!(fed(Opening::Http2Preface, &[&large, &[0; 0x10000]]).is_done());
}

/// The HTTP/1 opening ends at the first line feed after something other than CR/LF.
#[test]
fn request_line_ends_at_its_line_feed() {
    assert!(fed(Opening::RequestLine, &[b"GET / HTTP/1.1\r\n"]).is_done());
    assert!(
        fed(
            Opening::RequestLine,
            &[b"GET /health", b"check HTTP/1.1\r", b"\n"]
        )
        .is_done()
    );
    assert!(!fed(Opening::RequestLine, &[b"GET /healthch"]).is_done());
    // Empty lines before the request line do not open the connection.
    assert!(!fed(Opening::RequestLine, &[b"\r\n\r\n", b"\n"]).is_done());
    assert!(fed(Opening::RequestLine, &[b"\r\n", b"G\n"]).is_done());
}
