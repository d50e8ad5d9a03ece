//! The app crate's layers, checked from its source: which folder of `src/` may use which (the
//! rule README's "Layout" states), and no circle of files that use each other. A `use` (or an
//! inline `crate::…` path) outside `#[cfg(test)]` code is an edge from its file to the file that
//! defines what it names: a name that a module re-exports with `pub use` (a folder's `mod.rs`,
//! `lib.rs`, any file) is followed to the file its item comes from.

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
    expand_named(tree)
        .into_iter()
        .map(|(path, _)| path)
        .collect()
}

/// Expands a use tree into its paths, each with the name it brings in (`a::b as c`: `c`).
fn expand_named(tree: &str) -> Vec<(String, String)> {
    let last = |path: &str| path.rsplit("::").next().unwrap().trim().to_string();
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let mut parts = tree.split(" as ");
        let path = parts.next().unwrap().trim().to_string();
        let name = parts
            .next()
            .map_or_else(|| last(&path), |alias| alias.trim().to_string());
        return vec![(path, name)];
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
        .flat_map(expand_named)
        .map(|(path, name)| {
            if path == "self" {
                let name = if name == "self" { last(prefix) } else { name };
                (prefix.to_string(), name)
            } else {
                (format!("{prefix}::{path}"), name)
            }
        })
        .collect()
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The module a file is, as a path from the crate root: `kv/mod.rs` and `kv.rs` are `kv`,
/// `lib.rs` and `main.rs` the root.
fn module_of(file: &Path) -> Vec<String> {
    let mut segs: Vec<String> = file
        .parent()
        .unwrap()
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let stem = file.file_stem().unwrap().to_string_lossy();
    let root = segs.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root {
        segs.push(stem.into_owned());
    }
    segs
}

/// A `crate::`, `self::` or `super::` path written in `file`, as a path from the crate root;
/// None for any other (another crate's, `std`'s, a 2018 path to a child module).
fn absolute(file: &Path, segs: &[String]) -> Option<Vec<String>> {
    let (first, mut rest) = segs.split_first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => module_of(file),
        "super" => {
            // `super` of src/a/b.rs is src/a (mod.rs); each further one goes up.
            let mut base = module_of(file);
            base.pop();
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            base
        }
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base)
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
    paths
        .iter()
        .filter_map(|p| absolute(file, &segments(p)))
        .collect()
}

/// What a file re-exports: each name that a `pub use` (or `pub(…) use`) of its own brings in,
/// with the path from the crate root of what it names. Not followed, so that an import of the
/// name stops at this file: a `pub use` inside braces (an inline module's, a function's), a
/// glob, and a path out of the crate or to an item of the file itself (a macro, an enum's
/// variants).
fn reexports_of(root: &Path, file: &Path, code: &str) -> BTreeMap<String, Vec<String>> {
    let flat = code.replace('\n', " ");
    let module = module_of(file);
    let mut out = BTreeMap::new();
    for (at, _) in flat.match_indices("use ") {
        let before = flat[..at].trim_end();
        let visibility = match before.strip_suffix(')') {
            Some(b) => b.rfind('(').map_or("", |open| b[..open].trim_end()),
            None => before,
        };
        let public = visibility.strip_suffix("pub").is_some_and(|b| {
            b.chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        });
        // Char literals (`'{'`) are the only braces left outside blocks and use trees.
        let preceding = flat[..at].replace("'{'", "").replace("'}'", "");
        let top_level = preceding.matches('{').count() == preceding.matches('}').count();
        if !public || !top_level {
            continue;
        }
        let tree = &flat[at + 4..];
        for (path, name) in expand_named(&tree[..tree.find(';').unwrap_or(tree.len())]) {
            let segs = segments(&path);
            if segs.is_empty() || name == "*" || name == "_" {
                continue;
            }
            // Else a 2018 path: through a child module, or out of the crate.
            let target = absolute(file, &segs).or_else(|| {
                let child = [module.clone(), vec![segs[0].clone()]].concat();
                module_file(root, &child).map(|_| [module.clone(), segs].concat())
            });
            if let Some(target) = target {
                out.insert(name, target);
            }
        }
    }
    out
}

