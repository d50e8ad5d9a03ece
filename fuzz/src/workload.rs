//! Workload files: mutations of the presets' TOML (typed values for each key, wrong types,
//! tables moved, raw lines), and the spec target that feeds them to the reader and its users.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::sample::{select, Index};
use toml::Value as T;
use virtgap_workloads::spec;

use crate::{bytes, consumers, json, one_line, Outcome, Target};

/// Which dictionary a key's values come from.
#[derive(Clone, Copy, PartialEq)]
enum KeyKind {
    Size,
    Duration,
    Count,
    Percent,
    Rate,
    Choice(&'static [&'static str]),
    Text,
    Flag,
}

const TOP_KEYS: &[(&str, KeyKind)] = &[
    ("name", KeyKind::Text),
    ("description", KeyKind::Text),
    (
        "pattern",
        KeyKind::Choice(&["random", "sequential", "kv", "Random", "seq", ""]),
    ),
    (
        "rw",
        KeyKind::Choice(&["read", "write", "mix", "rw", "randrw", "Read", ""]),
    ),
    ("rwmix_read", KeyKind::Percent),
    ("bs", KeyKind::Size),
    ("qd", KeyKind::Count),
    ("workers", KeyKind::Count),
    (
        "engine",
        KeyKind::Choice(&["io_uring", "uring", "psync", "null", "libaio", ""]),
    ),
    (
        "distribution",
        KeyKind::Choice(&[
            "uniform",
            "zipf:0.99",
            "zipf:0",
            "zipf:-1",
            "zipf:10",
            "zipf:10.000001",
            "zipf:1e-300",
            "zipf:5e-324",
            "zipf:NaN",
            "zipf:inf",
            "zipf:",
            "zipf:1e309",
            "zipf:1",
            "zipf:1.0000000000000002",
            "Zipf:1",
            "uniform ",
        ]),
    ),
    ("rate_iops", KeyKind::Rate),
    ("size", KeyKind::Size),
    ("duration", KeyKind::Duration),
    ("ramp", KeyKind::Duration),
    ("direct", KeyKind::Flag),
    ("submit_batch", KeyKind::Count),
];

const KV_KEYS: &[(&str, KeyKind)] = &[
    ("x", KeyKind::Rate),
    ("read_rps", KeyKind::Rate),
    ("write_rps", KeyKind::Rate),
    (
        "ratio",
        KeyKind::Choice(&[
            "2:1",
            "1:0",
            "0:1",
            "0:0",
            "1:",
            "::",
            "4294967295:1",
            "4294967296:1",
            "1:4294967295",
            "4294967295:4294967295",
            "-1:1",
            " 2 : 1 ",
            "2:1:1",
        ]),
    ),
    ("record_bytes", KeyKind::Size),
    ("record_bytes_max", KeyKind::Size),
    ("defrag_lwm_pct", KeyKind::Percent),
    ("fill_pct", KeyKind::Percent),
    ("slice", KeyKind::Duration),
    ("max_lag", KeyKind::Duration),
    ("dsync", KeyKind::Flag),
];

const SIZE_NUMBERS: &[i64] = &[
    0,
    1,
    -1,
    511,
    512,
    513,
    4096,
    i64::MAX,
    i64::MIN,
    1 << 50,
    (1 << 50) + 1,
    64 << 20,
    (64 << 20) + 512,
];

const SIZE_TEXTS: &[&str] = &[
    "0",
    "1",
    "511",
    "512",
    "513",
    "4KiB",
    "4 KiB",
    "4kib",
    "4k",
    "4K",
    "4KB",
    "1.5KiB",
    "0.5KiB",
    "64MiB",
    "65MiB",
    "1GiB",
    "1PiB",
    "1025TiB",
    "99999999TiB",
    "16EiB",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "-0",
    "",
    "  ",
    "KiB",
    "4 KiB KiB",
    "1e3",
    "0x1000",
    "4\u{0}KiB",
    "٤KiB",
    "4KiB\n",
    "+4KiB",
    "4.KiB",
    "8MiB",
    "8MiB1",
    "4MiB",
    "1536",
    "1KiB-2KiB",
];

const DURATION_NUMBERS: &[i64] = &[0, 10, -1, i64::MAX];

