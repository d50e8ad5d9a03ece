//! The host fingerprint in words, as the TUI's header, the summary, doctor and the diff say it.

use crate::model::host::Fingerprint;

impl Fingerprint {
    /// The platform in words, e.g. "KVM guest (microVM) · AMD EPYC · 2 vCPU · clocksource tsc ·
    /// vda virtio-blk, 1 queue, IRQ on CPU 1".
    pub fn describe(&self) -> String {
        let host = match (self.hypervisor.as_str(), self.platform.as_str()) {
            ("none", "aws-metal") => format!(
                "bare metal (EC2 {})",
                self.instance_type.as_deref().unwrap_or("?")
            ),
            ("none", _) => "bare metal".to_string(),
            (_, "aws-nitro") => format!(
                "Nitro guest (EC2 {})",
                self.instance_type.as_deref().unwrap_or("?")
            ),
            (_, "aws-xen") => "Xen HVM guest (EC2)".to_string(),
            ("kvm", "microvm") => "KVM guest (microVM, no SMBIOS)".to_string(),
            (hv, _) => format!("{} guest", hv_name(hv)),
        };
        // The user's name for the host and its own name first: what tells two sides apart.
        let mut parts: Vec<String> = match (&self.label, &self.hostname) {
            (Some(label), Some(name)) => vec![format!("{label} ({name})")],
            (Some(label), None) => vec![label.clone()],
            (None, Some(name)) => vec![name.clone()],
            (None, None) => vec![],
        };
        parts.push(host);
        if let Some(m) = &self.cpu_model {
            parts.push(m.clone());
        }
        let unit = if self.hypervisor == "none" {
            "CPU"
        } else {
            "vCPU"
        };
        parts.push(format!("{} {unit}", self.cpus));
        if let Some(cs) = &self.clocksource {
            parts.push(format!("clocksource {cs}"));
        }
        if let Some(ce) = &self.clockevent {
            parts.push(format!("timer {ce}"));
        }
        for d in self.block_devices.iter().filter(|d| !d.queues.is_empty()) {
            let irq_cpus: Vec<String> = d
                .queues
                .iter()
                .filter_map(|q| q.irq.as_ref()?.effective_affinity.clone())
                .collect();
            let queues = if d.queues.len() == 1 {
                "1 queue".to_string()
            } else {
                format!("{} queues", d.queues.len())
            };
            let irq = match irq_cpus.len() {
                0 => String::new(),
                1 => format!(", IRQ on CPU {}", irq_cpus[0]),
                _ => format!(", IRQs on CPUs {}", dedup_join(&irq_cpus)),
            };
            parts.push(format!("{} {}, {queues}{irq}", d.name, d.kind));
        }
        parts.join(" · ")
    }
}

fn hv_name(hv: &str) -> &str {
    match hv {
        "kvm" => "KVM",
        "xen" => "Xen",
        "hyperv" => "Hyper-V",
        "vmware" => "VMware",
        _ => "virtualized",
    }
}

fn dedup_join(v: &[String]) -> String {
    let mut v = v.to_vec();
    v.sort();
    v.dedup();
    v.join(",")
}
