use super::*;
use crate::store::redis::apply::{REPLY_VALUE_BYTES, reply_len};

/// `wire::LARGEST_MERGED_REPLY` (which fits in `wire::MAX_REPLY`, checked at compile
/// time) is this script's reply format at the merge caps, framed as a bulk string.
#[test]
fn the_largest_merged_reply_fits_the_cap() {
    let payload = MERGE_CALLS * reply_len(0) * REPLY_VALUE_BYTES
        + (reply_len(MERGE_KEYS) - reply_len(0)) * REPLY_VALUE_BYTES;
    let framed = format!("${payload}\r\n").len() + payload + 2;
    assert!(framed <= LARGEST_MERGED_REPLY, "{framed}");
}
