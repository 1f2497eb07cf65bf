//! Merging the store's script calls into one `EVALSHA`, and splitting its reply among them.
//!
//! The script calls a connection's callers write together (before its task takes the output
//! buffer, with no other command between them) go out as one call of `lua/apply.lua` by its
//! batch convention: `EVALSHA sha K keys… "" blob_1 … blob_N`, whose reply is the calls'
//! replies concatenated in one bulk string. Each call gets its own part as a bulk string of
//! its own, so it reads exactly what a call alone reads; any other reply (an error,
//! `NOSCRIPT` included) reaches every call merged, each then acting on it as a call alone
//! would. One call alone is written exactly as [`super::Call::Alone`] writes it.

use std::io::Write as _;

use super::frame::{BULK_FRAMING, Frame, OUT_KEEP, bulk, bulk_payload, write_blob, write_keys};
use crate::store::redis::apply::ScriptCall;

/// The most calls merged into one script call. Redis runs a script to its end before it
/// serves anything else, so a merged call's size is how long it holds Redis (and the calls
/// behind it) at once: 64 requests of 4 token buckets are some 7 million instructions of
/// Redis (about 110,000 per request merged, docs/performance.md), milliseconds at most.
pub const MERGE_CALLS: usize = 64;

/// The most keys in one merged script call.
pub const MERGE_KEYS: usize = 512;

/// The most bytes of keys and operations in one merged script call.
pub const MERGE_BYTES: usize = 64 * 1024;

/// The largest reply of a merged script call: `lua/apply.lua` answers three values per call
/// (its header: `apply::reply_len`) and five per key, eight bytes each, so [`MERGE_CALLS`]
/// calls of [`MERGE_KEYS`] keys in all get (3 · 64 + 5 · 512) · 8 = 22,016 bytes, in a bulk
/// string.
pub const LARGEST_MERGED_REPLY: usize = (3 * MERGE_CALLS + 5 * MERGE_KEYS) * 8 + BULK_FRAMING;

// Every merged script call's reply fits in the cap every reply has.
const _: () = assert!(LARGEST_MERGED_REPLY <= super::frame::MAX_REPLY);

/// The script calls written since the connection's task last took the output buffer, not yet
/// in it: they go into it as one `EVALSHA` ([`Merging::write_into`]) when the task takes it,
/// when another command is written after them, or when they reach a cap ([`MERGE_CALLS`],
/// [`MERGE_KEYS`], [`MERGE_BYTES`]). Their callers' places in the queue are the last `calls`
/// of it.
#[derive(Default)]
pub(super) struct Merging {
    /// The script's SHA1 (every call merged runs the same script).
    pub(super) sha: &'static str,
    /// Every call's keys, RESP bulk strings, in order.
    pub(super) keys: Vec<u8>,
    pub(super) key_count: usize,
    /// One RESP bulk string per call: its packed operations.
    pub(super) blobs: Vec<u8>,
    pub(super) calls: usize,
}

impl Merging {
    /// Whether `call` cannot join the calls merging: they run another script, or one more
    /// call would pass a cap. They are then written out first.
    pub(super) fn is_closed_to(&self, call: &ScriptCall<'_>) -> bool {
        self.calls > 0
            && (self.sha != call.sha
                || self.calls >= MERGE_CALLS
                || self.key_count + call.ops.len() > MERGE_KEYS
                || self.keys.len() + self.blobs.len() >= MERGE_BYTES)
    }

    /// Adds `call`'s keys and operations, encoded from the borrowed call straight into the
    /// merging buffers. Should the encoding panic (a defect), the half-written call is taken
    /// back before the panic goes on: left in the buffers, it would shift every later reply
    /// on the connection to the wrong caller.
    pub(super) fn push(&mut self, call: &ScriptCall<'_>) {
        let before = (self.keys.len(), self.blobs.len());
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            write_keys(&mut self.keys, call);
            write_blob(&mut self.blobs, call);
        }));
        if let Err(panic) = written {
            self.keys.truncate(before.0);
            self.blobs.truncate(before.1);
            std::panic::resume_unwind(panic);
        }
        self.sha = call.sha;
        self.key_count += call.ops.len();
        self.calls += 1;
    }

    /// Writes the calls merging into `out` as one `EVALSHA` (one call: exactly its own
    /// command), empties the buffers, and returns how many calls it merged.
    pub(super) fn write_into(&mut self, out: &mut Vec<u8>) -> usize {
        let calls = self.calls;
        if calls == 0 {
            return 0;
        }
        // Writes into a Vec<u8>, which cannot fail.
        let _ = write!(
            out,
            "*{}\r\n$7\r\nEVALSHA\r\n",
            4 + self.key_count + self.calls
        );
        bulk(out, self.sha.as_bytes());
        bulk(out, self.key_count.to_string().as_bytes());
        out.extend_from_slice(&self.keys);
        out.extend_from_slice(b"$0\r\n\r\n");
        out.extend_from_slice(&self.blobs);
        self.keys.clear();
        self.blobs.clear();
        if self.keys.capacity() + self.blobs.capacity() > OUT_KEEP {
            self.keys = Vec::new();
            self.blobs = Vec::new();
        }
        self.key_count = 0;
        self.calls = 0;
        calls
    }
}

/// A merged script call's reply, taken apart call by call ([`Split::take`]).
pub(super) struct Split<'f> {
    frame: &'f [u8],
    /// The bulk string's payload, when it is the parts' concatenation.
    payload: Option<&'f [u8]>,
    /// Where the next call's part starts.
    at: usize,
}

/// One call's reply out of a [`Split`].
pub(super) enum Piece<'f> {
    /// Its part of the payload.
    Part(&'f [u8]),
    /// The whole reply, not the parts' concatenation (an error, say): every call gets it.
    Whole(&'f [u8]),
}

impl<'f> Split<'f> {
    /// The reply `frame` of merged calls whose parts take `total` bytes together.
    pub(super) fn new(frame: &'f [u8], total: usize) -> Split<'f> {
        Split {
            frame,
            payload: bulk_payload(frame).filter(|payload| payload.len() == total),
            at: 0,
        }
    }

    /// The next call's reply: its `part` bytes of the payload, in order, or the whole reply.
    pub(super) fn take(&mut self, part: usize) -> Piece<'f> {
        match self.payload {
            Some(payload) => {
                let piece = &payload[self.at..self.at + part];
                self.at += part;
                Piece::Part(piece)
            }
            None => Piece::Whole(self.frame),
        }
    }
}

impl Piece<'_> {
    /// The frame its caller reads: a part as a bulk string of its own, the whole reply as it
    /// came.
    pub(super) fn to_frame(&self) -> Frame {
        match self {
            Piece::Part(part) => {
                let mut own = Vec::with_capacity(part.len() + 16);
                bulk(&mut own, part);
                own
            }
            Piece::Whole(frame) => frame.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests;