const DURATION_TEXTS: &[&str] = &[
    "0s",
    "0",
    "1ns",
    "999ms",
    "1s",
    "1s 1ns",
    "10",
    "10 s",
    "1m 30s",
    "366d",
    "366days",
    "367d",
    "1y",
    "1year",
    "584942417355y",
    "584y",
    "18446744073709551615s",
    "18446744073709551615ns",
    "18446744073709551616s",
    "99999999999999999999d",
    "-1s",
    "",
    "1e3s",
    "1.5s",
    "0.5s",
    "1h",
    "P1D",
    "\u{202e}10s",
    "10s\u{0}",
    "500ms",
    "200y",
    "100000000h",
];

const COUNTS: &[i64] = &[
    0,
    1,
    2,
    31,
    32,
    33,
    1024,
    1025,
    4096,
    4097,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
    -1,
    i64::MAX,
];

const PERCENTS: &[i64] = &[0, 1, 50, 89, 90, 91, 99, 100, 101, 255, 256, -1, i64::MAX];

const RATES: &[i64] = &[
    0,
    1,
    2,
    1000,
    1_000_000,
    i64::MAX,
    i64::MAX / 2000,
    i64::MAX / 2000 + 1,
    i64::MAX / 1000,
    i64::MAX / 100,
    i64::MAX / 100 + 1,
    1 << 62,
    -1,
];

const TOKENS: &[&[u8]] = &[
    b"inf",
    b"nan",
    b"-inf",
    b"0x10",
    b"0o17",
    b"0b101",
    b"1_000",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"1e400",
    b"\"\"\"a\nb\"\"\"",
    b"'''x'''",
    b"1979-05-27T07:32:00Z",
    b"07:32:00",
    b"[1, 2]",
    b"{ a = 1 }",
    b"\"\\u0000\"",
    b"\"\\U0010FFFF\"",
    b"\"\\ud800\"",
    b"\n[kv]\n",
    b"\n[[kv]]\n",
    b"\nkv = { x = 1 }\n",
    b"\nrate_iops = 1\n",
    b"\nramp = \"584942417355y\"\n",
    b"\nslice = \"1y\"\n",
    b"=",
    b"#",
    b"\"",
];

/// A value from the key's own dictionary: `number` picks a size's or a duration's number form.
#[derive(Clone, Debug)]
pub struct Typed {
    number: bool,
    pick: Index,
}

#[derive(Clone, Debug)]
pub enum TableEdit {
    Typed(Typed),
    /// Any value, whatever the key: wrong types, floats that are not finite, dates, tables.
    Any(T),
    Remove,
    /// The same key's value in another preset.
    FromPreset(Index),
    Unknown(T),
    /// A [kv] table moved in from a kv preset, or taken away.
    MoveKv(Index),
}

/// One edit of a key, at the top or in [kv].
#[derive(Clone, Debug)]
pub struct TableOp {
    kv: bool,
    key: Index,
    edit: TableEdit,
}

/// One `key = value` line's value replaced by a raw TOML token; the line then kept, set twice,
/// or moved.
#[derive(Clone, Debug)]
pub struct LineOp {
    line: Index,
    token: Index,
    then: LineThen,
}

#[derive(Clone, Debug)]
pub enum LineThen {
    Keep,
    Twice,
    Swap(Index),
}

#[derive(Clone, Debug)]
pub enum SpecEdit {
    Structure(Vec<TableOp>),
    Text(Vec<LineOp>),
    /// The preset's own text, for byte edits only.
    Raw,
}

/// One case: a preset, edits of its table or its lines, then byte edits of the text.
#[derive(Clone, Debug)]
pub struct SpecCase {
    pub preset: Index,
    pub edit: SpecEdit,
    pub bytes: Vec<bytes::ByteOp>,
}

fn any_value() -> BoxedStrategy<T> {
    let floats = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        1e308,
        1.5,
        4096.0,
    ];
    let date = "1979-05-27T07:32:00Z"
        .parse::<toml::value::Datetime>()
        .map_or(T::Integer(0), T::Datetime);
    prop_oneof![
        1 => select(floats).prop_map(T::Float),
        1 => select(vec![0, -1, i64::MAX, i64::MIN]).prop_map(T::Integer),
        1 => any::<bool>().prop_map(T::Boolean),
        1 => Just(T::Array(vec![T::Integer(1), T::String("a".into())])),
        1 => Just(T::Table(toml::Table::new())),
        1 => Just(date),
        2 => json::string().prop_map(T::String),
    ]
    .boxed()
}

