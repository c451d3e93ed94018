//! `cargo xtask cycles`: import cycles between the top-level modules of a crate (DESIGN §5: "no
//! import cycle between runtime modules").
//!
//! Reads every `.rs` file under a `src` directory and builds the graph of its top-level modules
//! (`engine`, `ctx`, …; a file `a/b.rs` or `a/b/mod.rs` belongs to `a`): an edge `a -> b` for
//! every path in `a` that names something in `b` — `crate::b::…`, `use crate::{b::X, …}`,
//! `super::…`/`self::…` resolved from the file's (and inline module's) place, and `crate::X`
//! where the crate root re-exports `X` from `b` (`pub use b::X;` in `lib.rs`). Comments, string
//! literals and `#[cfg(test)] mod … { }` blocks are ignored. Cycles are the strongly connected
//! components of that graph (Tarjan), printed as `cycle: a -> b -> a`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// The module graph: each top-level module's dependencies, with where the first reference of
/// each edge was seen (`file:line`).
#[derive(Debug, Default)]
pub(crate) struct Graph {
    pub(crate) modules: BTreeSet<String>,
    pub(crate) edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    /// The graph of the crate whose sources are `files`: `(path relative to src/, source)`.
    pub(crate) fn from_sources(files: &[(String, String)]) -> Graph {
        let mut graph = Graph::default();
        let parsed: Vec<(String, Vec<String>, Vec<Token>)> =
            files.iter().map(|(path, src)| (path.clone(), module_path(path), tokenize(&strip(src)))).collect();
        for (_, module, _) in &parsed {
            if let Some(top) = module.first() {
                graph.modules.insert(top.clone());
            }
        }
        let reexports: BTreeMap<String, String> = parsed
            .iter()
            .filter(|(_, module, _)| module.is_empty())
            .flat_map(|(_, _, tokens)| root_reexports(tokens, &graph.modules))
            .collect();
        for (path, module, tokens) in &parsed {
            for (from, to, line) in references(module, tokens, &graph.modules, &reexports) {
                graph.edges.entry(from).or_default().entry(to).or_insert_with(|| format!("{path}:{line}"));
            }
        }
        graph
    }

    /// Reads every `.rs` file under `src`.
    pub(crate) fn from_dir(src: &Path) -> Result<Graph, String> {
        let mut files = Vec::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
            for entry in entries {
                let path = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text =
                        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
                    let rel = path.strip_prefix(src).unwrap_or(&path).to_string_lossy().replace('\\', "/");
                    files.push((rel, text));
                }
            }
        }
        files.sort();
        Ok(Graph::from_sources(&files))
    }

    pub(crate) fn edge_count(&self) -> usize {
        self.edges.values().map(BTreeMap::len).sum()
    }

    /// The strongly connected components with more than one module (Tarjan), each sorted.
    pub(crate) fn components(&self) -> Vec<Vec<String>> {
        struct Tarjan<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, (usize, usize)>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            out: Vec<Vec<String>>,
        }
        impl<'g> Tarjan<'g> {
            fn visit(&mut self, v: &'g str) {
                let n = self.index.len();
                self.index.insert(v, (n, n));
                self.stack.push(v);
                self.on_stack.insert(v);
                for w in self.graph.edges.get(v).into_iter().flat_map(BTreeMap::keys) {
                    if !self.index.contains_key(w.as_str()) {
                        self.visit(w);
                        let low = self.index[w.as_str()].1;
                        self.index.get_mut(v).expect("visited").1 = self.index[v].1.min(low);
                    } else if self.on_stack.contains(w.as_str()) {
                        let low = self.index[w.as_str()].0;
                        self.index.get_mut(v).expect("visited").1 = self.index[v].1.min(low);
                    }
                }
                let (index, low) = self.index[v];
                if index == low {
                    let mut component = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack.remove(w);
                        component.push(w.to_string());
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        component.sort();
                        self.out.push(component);
                    }
                }
            }
        }
        let mut t = Tarjan {
            graph: self,
            index: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for v in &self.modules {
            if !t.index.contains_key(v.as_str()) {
                t.visit(v);
            }
        }
        t.out.sort();
        t.out
    }

    /// Cycles to show for `component`: the shortest cycle through each of its modules, each
    /// starting at its smallest module, without repeats. Every module of the component is on
    /// one of them.
    pub(crate) fn cycles_in(&self, component: &[String]) -> Vec<Vec<String>> {
        let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
        let mut cycles = BTreeSet::new();
        for start in component {
            // Breadth-first from `start` inside the component, back to `start`.
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = VecDeque::from([start.as_str()]);
            let mut closing = None;
            while let Some(v) = queue.pop_front() {
                for w in self.edges.get(v).into_iter().flat_map(BTreeMap::keys).map(String::as_str) {
                    if w == start {
                        closing = Some(v);
                        break;
                    }
                    if inside.contains(w) && !came_from.contains_key(w) {
                        came_from.insert(w, v);
                        queue.push_back(w);
                    }
                }
                if closing.is_some() {
                    break;
                }
            }
            let Some(mut v) = closing else { continue };
            let mut cycle = vec![v.to_string()];
            while v != start {
                v = came_from[v];
                cycle.push(v.to_string());
            }
            cycle.reverse();
            let min = cycle.iter().enumerate().min_by_key(|(_, m)| *m).map_or(0, |(i, _)| i);
            cycle.rotate_left(min);
            cycles.insert(cycle);
        }
        cycles.into_iter().collect()
    }
}

