//! The documentation stays true to the tree and the command line: README.md and every page of
//! docs/ link only to files and headings that exist, every page is linked from the README, the
//! README stays short, and every command a shell block shows (`virtgap …`, `just …`,
//! `./setup.sh …`) names a subcommand, flags and recipes that exist.
//!
//! Commands are checked without running them: each `--flag` (and `-f`) must appear in the
//! `--help` of the subcommand it is given to, and a command that holds no placeholder
//! (`PID`, `FILE`, a `$(…)`) must also parse with the real parser (`Cli::try_parse_from`), so a
//! bad value, a missing argument or two conflicting flags fail here too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;

const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, README first.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no .md page");
    let mut all = vec![root().join("README.md")];
    all.extend(docs);
    all
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// Markdown: fences, headings, links

/// A fenced code block: its info string (`sh`, `console`, …), the 1-based line of its first
/// content line, and its lines.
struct Fence {
    lang: String,
    first_line: usize,
    lines: Vec<String>,
}

/// Splits a page into its prose (fenced blocks blanked, so line numbers hold) and its fences.
fn split_fences(text: &str) -> (String, Vec<Fence>) {
    let mut prose = String::new();
    let mut fences = Vec::new();
    // (fence character, run length, the block so far)
    let mut open: Option<(char, usize, Fence)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let run_of = |c: char| trimmed.chars().take_while(|&x| x == c).count();
        match &mut open {
            Some((c, n, fence)) => {
                let run = run_of(*c);
                if run >= *n && trimmed[run..].trim().is_empty() {
                    let (_, _, fence) = open.take().unwrap();
                    fences.push(fence);
                } else {
                    fence.lines.push(line.to_string());
                }
                prose.push('\n');
            }
            None => {
                let opener = ['`', '~']
                    .into_iter()
                    .map(|c| (c, run_of(c)))
                    .find(|&(_, n)| n >= 3);
                if let Some((c, n)) = opener {
                    let lang = trimmed[n..].split_whitespace().next().unwrap_or("");
                    open = Some((
                        c,
                        n,
                        Fence {
                            lang: lang.to_lowercase(),
                            first_line: i + 2,
                            lines: Vec::new(),
                        },
                    ));
                    prose.push('\n');
                } else {
                    prose.push_str(line);
                    prose.push('\n');
                }
            }
        }
    }
    if let Some((_, _, fence)) = open {
        panic!(
            "a code block opened at line {} is never closed",
            fence.first_line - 1
        );
    }
    (prose, fences)
}

/// Removes inline code spans (which may wrap across lines), keeping newlines so line numbers
/// hold. An unmatched run of backticks stays as text, as Markdown reads it.
fn strip_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: exactly n backticks.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(chars[i..j + n].iter().filter(|&&c| c == '\n'));
                i = j + n;
            }
            None => {
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// GitHub's anchor for a heading: its text as rendered, lower-cased, punctuation dropped
/// (letters, digits, `_`, `-` and spaces kept), spaces turned into hyphens.
fn slug(heading: &str) -> String {
    // Rendered text: a link keeps its text, code and emphasis lose their marks.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        let Some(mid) = rest[start..].find("](") else {
            break;
        };
        let Some(end) = rest[start + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..start]);
        text.push_str(&rest[start + 1..start + mid]);
        rest = &rest[start + mid + end + 1..];
    }
    text.push_str(rest);
    text.chars()
        .filter(|&c| c != '`' && c != '*')
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every heading's anchor in a page (ATX headings outside code blocks), with GitHub's `-1`,
/// `-2` … for repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let (prose, _) = split_fences(text);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in prose.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// A link's target as written, with the line it is on.
struct Link {
    line: usize,
    target: String,
}

