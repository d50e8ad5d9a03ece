//! The null engine: every request completes at once with its full length and no I/O is done.
//! It measures the generator's own cost per I/O (fio's `ioengine=null`).

use super::{
    sleep_until, slot_buffers, AlignedBuffer, Completion, Engine, EngineConfig, EngineError,
    IoRequest, Wait,
};

#[derive(Debug)]
pub struct NullEngine {
    buffers: Vec<AlignedBuffer>,
    queued: Vec<Completion>,
    done: Vec<Completion>,
}

impl NullEngine {
    pub fn new(cfg: &EngineConfig) -> Result<Self, EngineError> {
        Ok(Self {
            buffers: slot_buffers(cfg.slots, cfg.buffer_len, cfg.buffer_align)?,
            queued: Vec::with_capacity(cfg.slots as usize),
            done: Vec::with_capacity(cfg.slots as usize),
        })
    }
}

impl Engine for NullEngine {
    fn buffer_mut(&mut self, slot: u32) -> &mut [u8] {
        self.buffers[slot as usize].as_mut_slice()
    }

    fn queue(&mut self, req: IoRequest) -> Result<(), EngineError> {
        self.queued.push(Completion {
            slot: req.slot,
            result: req.len as i32,
        });
        Ok(())
    }

    fn submit(&mut self) -> Result<(), EngineError> {
        self.done.append(&mut self.queued);
        Ok(())
    }

    fn reap(&mut self, wait: Wait, out: &mut Vec<Completion>) -> Result<(), EngineError> {
        if self.done.is_empty() {
            if let Wait::Until(deadline) = wait {
                sleep_until(deadline);
            }
        }
        out.append(&mut self.done);
        Ok(())
    }

    fn features(&self) -> String {
        "no I/O".into()
    }
}
