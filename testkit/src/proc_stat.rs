//! Each CPU's times from /proc/stat: what the kernel says a CPU spent its time on, to hold a
//! sampler's or an experiment's view against.

use std::collections::BTreeMap;

/// One CPU's /proc/stat times, in clock ticks since boot.
#[derive(Clone, Copy, Debug)]
pub struct CpuTicks {
    /// user + nice.
    pub user: u64,
    /// idle + iowait.
    pub idle: u64,
    pub steal: u64,
    /// The first eight fields (user … steal): all the CPU's time.
    pub all: u64,
}

impl CpuTicks {
    /// The share of the time since `earlier` that `part` took.
    pub fn share_since(&self, earlier: &CpuTicks, part: impl Fn(&CpuTicks) -> u64) -> f64 {
        let all = self.all.saturating_sub(earlier.all).max(1);
        part(self).saturating_sub(part(earlier)) as f64 / all as f64
    }
}

/// Every CPU's times now, by CPU number.
pub fn cpu_ticks() -> BTreeMap<u32, CpuTicks> {
    std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let cpu: u32 = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
            // user nice system idle iowait irq softirq steal …
            let v: Vec<u64> = fields.filter_map(|x| x.parse().ok()).collect();
            let ticks = CpuTicks {
                user: v.first()? + v.get(1)?,
                idle: v.get(3)? + v.get(4).copied().unwrap_or(0),
                steal: v.get(7).copied().unwrap_or(0),
                all: v.iter().take(8).sum(),
            };
            Some((cpu, ticks))
        })
        .collect()
}
