//! MSR accesses by CPU and MSR (`bpf/msr.bpf.c`).

use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, MapCore, Object};

use super::{copy, load_tracepoints, percpu_entry, LoadContext, LoadResult, LoadedFamily, Slots};
use crate::bpf::msr::{types, MsrSkel, MsrSkelBuilder};
use crate::model::{MsrCount, MsrSnapshot, ProbeSnapshot};
use crate::report::Family;

struct MsrProbe<'obj> {
    skel: MsrSkel<'obj>,
    _links: Vec<Link>,
}

pub(super) fn load<'obj>(cx: &LoadContext<'_>, slots: &'obj mut Slots) -> LoadResult<'obj> {
    let (skel, links, report) = load_tracepoints(
        Family::Msr,
        MsrSkelBuilder::default,
        slots,
        cx.kernel,
        &|_| false,
        &|_: &mut crate::bpf::msr::OpenMsrSkel<'_>, _| {},
    )?;
    Ok((
        Box::new(MsrProbe {
            skel,
            _links: links,
        }),
        report,
    ))
}

impl LoadedFamily for MsrProbe<'_> {
    fn read(&self, snap: &mut ProbeSnapshot) {
        let map = &self.skel.maps.msrs;
        let mut counts = Vec::new();
        for key in map.keys() {
            let Some(k) = copy::<types::vg_msr_key>(&key) else {
                continue;
            };
            for (cpu, n) in percpu_entry::<u64>(map, &key).into_iter().enumerate() {
                if n > 0 {
                    counts.push(MsrCount {
                        cpu: cpu as u32,
                        msr: k.msr,
                        write: k.write == 1,
                        count: n,
                    });
                }
            }
        }
        counts.sort_by_key(|c| (c.cpu, c.msr, c.write));
        snap.msr = Some(MsrSnapshot { counts });
    }

    fn objects(&self) -> Vec<&Object> {
        vec![self.skel.object()]
    }
}