fn table_op() -> BoxedStrategy<TableOp> {
    let i = any::<Index>;
    let typed =
        (proptest::bool::weighted(0.25), i()).prop_map(|(number, pick)| Typed { number, pick });
    let edit = prop_oneof![
        5 => typed.prop_map(TableEdit::Typed),
        1 => any_value().prop_map(TableEdit::Any),
        1 => Just(TableEdit::Remove),
        1 => i().prop_map(TableEdit::FromPreset),
        1 => any_value().prop_map(TableEdit::Unknown),
        1 => i().prop_map(TableEdit::MoveKv),
    ];
    (proptest::bool::weighted(1.0 / 3.0), i(), edit)
        .prop_map(|(kv, key, edit)| TableOp { kv, key, edit })
        .boxed()
}

fn line_op() -> BoxedStrategy<LineOp> {
    let then = prop_oneof![
        2 => Just(LineThen::Keep),
        1 => Just(LineThen::Twice),
        1 => any::<Index>().prop_map(LineThen::Swap),
    ];
    (any::<Index>(), any::<Index>(), then)
        .prop_map(|(line, token, then)| LineOp { line, token, then })
        .boxed()
}

pub fn cases() -> BoxedStrategy<SpecCase> {
    let structure = || proptest::collection::vec(table_op(), 1..=3).prop_map(SpecEdit::Structure);
    let text = proptest::collection::vec(line_op(), 1..=2).prop_map(SpecEdit::Text);
    let edits = prop_oneof![
        6 => (structure(), Just(vec![])),
        2 => (text, Just(vec![])),
        1 => (structure(), bytes::ops()),
        1 => (Just(SpecEdit::Raw), bytes::ops()),
    ];
    (any::<Index>(), edits)
        .prop_map(|(preset, (edit, bytes))| SpecCase {
            preset,
            edit,
            bytes,
        })
        .boxed()
}

/// Workload files, and what reads a spec.
#[derive(Debug)]
pub struct Specs {
    presets: Vec<(&'static str, &'static str, toml::Table)>,
    strings: Vec<String>,
}

impl Specs {
    /// The presets, each checked to come out clean.
    pub fn load() -> Self {
        let presets = spec::PRESETS
            .iter()
            .map(|(name, text)| {
                let table: toml::Table = text
                    .parse()
                    .unwrap_or_else(|e| panic!("preset {name} is TOML: {e}"));
                (*name, *text, table)
            })
            .collect();
        let target = Self {
            presets,
            strings: json::interesting_strings(),
        };
        for (name, text, _) in &target.presets {
            let outcome = target.check(text.as_bytes());
            assert!(outcome.accepted, "preset {name} is accepted");
            for o in outcome.oddities {
                println!(
                    "fuzz spec: note: preset {name} already shows: {}: {}",
                    o.key, o.detail
                );
            }
        }
        target
    }

    fn value(&self, kind: KeyKind, typed: &Typed) -> T {
        let int = |xs: &[i64]| T::Integer(xs[typed.pick.index(xs.len())]);
        let text = |xs: &[&str]| T::String(xs[typed.pick.index(xs.len())].to_string());
        match kind {
            KeyKind::Size if typed.number => int(SIZE_NUMBERS),
            KeyKind::Size => text(SIZE_TEXTS),
            KeyKind::Duration if typed.number => int(DURATION_NUMBERS),
            KeyKind::Duration => text(DURATION_TEXTS),
            KeyKind::Count => int(COUNTS),
            KeyKind::Percent => int(PERCENTS),
            KeyKind::Rate => int(RATES),
            KeyKind::Choice(choices) => text(choices),
            KeyKind::Text => T::String(self.strings[typed.pick.index(self.strings.len())].clone()),
            KeyKind::Flag => [
                T::Boolean(true),
                T::Boolean(false),
                T::String("true".into()),
            ][typed.pick.index(3)]
            .clone(),
        }
    }

