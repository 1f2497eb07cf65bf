//! The module map of `src/lib.rs` holds: every module is on it, each module uses only modules
//! on its own line or below it, and no two modules use each other, directly or through others.
//!
//! Read from the source text: every `crate::name` path (in `use` lines, in grouped
//! `use crate::{a, b::c}` imports and in expressions) outside comments is an edge from the
//! file's top-level module to `name`. Doc links do not count: they document, they do not
//! depend.
//!
//! Inside each module the same holds for its files: the files of a module's direct children
//! (`src/config/parse.rs`, `src/config/compile.rs`, …) never use each other, directly or around a
//! circle. Their edges are read from every `crate::`, `super::` and `self::` path, resolved as
//! the compiler resolves them (inline `mod tests { … }` included), to the file they land in; a
//! path through a parent's re-export counts as a use of the parent.
//!
//! A child file of `admission`, `runtime`, `server`, `service` or `settings` imports no name
//! from its parent's file (tests aside): what siblings share has a file of its own.
//!
//! And the layout holds (docs/architecture.md, "Layout and tests"): no `mod.rs` under `src/`,
//! no inline `mod tests { … }` there (a module's unit tests live in its child file
//! `tests.rs`), and no source file over 600 lines, tests aside.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Modules the map leaves out on purpose: built only for the fuzz targets.
const OFF_MAP: &[&str] = &["fuzzing"];

/// The layers of the map, top first: each bullet of `# The modules, top to bottom` names the
/// modules of one layer in its leading `[`name`]` links.
fn layers(lib: &str) -> Vec<Vec<String>> {
    let mut layers = Vec::new();
    let mut inside = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with("# ") {
            inside = doc == "# The modules, top to bottom";
            continue;
        }
        let Some(bullet) = doc.strip_prefix("- ").filter(|_| inside) else {
            continue;
        };
        let head = bullet.split(':').next().unwrap_or("");
        let names: Vec<String> = head
            .split(',')
            .filter_map(|link| {
                let link = link.trim();
                link.strip_prefix("[`")?
                    .strip_suffix("`]")
                    .map(str::to_string)
            })
            .collect();
        if !names.is_empty() {
            layers.push(names);
        }
    }
    layers
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its comments (line comments and doc comments; block comments
/// are not used in this crate).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            // `//` inside a string literal ("http://…") is not a comment: keep lines whose
            // `//` follows a quote on the same line.
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules named in one `{…}` group of a `use crate::{…}` (its text after `{`),
/// nested groups skipped.
fn group(text: &str, out: &mut BTreeSet<String>) {
    let mut depth = 0usize;
    let mut at_item = true;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item = true,
            c if at_item && depth == 0 && (c.is_ascii_alphabetic() || c == '_') => {
                let name = ident(&text[i..]);
                if name != "self" {
                    out.insert(name.to_string());
                }
                at_item = false;
            }
            _ => {}
        }
    }
}

/// The crate's top-level modules that `code` names.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        // `$crate::` and `floodgate_crate::` are not this crate's paths.
        if code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[i + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(inner) => group(inner, &mut out),
            None => {
                out.insert(ident(rest).to_string());
            }
        }
    }
    out
}

/// The top-level module a file under `src/` belongs to (`None`: the crate root or `main.rs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

