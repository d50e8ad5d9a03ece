//! Raw byte mutations, for what structure-aware mutations cannot reach: broken syntax, cut
//! documents, bytes that are not UTF-8, tokens a serializer never writes.

use proptest::prelude::*;
use proptest::sample::Index;

/// One edit of the bytes of a document.
#[derive(Clone, Debug)]
pub enum ByteOp {
    /// One bit of one byte flipped.
    Flip(Index, u8),
    /// One byte replaced by a character that means something to JSON or TOML.
    Set(Index, Index),
    Delete(Index, usize),
    /// A span copied elsewhere in the document.
    Copy {
        from: Index,
        len: usize,
        to: Index,
    },
    /// A token of the format's own (`Target`'s list) inserted.
    Token(Index, Index),
    Truncate(Index),
    /// A span replaced by a span of another seed.
    Splice {
        donor: Index,
        from: Index,
        len: usize,
        at: Index,
        cut: usize,
    },
    /// A short run repeated many times: deep nesting from "[", long digit strings.
    Repeat {
        at: Index,
        len: usize,
        times: usize,
    },
    Reverse(Index, usize),
}

const SPECIAL: &[u8] = b"{}[]\":,-+.eE0123456789 \\\n\t\x00\xff'=#";

/// A span's length: mostly short, now and then wide.
fn span() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1..=16usize, 1 => 1..=512usize]
}

pub fn op() -> BoxedStrategy<ByteOp> {
    let i = any::<Index>;
    prop_oneof![
        (i(), 0..8u8).prop_map(|(at, bit)| ByteOp::Flip(at, bit)),
        (i(), i()).prop_map(|(at, c)| ByteOp::Set(at, c)),
        (i(), span()).prop_map(|(at, len)| ByteOp::Delete(at, len)),
        (i(), span(), i()).prop_map(|(from, len, to)| ByteOp::Copy { from, len, to }),
        (i(), i()).prop_map(|(at, t)| ByteOp::Token(at, t)),
        i().prop_map(ByteOp::Truncate),
        (i(), i(), span(), i(), span()).prop_map(|(donor, from, len, at, cut)| {
            ByteOp::Splice {
                donor,
                from,
                len,
                at,
                cut,
            }
        }),
        (i(), 1..=4usize, 1..=300usize).prop_map(|(at, len, times)| ByteOp::Repeat {
            at,
            len,
            times
        }),
        (i(), span()).prop_map(|(at, len)| ByteOp::Reverse(at, len)),
    ]
    .boxed()
}

/// One to three byte edits.
pub fn ops() -> impl Strategy<Value = Vec<ByteOp>> {
    proptest::collection::vec(op(), 1..=3)
}

/// Applies `op` to `data`; `donors` are the target's seeds, `tokens` its format's words.
pub fn apply(op: &ByteOp, data: &mut Vec<u8>, donors: &[&[u8]], tokens: &[&[u8]]) {
    let len = data.len();
    // A position in the document, its end included.
    let at = |i: &Index| i.index(len + 1);
    match op {
        ByteOp::Flip(i, bit) if len > 0 => data[i.index(len)] ^= 1 << bit,
        ByteOp::Set(i, c) if len > 0 => data[i.index(len)] = SPECIAL[c.index(SPECIAL.len())],
        ByteOp::Delete(i, n) => {
            let start = at(i);
            data.drain(start..(start + n).min(len));
        }
        ByteOp::Copy { from, len: n, to } => {
            let start = at(from);
            let chunk = data[start..(start + n).min(len)].to_vec();
            let to = at(to);
            data.splice(to..to, chunk);
        }
        ByteOp::Token(i, t) => {
            let to = at(i);
            data.splice(to..to, tokens[t.index(tokens.len())].iter().copied());
        }
        ByteOp::Truncate(i) => data.truncate(at(i)),
        ByteOp::Splice {
            donor,
            from,
            len: n,
            at: i,
            cut,
        } => {
            let donor = donors[donor.index(donors.len())];
            let from = from.index(donor.len() + 1);
            let piece = &donor[from..(from + n).min(donor.len())];
            let start = at(i);
            data.splice(start..(start + cut).min(len), piece.iter().copied());
        }
        ByteOp::Repeat {
            at: i,
            len: n,
            times,
        } => {
            let start = at(i);
            let end = (start + n).min(len);
            let run = data[start..end].repeat(*times);
            data.splice(end..end, run);
        }
        ByteOp::Reverse(i, n) => {
            let start = at(i);
            data[start..(start + n).min(len)].reverse();
        }
        // Flip and Set on an empty document.
        _ => {}
    }
}
