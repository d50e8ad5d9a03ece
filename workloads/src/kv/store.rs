//! A log-structured key-value store with Aerospike's I/O pattern: an index in DRAM, records
//! appended into a large write block that goes to the device in one O_DIRECT write, updates that
//! leave the older copy dead, and a defragmenter that rewrites the live records of blocks whose
//! live fraction fell below a threshold and frees them. Every read is verified against the index.
//!
//! Concurrency: one mutex serializes the store's writers (appends, sealing, defrag) and guards
//! the write buffers and block bookkeeping; no I/O happens under it. The index and block states
//! are atomics (`index.rs`), so a client read of a record on the device takes no lock: it looks
//! the key up, reads, and checks what it read against the index. Clients `put` (an in-memory
//! append) and `get` (synchronous) or `plan_read` + `verify_read` (for asynchronous engines). A full write buffer is sealed into the writer's queue, and one
//! writer thread (`run_writer`) writes sealed blocks in order. One defrag thread (`run_defrag`)
//! reads candidate blocks, re-appends their live records and frees them. Blocks still queued
//! for writing are served from memory.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use io_uring::{opcode, types};

use crate::act::roundup16;
use crate::engine::AlignedBuffer;
use crate::kv::index::{BlockState, BlockStates, Entry, Index, MAX_BLOCKS};

const MAGIC: u32 = u32::from_le_bytes(*b"VGKV");
/// magic u32, generation u32, key u64, length u32, pad u32, checksum u64.
pub const HEADER: usize = 32;
/// Free blocks kept back from clients so the defragmenter can always make progress.
const DEFRAG_RESERVE: usize = 2;
/// Large-block writes the writer keeps in flight.
const WRITES_IN_FLIGHT: usize = 4;
/// Written blocks' buffers kept for reuse (see `State::spare`).
const SPARE_BUFFERS: usize = WRITES_IN_FLIGHT;
/// Large-block reads the defragmenter keeps in flight at most: once more than `DEFRAG_BACKLOG`
/// blocks wait for it; one at a time until then.
const DEFRAG_READS_IN_FLIGHT: usize = 4;
const DEFRAG_BACKLOG: usize = 2;
/// Bytes of sealed blocks allowed to wait for the writer before clients wait too (Aerospike's
/// write cache is 64 MiB by default).
const WRITE_CACHE_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("record size {record} B does not fit a {lb} B large block with its 32-byte header; use a smaller --record-bytes or a larger --lb-bytes")]
    RecordTooLarge { record: u64, lb: u64 },
    #[error(
        "the target holds {blocks} large blocks; the store needs at least 4 (use a larger --size)"
    )]
    TooSmall { blocks: u64 },
    #[error("the target holds {blocks} large blocks; the store's index addresses at most {max} (use a smaller --size or a larger --lb-bytes)")]
    TooLarge { blocks: u64, max: u64 },
    #[error(
        "the store is full: every block is live (lower --fill-pct, raise --defrag-lwm-pct or use a larger --size)"
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
    #[error("the store was stopped")]
    Stopped,
}

#[derive(Clone, Debug)]
pub struct KvConfig {
    /// Bytes of one record, header included.
    pub record_bytes: u64,
    /// With a range, record sizes are uniform in `record_bytes..=record_bytes_max` (ACT's
    /// `record-bytes-range-max`); equal to `record_bytes` for one size.
    pub record_bytes_max: u64,
    /// Large-block size.
    pub lb_bytes: u64,
    /// Blocks whose live fraction falls below this percentage are defragmented.
    pub defrag_lwm_pct: u64,
    /// Large-block writes with O_DSYNC, as ACT does by default.
    pub dsync: bool,
}

impl KvConfig {
    /// Records of the average stored size that fit one large block (ACT's integer division).
    pub fn records_per_block(&self) -> u64 {
        let smallest = KvStore::stored_bytes(self.record_bytes);
        let largest = KvStore::stored_bytes(self.record_bytes_max.max(self.record_bytes));
        self.lb_bytes / ((smallest + largest) / 2)
    }
}

/// What the store did, for rates and checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvCounters {
    pub puts: u64,
    pub gets: u64,
    /// Reads served from memory (the record was not on the device yet).
    pub buffered_gets: u64,
    /// Reads repeated because the record moved while it was being read.
    pub read_retries: u64,
    pub lb_writes: u64,
    pub lb_reads: u64,
    /// Records moved by defragmentation.
    pub relocated: u64,
    pub mismatches: u64,
}

/// The read side's counters, kept outside the lock.
#[derive(Default)]
struct ReadCounters {
    gets: AtomicU64,
    buffered_gets: AtomicU64,
    read_retries: AtomicU64,
    mismatches: AtomicU64,
}

/// Who is sealing a block: clients leave a reserve of free blocks for the defragmenter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Client,
    Defrag,
}

struct PendingWrite {
    block: u32,
    data: Arc<AlignedBuffer>,
    sealed_at: Instant,
    /// Handed to the device (the writer keeps several blocks in flight).
    submitted: bool,
}

struct State {
    /// Live bytes per block.
    live: Vec<u64>,
    free: VecDeque<u32>,
    /// Blocks below the low-water mark, with when they crossed it.
    defrag_queue: VecDeque<(u32, Instant)>,
    /// Blocks taken by the defragmenter and not yet freed (read in flight or relocating).
    defragging: Vec<u32>,
    buf: AlignedBuffer,
    buf_block: u32,
    buf_used: usize,
    writing: VecDeque<PendingWrite>,
    /// Written blocks' buffers, kept for the next blocks to fill: a fresh large buffer each
    /// time is mapped, faulted in page by page and unmapped again (a TLB shootdown of every
    /// CPU), thousands of times a second at high ratings.
    spare: Vec<AlignedBuffer>,
    /// The background threads should stop (the writer drains its queue first).
    stopping: bool,
    counters: KvCounters,
}

