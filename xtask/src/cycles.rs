//! `cargo xtask cycles`: import cycles between the modules of a crate, nested ones included
//! (DESIGN §5: "no import cycle between runtime modules").
//!
//! # The graph
//!
//! Reads every `.rs` file under a `src` directory. The nodes are module paths: `a.rs` and
//! `a/mod.rs` are `a`, `a/b.rs` is `a::b`, an inline `mod c { … }` in it is `a::b::c`. Test
//! modules (`#[cfg(test)] mod … { }`, and the file of a `#[cfg(test)] mod x;`) are left out;
//! the crate root (`lib.rs`) is no node: it is the crate's façade.
//!
//! A reference is a path that names something of the crate, in a `use` item or in code:
//! `crate::…` (`$crate::…`), `self::…`, `super::…`, or a path starting with the name of a
//! child module or of an import of the module (`use executor::Executor;` in `sched`). It
//! resolves to the longest prefix of the path that is a module (`crate::sched::executor::Foo`
//! → `sched::executor`, `crate::sched::Shared` → `sched`), and when the next name is one the
//! module imports, on to where that import leads: `crate::Engine` → `engine` when `lib.rs`
//! has `pub use engine::Engine;`, `super::WorkflowCtx` → `turn::ctx` when `turn` has
//! `pub use ctx::WorkflowCtx;`. A re-export never hides where a name is defined. Comments and
//! string literals are ignored; a `mod x;` declaration is no reference.
//!
//! A reference from module `m` to module `t` is an edge where the two part: between the
//! children of their deepest common ancestor that hold them (`turn::ctx` → `sched::executor`
//! is the edge `turn -> sched`, `sched::executor` → `sched::timers` is itself), or, when one
//! is inside the other, between the outer one and its child on the way (`a::b::c` → `a` is
//! `a::b -> a`). So the top-level modules are checked as before, and the modules under each
//! parent, with the parent itself, are checked the same way.
//!
//! # Parents and children
//!
//! A module and its submodules are one unit to the rest of the crate. A child using its parent
//! (`use super::Shared;`) is an edge `child -> parent`; a parent reaching into its own children
//! (a field of a child's type, `child::f()`, `pub use child::X`) is no edge: that is the hub
//! pattern the runtime uses (`sched::Shared` owns each child's state and each child works on
//! `&Shared`). What the check forbids is a cycle between top-level modules and a cycle between
//! siblings under one parent (`sched::executor -> sched::timers -> sched::executor`). Paths
//! only: a dependency through a field access (`shared.timers.schedule()`) or through a trait
//! method is invisible to it.
//!
//! Cycles are the strongly connected components of that graph (Tarjan), printed as
//! `cycle: a -> b -> a`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

