//! Small readers of /proc files the probes need: IRQ names from /proc/interrupts, symbol
//! addresses from /proc/kallsyms. Parsers take text so tests feed them fixtures.

use std::collections::BTreeMap;

/// IRQ number -> action name ("virtio1-req.0", "nvme0q3"), from /proc/interrupts text.
pub fn irq_names(interrupts: &str) -> BTreeMap<u32, String> {
    let mut lines = interrupts.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let (num, rest) = line.trim_start().split_once(':')?;
            let irq: u32 = num.trim().parse().ok()?;
            // After the per-CPU counts: chip name, hwirq/trigger, then the action name(s).
            let fields: Vec<&str> = rest.split_whitespace().skip(cpus).collect();
            let name = fields
                .get(2..)
                .map(|f| f.join(" "))
                .filter(|s| !s.is_empty())?;
            Some((irq, name))
        })
        .collect()
}

/// The driver name for a hardware queue's IRQ: "virtio1-req.0" → queue 0, "nvme0q3" → queue 2
/// (NVMe queue 0 is the admin queue, so I/O queue q serves hctx q-1).
pub fn queue_of_irq(driver_device: &str, irq_name: &str) -> Option<u32> {
    let rest = irq_name.strip_prefix(driver_device)?;
    if let Some(n) = rest.strip_prefix("-req.") {
        return n.parse().ok();
    }
    if let Some(q) = rest.strip_prefix('q') {
        let qid: u32 = q.parse().ok()?;
        return qid.checked_sub(1);
    }
    None
}

/// The driver device of a block device's sysfs directory ("virtio1"; an NVMe namespace's
/// link is its controller, "nvme0"): the name its queue IRQs start with.
pub fn driver_device(block_dir: &std::path::Path) -> Option<String> {
    std::fs::canonicalize(block_dir.join("device"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
}

/// The chip of each numbered IRQ ("PCI-MSIX-0000:00:02.0", "xen-pirq-msi-x", "IR-PCI-MSI").
pub fn irq_chips(interrupts: &str) -> BTreeMap<u32, String> {
    let mut lines = interrupts.lines();
    let cpus = lines.next().map_or(0, |h| h.split_whitespace().count());
    lines
        .filter_map(|line| {
            let (num, rest) = line.trim_start().split_once(':')?;
            let irq: u32 = num.trim().parse().ok()?;
            let mut fields = rest.split_whitespace().skip(cpus);
            let chip = fields.next()?;
            // Xen prints its handler type as a separate "-msi-x" word after "xen-pirq".
            let chip = match fields.next() {
                Some(kind) if kind.starts_with('-') => format!("{chip}{kind}"),
                _ => chip.to_string(),
            };
            Some((irq, chip))
        })
        .collect()
}

/// Time one CPU spent in each state, from /proc/stat, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuTimes {
    pub cpu: u32,
    pub user_ns: u64,
    pub system_ns: u64,
    pub idle_ns: u64,
    pub iowait_ns: u64,
    pub irq_ns: u64,
    pub softirq_ns: u64,
    /// Time the hypervisor ran something else while this vCPU wanted to run.
    pub steal_ns: u64,
}

impl CpuTimes {
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            cpu: self.cpu,
            user_ns: self.user_ns.saturating_sub(earlier.user_ns),
            system_ns: self.system_ns.saturating_sub(earlier.system_ns),
            idle_ns: self.idle_ns.saturating_sub(earlier.idle_ns),
            iowait_ns: self.iowait_ns.saturating_sub(earlier.iowait_ns),
            irq_ns: self.irq_ns.saturating_sub(earlier.irq_ns),
            softirq_ns: self.softirq_ns.saturating_sub(earlier.softirq_ns),
            steal_ns: self.steal_ns.saturating_sub(earlier.steal_ns),
        }
    }

    pub fn total_ns(&self) -> u64 {
        self.user_ns
            + self.system_ns
            + self.idle_ns
            + self.iowait_ns
            + self.irq_ns
            + self.softirq_ns
            + self.steal_ns
    }
}

/// Per-CPU times from /proc/stat text; `tick_ns` is one USER_HZ tick in ns.
pub fn cpu_times(stat: &str, tick_ns: u64) -> Vec<CpuTimes> {
    stat.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let cpu: u32 = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
            let at = |i: usize| v.get(i).copied().unwrap_or(0) * tick_ns;
            // user nice system idle iowait irq softirq steal guest guest_nice
            Some(CpuTimes {
                cpu,
                user_ns: at(0) + at(1),
                system_ns: at(2),
                idle_ns: at(3),
                iowait_ns: at(4),
                irq_ns: at(5),
                softirq_ns: at(6),
                steal_ns: at(7),
            })
        })
        .collect()
}

/// Reads /proc/stat now.
pub fn read_cpu_times() -> Vec<CpuTimes> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    std::fs::read_to_string("/proc/stat")
        .map(|s| cpu_times(&s, 1_000_000_000 / hz))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const THIS_MACHINE: &str = "           CPU0       CPU1       \n \
 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n \
 36:          0    1201022 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n \
 39:       2734          0 PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n\
NMI:          0          0   Non-maskable interrupts\n\
LOC:    1234567    2345678   Local timer interrupts\n";

    #[test]
    fn maps_irq_names_to_queues() {
        assert_eq!(super::queue_of_irq("virtio1", "virtio1-req.0"), Some(0));
        assert_eq!(super::queue_of_irq("virtio1", "virtio1-config"), None);
        assert_eq!(super::queue_of_irq("nvme0", "nvme0q1"), Some(0));
        assert_eq!(super::queue_of_irq("nvme0", "nvme0q0"), None, "admin queue");
        assert_eq!(super::queue_of_irq("nvme0", "nvme10q1"), None);
    }

    #[test]
    fn names_irqs_from_proc_interrupts() {
        let names = irq_names(THIS_MACHINE);
        assert_eq!(names[&36], "virtio1-req.0");
        assert_eq!(names[&24], "ACPI:Ged");
        assert_eq!(names.len(), 3, "system rows have no number");
        assert_eq!(irq_chips(THIS_MACHINE)[&36], "PCI-MSIX-0000:00:02.0");
    }

    #[test]
    fn names_xen_nvme_queues() {
        // Xen prints the chip and its handler type as two words.
        let xen = "      CPU0   CPU1   CPU2\n \
 90:   12   0   5   xen-pirq    -msi-x     nvme0q1\n \
 91:   0   99   0   xen-pirq    -msi-x     nvme0q2\n";
        let names = irq_names(xen);
        assert_eq!(names[&91], "nvme0q2");
        assert_eq!(irq_chips(xen)[&90], "xen-pirq-msi-x");
    }

    #[test]
    fn reads_cpu_times_with_steal() {
        let stat = "cpu  100 5 50 1000 10 3 7 40 0 0\ncpu0 60 5 30 500 5 3 7 40 0 0\ncpu1 40 0 20 500 5 0 0 0 0 0\nintr 123\n";
        let t = cpu_times(stat, 10_000_000);
        assert_eq!(t.len(), 2, "the aggregate line is skipped");
        assert_eq!(t[0].user_ns, 650_000_000);
        assert_eq!(t[0].steal_ns, 400_000_000);
        assert_eq!(t[1].total_ns(), 565 * 10_000_000);
        assert_eq!(t[0].since(&t[1]).idle_ns, 0);
    }
}