#[test]
/// Every `crate::` edge points down the map, every module is placed, and there is no cycle.
fn modules_follow_the_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let layers = layers(&lib);
    assert!(layers.len() > 5, "the map of src/lib.rs was not found");
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i)))
        .collect();

    // Every declared module is on the map (or deliberately off it), and only those.
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|rest| ident(rest).to_string())
        .collect();
    for name in &declared {
        assert!(
            layer_of.contains_key(name.as_str()) || OFF_MAP.contains(&name.as_str()),
            "module `{name}` is declared in src/lib.rs but not on its map"
        );
    }
    for name in layer_of.keys() {
        assert!(
            declared.contains(*name),
            "the map names `{name}`, which is not a module"
        );
    }

    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut edges: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for file in &files {
        let Some(from) = module_of(&src, file) else {
            continue;
        };
        if OFF_MAP.contains(&from.as_str()) {
            continue;
        }
        let text = fs::read_to_string(file).unwrap();
        for to in uses(&code(&text)) {
            if to == from || !declared.contains(&to) {
                continue;
            }
            let shown = file.strip_prefix(root).unwrap_or(file).to_path_buf();
            let (Some(&a), Some(&b)) = (layer_of.get(from.as_str()), layer_of.get(to.as_str()))
            else {
                wrong.push(format!(
                    "{}: `{from}` uses `{to}`, off the map",
                    shown.display()
                ));
                continue;
            };
            if b < a {
                wrong.push(format!(
                    "{}: `{from}` uses `{to}`, which is above it on the map",
                    shown.display()
                ));
            }
            edges
                .entry(from.clone())
                .or_default()
                .entry(to)
                .or_insert(shown);
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the map:\n{}",
        wrong.join("\n")
    );

    // Modules of one line may use each other, but never in a circle.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeMap<String, PathBuf>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(start) = path.iter().position(|n| n == node) {
            let cycle = &path[start..];
            panic!("a cycle of modules: {} -> {node}", cycle.join(" -> "));
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flat_map(|e| e.keys()) {
            visit(next, edges, path, done);
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done);
    }
}

#[test]
/// The reader recognises the import forms the check relies on.
fn reads_imports() {
    let found = uses(&code(
        "use crate::a::B;\nuse crate::{b, c::{D, e}, self};\nlet x = crate::d::f();\n\
         // crate::commented\nlet u = \"http://x\"; crate::g::h();\n$crate::macro_path",
    ));
    let want: BTreeSet<String> = ["a", "b", "c", "d", "g"].map(String::from).into();
    assert_eq!(found, want);
}

/// Cycles among the files of one module that the check tolerates, each as the module
/// and its files in the order the check reports them: each is a file that should be split or
/// merged. Remove an entry when its cycle is gone; a new cycle is never added here.
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[];

/// One file under `src/` as the file check reads it.
struct SourceFile {
    /// The path shown in messages (`src/config/tree.rs`).
    shown: String,
    /// Its module path below the crate root (`["config", "tree"]`; `[]` for `lib.rs`).
    module: Vec<String>,
    /// Its text.
    text: String,
}

/// The module path of a file under `src/` (`None`: `main.rs`, another crate).
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect::<Option<_>>()?;
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    match (parts.is_empty(), stem) {
        (true, "main") => return None,
        (true, "lib") | (false, "mod") => {}
        _ => parts.push(stem.to_string()),
    }
    Some(parts)
}