pub struct KvStore {
    /// Reads.
    file: Arc<File>,
    /// Large-block writes (reopened with O_DSYNC when asked).
    write_file: File,
    cfg: KvConfig,
    /// Stored size of the smallest and largest record.
    stored_min: u64,
    stored_max: u64,
    align: usize,
    index: Index,
    states: BlockStates,
    reads: ReadCounters,
    state: Mutex<State>,
    /// A block was freed or written, or the store is stopping.
    space: Condvar,
    /// A block was sealed or became a defrag candidate, or the store is stopping.
    work: Condvar,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("cfg", &self.cfg)
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

/// Writes the payload of (key, generation) — deterministic, so every generation differs — and
/// returns its checksum.
fn fill_payload(buf: &mut [u8], key: u64, generation: u32) -> u64 {
    crate::pattern::fill_random(
        buf,
        key ^ (u64::from(generation) << 32) ^ 0x9e37_79b9_7f4a_7c15,
    );
    checksum_of(buf)
}

/// FNV-style fold of a payload's 8-byte words (the last one zero-padded).
fn checksum_of(payload: &[u8]) -> u64 {
    let fold = |sum: u64, x: u64| (sum ^ x).wrapping_mul(0x0000_0100_0000_01b3);
    // Whole words as fixed-size loads (a copy of a variable length per word is a memcpy call
    // each, which was a tenth of a client thread's CPU), then the zero-padded tail.
    let words = payload.chunks_exact(8);
    let tail = words.remainder();
    let mut sum = words.fold(0xcbf2_9ce4_8422_2325, |sum, w| {
        fold(sum, u64::from_le_bytes(w.try_into().expect("8 bytes")))
    });
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        sum = fold(sum, u64::from_le_bytes(word));
    }
    sum
}

fn word<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("in bounds")
}

fn alloc(len: u64, align: usize) -> Result<AlignedBuffer, KvError> {
    AlignedBuffer::new(len as usize, align.max(4096)).map_err(|e| KvError::Io {
        op: "allocate",
        offset: 0,
        len: len as usize,
        err: std::io::Error::other(e.to_string()),
    })
}

/// Submits what is queued on a large-block ring and waits for at least one completion:
/// (user data, result) of every completion there is. An interrupted wait reaps what came.
fn reap(ring: &mut io_uring::IoUring) -> std::io::Result<Vec<(u64, i32)>> {
    if let Err(e) = ring.submit_and_wait(1) {
        if !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN)) {
            return Err(e);
        }
    }
    Ok(ring
        .completion()
        .map(|c| (c.user_data(), c.result()))
        .collect())
}

/// The error of a large-block completion that did not move all `len` bytes.
fn short(res: i32, len: usize, what: &str) -> Option<std::io::Error> {
    if res == len as i32 {
        None
    } else if res < 0 {
        Some(std::io::Error::from_raw_os_error(-res))
    } else {
        Some(std::io::Error::other(format!("short {what} of {res} B")))
    }
}

fn pread_exact(
    file: &File,
    buf: &mut AlignedBuffer,
    offset: u64,
    len: usize,
) -> Result<(), KvError> {
    let op = if len >= 64 << 10 {
        "large-block read"
    } else {
        "record read"
    };
    if len > buf.len() {
        return Err(KvError::Io {
            op,
            offset,
            len,
            err: std::io::Error::other("read larger than its buffer"),
        });
    }
    // SAFETY: the buffer holds at least len bytes (checked above) and outlives the call.
    let n = unsafe {
        libc::pread(
            file.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            len,
            offset as libc::off_t,
        )
    };
    if n != len as isize {
        let err = if n < 0 {
            std::io::Error::last_os_error()
        } else {
            std::io::Error::other(format!("short read of {n} B"))
        };
        return Err(KvError::Io {
            op,
            offset,
            len,
            err,
        });
    }
    Ok(())
}

/// One client operation: the device read's service time (None for a write, or a read served
/// from memory) and the bytes read or appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDone {
    pub service_ns: Option<u64>,
    pub bytes: u64,
    /// Where the device read started on the target (None: served from memory, or a write).
    pub offset: Option<u64>,
}

/// A client read as an asynchronous engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlannedRead {
    /// Served and checked from memory: the record was not on the device yet.
    Done { bytes: u64 },
    /// To be read from the device and checked with `KvStore::verify_read`.
    Device(DeviceRead),
}

/// One aligned device read covering a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRead {
    pub key: u64,
    entry: Entry,
    /// Where the aligned span starts on the target and how long it is.
    pub offset: u64,
    pub len: usize,
    /// The record's place inside the span.
    at: usize,
    retries: u32,
}

/// Where a record's bytes are when a reader looks it up.
enum Location {
    Memory(Vec<u8>),
    Device(u64),
}

impl KvStore {
    /// A store over the first `size` bytes of `file` (opened with O_DIRECT), for keys
    /// 0..`keys`. `align` is the target's direct-I/O alignment.
    pub fn new(
        file: Arc<File>,
        size: u64,
        align: usize,
        cfg: KvConfig,
        keys: u64,
    ) -> Result<Self, KvError> {
        let stored_min = Self::stored_bytes(cfg.record_bytes);
        let stored_max = Self::stored_bytes(cfg.record_bytes_max.max(cfg.record_bytes));
        if stored_max > cfg.lb_bytes {
            return Err(KvError::RecordTooLarge {
                record: cfg.record_bytes_max.max(cfg.record_bytes),
                lb: cfg.lb_bytes,
            });
        }
        let blocks = size / cfg.lb_bytes;
        if blocks < 4 {
            return Err(KvError::TooSmall { blocks });
        }
        if blocks > MAX_BLOCKS {
            return Err(KvError::TooLarge {
                blocks,
                max: MAX_BLOCKS,
            });
        }
        let write_file = if cfg.dsync {
            // O_DSYNC cannot be added with fcntl; reopening the descriptor's own link works for
            // unlinked temp files and devices alike.
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
                .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        } else {
            file.try_clone()
        }
        .map_err(|err| KvError::Io {
            op: "reopen for large-block writes",
            offset: 0,
            len: 0,
            err,
        })?;
        let states = BlockStates::new(blocks);
        states.set(0, BlockState::Open);
        let state = State {
            live: vec![0; blocks as usize],
            free: (1..blocks as u32).collect(),
            defrag_queue: VecDeque::new(),
            defragging: Vec::new(),
            buf: alloc(cfg.lb_bytes, align)?,
            buf_block: 0,
            buf_used: 0,
            writing: VecDeque::new(),
            spare: Vec::new(),
            stopping: false,
            counters: KvCounters::default(),
        };
        Ok(Self {
            file,
            write_file,
            stored_min,
            stored_max,
            align: align.max(512),
            index: Index::new(keys),
            states,
            reads: ReadCounters::default(),
            state: Mutex::new(state),
            space: Condvar::new(),
            work: Condvar::new(),
            cfg,
        })
    }

