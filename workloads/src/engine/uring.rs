//! The io_uring engine: one ring per worker, built on the thread that uses it. Setup walks
//! fio's ladder — single-issuer + defer-taskrun, then coop-taskrun, then plain — and registers
//! the ring fd, the file and the slot buffers when the kernel (and RLIMIT_MEMLOCK) allow,
//! falling back one feature at a time and saying which it got.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};

use super::{
    slot_buffers, AlignedBuffer, Completion, Engine, EngineConfig, EngineError, IoDir, IoRequest,
    Wait,
};

/// How a ring reaches its file and buffers: registered with it where the kernel (and
/// RLIMIT_MEMLOCK) allowed, so a request skips the file lookup and the page pinning.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registered {
    raw_fd: i32,
    /// The file is the ring's registered file 0.
    fixed_file: bool,
    /// Buffer `slot` is the ring's registered buffer `slot`.
    fixed_buffers: bool,
}

impl Registered {
    /// Registers the ring's fd, `raw_fd` and `buffers` (buffer index = slot) with `ring`, each
    /// where allowed, naming what it got in `features`; `fixed_ops`: the kernel has
    /// READ_FIXED/WRITE_FIXED.
    ///
    /// # Safety
    /// `buffers` must stay allocated and unmoved until `ring` is dropped.
    pub(crate) unsafe fn register<'b>(
        ring: &IoUring,
        raw_fd: i32,
        buffers: impl IntoIterator<Item = &'b mut AlignedBuffer>,
        fixed_ops: bool,
        features: &mut Vec<&'static str>,
    ) -> Self {
        if ring.submitter().register_ring_fd().is_ok() {
            features.push("registered ring");
        }
        let fixed_file = ring.submitter().register_files(&[raw_fd]).is_ok();
        if fixed_file {
            features.push("registered file");
        }
        let iovecs: Vec<libc::iovec> = buffers.into_iter().map(AlignedBuffer::iovec).collect();
        // SAFETY: every iovec points into one of `buffers`, which the caller keeps alive and in
        // place for the ring's life.
        let fixed_buffers =
            fixed_ops && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        // Typically RLIMIT_MEMLOCK too small for the pinned pages; plain buffers still work.
        features.push(if fixed_buffers {
            "fixed buffers"
        } else {
            "unregistered buffers"
        });
        Self {
            raw_fd,
            fixed_file,
            fixed_buffers,
        }
    }

    /// The request to read (`write`: write) `len` bytes at `offset` of the file into (from)
    /// `buf`, slot `slot`'s buffer, by the registered file and buffer where there are.
    pub(crate) fn sqe(
        &self,
        write: bool,
        buf: *mut u8,
        len: u32,
        offset: u64,
        slot: u16,
    ) -> squeue::Entry {
        // The opcodes take the registered file and the plain fd as two types (io-uring's
        // target trait is sealed, so no generic function can take either): one body for both.
        macro_rules! entry {
            ($file:expr) => {
                match (write, self.fixed_buffers) {
                    (false, true) => opcode::ReadFixed::new($file, buf, len, slot)
                        .offset(offset)
                        .build(),
                    (true, true) => opcode::WriteFixed::new($file, buf, len, slot)
                        .offset(offset)
                        .build(),
                    (false, false) => opcode::Read::new($file, buf, len).offset(offset).build(),
                    (true, false) => opcode::Write::new($file, buf, len).offset(offset).build(),
                }
            };
        }
        if self.fixed_file {
            entry!(types::Fixed(0))
        } else {
            entry!(types::Fd(self.raw_fd))
        }
    }
}

pub struct UringEngine {
    ring: IoUring<squeue::Entry, cqueue::Entry>,
    buffers: Vec<AlignedBuffer>,
    access: Registered,
    ext_arg: bool,
    unsubmitted: u32,
    features: Vec<&'static str>,
}

