//! Page-aligned I/O buffers, as O_DIRECT requires.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use super::EngineError;

/// A heap buffer aligned for direct I/O. Its address never changes, so it can be registered
/// with io_uring and handed to the kernel while the owner keeps the value.
#[derive(Debug)]
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory; moving it between threads is sound.
unsafe impl Send for AlignedBuffer {}
// SAFETY: a shared reference only reads the bytes (`as_slice`); writing needs `&mut self`.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    pub fn new(len: usize, align: usize) -> Result<Self, EngineError> {
        let layout = Layout::from_size_align(len.max(1), align.max(4096))
            .map_err(|_| EngineError::Alloc { bytes: len })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(EngineError::Alloc { bytes: len })?;
        Ok(Self { ptr, layout })
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        self.layout.size() == 0
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn iovec(&mut self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr.as_ptr().cast(),
            iov_len: self.layout.size(),
        }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated by alloc_zeroed with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One buffer per slot, each pre-filled with incompressible bytes.
pub(crate) fn slot_buffers(
    slots: u32,
    len: usize,
    align: usize,
) -> Result<Vec<AlignedBuffer>, EngineError> {
    (0..slots)
        .map(|i| {
            let mut b = AlignedBuffer::new(len, align)?;
            crate::pattern::fill_random(b.as_mut_slice(), 0x5eed ^ u64::from(i));
            Ok(b)
        })
        .collect()
}
