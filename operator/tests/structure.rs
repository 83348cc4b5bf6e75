//! The module structure stays a hierarchy: no module imports, directly or through others, a module
//! that imports it back. Checked for every crate of the workspace (the members of the root
//! `Cargo.toml`, so that a new crate is checked from the day it joins; payment-resource's `payouts`
//! and `posting`, lock-server's backends and lock-client's handles and sessions once imported each
//! other), over every module file's `use` trees and the `crate::…` / `super::…` paths its code
//! names (test modules excluded: they may look at anything). Paths through a re-export (`pub use`) count as edges to where the item lives. A
//! submodule naming what its own parent (or any ancestor) declares is inside that module, not a
//! dependency of it, and is not an edge; everything else is.
//!
//! The same check runs at the level of the operator's top modules (`actions`, `builders`,
//! `controller`, `crd`, …), so that one whole module never depends on another that depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module by its path from the crate root (`[]` is the root).
type ModPath = Vec<String>;

struct Module {
    path: ModPath,
    /// The file's code before its first `#[cfg(test)]`, comments removed.
    code: String,
}

fn crate_modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Module>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            walk(root, &p, out);
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = p.strip_prefix(root).expect("under src");
        let mut path: ModPath = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        match path.last().map(String::as_str) {
            Some("lib") if path.len() == 1 => path.clear(),
            Some("main") if path.len() == 1 => continue,
            Some("mod") => {
                path.pop();
            }
            _ => {}
        }
        // Test-only modules (`mod tests;`, `mod testing;`) may use anything, and so may the modules
        // inside them (a `tests/` folder split by concern).
        if path.iter().any(|n| n == "tests" || n == "testing") {
            continue;
        }
        let text = fs::read_to_string(&p).expect("read module");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code = code
            .lines()
            .map(|l| match l.find("//") {
                Some(i) => &l[..i],
                None => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        out.push(Module { path, code });
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens of a `use` tree: identifiers, `::`, `{`, `}`, `,`, `*`.
fn tokens(tree: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = tree.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
            continue;
        }
        if "{},*".contains(c) {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// Every path a `use` tree names (`a::{b, c::d as e}` → `a::b`, `a::c::d`; `self` and `*` name the
/// prefix).
fn expand(tokens: &[String], pos: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match tokens.get(*pos).map(String::as_str) {
            Some("::") => *pos += 1,
            Some("{") => {
                *pos += 1;
                loop {
                    match tokens.get(*pos).map(String::as_str) {
                        None => return,
                        Some("}") => {
                            *pos += 1;
                            return;
                        }
                        Some(",") => *pos += 1,
                        Some(_) => expand(tokens, pos, &path, out),
                    }
                }
            }
            Some("*") => {
                *pos += 1;
                out.push(path);
                return;
            }
            Some("as") => {
                *pos += 2;
                out.push(path);
                return;
            }
            Some("," | "}") | None => {
                out.push(path);
                return;
            }
            Some("self") if !path.is_empty() => *pos += 1,
            Some(ident) => {
                path.push(ident.to_owned());
                *pos += 1;
            }
        }
    }
}

/// The `use` statements of `code`, whole (they may span lines), with whether each is `pub`.
fn use_statements(code: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = &rest[..i];
        let at_start = before
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}');
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        let lead = before[line_start..].trim();
        let Some(end) = rest[i..].find(';') else {
            break;
        };
        if at_start && (lead.is_empty() || lead.starts_with("pub")) {
            out.push((lead.starts_with("pub"), rest[i + 4..i + end].to_owned()));
            rest = &rest[i + end..];
        } else {
            rest = &rest[i + 4..];
        }
    }
    out
}