/// A byte-level reader of Rust source that skips comments, string and character literals, and
/// knows which inline `mod name { … }` it is in.
struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl<'a> Reader<'a> {
    fn peek(&self, ahead: usize) -> u8 {
        self.text.get(self.at + ahead).copied().unwrap_or(0)
    }

    fn skip_space(&mut self) {
        loop {
            match (self.peek(0), self.peek(1)) {
                (b' ' | b'\t' | b'\n' | b'\r', _) => self.at += 1,
                (b'/', b'/' | b'*') => self.skip_comment(),
                _ => return,
            }
        }
    }

    /// At `//` or `/*`: past the comment (block comments nest).
    fn skip_comment(&mut self) {
        if self.peek(1) == b'/' {
            while self.at < self.text.len() && self.peek(0) != b'\n' {
                self.at += 1;
            }
            return;
        }
        let mut depth = 0usize;
        while self.at < self.text.len() {
            match (self.peek(0), self.peek(1)) {
                (b'/', b'*') => {
                    depth += 1;
                    self.at += 2;
                }
                (b'*', b'/') => {
                    depth -= 1;
                    self.at += 2;
                    if depth == 0 {
                        return;
                    }
                }
                _ => self.at += 1,
            }
        }
    }

    fn ident(&mut self) -> &'a str {
        let start = self.at;
        while is_ident(self.peek(0)) {
            self.at += 1;
        }
        std::str::from_utf8(&self.text[start..self.at]).unwrap_or("")
    }

    /// At `"` (after any `b`): past the string.
    fn skip_string(&mut self) {
        self.at += 1;
        while self.at < self.text.len() {
            match self.peek(0) {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return;
                }
                _ => self.at += 1,
            }
        }
    }

    /// After an `r` or `br` at `#` or `"`: past the raw string (or nothing, if it is not one).
    fn skip_raw_string(&mut self) {
        let hashes = (0..).take_while(|&i| self.peek(i) == b'#').count();
        if self.peek(hashes) != b'"' {
            return;
        }
        self.at += hashes + 1;
        while self.at < self.text.len() {
            if self.peek(0) == b'"' && (1..=hashes).all(|i| self.peek(i) == b'#') {
                self.at += hashes + 1;
                return;
            }
            self.at += 1;
        }
    }

    /// At `'`: past a character literal, or past the quote of a lifetime or label.
    fn skip_char(&mut self) {
        if self.peek(1) == b'\\' {
            self.at += 2;
            while self.at < self.text.len() && self.peek(0) != b'\'' {
                self.at += 1;
            }
            self.at += 1;
        } else if let Some(len) = (2..=5).find(|&i| self.peek(i) == b'\'') {
            // One character, possibly of several UTF-8 bytes; `'a` of a lifetime has no
            // closing quote right after it.
            if len == 2 || self.peek(1) >= 0x80 {
                self.at += len + 1;
            } else {
                self.at += 1;
            }
        } else {
            self.at += 1;
        }
    }

    /// After a path's first segment: the rest of the path, `::`-separated, with `{…}` groups
    /// expanded into one path per member (`self` in a group is the group's own prefix, a glob
    /// ends the path).
    fn path_tail(&mut self) -> Vec<Vec<String>> {
        let mut segments = Vec::new();
        loop {
            let save = self.at;
            self.skip_space();
            if !(self.peek(0) == b':' && self.peek(1) == b':') {
                self.at = save;
                return vec![segments];
            }
            self.at += 2;
            self.skip_space();
            match self.peek(0) {
                b'{' => {
                    self.at += 1;
                    let mut out = Vec::new();
                    loop {
                        self.skip_space();
                        match self.peek(0) {
                            b'}' => {
                                self.at += 1;
                                break;
                            }
                            b',' => self.at += 1,
                            b'*' => self.at += 1,
                            b if is_ident(b) => {
                                let first = self.ident();
                                for tail in self.path_tail() {
                                    let mut path = segments.clone();
                                    if first != "self" {
                                        path.push(first.to_string());
                                    }
                                    path.extend(tail);
                                    out.push(path);
                                }
                                // `as name`, or anything else up to the next member.
                                self.skip_space();
                                if self.peek(0) == b'a' && self.peek(1) == b's' {
                                    self.at += 2;
                                    self.skip_space();
                                    self.ident();
                                }
                            }
                            0 => break,
                            _ => self.at += 1,
                        }
                    }
                    return out;
                }
                b if is_ident(b) => segments.push(self.ident().to_string()),
                _ => return vec![segments],
            }
        }
    }
}

