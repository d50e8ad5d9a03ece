//! A log-structured key-value store with Aerospike's I/O pattern: an index in DRAM, records
//! appended into a large write block that goes to the device in one O_DIRECT write, updates that
//! leave the older copy dead, and a defragmenter that rewrites the live records of blocks whose
//! live fraction fell below a threshold and frees them. Every read is verified against the index.
//!
//! This is the storage core: one owner, synchronous I/O. The `kv` workload runner (pacing, many
//! service threads, ACT's verdict) is built on it.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::act::roundup16;
use crate::engine::AlignedBuffer;

const MAGIC: u32 = u32::from_le_bytes(*b"VGKV");
/// magic u32, generation u32, key u64, length u32, pad u32, checksum u64.
const HEADER: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("record size {record} B does not fit a {lb} B large block with its 32-byte header")]
    RecordTooLarge { record: u64, lb: u64 },
    #[error("the target holds {blocks} large blocks; the store needs at least 4")]
    TooSmall { blocks: u64 },
    #[error(
        "the store is full: every block is live (raise --defrag-lwm-pct or use a larger target)"
    )]
    Full,
    #[error("{op} of {len} B at offset {offset} failed: {err}")]
    Io {
        op: &'static str,
        offset: u64,
        len: usize,
        err: std::io::Error,
    },
    #[error("key {key}: read back {found} instead of generation {generation} (data loss)")]
    Mismatch {
        key: u64,
        generation: u32,
        found: String,
    },
    #[error("key {0} was never written")]
    Missing(u64),
}

#[derive(Clone, Debug)]
pub struct KvConfig {
    /// Bytes of one record, header included.
    pub record_bytes: u64,
    /// Large-block size.
    pub lb_bytes: u64,
    /// Blocks whose live fraction falls below this percentage are defragmented.
    pub defrag_lwm_pct: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    block: u32,
    offset: u32,
    generation: u32,
    checksum: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockState {
    Free,
    Open,
    Sealed,
}

/// What the store did, for rates and checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvCounters {
    pub puts: u64,
    pub gets: u64,
    /// Reads served from the write buffer (the record was not on the device yet).
    pub buffered_gets: u64,
    pub lb_writes: u64,
    pub lb_reads: u64,
    /// Records moved by defragmentation.
    pub relocated: u64,
    pub mismatches: u64,
}

pub struct KvStore {
    file: Arc<File>,
    cfg: KvConfig,
    stored: u64,
    align: usize,
    states: Vec<BlockState>,
    live: Vec<u64>,
    free: VecDeque<u32>,
    defrag_queue: VecDeque<u32>,
    index: Vec<Option<Entry>>,
    buf: AlignedBuffer,
    buf_block: u32,
    buf_used: usize,
    scratch: AlignedBuffer,
    pub counters: KvCounters,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("cfg", &self.cfg)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// Writes the payload of (key, generation) — deterministic, so every generation differs — and
/// returns its checksum.
fn fill_payload(buf: &mut [u8], key: u64, generation: u32) -> u64 {
    let mut x = key ^ (u64::from(generation) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    checksum_of(buf)
}

/// FNV-style fold of a payload's 8-byte words (the last one zero-padded).
fn checksum_of(payload: &[u8]) -> u64 {
    let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in payload.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        sum = (sum ^ x).wrapping_mul(0x0000_0100_0000_01b3);
    }
    sum
}

fn word<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("in bounds")
}

impl KvStore {
    /// A store over the first `size` bytes of `file`, for keys 0..`keys`. `align` is the
    /// direct-I/O alignment of the target.
    pub fn new(
        file: Arc<File>,
        size: u64,
        align: usize,
        cfg: KvConfig,
        keys: u64,
    ) -> Result<Self, KvError> {
        let stored = roundup16(cfg.record_bytes.max(HEADER as u64 + 8));
        if stored > cfg.lb_bytes {
            return Err(KvError::RecordTooLarge {
                record: cfg.record_bytes,
                lb: cfg.lb_bytes,
            });
        }
        let blocks = size / cfg.lb_bytes;
        if blocks < 4 {
            return Err(KvError::TooSmall { blocks });
        }
        let alloc = |len: u64| {
            AlignedBuffer::new(len as usize, align.max(4096)).map_err(|e| KvError::Io {
                op: "allocate",
                offset: 0,
                len: len as usize,
                err: std::io::Error::other(e.to_string()),
            })
        };
        let mut store = Self {
            file,
            stored,
            align: align.max(512),
            states: vec![BlockState::Free; blocks as usize],
            live: vec![0; blocks as usize],
            free: (1..blocks as u32).collect(),
            defrag_queue: VecDeque::new(),
            index: vec![None; keys as usize],
            buf: alloc(cfg.lb_bytes)?,
            buf_block: 0,
            buf_used: 0,
            scratch: alloc(cfg.lb_bytes + 2 * align.max(4096) as u64)?,
            counters: KvCounters::default(),
            cfg,
        };
        store.states[0] = BlockState::Open;
        Ok(store)
    }

