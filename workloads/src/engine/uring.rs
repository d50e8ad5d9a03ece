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

pub struct UringEngine {
    ring: IoUring<squeue::Entry, cqueue::Entry>,
    raw_fd: i32,
    buffers: Vec<AlignedBuffer>,
    fixed_file: bool,
    fixed_buffers: bool,
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
        if ring.submitter().register_ring_fd().is_ok() {
            features.push("registered ring");
        }

        let raw_fd = cfg.file.as_raw_fd();
        let fixed_file = ring.submitter().register_files(&[raw_fd]).is_ok();
        if fixed_file {
            features.push("registered file");
        }

        let mut buffers = slot_buffers(cfg.slots, cfg.buffer_len, cfg.buffer_align)?;
        let iovecs: Vec<libc::iovec> = buffers.iter_mut().map(AlignedBuffer::iovec).collect();
        // SAFETY: every iovec points into an AlignedBuffer owned by this engine, whose heap
        // allocation does not move and outlives the ring (the ring is dropped first: field order
        // drops `ring` before `buffers`).
        let fixed_buffers = probe.is_supported(opcode::ReadFixed::CODE)
            && unsafe { ring.submitter().register_buffers(&iovecs) }.is_ok();
        if fixed_buffers {
            features.push("fixed buffers");
        } else {
            // Typically RLIMIT_MEMLOCK too small for the pinned pages; plain buffers still work.
            features.push("unregistered buffers");
        }
        let ext_arg = ring.params().is_feature_ext_arg();
        Ok(Self {
            ring,
            raw_fd,
            buffers,
            fixed_file,
            fixed_buffers,
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
        let entry = match (req.dir, self.fixed_file, self.fixed_buffers) {
            (IoDir::Read, true, true) => {
                opcode::ReadFixed::new(types::Fixed(0), buf, req.len, req.slot as u16)
                    .offset(req.offset)
                    .build()
            }
            (IoDir::Write, true, true) => {
                opcode::WriteFixed::new(types::Fixed(0), buf, req.len, req.slot as u16)
                    .offset(req.offset)
                    .build()
            }
            (IoDir::Read, true, false) => opcode::Read::new(types::Fixed(0), buf, req.len)
                .offset(req.offset)
                .build(),
            (IoDir::Write, true, false) => opcode::Write::new(types::Fixed(0), buf, req.len)
                .offset(req.offset)
                .build(),
            (IoDir::Read, false, true) => {
                opcode::ReadFixed::new(types::Fd(self.raw_fd), buf, req.len, req.slot as u16)
                    .offset(req.offset)
                    .build()
            }
            (IoDir::Write, false, true) => {
                opcode::WriteFixed::new(types::Fd(self.raw_fd), buf, req.len, req.slot as u16)
                    .offset(req.offset)
                    .build()
            }
            (IoDir::Read, false, false) => opcode::Read::new(types::Fd(self.raw_fd), buf, req.len)
                .offset(req.offset)
                .build(),
            (IoDir::Write, false, false) => {
                opcode::Write::new(types::Fd(self.raw_fd), buf, req.len)
                    .offset(req.offset)
                    .build()
            }
        };
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
