//! Opening and reading one limits file so that no file can block the loader or exhaust
//! memory.
//!
//! A limits directory is written by whoever controls the ConfigMap; a mistake or a hostile
//! entry must cost one error line, not the server. So each listed file is:
//!
//! - **opened without blocking** (`O_NONBLOCK`: opening a FIFO for reading would otherwise
//!   wait for a writer forever) and **read only if it is a regular file**, checked on the
//!   opened file itself (a FIFO, a socket or a device such as `/dev/zero`, reached directly
//!   or through a symlink, is refused);
//! - **read up to [`MAX_FILE_BYTES`]**, and a whole load up to [`MAX_LOAD_BYTES`]; a load
//!   holds at most [`Defaults::max_rules`](crate::config::Defaults::max_rules) rules (default
//!   [`MAX_LOAD_RULES`](crate::config::MAX_LOAD_RULES)), counted before compiling, for files
//!   and xDS pushes alike;
//! - **refused when its flow collections (`[...]`, `{...}`) nest deeper than
//!   [`MAX_FLOW_DEPTH`](crate::config::MAX_FLOW_DEPTH)**, before the YAML parser sees it
//!   ([`config::check_flow_depth`](crate::config::check_flow_depth) says why).
//!
//! A listing is bounded too: at most [`MAX_FILES`] directory entries are looked at and the
//! reference layout's walk goes at most [`MAX_WALK_DEPTH`] directories deep; past either the
//! load is refused, naming the directory, and the limits in force stay.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::config::check_flow_depth;

/// Largest limits file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Most bytes one load reads, all files of a directory together.
pub const MAX_LOAD_BYTES: u64 = 64 * 1024 * 1024;

/// Most directory entries one listing looks at (files and directories together). A ConfigMap
/// holds at most 1 MiB, so thousands of keys at the very most; a million empty files would
/// otherwise pass the byte bounds and cost a `stat` each on every reload.
pub const MAX_FILES: usize = 10_000;

/// Deepest directory the reference layout's recursive walk enters, below its start.
pub const MAX_WALK_DEPTH: usize = 32;

/// Reads the files of one load, keeping count of the bytes read.
#[derive(Debug)]
pub(crate) struct Reader {
    remaining: u64,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            remaining: MAX_LOAD_BYTES,
        }
    }
}

impl Reader {
    /// The content of `path`, or why it cannot be used (one line, without the file name).
    pub(crate) fn read(&mut self, path: &Path) -> Result<String, String> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| format!("cannot read: {e}"))?;
        let kind = file
            .metadata()
            .map_err(|e| format!("cannot read: {e}"))?
            .file_type();
        if !kind.is_file() {
            return Err(format!(
                "cannot read: not a regular file ({}); only regular files are loaded",
                describe(kind)
            ));
        }
        let cap = MAX_FILE_BYTES.min(self.remaining);
        let content = read_capped(file, cap)?;
        let read = content.len() as u64;
        if read > cap {
            return Err(if cap < MAX_FILE_BYTES {
                format!("cannot read: the limits files together exceed {MAX_LOAD_BYTES} bytes")
            } else {
                format!("cannot read: larger than {MAX_FILE_BYTES} bytes")
            });
        }
        self.remaining -= read;
        check_flow_depth(&content)?;
        Ok(content)
    }
}

/// Up to `cap + 1` bytes of `file` (one more than allowed tells that it is too large).
fn read_capped(file: File, cap: u64) -> Result<String, String> {
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "cannot read: not valid UTF-8".to_string())
}

fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests;