/// `crate::a::b` / `super::x` paths named in code outside `use` statements.
fn inline_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            let mut segs = Vec::new();
            let mut j = i;
            loop {
                let start = j;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                segs.push(chars[start..j].iter().collect::<String>());
                if chars.get(j) == Some(&':')
                    && chars.get(j + 1) == Some(&':')
                    && chars.get(j + 2).is_some_and(|c| is_ident(*c))
                {
                    j += 2;
                } else {
                    break;
                }
            }
            let first = segs[0].as_str();
            if segs.len() > 1 && (first == "crate" || first == "super" || children.contains(first)) {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

struct Graph {
    modules: BTreeSet<ModPath>,
    /// Per module: name → the module its `pub use` re-exports it from.
    reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
}

impl Graph {
    fn children(&self, of: &ModPath) -> BTreeSet<String> {
        self.modules
            .iter()
            .filter(|m| m.len() == of.len() + 1 && m.starts_with(of))
            .map(|m| m[of.len()].clone())
            .collect()
    }

    /// The module a path names (or names an item of), from inside `from`; `None` outside the crate.
    fn resolve(&self, from: &ModPath, path: &[String]) -> Option<ModPath> {
        let mut at: ModPath = match path.first()?.as_str() {
            "crate" => Vec::new(),
            "super" | "self" => from.clone(),
            name if self.children(from).contains(name) => from.clone(),
            _ => return None,
        };
        let skip = usize::from(path[0] == "crate" || path[0] == "self");
        for s in &path[skip..] {
            if s == "super" {
                at.pop();
                continue;
            }
            let mut next = at.clone();
            next.push(s.clone());
            if self.modules.contains(&next) {
                at = next;
                continue;
            }
            // An item of `at`: where it really lives, if `at` re-exports it.
            if let Some(target) = self.reexports.get(&at).and_then(|r| r.get(s)) {
                return Some(target.clone());
            }
            break;
        }
        Some(at)
    }
}

fn edges(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let modules = crate_modules(src);
    let mut graph = Graph {
        modules: modules.iter().map(|m| m.path.clone()).collect(),
        reexports: BTreeMap::new(),
    };
    graph.modules.insert(Vec::new());
    // Re-exports first (a path through one resolves to where the item lives).
    let mut reexports = BTreeMap::new();
    for m in &modules {
        for (public, stmt) in use_statements(&m.code) {
            if !public {
                continue;
            }
            let toks = tokens(&stmt);
            let mut paths = Vec::new();
            expand(&toks, &mut 0, &[], &mut paths);
            for p in paths {
                let Some(name) = p.last().cloned() else {
                    continue;
                };
                if let Some(target) = graph.resolve(&m.path, &p[..p.len() - 1]) {
                    reexports
                        .entry(m.path.clone())
                        .or_insert_with(BTreeMap::new)
                        .insert(name, target);
                }
            }
        }
    }
    graph.reexports = reexports;
    let mut out: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for m in &modules {
        let children = graph.children(&m.path);
        let mut paths = Vec::new();
        let mut rest = m.code.clone();
        for (_, stmt) in use_statements(&m.code) {
            expand(&tokens(&stmt), &mut 0, &[], &mut paths);
            rest = rest.replacen(&format!("use {stmt};"), "", 1);
        }
        paths.extend(inline_paths(&rest, &children));
        let targets = out.entry(m.path.clone()).or_default();
        for p in paths {
            if let Some(t) = graph.resolve(&m.path, &p)
                && !m.path.starts_with(&t)
            {
                targets.insert(t);
            }
        }
    }
    out
}

/// The cycles of `graph` (its strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<String>> {
    let nodes: Vec<&ModPath> = graph.keys().collect();
    let reach = |from: &ModPath| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for t in graph.get(&n).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&ModPath, BTreeSet<ModPath>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) {
            continue;
        }
        let component: Vec<&ModPath> = nodes
            .iter()
            .copied()
            .filter(|m| m == n || (reachable[n].contains(*m) && reachable[m].contains(*n)))
            .collect();
        if component.len() > 1 {
            out.push(component.iter().map(|m| name(m)).collect());
        }
        done.extend(component.into_iter().cloned());
    }
    out
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn src(crate_dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_dir).join("src")
}

#[test]
fn the_operators_modules_import_no_circle() {
    let graph = edges(&src("."));
    assert!(graph.len() > 20, "modules not found: {:?}", graph.keys());
    assert_eq!(cycles(&graph), Vec::<Vec<String>>::new());
}

