//! The TSC as the msr probe needs it: its rate against CLOCK_MONOTONIC (bpf_ktime_get_ns's
//! clock) and a recent pair of readings, so a TSC-deadline value can be turned into the
//! monotonic time it fires at. x86_64 with an invariant TSC only.

/// Whether the TSC ticks at a constant rate through frequency changes and idle states.
pub fn invariant() -> bool {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    cfg!(target_arch = "x86_64") && has("constant_tsc") && has("nonstop_tsc")
}

fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC has no preconditions on x86_64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    0
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// (TSC, monotonic ns) read back to back.
pub fn pair() -> (u64, u64) {
    let ns = monotonic_ns();
    (rdtsc(), ns)
}

/// TSC ticks per ns in 8.24 fixed point, measured over 20 ms; None without an invariant TSC.
pub fn ticks_per_ns_q24() -> Option<u64> {
    if !invariant() {
        return None;
    }
    let (t0, n0) = pair();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (t1, n1) = pair();
    let (dt, dn) = (t1.checked_sub(t0)?, n1.checked_sub(n0)?);
    (dn > 0).then(|| ((u128::from(dt) << 24) / u128::from(dn)) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_rate_is_plausible_where_the_tsc_is_invariant() {
        match super::ticks_per_ns_q24() {
            // Between 0.5 and 10 GHz.
            Some(q) => assert!(((1 << 23)..(10 << 24)).contains(&q), "{q}"),
            None => eprintln!("no invariant TSC here: nothing to check"),
        }
    }
}