/// Every path in `text` that starts at `crate::`, `super::` or `self::`, resolved to a path
/// from the crate root, for a file whose module is `module`. `super` and `self` inside an
/// inline `mod name { … }` count from that module, as the compiler reads them.
fn crate_paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut reader = Reader {
        text: text.as_bytes(),
        at: 0,
    };
    let mut found = Vec::new();
    let mut depth = 0usize;
    // Inline modules open around the reader: each name with the depth inside its brace.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut prev = b' ';
    while reader.at < reader.text.len() {
        let b = reader.peek(0);
        match b {
            b'/' if matches!(reader.peek(1), b'/' | b'*') => {
                reader.skip_comment();
                continue;
            }
            b'"' => {
                reader.skip_string();
                prev = b'"';
                continue;
            }
            b'\'' => {
                reader.skip_char();
                prev = b'\'';
                continue;
            }
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            b if is_ident(b) && !is_ident(prev) && prev != b'$' => {
                let word = reader.ident();
                match word {
                    "r" | "br" if matches!(reader.peek(0), b'#' | b'"') => reader.skip_raw_string(),
                    "mod" => {
                        reader.skip_space();
                        let name = reader.ident().to_string();
                        reader.skip_space();
                        if !name.is_empty() && reader.peek(0) == b'{' {
                            inline.push((name, depth + 1));
                        }
                    }
                    "crate" | "super" | "self" => {
                        let mut base: Vec<String> = module.to_vec();
                        base.extend(inline.iter().map(|(n, _)| n.clone()));
                        let start = match word {
                            "crate" => Vec::new(),
                            "self" => base,
                            _ => base[..base.len().saturating_sub(1)].to_vec(),
                        };
                        for tail in reader.path_tail() {
                            let mut path = start.clone();
                            for segment in tail {
                                if segment == "super" {
                                    path.pop();
                                } else {
                                    path.push(segment);
                                }
                            }
                            found.push(path);
                        }
                    }
                    _ => {}
                }
                prev = b'a';
                continue;
            }
            _ => {}
        }
        prev = b;
        reader.at += 1;
    }
    found
}

/// The cycles among the files of each module: for every module, the files of its direct
/// children (a child's own children counted as the child) that use each other, directly or
/// around a circle. The crate root's children are the top-level modules, which
/// `modules_follow_the_map` checks against the map; a file and its own parent or children
/// are one unit and may use each other. Each cycle comes as its module, its files, and the
/// lines that tie them (`a.rs uses b.rs (crate::m::b::f)`).
fn file_cycles(files: &[SourceFile]) -> Vec<(String, Vec<String>, Vec<String>)> {
    let modules: BTreeMap<&[String], &str> = files
        .iter()
        .map(|f| (f.module.as_slice(), f.shown.as_str()))
        .collect();
    // module -> child -> child -> the first use that ties them.
    type Graph = BTreeMap<String, BTreeMap<String, String>>;
    let mut graphs: BTreeMap<Vec<String>, Graph> = BTreeMap::new();
    for file in files {
        for path in crate_paths(&file.module, &file.text) {
            // The module the path lands in: its longest prefix that is a file.
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains_key(p))
            else {
                continue;
            };
            let common = file
                .module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == 0 || common >= file.module.len() || common >= target.len() {
                continue;
            }
            let (from, to) = (&file.module[common], &target[common]);
            graphs
                .entry(file.module[..common].to_vec())
                .or_default()
                .entry(from.clone())
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| {
                    format!(
                        "{} uses {} (crate::{})",
                        file.shown,
                        modules[target],
                        path.join("::")
                    )
                });
        }
    }
    let shown = |parent: &[String], child: &str| {
        let mut module = parent.to_vec();
        module.push(child.to_string());
        modules
            .get(module.as_slice())
            .map_or_else(|| module.join("::"), |s| s.to_string())
    };
    let mut cycles = Vec::new();
    for (parent, graph) in &graphs {
        for component in strongly_connected(graph) {
            let ties = component
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|(b, _)| component.contains(*b))
                        .map(|(_, tie)| tie.clone())
                })
                .collect();
            let members = component.iter().map(|c| shown(parent, c)).collect();
            cycles.push((parent.join("::"), members, ties));
        }
    }
    cycles
}

/// The strongly connected components of more than one node (Tarjan's algorithm), each sorted.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(node: &'g str, s: &mut State<'g>) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        for next in s.graph.get(node).into_iter().flat_map(|e| e.keys()) {
            let next = next.as_str();
            if !s.index.contains_key(next) {
                visit(next, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.stack.contains(&next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let at = s.stack.iter().rposition(|n| *n == node).unwrap();
            let mut component: Vec<String> = s.stack.drain(at..).map(str::to_string).collect();
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(node, &mut state);
        }
    }
    state.out
}