/// Every inline link and image target (`[text](target)`, `![alt](target)`) and every link
/// definition (`[label]: target`) outside code.
fn links(text: &str) -> Vec<Link> {
    let (prose, _) = split_fences(text);
    let prose = strip_code_spans(&prose);
    let mut out = Vec::new();
    let line_of = |at: usize| prose[..at].matches('\n').count() + 1;
    let mut from = 0;
    while let Some(found) = prose[from..].find("](") {
        let start = from + found + 2;
        // The target ends at the parenthesis that closes this one (targets may hold pairs).
        let mut depth = 1;
        let mut end = None;
        for (k, c) in prose[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(start + k);
                        break;
                    }
                }
                '\n' => break,
                _ => {}
            }
        }
        let Some(end) = end else {
            panic!(
                "line {}: a link whose target is never closed",
                line_of(start)
            );
        };
        let mut target = prose[start..end].trim();
        // An optional title: [text](target "title").
        if let Some(space) = target.find(char::is_whitespace) {
            target = &target[..space];
        }
        let target = target.trim_start_matches('<').trim_end_matches('>');
        out.push(Link {
            line: line_of(start),
            target: target.to_string(),
        });
        from = end;
    }
    for (i, line) in prose.lines().enumerate() {
        let t = line.trim_start();
        if let (true, Some(close)) = (t.starts_with('['), t.find("]:")) {
            if let Some(target) = t[close + 2..].split_whitespace().next() {
                out.push(Link {
                    line: i + 1,
                    target: target
                        .trim_start_matches('<')
                        .trim_end_matches('>')
                        .to_string(),
                });
            }
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// A relative link's file (None: the page itself) and anchor.
fn resolve(page: &Path, target: &str) -> (Option<PathBuf>, Option<String>) {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a.to_string())),
        None => (target, None),
    };
    let file = (!path.is_empty()).then(|| page.parent().unwrap().join(path));
    (file, anchor)
}

