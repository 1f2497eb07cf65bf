//! A pure check on a limits file's text before the YAML parser sees it: how deep its flow
//! collections (`[...]`, `{...}`) nest.
//!
//! libyaml's scanner costs time quadratic in that depth (100,000 levels pin a core for many
//! seconds), and no limits file needs more than a few levels, so a file nested deeper than
//! [`MAX_FLOW_DEPTH`] is refused with one error. The file source runs it on every file it
//! reads.

/// Deepest nesting of YAML flow collections accepted in a limits file.
pub const MAX_FLOW_DEPTH: usize = 64;

/// Refuses YAML whose flow collections nest deeper than [`MAX_FLOW_DEPTH`].
///
/// Follows YAML's lexical rules as far as they decide what is structure, so that no text
/// (a quoted or block scalar, a comment) can hide nesting from it: `#` starts a comment where
/// a node may start (line start, after white space); a quote starts a quoted scalar only
/// where a node starts (line start, after white space, `[`, `{`, `,`, `:`); outside flow
/// collections, `|` or `>` ending a line starts a block scalar, whose lines (blank, or at
/// least as indented as its first) are text; `[` and `{` open a collection where a node
/// starts, and anywhere inside one. Where it errs, it errs towards counting deeper.
pub fn check_flow_depth(content: &str) -> Result<(), String> {
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

#[cfg(test)]
mod tests;
