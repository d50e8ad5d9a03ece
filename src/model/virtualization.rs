//! The hypervisor signals a profile keeps: MSR accesses, the sampler's split of each CPU's time,
//! host-side KVM events and paravirt callback times.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Hypervisor signals of a run, as a profile keeps them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Virtualization {
    /// Seconds the probes were attached: the denominator of every rate below but two.
    pub seconds: f64,
    /// Of those, the seconds virtgap's sampler was paused: the host's MSR writes (neither
    /// `by_sampler` nor `while_sampling`) were counted then, and their rates are per second of
    /// this. Absent when no sampler ran (all of `seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msr_quiet_seconds: Option<f64>,
    /// None when the msr probe did not attach.
    pub msr_writes: Option<Vec<MsrAccesses>>,
    pub msr_reads: Option<Vec<MsrAccesses>>,
    /// IPIs to one CPU timed from their send to their x2APIC ICR write's return, over
    /// `seconds`; absent where the kernel has no `ipi:ipi_send_cpu` (before 6.4) or the msr
    /// probe did not attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icr_sends: Option<IcrSendTime>,
    pub sampler: Option<SamplerSection>,
    pub kvm_host: Option<KvmHostSection>,
    pub pv_paths: Option<Vec<PvPathFigure>>,
}

/// IPIs to one CPU, timed from the generic send (`ipi:ipi_send_cpu`) to the return of the ICR
/// write that sends them: the native send, and in a guest whose ICR writes exit, the exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IcrSendTime {
    pub sends: u64,
    /// Their time in all, ns.
    pub ns: u64,
    /// Sends to one CPU that no ICR write ended: where these come and no send is timed, this
    /// host's IPIs are not x2APIC ICR writes (an xAPIC's MMIO write, a paravirt send).
    #[serde(default)]
    pub unpaired: u64,
}

impl IcrSendTime {
    /// The sends' time, ns; None where IPIs were sent but none through the x2APIC ICR.
    pub fn time_ns(&self) -> Option<f64> {
        (self.sends > 0 || self.unpaired == 0).then_some(self.ns as f64)
    }
}

/// Accesses to one MSR on one CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MsrAccesses {
    pub cpu: u32,
    /// The MSR's number, written in hexadecimal (`"0x6e0"`).
    #[serde(with = "hex_number")]
    #[schemars(with = "String")]
    pub msr: u32,
    pub name: String,
    pub count: u64,
    /// Writes to this MSR exit to the detected hypervisor (profiles from before the label was
    /// kept counted every write as exiting).
    #[serde(default = "every_write_exited")]
    pub exits: bool,
    /// Writes in the wake of virtgap's own sampler interrupt (the tool's cost).
    #[serde(default)]
    pub by_sampler: bool,
    /// Other writes made while the sampler ran (the host's, in a pattern its timer changed).
    #[serde(default)]
    pub while_sampling: bool,
}

impl MsrAccesses {
    /// A write the host made with no sampler running: the ones its rates are made of.
    pub fn is_hosts(&self) -> bool {
        !self.by_sampler && !self.while_sampling
    }
}

/// The shortest time the host's MSR writes can be counted in and give a rate (the sampler
/// must pause at least this long).
pub const MIN_MSR_SECONDS: f64 = virtgap_probes::model::MIN_QUIET_NS as f64 / 1e9;

/// Which of the host's MSR writes (virtgap's sampler's own always left out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsrWrites {
    /// Writes that exit to the detected hypervisor.
    Exiting,
    /// Writes with no exit known here.
    Other,
}

/// One MSR's writes per second.
#[derive(Clone, Debug, PartialEq)]
pub struct MsrRate {
    pub msr: u32,
    pub name: String,
    pub per_s: f64,
}

impl Virtualization {
    /// The seconds the host's MSR writes were counted in.
    pub fn msr_seconds(&self) -> f64 {
        self.msr_quiet_seconds.unwrap_or(self.seconds)
    }

    /// The host's own writes that `wanted` picks (none of virtgap's sampler's: see
    /// [`MsrAccesses::is_hosts`]) over `seconds`, scaled from the time they were counted in:
    /// the one scaling of the host's MSR writes, for rates, a window's count and the
    /// hypervisor's MSR paths. None when not measured: no msr probe, or the sampler never paused
    /// long enough.
    pub fn host_writes(&self, wanted: impl Fn(&MsrAccesses) -> bool, seconds: f64) -> Option<f64> {
        let (writes, counted) = self.counted_writes()?;
        let n: u64 = writes
            .iter()
            .filter(|w| w.is_hosts() && wanted(w))
            .map(|w| w.count)
            .sum();
        Some(n as f64 * seconds / counted)
    }

    /// The writes and the seconds they were counted in, when long enough to scale.
    fn counted_writes(&self) -> Option<(&[MsrAccesses], f64)> {
        let writes = self.msr_writes.as_ref()?;
        let counted = self.msr_seconds();
        (counted >= MIN_MSR_SECONDS).then_some((writes.as_slice(), counted))
    }

    /// The host's MSR writes per second, by MSR over all CPUs, most written first (by MSR
    /// number among equals): the one computation of them for the summary, the TUI and the
    /// diff. None when not measured (see [`Self::host_writes`]).
    pub fn msr_write_rates(&self, which: MsrWrites) -> Option<Vec<MsrRate>> {
        let exiting = which == MsrWrites::Exiting;
        let mut names: BTreeMap<u32, &str> = BTreeMap::new();
        for w in self.counted_writes()?.0 {
            if w.is_hosts() && w.exits == exiting {
                names.entry(w.msr).or_insert(&w.name);
            }
        }
        let mut rates = names
            .into_iter()
            .map(|(msr, name)| {
                let per_s = self.host_writes(|w| w.msr == msr && w.exits == exiting, 1.0)?;
                Some(MsrRate {
                    msr,
                    name: name.to_string(),
                    per_s,
                })
            })
            .collect::<Option<Vec<MsrRate>>>()?;
        // Writes per second rank as their counts do (one denominator).
        rates.sort_by(|a, b| b.per_s.total_cmp(&a.per_s).then(a.msr.cmp(&b.msr)));
        Some(rates)
    }