/// The module graph: each module's dependencies, with where the first reference of each edge
/// was seen (`file:line`, followed by the two modules it joins when those are not the edge's
/// own: `turn/ctx.rs:9 (turn::ctx -> sched::executor)` for the edge `turn -> sched`).
#[derive(Debug, Default)]
pub(crate) struct Graph {
    pub(crate) modules: BTreeSet<String>,
    pub(crate) edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    /// The graph of the crate whose sources are `files`: `(path relative to src/, source)`.
    pub(crate) fn from_sources(files: &[(String, String)]) -> Graph {
        let mut krate = Crate::default();
        for (path, src) in files {
            krate.scan(path, src);
        }
        krate.drop_test_modules();
        krate.graph()
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

/// A module path: `[]` is the crate root, `[sched, executor]` is `sched::executor`.
type ModPath = Vec<String>;

/// What the sources of a crate say about its modules.
#[derive(Default)]
struct Crate {
    /// Every module but the root.
    modules: BTreeSet<ModPath>,
    /// Each module's file and references (the root's too).
    sources: BTreeMap<ModPath, Source>,
    /// Each module's item-level imports: the name a `use` binds → the path it imports, and
    /// whether the `use` is `pub` (else only the module and its descendants see it).
    imports: BTreeMap<ModPath, BTreeMap<String, (Vec<String>, bool)>>,
    /// Modules declared `#[cfg(test)] mod x;`: their files are left out.
    test_modules: Vec<ModPath>,
}

#[derive(Default)]
struct Source {
    file: String,
    refs: Vec<Ref>,
}

/// A path that may name something of the crate.
struct Ref {
    path: Vec<String>,
    line: usize,
}

impl Crate {
    /// Reads one file: its modules (the file's and inline ones), imports and references.
    fn scan(&mut self, file: &str, src: &str) {
        let file_module = module_path(file);
        let tokens = tokenize(&strip(src));
        // Open modules: (path, brace depth of its body, whether it is a test module).
        let mut open: Vec<(ModPath, usize, bool)> = vec![(file_module.clone(), 0, false)];
        self.declare(&file_module, file);
        let mut depth = 0;
        let mut i = 0;
        while i < tokens.len() {
            let (module, base, test) = open.last().cloned().expect("the file's module stays open");
            let t = &tokens[i];
            let prev = i.checked_sub(1).map(|p| tokens[p].text.as_str());
            match t.text.as_str() {
                "mod" if tokens.get(i + 1).is_some_and(is_ident) => {
                    let test = test || is_test_mod(&tokens, i);
                    let path = [module.as_slice(), &[tokens[i + 1].text.clone()]].concat();
                    if is(&tokens, i + 2, "{") {
                        depth += 1;
                        if !test {
                            self.declare(&path, file);
                        }
                        open.push((path, depth, test));
                        i += 3;
                    } else {
                        if test {
                            self.test_modules.push(path);
                        }
                        i += 2;
                    }
                    continue;
                }
                "{" => depth += 1,
                "}" => {
                    if open.len() > 1 && base == depth {
                        open.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                // Not `+ use<'a, T>`, a bound.
                "use" if !is(&tokens, i + 1, "<") => {
                    let end = (i..tokens.len()).find(|&j| tokens[j].text == ";").unwrap_or(tokens.len());
                    if !test {
                        let public = is_public(&tokens, i);
                        for leaf in use_leaves(&tokens[i + 1..end]) {
                            if depth == base
                                && let Some(name) = &leaf.binding
                            {
                                let imports = self.imports.entry(module.clone()).or_default();
                                imports.entry(name.clone()).or_insert_with(|| (leaf.path.clone(), public));
                            }
                            let r = Ref { path: leaf.path, line: leaf.line };
                            self.source(&module).refs.push(r);
                        }
                    }
                    i = end + 1;
                    continue;
                }
                _ if !test && (is_ident(t) || t.text == "$crate") && !matches!(prev, Some("::" | ".")) => {
                    let source = self.source(&module);
                    // A path, unless it is the `crate::a` of `pub(in crate::a)`.
                    let visibility = prev == Some("in") && i >= 3 && tokens[i - 2].text == "(";
                    if is(&tokens, i + 1, "::") && !visibility {
                        let mut path = vec![t.text.clone()];
                        let mut j = i + 1;
                        while is(&tokens, j, "::") && tokens.get(j + 1).is_some_and(is_ident) {
                            path.push(tokens[j + 1].text.clone());
                            j += 2;
                        }
                        if path.len() > 1 {
                            source.refs.push(Ref { path, line: t.line });
                        }
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn declare(&mut self, module: &ModPath, file: &str) {
        if !module.is_empty() {
            self.modules.insert(module.clone());
        }
        self.source(module).file = file.to_string();
    }

    fn source(&mut self, module: &ModPath) -> &mut Source {
        self.sources.entry(module.clone()).or_default()
    }

    /// Leaves out the test modules declared `#[cfg(test)] mod x;` and everything inside them.
    fn drop_test_modules(&mut self) {
        let tests = std::mem::take(&mut self.test_modules);
        let kept = |m: &ModPath| !tests.iter().any(|t| m.starts_with(t));
        self.modules.retain(|m| kept(m));
        self.sources.retain(|m, _| kept(m));
        self.imports.retain(|m, _| kept(m));
    }

    /// The module a path used in `from` names something of, and whether it names that module
    /// itself (`crate::sched`, `super::*`) rather than an item in it; `None` when it names
    /// nothing of this crate (`std::…`, a local, another crate) or nothing at all.
    fn resolve(&self, from: &[String], path: &[String], seen: &mut Vec<(ModPath, String)>) -> Option<(ModPath, bool)> {
        let (mut module, mut rest): (ModPath, &[String]) = match path.first()?.as_str() {
            "crate" | "$crate" => (Vec::new(), &path[1..]),
            "self" => (from.to_vec(), &path[1..]),
            "super" => (from.to_vec(), path),
            first if self.modules.contains(&[from, &[first.to_string()]].concat()) => (from.to_vec(), path),
            // A name this module imports: `use super::operate;` then `operate::f()`.
            first => match self.import(from, from, first, seen)? {
                Some((module, true)) => (module, &path[1..]),
                other => return other,
            },
        };
        while rest.first().is_some_and(|s| s == "super") {
            module.pop()?;
            rest = &rest[1..];
        }
        while let Some(name) = rest.first() {
            let child = [module.as_slice(), std::slice::from_ref(name)].concat();
            if !self.modules.contains(&child) {
                break;
            }
            module = child;
            rest = &rest[1..];
        }
        match rest.first().map(String::as_str) {
            None | Some("*") => Some((module, true)),
            Some(name) => self.import(from, &module, name, seen).unwrap_or(Some((module, false))),
        }
    }

    /// What `name` imported at item level in `module` resolves to, seen from `from`: `None`
    /// when the module imports no such name visible from there (a private import is seen by
    /// the module and its descendants), `Some(None)` when the import leads outside the crate
    /// (or in a circle).
    fn import(
        &self,
        from: &[String],
        module: &[String],
        name: &str,
        seen: &mut Vec<(ModPath, String)>,
    ) -> Option<Option<(ModPath, bool)>> {
        let (path, public) = self.imports.get(module)?.get(name)?;
        if !public && !from.starts_with(module) {
            return None;
        }
        let key = (module.to_vec(), name.to_string());
        if seen.contains(&key) {
            return Some(None);
        }
        seen.push(key);
        Some(self.resolve(module, path, seen))
    }

    /// The graph: every reference of every module, drawn at the level where its two modules
    /// part (see the module docs).
    fn graph(&self) -> Graph {
        let mut graph = Graph { modules: self.modules.iter().map(|m| m.join("::")).collect(), edges: BTreeMap::new() };
        for (module, source) in self.sources.iter().filter(|(m, _)| !m.is_empty()) {
            for r in &source.refs {
                let Some((target, _)) = self.resolve(module, &r.path, &mut Vec::new()) else { continue };
                if target.is_empty() || &target == module {
                    continue;
                }
                // A parent reaching into its own children is no edge: a module and its
                // submodules are one unit (the hub pattern: `sched::Shared` owns each child's
                // state, each child works on `&Shared`). Cycles between siblings, and between
                // top-level modules, are what the check forbids.
                if target.starts_with(module) {
                    continue;
                }
                let (from, to) = level(module, &target);
                let mut at = format!("{}:{}", source.file, r.line);
                if (from, to) != (module.as_slice(), target.as_slice()) {
                    at.push_str(&format!(" ({} -> {})", module.join("::"), target.join("::")));
                }
                graph.edges.entry(from.join("::")).or_default().entry(to.join("::")).or_insert(at);
            }
        }
        graph
    }
}

/// The two modules an edge for a reference from `from` to `to` joins: the children of their
/// deepest common ancestor that hold them, or, when one is inside the other, the outer one and
/// its child on the way.
fn level<'a>(from: &'a [String], to: &'a [String]) -> (&'a [String], &'a [String]) {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    (&from[..from.len().min(common + 1)], &to[..to.len().min(common + 1)])
}

/// The module path of a file under `src/`: `lib.rs` → `[]`, `a.rs` and `a/mod.rs` → `[a]`,
/// `a/b.rs` → `[a, b]`.
fn module_path(path: &str) -> ModPath {
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

/// One leaf of a `use` tree: `use a::{b::C, d::{self, E as F}, g::*};` has the leaves
/// `a::b::C` (binding `C`), `a::d` (`d`), `a::d::E` (`F`) and the glob `a::g::*`.
#[derive(Debug, PartialEq)]
struct Leaf {
    path: Vec<String>,
    binding: Option<String>,
    glob: bool,
    line: usize,
}

/// The leaves of the `use` tree `tokens` (what follows `use`, up to the `;`).
fn use_leaves(tokens: &[Token]) -> Vec<Leaf> {
    fn tree(tokens: &[Token], i: &mut usize, mut path: Vec<String>, out: &mut Vec<Leaf>) {
        if is(tokens, *i, "::") {
            // `::name`: a crate, never a module of this one.
            path.push("::".into());
            *i += 1;
        }
        while let Some(t) = tokens.get(*i) {
            match t.text.as_str() {
                "{" => {
                    *i += 1;
                    while *i < tokens.len() && !is(tokens, *i, "}") {
                        tree(tokens, i, path.clone(), out);
                        if is(tokens, *i, ",") {
                            *i += 1;
                        } else if !is(tokens, *i, "}") {
                            return; // not a use tree
                        }
                    }
                    *i += 1;
                    return;
                }
                "*" => {
                    *i += 1;
                    out.push(Leaf { path: [path, vec!["*".into()]].concat(), binding: None, glob: true, line: t.line });
                    return;
                }
                name if is_ident(t) => {
                    *i += 1;
                    if is(tokens, *i, "::") {
                        path.push(name.to_string());
                        *i += 1;
                        continue;
                    }
                    if name != "self" {
                        path.push(name.to_string());
                    }
                    let mut binding = path.last().cloned();
                    if is(tokens, *i, "as") {
                        binding = tokens.get(*i + 1).map(|t| t.text.clone()).filter(|alias| alias != "_");
                        *i += 2;
                    }
                    out.push(Leaf { path, binding, glob: false, line: t.line });
                    return;
                }
                _ => return,
            }
        }
    }
    let mut out = Vec::new();
    tree(tokens, &mut 0, Vec::new(), &mut out);
    out
}

/// Whether the `use` at `i` is `pub` or `pub(…)`.
fn is_public(tokens: &[Token], i: usize) -> bool {
    let mut j = i;
    if j > 0 && tokens[j - 1].text == ")" {
        while j > 0 && tokens[j - 1].text != "(" {
            j -= 1;
        }
        j = j.saturating_sub(1);
    }
    j > 0 && tokens[j - 1].text == "pub"
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
        assert_eq!(g.modules, BTreeSet::from(["a", "a::b", "d", "d::inner"].map(String::from)));
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

    #[test]
    fn a_cycle_between_nested_siblings_is_found() {
        let g = graph(&[
            ("lib.rs", "mod sched;"),
            ("sched/mod.rs", "mod executor;\nmod timers;\npub(crate) struct Shared;"),
            ("sched/executor.rs", "use super::Shared;\nuse super::timers::Timer;\npub(crate) fn run(_: &Shared) {}"),
            (
                "sched/timers.rs",
                "use super::Shared;\npub(crate) struct Timer;\nfn f(s: &Shared) {\n    super::executor::run(s);\n}",
            ),
        ]);
        assert_eq!(g.components(), [["sched::executor", "sched::timers"]]);
        assert_eq!(g.edges["sched::executor"]["sched::timers"], "sched/executor.rs:2");
        assert_eq!(g.edges["sched::timers"]["sched::executor"], "sched/timers.rs:4");
        assert_eq!(deps(&g, "sched::executor"), ["sched", "sched::timers"], "a child uses its parent");
        assert!(deps(&g, "sched").is_empty(), "`mod executor;` is no edge");
    }

    #[test]
    fn a_parent_reexporting_its_children_is_no_cycle() {
        let g = graph(&[
            ("lib.rs", "mod engine;\nmod turn;"),
            (
                "turn/mod.rs",
                "mod child;\nmod ctx;\nmod wait;\npub use child::ChildHandle;\n\
                 pub(crate) use ctx::{Step, WorkflowCtx as Ctx};\npub use wait::*;\n\
                 pub(crate) struct TurnState;\nfn halt() {}",
            ),
            ("turn/ctx.rs", "use super::{TurnState, halt};\npub struct WorkflowCtx;\npub struct Step;"),
            ("turn/child.rs", "use super::{Ctx, TurnState};\npub struct ChildHandle;"),
            ("turn/wait.rs", "pub struct SignalError;\nfn f(_: super::TurnState) {}"),
            ("engine.rs", "fn f(_: crate::turn::Ctx) {}"),
        ]);
        assert!(g.components().is_empty());
        assert!(deps(&g, "turn").is_empty(), "re-exports are no edges");
        assert_eq!(deps(&g, "turn::ctx"), ["turn"]);
        assert_eq!(deps(&g, "turn::child"), ["turn", "turn::ctx"], "`super::Ctx` is `ctx`'s");
        assert_eq!(g.edges["engine"]["turn"], "engine.rs:1 (engine -> turn::ctx)");
    }

    #[test]
    fn a_parent_and_its_children_using_each_other_is_no_cycle_but_siblings_are() {
        let g = graph(&[
            ("lib.rs", "mod sched;\nmod turn;"),
            (
                "sched/mod.rs",
                "mod executor;\nmod hooks;\nmod timers;\nuse executor::Executor;\nuse hooks::Hooks;\n\
                 pub(crate) struct Shared {\n    executor: Executor,\n    hooks: Hooks,\n}\n\
                 fn f() {\n    timers::poke();\n}",
            ),
            (
                "sched/executor.rs",
                "use super::Shared;\npub(crate) struct Executor;\nfn g() {\n    super::timers::poke();\n}",
            ),
            ("sched/hooks.rs", "pub(crate) struct Hooks;"),
            ("sched/timers.rs", "pub(crate) fn poke() {}\nfn f(_: &super::Shared) {\n    super::executor::h();\n}"),
            (
                "turn/mod.rs",
                "mod ctx;\npub(crate) use ctx::Undo;\npub(crate) struct TurnState {\n    undos: Vec<Undo>,\n}",
            ),
            ("turn/ctx.rs", "pub(crate) struct Undo;\nfn f(_: super::TurnState) {}"),
        ]);
        // The hub (parent <-> children) is one unit; the siblings executor and timers are not.
        assert_eq!(g.components(), [["sched::executor", "sched::timers"]]);
        assert_eq!(g.edges["sched::executor"]["sched"], "sched/executor.rs:1");
        assert_eq!(g.edges["sched::executor"]["sched::timers"], "sched/executor.rs:4");
        assert!(deps(&g, "sched").is_empty(), "a parent reaching into its children is no edge");
        assert_eq!(g.edges["turn::ctx"]["turn"], "turn/ctx.rs:2");
    }

    #[test]
    fn a_reexport_does_not_hide_a_cycle_between_siblings() {
        let g = graph(&[
            ("lib.rs", "mod turn;"),
            ("turn/mod.rs", "mod child;\nmod ctx;\npub use ctx::WorkflowCtx;"),
            ("turn/child.rs", "use super::WorkflowCtx;\npub(crate) fn spawn() {}"),
            ("turn/ctx.rs", "pub struct WorkflowCtx;\nfn f() {\n    super::child::spawn();\n}"),
        ]);
        assert_eq!(g.components(), [["turn::child", "turn::ctx"]]);
        assert_eq!(g.edges["turn::child"]["turn::ctx"], "turn/child.rs:1");
        assert_eq!(g.edges["turn::ctx"]["turn::child"], "turn/ctx.rs:3");
    }

    #[test]
    fn paths_resolve_to_the_longest_module_prefix_and_join_at_the_level_they_part() {
        let g = graph(&[
            ("lib.rs", "mod engine;\nmod sched;\nmod turn;"),
            ("sched/mod.rs", "mod executor;\nmod timers;\npub(crate) struct Shared;"),
            ("sched/executor.rs", "pub(crate) struct Foo;\nmod inner {\n    pub(crate) fn g() {}\n}"),
            ("sched/timers.rs", "fn f(_: crate::sched::Shared) {\n    crate::sched::executor::inner::g();\n}"),
            ("engine.rs", "use crate::sched::executor::Foo;"),
            ("turn/ctx.rs", "fn f() {\n    crate::sched::executor::Foo::new();\n}"),
            ("turn/mod.rs", "mod ctx;"),
        ]);
        assert!(g.modules.contains("sched::executor::inner"));
        assert_eq!(deps(&g, "sched::timers"), ["sched", "sched::executor"]);
        assert_eq!(
            g.edges["sched::timers"]["sched::executor"],
            "sched/timers.rs:2 (sched::timers -> sched::executor::inner)"
        );
        assert_eq!(g.edges["engine"]["sched"], "engine.rs:1 (engine -> sched::executor)");
        assert_eq!(g.edges["turn"]["sched"], "turn/ctx.rs:2 (turn::ctx -> sched::executor)");
        assert!(g.components().is_empty());
    }

    #[test]
    fn test_modules_in_their_own_file_and_use_bounds_are_left_out() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;"),
            ("a/mod.rs", "#[cfg(test)]\nmod tests;\nfn f<T>(t: T) -> impl Sized + use<T> { t }\npub(crate) struct A;"),
            ("a/tests.rs", "use crate::b::B;"),
            ("b.rs", "use crate::a::A;\npub(crate) struct B;"),
        ]);
        assert_eq!(g.modules, BTreeSet::from(["a", "b"].map(String::from)));
        assert!(deps(&g, "a").is_empty());
        assert_eq!(deps(&g, "b"), ["a"]);
    }

    #[test]
    fn use_trees_are_read_leaf_by_leaf() {
        let tokens = tokenize("crate::{b::C, d::{self, E as F}, g::*, h::T as _}");
        let leaves: Vec<(String, Option<String>, bool)> =
            use_leaves(&tokens).into_iter().map(|l| (l.path.join("::"), l.binding, l.glob)).collect();
        let expected = [
            ("crate::b::C", Some("C"), false),
            ("crate::d", Some("d"), false),
            ("crate::d::E", Some("F"), false),
            ("crate::g::*", None, true),
            ("crate::h::T", None, false),
        ]
        .map(|(p, b, g)| (p.to_string(), b.map(String::from), g));
        assert_eq!(leaves, expected);
    }
}
