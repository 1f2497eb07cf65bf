//! The module map of `src/lib.rs` holds: every module is on it, each module uses only modules
//! on its own line or below it, and no two modules use each other, directly or through others.
//!
//! Read from the source text: every `crate::name` path (in `use` lines, in grouped
//! `use crate::{a, b::c}` imports and in expressions) outside comments is an edge from the
//! file's top-level module to `name`. Doc links do not count: they document, they do not
//! depend.
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