/// Every file under `src/` with its module path, as the file checks read them.
fn source_files() -> Vec<SourceFile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    paths.sort();
    paths
        .iter()
        .filter_map(|path| {
            Some(SourceFile {
                module: module_path(&src, path)?,
                shown: path.strip_prefix(root).unwrap().display().to_string(),
                text: fs::read_to_string(path).unwrap(),
            })
        })
        .collect()
}

#[test]
/// No two files of one module use each other, directly or around a circle.
fn files_of_a_module_do_not_use_each_other() {
    let files = source_files();
    let cycles: Vec<String> = file_cycles(&files)
        .into_iter()
        .filter(|(module, members, _)| {
            !KNOWN_FILE_CYCLES
                .iter()
                .any(|(m, known)| m == module && known.iter().eq(members.iter()))
        })
        .map(|(module, members, ties)| {
            format!(
                "in `{module}`: {} use each other:\n  {}",
                members.join(", "),
                ties.join("\n  ")
            )
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "files of one module that use each other (split out what both need, or merge them):\n{}",
        cycles.join("\n")
    );
}

#[test]
/// The file check resolves `crate::`, `super::` and `self::` paths (groups, inline modules,
/// comments and strings as the compiler reads them) and reports a cycle with its files.
fn reports_a_cycle_among_files() {
    let file = |shown: &str, module: &[&str], text: &str| SourceFile {
        shown: shown.to_string(),
        module: module.iter().map(|s| s.to_string()).collect(),
        text: text.to_string(),
    };
    let files = [
        file("src/m/mod.rs", &["m"], "mod a; mod b; mod c; pub use a::X;"),
        file(
            "src/m/a.rs",
            &["m", "a"],
            "use super::{b::{self, Y}, X};\n// crate::m::c::Z\nlet s = \"crate::m::c\";",
        ),
        file(
            "src/m/b.rs",
            &["m", "b"],
            "let c = '{'; let l: &'static str = r#\"}\"#;\n\
             mod tests { use super::super::c; fn t() { super::f(); } }\n\
             fn g() { crate::m::a::f(); }",
        ),
        file(
            "src/m/c.rs",
            &["m", "c"],
            "pub(super) fn f() { self::g(); }",
        ),
        file("src/n.rs", &["n"], "use crate::m::c;"),
    ];
    assert_eq!(
        crate_paths(&files[2].module, &files[2].text),
        [["m", "c"].as_slice(), &["m", "b", "f"], &["m", "a", "f"]]
            .map(|p| p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    );
    let cycles = file_cycles(&files);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    let (module, members, ties) = &cycles[0];
    assert_eq!(module, "m");
    assert_eq!(members, &["src/m/a.rs", "src/m/b.rs"]);
    assert_eq!(
        ties,
        &[
            "src/m/a.rs uses src/m/b.rs (crate::m::b)",
            "src/m/b.rs uses src/m/a.rs (crate::m::a::f)",
        ]
    );
}

/// Where `Any` is found in `code` (comments stripped): the identifier `Any` or a path through
/// `std::any` / `core::any`, as line numbers.
fn any_uses(code: &str) -> Vec<usize> {
    let word = |line: &str, needle: &str| {
        line.match_indices(needle).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            let after = line[i + needle.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    };
    code.lines()
        .enumerate()
        .filter(|(_, line)| {
            word(line, "Any") || line.contains("std::any") || line.contains("core::any")
        })
        .map(|(i, _)| i + 1)
        .collect()
}

#[test]
/// The configuration and the outcome hold plain data: no `Any` slot in `src/config/**` or
/// `src/outcome.rs` (telemetry's per-rule handles ride beside the configuration, in the
/// snapshot the limits publisher swaps, not inside it).
fn config_and_outcome_hold_no_any() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("outcome.rs")];
    sources(&src.join("config"), &mut files);
    if src.join("config.rs").exists() {
        files.push(src.join("config.rs"));
    }
    let mut found = Vec::new();
    for file in &files {
        for line in any_uses(&code(&fs::read_to_string(file).unwrap())) {
            found.push(format!("{}:{line}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "`Any` where plain data belongs:\n{}",
        found.join("\n")
    );
}

#[test]
/// The `Any` reader finds the type and the module, not words that contain them.
fn reads_any() {
    let text = "use std::any::Any;\nstruct S(Box<dyn Any + Send>);\nlet Anyway = 1;\n\
                // a dyn Any in a comment\nfn any() {}\nlet c = core::any::type_name::<u8>();";
    assert_eq!(any_uses(&code(text)), [1, 2, 6]);
}

/// Who owns each metric family, by the start of its name (the longest match wins): the
/// module whose metrics file registers it. `telemetry` owns the counting of an outcome and
/// the requests, and the statsd sink's own count; every other capability owns its series.
const FAMILY_OWNERS: &[(&str, &str)] = &[
    ("floodgate_rule_", "telemetry"),
    ("floodgate_requests", "telemetry"),
    ("floodgate_request_duration_seconds", "telemetry"),
    ("floodgate_domain_requests", "telemetry"),
    ("floodgate_oversized_values", "telemetry"),
    ("floodgate_ignored_overrides", "telemetry"),
    ("floodgate_global_shadow_mode", "telemetry"),
    ("floodgate_shaped_", "telemetry"),
    ("floodgate_statsd_dropped_lines", "telemetry"),
    ("floodgate_store_", "store"),
    ("floodgate_memory_", "store"),
    ("floodgate_local_", "store"),
    ("floodgate_cluster_refunds", "store"),
    ("floodgate_per_second_refunds", "store"),
    ("floodgate_redis_calls_", "store"),
    ("floodgate_host_delay_seconds", "store"),
    ("floodgate_lease_", "store"),
    ("floodgate_connections_", "transport"),
    ("floodgate_accept_errors", "transport"),
    ("floodgate_tls_", "transport"),
    ("floodgate_config_", "sources"),
    ("floodgate_rlqs_", "rlqs"),
];

/// The metric family names a file registers: every string literal of its code (comments and
/// unit tests left out) that is exactly a `floodgate_*` name, as `Registry::register` takes it.
fn family_names(text: &str) -> Vec<String> {
    let product = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    code(product)
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|literal| {
            literal.starts_with("floodgate_")
                && literal
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .map(str::to_string)
        .collect()
}

/// What is wrong with `file` (a path under `src/`, `/`-separated) registering `name`: it is
/// not its owner's metrics file (`src/<owner>/metrics.rs`, or a `metrics.rs` or `metrics/`
/// file below `src/<owner>/`), or the family has no owner.
fn misplaced_family(file: &str, name: &str) -> Option<String> {
    let owner = FAMILY_OWNERS
        .iter()
        .filter(|(prefix, _)| name.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, owner)| *owner);
    let Some(owner) = owner else {
        return Some(format!("{file}: `{name}` has no owner in FAMILY_OWNERS"));
    };
    let in_metrics = file
        .strip_prefix(&format!("src/{owner}/"))
        .is_some_and(|inside| {
            inside
                .split('/')
                .any(|part| part == "metrics" || part == "metrics.rs")
        });
    (!in_metrics).then(|| format!("{file}: `{name}` belongs in `{owner}`'s metrics file"))
}

#[test]
/// Each capability registers its own metric families, in its own metrics file: no
/// `floodgate_*` family is registered by a module that does not own it (telemetry registers
/// only the counting of outcomes and requests), and every family has an owner.
fn metric_families_are_registered_by_their_owner() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut wrong = Vec::new();
    let mut found = 0;
    for file in &files {
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        if shown.ends_with("/tests.rs") || shown.contains("/tests/") {
            continue;
        }
        for name in family_names(&fs::read_to_string(file).unwrap()) {
            found += 1;
            wrong.extend(misplaced_family(&shown, &name));
        }
    }
    assert!(
        found > 40,
        "only {found} families found: the reader is broken"
    );
    assert!(
        wrong.is_empty(),
        "metric families registered outside their owner:\n{}",
        wrong.join("\n")
    );
}

#[test]
/// The ownership check reads registered names and refuses a family in another module's
/// file, or in the owner's files outside its metrics file.
fn reads_family_owners() {
    let text = "registry.register(\n    \"floodgate_store_errors\",\n    \"Store failures\",\n);\n\
                let x = \"floodgate_store_errors_total {\";\n// \"floodgate_lease_x\"\n\
                #[cfg(test)]\nmod tests { fn t() { let _ = \"floodgate_rule_hits\"; } }";
    assert_eq!(family_names(text), ["floodgate_store_errors"]);
    assert!(misplaced_family("src/store/metrics.rs", "floodgate_store_errors").is_none());
    assert!(misplaced_family("src/store/lease/metrics.rs", "floodgate_lease_tokens").is_none());
    assert!(misplaced_family("src/telemetry/metrics/rules.rs", "floodgate_rule_hits").is_none());
    assert!(misplaced_family("src/telemetry/metrics/store.rs", "floodgate_store_errors").is_some());
    assert!(misplaced_family("src/store/resilient.rs", "floodgate_store_errors").is_some());
    assert!(misplaced_family("src/rlqs/metrics.rs", "floodgate_made_up").is_some());
}

/// Each `use` of its parent file's own items by a child file (tests aside), as `file uses
/// parent (crate::path)`: a name two files of a module share lives in a file of its own,
/// which both import (`server/error.rs`), never in the parent that declares them.
fn parent_imports(files: &[SourceFile]) -> Vec<String> {
    let modules: BTreeMap<&[String], &str> = files
        .iter()
        .map(|f| (f.module.as_slice(), f.shown.as_str()))
        .collect();
    let mut found = Vec::new();
    for file in files {
        let Some((_, parent)) = file.module.split_last() else {
            continue;
        };
        // A module's unit tests are its child file `tests.rs` (or folder): they test the parent.
        if parent.is_empty() || file.module.iter().any(|m| m == "tests") {
            continue;
        }
        // An inline test module (`#[cfg(test)] mod tests { … }`, last in its file) is tests.
        let code = file
            .text
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or("");
        for path in crate_paths(&file.module, code) {
            let target = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains_key(p));
            if target == Some(parent) && path.len() > parent.len() {
                let line = format!(
                    "{} uses {} (crate::{})",
                    file.shown,
                    modules[parent],
                    path.join("::")
                );
                if !found.contains(&line) {
                    found.push(line);
                }
            }
        }
    }
    found
}

/// The modules whose child files the check holds to the rule: a module joins the list once
/// what its children share has files of its own.
const PARENTS_CHECKED: &[&str] = &[
    "admission",
    "runtime",
    "server",
    "service",
    "settings",
    "settings/reference",
];

#[test]
/// A child file imports no name from its parent's file: what siblings share has a file of its
/// own (tests aside).
fn child_files_do_not_import_their_parent() {
    let files = source_files();
    let found: Vec<String> = parent_imports(&files)
        .into_iter()
        .filter(|line| {
            PARENTS_CHECKED.iter().any(|parent| {
                line.split(" uses ")
                    .nth(1)
                    .is_some_and(|to| to.starts_with(&format!("src/{parent}.rs ")))
            })
        })
        .collect();
    assert!(
        found.is_empty(),
        "child files that import their parent file's items (give what they share a file of \
         its own):\n  {}",
        found.join("\n  ")
    );
}

/// The most lines a source file under `src/` may have; a longer one is split by what it does.
/// Unit tests do not count (`tests.rs` files and the files under a `tests/` folder).
const MAX_LINES: usize = 600;

/// Every `.rs` file under `src/` as its path from the crate root (`/`-separated) and its text.
fn crate_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = Vec::new();
    sources(&root.join("src"), &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let shown = path.strip_prefix(root).unwrap();
            let shown: Vec<&str> = shown.iter().map(|c| c.to_str().unwrap()).collect();
            (shown.join("/"), fs::read_to_string(path).unwrap())
        })
        .collect()
}

