//! Profiles: structure-aware mutations of JSON seeds (values, keys, shapes, histogram surgery),
//! and the profile target that feeds them to the reader and its consumers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use proptest::prelude::*;
use proptest::sample::{select, Index};
use serde_json::{json, Map, Value};
use virtgap::model::file;
use virtgap::model::profile::Profile;

use crate::{bytes, consumers, one_line, workspace, Outcome, Target};

// ---------------------------------------------------------------------------------------------
// Paths in a document

#[derive(Clone, Debug, PartialEq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

fn show_path(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if s.is_empty() => s.push_str(k),
            Seg::Key(k) => s.push_str(&format!(".{k}")),
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    if s.is_empty() {
        "(document)".into()
    } else {
        s
    }
}

fn node<'a>(mut v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    for seg in path {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get(k)?,
            (Seg::Index(i), Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

fn node_mut<'a>(mut v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    for seg in path {
        v = match (seg, v) {
            (Seg::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (Seg::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

/// The child `pick` chooses, if `v` has any.
fn child<'a>(v: &'a Value, pick: &Index) -> Option<(Seg, &'a Value)> {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let (k, c) = m.iter().nth(pick.index(m.len()))?;
            Some((Seg::Key(k.clone()), c))
        }
        Value::Array(a) if !a.is_empty() => {
            let i = pick.index(a.len());
            Some((Seg::Index(i), &a[i]))
        }
        _ => None,
    }
}

/// Every node's path, the document's own (empty) path first.
fn all_paths(v: &Value) -> Vec<Vec<Seg>> {
    let mut out = Vec::new();
    let mut stack = vec![(Vec::new(), v)];
    while let Some((path, v)) = stack.pop() {
        let kids: Vec<(Seg, &Value)> = match v {
            Value::Object(m) => m.iter().map(|(k, c)| (Seg::Key(k.clone()), c)).collect(),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, c)| (Seg::Index(i), c))
                .collect(),
            _ => Vec::new(),
        };
        for (seg, c) in kids {
            let mut p = path.clone();
            p.push(seg);
            stack.push((p, c));
        }
        out.push(path);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Values that break readers

fn interesting_numbers() -> Vec<Value> {
    vec![
        json!(0),
        json!(1),
        json!(-1),
        json!(2),
        json!(255),
        json!(256),
        json!(65535),
        json!(65536),
        json!(u32::MAX),
        json!(u64::from(u32::MAX) + 1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(u64::MAX - 1),
        json!(u64::MAX / 2),
        json!(u64::MAX / 2 + 1),
        json!((1u64 << 53) + 1),
        json!(1.5),
        json!(0.5),
        json!(-0.5),
        json!(-0.0),
        json!(1e-300),
        json!(5e-324),
        json!(1e308),
        json!(-1e308),
        json!(f64::MAX),
        json!(f64::EPSILON),
        json!(1e19),
        json!(1.8446744073709552e19),
        json!(1e9),
        json!(1e12),
    ]
}

pub fn number() -> impl Strategy<Value = Value> {
    select(interesting_numbers())
}

/// Strings that break parsers, terminals, SVG, CSV and format strings.
pub fn interesting_strings() -> Vec<String> {
    [
        "",
        " ",
        "0",
        "-1",
        &"A".repeat(10_000),
        "é漢字🙂\u{10FFFF}",
        "\u{0}\u{1b}[2J\u{1b}]0;title\u{7}\u{9b}",
        "\u{202e}evil\u{200b}",
        "a\"b<c>&d'e</text><script>",
        "\n\r\t\\",
        "%s%n{}{{}}",
        &"🙂".repeat(2_000),
        "0x6e0",
    ]
    .map(String::from)
    .to_vec()
}

/// An interesting string, or now and then a workload file: profiles hold one as their
/// effective spec, which consumers parse as TOML.
pub fn string() -> impl Strategy<Value = String> {
    let presets: Vec<String> = virtgap_workloads::spec::PRESETS
        .iter()
        .map(|(_, text)| text.to_string())
        .collect();
    prop_oneof![13 => select(interesting_strings()), 1 => select(presets)]
}

pub fn value() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => number(),
        2 => string().prop_map(Value::String),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
        1 => prop_oneof![Just(json!([])), Just(json!({}))],
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Recipes

/// A number near the old one: for integers, off by one, doubled, a million times, halved,
/// negated, plus a half; for floats, scaled far up or down, negated, cut, plus a half.
#[derive(Clone, Copy, Debug)]
pub enum Near {
    Up,
    Down,
    Double,
    Mega,
    Half,
    Negate,
    PlusHalf,
}

/// A string near the old one.
#[derive(Clone, Debug)]
pub enum NearString {
    Cut(Index),
    Twice,
    Insert(Index, char),
    Upper,
}

/// A new value for a node, mostly of its own JSON type so the reader gets past type checks.
#[derive(Clone, Debug)]
pub enum Tweak {
    /// Near the old number or string; a bool flipped; anything else replaced by `Fresh`'s.
    Near(Near, NearString, Value),
    /// An interesting number for a number, string for a string, value for anything else.
    Fresh(Value, String, Value),
}

fn tweak() -> BoxedStrategy<Tweak> {
    let near = select(vec![
        Near::Up,
        Near::Down,
        Near::Double,
        Near::Mega,
        Near::Half,
        Near::Negate,
        Near::PlusHalf,
    ]);
    let near_string = prop_oneof![
        any::<Index>().prop_map(NearString::Cut),
        Just(NearString::Twice),
        (
            any::<Index>(),
            select(vec!['\u{0}', '"', '<', '&', 'é', '\u{1b}', '\n', '%', ';'])
        )
            .prop_map(|(i, c)| NearString::Insert(i, c)),
        Just(NearString::Upper),
    ];
    prop_oneof![
        (near, near_string, value()).prop_map(|(n, s, v)| Tweak::Near(n, s, v)),
        (number(), string(), value()).prop_map(|(n, s, v)| Tweak::Fresh(n, s, v)),
    ]
    .boxed()
}

/// Where a mutation lands.
#[derive(Clone, Debug)]
pub enum Place {
    /// Down from the top, one child per step, until the steps or the tree run out: favours the
    /// document's structure over its thousands of histogram buckets.
    Descend(Vec<Index>),
    /// Any node of the seed, by its path there.
    Any(Index),
}

/// A node from a seed: at the same path, or anywhere.
#[derive(Clone, Debug)]
pub struct Graft {
    donor: Index,
    from: Option<Index>,
}

#[derive(Clone, Debug)]
pub enum ArrayEdit {
    Remove(Index),
    Dup(Index, Index),
    Double,
    TimesTen,
    Reverse,
    Truncate(Index),
    Swap(Index, Index),
    Clear,
}

#[derive(Clone, Debug)]
pub enum ObjectEdit {
    Remove(Index),
    Unknown(Value),
    /// A key renamed (`key_`): the reader sees it missing, and an unknown key.
    Rename(Index),
    /// Another key's value under this key: a map of counts where a number was, etc.
    Copy(Index, Index),
    Clear,
}

#[derive(Clone, Debug)]
pub enum Edit {
    Tweak(Tweak),
    Replace(Value),
    Graft(Graft),
    /// The container's shape changed; a leaf is tweaked instead.
    Shape(ArrayEdit, ObjectEdit, Tweak),
    Null,
    /// Nested `depth` deep, in arrays or objects by `objects`' bits: serde_json stops at 128.
    Nest {
        depth: usize,
        objects: u64,
    },
    Empty {
        object: bool,
    },
    /// A list where one value was, or one more element.
    Append(Graft),
    Remove,
}

/// Breaks a histogram in the ways a reader's arithmetic is most likely to trip on.
#[derive(Clone, Debug)]
pub enum Surgery {
    /// One bucket's high below its low.
    Inverted(Index, u64),
    /// Counts that overflow when added.
    Saturated,
    TopBucket,
    ZeroBucket,
    /// One bucket emptied.
    ZeroCount(Index),
    Reverse,
    Count(u64),
    Sum(Value),
    Extremes(u64, u64),
    Clear,
}

#[derive(Clone, Debug)]
pub enum JsonOp {
    Histogram(Index, Surgery),
    /// One key set in every row of a table: all intervals zero-length, every CPU the same.
    Broadcast {
        table: Index,
        key: Index,
        from_key: Option<Index>,
        tweak: Tweak,
    },
    /// The calibrated exit cost the diff multiplies by.
    Calibration(Value),
    Node(Place, Edit),
}

fn graft() -> BoxedStrategy<Graft> {
    (
        any::<Index>(),
        prop::option::weighted(2.0 / 3.0, any::<Index>()),
    )
        .prop_map(|(donor, from)| Graft { donor, from })
        .boxed()
}

fn array_edit() -> BoxedStrategy<ArrayEdit> {
    let i = any::<Index>;
    prop_oneof![
        i().prop_map(ArrayEdit::Remove),
        (i(), i()).prop_map(|(a, b)| ArrayEdit::Dup(a, b)),
        Just(ArrayEdit::Double),
        Just(ArrayEdit::TimesTen),
        Just(ArrayEdit::Reverse),
        i().prop_map(ArrayEdit::Truncate),
        (i(), i()).prop_map(|(a, b)| ArrayEdit::Swap(a, b)),
        Just(ArrayEdit::Clear),
    ]
    .boxed()
}

fn object_edit() -> BoxedStrategy<ObjectEdit> {
    let i = any::<Index>;
    prop_oneof![
        i().prop_map(ObjectEdit::Remove),
        value().prop_map(ObjectEdit::Unknown),
        i().prop_map(ObjectEdit::Rename),
        (i(), i()).prop_map(|(a, b)| ObjectEdit::Copy(a, b)),
        Just(ObjectEdit::Clear),
    ]
    .boxed()
}

fn edit() -> BoxedStrategy<Edit> {
    prop_oneof![
        4 => tweak().prop_map(Edit::Tweak),
        1 => value().prop_map(Edit::Replace),
        1 => graft().prop_map(Edit::Graft),
        2 => (array_edit(), object_edit(), tweak()).prop_map(|(a, o, t)| Edit::Shape(a, o, t)),
        1 => Just(Edit::Null),
        1 => (1..=140usize, any::<u64>()).prop_map(|(depth, objects)| Edit::Nest { depth, objects }),
        1 => any::<bool>().prop_map(|object| Edit::Empty { object }),
        1 => graft().prop_map(Edit::Append),
        1 => Just(Edit::Remove),
    ]
    .boxed()
}

fn surgery() -> BoxedStrategy<Surgery> {
    prop_oneof![
        (any::<Index>(), 1..=1000u64).prop_map(|(i, by)| Surgery::Inverted(i, by)),
        Just(Surgery::Saturated),
        Just(Surgery::TopBucket),
        Just(Surgery::ZeroBucket),
        any::<Index>().prop_map(Surgery::ZeroCount),
        Just(Surgery::Reverse),
        select(vec![0, 1, u64::MAX]).prop_map(Surgery::Count),
        select(vec![json!(-1.0), json!(1e308), json!(0), json!(u64::MAX)]).prop_map(Surgery::Sum),
        select(vec![
            (5u64, 1u64),
            (0, 0),
            (u64::MAX, u64::MAX),
            (u64::MAX, 0)
        ])
        .prop_map(|(lo, hi)| Surgery::Extremes(lo, hi)),
        Just(Surgery::Clear),
    ]
    .boxed()
}

fn json_op() -> BoxedStrategy<JsonOp> {
    let i = any::<Index>;
    let descend = proptest::collection::vec(i(), 1..=8).prop_map(Place::Descend);
    prop_oneof![
        1 => (i(), surgery()).prop_map(|(h, s)| JsonOp::Histogram(h, s)),
        1 => (i(), i(), prop::option::of(i()), tweak()).prop_map(|(table, key, from_key, tweak)| {
            JsonOp::Broadcast { table, key, from_key, tweak }
        }),
        1 => number().prop_map(JsonOp::Calibration),
        4 => (descend, edit()).prop_map(|(p, e)| JsonOp::Node(p, e)),
        5 => (i().prop_map(Place::Any), edit()).prop_map(|(p, e)| JsonOp::Node(p, e)),
    ]
    .boxed()
}

/// One case: a seed, structure-aware edits, then byte edits of its text.
#[derive(Clone, Debug)]
pub struct ProfileCase {
    pub seed: Index,
    pub ops: Vec<JsonOp>,
    pub pretty: bool,
    pub bytes: Vec<bytes::ByteOp>,
}

pub fn cases() -> BoxedStrategy<ProfileCase> {
    // Mostly one to three edits, now and then up to eight.
    let ops = prop_oneof![
        3 => proptest::collection::vec(json_op(), 1..=3),
        1 => proptest::collection::vec(json_op(), 1..=8),
    ];
    let pretty = proptest::bool::weighted(0.2);
    let edits = prop_oneof![
        7 => (ops.clone(), pretty, Just(vec![])),
        2 => (ops, pretty, bytes::ops()),
        1 => (Just(vec![]), Just(false), bytes::ops()),
    ];
    (any::<Index>(), edits)
        .prop_map(|(seed, (ops, pretty, bytes))| ProfileCase {
            seed,
            ops,
            pretty,
            bytes,
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Applying a recipe

/// A seed document and what mutations aim at in it.
#[derive(Debug)]
pub struct JsonSeed {
    pub name: String,
    pub text: Vec<u8>,
    pub value: Value,
    paths: Vec<Vec<Seg>>,
    /// Objects holding a "buckets" list.
    histograms: Vec<Vec<Seg>>,
    /// Arrays whose first element is an object.
    tables: Vec<Vec<Seg>>,
}

impl JsonSeed {
    pub fn new(name: String, text: Vec<u8>) -> Option<Self> {
        let value: Value = serde_json::from_slice(&text).ok()?;
        let paths = all_paths(&value);
        let at = |p: &Vec<Seg>| node(&value, p);
        let histograms = paths
            .iter()
            .filter(|p| at(p).is_some_and(|v| v.get("buckets").is_some()))
            .cloned()
            .collect();
        let tables = paths
            .iter()
            .filter(|p| {
                at(p)
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.first().is_some_and(Value::is_object))
            })
            .cloned()
            .collect();
        Some(Self {
            name,
            text,
            value,
            paths,
            histograms,
            tables,
        })
    }
}

fn locate(place: &Place, doc: &Value, seed: &JsonSeed) -> Vec<Seg> {
    match place {
        Place::Any(i) => seed.paths[i.index(seed.paths.len())].clone(),
        Place::Descend(steps) => {
            let (mut path, mut v) = (Vec::new(), doc);
            for step in steps {
                let Some((seg, c)) = child(v, step) else {
                    break;
                };
                path.push(seg);
                v = c;
            }
            path
        }
    }
}

fn apply(doc: &mut Value, op: &JsonOp, seed: &JsonSeed, seeds: &[JsonSeed]) {
    match op {
        JsonOp::Histogram(h, surgery) if !seed.histograms.is_empty() => {
            let path = &seed.histograms[h.index(seed.histograms.len())];
            if let Some(Value::Object(h)) = node_mut(doc, path) {
                operate(h, surgery);
            }
        }
        JsonOp::Broadcast {
            table,
            key,
            from_key,
            tweak,
        } if !seed.tables.is_empty() => {
            let path = &seed.tables[table.index(seed.tables.len())];
            if let Some(Value::Array(a)) = node_mut(doc, path) {
                broadcast(a, key, from_key.as_ref(), tweak);
            }
        }
        JsonOp::Calibration(cost) => {
            if let Value::Object(top) = doc {
                let figures = json!({"figures": [{"name": "cpuid", "median_ns": cost}]});
                top.insert("calibration".into(), figures);
            }
        }
        JsonOp::Node(place, edit) => {
            let path = locate(place, doc, seed);
            edit_node(doc, &path, edit, seeds);
        }
        // Histogram surgery or a broadcast on a seed without histograms or tables.
        _ => {}
    }
}

fn graft_from(g: &Graft, path: &[Seg], seeds: &[JsonSeed]) -> Option<Value> {
    let donor = &seeds[g.donor.index(seeds.len())];
    match &g.from {
        None => node(&donor.value, path).cloned(),
        Some(i) => node(&donor.value, &donor.paths[i.index(donor.paths.len())]).cloned(),
    }
}

fn edit_node(doc: &mut Value, path: &[Seg], edit: &Edit, seeds: &[JsonSeed]) {
    if let Edit::Remove = edit {
        // Removing a node needs its parent.
        let Some((last, parent)) = path.split_last() else {
            return;
        };
        match (node_mut(doc, parent), last) {
            (Some(Value::Object(m)), Seg::Key(k)) => {
                m.remove(k);
            }
            (Some(Value::Array(a)), Seg::Index(i)) if *i < a.len() => {
                a.remove(*i);
            }
            _ => {}
        }
        return;
    }
    let graft = match edit {
        Edit::Graft(g) | Edit::Append(g) => graft_from(g, path, seeds),
        _ => None,
    };
    let Some(v) = node_mut(doc, path) else { return };
    match edit {
        Edit::Tweak(t) => *v = tweaked(v, t),
        Edit::Replace(new) => *v = new.clone(),
        Edit::Graft(_) => {
            if let Some(g) = graft {
                *v = g;
            }
        }
        Edit::Shape(a, o, t) => match v {
            Value::Array(arr) => array(arr, a),
            Value::Object(m) => object(m, o),
            _ => *v = tweaked(v, t),
        },
        Edit::Null => *v = Value::Null,
        Edit::Nest { depth, objects } => {
            let mut inner = v.take();
            for level in 0..*depth {
                inner = if (objects >> (level % 64)) & 1 == 1 {
                    json!({ "x": inner })
                } else {
                    json!([inner])
                };
            }
            *v = inner;
        }
        Edit::Empty { object } => *v = if *object { json!({}) } else { json!([]) },
        Edit::Append(_) => match (v, graft) {
            (Value::Array(a), Some(g)) => a.push(g),
            (v, Some(g)) => *v = json!([g]),
            _ => {}
        },
        Edit::Remove => {}
    }
}

fn tweaked(v: &Value, t: &Tweak) -> Value {
    match (v, t) {
        (Value::Bool(b), _) => Value::Bool(!b),
        (Value::Number(_), Tweak::Near(near, _, _)) => near_number(v, *near),
        (Value::Number(_), Tweak::Fresh(n, _, _)) => n.clone(),
        (Value::String(s), Tweak::Near(_, near, _)) => Value::String(near_string(s, near)),
        (Value::String(_), Tweak::Fresh(_, s, _)) => Value::String(s.clone()),
        (_, Tweak::Near(_, _, any) | Tweak::Fresh(_, _, any)) => any.clone(),
    }
}

fn near_number(v: &Value, near: Near) -> Value {
    if let Some(n) = v.as_u64() {
        return match near {
            Near::Up => json!(n.saturating_add(1)),
            Near::Down => json!(n.saturating_sub(1)),
            Near::Double => json!(n.saturating_mul(2)),
            Near::Mega => json!(n.saturating_mul(1_000_000)),
            Near::Half => json!(n / 2),
            Near::Negate => json!(-(n.min(i64::MAX as u64) as i64)),
            Near::PlusHalf => json!(n as f64 + 0.5),
        };
    }
    let x = v.as_f64().unwrap_or(0.0);
    let y = match near {
        Near::Up | Near::PlusHalf => x + 0.5,
        Near::Down => x.trunc(),
        Near::Double => x * 1e6,
        Near::Mega => x * 1e300,
        Near::Half => x / 1e300,
        Near::Negate => -x,
    };
    if y.is_finite() {
        json!(y)
    } else {
        json!(f64::MAX)
    }
}

fn near_string(s: &str, near: &NearString) -> String {
    let chars: Vec<char> = s.chars().collect();
    match near {
        NearString::Cut(i) => chars[..i.index(chars.len() + 1)].iter().collect(),
        NearString::Twice => format!("{s}{s}"),
        NearString::Insert(i, c) => {
            let mut chars = chars;
            chars.insert(i.index(chars.len() + 1), *c);
            chars.into_iter().collect()
        }
        NearString::Upper => s.to_uppercase(),
    }
}

fn array(a: &mut Vec<Value>, edit: &ArrayEdit) {
    let len = a.len();
    match edit {
        ArrayEdit::Remove(i) if len > 0 => {
            a.remove(i.index(len));
        }
        ArrayEdit::Dup(i, to) if len > 0 => {
            let v = a[i.index(len)].clone();
            a.insert(to.index(len + 1), v);
        }
        ArrayEdit::Double if len < 5_000 => a.extend(a.clone()),
        ArrayEdit::TimesTen if len < 500 => {
            let copy = a.clone();
            for _ in 0..9 {
                a.extend(copy.iter().cloned());
            }
        }
        ArrayEdit::Reverse => a.reverse(),
        ArrayEdit::Truncate(i) => a.truncate(i.index(len + 1)),
        ArrayEdit::Swap(i, j) if len > 1 => a.swap(i.index(len), j.index(len)),
        ArrayEdit::Clear => a.clear(),
        _ => {}
    }
}

fn object(m: &mut Map<String, Value>, edit: &ObjectEdit) {
    let keys: Vec<String> = m.keys().cloned().collect();
    let key = |i: &Index| keys[i.index(keys.len())].clone();
    match edit {
        ObjectEdit::Unknown(v) => {
            m.insert("fuzz_unknown_key".into(), v.clone());
        }
        ObjectEdit::Clear => m.clear(),
        _ if keys.is_empty() => {}
        ObjectEdit::Remove(i) => {
            m.remove(&key(i));
        }
        ObjectEdit::Rename(i) => {
            let k = key(i);
            if let Some(v) = m.remove(&k) {
                m.insert(format!("{k}_"), v);
            }
        }
        ObjectEdit::Copy(from, to) => {
            if let Some(v) = m.get(&key(from)).cloned() {
                m.insert(key(to), v);
            }
        }
    }
}

fn operate(h: &mut Map<String, Value>, surgery: &Surgery) {
    let buckets = h.entry("buckets").or_insert_with(|| json!([]));
    let Value::Array(b) = buckets else { return };
    let n = b.len();
    match surgery {
        Surgery::Inverted(i, by) if n > 0 => {
            // Only real [low, high, count] triples: a mutated bucket is left alone.
            if let Some(Value::Array(bucket)) = b.get_mut(i.index(n)) {
                if let Some(low) = bucket.first().and_then(Value::as_u64) {
                    if let Some(high) = bucket.get_mut(1) {
                        *high = json!(low.saturating_sub(*by));
                    }
                }
            }
        }
        Surgery::Saturated => {
            b.push(json!([1, 2, u64::MAX]));
            b.push(json!([3, 4, u64::MAX]));
        }
        Surgery::TopBucket => b.push(json!([u64::MAX - 1, u64::MAX, 1])),
        Surgery::ZeroBucket => b.push(json!([0, 0, 1])),
        Surgery::ZeroCount(i) if n > 0 => {
            if let Some(count) = b.get_mut(i.index(n)).and_then(|bucket| bucket.get_mut(2)) {
                *count = json!(0);
            }
        }
        Surgery::Reverse => b.reverse(),
        Surgery::Count(c) => {
            h.insert("count".into(), json!(c));
        }
        Surgery::Sum(s) => {
            h.insert("sum_ns".into(), s.clone());
        }
        Surgery::Extremes(lo, hi) => {
            h.insert("min_ns".into(), json!(lo));
            h.insert("max_ns".into(), json!(hi));
        }
        Surgery::Clear => b.clear(),
        // Bucket edits on a histogram without buckets.
        _ => {}
    }
}

fn broadcast(a: &mut [Value], key: &Index, from_key: Option<&Index>, tweak: &Tweak) {
    let Some(Value::Object(first)) = a.first() else {
        return;
    };
    let keys: Vec<String> = first.keys().cloned().collect();
    if keys.is_empty() {
        return;
    }
    let key = &keys[key.index(keys.len())];
    let from_key = from_key.map(|k| &keys[k.index(keys.len())]);
    let value = tweaked(&first[key], tweak);
    for v in a.iter_mut() {
        if let Value::Object(m) = v {
            let new = match from_key {
                Some(k) => m.get(k).cloned().unwrap_or(Value::Null),
                None => value.clone(),
            };
            m.insert(key.clone(), new);
        }
    }
}

/// Leaf differences from `seed` to `doc`, as "path: seed value -> input value".
fn differences(seed: &Value, doc: &Value, path: &mut Vec<Seg>, out: &mut Vec<String>) {
    if out.len() > 200 {
        return;
    }
    let short = |v: Option<&Value>| v.map_or("(absent)".into(), |v| one_line(&v.to_string(), 100));
    match (seed, doc) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                path.push(Seg::Key(k.clone()));
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => differences(x, y, path, out),
                    (x, y) => {
                        out.push(format!("{}: {} -> {}", show_path(path), short(x), short(y)))
                    }
                }
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                path.push(Seg::Index(i));
                differences(x, y, path, out);
                path.pop();
            }
        }
        (Value::Array(a), Value::Array(b)) => out.push(format!(
            "{}: {} elements -> {} elements: {}",
            show_path(path),
            a.len(),
            b.len(),
            one_line(&doc.to_string(), 160)
        )),
        (x, y) if x != y => out.push(format!(
            "{}: {} -> {}",
            show_path(path),
            short(Some(x)),
            short(Some(y))
        )),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The target

/// Profiles, and what reads them: the diff, its renderers, the summary, the report, the CSV.
#[derive(Debug)]
pub struct Profiles {
    seeds: Vec<JsonSeed>,
    /// The other side of every diff: the minimal profile from tests/data.
    reference: Profile,
    donors: Vec<Vec<u8>>,
}

const TOKENS: &[&[u8]] = &[
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"-0",
    b"0.0e0",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"\"\\ud800\"",
    b"\"\\u0000\"",
    b"null",
    b"true",
    b"[]",
    b"{}",
    b"\"schema_version\":1,",
    b",",
    b"1.7976931348623157e309",
    b"00",
    b"1.",
    b".5",
    b"[[[[[[[[[[[[[[[[[[[[",
];

impl Profiles {
    /// The minimal profile and tests/data/fuzz-seeds/*.json, each checked to load cleanly.
    pub fn load() -> Self {
        let data = workspace().join("tests/data");
        let minimal = data.join("minimal-profile.json");
        let reference = file::load(&minimal)
            .unwrap_or_else(|e| panic!("the reference profile must parse: {e}"));
        let mut files = vec![minimal];
        if let Ok(dir) = std::fs::read_dir(data.join("fuzz-seeds")) {
            let mut more: Vec<PathBuf> = dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect();
            more.sort();
            files.extend(more);
        }
        let mut seeds = Vec::new();
        for path in files {
            let name = path
                .strip_prefix(workspace())
                .unwrap_or(&path)
                .display()
                .to_string();
            let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            // Seeds are profiles earlier versions wrote: one the reader refuses is a profile
            // users hold that no longer loads.
            if let Err(e) = file::parse(&text, &name) {
                panic!("fuzz seed {name} no longer loads: {e}");
            }
            seeds.extend(JsonSeed::new(name, text));
        }
        let donors = seeds.iter().map(|s| s.text.clone()).collect();
        let target = Self {
            seeds,
            reference,
            donors,
        };
        // The seeds themselves must come out clean, or every finding would be noise.
        for s in &target.seeds {
            let outcome = target.check(&s.text);
            assert!(outcome.accepted, "seed {} is accepted", s.name);
            for o in outcome.oddities {
                println!(
                    "fuzz profile: note: seed {} already shows: {}: {}",
                    s.name, o.key, o.detail
                );
            }
        }
        target
    }
}

impl Target for Profiles {
    type Case = ProfileCase;

    fn name(&self) -> &'static str {
        "profile"
    }

    fn ext(&self) -> &'static str {
        "json"
    }

    fn cases(&self) -> BoxedStrategy<ProfileCase> {
        cases()
    }

    fn input(&self, case: &ProfileCase) -> (Vec<u8>, &'static str) {
        let seed = &self.seeds[case.seed.index(self.seeds.len())];
        let mut input = if case.ops.is_empty() {
            seed.text.clone()
        } else {
            let mut doc = seed.value.clone();
            for op in &case.ops {
                apply(&mut doc, op, seed, &self.seeds);
            }
            let text = if case.pretty {
                serde_json::to_vec_pretty(&doc)
            } else {
                serde_json::to_vec(&doc)
            };
            text.unwrap_or_default()
        };
        let donors: Vec<&[u8]> = self.donors.iter().map(Vec::as_slice).collect();
        for op in &case.bytes {
            bytes::apply(op, &mut input, &donors, TOKENS);
        }
        let how = match (case.ops.is_empty(), case.bytes.is_empty()) {
            (false, true) => "structure",
            (false, false) => "structure+bytes",
            _ => "bytes",
        };
        (input, how)
    }

    fn check(&self, input: &[u8]) -> Outcome {
        consumers::profile(input, &self.reference)
    }

    fn explain(&self, case: &ProfileCase, input: &[u8]) -> String {
        let seed = &self.seeds[case.seed.index(self.seeds.len())];
        let Ok(doc) = serde_json::from_slice::<Value>(input) else {
            return format!(
                "{} made into {} bytes that are not JSON",
                seed.name,
                input.len()
            );
        };
        let mut diffs = Vec::new();
        differences(&seed.value, &doc, &mut Vec::new(), &mut diffs);
        let mut s = format!("{} with {} change(s):", seed.name, diffs.len());
        for d in diffs.iter().take(12) {
            s.push_str(&format!("\n  {d}"));
        }
        if diffs.len() > 12 {
            s.push_str("\n  …");
        }
        s
    }
}