    pub fn keys(&self) -> u64 {
        self.index.len() as u64
    }

    /// Records that fit one large block.
    pub fn records_per_block(&self) -> u64 {
        self.cfg.lb_bytes / self.stored
    }

    /// Writes a new generation of `key`.
    pub fn put(&mut self, key: u64) -> Result<(), KvError> {
        let generation = self.index[key as usize].map_or(1, |e| e.generation + 1);
        self.append(key, generation, None)?;
        self.counters.puts += 1;
        Ok(())
    }

    /// Appends a record to the write buffer (copying `existing` bytes when relocating), updates
    /// the index and marks the older copy dead.
    fn append(
        &mut self,
        key: u64,
        generation: u32,
        existing: Option<&[u8]>,
    ) -> Result<(), KvError> {
        if self.buf_used + self.stored as usize > self.cfg.lb_bytes as usize {
            self.seal()?;
        }
        let at = self.buf_used;
        let rec = &mut self.buf.as_mut_slice()[at..at + self.stored as usize];
        let checksum = match existing {
            Some(bytes) => {
                rec.copy_from_slice(bytes);
                u64::from_le_bytes(word(rec, 24))
            }
            None => {
                let sum = fill_payload(&mut rec[HEADER..], key, generation);
                rec[0..4].copy_from_slice(&MAGIC.to_le_bytes());
                rec[4..8].copy_from_slice(&generation.to_le_bytes());
                rec[8..16].copy_from_slice(&key.to_le_bytes());
                rec[16..20].copy_from_slice(&(self.stored as u32).to_le_bytes());
                rec[20..24].copy_from_slice(&0u32.to_le_bytes());
                rec[24..32].copy_from_slice(&sum.to_le_bytes());
                sum
            }
        };
        self.buf_used += self.stored as usize;
        if let Some(old) = self.index[key as usize] {
            self.kill(old.block);
        }
        self.live[self.buf_block as usize] += self.stored;
        self.index[key as usize] = Some(Entry {
            block: self.buf_block,
            offset: at as u32,
            generation,
            checksum,
        });
        Ok(())
    }

    /// One copy in `block` died; queue the block for defragmentation when it drops below the
    /// threshold.
    fn kill(&mut self, block: u32) {
        let b = block as usize;
        self.live[b] = self.live[b].saturating_sub(self.stored);
        let below = self.live[b] * 100 < self.cfg.defrag_lwm_pct * self.cfg.lb_bytes;
        if self.states[b] == BlockState::Sealed && below && !self.defrag_queue.contains(&block) {
            self.defrag_queue.push_back(block);
        }
    }

    /// Writes the full write buffer as one large block and opens the next free block.
    fn seal(&mut self) -> Result<(), KvError> {
        let offset = u64::from(self.buf_block) * self.cfg.lb_bytes;
        let len = self.cfg.lb_bytes as usize;
        // Unused tail bytes of a block are zeroes: no header, so defrag stops there.
        self.buf.as_mut_slice()[self.buf_used..].fill(0);
        self.pwrite(offset, len)?;
        self.counters.lb_writes += 1;
        let sealed = self.buf_block;
        self.states[sealed as usize] = BlockState::Sealed;
        if self.live[sealed as usize] * 100 < self.cfg.defrag_lwm_pct * self.cfg.lb_bytes {
            self.defrag_queue.push_back(sealed);
        }
        // A free block, by defragmenting if none is left.
        let next = loop {
            if let Some(b) = self.free.pop_front() {
                break b;
            }
            if !self.defrag_one_into_free()? {
                return Err(KvError::Full);
            }
        };
        self.buf_block = next;
        self.buf_used = 0;
        self.states[next as usize] = BlockState::Open;
        Ok(())
    }

