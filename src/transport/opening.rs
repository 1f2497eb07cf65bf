//! Whether a connection has finished its opening: the bytes a client must send before the
//! connection counts as open (the HTTP/2 client preface on the gRPC port, the first HTTP/1
//! request line on the admin ports). Until then it is held to the handshake deadline
//! ([`super::Guarded`]), so a client that connects and never starts talking HTTP is closed
//! within `--handshake-timeout` rather than the much longer idle timeout.
//!
//! Pure: fed the bytes read, in order, and nothing else. It only counts bytes; whether they
//! are valid is for hyper to judge (invalid ones close the connection at once anyway).

/// What a client must send first on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// The HTTP/2 client connection preface (RFC 9113 §3.4): the 24-byte magic
    /// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`, then a whole SETTINGS frame.
    Http2Preface,
    /// The first HTTP/1 request line, up to its line feed (empty lines before it, which
    /// RFC 9112 §2.2 lets a server skip, do not count).
    RequestLine,
}

/// Length of the HTTP/2 preface's magic.
const MAGIC: u64 = 24;
/// Length of an HTTP/2 frame header; its first 3 bytes are the payload length.
const FRAME_HEADER: u64 = 9;

/// How far a connection is through its [`Opening`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// `seen` bytes of the HTTP/2 preface read; `frame_len` accumulates the length of the
    /// frame after the magic (complete once `seen` is past its 3 bytes).
    Preface { seen: u64, frame_len: u64 },
    /// Waiting for the line feed ending the first request line; `started` once a byte other
    /// than CR or LF was read.
    RequestLine { started: bool },
    /// The opening is complete.
    Done,
}

impl Progress {
    /// Nothing read yet.
    pub(crate) fn new(opening: Opening) -> Progress {
        match opening {
            Opening::Http2Preface => Progress::Preface {
                seen: 0,
                frame_len: 0,
            },
            Opening::RequestLine => Progress::RequestLine { started: false },
        }
    }

    /// Whether the opening is complete.
    pub(crate) fn is_done(&self) -> bool {
        *self == Progress::Done
    }

    /// Moves on over `bytes`, the next bytes read from the connection.
    pub(crate) fn advance(&mut self, bytes: &[u8]) {
        match self {
            Progress::Done => {}
            Progress::Preface { seen, frame_len } => {
                let start = *seen;
                let end = start + bytes.len() as u64;
                // The frame's 3-byte length follows the magic.
                for at in start.max(MAGIC)..end.min(MAGIC + 3) {
                    // `at - start` < `bytes.len()`: within the chunk.
                    let byte = bytes[(at - start) as usize];
                    *frame_len = *frame_len << 8 | u64::from(byte);
                }
                *seen = end;
                if end >= MAGIC + 3 && end >= MAGIC + FRAME_HEADER + *frame_len {
                    *self = Progress::Done;
                }
            }
            Progress::RequestLine { started } => {
                for &byte in bytes {
                    match byte {
                        b'\n' if *started => {
                            *self = Progress::Done;
                            return;
                        }
                        b'\r' | b'\n' => {}
                        _ => *started = true,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
}