/// `a/b/../c` → `a/c`, without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut anchor_cache: HashMap<PathBuf, BTreeSet<String>> = HashMap::new();
    for page in pages() {
        let text = read(&page);
        for link in links(&text) {
            if is_external(&link.target) {
                continue;
            }
            checked += 1;
            let at = format!("{}:{}: ({})", shown(&page), link.line, link.target);
            let (file, anchor) = resolve(&page, &link.target);
            let file = file.unwrap_or_else(|| page.clone());
            if !file.exists() {
                problems.push(format!("{at}: no such file {}", shown(&normalize(&file))));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|e| e != "md") {
                problems.push(format!("{at}: an anchor into a file that is not Markdown"));
                continue;
            }
            let known = anchor_cache
                .entry(normalize(&file))
                .or_insert_with(|| anchors(&read(&file)));
            if !known.contains(&anchor) {
                problems.push(format!(
                    "{at}: no heading with the anchor #{anchor} in {} (it has: {})",
                    shown(&normalize(&file)),
                    known.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    println!("{checked} relative links checked");
    assert!(
        checked > 0,
        "no relative link found: is the link scanner broken?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn every_docs_page_and_picture_is_linked() {
    let readme = root().join("README.md");
    let linked_from = |page: &Path| -> BTreeSet<PathBuf> {
        links(&read(page))
            .into_iter()
            .filter(|l| !is_external(&l.target))
            .filter_map(|l| resolve(page, &l.target).0)
            .map(|p| normalize(&p))
            .collect()
    };
    let from_readme = linked_from(&readme);
    let mut from_any = from_readme.clone();
    for page in pages() {
        from_any.extend(linked_from(&page));
    }
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = normalize(&entry.unwrap().path());
        if path.extension().is_some_and(|e| e == "md") {
            if !from_readme.contains(&path) {
                missing.push(format!("{} is not linked from README.md", shown(&path)));
            }
        } else if path.is_file() && !from_any.contains(&path) {
            missing.push(format!("{} is linked from no page", shown(&path)));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_readme_is_short() {
    let lines = read(&root().join("README.md")).lines().count();
    println!("README.md: {lines} lines");
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move detail into docs/"
    );
}

/// The layout table of docs/development.md names every source file of the app's layers (each
/// `.rs` directly in `src/`'s directories but `mod.rs`), and every `.rs` file it names exists
/// in its row's directory or below.
#[test]
fn the_layout_table_names_every_source_file_and_only_files_that_exist() {
    let text = read(&root().join("docs/development.md"));
    let section = text
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/development.md has a Layout section");
    let mut problems = Vec::new();
    let mut rows = 0;
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((dir, description)) = rest.split_once("` | ") else {
            continue;
        };
        let path = root().join(dir);
        if !path.is_dir() {
            continue;
        }
        rows += 1;
        let named: BTreeSet<&str> = description.split('`').skip(1).step_by(2).collect();
        for name in named.iter().filter(|n| n.ends_with(".rs")) {
            let found = files_under(&path).iter().any(|p| p.ends_with(name));
            if !found {
                problems.push(format!("{dir}: names {name}, which is not there"));
            }
        }
        if dir.starts_with("src/") && dir != "src/" {
            for entry in std::fs::read_dir(&path).unwrap() {
                let file = entry.unwrap().file_name().to_string_lossy().into_owned();
                if file.ends_with(".rs") && file != "mod.rs" && !named.contains(file.as_str()) {
                    problems.push(format!("{dir}: {file} is not in the table"));
                }
            }
        }
    }
    assert!(rows >= 10, "the layout table has only {rows} rows");
    assert!(
        problems.is_empty(),
        "docs/development.md's layout table:\n  {}",
        problems.join("\n  ")
    );
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn the_scanners_read_markdown_as_github_does() {
    assert_eq!(
        slug("The storage's four figures: iotune"),
        "the-storages-four-figures-iotune"
    );
    assert_eq!(
        slug("The key-value workload (ACT)"),
        "the-key-value-workload-act"
    );
    assert_eq!(
        slug("Fleet mode: Prometheus and `serve`"),
        "fleet-mode-prometheus-and-serve"
    );
    assert_eq!(slug("See [the diff](diff.md) *now*"), "see-the-diff-now");
    let page = "# A\n\n```sh\n# not a heading\n[x](nowhere.md)\n```\n## A\nsee `[y](no.md)` and\n\
                [z](there.md#a-1), ![p](p.png \"title\")\n[d]: def.md\n";
    assert_eq!(anchors(page).into_iter().collect::<Vec<_>>(), ["a", "a-1"]);
    let targets: Vec<String> = links(page).into_iter().map(|l| l.target).collect();
    assert_eq!(targets, ["there.md#a-1", "p.png", "def.md"]);
    assert_eq!(
        commands_in(&[
            "# a comment",
            "virtgap diff a.json \\",
            "  b.json --html r.html  # ok"
        ]),
        [
            (0, "a comment".to_string()),
            (1, "virtgap diff a.json b.json --html r.html".to_string())
        ]
    );
    assert_eq!(
        strip_comment("virtgap record --label 'a # b' # c"),
        "virtgap record --label 'a # b'"
    );
    let cmd = shell_words("virtgap iotune --destroy-data \"$(cat /x)\" -o f.json | tee log > out")
        .unwrap();
    assert_eq!(
        cmd.words,
        [
            "virtgap",
            "iotune",
            "--destroy-data",
            SUBSTITUTED,
            "-o",
            "f.json"
        ]
    );
    assert!(cmd.substituted);
    assert!(shell_words("virtgap record; rm -rf x").is_err());
    assert!(has_flag("  -w, --workload <NAME|FILE>\n", "-w"));
    assert!(has_flag("      --x <N>\n", "--x"));
    assert!(!has_flag("      --xyz <N>\n", "--x"));
    assert!(!has_flag("      --rate-iops <IOPS>\n", "--rate"));
    assert!(!has_flag(
        "      --pid <PID>\n          the run ends at --duration, Ctrl-C\n",
        "--duration"
    ));
    assert!(has_flag("  -q, --quiet  No progress line\n", "--quiet"));
}

// ---------------------------------------------------------------------------------------------
// Commands shown in shell blocks

/// The languages whose blocks hold commands.
const SHELL_BLOCKS: [&str; 5] = ["sh", "bash", "shell", "console", "shell-session"];

/// What a `$(…)` becomes: a value we cannot know, so the command's flags are checked but it is
/// not parsed whole.
const SUBSTITUTED: &str = "SUBSTITUTED";

/// A block's logical lines, each with the index of its first line: continuations (`\` at the
/// end) joined, prompts (`$ `, `# `) and trailing comments dropped.
fn commands_in(lines: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut first = 0;
    for (i, line) in lines.iter().enumerate() {
        if pending.is_empty() {
            first = i;
        }
        let mut line = line.trim().to_string();
        if pending.is_empty() {
            for prompt in ["$ ", "# "] {
                if let Some(rest) = line.strip_prefix(prompt) {
                    line = rest.trim_start().to_string();
                }
            }
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(&line);
        let command = strip_comment(&pending).trim().to_string();
        if !command.is_empty() {
            out.push((first, command));
        }
        pending.clear();
    }
    out
}

/// The line up to an unquoted `#` that starts a word.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if prev.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        prev = c;
    }
    line
}

/// A command's words as the shell would pass them.
#[derive(Debug)]
struct Words {
    words: Vec<String>,
    /// A `$(…)` stood for a value.
    substituted: bool,
}

/// Splits a command the simple way: each `$(…)` becomes one placeholder value, the command ends
/// at an unquoted `|` (what is piped into is another command), and redirections are dropped.
/// What this cannot follow is an error, and the caller skips the line saying so: backticks,
/// `;`, `&&`, `||`, `&` (several commands on one line), and quotes that do not close.
fn shell_words(command: &str) -> Result<Words, String> {
    let mut text = String::new();
    let mut substituted = false;
    let mut quote = None;
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '`') => return Err("a backtick substitution".into()),
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            (Some('"'), '"') => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (_, '$') if chars.peek() == Some(&'(') => {
                chars.next();
                let mut depth = 1;
                for c in chars.by_ref() {
                    depth += i32::from(c == '(') - i32::from(c == ')');
                    if depth == 0 {
                        break;
                    }
                }
                if depth != 0 {
                    return Err("a $( that does not close".into());
                }
                substituted = true;
                text.push_str(SUBSTITUTED);
                continue;
            }
            (None, ';') => return Err("several commands (;)".into()),
            (None, '&') if chars.peek() == Some(&'&') => return Err("several commands (&&)".into()),
            // `2>&1` and `&>` are redirections; any other `&` sends a job to the background.
            (None, '&') if !text.ends_with('>') && chars.peek() != Some(&'>') => {
                return Err("a background job (&)".into())
            }
            (None, '|') if chars.peek() == Some(&'|') => return Err("several commands (||)".into()),
            (None, '|') => break,
            _ => {}
        }
        text.push(c);
    }
    let words = shlex::split(&text).ok_or_else(|| format!("quotes that do not close: {text}"))?;
    let mut kept = Vec::new();
    let mut iter = words.into_iter();
    while let Some(word) = iter.next() {
        let bare = word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '&');
        if bare.starts_with('>') || bare.starts_with('<') {
            if bare.trim_start_matches(['>', '<', '&']).is_empty() && !bare.ends_with('&') {
                iter.next(); // the redirection's file
            }
            continue;
        }
        kept.push(word);
    }
    Ok(Words {
        words: kept,
        substituted,
    })
}

/// A metavariable standing for a value (`PID`, `PID[,PID…]`, `FILE`, `DIR|FILE|DEVICE`):
/// upper-case letters and punctuation, no lower-case letter.
fn is_placeholder(word: &str) -> bool {
    let value = word.split_once('=').map_or(word, |(_, v)| v);
    value == SUBSTITUTED
        || value.contains('$')
        || (value.chars().any(|c| c.is_ascii_uppercase()) && !value.chars().any(char::is_lowercase))
}

/// Whether `flag` (`--name` or `-n`) is one of the options a help text lists: on a line that
/// starts with an option (`  -w, --workload <NAME|FILE>`), before its description, never a
/// mention of it in another option's description.
fn has_flag(help: &str, flag: &str) -> bool {
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .map(|line| line.split("  ").next().unwrap_or(line))
        .any(|spec| {
            spec.match_indices(flag).any(|(at, _)| {
                let before = spec[..at].chars().next_back();
                let after = spec[at + flag.len()..].chars().next();
                before.is_none_or(|c| c.is_whitespace() || c == ',' || c == '[')
                    && after.is_none_or(|c| c.is_whitespace() || matches!(c, ',' | '=' | '<' | ']'))
            })
        })
}

/// What one `virtgap` command's checks found wrong.
fn check_virtgap(words: &[String], helps: &mut Helps) -> Vec<String> {
    let mut problems = Vec::new();
    let subcommands = helps.subcommands();
    let (sub, args) = match words.get(1) {
        Some(first) if !first.starts_with('-') => {
            if !subcommands.contains(first) {
                return vec![format!(
                    "`{first}` is no subcommand (there are: {})",
                    subcommands.iter().cloned().collect::<Vec<_>>().join(", ")
                )];
            }
            (Some(first.as_str()), &words[2..])
        }
        _ => (None, &words[1..]),
    };
    let help = helps.of(sub);
    for arg in args {
        if arg == "--" {
            break;
        }
        let flags: Vec<String> = if let Some(long) = arg.strip_prefix("--") {
            vec![format!("--{}", long.split('=').next().unwrap())]
        } else if let Some(short) = arg.strip_prefix('-') {
            if short
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic())
            {
                // A cluster of short flags (-qv), or one with its value attached (-wseq1m): the
                // first letter is a flag either way.
                vec![format!("-{}", short.chars().next().unwrap())]
            } else {
                Vec::new() // a negative number, a value
            }
        } else {
            Vec::new()
        };
        for flag in flags {
            if !has_flag(&help, &flag) {
                problems.push(format!(
                    "`{flag}` is not an option of `virtgap{}`",
                    sub.map(|s| format!(" {s}")).unwrap_or_default()
                ));
            }
        }
    }
    problems
}