/// The file of the longest prefix of `segs` that is a module (the crate root's file for none),
/// and how many segments that prefix has.
fn longest_module(root: &Path, segs: &[String]) -> (PathBuf, usize) {
    let mut best = if root.join("lib.rs").is_file() {
        PathBuf::from("lib.rs")
    } else {
        PathBuf::from("main.rs")
    };
    let mut used = 0;
    let mut dir = PathBuf::new();
    for seg in segs {
        let as_file = dir.join(format!("{seg}.rs"));
        let as_dir = dir.join(seg).join("mod.rs");
        if root.join(&as_file).is_file() {
            best = as_file;
        } else if root.join(&as_dir).is_file() {
            best = as_dir;
        } else {
            break;
        }
        used += 1;
        dir.push(seg);
    }
    (best, used)
}

/// The file of the module at `segs`, if every segment is a module.
fn module_file(root: &Path, segs: &[String]) -> Option<PathBuf> {
    let (file, used) = longest_module(root, segs);
    (used == segs.len()).then_some(file)
}

/// A crate's sources: each file's code (test code, comments and strings left out), and what
/// each re-exports.
struct Crate {
    root: PathBuf,
    code: BTreeMap<PathBuf, String>,
    reexports: BTreeMap<PathBuf, BTreeMap<String, Vec<String>>>,
}

/// Where a path leads: the file that defines what it names, and the files whose `pub use` it
/// went through, in order.
#[derive(Debug, PartialEq)]
struct Found {
    file: PathBuf,
    via: Vec<PathBuf>,
}

impl Crate {
    fn new(root: PathBuf) -> Self {
        let mut files = Vec::new();
        rust_files(&root, &root, &mut files);
        let code: BTreeMap<PathBuf, String> = files
            .into_iter()
            .map(|f| {
                let text = std::fs::read_to_string(root.join(&f)).unwrap();
                (f, code_of(&text))
            })
            .collect();
        let reexports = code
            .iter()
            .map(|(f, c)| (f.clone(), reexports_of(&root, f, c)))
            .collect();
        Self {
            root,
            code,
            reexports,
        }
    }

    /// The file that defines what `segs` (a path from the crate root) names: the file of its
    /// longest prefix that is a module — or, when that module re-exports the next name, where
    /// the re-export leads, followed through any further one. None for a name of the crate
    /// root that it does not re-export from one of its modules.
    fn file_of(&self, segs: &[String]) -> Option<Found> {
        let mut segs = segs.to_vec();
        let mut via = Vec::new();
        loop {
            let (file, used) = longest_module(&self.root, &segs);
            let reexport = segs
                .get(used)
                .and_then(|name| self.reexports.get(&file)?.get(name));
            match reexport {
                // Rust has no loop of re-exports: the bound only keeps a misread finite.
                Some(target) if via.len() < 32 => {
                    segs = [target.clone(), segs[used + 1..].to_vec()].concat();
                    via.push(file);
                }
                _ => return (used > 0).then_some(Found { file, via }),
            }
        }
    }
}

/// file -> each file it uses (test code left out), with the first path that names it there.
type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, String>>;