/// The module path of a file under `src/`: `lib.rs` → `[]`, `a.rs` and `a/mod.rs` → `[a]`,
/// `a/b.rs` → `[a, b]`.
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.trim_end_matches(".rs").split('/').map(String::from).collect();
    if parts.last().is_some_and(|p| p == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")) {
        parts.pop();
    }
    parts
}

/// `src` with comments, string and character literals blanked out (newlines kept, so lines
/// still count).
fn strip(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == '"'
            || (c == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(chars.get(i.wrapping_sub(1))))
        {
            // A string, or a raw string r"…" / r#"…"#.
            let raw = c == 'r';
            let mut hashes = 0;
            if raw {
                i += 1;
                while chars.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if chars.get(i) != Some(&'"') {
                    continue; // `r#ident`, not a string
                }
            }
            i += 1;
            while i < chars.len() {
                if !raw && chars[i] == '\\' {
                    i += 2;
                    continue;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push_str("\"\"");
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{..}'); `'a` alone is a lifetime.
            i += if next == Some('\\') { 2 } else { 1 };
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

/// Identifiers (`$crate` included), `::` and single punctuation characters.
fn tokenize(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let (mut tokens, mut line, mut i) = (Vec::new(), 1, 0);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if ident_char(Some(&c)) || (c == '$' && ident_char(chars.get(i + 1))) {
            let start = i;
            i += 1;
            while ident_char(chars.get(i)) {
                i += 1;
            }
            tokens.push(Token { text: chars[start..i].iter().collect(), line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token { text: "::".into(), line });
            i += 2;
        } else {
            tokens.push(Token { text: c.to_string(), line });
            i += 1;
        }
    }
    tokens
}

fn is(tokens: &[Token], i: usize, text: &str) -> bool {
    tokens.get(i).is_some_and(|t| t.text == text)
}

fn is_ident(token: &Token) -> bool {
    token.text.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The first segments of a path that continues at `i`: one identifier, or the first identifier
/// of each element of a `{ … }` group.
fn first_segments(tokens: &[Token], i: usize) -> Vec<String> {
    if !is(tokens, i, "{") {
        return tokens
            .get(i)
            .filter(|t| is_ident(t) || t.text == "*")
            .map(|t| vec![t.text.clone()])
            .unwrap_or_default();
    }
    let (mut out, mut depth, mut at_element) = (Vec::new(), 0, true);
    for t in &tokens[i..] {
        match t.text.as_str() {
            "{" => {
                depth += 1;
                at_element = depth == 1;
            }
            "}" => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            "," if depth == 1 => at_element = true,
            text if at_element && depth == 1 => {
                out.push(text.to_string());
                at_element = false;
            }
            _ => {}
        }
    }
    out
}

/// Names the crate root re-exports from a module: `pub use engine::{Engine, Started};` maps
/// `Engine` and `Started` to `engine`.
fn root_reexports(tokens: &[Token], modules: &BTreeSet<String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate() {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "use" if depth == 0 => {
                let mut j = i + 1;
                if is(tokens, j, "crate") || is(tokens, j, "self") {
                    j += 2;
                }
                let Some(module) = tokens.get(j).filter(|t| modules.contains(&t.text)) else { continue };
                for name in tokens[j + 1..].iter().take_while(|t| t.text != ";").filter(|t| is_ident(t)) {
                    if !matches!(name.text.as_str(), "self" | "as" | "crate" | "super") {
                        out.push((name.text.clone(), module.text.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether the `mod` at `i` has `#[cfg(test)]` right before it (`pub`/`pub(…)` between).
fn is_test_mod(tokens: &[Token], i: usize) -> bool {
    let mut j = i;
    if j > 0 && tokens[j - 1].text == ")" {
        while j > 0 && tokens[j - 1].text != "(" {
            j -= 1;
        }
        j = j.saturating_sub(1);
    }
    if j > 0 && tokens[j - 1].text == "pub" {
        j -= 1;
    }
    j >= 7 && tokens[j - 7..j].iter().map(|t| t.text.as_str()).eq(["#", "[", "cfg", "(", "test", ")", "]"])
}

/// The edges `(from, to, line)` of the file whose module path is `file_module`.
fn references(
    file_module: &[String],
    tokens: &[Token],
    modules: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    let mut module: Vec<String> = file_module.to_vec();
    // Inline modules: (brace depth inside them, whether it is a test module).
    let mut inline: Vec<(usize, bool)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        match t.text.as_str() {
            "mod" if tokens.get(i + 1).is_some_and(is_ident) && is(tokens, i + 2, "{") => {
                let test = is_test_mod(tokens, i) || inline.last().is_some_and(|(_, test)| *test);
                module.push(tokens[i + 1].text.clone());
                depth += 1;
                inline.push((depth, test));
                i += 3;
                continue;
            }
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(d, _)| *d == depth) {
                    inline.pop();
                    module.pop();
                }
                depth -= 1;
            }
            "crate" | "$crate" | "super" | "self"
                if is(tokens, i + 1, "::") && !(i > 0 && tokens[i - 1].text == "::") =>
            {
                let in_test = inline.last().is_some_and(|(_, test)| *test);
                let mut base: Option<Vec<String>> = match t.text.as_str() {
                    "self" => Some(module.clone()),
                    "super" => module.split_last().map(|(_, parent)| parent.to_vec()),
                    _ => Some(Vec::new()),
                };
                let mut j = i + 2;
                while is(tokens, j, "super") && is(tokens, j + 1, "::") {
                    base = base.and_then(|b| b.split_last().map(|(_, parent)| parent.to_vec()));
                    j += 2;
                }
                if let (Some(base), Some(from), false) = (base, file_module.first(), in_test) {
                    for first in first_segments(tokens, j) {
                        let to = match base.first() {
                            Some(top) => Some(top.clone()),
                            None if modules.contains(&first) => Some(first),
                            None => reexports.get(&first).cloned(),
                        };
                        if let Some(to) = to.filter(|to| to != from) {
                            out.push((from.clone(), to, t.line));
                        }
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        let files: Vec<(String, String)> = files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect();
        Graph::from_sources(&files)
    }

    fn deps(g: &Graph, module: &str) -> Vec<String> {
        g.edges.get(module).map(|e| e.keys().cloned().collect()).unwrap_or_default()
    }

    #[test]
    fn a_cycle_is_found_and_printed_from_its_smallest_module() {
        let g = graph(&[
            ("lib.rs", "mod ctx; mod engine; mod clock;"),
            ("engine.rs", "use crate::ctx::WorkflowCtx;\nuse crate::clock::Clock;"),
            ("ctx.rs", "use crate::clock::Clock;\n\nfn f() { crate::engine::shared(); }"),
            ("clock.rs", "pub struct Clock;"),
        ]);
        assert_eq!(g.components(), [["ctx", "engine"]]);
        assert_eq!(g.cycles_in(&g.components()[0]), [["ctx", "engine"]]);
        assert_eq!(g.edges["ctx"]["engine"], "ctx.rs:3");
    }

    #[test]
    fn a_dag_has_no_cycle() {
        let g = graph(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::{b::B, c::{self, C}};"),
            ("b.rs", "use crate::c::C; // use crate::a::A; a comment\nconst S: &str = \"crate::a::A\";"),
            ("c.rs", "#[cfg(test)]\nmod tests { use crate::a::A; }"),
        ]);
        assert_eq!(deps(&g, "a"), ["b", "c"]);
        assert_eq!(deps(&g, "b"), ["c"]);
        assert!(deps(&g, "c").is_empty(), "test modules, comments and strings are not edges");
        assert!(g.components().is_empty());
    }

    #[test]
    fn super_and_self_resolve_from_the_files_place() {
        let g = graph(&[
            ("lib.rs", "mod a; mod d;"),
            ("a/mod.rs", "mod b; use self::b::X; use super::d::D;"),
            ("a/b.rs", "use super::sibling; use super::super::d::{D, E};"),
            ("d/mod.rs", "mod inner { use super::super::a::Y; }"),
        ]);
        assert_eq!(g.modules, BTreeSet::from(["a".to_string(), "d".to_string()]));
        assert_eq!(deps(&g, "a"), ["d"]);
        assert_eq!(deps(&g, "d"), ["a"]);
        assert_eq!(g.components(), [["a", "d"]]);
    }

    #[test]
    fn names_the_root_reexports_count_as_their_module() {
        let g = graph(&[
            ("lib.rs", "mod engine; mod ctx;\npub use engine::{Engine, Started as S};\npub use ctx::Ctx;"),
            ("engine.rs", "use crate::Ctx;"),
            ("ctx.rs", "use crate::{Engine, Unknown};\nfn f(_: &'static str, _: char) { let _ = '\\''; }"),
        ]);
        assert_eq!(deps(&g, "ctx"), ["engine"]);
        assert_eq!(deps(&g, "engine"), ["ctx"]);
    }

    #[test]
    fn a_larger_component_shows_a_cycle_through_every_module() {
        let g = graph(&[
            ("lib.rs", "mod a; mod b; mod c;"),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "use crate::c::X; use crate::a::Y;"),
            ("c.rs", "use crate::a::X;"),
        ]);
        let component = &g.components()[0];
        assert_eq!(component, &["a", "b", "c"]);
        assert_eq!(g.cycles_in(component), [vec!["a", "b"], vec!["a", "b", "c"]]);
    }
}
