//! The psync engine: blocking pread/pwrite, one I/O at a time, performed when reaped.

use std::os::fd::AsRawFd;

use super::{
    sleep_until, slot_buffers, AlignedBuffer, Completion, Engine, EngineConfig, EngineError, IoDir,
    IoRequest, Wait,
};

#[derive(Debug)]
pub struct PsyncEngine {
    cfg: EngineConfig,
    buffers: Vec<AlignedBuffer>,
    pending: std::collections::VecDeque<IoRequest>,
}

impl PsyncEngine {
    pub fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        Ok(Self {
            buffers: slot_buffers(cfg.slots, cfg.buffer_len, cfg.buffer_align)?,
            cfg: cfg.clone(),
            pending: Default::default(),
        })
    }
}

impl Engine for PsyncEngine {
    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        self.buffers[slot as usize].as_mut_slice()
    }

    fn queue(&mut self, req: IoRequest) -> Result<(), EngineError> {
        self.pending.push_back(req);
        Ok(())
    }

    fn submit(&mut self) -> Result<(), EngineError> {
        Ok(())
    }

    fn reap(&mut self, wait: Wait, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        let Some(req) = self.pending.pop_front() else {
            if let Wait::Until(deadline) = wait {
                sleep_until(deadline);
            }
            return Ok(());
        };
        let fd = self.cfg.file.as_raw_fd();
        let buf = &mut self.buffers[req.slot as usize];
        let ptr = buf.as_mut_ptr();
        let len = req.len as usize;
        debug_assert!(len <= buf.len());
        let offset = req.offset as libc::off_t;
        // SAFETY: ptr points to a live buffer of at least `len` bytes owned by this engine, and
        // the call completes before the buffer can be touched again.
        let n = unsafe {
            match req.dir {
                IoDir::Read => libc::pread(fd, ptr.cast(), len, offset),
                IoDir::Write => libc::pwrite(fd, ptr.cast(), len, offset),
            }
        };
        let result = if n < 0 {
            -std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        } else {
            n as i32
        };
        out.push(Completion {
            slot: req.slot,
            result,
        });
        Ok(())
    }

    fn features(&self) -> String {
        "blocking pread/pwrite".into()
    }
}