/// The files of the crate whose sources are at `root`, and what each uses.
fn edges(root: &Path) -> Graph {
    let krate = Crate::new(root.to_path_buf());
    let mut graph = Graph::new();
    for (file, code) in &krate.code {
        let mut targets = BTreeMap::new();
        for segs in paths_named(file, code) {
            let Some(Found { file: target, via }) = krate.file_of(&segs) else {
                continue;
            };
            // A folder's mod.rs only names its files.
            let own_folder = target.file_name().unwrap() == "mod.rs"
                && file.starts_with(target.parent().unwrap());
            if target == *file || own_folder {
                continue;
            }
            let mut named = format!("crate::{}", segs.join("::"));
            if !via.is_empty() {
                let via: Vec<String> = via.iter().map(|v| v.display().to_string()).collect();
                named += &format!(", re-exported by {}", via.join(" then "));
            }
            targets.entry(target).or_insert(named);
        }
        graph.insert(file.clone(), targets);
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
        for (target, named) in targets {
            let to = layer_of(&target);
            if to != from && !allowed.contains(&to.as_str()) && !OPEN_TO_ALL.contains(&to.as_str())
            {
                breaches.push(format!(
                    "{} uses {} ({named})",
                    file.display(),
                    target.display()
                ));
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
    let mut found = Vec::new();
    for dir in CRATES {
        let graph = edges(&crate_src(dir));
        for circle in circles(&graph) {
            found.push(format!("{dir}: {}", circle.join(" <-> ")));
            // How: each use between two files of the circle.
            for file in &circle {
                let targets = &graph[Path::new(file)];
                for (target, named) in targets {
                    if circle.contains(&target.display().to_string()) {
                        found.push(format!("    {file} uses {} ({named})", target.display()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "files that use each other in a circle:\n  {}",
        found.join("\n  ")
    );
}

/// Tarjan's strongly connected components of more than one file.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
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
            for w in self.graph.get(v).into_iter().flat_map(BTreeMap::keys) {
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
    assert_eq!(
        expand_named("a::{b as c, d::{self as e, f}, self}"),
        [
            ("a::b".to_string(), "c".to_string()),
            ("a::d".to_string(), "e".to_string()),
            ("a::d::f".to_string(), "f".to_string()),
            ("a".to_string(), "a".to_string()),
        ]
    );
    let code = code_of(
        "use crate::model::profile::Profile;\nfn f() { crate::run::series::go(); }\n#[cfg(test)]\nmod tests {\n    use crate::cmd::record;\n}\n",
    );
    let named = paths_named(Path::new("analysis/diff.rs"), &code);
    assert!(named.contains(&segments("model::profile::Profile")));
    assert!(named.contains(&segments("run::series::go")));
    assert!(
        !named.iter().any(|p| p[0] == "cmd"),
        "test code is left out: {named:?}"
    );
    let named = paths_named(
        Path::new("a/b/c.rs"),
        "use super::super::x::Y;\nuse self::z::W;\nuse super::V;\n",
    );
    assert_eq!(
        named,
        [
            segments("a::x::Y"),
            segments("a::b::c::z::W"),
            segments("a::b::V")
        ]
    );
    let app = Crate::new(src());
    assert_eq!(
        app.file_of(&segments("model::profile::Profile")),
        Some(Found {
            file: PathBuf::from("model/profile.rs"),
            via: vec![]
        })
    );
}

#[test]
fn the_checker_follows_re_exports_to_the_file_that_defines_the_item() {
    let root = crate_src("workloads/src");
    let code = code_of(
        "mod a;\npub use a::{B, C as D};\npub(crate) use crate::e::F;\npub use super::G;\nuse h::I;\npub use other_crate::J;\npub use k::*;\nmacro_rules! m { () => {} }\npub(crate) use m;\nmod inner {\n    pub use crate::x::Y;\n}\n",
    );
    let reexports = reexports_of(&root, Path::new("kv/mod.rs"), &code);
    let expected: BTreeMap<String, Vec<String>> = [
        ("F", "e::F"),
        ("G", "G"),
        // `kv/a.rs` is no module: the path leaves the crate.
    ]
    .into_iter()
    .map(|(n, p)| (n.to_string(), segments(p)))
    .collect();
    assert_eq!(reexports, expected);
    let reexports = reexports_of(
        &root,
        Path::new("kv/mod.rs"),
        "pub use verdict::{Behind as B};",
    );
    assert_eq!(reexports["B"], segments("kv::verdict::Behind"));

    // Through a folder's mod.rs, and through lib.rs.
    let workloads = Crate::new(root);
    assert_eq!(
        workloads.file_of(&segments("kv::KvOutcome")),
        Some(Found {
            file: PathBuf::from("kv/verdict.rs"),
            via: vec![PathBuf::from("kv/mod.rs")]
        })
    );
    assert_eq!(
        workloads
            .file_of(&segments("RunStats::merge"))
            .map(|f| f.file),
        Some(PathBuf::from("stats.rs"))
    );
    // A name the crate root defines itself (or does not have) leads to no file.
    assert_eq!(workloads.file_of(&segments("nothing_here")), None);
    let probes = Crate::new(crate_src("probes/src"));
    assert_eq!(
        probes.file_of(&segments("KernelHist::from_raw")),
        Some(Found {
            file: PathBuf::from("hist.rs"),
            via: vec![PathBuf::from("lib.rs")]
        })
    );
}