/// The files named `mod.rs`: a module with children is `foo.rs` beside its folder `foo/`.
fn mod_rs_files(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| path == "mod.rs" || path.ends_with("/mod.rs"))
        .map(|(path, _)| path.clone())
        .collect()
}

/// Each inline `mod tests { … }` (comments aside) as `path:line`: a module's unit tests live in
/// its child file `foo/tests.rs`, declared `#[cfg(test)] mod tests;`.
fn inline_test_modules(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        for (n, line) in code(text).lines().enumerate() {
            let spaced = line.replace('{', " { ");
            let mut words = spaced.split_whitespace().peekable();
            // Past a visibility: `pub`, `pub(crate)`, `pub(super)`.
            if words.peek().is_some_and(|w| w.starts_with("pub")) {
                words.next();
            }
            if words.next() == Some("mod")
                && words.next() == Some("tests")
                && words.next() == Some("{")
            {
                found.push(format!("{path}:{}", n + 1));
            }
        }
    }
    found
}

/// Whether `path` holds unit tests, which the line bound leaves out.
fn is_test_file(path: &str) -> bool {
    path.ends_with("/tests.rs") || path.split('/').any(|part| part == "tests")
}

/// The source files over [`MAX_LINES`] lines, tests aside, as `path (lines)`.
fn long_files(files: &[(String, String)]) -> Vec<(String, usize)> {
    files
        .iter()
        .filter(|(path, _)| !is_test_file(path))
        .map(|(path, text)| (path.clone(), text.lines().count()))
        .filter(|(_, lines)| *lines > MAX_LINES)
        .collect()
}