impl UringEngine {
    pub fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        let entries = cfg.slots.next_power_of_two().max(2);
        let mut features = Vec::new();
        let ring = build_ring(entries, &mut features).map_err(EngineError::Setup)?;

        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(EngineError::Setup)?;
        if !probe.is_supported(opcode::Read::CODE) || !probe.is_supported(opcode::Write::CODE) {
            return Err(EngineError::Unsupported("IORING_OP_READ/WRITE"));
        }
        let mut buffers = slot_buffers(cfg.slots, cfg.buffer_len, cfg.buffer_align)?;
        // SAFETY: the buffers are owned by this engine, their heap allocations do not move, and
        // the ring is dropped first (field order drops `ring` before `buffers`).
        let access = unsafe {
            Registered::register(
                &ring,
                cfg.file.as_raw_fd(),
                &mut buffers,
                probe.is_supported(opcode::ReadFixed::CODE),
                &mut features,
            )
        };
        let ext_arg = ring.params().is_feature_ext_arg();
        Ok(Self {
            ring,
            buffers,
            access,
            ext_arg,
            unsubmitted: 0,
            features,
        })
    }

    fn drain(&mut self, out: &mut Vec<Completion>) {
        for cqe in self.ring.completion() {
            out.push(Completion {
                slot: cqe.user_data() as u32,
                result: cqe.result(),
            });
        }
    }
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("features", &self.features)
            .finish_non_exhaustive()
    }
}

pub(crate) fn build_ring(
    entries: u32,
    features: &mut Vec<&'static str>,
) -> io::Result<IoUring<squeue::Entry, cqueue::Entry>> {
    let cq = entries * 2;
    let attempt = IoUring::builder()
        .setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries);
    if let Ok(ring) = attempt {
        features.push("single issuer, deferred task work");
        return Ok(ring);
    }
    if let Ok(ring) = IoUring::builder()
        .setup_cqsize(cq)
        .setup_coop_taskrun()
        .build(entries)
    {
        features.push("cooperative task work");
        return Ok(ring);
    }
    IoUring::builder().setup_cqsize(cq).build(entries)
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::ETIME) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}

impl Engine for UringEngine {
    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        self.buffers[slot as usize].as_mut_slice()
    }

    fn queue(&mut self, req: IoRequest) -> Result<(), EngineError> {
        let buf = self.buffers[req.slot as usize].as_mut_ptr();
        let entry = self.access.sqe(
            req.dir == IoDir::Write,
            buf,
            req.len,
            req.offset,
            req.slot as u16,
        );
        let entry = entry.user_data(u64::from(req.slot));
        // The SQ has as many entries as there are slots and a slot is queued at most once
        // before it completes, so the queue cannot be full; if it somehow is, submit first.
        if self.ring.submission().is_full() {
            self.submit()?;
        }
        // SAFETY: the buffer of `req.slot` (and the registered file) stay alive and untouched by
        // us until this slot's completion is reaped: the worker does not reuse a slot in flight,
        // and the engine owns the buffers for its whole life.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| EngineError::Submit(io::Error::other("submission queue full")))?;
        self.unsubmitted += 1;
        Ok(())
    }

    fn submit(&mut self) -> Result<(), EngineError> {
        while self.unsubmitted > 0 {
            match self.ring.submit() {
                Ok(n) => self.unsubmitted = self.unsubmitted.saturating_sub(n as u32),
                Err(e) if is_transient(&e) => return Ok(()),
                Err(e) => return Err(EngineError::Submit(e)),
            }
            if self.ring.submission().is_empty() {
                self.unsubmitted = 0;
            }
        }
        Ok(())
    }

    fn reap(&mut self, wait: Wait, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        self.drain(out);
        if !out.is_empty() {
            return Ok(());
        }
        let waited = match wait {
            Wait::None => self.ring.submit_and_wait(0),
            Wait::One => self.ring.submit_and_wait(1),
            Wait::Until(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    self.ring.submit_and_wait(0)
                } else if self.ext_arg {
                    let ts = types::Timespec::from(left);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    self.ring.submitter().submit_with_args(1, &args)
                } else {
                    // Kernels before 5.11 cannot wait with a timeout: poll in short naps.
                    std::thread::sleep(left.min(std::time::Duration::from_micros(50)));
                    self.ring.submit_and_wait(0)
                }
            }
        };
        match waited {
            Ok(_) => {}
            Err(e) if is_transient(&e) => {}
            Err(e) => return Err(EngineError::Submit(e)),
        }
        self.drain(out);
        Ok(())
    }

    fn features(&self) -> String {
        self.features.join(", ")
    }
}