    /// Bytes a record of `record_bytes` occupies in a block (16-byte units, header included).
    pub fn stored_bytes(record_bytes: u64) -> u64 {
        roundup16(record_bytes.max(HEADER as u64 + 8))
    }

    /// Records of the average stored size that fit one large block.
    pub fn records_per_block(&self) -> u64 {
        self.cfg.records_per_block()
    }

    /// The stored size of `key`'s record at `generation`: the one configured size, or with a
    /// range a size spread uniformly over it (a hash of key and generation, so a relocated copy
    /// keeps its size and each rewrite draws a new one).
    fn record_len(&self, key: u64, generation: u32) -> u64 {
        let span = (self.stored_max - self.stored_min) / 16;
        if span == 0 {
            return self.stored_min;
        }
        let mut h = key ^ (u64::from(generation) << 40) ^ 0x2545_f491_4f6c_dd1d;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        self.stored_min + h % (span + 1) * 16
    }

    pub fn blocks(&self) -> u64 {
        self.states.len() as u64
    }

    pub fn keys(&self) -> u64 {
        self.index.keys()
    }

    /// Bytes of a client read of a record stored at `abs` with `len` bytes: the smallest
    /// aligned span covering it.
    fn read_span(&self, abs: u64, len: u64) -> (u64, u64) {
        let align = self.align as u64;
        let start = abs / align * align;
        (start, (abs + len).div_ceil(align) * align)
    }

    /// Bytes of a client read of the smallest and the largest record when aligned at the
    /// start of a sector (a record straddling a boundary costs one sector more).
    pub fn read_bytes(&self) -> (u64, u64) {
        let covering = |len: u64| len.div_ceil(self.align as u64) * self.align as u64;
        (covering(self.stored_min), covering(self.stored_max))
    }

    pub fn counters(&self) -> KvCounters {
        let mut c = self.lock().counters.clone();
        let r = &self.reads;
        c.gets = r.gets.load(Ordering::Relaxed);
        c.buffered_gets = r.buffered_gets.load(Ordering::Relaxed);
        c.read_retries = r.read_retries.load(Ordering::Relaxed);
        c.mismatches = r.mismatches.load(Ordering::Relaxed);
        c
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking holder leaves counters, not invariants the readers rely on, half-done;
        // the run that panicked fails anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn below_lwm(&self, live: u64) -> bool {
        live * 100 < self.cfg.defrag_lwm_pct * self.cfg.lb_bytes
    }

    /// Writes a new generation of `key`: an append into the write buffer. Returns the
    /// record's stored size.
    pub fn put(&self, key: u64) -> Result<u64, KvError> {
        let mut g = self.lock();
        let generation = self
            .index
            .get(key)
            .map_err(|()| KvError::Missing(key))?
            .map_or(1, |e| e.generation + 1);
        let len = self.record_len(key, generation);
        g = self.append(g, key, generation, len as usize, None, Role::Client)?;
        g.counters.puts += 1;
        Ok(len)
    }

