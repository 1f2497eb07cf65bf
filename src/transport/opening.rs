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
mod tests;