#[test]
/// No `mod.rs` under `src/`: one module layout, `foo.rs` + `foo/`.
fn no_mod_rs_files() {
    let found = mod_rs_files(&crate_sources());
    assert!(
        found.is_empty(),
        "modules laid out as `foo/mod.rs` (move each to `foo.rs`, beside its folder):\n{}",
        found.join("\n")
    );
}

#[test]
/// No inline `mod tests { … }` under `src/`: unit tests live in `foo/tests.rs`.
fn unit_tests_live_in_tests_files() {
    let found = inline_test_modules(&crate_sources());
    assert!(
        found.is_empty(),
        "inline test modules (move each body to the module's child file `tests.rs`, \
         declared `#[cfg(test)] mod tests;`):\n{}",
        found.join("\n")
    );
}

#[test]
/// No source file under `src/` over 600 lines, tests aside.
fn source_files_stay_under_600_lines() {
    let long = long_files(&crate_sources());
    let offenders: Vec<String> = long
        .iter()
        .map(|(path, lines)| format!("{path} ({lines} lines)"))
        .collect();
    assert!(
        offenders.is_empty(),
        "source files over {MAX_LINES} lines, tests aside (split each by what it does):\n{}",
        offenders.join("\n")
    );
}

#[test]
/// The layout checks find each kind of offender, and only offenders.
fn layout_checks_find_offenders() {
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let long = "fn f() {}\n".repeat(MAX_LINES + 1);
    let files = [
        file("src/a/mod.rs", "mod b;"),
        file("src/mod.rs", ""),
        file("src/model.rs", "// mod tests { in a comment }\n"),
        file("src/b.rs", "fn f() {}\n#[cfg(test)]\nmod tests {\n}\n"),
        file("src/c.rs", "#[cfg(test)]\npub(crate) mod tests {}\n"),
        file(
            "src/d.rs",
            "#[cfg(test)]\nmod tests;\nmod tests_support {}\n",
        ),
        file("src/long.rs", &long),
        file("src/long/tests.rs", &long),
        file("src/config/tests/loading.rs", &long),
        file("src/short.rs", &"\n".repeat(MAX_LINES)),
    ];
    assert_eq!(mod_rs_files(&files), ["src/a/mod.rs", "src/mod.rs"]);
    assert_eq!(inline_test_modules(&files), ["src/b.rs:3", "src/c.rs:2"]);
    assert_eq!(
        long_files(&files),
        [("src/long.rs".to_string(), MAX_LINES + 1)]
    );
}