    /// Appends a record to the write buffer (copying `existing` bytes when relocating), updates
    /// the index and marks the older copy dead.
    fn append<'a>(
        &'a self,
        mut g: MutexGuard<'a, State>,
        key: u64,
        generation: u32,
        stored: usize,
        existing: Option<&[u8]>,
        role: Role,
    ) -> Result<MutexGuard<'a, State>, KvError> {
        if g.buf_used + stored > self.cfg.lb_bytes as usize {
            g = self.seal(g, role, stored)?;
        }
        let st = &mut *g;
        let at = st.buf_used;
        let rec = &mut st.buf.as_mut_slice()[at..at + stored];
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
                rec[16..20].copy_from_slice(&(stored as u32).to_le_bytes());
                rec[20..24].copy_from_slice(&0u32.to_le_bytes());
                rec[24..32].copy_from_slice(&sum.to_le_bytes());
                sum
            }
        };
        st.buf_used += stored;
        if let Ok(Some(old)) = self.index.get(key) {
            let b = old.block as usize;
            st.live[b] = st.live[b].saturating_sub(u64::from(old.len));
            if self.states.get(old.block) == BlockState::Sealed
                && self.below_lwm(st.live[b])
                && !st.defrag_queue.iter().any(|(q, _)| *q == old.block)
            {
                st.defrag_queue.push_back((old.block, Instant::now()));
                self.work.notify_all();
            }
        }
        let open = st.buf_block;
        st.live[open as usize] += stored as u64;
        self.index.set(
            key,
            Entry {
                block: open,
                offset: at as u32,
                len: stored as u32,
                generation,
                checksum_low: checksum as u32,
            },
        );
        Ok(g)
    }

    /// Hands the full write buffer to the writer and opens a free block, waiting for the
    /// defragmenter to free one when clients have used theirs.
    fn seal<'a>(
        &'a self,
        mut g: MutexGuard<'a, State>,
        role: Role,
        next_record: usize,
    ) -> Result<MutexGuard<'a, State>, KvError> {
        let reserve = if role == Role::Client {
            DEFRAG_RESERVE
        } else {
            0
        };
        loop {
            // Another thread may have sealed the buffer while this one waited for space.
            if g.buf_used + next_record <= self.cfg.lb_bytes as usize {
                return Ok(g);
            }
            if g.stopping && role == Role::Client {
                return Err(KvError::Stopped);
            }
            // At most a quarter of a small store waits in memory.
            let cache_blocks = (WRITE_CACHE_BYTES / self.cfg.lb_bytes)
                .min(self.states.len() as u64 / 4)
                .max(4) as usize;
            let writer_has_room = role == Role::Defrag || g.writing.len() < cache_blocks;
            if g.free.len() > reserve && writer_has_room {
                break;
            }
            let nothing_to_free =
                g.defrag_queue.is_empty() && g.defragging.is_empty() && g.writing.is_empty();
            if role == Role::Defrag || nothing_to_free {
                return Err(KvError::Full);
            }
            g = self
                .space
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let next = g.free.pop_front().expect("checked above");
        let fresh = match g.spare.pop() {
            Some(buf) => buf,
            None => alloc(self.cfg.lb_bytes, self.align)?,
        };
        let st = &mut *g;
        // Unused tail bytes of a block are zeroes: no header, so defrag stops there.
        let used = st.buf_used;
        st.buf.as_mut_slice()[used..].fill(0);
        let full = std::mem::replace(&mut st.buf, fresh);
        let sealed = st.buf_block;
        self.states.set(sealed, BlockState::Writing);
        st.writing.push_back(PendingWrite {
            block: sealed,
            data: Arc::new(full),
            sealed_at: Instant::now(),
            submitted: false,
        });
        st.buf_block = next;
        st.buf_used = 0;
        self.states.set(next, BlockState::Open);
        self.work.notify_all();
        Ok(g)
    }

    /// The writer: writes sealed blocks as they come, one large-block write each and up to
    /// `WRITES_IN_FLIGHT` at once through an io_uring ring (synchronously, one at a time, where
    /// io_uring is unavailable), calling `observe(offset, service_ns)` per write, until
    /// `stop_background` and the queue is empty. A block is on the device (and readable from
    /// there) once its own write completed, whatever the order.
    pub fn run_writer(&self, mut observe: impl FnMut(u64, u64)) -> Result<(), KvError> {
        let Ok(mut ring) =
            crate::engine::build_ring(WRITES_IN_FLIGHT.next_power_of_two() as u32, &mut Vec::new())
        else {
            return self.run_writer_sync(observe);
        };
        let fd = types::Fd(self.write_file.as_raw_fd());
        let len = self.cfg.lb_bytes as usize;
        // Blocks in flight: their buffers stay referenced here until their writes complete.
        let mut in_flight: Vec<(u32, Arc<AlignedBuffer>, Instant)> = Vec::new();
        let mut failed = None;
        loop {
            let next: Vec<(u32, Arc<AlignedBuffer>)> = {
                let mut g = self.lock();
                loop {
                    let room = WRITES_IN_FLIGHT - in_flight.len();
                    let next: Vec<_> = g
                        .writing
                        .iter_mut()
                        .filter(|p| !p.submitted)
                        .take(if failed.is_some() { 0 } else { room })
                        .map(|p| {
                            p.submitted = true;
                            (p.block, Arc::clone(&p.data))
                        })
                        .collect();
                    if !next.is_empty() || !in_flight.is_empty() {
                        break next;
                    }
                    if let Some(e) = failed {
                        return Err(e);
                    }
                    // A defragmenter between its read and its relocation may still seal a block.
                    if g.stopping && g.writing.is_empty() && g.defragging.is_empty() {
                        return Ok(());
                    }
                    g = self.work.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            for (block, data) in next {
                let offset = u64::from(block) * self.cfg.lb_bytes;
                let sqe = opcode::Write::new(fd, data.as_slice().as_ptr(), len as u32)
                    .offset(offset)
                    .build()
                    .user_data(u64::from(block));
                // SAFETY: `data` holds lb_bytes bytes and is kept alive in `in_flight` until
                // this write's completion is reaped (the loop returns only with nothing in
                // flight); the ring has room for WRITES_IN_FLIGHT entries.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    unreachable!("at most WRITES_IN_FLIGHT writes are queued");
                }
                in_flight.push((block, data, Instant::now()));
            }
            let done = match reap(&mut ring) {
                Ok(done) => done,
                Err(e) => {
                    // The ring cannot be waited on: keep the buffers (leaked) rather than free
                    // memory the kernel may still be reading.
                    std::mem::forget(std::mem::take(&mut in_flight));
                    return Err(self.writer_failed(0, len, e));
                }
            };
            for (tag, res) in done {
                let block = tag as u32;
                let Some(at) = in_flight.iter().position(|(b, _, _)| *b == block) else {
                    continue;
                };
                let (_, data, started) = in_flight.swap_remove(at);
                let offset = u64::from(block) * self.cfg.lb_bytes;
                if let Some(err) = short(res, len, "write") {
                    failed.get_or_insert(self.writer_failed(offset, len, err));
                    continue;
                }
                if failed.is_none() {
                    observe(offset, started.elapsed().as_nanos() as u64);
                    self.block_written(block, data);
                }
            }
        }
    }

    /// The writer's fallback without io_uring: one synchronous write at a time, in order.
    fn run_writer_sync(&self, mut observe: impl FnMut(u64, u64)) -> Result<(), KvError> {
        let len = self.cfg.lb_bytes as usize;
        loop {
            let (block, data) = {
                let mut g = self.lock();
                loop {
                    if let Some(p) = g.writing.front_mut() {
                        p.submitted = true;
                        break (p.block, Arc::clone(&p.data));
                    }
                    if g.stopping && g.defragging.is_empty() {
                        return Ok(());
                    }
                    g = self.work.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            let offset = u64::from(block) * self.cfg.lb_bytes;
            let started = Instant::now();
            // SAFETY: `data` holds lb_bytes bytes, is only read while shared, and lives until the
            // call returns.
            let n = unsafe {
                libc::pwrite(
                    self.write_file.as_raw_fd(),
                    data.as_slice().as_ptr().cast(),
                    len,
                    offset as libc::off_t,
                )
            };
            let service_ns = started.elapsed().as_nanos() as u64;
            if n != len as isize {
                return Err(self.writer_failed(offset, len, std::io::Error::last_os_error()));
            }
            observe(offset, service_ns);
            self.block_written(block, data);
        }
    }

    /// A sealed block's write of `data` completed: it is read from the device from now on,
    /// and its buffer is kept for a later block.
    fn block_written(&self, block: u32, data: Arc<AlignedBuffer>) {
        let mut g = self.lock();
        if let Some(at) = g.writing.iter().position(|p| p.block == block) {
            g.writing.remove(at);
        }
        // Readers copy out of a writing block under the lock, so this is the last reference.
        if let Ok(buf) = Arc::try_unwrap(data) {
            if g.spare.len() < SPARE_BUFFERS {
                g.spare.push(buf);
            }
        }
        self.states.set(block, BlockState::Sealed);
        g.counters.lb_writes += 1;
        if self.below_lwm(g.live[block as usize]) {
            g.defrag_queue.push_back((block, Instant::now()));
        }
        self.space.notify_all();
        self.work.notify_all();
    }

    /// A large-block write failed: the store stops (waiting clients give up).
    fn writer_failed(&self, offset: u64, len: usize, err: std::io::Error) -> KvError {
        let err = KvError::Io {
            op: "large-block write",
            offset,
            len,
            err,
        };
        self.halt(self.lock(), err)
    }

    /// The defragmenter: takes blocks below the low-water mark, reads each with one large-block
    /// read (`observe(offset, service_ns)`), re-appends its live records and frees it. Reads go through
    /// an io_uring ring (synchronously where io_uring is unavailable): one at a time while the
    /// defragmenter keeps up, up to `DEFRAG_READS_IN_FLIGHT` once candidates back up, so a
    /// saturated device queue shared with the clients' reads does not hold the defragmenter —
    /// and the large-block writes it feeds — to one queue wait per block. Relocations stay
    /// serial, under the store's lock.
    pub fn run_defrag(&self, mut observe: impl FnMut(u64, u64)) -> Result<(), KvError> {
        let Ok(mut ring) = crate::engine::build_ring(
            DEFRAG_READS_IN_FLIGHT.next_power_of_two() as u32,
            &mut Vec::new(),
        ) else {
            return self.run_defrag_sync(observe);
        };
        let fd = types::Fd(self.file.as_raw_fd());
        let len = self.cfg.lb_bytes as usize;
        let mut spare = (0..DEFRAG_READS_IN_FLIGHT)
            .map(|_| alloc(self.cfg.lb_bytes, self.align))
            .collect::<Result<Vec<_>, _>>()?;
        // One large-block read of `block` into `buf`, tagged with the block.
        let read_block = |buf: &mut AlignedBuffer, block: u32| {
            opcode::Read::new(fd, buf.as_mut_ptr(), len as u32)
                .offset(u64::from(block) * self.cfg.lb_bytes)
                .build()
                .user_data(u64::from(block))
        };
        // Reads in flight: each buffer stays here until its read completes.
        let mut in_flight: Vec<(u32, AlignedBuffer, Instant)> = Vec::new();
        let mut failed: Option<KvError> = None;
        loop {
            let next: Vec<u32> = {
                let mut g = self.lock();
                loop {
                    // One read at a time, as ACT's defragmenter, while it keeps up: a burst of
                    // large reads would queue the clients' small ones behind it. More only
                    // once candidates back up (a saturated device).
                    let allowed = if g.defrag_queue.len() > DEFRAG_BACKLOG {
                        DEFRAG_READS_IN_FLIGHT
                    } else {
                        1
                    };
                    let room = if failed.is_some() || g.stopping {
                        0
                    } else {
                        allowed.saturating_sub(in_flight.len())
                    };
                    let next: Vec<u32> = std::iter::from_fn(|| self.take_candidate(&mut g))
                        .take(room)
                        .collect();
                    if !next.is_empty() || !in_flight.is_empty() {
                        break next;
                    }
                    if let Some(e) = failed {
                        return Err(self.halt(g, e));
                    }
                    if g.stopping {
                        return Ok(());
                    }
                    g = self.work.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            for block in next {
                let mut buf = spare.pop().expect("one spare buffer per block taken");
                let sqe = read_block(&mut buf, block);
                // SAFETY: `buf` holds lb_bytes bytes and stays in `in_flight` (heap memory that
                // does not move with the struct) until this read's completion is reaped; the
                // ring has room for DEFRAG_READS_IN_FLIGHT entries.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    unreachable!("at most DEFRAG_READS_IN_FLIGHT reads are queued");
                }
                in_flight.push((block, buf, Instant::now()));
            }
            let done = match reap(&mut ring) {
                Ok(done) => done,
                Err(e) => {
                    // The ring cannot be waited on: keep the buffers (leaked) rather than free
                    // memory the kernel may still be writing.
                    std::mem::forget(std::mem::take(&mut in_flight));
                    let err = KvError::Io {
                        op: "large-block read",
                        offset: 0,
                        len,
                        err: e,
                    };
                    return Err(self.halt(self.lock(), err));
                }
            };
            for (tag, res) in done {
                let block = tag as u32;
                let Some(at) = in_flight.iter().position(|(b, _, _)| *b == block) else {
                    continue;
                };
                let offset = u64::from(block) * self.cfg.lb_bytes;
                if res == -libc::EAGAIN {
                    let sqe = read_block(&mut in_flight[at].1, block);
                    // SAFETY: as above; this read's own entry was just reaped, so there is room.
                    if unsafe { ring.submission().push(&sqe) }.is_err() {
                        unreachable!("a reaped read leaves room for its retry");
                    }
                    continue;
                }
                let (_, buf, started) = in_flight.swap_remove(at);
                if let Some(err) = short(res, len, "read") {
                    self.lock().defragging.retain(|b| *b != block);
                    failed.get_or_insert(KvError::Io {
                        op: "large-block read",
                        offset,
                        len,
                        err,
                    });
                    spare.push(buf);
                    continue;
                }
                if failed.is_none() {
                    observe(offset, started.elapsed().as_nanos() as u64);
                    if let Err(e) = self.relocate(block, buf.as_slice()) {
                        failed.get_or_insert(e);
                    }
                } else {
                    self.lock().defragging.retain(|b| *b != block);
                }
                spare.push(buf);
            }
        }
    }

    /// The defragmenter's fallback without io_uring: one synchronous read at a time.
    fn run_defrag_sync(&self, mut observe: impl FnMut(u64, u64)) -> Result<(), KvError> {
        let len = self.cfg.lb_bytes as usize;
        let mut scratch = alloc(self.cfg.lb_bytes, self.align)?;
        loop {
            let block = {
                let mut g = self.lock();
                loop {
                    if g.stopping {
                        return Ok(());
                    }
                    if let Some(b) = self.take_candidate(&mut g) {
                        break b;
                    }
                    g = self.work.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            let offset = u64::from(block) * self.cfg.lb_bytes;
            let started = Instant::now();
            if let Err(e) = pread_exact(&self.file, &mut scratch, offset, len) {
                let mut g = self.lock();
                g.defragging.retain(|b| *b != block);
                return Err(self.halt(g, e));
            }
            observe(offset, started.elapsed().as_nanos() as u64);
            self.relocate(block, scratch.as_slice())?;
        }
    }

    /// The next block to defragment, marked as being defragmented. A queued block may have been
    /// refilled, freed or taken already since it was queued: it is judged as it is now.
    fn take_candidate(&self, g: &mut State) -> Option<u32> {
        while let Some((b, _)) = g.defrag_queue.pop_front() {
            if self.states.get(b) == BlockState::Sealed
                && self.below_lwm(g.live[b as usize])
                && !g.defragging.contains(&b)
            {
                g.defragging.push(b);
                return Some(b);
            }
        }
        None
    }

    /// A background thread failed with `err`: the store stops (waiting clients give up).
    fn halt(&self, mut g: MutexGuard<'_, State>, err: KvError) -> KvError {
        g.stopping = true;
        self.space.notify_all();
        self.work.notify_all();
        err
    }

    /// Re-appends the live records of `block` (its bytes as read from the device in `data`)
    /// and frees it.
    fn relocate(&self, block: u32, data: &[u8]) -> Result<(), KvError> {
        let len = data.len();
        let mut g = self.lock();
        g.counters.lb_reads += 1;
        // Records lie back to back, each header giving its stored length; the zeroed tail
        // has no magic.
        let mut at = 0;
        while at + HEADER <= len {
            let head = &data[at..at + HEADER];
            let stored = u32::from_le_bytes(word(head, 16)) as usize;
            if u32::from_le_bytes(word(head, 0)) != MAGIC || stored < HEADER || at + stored > len {
                break;
            }
            let rec = &data[at..at + stored];
            let next = at + stored;
            let generation = u32::from_le_bytes(word(rec, 4));
            let key = u64::from_le_bytes(word(rec, 8));
            let current = self.index.get(key).ok().flatten();
            if current.is_some_and(|e| {
                e.block == block && e.offset as usize == at && e.generation == generation
            }) {
                g = match self.append(g, key, generation, stored, Some(rec), Role::Defrag) {
                    Ok(g) => g,
                    Err(e) => {
                        let mut g = self.lock();
                        g.defragging.retain(|b| *b != block);
                        return Err(self.halt(g, e));
                    }
                };
                g.counters.relocated += 1;
            }
            at = next;
        }
        g.live[block as usize] = 0;
        self.states.set(block, BlockState::Free);
        g.free.push_back(block);
        g.defragging.retain(|b| *b != block);
        self.space.notify_all();
        // A stopping writer waits for this relocation's sealed blocks.
        self.work.notify_all();
        Ok(())
    }

    /// Lets the background threads run (again) after `stop_background`.
    pub fn start_background(&self) {
        self.lock().stopping = false;
    }

    /// Asks the writer to finish its queue and the defragmenter to stop; waiting clients give up.
    pub fn stop_background(&self) {
        self.lock().stopping = true;
        self.space.notify_all();
        self.work.notify_all();
    }

    /// How long the oldest sealed block has waited for the writer, and the oldest defrag
    /// candidate for the defragmenter.
    pub fn backlog(&self) -> (Duration, Duration) {
        let g = self.lock();
        let age = |t: Option<Instant>| t.map_or(Duration::ZERO, |t| t.elapsed());
        (
            age(g.writing.front().map(|p| p.sealed_at)),
            age(g.defrag_queue.front().map(|(_, t)| *t)),
        )
    }

    /// Waits until at most `candidates` blocks wait for the defragmenter or are being
    /// defragmented and at most `pending` for the writer: the loader's pace, so defrag handles blocks as they cross the low-water
    /// mark, as it does at a sustainable load, instead of in a backlog.
    pub fn wait_caught_up(&self, candidates: usize, pending: usize) {
        let mut g = self.lock();
        while !g.stopping
            && (g.defrag_queue.len() + g.defragging.len() > candidates || g.writing.len() > pending)
        {
            g = self
                .space
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sealed blocks waiting for the writer, and blocks waiting for the defragmenter.
    pub fn pending_blocks(&self) -> (u64, u64) {
        let g = self.lock();
        (g.writing.len() as u64, g.defrag_queue.len() as u64)
    }

    /// Blocks free for new data.
    pub fn free_blocks(&self) -> u64 {
        self.lock().free.len() as u64
    }

    /// Reads `key` with one aligned read of the smallest direct-I/O size covering its record
    /// into `scratch` (or from memory if it is not on the device yet) and checks it against the
    /// index.
    pub fn get(&self, key: u64, scratch: &mut AlignedBuffer) -> Result<OpDone, KvError> {
        let mut retries = 0;
        loop {
            let (entry, location) = self.locate(key)?;
            let (rec, done) = self.fetch(location, entry.len as usize, scratch)?;
            if self.check(key, entry, &rec, &mut retries)? {
                return Ok(done);
            }
        }
    }

    /// The key's current entry, read without the lock.
    fn entry(&self, key: u64) -> Result<Entry, KvError> {
        self.index
            .get(key)
            .ok()
            .flatten()
            .ok_or(KvError::Missing(key))
    }

    /// Where `key`'s current record is, copied out when it is still in memory. A record on the
    /// device is found without the lock; one in a write buffer (or in a block that is changing
    /// state) is settled under it.
    fn locate(&self, key: u64) -> Result<(Entry, Location), KvError> {
        let e = self.entry(key)?;
        self.reads.gets.fetch_add(1, Ordering::Relaxed);
        let on_device =
            |e: &Entry| Location::Device(u64::from(e.block) * self.cfg.lb_bytes + e.offset as u64);
        if self.states.get(e.block) == BlockState::Sealed {
            return Ok((e, on_device(&e)));
        }
        let g = self.lock();
        let e = self.entry(key)?;
        let (at, stored) = (e.offset as usize, e.len as usize);
        // The block's state says where it is, so the writer's queue is searched only for
        // blocks actually in it.
        let location = if e.block == g.buf_block {
            Location::Memory(g.buf.as_slice()[at..at + stored].to_vec())
        } else if self.states.get(e.block) == BlockState::Writing {
            let p = g
                .writing
                .iter()
                .find(|p| p.block == e.block)
                .expect("a Writing block is in the writer's queue");
            Location::Memory(p.data.as_slice()[at..at + stored].to_vec())
        } else {
            on_device(&e)
        };
        if matches!(location, Location::Memory(_)) {
            self.reads.buffered_gets.fetch_add(1, Ordering::Relaxed);
        }
        Ok((e, location))
    }

    /// The record's bytes: from memory, or one aligned device read (outside the lock), checked
    /// in place in `scratch`.
    fn fetch<'s>(
        &self,
        location: Location,
        stored: usize,
        scratch: &'s mut AlignedBuffer,
    ) -> Result<(Cow<'s, [u8]>, OpDone), KvError> {
        Ok(match location {
            Location::Memory(rec) => (
                Cow::Owned(rec),
                OpDone {
                    service_ns: None,
                    bytes: stored as u64,
                    offset: None,
                },
            ),
            Location::Device(abs) => {
                let (start, end) = self.read_span(abs, stored as u64);
                let started = Instant::now();
                pread_exact(&self.file, scratch, start, (end - start) as usize)?;
                let ns = started.elapsed().as_nanos() as u64;
                let at = (abs - start) as usize;
                (
                    Cow::Borrowed(&scratch.as_slice()[at..at + stored]),
                    OpDone {
                        service_ns: Some(ns),
                        bytes: end - start,
                        offset: Some(start),
                    },
                )
            }
        })
    }

    /// Ok(true): `rec` is `entry`. Ok(false): it is not, but the index moved the record while
    /// it was read (defrag, block reused), so read again. Err: a copy the index still points at
    /// is wrong — data loss.
    fn check(
        &self,
        key: u64,
        entry: Entry,
        rec: &[u8],
        retries: &mut u32,
    ) -> Result<bool, KvError> {
        if Self::matches(rec, key, &entry) {
            return Ok(true);
        }
        let mut now = self.index.get(key).ok().flatten();
        if now == Some(entry) {
            // A writer may be between the entry's two words: read it again once the writer is
            // done with it (writers hold the lock) before calling this data loss.
            let _writers_done = self.lock();
            now = self.index.get(key).ok().flatten();
        }
        if now != Some(entry) && *retries < 16 {
            self.reads.read_retries.fetch_add(1, Ordering::Relaxed);
            self.reads.gets.fetch_sub(1, Ordering::Relaxed);
            *retries += 1;
            return Ok(false);
        }
        self.reads.mismatches.fetch_add(1, Ordering::Relaxed);
        Err(KvError::Mismatch {
            key,
            generation: entry.generation,
            found: format!(
                "key {} generation {}",
                u64::from_le_bytes(word(rec, 8)),
                u32::from_le_bytes(word(rec, 4))
            ),
        })
    }

    /// The header names this key and generation, and the payload is the one whose checksum
    /// the header and the index hold.
    fn matches(rec: &[u8], key: u64, e: &Entry) -> bool {
        if rec.len() < HEADER {
            return false;
        }
        let checksum = u64::from_le_bytes(word(rec, 24));
        u32::from_le_bytes(word(rec, 0)) == MAGIC
            && u32::from_le_bytes(word(rec, 4)) == e.generation
            && u64::from_le_bytes(word(rec, 8)) == key
            && checksum as u32 == e.checksum_low
            && checksum_of(&rec[HEADER..]) == checksum
    }

    /// Starts a client read of `key` for an asynchronous engine: either the record, copied
    /// from memory (already checked, `PlannedRead::Done`), or the aligned span to read from the
    /// device, to be checked with `verify_read` once read.
    pub fn plan_read(&self, key: u64) -> Result<PlannedRead, KvError> {
        let mut retries = 0;
        loop {
            let (entry, location) = self.locate(key)?;
            match location {
                Location::Memory(rec) => {
                    if self.check(key, entry, &rec, &mut retries)? {
                        return Ok(PlannedRead::Done {
                            bytes: rec.len() as u64,
                        });
                    }
                }
                Location::Device(abs) => {
                    let (start, end) = self.read_span(abs, u64::from(entry.len));
                    return Ok(PlannedRead::Device(DeviceRead {
                        key,
                        entry,
                        offset: start,
                        len: (end - start) as usize,
                        at: (abs - start) as usize,
                        retries,
                    }));
                }
            }
        }
    }

    /// Checks a device read planned by `plan_read` whose bytes are `data` (the whole span).
    /// Ok(None): the record is good. Ok(Some(plan)): it moved while being read; issue `plan`
    /// instead (a record now in memory is checked at once and comes back as `Done`).
    pub fn verify_read(
        &self,
        read: &DeviceRead,
        data: &[u8],
    ) -> Result<Option<PlannedRead>, KvError> {
        let stored = read.entry.len as usize;
        let rec = data.get(read.at..read.at + stored).unwrap_or(&[]);
        let mut retries = read.retries;
        if self.check(read.key, read.entry, rec, &mut retries)? {
            return Ok(None);
        }
        let mut next = self.plan_read(read.key)?;
        if let PlannedRead::Device(d) = &mut next {
            d.retries += retries;
        }
        Ok(Some(next))
    }

    /// A buffer large enough for any client read.
    pub fn read_buffer(&self) -> Result<AlignedBuffer, KvError> {
        alloc(self.read_bytes().1 + self.align as u64, self.align)
    }

    /// The descriptor client reads go to (O_DIRECT).
    pub fn read_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of 8 blocks of 1536-byte records on a plain temp file (the logic under test
    /// does not depend on O_DIRECT), with its writer and defragmenter running inside `body`.
    fn with_store(keys: u64, body: impl FnOnce(&KvStore)) {
        with_store_of(1 << 20, keys, body)
    }

    fn with_store_of(size: u64, keys: u64, body: impl FnOnce(&KvStore)) {
        let file = tempfile::tempfile().unwrap();
        file.set_len(size).unwrap();
        let cfg = KvConfig {
            record_bytes: 1536,
            record_bytes_max: 1536,
            lb_bytes: 128 << 10,
            defrag_lwm_pct: 50,
            dsync: false,
        };
        let store = KvStore::new(Arc::new(file), size, 512, cfg, keys).unwrap();
        std::thread::scope(|s| {
            store.start_background();
            let w = s.spawn(|| store.run_writer(|_, _| {}));
            let d = s.spawn(|| store.run_defrag(|_, _| {}));
            body(&store);
            store.stop_background();
            w.join().unwrap().unwrap();
            d.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_read_racing_defrag_and_block_reuse_retries_instead_of_failing() {
        with_store(100, |store| {
            for key in 0..100 {
                store.put(key).unwrap();
            }
            store.wait_caught_up(0, 0);
            // Key 0 sits in block 0, on the device. A reader finds it there...
            let (entry, location) = store.locate(0).unwrap();
            assert_eq!(entry.block, 0);
            assert!(matches!(location, Location::Device(_)));
            // ...then, before its read lands, overwrites empty block 0, defrag moves key 0 out
            // and frees the block, and the block is reused for other records.
            let mut i = 0;
            loop {
                store.put(1 + i % 50).unwrap();
                i += 1;
                store.wait_caught_up(0, 0);
                let _g = store.lock();
                let moved = store.index.get(0).unwrap().is_some_and(|e| e.block != 0);
                if moved && store.states.get(0) == BlockState::Sealed {
                    break;
                }
                assert!(i < 10_000, "block 0 was never reused");
            }
            let mut scratch = store.read_buffer().unwrap();
            let (rec, _) = store
                .fetch(location, entry.len as usize, &mut scratch)
                .unwrap();
            let mut retries = 0;
            assert!(
                !store.check(0, entry, &rec, &mut retries).unwrap(),
                "read again"
            );
            assert_eq!(store.counters().read_retries, 1);
            store.get(0, &mut scratch).unwrap();
            assert_eq!(store.counters().mismatches, 0);
        });
    }

    #[test]
    fn a_reader_meeting_a_half_written_entry_retries_instead_of_calling_it_data_loss() {
        with_store(100, |store| {
            for key in 0..100 {
                store.put(key).unwrap();
            }
            store.wait_caught_up(0, 0);
            let (entry, location) = store.locate(7).unwrap();
            assert!(matches!(location, Location::Device(_)));
            let mut scratch = store.read_buffer().unwrap();
            let (rec, _) = store
                .fetch(location, entry.len as usize, &mut scratch)
                .unwrap();
            // A writer, holding the lock, has stored the entry's new version word but not yet
            // its new location: a lock-free reader sees the old place with the new generation.
            let torn = Entry {
                generation: entry.generation + 1,
                ..entry
            };
            let (stored, proceed) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _writing = store.lock();
                    store.index.set(7, torn);
                    stored.wait();
                    proceed.wait();
                    std::thread::sleep(Duration::from_millis(50));
                    store.index.set(7, entry);
                });
                stored.wait();
                assert_eq!(store.index.get(7), Ok(Some(torn)));
                proceed.wait();
                let mut retries = 0;
                assert!(
                    !store.check(7, torn, &rec, &mut retries).unwrap(),
                    "the entry changed once the writer was done: read again"
                );
            });
            assert_eq!(store.counters().mismatches, 0);
            store.get(7, &mut scratch).unwrap();
        });
    }

    #[test]
    fn a_corrupted_record_the_index_still_points_at_is_data_loss() {
        with_store(100, |store| {
            for key in 0..100 {
                store.put(key).unwrap();
            }
            store.wait_caught_up(0, 0);
            let (entry, _) = store.locate(5).unwrap();
            let at = u64::from(entry.block) * (128 << 10) + u64::from(entry.offset) + 40;
            std::os::unix::fs::FileExt::write_all_at(&*store.file, b"garbage!", at).unwrap();
            let mut scratch = store.read_buffer().unwrap();
            let e = store.get(5, &mut scratch).unwrap_err();
            assert!(matches!(e, KvError::Mismatch { key: 5, .. }), "{e}");
            assert_eq!(store.counters().mismatches, 1);
        });
    }

    #[test]
    fn blocks_defragmented_together_are_each_freed_once_and_lose_no_record() {
        // 32 blocks; ten filled, then half of every block's records rewritten so they all cross
        // the low-water mark at about the same time and several reads are in flight at once.
        let keys = 850;
        with_store_of(32 * (128 << 10), keys, |store| {
            for key in 0..keys {
                store.put(key).unwrap();
            }
            store.wait_caught_up(0, 0);
            for round in 0..4 {
                for key in (round % 2..keys).step_by(2) {
                    store.put(key).unwrap();
                }
                store.wait_caught_up(0, 0);
            }
            let g = store.lock();
            let mut free: Vec<u32> = g.free.iter().copied().collect();
            free.sort_unstable();
            let listed = free.len();
            free.dedup();
            assert_eq!(free.len(), listed, "a block is on the free list twice");
            for b in &free {
                assert_eq!(store.states.get(*b), BlockState::Free);
                assert_eq!(g.live[*b as usize], 0);
            }
            let in_use = (0..32)
                .filter(|b| store.states.get(*b) != BlockState::Free)
                .count();
            assert_eq!(
                in_use + free.len(),
                32,
                "every block is free or in use, once"
            );
            assert!(
                g.counters.lb_reads >= 10,
                "{} blocks defragmented",
                g.counters.lb_reads
            );
            assert!(g.counters.relocated > 0);
            drop(g);
            let mut scratch = store.read_buffer().unwrap();
            for key in 0..keys {
                store.get(key, &mut scratch).unwrap();
            }
            assert_eq!(store.counters().mismatches, 0);
        });
    }

    #[test]
    fn the_word_at_a_time_checksum_and_fill_equal_their_definitions() {
        // The definitions, a byte at a time: payloads on the device were written by them.
        let checksum = |p: &[u8]| {
            let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
            for chunk in p.chunks(8) {
                let mut word = [0u8; 8];
                word[..chunk.len()].copy_from_slice(chunk);
                sum = (sum ^ u64::from_le_bytes(word)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            sum
        };
        let fill = |buf: &mut [u8], seed: u64| {
            let mut x = seed | 1;
            for chunk in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
        };
        for len in (0..=24).chain([1501, 1504]) {
            let (mut ours, mut theirs) = (vec![0u8; len], vec![0u8; len]);
            crate::pattern::fill_random(&mut ours, 99 + len as u64);
            fill(&mut theirs, 99 + len as u64);
            assert_eq!(ours, theirs, "fill of {len} B");
            assert_eq!(checksum_of(&ours), checksum(&ours), "checksum of {len} B");
        }
    }

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