/// `virtgap [SUBCOMMAND] --help`, each run once.
struct Helps {
    cache: HashMap<Option<String>, String>,
}

impl Helps {
    fn of(&mut self, sub: Option<&str>) -> String {
        self.cache
            .entry(sub.map(str::to_string))
            .or_insert_with(|| {
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_virtgap"));
                cmd.args(sub).arg("--help");
                let out = cmd.output().expect("run virtgap --help");
                assert!(
                    out.status.success(),
                    "virtgap {} --help failed: {}",
                    sub.unwrap_or(""),
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8(out.stdout).expect("help is UTF-8")
            })
            .clone()
    }

    /// The subcommands `virtgap --help` lists.
    fn subcommands(&mut self) -> BTreeSet<String> {
        let help = self.of(None);
        let names: BTreeSet<String> = help
            .lines()
            .skip_while(|l| l.trim() != "Commands:")
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect();
        assert!(
            names.contains("record") && names.contains("diff"),
            "no Commands: in\n{help}"
        );
        names
    }
}

/// The recipes `just --summary` lists, or why they cannot be had.
fn just_recipes() -> Result<BTreeSet<String>, String> {
    let out = Command::new("just")
        .arg("--summary")
        .current_dir(root())
        .output()
        .map_err(|e| format!("`just` is not on PATH ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "just --summary failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// The first argument `./setup.sh` accepts: it installs packages, then `exec just "$@"`, so any
/// recipe of the justfile (and none at all).
fn setup_arguments(recipes: &BTreeSet<String>) -> BTreeSet<String> {
    let setup = read(&root().join("setup.sh"));
    assert!(
        setup.lines().any(|l| l.trim() == "exec just \"$@\""),
        "setup.sh no longer ends in `exec just \"$@\"`: teach tests/docs.rs what it accepts"
    );
    recipes.clone()
}

/// Where a command was shown.
struct Shown {
    at: String,
    command: String,
}

fn shown_commands() -> Vec<Shown> {
    let mut out = Vec::new();
    for page in pages() {
        let (_, fences) = split_fences(&read(&page));
        for fence in fences {
            if !SHELL_BLOCKS.contains(&fence.lang.as_str()) {
                continue;
            }
            let lines: Vec<&str> = fence.lines.iter().map(String::as_str).collect();
            for (index, command) in commands_in(&lines) {
                let line = fence.first_line + index;
                out.push(Shown {
                    at: format!("{}:{line}", shown(&page)),
                    command,
                });
            }
        }
    }
    out
}

#[test]
fn every_command_shown_exists() {
    let mut helps = Helps {
        cache: HashMap::new(),
    };
    let recipes = just_recipes();
    let mut problems = Vec::new();
    // What was checked, by program: (flags checked, also parsed whole).
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut skipped = Vec::new();
    let mut flags_only = Vec::new();
    for Shown { at, command } in shown_commands() {
        let first = command.split_whitespace().next().unwrap_or("");
        let program = match first {
            "virtgap" => "virtgap",
            "just" => "just",
            "./setup.sh" => "./setup.sh",
            _ => continue, // cargo, scp, …: not ours to check
        };
        let words = match shell_words(&command) {
            Ok(w) => w,
            // Lines the simple splitter does not follow (several commands on a line, backticks)
            // are skipped, each said below; none is shown today. A `$(…)` is followed: it
            // becomes a placeholder value (`--pid $(pgrep -o -x fio)` in docs/attach.md,
            // `--destroy-data "$(cat /sys/block/md0/md/uuid)"` in docs/workloads.md), so such a
            // line's flags are checked but it is not parsed whole; so is a pipe: what is piped
            // into is another program's command.
            Err(why) => {
                skipped.push(format!("{at}: `{command}`: skipped, {why}"));
                continue;
            }
        };
        let words = words.words;
        let entry = counts.entry(program).or_default();
        match program {
            "virtgap" => {
                entry.0 += 1;
                let found = check_virtgap(&words, &mut helps);
                if words.iter().any(|w| is_placeholder(w)) {
                    flags_only.push(format!("{at}: `{command}`"));
                } else if found.is_empty() {
                    entry.1 += 1;
                    if let Err(e) = virtgap::cli::Cli::try_parse_from(&words) {
                        problems.push(format!("{at}: `{command}`: the parser refuses it:\n{e}"));
                    }
                }
                problems.extend(found.into_iter().map(|p| format!("{at}: `{command}`: {p}")));
            }
            "just" | "./setup.sh" => match &recipes {
                Err(why) => skipped.push(format!("{at}: `{command}`: skipped, {why}")),
                Ok(recipes) => {
                    entry.0 += 1;
                    let (accepted, what) = if program == "just" {
                        (recipes.clone(), "a recipe of `just --summary`")
                    } else {
                        (
                            setup_arguments(recipes),
                            "an argument setup.sh takes (a just recipe)",
                        )
                    };
                    // just's own flags (--list) come before the recipe; setup.sh has none.
                    let arg = words[1..]
                        .iter()
                        .find(|w| program != "just" || !w.starts_with('-'));
                    if let Some(arg) = arg {
                        if !accepted.contains(arg) {
                            problems.push(format!("{at}: `{command}`: `{arg}` is not {what}"));
                        }
                    }
                }
            },
            _ => unreachable!(),
        }
    }
    for (program, (checked, parsed)) in &counts {
        match *program {
            "virtgap" => println!(
                "virtgap: {checked} commands' flags checked against `--help`, {parsed} of them \
                 also parsed whole"
            ),
            _ => println!("{program}: {checked} commands checked against `just --summary`"),
        }
    }
    println!("flags checked but not parsed whole, for a placeholder value:");
    for line in &flags_only {
        println!("  {line}");
    }
    println!("skipped: {}", if skipped.is_empty() { "none" } else { "" });
    for line in &skipped {
        println!("  {line}");
    }
    if let Err(why) = &recipes {
        // Under CI `just` is there (setup.sh installs it): its absence fails there.
        virtgap_testkit::require(
            "checking the just and setup.sh commands the docs show",
            Err(why),
        );
    }
    let virtgap_checked = counts.get("virtgap").map_or(0, |c| c.0);
    assert!(
        virtgap_checked >= 10,
        "only {virtgap_checked} virtgap commands found in shell blocks"
    );
    assert!(
        problems.is_empty(),
        "commands the docs show that do not exist:\n{}",
        problems.join("\n")
    );
}
