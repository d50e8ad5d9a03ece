//! A micro-guest through /dev/kvm: a few bytes of real-mode code that write a byte to a port a
//! known number of times and halt. It drives host-side KVM probes with exits whose count is
//! known exactly, and times one exit round trip for `calibrate --host`.

use std::time::Instant;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};

use crate::model::calibration::Figure;

/// Guest-physical address the code is loaded at.
const CODE_ADDR: u64 = 0x1000;
const MEM_SIZE: usize = 0x4000;
/// The port the guest writes to (COM1).
pub const PORT: u16 = 0x3f8;

#[derive(Debug, thiserror::Error)]
pub enum MicroVmError {
    #[error("/dev/kvm: {0}")]
    Kvm(#[from] kvm_ioctls::Error),
    #[error("cannot map guest memory: {0}")]
    Mmap(std::io::Error),
    #[error("the guest stopped unexpectedly: {0}")]
    Exit(String),
}

/// `mov cx, n; mov dx, 0x3f8; l: out dx, al; loop l; hlt` in 16-bit real mode.
fn program(n: u16) -> Vec<u8> {
    let [lo, hi] = n.to_le_bytes();
    let [plo, phi] = PORT.to_le_bytes();
    vec![0xb9, lo, hi, 0xba, plo, phi, 0xee, 0xe2, 0xfd, 0xf4]
}

/// What one guest run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Port writes that exited to this process.
    pub port_writes: u64,
    /// Nanoseconds per exit round trip (guest -> host user space -> guest), one sample each.
    pub round_trips_ns: Vec<f64>,
}

/// Runs a guest that performs `n` port writes (1..=65535) and halts.
pub fn run_guest(n: u16) -> Result<Run, MicroVmError> {
    let kvm = Kvm::new()?;
    let vm = kvm.create_vm()?;
    // SAFETY: an anonymous private mapping we own; unmapped at the end of this function, after
    // the VM (which refers to it) is dropped.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MEM_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_ANONYMOUS | libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if mem == libc::MAP_FAILED {
        return Err(MicroVmError::Mmap(std::io::Error::last_os_error()));
    }
    let result = (|| {
        let code = program(n);
        // SAFETY: mem is MEM_SIZE writable bytes; the code is far smaller than the page it goes to.
        unsafe {
            std::ptr::copy_nonoverlapping(
                code.as_ptr(),
                (mem as *mut u8).add(CODE_ADDR as usize),
                code.len(),
            )
        };
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: MEM_SIZE as u64,
            userspace_addr: mem as u64,
            flags: 0,
        };
        // SAFETY: the region describes memory that stays mapped for the VM's whole life.
        unsafe { vm.set_user_memory_region(region)? };
        let mut vcpu = vm.create_vcpu(0)?;
        let mut sregs = vcpu.get_sregs()?;
        sregs.cs.base = 0;
        sregs.cs.selector = 0;
        vcpu.set_sregs(&sregs)?;
        let mut regs = vcpu.get_regs()?;
        regs.rip = CODE_ADDR;
        regs.rflags = 2;
        vcpu.set_regs(&regs)?;
        let mut run = Run {
            port_writes: 0,
            round_trips_ns: Vec::with_capacity(n as usize),
        };
        loop {
            let t = Instant::now();
            let exit = vcpu.run()?;
            match exit {
                VcpuExit::IoOut(port, _) if port == PORT => {
                    run.port_writes += 1;
                    // The first run includes entering the guest for the first time.
                    if run.port_writes > 1 {
                        run.round_trips_ns.push(t.elapsed().as_nanos() as f64);
                    }
                }
                VcpuExit::Hlt => return Ok(run),
                other => return Err(MicroVmError::Exit(format!("{other:?}"))),
            }
        }
    })();
    drop(vm);
    // SAFETY: mem was mapped above with this size and nothing refers to it any more.
    unsafe { libc::munmap(mem, MEM_SIZE) };
    result
}

/// The guest exit round trip, for `calibrate --host`.
pub fn exit_round_trip(n: u16) -> Result<Figure, MicroVmError> {
    let mut run = run_guest(n)?;
    run.round_trips_ns.sort_by(f64::total_cmp);
    let at =
        |p: f64| run.round_trips_ns[((p / 100.0) * (run.round_trips_ns.len() - 1) as f64) as usize];
    Ok(Figure {
        name: "kvm_exit_round_trip".into(),
        what: "micro-guest port write: exit to host user space and re-enter".into(),
        median_ns: at(50.0),
        p99_ns: at(99.0),
        samples: run.round_trips_ns.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_loops_n_times_then_halts() {
        let p = program(1000);
        assert_eq!(&p[..3], &[0xb9, 0xe8, 0x03], "mov cx, 1000");
        assert_eq!(p[6], 0xee, "out dx, al");
        assert_eq!(&p[7..9], &[0xe2, 0xfd], "loop back to the out");
        assert_eq!(p[9], 0xf4, "hlt");
    }
}

#[cfg(test)]
mod root_tests {
    use virtgap_probes::{Family, ProbeConfig, ProbeSession, ProbeStorage};

    use super::*;

    #[test]
    fn host_probe_counts_exactly_the_port_writes_the_guest_made() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let kvm = std::path::Path::new("/dev/kvm").exists();
        if !virtgap_testkit::require(
            "the micro-guest test",
            if root && kvm {
                Ok(())
            } else {
                Err("needs root and /dev/kvm")
            },
        ) {
            return;
        }
        let mut storage = ProbeStorage::default();
        let session = ProbeSession::load(
            &mut storage,
            &ProbeConfig::new(vec![Family::KvmHost], Some(std::process::id())),
        );
        let family = session
            .report
            .families
            .iter()
            .find(|f| f.family == Family::KvmHost)
            .unwrap();
        assert!(family.unavailable.is_none(), "{family:?}");
        let pio = family
            .tracepoints
            .iter()
            .find(|t| t.tracepoint == "kvm_pio")
            .unwrap();
        assert!(pio.attached.is_some(), "{pio:?}");
        let before = session.snapshot();
        let run = run_guest(1000).expect("the micro-guest runs");
        let after = session.snapshot();
        assert_eq!(run.port_writes, 1000, "the guest did what it was told");
        let kvm_delta = after.kvm.unwrap().since(&before.kvm.unwrap());
        assert_eq!(
            kvm_delta.count(std::process::id(), "pio"),
            1000,
            "{kvm_delta:?}"
        );
    }
}
