//! Opening and reading one limits file so that no file can block the loader or exhaust
//! memory, and bounding how long a whole load may take.
//!
//! A limits directory is written by whoever controls the ConfigMap; a mistake or a hostile
//! entry must cost one error line, not the server. So each listed file is:
//!
//! - **opened without blocking** (`O_NONBLOCK`: opening a FIFO for reading would otherwise
//!   wait for a writer forever) and **read only if it is a regular file**, checked on the
//!   opened file itself (a FIFO, a socket or a device such as `/dev/zero`, reached directly
//!   or through a symlink, is refused);
//! - **read up to [`MAX_FILE_BYTES`]**, and a whole load up to [`MAX_LOAD_BYTES`]; a load
//!   holds at most [`Defaults::max_rules`](super::Defaults::max_rules) rules (default
//!   [`MAX_LOAD_RULES`]), counted before compiling, for files and xDS pushes alike;
//! - **refused when its flow collections (`[...]`, `{...}`) nest deeper than
//!   [`MAX_FLOW_DEPTH`]**, before the YAML parser sees it: libyaml's scanner costs time
//!   quadratic in that depth (100,000 levels pin a core for many seconds), and no limits file
//!   needs more than a few levels.
//!
//! A listing is bounded too: at most [`MAX_FILES`] directory entries are looked at and the
//! reference layout's walk goes at most [`MAX_WALK_DEPTH`] directories deep; past either the
//! load is refused, naming the directory, and the limits in force stay.
//!
//! [`load_within`] runs a load on its own thread and gives up after a deadline, so reload and
//! shutdown never wait on it; at most [`MAX_LOADS_RUNNING`] loads run at once, abandoned ones
//! included.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::{Config, ConfigError, ConfigErrors};

/// Largest limits file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Most bytes one load reads, all files of a directory together.
pub const MAX_LOAD_BYTES: u64 = 64 * 1024 * 1024;

/// Most rules one load may hold by default (`--max-load-rules`): every descriptor of every
/// file (or pushed `RateLimitConfig`), nested ones included, counted before anything is
/// compiled. A pushed configuration has no file size to bound it: a 3.4 MB protobuf
/// message carries 200,000 descriptors, and each rule costs a few KiB from the YAML it is
/// converted to up to the matching tree, so this keeps a load within a pod's memory.
pub const MAX_LOAD_RULES: usize = 20_000;

/// Deepest nesting of YAML flow collections accepted in a limits file.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Most directory entries one listing looks at (files and directories together). A ConfigMap
/// holds at most 1 MiB, so thousands of keys at the very most; a million empty files would
/// otherwise pass the byte bounds and cost a `stat` each on every reload.
pub const MAX_FILES: usize = 10_000;

/// Deepest directory the reference layout's recursive walk enters, below its start.
pub const MAX_WALK_DEPTH: usize = 32;

/// Longest a load (reading, parsing, validating every file) may take before it is abandoned.
pub const LOAD_DEADLINE: Duration = Duration::from_secs(10);

/// Most loads running at once, abandoned ones included: a file that makes every load slow
/// costs at most this many busy threads.
pub const MAX_LOADS_RUNNING: usize = 3;

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