    /// MSR writes per second of its running time that virtgap's own sampler interrupts caused
    /// (None: the sampler never ran, or no msr probe).
    pub fn sampler_msr_writes_per_s(&self) -> Option<f64> {
        let writes = self.msr_writes.as_ref()?;
        let sampling = self.seconds - self.msr_quiet_seconds?;
        let own: u64 = writes
            .iter()
            .filter(|w| w.by_sampler)
            .map(|w| w.count)
            .sum();
        (sampling > 0.0).then(|| own as f64 / sampling)
    }
}

/// An MSR number as profiles write it: `"0x6e0"`.
mod hex_number {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{n:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        let text = String::deserialize(d)?;
        let digits = text
            .strip_prefix("0x")
            .ok_or_else(|| D::Error::custom(format!("{text:?} is not a hexadecimal MSR number")))?;
        u32::from_str_radix(digits, 16)
            .map_err(|_| D::Error::custom(format!("{text:?} is not a hexadecimal MSR number")))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SamplerSection {
    pub frequency_hz: u64,
    /// Samples the kernel-side map had no room for.
    pub dropped: u64,
    pub cpus: Vec<SampledCpu>,
    /// Seconds the sampler ran (it pauses while the msr probe counts the host's timer writes);
    /// absent in profiles from before it paused, when it ran throughout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_seconds: Option<f64>,
}

impl SamplerSection {
    /// The seconds its samples cover, out of a window of `window` seconds.
    pub fn seconds(&self, window: f64) -> f64 {
        self.sampled_seconds.unwrap_or(window)
    }
}

/// One CPU's samples: per category (hypervisor interface, idle, IRQ, ...) and its top symbols.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SampledCpu {
    pub cpu: u32,
    pub samples: u64,
    pub categories: BTreeMap<String, u64>,
    /// (kernel symbol, samples), most sampled first. A sample in an MMIO or port accessor
    /// names its caller too: "vp_notify/iowrite16".
    pub top: Vec<(String, u64)>,
    /// Mechanism name -> samples in its sampled path (the doorbell where nothing can time it),
    /// part of the hypervisor interface's (absent in older profiles).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mechanisms: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvmHostSection {
    pub events: Vec<virtgap_probes::model::KvmEventCount>,
    pub exits: Vec<KvmExitFigure>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KvmExitFigure {
    pub reason: String,
    pub count: u64,
    pub mean_ns: Option<f64>,
}

/// Entry-to-return time of one paravirt callback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PvPathFigure {
    pub symbol: String,
    pub count: u64,
    pub mean_ns: Option<f64>,
    pub p99_ns: Option<f64>,
}

fn every_write_exited() -> bool {
    true
}

impl SampledCpu {
    /// Samples in one category (0 when none).
    pub fn in_category(&self, category: &str) -> u64 {
        self.categories.get(category).copied().unwrap_or(0)
    }

    /// Whether these samples stand for the CPU's time (`CpuSamples::represents`).
    pub fn represents(&self, frequency_hz: u64, secs: f64) -> bool {
        virtgap_probes::model::samples_represent(self.samples, frequency_hz, secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(msr: u32, count: u64, by_sampler: bool, while_sampling: bool) -> MsrAccesses {
        MsrAccesses {
            cpu: 0,
            msr,
            name: "TSC_DEADLINE".into(),
            count,
            exits: true,
            by_sampler,
            while_sampling,
        }
    }

    fn window(quiet: Option<f64>, counts: Vec<MsrAccesses>) -> Virtualization {
        Virtualization {
            seconds: 1.0,
            msr_quiet_seconds: quiet,
            msr_writes: Some(counts),
            msr_reads: None,
            icr_sends: None,
            sampler: None,
            kvm_host: None,
            pv_paths: None,
        }
    }

    #[test]
    fn the_hosts_writes_are_those_counted_in_the_samplers_pauses_scaled_to_the_window() {
        // 250 ms of a 1 s window unsampled: its 100 writes stand for 400; the sampler's own
        // and those made while it ran are not the host's.
        let v = window(
            Some(0.25),
            vec![
                writes(0x6e0, 100, false, false),
                writes(0x6e0, 30, false, true),
                writes(0x6e0, 900, true, false),
            ],
        );
        assert_eq!(v.host_writes(|w| w.exits, v.seconds), Some(400.0));
        assert_eq!(v.host_writes(|w| w.msr == 0x6e0, 0.5), Some(200.0));
        let rates = v.msr_write_rates(MsrWrites::Exiting).unwrap();
        assert_eq!((rates.len(), rates[0].per_s), (1, 400.0));
        // No sampler: counted all through, exactly.
        let exact = window(None, vec![writes(0x6e0, 100, false, false)]);
        assert_eq!(exact.host_writes(|w| w.exits, exact.seconds), Some(100.0));
        // A window the sampler ran all through: nothing to count in.
        let sampled = window(Some(0.0), vec![writes(0x6e0, 100, false, true)]);
        assert_eq!(sampled.host_writes(|w| w.exits, 1.0), None);
        assert!(sampled.msr_write_rates(MsrWrites::Exiting).is_none());
    }
}
