//! The data written to targets. Every 512-byte sector starts with a header naming its own byte
//! offset and the run that wrote it, so a read can prove it returned the sector it asked for
//! and a test can prove a write landed where it was sent.

/// Granularity of headers: the smallest O_DIRECT unit.
pub const SECTOR: usize = 512;
const MAGIC: u64 = u64::from_le_bytes(*b"VGAPSECT");

/// Tag of data written by the fill that prepares a temp file.
pub const FILL_TAG: u64 = 1;

/// Writes headers into every sector of `buf`, which will be written at byte offset `offset`.
#[inline]
pub fn stamp(buf: &mut [u8], offset: u64, tag: u64) {
    for (i, sector) in buf.chunks_exact_mut(SECTOR).enumerate() {
        sector[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        sector[8..16].copy_from_slice(&(offset + (i * SECTOR) as u64).to_le_bytes());
        sector[16..24].copy_from_slice(&tag.to_le_bytes());
    }
}

/// What a sector's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SectorHeader {
    pub offset: u64,
    pub tag: u64,
}

/// Checks every sector of `buf`, read from byte offset `offset`, carries its own offset.
/// Returns the headers, or a description of the first bad sector.
pub fn verify(buf: &[u8], offset: u64) -> Result<Vec<SectorHeader>, String> {
    buf.chunks_exact(SECTOR)
        .enumerate()
        .map(|(i, sector)| {
            let want = offset + (i * SECTOR) as u64;
            let word = |r: std::ops::Range<usize>| {
                u64::from_le_bytes(sector[r].try_into().expect("8-byte slice"))
            };
            if word(0..8) != MAGIC {
                return Err(format!("sector at byte {want} has no virtgap header"));
            }
            let found = word(8..16);
            if found != want {
                return Err(format!(
                    "sector at byte {want} holds the data of byte {found}"
                ));
            }
            Ok(SectorHeader {
                offset: found,
                tag: word(16..24),
            })
        })
        .collect()
}

/// Fills `buf` with incompressible bytes (so no layer can shortcut zeroes or dedupe blocks).
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    // xorshift64: cheap, and plenty random for defeating compression.
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x.to_le_bytes()
    };
    // Whole words as fixed-size stores (not a variable-length copy, a memcpy call, per word).
    let mut words = buf.chunks_exact_mut(8);
    for word in &mut words {
        word.copy_from_slice(&next());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&next()[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_buffers_verify() {
        let mut buf = vec![0u8; 4096];
        fill_random(&mut buf, 42);
        stamp(&mut buf, 8192, 7);
        let headers = verify(&buf, 8192).unwrap();
        assert_eq!(headers.len(), 8);
        assert_eq!(
            headers[3],
            SectorHeader {
                offset: 8192 + 3 * 512,
                tag: 7
            }
        );
    }

    #[test]
    fn misplaced_data_is_caught() {
        let mut buf = vec![0u8; 1024];
        stamp(&mut buf, 0, 7);
        let e = verify(&buf, 4096).unwrap_err();
        assert!(e.contains("holds the data of byte 0"), "{e}");
        let e = verify(&[0u8; 512], 0).unwrap_err();
        assert!(e.contains("no virtgap header"), "{e}");
    }
}