/// Refuses YAML whose flow collections nest deeper than [`MAX_FLOW_DEPTH`].
///
/// Follows YAML's lexical rules as far as they decide what is structure, so that no text
/// (a quoted or block scalar, a comment) can hide nesting from it: `#` starts a comment where
/// a node may start (line start, after white space); a quote starts a quoted scalar only
/// where a node starts (line start, after white space, `[`, `{`, `,`, `:`); outside flow
/// collections, `|` or `>` ending a line starts a block scalar, whose lines (blank, or at
/// least as indented as its first) are text; `[` and `{` open a collection where a node
/// starts, and anywhere inside one. Where it errs, it errs towards counting deeper.
fn check_flow_depth(content: &str) -> Result<(), String> {
    let bytes = content.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    // Whether a node may start here (the previous byte was a separator).
    let mut node_start = true;
    // Indentation of the current line.
    let mut line_indent = 0usize;
    while let Some(&c) = bytes.get(i) {
        i += 1;
        match c {
            b'\n' => {
                line_indent = bytes[i..].iter().take_while(|&&b| b == b' ').count();
                node_start = true;
                continue;
            }
            b'#' if node_start => {
                i = line_end(bytes, i);
                continue;
            }
            b'"' if node_start => {
                while let Some(&c) = bytes.get(i) {
                    i += 1;
                    match c {
                        b'\\' => i += 1,
                        b'"' => break,
                        _ => {}
                    }
                }
                node_start = false;
                continue;
            }
            b'\'' if node_start => {
                while let Some(&c) = bytes.get(i) {
                    i += 1;
                    // '' is an escaped quote inside the scalar.
                    if c == b'\'' {
                        if bytes.get(i) == Some(&b'\'') {
                            i += 1;
                        } else {
                            break;
                        }
                    }
                }
                node_start = false;
                continue;
            }
            b'|' | b'>' if node_start && depth == 0 => {
                if let Some(end) = block_scalar_end(bytes, i, line_indent) {
                    i = end;
                    continue;
                }
            }
            b'[' | b'{' if node_start || depth > 0 => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    return Err(format!(
                        "flow collections ([...] or {{...}}) nested deeper than {MAX_FLOW_DEPTH} \
                         levels"
                    ));
                }
                node_start = true;
                continue;
            }
            b']' | b'}' if depth > 0 => {
                depth -= 1;
                node_start = false;
                continue;
            }
            b',' if depth > 0 => {
                node_start = true;
                continue;
            }
            _ => {}
        }
        node_start = c.is_ascii_whitespace() || c == b':';
    }
    Ok(())
}

/// The index of the next newline at or after `from` (or the end).
fn line_end(bytes: &[u8], from: usize) -> usize {
    bytes[from.min(bytes.len())..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |at| from + at)
}

/// Where the block scalar whose indicator ends just before `from` ends (at the newline
/// before its first line of structure), or `None` if the indicator is not one (more text
/// follows it on its line).
fn block_scalar_end(bytes: &[u8], from: usize, parent_indent: usize) -> Option<usize> {
    let header_end = line_end(bytes, from);
    let header = &bytes[from..header_end];
    let before_comment = header
        .windows(2)
        .position(|w| w[0].is_ascii_whitespace() && w[1] == b'#')
        .map_or(header, |at| &header[..at]);
    if !before_comment
        .iter()
        .all(|&b| matches!(b, b'+' | b'-' | b'0'..=b'9') || b.is_ascii_whitespace())
    {
        return None;
    }
    // An explicit indentation indicator fixes the content's indentation.
    let explicit = before_comment
        .iter()
        .find(|b| b.is_ascii_digit())
        .map(|&d| parent_indent + usize::from(d - b'0'));
    let mut content_indent = explicit;
    let mut at = header_end;
    while at < bytes.len() {
        let line_start = at + 1;
        let next = line_end(bytes, line_start);
        let line = &bytes[line_start.min(bytes.len())..next];
        let indent = line.iter().take_while(|&&b| b == b' ').count();
        let blank = line.iter().all(|b| b.is_ascii_whitespace());
        if !blank {
            let needed = *content_indent.get_or_insert(indent);
            if indent < needed || indent <= parent_indent {
                return Some(at);
            }
        }
        at = next;
    }
    Some(at)
}