#[test]
fn the_operators_top_modules_import_no_circle() {
    let mut top: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, targets) in edges(&src(".")) {
        let Some(f) = from.first() else { continue };
        let entry = top.entry(vec![f.clone()]).or_default();
        for t in targets {
            if let Some(t) = t.first().filter(|t| *t != f) {
                entry.insert(vec![t.clone()]);
            }
        }
    }
    assert_eq!(cycles(&top), Vec::<Vec<String>>::new());
}

/// The workspace's crates: the `members` of the `[workspace]` table of the manifest at `root`, a
/// member ending in `/*` standing for every folder under it that holds a `Cargo.toml`.
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("read the workspace manifest");
    let start = manifest.find("members").expect("a members list");
    let list = &manifest[start..];
    let list = &list[list.find('[').expect("members = [") + 1..list.find(']').expect("]")];
    let mut out = Vec::new();
    for entry in list.lines().map(|l| l.split('#').next().unwrap_or_default()) {
        for quoted in entry.split('"').skip(1).step_by(2) {
            match quoted.strip_suffix("/*") {
                None => out.push(quoted.to_owned()),
                Some(parent) => {
                    let mut found: Vec<String> = fs::read_dir(root.join(parent))
                        .expect("read a members glob's folder")
                        .map(|e| e.expect("dir entry").path())
                        .filter(|p| p.join("Cargo.toml").is_file())
                        .filter_map(|p| Some(format!("{parent}/{}", p.file_name()?.to_str()?)))
                        .collect();
                    found.sort();
                    out.extend(found);
                }
            }
        }
    }
    out
}

#[test]
fn no_crate_of_the_workspace_imports_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = workspace_members(&root);
    for expected in ["operator", "services/lock-server", "services/payment-resource"] {
        assert!(
            members.iter().any(|m| m == expected),
            "{expected} not in {members:?}"
        );
    }
    let mut circles = BTreeMap::new();
    for member in &members {
        let src = root.join(member).join("src");
        assert!(
            src.join("lib.rs").is_file() || src.join("main.rs").is_file(),
            "{member}: no crate root in src/"
        );
        let graph = edges(&src);
        let found = cycles(&graph);
        if !found.is_empty() {
            circles.insert(member.clone(), found);
        }
    }
    assert_eq!(circles, BTreeMap::new());
}

/// The members are read as cargo reads them: listed ones, and the crates under a glob (a new crate
/// there is checked without being named anywhere).
#[test]
fn the_workspace_members_are_all_found() {
    let dir = std::env::temp_dir().join(format!("dlock-members-{}", std::process::id()));
    fs::create_dir_all(dir.join("tools/new-crate")).unwrap();
    fs::create_dir_all(dir.join("tools/not-a-crate")).unwrap();
    fs::write(dir.join("tools/new-crate/Cargo.toml"), "[package]\n").unwrap();
    fs::write(
        dir.join("Cargo.toml"),
        "[workspace]\nresolver = \"3\"\nmembers = [\n    \"a\", # the first\n    \"b/c\",\n    \"tools/*\",\n]\n\n[workspace.dependencies]\nx = { path = \"x\" }\n",
    )
    .unwrap();
    let members = workspace_members(&dir);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(members, vec!["a", "b/c", "tools/new-crate"]);
}

/// Negative control: the check sees a circle, through a `use` tree and through an inline path.
#[test]
fn a_circle_is_found() {
    let dir = std::env::temp_dir().join(format!("dlock-structure-{}", std::process::id()));
    let src = dir.join("src");
    fs::create_dir_all(src.join("b")).unwrap();
    fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    fs::write(src.join("a.rs"), "use crate::b::{x::Y, x};\n").unwrap();
    // A parent and its child naming each other: the module and its inside, not a circle.
    fs::write(
        src.join("b/mod.rs"),
        "pub mod x;\npub struct T;\nfn g() { x::h(); }\n",
    )
    .unwrap();
    fs::write(src.join("b/x.rs"), "use super::T;\nfn f() { crate::a::g(); }\n").unwrap();
    fs::write(
        src.join("c.rs"),
        "use super::a;\n#[cfg(test)]\nmod tests { use crate::c; }\n",
    )
    .unwrap();
    let found = cycles(&edges(&src));
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, vec![vec!["a".to_owned(), "b::x".to_owned()]]);
}
