//! RESP2 framing: the commands a connection writes ([`Call`], encoded straight into the
//! connection's output buffer) and the replies it reads (where each whole reply ends in the
//! bytes read so far; the connection's task, `task.rs`, hands each whole reply to its caller).
//!
//! A parser resumes where it stopped and caps what it buffers. A reply arrives in as many
//! reads as the network cuts it into; the parser keeps its place between them (how far the
//! reply is parsed, how many elements are still to come, how far the current line was searched
//! for its end), so each byte is looked at once however the reply is cut, and a reply streamed
//! a few bytes at a time costs what it costs read at once. Each reply has a cap, the most
//! bytes its caller can use: a reply that cannot fit in it (a line longer than what is left, a
//! bulk string announced longer, an array announcing more elements than the bytes left could
//! hold) is refused as soon as that is known, before its bytes are read, let alone buffered.

use redis::Cmd;
use thiserror::Error;

use crate::store::redis::apply::{self, ScriptCall};

/// Why the bytes read are not a reply the connection can hand out: the connection closes.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub(super) enum FrameError {
    /// Not RESP2.
    #[error("malformed reply from Redis")]
    Malformed,
    /// More than the caller waiting for it can take.
    #[error("a reply from Redis larger than the {cap} bytes its call can take")]
    TooLarge {
        /// The reply's cap.
        cap: usize,
    },
}

/// The fewest bytes an element of a reply takes (`+\r\n`, an empty simple string): what an
/// array's announced length costs at least, before any of its elements is read.
const LEAST_ELEMENT: u64 = 3;

/// Where the parse of the reply at the start of the unread bytes stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Parser {
    /// Bytes of the reply parsed: every element before this offset is whole.
    at: usize,
    /// Elements still to read: 1 for the reply itself, plus what its arrays announced.
    left: u64,
    /// Where the search for the end (`\r`) of the line at `at` resumes.
    scanned: usize,
}

impl Default for Parser {
    fn default() -> Parser {
        Parser::new()
    }
}

impl Parser {
    /// A parser at the start of a reply.
    pub(super) const fn new() -> Parser {
        Parser {
            at: 0,
            left: 1,
            scanned: 0,
        }
    }

    /// The length of the whole reply at the start of `buf`, `None` while it is incomplete.
    /// Until it answers `Some` (or an error) each call must see the same reply at the start of
    /// `buf`, with the bytes given before unchanged and perhaps more after them; after `Some`
    /// the parser starts on the next reply. `cap` is the most bytes the reply may take: one
    /// that cannot fit is [`FrameError::TooLarge`] as soon as its headers say so.
    pub(super) fn frame_len(
        &mut self,
        buf: &[u8],
        cap: usize,
    ) -> Result<Option<usize>, FrameError> {
        let too_large = FrameError::TooLarge { cap };
        while self.left > 0 {
            let from = self.scanned.max(self.at);
            let Some(cr) = buf
                .get(from..)
                .and_then(|rest| rest.iter().position(|&b| b == b'\r'))
                .map(|i| from + i)
            else {
                self.scanned = buf.len().max(from);
                // The line ends later, with its CR LF still to come.
                if buf.len().saturating_add(2) > cap {
                    return Err(too_large);
                }
                return Ok(None);
            };
            self.scanned = cr;
            if cr + 1 >= buf.len() {
                if cr + 2 > cap {
                    return Err(too_large);
                }
                return Ok(None);
            }
            if cr == self.at || buf[cr + 1] != b'\n' {
                return Err(FrameError::Malformed);
            }
            let (kind, number) = (buf[self.at], &buf[self.at + 1..cr]);
            let mut next = cr + 2;
            let mut left = self.left - 1;
            match kind {
                b'+' | b'-' | b':' => {}
                b'$' => {
                    let n = parse_int(number).ok_or(FrameError::Malformed)?;
                    // Negative: a nil, no payload.
                    if let Ok(n) = usize::try_from(n) {
                        let end = next
                            .checked_add(n)
                            .and_then(|end| end.checked_add(2))
                            .filter(|&end| end <= cap)
                            .ok_or(too_large)?;
                        if buf.len() < end {
                            // Resumed at this header's `\r` (`scanned`): the payload, which
                            // may hold CR bytes, is not searched.
                            return Ok(None);
                        }
                        if &buf[end - 2..end] != b"\r\n" {
                            return Err(FrameError::Malformed);
                        }
                        next = end;
                    }
                }
                b'*' => {
                    let n = parse_int(number).ok_or(FrameError::Malformed)?;
                    // Negative: a nil array, no elements.
                    if let Ok(n) = u64::try_from(n) {
                        left = left.checked_add(n).ok_or(too_large)?;
                    }
                }
                _ => return Err(FrameError::Malformed),
            }
            // The elements still to come cannot fit in what the cap leaves: refused now, not
            // once their bytes have been read.
            let least = left
                .checked_mul(LEAST_ELEMENT)
                .and_then(|bytes| usize::try_from(bytes).ok())
                .and_then(|bytes| bytes.checked_add(next))
                .ok_or(too_large)?;
            if least > cap {
                return Err(too_large);
            }
            self.at = next;
            self.left = left;
            self.scanned = next;
        }
        let len = self.at;
        *self = Parser::new();
        Ok(Some(len))
    }
}

/// A RESP integer (an optional `-`, then decimal digits).
pub(super) fn parse_int(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -n } else { n })
}

/// One reply as it came: a whole RESP2 frame.
pub type Frame = Vec<u8>;