/// Runs `load` (of the limits at `label`), giving up after `deadline` (an error naming
/// `label`); the load itself runs on its own thread and finishes, or not, in the background.
pub(super) fn load_within(
    label: String,
    deadline: Duration,
    load: impl FnOnce() -> Result<Config, ConfigErrors> + Send + 'static,
) -> Result<Config, ConfigErrors> {
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    let refuse = |message: String| {
        Err(ConfigErrors(vec![ConfigError {
            file: label.clone(),
            path: String::new(),
            message,
        }]))
    };
    if RUNNING
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_LOADS_RUNNING).then_some(n + 1)
        })
        .is_err()
    {
        return refuse(format!(
            "{MAX_LOADS_RUNNING} earlier loads are still running (each abandoned after \
             {deadline:?}); not loading again until one ends"
        ));
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("limits-load".into())
        .spawn(move || {
            let loaded = load();
            RUNNING.fetch_sub(1, Ordering::AcqRel);
            // The receiver is gone when the load was abandoned.
            let _ = tx.send(loaded);
        });
    if let Err(e) = spawned {
        RUNNING.fetch_sub(1, Ordering::AcqRel);
        return refuse(format!("cannot start the load: {e}"));
    }
    match rx.recv_timeout(deadline) {
        Ok(loaded) => loaded,
        Err(_) => refuse(format!(
            "loading took longer than {deadline:?} and was abandoned; the previous limits stay \
             in force"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(yaml: &str) -> bool {
        check_flow_depth(yaml).is_ok()
    }

    /// Deep flow nesting is refused however it is spelled; brackets in scalars and comments
    /// are not nesting.
    #[test]
    fn flow_depth_is_bounded() {
        let deep = |open: &str, n: usize| open.repeat(n);
        assert!(depth_ok(&deep("[", MAX_FLOW_DEPTH)));
        assert!(!depth_ok(&deep("[", MAX_FLOW_DEPTH + 1)));
        assert!(!depth_ok(&format!("a: {}", deep("{a: ", 100_000))));
        // A quoted closer does not hide an opener.
        assert!(!depth_ok(&deep("[ \"]\", ", MAX_FLOW_DEPTH + 1)));
        assert!(!depth_ok(&deep("[ ']''', ", MAX_FLOW_DEPTH + 1)));
        // A quote inside a plain scalar is not a quote.
        assert!(!depth_ok(&format!(
            "a: don't\nb: {}",
            deep("[x'y, ", MAX_FLOW_DEPTH + 1)
        )));
        // A block scalar's text hides nothing after it.
        assert!(!depth_ok(&format!(
            "a: |\n  \"\n  text\nb: {}",
            deep("[", MAX_FLOW_DEPTH + 1)
        )));
        assert!(depth_ok(&format!(
            "a: |\n  \"\n  {}\nb: 1\n",
            deep("[", MAX_FLOW_DEPTH + 1)
        )));
        // Brackets in plain scalars, quoted scalars and comments are text.
        let text = "domain: a[b\ndescriptors:\n  - key: \"[[[[\"\n    value: '{{{{'  # [[[[\n";
        assert!(depth_ok(&text.repeat(100)));
        assert!(depth_ok(
            "descriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]"
        ));
    }

    /// A load past its deadline is abandoned: the caller gets an error naming the path at
    /// the deadline, not when the load ends; given time, the same load succeeds.
    #[test]
    fn a_slow_load_is_abandoned_at_its_deadline() {
        let dir = tempfile::tempdir().unwrap();
        // Thousands of files: far more than a millisecond's work.
        for i in 0..2000 {
            let yaml = format!(
                "domain: d{i}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            );
            std::fs::write(dir.path().join(format!("f{i:04}.yaml")), yaml).unwrap();
        }
        let loader = super::super::Loader {
            source: super::super::Source::Path(dir.path().to_path_buf()),
            defaults: super::super::Defaults::default(),
            merge_domains: false,
        };
        let started = std::time::Instant::now();
        let errors = loader.load_within(Duration::from_millis(1)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1));
        let said = errors.to_string();
        assert!(said.contains("abandoned") && said.contains(&*dir.path().to_string_lossy()));
        let config = loader.load_within(Duration::from_secs(60)).unwrap();
        assert_eq!(config.domains().count(), 2000);
    }

    /// A FIFO, a device and a directory are refused without blocking; a file over the cap is
    /// refused; a regular file is read.
    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("x.yaml");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let mut reader = Reader::default();
        let refused = reader.read(&fifo).unwrap_err();
        assert!(refused.contains("FIFO"), "{refused}");
        let zero = reader.read(Path::new("/dev/zero")).unwrap_err();
        assert!(zero.contains("character device"), "{zero}");
        assert!(reader.read(dir.path()).unwrap_err().contains("directory"));
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(reader.read(&big).unwrap_err().contains("larger than"));
        let ok = dir.path().join("ok.yaml");
        std::fs::write(&ok, "domain: d\n").unwrap();
        assert_eq!(reader.read(&ok).unwrap(), "domain: d\n");
    }
}
