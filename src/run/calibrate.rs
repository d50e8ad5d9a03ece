//! Micro-benchmarks of operations that exit to the hypervisor (or would on
//! some hosts), so counts of them can be turned into an *estimated* time. Each figure is the
//! median and p99 of many samples; a sample times a batch of operations when one is too short
//! to time on its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::calibration::{Calibration, Figure};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Times `samples` batches of `batch` calls of `op`; per-call ns of each batch.
fn measure(name: &str, what: &str, samples: usize, batch: usize, mut op: impl FnMut()) -> Figure {
    for _ in 0..batch.min(1000) {
        op(); // warm caches and the branch predictor
    }
    let mut per_op: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                op();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    per_op.sort_by(f64::total_cmp);
    Figure {
        name: name.into(),
        what: what.into(),
        median_ns: percentile(&per_op, 50.0),
        p99_ns: percentile(&per_op, 99.0),
        samples,
    }
}

#[cfg(target_arch = "x86_64")]
fn cpuid() {
    std::hint::black_box(std::arch::x86_64::__cpuid(0));
}

#[cfg(target_arch = "x86_64")]
fn rdtscp() {
    let mut aux = 0u32;
    // SAFETY: RDTSCP only reads the TSC and TSC_AUX; aux is a valid out pointer.
    std::hint::black_box(unsafe { std::arch::x86_64::__rdtscp(&mut aux) });
}

fn clock_vdso() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    std::hint::black_box(ts);
}

fn clock_syscall() {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: raw clock_gettime syscall with a valid out pointer; bypasses the vDSO on purpose.
    unsafe {
        libc::syscall(
            libc::SYS_clock_gettime,
            libc::CLOCK_MONOTONIC,
            &mut ts as *mut libc::timespec,
        )
    };
    std::hint::black_box(ts);
}

fn short_sleep() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000,
    };
    // SAFETY: valid timespec, no remainder pointer.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; the set is built and passed by pointer for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Two threads pinned to different CPUs wake each other in turn; a sample is one round trip.
/// Waking a sleeping thread on another CPU sends an IPI (and on a VM, usually exits twice).
fn ipi_round_trip(samples: usize) -> Option<Figure> {
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if cpus < 2 {
        return None;
    }
    let turn = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let main = std::thread::current();
    let (t2, d2) = (Arc::clone(&turn), Arc::clone(&done));
    let peer = std::thread::spawn(move || {
        pin(1);
        let mut seen = 0;
        while !d2.load(Ordering::Acquire) {
            let now = t2.load(Ordering::Acquire);
            if now > seen && now % 2 == 1 {
                seen = now + 1;
                t2.store(seen, Ordering::Release);
                main.unpark();
            } else {
                std::thread::park_timeout(Duration::from_millis(50));
            }
        }
    });
    pin(0);
    let peer_thread = peer.thread().clone();
    let mut rtts = Vec::with_capacity(samples);
    for i in 0..samples as u64 {
        // Let the peer fall asleep so each wakeup really crosses CPUs.
        std::thread::sleep(Duration::from_micros(200));
        let t = Instant::now();
        turn.store(2 * i + 1, Ordering::Release);
        peer_thread.unpark();
        while turn.load(Ordering::Acquire) != 2 * i + 2 {
            std::thread::park_timeout(Duration::from_millis(50));
        }
        rtts.push(t.elapsed().as_nanos() as f64);
    }
    done.store(true, Ordering::Release);
    peer_thread.unpark();
    let _ = peer.join();
    rtts.sort_by(f64::total_cmp);
    Some(Figure {
        name: "ipi_round_trip".into(),
        what: "wake a sleeping thread on another CPU and be woken back".into(),
        median_ns: percentile(&rtts, 50.0),
        p99_ns: percentile(&rtts, 99.0),
        samples,
    })
}

/// Runs every micro-benchmark; `scale` (0–1] shortens them for tests.
pub fn calibrate(scale: f64) -> Calibration {
    let n = |x: usize| ((x as f64 * scale) as usize).max(20);
    let mut figures = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        figures.push(measure(
            "cpuid",
            "CPUID leaf 0 (always exits under hardware virtualization)",
            n(2000),
            10,
            cpuid,
        ));
        figures.push(measure(
            "rdtscp",
            "RDTSCP (exits only if the hypervisor traps the TSC)",
            n(2000),
            200,
            rdtscp,
        ));
    }
    figures.push(measure(
        "clock_gettime_vdso",
        "clock_gettime(CLOCK_MONOTONIC) through the vDSO",
        n(2000),
        200,
        clock_vdso,
    ));
    figures.push(measure(
        "clock_gettime_syscall",
        "clock_gettime as a real system call",
        n(2000),
        50,
        clock_syscall,
    ));
    figures.push(measure(
        "timer_reprogram",
        "nanosleep(1 µs): arm the timer (TSC-deadline write), sleep, wake",
        n(2000),
        1,
        short_sleep,
    ));
    if let Some(f) = ipi_round_trip(n(1000)) {
        figures.push(f);
    }
    Calibration {
        clocksource: std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .ok()
        .map(|s| s.trim().to_string()),
        figures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_has_a_spread_and_cpuid_exits_in_a_vm() {
        let c = calibrate(0.05);
        for name in [
            "clock_gettime_vdso",
            "clock_gettime_syscall",
            "timer_reprogram",
        ] {
            let f = c
                .figures
                .iter()
                .find(|f| f.name == name)
                .unwrap_or_else(|| panic!("{name}"));
            assert!(f.median_ns > 0.0 && f.p99_ns >= f.median_ns, "{f:?}");
        }
        let syscall = c
            .figures
            .iter()
            .find(|f| f.name == "clock_gettime_syscall")
            .unwrap();
        let vdso = c
            .figures
            .iter()
            .find(|f| f.name == "clock_gettime_vdso")
            .unwrap();
        assert!(
            syscall.median_ns > vdso.median_ns,
            "a real syscall costs more than the vDSO"
        );
        #[cfg(target_arch = "x86_64")]
        if crate::run::host::cpuid().hypervisor_bit {
            let cpuid = c.figures.iter().find(|f| f.name == "cpuid").unwrap();
            assert!(
                cpuid.median_ns > 1_000.0,
                "CPUID exits to the hypervisor: {cpuid:?}"
            );
        }
    }
}
