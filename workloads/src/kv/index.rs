//! The store's DRAM index and block states, readable without the store's lock.
//!
//! Readers look a key up and read the device with no lock held; only the store's writers
//! (appends and defrag, serialized by the store's mutex) change entries. An entry is two
//! atomic words — where the record is, and which version it is — so a reader racing a writer
//! can see a mix of old and new. That is harmless: the record read from the device is checked
//! against the entry, and a mismatch is judged against the entry as it is afterwards (a moved
//! record is read again; one that still disagrees with an unchanged entry is data loss).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Where a key's current record is and what it must contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub block: u32,
    pub offset: u32,
    /// Stored bytes (header included, 16-byte units).
    pub len: u32,
    pub generation: u32,
    /// The low half of the record's payload checksum (the record's header holds all of it).
    pub checksum_low: u32,
}

/// Bits of a location word: block, then offset and length in 16-byte units (length minus
/// one, so a record filling a whole 8 MiB block fits).
const UNIT_BITS: u32 = 19;
const BLOCK_BITS: u32 = 64 - 2 * UNIT_BITS;
/// A location word no entry has: the key was never written.
const EMPTY: u64 = u64::MAX;
/// Blocks an index can address (the all-ones block is the empty marker).
pub const MAX_BLOCKS: u64 = (1 << BLOCK_BITS) - 1;
/// Largest large block whose offsets and lengths fit a location word.
pub const MAX_BLOCK_BYTES: u64 = 16 << UNIT_BITS;

impl Entry {
    fn location_word(&self) -> u64 {
        debug_assert!(u64::from(self.block) < MAX_BLOCKS);
        debug_assert!(self.len >= 16 && u64::from(self.len) <= MAX_BLOCK_BYTES);
        (u64::from(self.block) << (2 * UNIT_BITS))
            | (u64::from(self.offset / 16) << UNIT_BITS)
            | u64::from(self.len / 16 - 1)
    }

    fn version_word(&self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.checksum_low)
    }

    fn from_words(location: u64, version: u64) -> Option<Self> {
        if location == EMPTY {
            return None;
        }
        let unit_mask = (1 << UNIT_BITS) - 1;
        Some(Self {
            block: (location >> (2 * UNIT_BITS)) as u32,
            offset: ((location >> UNIT_BITS) & unit_mask) as u32 * 16,
            len: ((location & unit_mask) as u32 + 1) * 16,
            generation: (version >> 32) as u32,
            checksum_low: version as u32,
        })
    }
}

/// One entry per key.
pub struct Index {
    location: Vec<AtomicU64>,
    version: Vec<AtomicU64>,
}

impl Index {
    pub fn new(keys: u64) -> Self {
        Self {
            location: (0..keys).map(|_| AtomicU64::new(EMPTY)).collect(),
            version: (0..keys).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn keys(&self) -> u64 {
        self.location.len() as u64
    }

    /// The key's entry; Err when the key is out of range.
    pub fn get(&self, key: u64) -> Result<Option<Entry>, ()> {
        let k = usize::try_from(key).map_err(|_| ())?;
        let location = self.location.get(k).ok_or(())?.load(Ordering::Acquire);
        let version = self.version[k].load(Ordering::Acquire);
        Ok(Entry::from_words(location, version))
    }

    /// Points `key` at a new record. Callers hold the store's lock: one writer at a time.
    pub fn set(&self, key: u64, entry: Entry) {
        let k = key as usize;
        self.version[k].store(entry.version_word(), Ordering::Release);
        self.location[k].store(entry.location_word(), Ordering::Release);
    }
}

/// Where a block's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    Free = 0,
    /// The write buffer fills it.
    Open = 1,
    /// Sealed, queued for the writer; reads are served from its buffer.
    Writing = 2,
    /// On the device.
    Sealed = 3,
}

/// Every block's state, changed under the store's lock and read without it.
pub struct BlockStates(Vec<AtomicU8>);

impl BlockStates {
    pub fn new(blocks: u64) -> Self {
        Self(
            (0..blocks)
                .map(|_| AtomicU8::new(BlockState::Free as u8))
                .collect(),
        )
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, block: u32) -> BlockState {
        match self.0[block as usize].load(Ordering::Acquire) {
            0 => BlockState::Free,
            1 => BlockState::Open,
            2 => BlockState::Writing,
            _ => BlockState::Sealed,
        }
    }

    pub fn set(&self, block: u32, state: BlockState) {
        self.0[block as usize].store(state as u8, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_at_the_edges_of_their_fields() {
        let index = Index::new(3);
        assert_eq!(index.get(0), Ok(None));
        assert_eq!(index.get(3), Err(()));
        let widest = Entry {
            block: (MAX_BLOCKS - 1) as u32,
            offset: (MAX_BLOCK_BYTES - 16) as u32,
            len: MAX_BLOCK_BYTES as u32,
            generation: u32::MAX,
            checksum_low: u32::MAX,
        };
        let smallest = Entry {
            block: 0,
            offset: 0,
            len: 16,
            generation: 1,
            checksum_low: 0,
        };
        index.set(1, widest);
        index.set(2, smallest);
        assert_eq!(index.get(1), Ok(Some(widest)));
        assert_eq!(index.get(2), Ok(Some(smallest)));
        assert_eq!(index.get(0), Ok(None));
    }
}
