//! The app crate's layers, checked from its source: which folder of `src/` may use which (the
//! rule README's "Layout" states), and no circle of files that use each other. A `use` (or an
//! inline `crate::…` path) outside `#[cfg(test)]` code is an edge from its file to the file that
//! defines what it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What each layer of `src/` may use besides itself. `stderr` (the message macros) is open to
/// all; `main.rs` and `lib.rs` stand above everything.
const MAY_USE: &[(&str, &[&str])] = &[
    ("model", &[]),
    ("analysis", &["model"]),
    ("render", &["model", "analysis"]),
    ("run", &["model", "analysis"]),
    ("cli", &["run"]),
    ("tui", &["model", "analysis", "render", "run", "cli"]),
    ("cmd", &["model", "analysis", "render", "run", "cli"]),
];

const OPEN_TO_ALL: &[&str] = &["stderr"];

/// The crates whose files must not use each other in a circle: the app, then the libraries.
const CRATES: &[&str] = &["src", "workloads/src", "probes/src", "testkit/src"];

fn src() -> PathBuf {
    crate_src("src")
}

fn crate_src(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
}

/// Every .rs file under `dir`, as paths relative to `root`.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root).unwrap().to_path_buf());
        }
    }
}

/// The layer a file of `src/` belongs to: its folder, or its own name for a top-level file.
fn layer_of(file: &Path) -> String {
    let first = file
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// The source without `#[cfg(test)]` items (test modules may build fixtures from any layer),
/// comments, and string literals.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            // Skip the item that follows: up to its matching closing brace or a `;`.
            let mut depth = 0i32;
            let mut opened = false;
            for l in lines.by_ref() {
                let code = l.split("//").next().unwrap_or("");
                depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
                opened |= code.contains('{');
                if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        out.push_str(&strip_strings(code));
        out.push('\n');
    }
    out
}

fn strip_strings(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in line.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else {
            out.push(c);
        }
    }
    out
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap().trim().to_string()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap()];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.to_string()
            } else {
                format!("{prefix}::{p}")
            }
        })
        .collect()
}

/// The crate paths a file names: its `use` trees expanded, and inline `crate::…` paths.
fn paths_named(file: &Path, code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let flat = code.replace('\n', " ");
    for (at, _) in flat.match_indices("use ") {
        let boundary = flat[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !boundary {
            continue;
        }
        let tree = &flat[at + 4..];
        paths.extend(expand(&tree[..tree.find(';').unwrap_or(tree.len())]));
    }
    for (i, _) in flat.match_indices("crate::") {
        let rest: String = flat[i..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        paths.push(rest);
    }
    let dir: Vec<String> = file
        .parent()
        .unwrap()
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    paths
        .into_iter()
        .filter_map(|p| {
            let segs: Vec<String> = p
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            match segs.first().map(String::as_str) {
                Some("crate") => Some(segs[1..].to_vec()),
                Some("super") => {
                    let mut base = dir.clone();
                    let mut rest = &segs[..];
                    // `super` of src/a/b.rs is src/a (mod.rs); each further one goes up.
                    if file.file_name().unwrap() == "mod.rs" {
                        base.pop();
                    }
                    rest = &rest[1..];
                    while rest.first().map(String::as_str) == Some("super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    Some(base.into_iter().chain(rest.iter().cloned()).collect())
                }
                _ => None,
            }
        })
        .collect()
}

/// The file under `root` that defines the longest prefix of `segs` that is a module.
fn file_of(root: &Path, segs: &[String]) -> Option<PathBuf> {
    let mut best = None;
    let mut dir = PathBuf::new();
    for seg in segs {
        let as_file = dir.join(format!("{seg}.rs"));
        let as_dir = dir.join(seg).join("mod.rs");
        if root.join(&as_file).is_file() {
            best = Some(as_file);
        } else if root.join(&as_dir).is_file() {
            best = Some(as_dir);
        } else {
            break;
        }
        dir.push(seg);
    }
    best
}

/// file -> the files it uses (test code left out), in the crate whose sources are at `root`.
fn edges(root: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(root, root, &mut files);
    let mut graph = BTreeMap::new();
    for file in files {
        let code = code_of(&std::fs::read_to_string(root.join(&file)).unwrap());
        let targets: BTreeSet<PathBuf> = paths_named(&file, &code)
            .iter()
            .filter_map(|segs| file_of(root, segs))
            .filter(|t| *t != file)
            // A folder's mod.rs only names its files.
            .filter(|t| {
                !(t.file_name().unwrap() == "mod.rs" && file.starts_with(t.parent().unwrap()))
            })
            .collect();
        graph.insert(file, targets);
    }
    graph
}

#[test]
fn each_layer_uses_only_the_layers_below_it() {
    let rule: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    let mut breaches = Vec::new();
    for (file, targets) in edges(&src()) {
        let from = layer_of(&file);
        let Some(allowed) = rule.get(from.as_str()) else {
            continue; // main.rs, lib.rs, stderr.rs
        };
        for target in targets {
            let to = layer_of(&target);
            if to != from && !allowed.contains(&to.as_str()) && !OPEN_TO_ALL.contains(&to.as_str())
            {
                breaches.push(format!("{} uses {}", file.display(), target.display()));
            }
        }
    }
    assert!(
        breaches.is_empty(),
        "imports against the layer rule (README, Layout):\n  {}",
        breaches.join("\n  ")
    );
}

#[test]
fn no_files_use_each_other_in_a_circle() {
    let circles: Vec<String> = CRATES
        .iter()
        .flat_map(|dir| {
            circles(&edges(&crate_src(dir)))
                .into_iter()
                .map(move |c| format!("{dir}: {}", c.join(" <-> ")))
        })
        .collect();
    assert!(
        circles.is_empty(),
        "files that use each other in a circle:\n  {}",
        circles.join("\n  ")
    );
}

/// Tarjan's strongly connected components of more than one file.
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        circles: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.display().to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.circles.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        circles: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.circles
}

#[test]
fn the_checker_sees_uses_of_every_shape() {
    assert_eq!(
        expand("crate::model::{profile::{Profile, Stage as S}, host, self}"),
        [
            "crate::model::profile::Profile",
            "crate::model::profile::Stage",
            "crate::model::host",
            "crate::model"
        ]
    );
    let code = code_of(
        "use crate::model::profile::Profile;\nfn f() { crate::run::series::go(); }\n#[cfg(test)]\nmod tests {\n    use crate::cmd::record;\n}\n",
    );
    let named = paths_named(Path::new("analysis/diff.rs"), &code);
    assert!(named.contains(&vec!["model".into(), "profile".into(), "Profile".into()]));
    assert!(named.contains(&vec!["run".into(), "series".into(), "go".into()]));
    assert!(
        !named.iter().any(|p| p[0] == "cmd"),
        "test code is left out: {named:?}"
    );
    assert_eq!(
        file_of(
            &src(),
            &["model".into(), "profile".into(), "Profile".into()]
        ),
        Some(PathBuf::from("model/profile.rs"))
    );
}
