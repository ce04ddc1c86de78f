//! The crate's modules form layers and every dependency points down: a module names only
//! itself and the modules of the layers below its own (`docs/design.md`, "Modules").
//!
//! Reads `src/**/*.rs` as text (comments, strings and character literals blanked out), finds
//! every path that leaves its module — `crate::x…`, `crate::{x…, y…}` (in `use` or inline),
//! a `super::` chain that climbs to the crate root, and `crate::Name` for a name the crate
//! root re-exports (resolved through `src/lib.rs`) — and checks its top-level module against
//! [`LAYERS`]. A failure names each offending file and line. The table is also checked
//! against the sentence in `docs/design.md` that draws it, so the picture stays true.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The crate's modules, top layer first. A module may name modules of lower layers only:
/// never one of its own layer (but itself), never one above.
const LAYERS: &[&[&str]] = &[
    &["node"],
    &["net"],
    &["tls"],
    &["proto"],
    &["peer"],
    &["deliver", "journal"],
    &["events", "flow", "handoff", "membership"],
    &["addr", "codec", "wire", "util"],
    &["sync"],
];

/// One path out of a file's module: where it is, and the top-level module it names.
#[derive(Debug, PartialEq, Eq)]
struct Reach {
    line: usize,
    /// The path as written, up to the module it names (`crate::node`, `super::super::net`).
    path: String,
    /// The first segment below the crate root: a module, or a name the root re-exports.
    target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The text with comments, string and character literals replaced by spaces (newlines
/// kept, so lines still count).
fn blank_non_code(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if (c == 'r' || c == 'b')
            && !b[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
            && raw_string_at(&b, i).is_some()
        {
            let (hashes, body) = raw_string_at(&b, i).unwrap_or_default();
            for &ch in &b[i..body] {
                blank(&mut out, ch);
            }
            i = body;
            // The body ends at `"` followed by as many `#` as opened it.
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}') or a lifetime ('a): a literal
            // closes with a quote within a few characters.
            let close = if next == Some('\\') {
                (i + 3..b.len().min(i + 12)).find(|&k| b[k] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    for &ch in &b[i..=end] {
                        blank(&mut out, ch);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// If a raw string (`r"`, `r#"`, `br"`…) starts at `i`: its count of `#` and where its body
/// starts.
fn raw_string_at(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut k = i;
    if b[k] == 'b' {
        k += 1;
    }
    if b.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let mut hashes = 0;
    while b.get(k) == Some(&'#') {
        hashes += 1;
        k += 1;
    }
    (b.get(k) == Some(&'"')).then_some((hashes, k + 1))
}

/// Identifiers, `::` and single punctuation characters, each with its line.
fn tokens(code: &str) -> Vec<(usize, Tok)> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphabetic() || c == '_' || c == '$' {
            let start = i;
            i += 1;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            // `$crate` in a macro is the crate root too; `r#ident` is `ident`.
            let word = word.trim_start_matches('$').to_string();
            out.push((line, Tok::Ident(word)));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                i += 1;
            }
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push((line, Tok::Path));
            i += 2;
        } else {
            out.push((line, Tok::Punct(c)));
            i += 1;
        }
    }
    out
}

/// The first segment of each branch of the use group that opens at `toks[open]` (`{`),
/// with the line of each.
fn group_heads(toks: &[(usize, Tok)], open: usize) -> Vec<(usize, String)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (line, tok) in &toks[open..] {
        match tok {
            Tok::Punct('{') => {
                depth += 1;
                expect_head = depth == 1;
            }
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth == 1 => expect_head = true,
            Tok::Ident(word) if depth == 1 && expect_head => {
                heads.push((*line, word.clone()));
                expect_head = false;
            }
            _ if depth == 1 => expect_head = false,
            _ => {}
        }
    }
    heads
}

/// Every path in `src` (a file whose module is `depth` levels below the crate root) that
/// reaches the crate root: `crate::…` and `super::` chains climbing out of the file's
/// top-level module.
fn reaches(src: &str, depth: usize) -> Vec<Reach> {
    let toks = tokens(&blank_non_code(src));
    let mut out = Vec::new();
    // Brace depths at which inline modules (`mod tests { … }`) opened: each is one level
    // deeper for `super`.
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut braces = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].1 {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => {
                if inline_mods.last() == Some(&braces) {
                    inline_mods.pop();
                }
                braces -= 1;
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((_, Tok::Ident(_))), Some((_, Tok::Punct('{')))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline_mods.push(braces + 1);
                }
            }
            Tok::Ident(w) if w == "crate" || w == "super" => {
                // The chain of `super::` from here, or `crate::`.
                let mut prefix = w.clone();
                let mut climbed = usize::from(w == "super");
                let mut k = i + 1;
                let mut at_root = w == "crate";
                while !at_root
                    && toks.get(k).map(|t| &t.1) == Some(&Tok::Path)
                    && toks.get(k + 1).map(|t| &t.1) == Some(&Tok::Ident("super".into()))
                {
                    climbed += 1;
                    prefix.push_str("::super");
                    k += 2;
                }
                if w == "super" {
                    at_root = climbed >= depth + inline_mods.len();
                }
                if at_root && toks.get(k).map(|t| &t.1) == Some(&Tok::Path) {
                    match toks.get(k + 1) {
                        Some((l, Tok::Ident(seg))) => out.push(Reach {
                            line: *l,
                            path: format!("{prefix}::{seg}"),
                            target: seg.clone(),
                        }),
                        Some((_, Tok::Punct('{'))) => {
                            for (l, seg) in group_heads(&toks, k + 1) {
                                out.push(Reach {
                                    line: l,
                                    path: format!("{prefix}::{{{seg}…}}"),
                                    target: seg,
                                });
                            }
                        }
                        _ => {}
                    }
                }
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// What the crate root re-exports (`pub use module::{Name, …}` in `src/lib.rs`): each name
/// and the path's first segment (a module of the crate or an external crate).
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let toks = tokens(&blank_non_code(lib));
    let mut map = BTreeMap::new();
    let mut braces = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].1 {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => braces -= 1,
            Tok::Ident(w) if w == "use" && braces == 0 => {
                let module = match toks.get(i + 1) {
                    Some((_, Tok::Ident(m))) => m.clone(),
                    _ => String::new(),
                };
                i += 2;
                while i < toks.len() && toks[i].1 != Tok::Punct(';') {
                    if let Tok::Ident(name) = &toks[i].1 {
                        if name != "as" && name != "self" {
                            map.insert(name.clone(), module.clone());
                        }
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// A file's top-level module and how many levels below the crate root its module is
/// (`src/x.rs`, `src/x/mod.rs`: 1; `src/x/y.rs`: 2).
fn module_of(rel: &Path) -> (String, usize) {
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let top = parts[0].trim_end_matches(".rs").to_string();
    let depth = if parts.last().is_some_and(|f| f == "mod.rs") {
        parts.len() - 1
    } else {
        parts.len()
    };
    (top, depth)
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every dependency that does not point down, as `file:line: message` lines.
fn violations(src_dir: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src_dir.join("lib.rs")).expect("src/lib.rs");
    let reexports = root_reexports(&lib);
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let mut bad = Vec::new();
    for file in files {
        let rel = file.strip_prefix(src_dir).expect("under src");
        if rel == Path::new("lib.rs") {
            continue;
        }
        let shown = format!("src/{}", rel.display());
        let (module, depth) = module_of(rel);
        let Some(layer) = layer_of(&module) else {
            bad.push(format!(
                "{shown}: module `{module}` has no layer in LAYERS (tests/layers.rs)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("a source file");
        for r in reaches(&text, depth) {
            let (target, via) = match layer_of(&r.target) {
                Some(_) => (r.target.clone(), String::new()),
                None => match reexports.get(&r.target) {
                    Some(m) => (m.clone(), format!(" (re-exported from `{m}`)")),
                    None => {
                        bad.push(format!(
                            "{shown}:{}: `{}` names neither a module nor a re-export of \
                             the crate root",
                            r.line, r.path
                        ));
                        continue;
                    }
                },
            };
            let Some(to) = layer_of(&target) else {
                continue; // an external crate the root re-exports (`crate::Bytes`)
            };
            if target != module && to <= layer {
                let relation = if to == layer { "beside" } else { "above" };
                bad.push(format!(
                    "{shown}:{}: `{module}` imports `{}`{via}: `{target}` is {relation} \
                     `{module}`, dependencies point down",
                    r.line, r.path
                ));
            }
        }
    }
    bad
}

#[test]
fn dependencies_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    let mut msg = String::new();
    for b in &bad {
        let _ = writeln!(msg, "  {b}");
    }
    assert!(
        bad.is_empty(),
        "{} dependencies do not point down the layers {}:\n{msg}",
        bad.len(),
        picture()
    );
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(&src).expect("src/") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().expect("a name").to_string_lossy();
        if path.is_dir() {
            modules.insert(name.into_owned());
        } else if name != "lib.rs" && name.ends_with(".rs") {
            modules.insert(name.trim_end_matches(".rs").to_string());
        }
    }
    let placed: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|l| l.iter().map(|m| m.to_string()))
        .collect();
    assert_eq!(modules, placed, "src/'s modules and the layers differ");
}

/// The layers as `docs/design.md` draws them.
fn picture() -> String {
    LAYERS
        .iter()
        .map(|l| {
            l.iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

#[test]
fn design_draws_these_layers() {
    let design = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md");
    let text = std::fs::read_to_string(design).expect("docs/design.md");
    let start = text
        .find("Dependencies point down:")
        .expect("docs/design.md says how dependencies point");
    let sentence = &text[start..];
    let sentence = &sentence[..sentence.find('.').expect("the sentence ends")];
    let drawn: String = sentence
        .trim_start_matches("Dependencies point down:")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(drawn, picture(), "docs/design.md draws other layers");
}

#[test]
fn finds_paths_out_of_a_module() {
    let src = r##"
use crate::sync::Arc;
use crate::{flow::Permit, wire::{self, Frame}};
// use crate::node::Sender;
/* use crate::node::Error; /* nested */ crate::node */
fn f<'a>(x: &'a str) -> char {
    let _ = "crate::node::Sender";
    let _ = r#"crate::node"#;
    let _ = crate::Delivery::new;
    let _ = super::super::events::Event::Closed;
    let _ = ['\'', '"', 'x']; let _ = "crate::node";
    '\u{22}'
}
mod tests {
    use super::*;
    use super::super::super::journal::Journal;
}
"##;
    let got: Vec<(usize, String)> = reaches(src, 2)
        .into_iter()
        .map(|r| (r.line, r.target))
        .collect();
    let want: Vec<(usize, String)> = [
        (2, "sync"),
        (3, "flow"),
        (3, "wire"),
        (9, "Delivery"),
        (10, "events"),
        (16, "journal"),
    ]
    .iter()
    .map(|(l, t)| (*l, t.to_string()))
    .collect();
    assert_eq!(got, want);
    let lib = "pub use deliver::{Delivery, Inbox};\npub use journal::{inspect as inspect_journal};\nmod x { use crate::y; }";
    let map = root_reexports(lib);
    assert_eq!(map.get("Delivery").map(String::as_str), Some("deliver"));
    assert_eq!(
        map.get("inspect_journal").map(String::as_str),
        Some("journal")
    );
    assert_eq!(map.get("y"), None);
}