/// The most bytes a reply may take, unless its call expects a longer one (a script call's
/// own reply, when larger). What floodgate asks Redis for is answered in far less, the
/// largest being a merged script call's (`merge::LARGEST_MERGED_REPLY`: 22,016 bytes of
/// payload); `SCRIPT LOAD` answers a 40-byte SHA1, RLQS's share script at most 100
/// integers, an error a line of a few hundred bytes. A longer reply comes from a peer that
/// is not a sane Redis (or from a man in the middle): it is refused as soon as its headers
/// say so, and the connection closes. The read buffer holds one reply and one read past it,
/// so it never grows past twice this (or twice the largest reply a waiting call expects).
pub const MAX_REPLY: usize = 32 * 1024;

/// The most an output buffer keeps once its commands are out: above it, a burst's memory
/// goes back rather than staying with the connection.
pub(super) const OUT_KEEP: usize = 256 * 1024;

/// The framing of a bulk-string reply around its payload: `$`, up to 20 digits, two CR LFs.
pub(super) const BULK_FRAMING: usize = 25;

/// The most bytes the reply of a call expecting a bulk string of `payload` bytes may take:
/// [`MAX_REPLY`], or the bulk string framed if that is longer (a script call alone of more
/// keys than a merged call holds).
pub(super) fn reply_cap(payload: usize) -> usize {
    MAX_REPLY.max(payload.saturating_add(BULK_FRAMING))
}

/// The payload of a bulk-string reply frame (`$<n>\r\n<payload>\r\n`), `None` for any other
/// frame.
pub fn bulk_payload(frame: &[u8]) -> Option<&[u8]> {
    let rest = frame.strip_prefix(b"$")?;
    let end = rest.iter().position(|&b| b == b'\r')?;
    let n = usize::try_from(parse_int(&rest[..end])?).ok()?;
    rest.get(end + 2..end + 2 + n)
}

/// A call, as data: what a caller hands its connection ([`super::Conn::call`]), which writes
/// it as RESP into its output buffer while it holds it. The caller's code never runs there:
/// the call goes down once, and its reply comes back once.
#[derive(Clone, Copy, Debug)]
pub enum Call<'a> {
    /// A command redis-rs built (setup, the probe, `SCRIPT LOAD`, the RLQS share tables'
    /// scripts): a command of its own, whose reply may take [`MAX_REPLY`].
    Command(&'a Cmd),
    /// A call of the store's script with Redis `TIME` (its `now_us` is `None`): merged into
    /// one `EVALSHA` with the script calls written with it (`merge.rs`), its reply still its
    /// own.
    Script(ScriptCall<'a>),
    /// A call of the store's script as a command of its own: `EVALSHA sha #ops KEYS… now
    /// ops`, byte for byte what redis-rs packs for [`apply::command`].
    Alone(ScriptCall<'a>),
}

impl Call<'_> {
    /// Appends the call as one whole RESP2 command to `out` (a [`Call::Script`] as a command
    /// of its own, as [`Call::Alone`]; merging is the connection's, `merge.rs`).
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Call::Command(cmd) => cmd.write_packed_command(out),
            Call::Script(call) | Call::Alone(call) => write_script(out, call),
        }
    }

    /// The bytes of the bulk string the call is answered with (0: not a bulk string it
    /// expects, so [`MAX_REPLY`] caps its reply).
    pub(super) fn reply_bytes(&self) -> usize {
        match self {
            Call::Command(_) => 0,
            Call::Script(call) | Call::Alone(call) => call.reply_bytes,
        }
    }
}

/// A script call alone, as [`apply::command`] packs it: no `Cmd`, no second copy.
fn write_script(out: &mut Vec<u8>, call: &ScriptCall<'_>) {
    let mut number = Number::default();
    out.push(b'*');
    out.extend_from_slice(number.of(5 + call.ops.len() as u64));
    out.extend_from_slice(b"\r\n$7\r\nEVALSHA\r\n");
    bulk(out, call.sha.as_bytes());
    bulk(out, number.of(call.ops.len() as u64));
    write_keys(out, call);
    match call.now_us {
        // Only tests fix the time: the production call asks Redis `TIME` ("").
        Some(now) => bulk(out, now.to_string().as_bytes()),
        None => bulk(out, b""),
    }
    write_blob(out, call);
}

/// The KEYS of a script call ([`apply::op_key`]), as RESP bulk strings.
pub(super) fn write_keys(out: &mut Vec<u8>, call: &ScriptCall<'_>) {
    for op in call.ops {
        match &op.reference {
            Some(counter) => bulk(out, &counter.key()),
            None => {
                let key = op.key.as_bytes();
                bulk_header(out, (call.prefix.len() + key.len()) as u64);
                out.extend_from_slice(call.prefix);
                out.extend_from_slice(key);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// Every op's numbers of a script call ([`apply::op_numbers`]), as one RESP bulk string.
pub(super) fn write_blob(out: &mut Vec<u8>, call: &ScriptCall<'_>) {
    bulk_header(out, (call.ops.len() * apply::OP_BYTES) as u64);
    for op in call.ops {
        for value in apply::op_numbers(op, call.action) {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// A RESP bulk string.
pub(super) fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    bulk_header(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A RESP bulk string's `$<len>\r\n`.
fn bulk_header(out: &mut Vec<u8>, len: u64) {
    out.push(b'$');
    out.extend_from_slice(Number::default().of(len));
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of a number, without `fmt`'s machinery.
#[derive(Default)]
struct Number([u8; 20]);

impl Number {
    fn of(&mut self, mut n: u64) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &self.0[at..];
            }
        }
    }
}

#[cfg(test)]
mod tests;