    fn pwrite(&mut self, offset: u64, len: usize) -> Result<(), KvError> {
        let ptr = self.buf.as_mut_ptr();
        // SAFETY: the buffer holds lb_bytes >= len bytes and outlives the call.
        let n = unsafe {
            libc::pwrite(
                self.file.as_raw_fd(),
                ptr.cast(),
                len,
                offset as libc::off_t,
            )
        };
        if n != len as isize {
            return Err(KvError::Io {
                op: "large-block write",
                offset,
                len,
                err: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    fn pread_scratch(&mut self, offset: u64, len: usize, op: &'static str) -> Result<(), KvError> {
        let ptr = self.scratch.as_mut_ptr();
        // SAFETY: scratch holds at least lb_bytes + 2 alignment units >= len and outlives the call.
        let n = unsafe {
            libc::pread(
                self.file.as_raw_fd(),
                ptr.cast(),
                len,
                offset as libc::off_t,
            )
        };
        if n != len as isize {
            return Err(KvError::Io {
                op,
                offset,
                len,
                err: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Defragments queued blocks until one is freed. false: nothing could be freed.
    fn defrag_one_into_free(&mut self) -> Result<bool, KvError> {
        while let Some(block) = self.defrag_queue.pop_front() {
            // A queued block may have been freed and reused since: judge it as it is now.
            let b = block as usize;
            let below = self.live[b] * 100 < self.cfg.defrag_lwm_pct * self.cfg.lb_bytes;
            if self.states[b] != BlockState::Sealed || !below {
                continue;
            }
            self.defrag(block)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Runs the defragmenter while blocks are queued and free space is short (fewer than a
    /// quarter of the blocks free), as a background defragmenter would keep up.
    pub fn defrag_pending(&mut self) -> Result<(), KvError> {
        while self.free.len() * 4 < self.states.len() && self.defrag_one_into_free()? {}
        Ok(())
    }

    /// Reads `block` with one large-block read, re-appends its live records and frees it.
    fn defrag(&mut self, block: u32) -> Result<(), KvError> {
        let offset = u64::from(block) * self.cfg.lb_bytes;
        let len = self.cfg.lb_bytes as usize;
        self.pread_scratch(offset, len, "large-block read")?;
        self.counters.lb_reads += 1;
        let data = self.scratch.as_slice()[..len].to_vec();
        let stored = self.stored as usize;
        for at in (0..len - stored + 1).step_by(stored) {
            let rec = &data[at..at + stored];
            if u32::from_le_bytes(word(rec, 0)) != MAGIC {
                break;
            }
            let generation = u32::from_le_bytes(word(rec, 4));
            let key = u64::from_le_bytes(word(rec, 8));
            let current = self.index.get(key as usize).copied().flatten();
            if current.is_some_and(|e| {
                e.block == block && e.offset as usize == at && e.generation == generation
            }) {
                self.append(key, generation, Some(rec))?;
                self.counters.relocated += 1;
            }
        }
        self.live[block as usize] = 0;
        self.states[block as usize] = BlockState::Free;
        self.free.push_back(block);
        Ok(())
    }

    /// Reads `key` with one aligned read of the smallest direct-I/O size covering the record (or
    /// from the write buffer if it is not on the device yet) and checks it against the index.
    pub fn get(&mut self, key: u64) -> Result<(), KvError> {
        let e = self
            .index
            .get(key as usize)
            .copied()
            .flatten()
            .ok_or(KvError::Missing(key))?;
        self.counters.gets += 1;
        let stored = self.stored as usize;
        let rec: Vec<u8> = if e.block == self.buf_block {
            self.counters.buffered_gets += 1;
            self.buf.as_slice()[e.offset as usize..e.offset as usize + stored].to_vec()
        } else {
            let abs = u64::from(e.block) * self.cfg.lb_bytes + u64::from(e.offset);
            let start = abs / self.align as u64 * self.align as u64;
            let end = (abs + stored as u64).div_ceil(self.align as u64) * self.align as u64;
            self.pread_scratch(start, (end - start) as usize, "record read")?;
            let at = (abs - start) as usize;
            self.scratch.as_slice()[at..at + stored].to_vec()
        };
        let ok = u32::from_le_bytes(word(&rec, 0)) == MAGIC
            && u32::from_le_bytes(word(&rec, 4)) == e.generation
            && u64::from_le_bytes(word(&rec, 8)) == key
            && u64::from_le_bytes(word(&rec, 24)) == e.checksum
            && checksum_of(&rec[HEADER..]) == e.checksum;
        if !ok {
            self.counters.mismatches += 1;
            return Err(KvError::Mismatch {
                key,
                generation: e.generation,
                found: format!(
                    "key {} generation {}",
                    u64::from_le_bytes(word(&rec, 8)),
                    u32::from_le_bytes(word(&rec, 4))
                ),
            });
        }
        Ok(())
    }

    /// Writes every key once.
    pub fn fill(&mut self) -> Result<(), KvError> {
        for key in 0..self.keys() {
            self.put(key)?;
            self.defrag_pending()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_checksums_agree() {
        let mut buf = vec![0u8; 1504];
        let sum = fill_payload(&mut buf, 42, 7);
        assert_eq!(checksum_of(&buf), sum);
        let mut other = vec![0u8; 1504];
        assert_ne!(
            fill_payload(&mut other, 42, 8),
            sum,
            "a new generation has new bytes"
        );
    }
}