    fn apply(&self, t: &mut toml::Table, op: &TableOp) {
        if let TableEdit::MoveKv(i) = &op.edit {
            if t.remove("kv").is_none() {
                let kv: Vec<&T> = self.presets.iter().filter_map(|p| p.2.get("kv")).collect();
                t.insert("kv".into(), kv[i.index(kv.len())].clone());
            }
            return;
        }
        let keys = if op.kv { KV_KEYS } else { TOP_KEYS };
        let (key, kind) = keys[op.key.index(keys.len())];
        let table = if op.kv {
            match t
                .entry("kv")
                .or_insert_with(|| T::Table(toml::Table::new()))
            {
                T::Table(kv) => kv,
                _ => return,
            }
        } else {
            t
        };
        match &op.edit {
            TableEdit::Typed(typed) => {
                table.insert(key.into(), self.value(kind, typed));
            }
            TableEdit::Any(v) => {
                table.insert(key.into(), v.clone());
            }
            TableEdit::Remove => {
                table.remove(key);
            }
            TableEdit::FromPreset(i) => {
                let other = &self.presets[i.index(self.presets.len())].2;
                let from = if op.kv {
                    other.get("kv").and_then(|kv| kv.get(key))
                } else {
                    other.get(key)
                };
                if let Some(v) = from {
                    table.insert(key.into(), v.clone());
                }
            }
            TableEdit::Unknown(v) => {
                table.insert("fuzz_unknown".into(), v.clone());
            }
            TableEdit::MoveKv(_) => {}
        }
    }
}

/// Replaces the value on one `key = value` line with a raw TOML token.
fn replace_line(text: &str, op: &LineOp) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let assignments: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains('='))
        .collect();
    if assignments.is_empty() {
        return text.to_string();
    }
    let i = assignments[op.line.index(assignments.len())];
    let key = lines[i]
        .split('=')
        .next()
        .unwrap_or("")
        .trim_end()
        .to_string();
    let token = String::from_utf8_lossy(TOKENS[op.token.index(TOKENS.len())]);
    lines[i] = format!("{key} = {token}");
    match &op.then {
        LineThen::Keep => {}
        LineThen::Twice => lines.insert(i, lines[i].clone()),
        LineThen::Swap(j) => {
            let j = j.index(lines.len());
            lines.swap(i, j);
        }
    }
    lines.join("\n") + "\n"
}

impl Target for Specs {
    type Case = SpecCase;

    fn name(&self) -> &'static str {
        "spec"
    }

    fn ext(&self) -> &'static str {
        "toml"
    }

    fn cases(&self) -> BoxedStrategy<SpecCase> {
        cases()
    }

    fn input(&self, case: &SpecCase) -> (Vec<u8>, &'static str) {
        let (_, text, table) = &self.presets[case.preset.index(self.presets.len())];
        let mut input = match &case.edit {
            SpecEdit::Structure(ops) => {
                let mut t = table.clone();
                for op in ops {
                    self.apply(&mut t, op);
                }
                toml::to_string(&t)
                    .unwrap_or_else(|_| text.to_string())
                    .into_bytes()
            }
            SpecEdit::Text(ops) => ops
                .iter()
                .fold(text.to_string(), |s, op| replace_line(&s, op))
                .into_bytes(),
            SpecEdit::Raw => text.as_bytes().to_vec(),
        };
        let donors: Vec<&[u8]> = self.presets.iter().map(|p| p.1.as_bytes()).collect();
        for op in &case.bytes {
            bytes::apply(op, &mut input, &donors, TOKENS);
        }
        let how = match (&case.edit, case.bytes.is_empty()) {
            (SpecEdit::Structure(_), true) => "structure",
            (SpecEdit::Structure(_), false) => "structure+bytes",
            (SpecEdit::Text(_), _) => "text",
            (SpecEdit::Raw, _) => "bytes",
        };
        (input, how)
    }

    fn check(&self, input: &[u8]) -> Outcome {
        consumers::spec(input)
    }

    fn explain(&self, case: &SpecCase, input: &[u8]) -> String {
        let (name, preset, table) = &self.presets[case.preset.index(self.presets.len())];
        let text = String::from_utf8_lossy(input);
        let mine: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        // The preset as written and as re-serialized, so that formatting is no difference.
        let normalized = toml::to_string(table).unwrap_or_default();
        let theirs: BTreeSet<&str> = preset
            .lines()
            .chain(normalized.lines())
            .map(str::trim)
            .collect();
        let mut s = format!("preset {name}, lines not in it:");
        for l in mine.iter().filter(|l| !theirs.contains(*l)).take(12) {
            s.push_str(&format!("\n  {}", one_line(l, 160)));
        }
        s.push_str(&format!("\ninput ({} lines):", mine.len()));
        for l in mine.iter().take(30) {
            s.push_str(&format!("\n  | {}", one_line(l, 160)));
        }
        s
    }
}
