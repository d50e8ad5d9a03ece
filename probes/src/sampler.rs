//! Starting the hypervisor sampler: one cpu-clock perf event per online CPU, each running the
//! sampler program on every sample.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, OpenObject};

use crate::attach::{AttachKind, AttachOutcome};
use crate::bpf;
use crate::session::{Family, FamilyReport};

/// Opens a cpu-clock sampling event on `cpu` at `hz`.
fn open_cpu_clock(cpu: i32, hz: u64) -> Result<i32, std::io::Error> {
    use libbpf_rs::libbpf_sys as sys;
    let mut attr = sys::perf_event_attr {
        type_: sys::PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<sys::perf_event_attr>() as u32,
        config: u64::from(sys::PERF_COUNT_SW_CPU_CLOCK),
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_freq = hz;
    attr.set_freq(1);
    // SAFETY: perf_event_open with a fully initialised attr; pid -1 and a CPU number means
    // "every task on that CPU". A non-negative result is a new fd we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const sys::perf_event_attr,
            -1,
            cpu,
            -1,
            sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd as i32)
}

/// Loads the sampler and attaches it to a cpu-clock event on every online CPU.
pub fn start<'a>(
    slot: &'a mut MaybeUninit<OpenObject>,
    hz: u64,
    links: &mut Vec<Link>,
) -> Result<(bpf::sampler::SamplerSkel<'a>, FamilyReport), FamilyReport> {
    let fail = |why: String| FamilyReport {
        family: Family::Sampler,
        unavailable: Some(why),
        tracepoints: vec![],
    };
    let open = bpf::sampler::SamplerSkelBuilder::default()
        .open(slot)
        .map_err(|e| fail(format!("open: {e}")))?;
    let skel = open.load().map_err(|e| fail(format!("load: {e}")))?;
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as i32;
    let mut outcomes = Vec::new();
    for cpu in 0..cpus {
        let name = format!("cpu-clock@{hz}Hz cpu{cpu}");
        let result = open_cpu_clock(cpu, hz)
            .map_err(|e| format!("perf_event_open: {e}"))
            .and_then(|fd| {
                skel.progs
                    .sample
                    .attach_perf_event(fd)
                    .map_err(|e| format!("attach: {e}"))
            });
        match result {
            Ok(link) => {
                links.push(link);
                outcomes.push(AttachOutcome {
                    tracepoint: name,
                    attached: Some(AttachKind::PerfEvent),
                    reason: None,
                });
            }
            Err(why) => outcomes.push(AttachOutcome {
                tracepoint: name,
                attached: None,
                reason: Some(why),
            }),
        }
    }
    if outcomes.iter().all(|o| o.attached.is_none()) {
        let why = outcomes
            .first()
            .and_then(|o| o.reason.clone())
            .unwrap_or_else(|| "no CPU".into());
        return Err(fail(why));
    }
    Ok((
        skel,
        FamilyReport {
            family: Family::Sampler,
            unavailable: None,
            tracepoints: outcomes,
        },
    ))
}
