//! The host fingerprint: which hypervisor (if any), which cloud and instance type, clocksource,
//! kernel, CPUs, and per block device its queues, scheduler and the IRQ (with its chip and
//! effective affinity) behind each queue; and the disks a target's I/O reaches. Pure data: the
//! host is read in `run::host`, described in words in `render::host`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the CPU says about a hypervisor (CPUID leaf 1 ECX bit 31, the leaves from 0x40000000).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Cpuid {
    pub hypervisor_bit: bool,
    /// The first leaf's 12-byte vendor signature, e.g. "KVMKVMKVM", "XenVMMXenVMM",
    /// "Microsoft Hv".
    pub signature: Option<String>,
    /// Every hypervisor leaf that answers (0x40000000 + n × 0x100), lowest first: a Xen guest
    /// may show Hyper-V's interface first and Xen's at 0x40000100. Empty in older profiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaves: Vec<virtgap_probes::virt::CpuidLeaf>,
    /// Each interface's feature and hint leaves after its first (KVM's 0x40000001, Hyper-V's
    /// 0x40000003..): what the hypervisor offers, which decides whether a path's 0 calls mean
    /// "not used" or "not offered". Empty in older profiles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<virtgap_probes::virt::CpuidRegisters>,
}

/// SMBIOS identity, from /sys/class/dmi/id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Dmi {
    pub sys_vendor: Option<String>,
    pub product_name: Option<String>,
    pub bios_vendor: Option<String>,
    pub bios_version: Option<String>,
}

/// An IRQ serving a hardware queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QueueIrq {
    pub irq: u32,
    pub name: String,
    /// "PCI-MSIX-…", "xen-pirq-msi-x", "IR-PCI-MSI": the delivery path.
    pub chip: String,
    /// CPUs the interrupt is delivered to now.
    pub effective_affinity: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HwQueue {
    pub index: u32,
    /// CPUs that submit to this queue.
    pub cpu_list: String,
    pub irq: Option<QueueIrq>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BlockDeviceInfo {
    pub name: String,
    /// "virtio-blk", "nvme", "scsi", … from the driver device's name.
    pub kind: String,
    /// The driver device ("virtio1", "nvme0").
    pub driver_device: Option<String>,
    pub model: Option<String>,
    pub scheduler: Option<String>,
    pub nr_requests: Option<u32>,
    pub rq_affinity: Option<u32>,
    pub io_poll: Option<bool>,
    pub logical_block_size: Option<u32>,
    pub queues: Vec<HwQueue>,
}

/// Everything virtgap knows about the host before measuring.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Fingerprint {
    /// What the user calls this host in reports (`record --label`): "vm", "metal".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The host's name (/proc/sys/kernel/hostname), so that two hosts' reports tell them apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub cpuid: Cpuid,
    /// "kvm", "xen", "hyperv", "vmware", "other", or "none".
    pub hypervisor: String,
    /// "aws-xen", "aws-nitro", "aws-metal", "microvm", "metal", or "unknown".
    pub platform: String,
    pub instance_type: Option<String>,
    pub dmi: Option<Dmi>,
    /// /sys/hypervisor/type (present on Xen only).
    pub sys_hypervisor_type: Option<String>,
    pub clocksource: Option<String>,
    pub available_clocksources: Vec<String>,
    /// The clockevent device ("lapic-deadline", "xen", "hyperv_stimer0"): how the kernel
    /// programs its timer, an MSR write that exits or a hypercall (absent in older profiles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clockevent: Option<String>,
    pub kernel: Option<String>,
    pub btf: bool,
    pub cpu_model: Option<String>,
    pub cpus: u32,
    pub smt_active: Option<bool>,
    pub block_devices: Vec<BlockDeviceInfo>,
}

/// A block device by kernel name and number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Disk {
    pub name: String,
    pub major: u32,
    pub minor: u32,
}

impl Disk {
    pub fn dev(&self) -> (u32, u32) {
        (self.major, self.minor)
    }
}

/// Where a target's I/O reaches request-based devices: the disk holding the target and, when
/// that disk is stacked (md, device-mapper, NVMe multipath), the disks under it. Block stages
/// are measured on the leaves and summed over them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TargetDisks {
    /// The whole disk holding the target ("md0", "vda").
    pub top: Option<Disk>,
    /// Request-based disks whose requests are the target's I/O (["nvme1n1", "nvme2n1"]).
    pub leaves: Vec<Disk>,
    /// Why stages may be missing or partial, in words.
    pub note: Option<String>,
}

impl TargetDisks {
    /// A plain disk that is its own leaf.
    #[cfg(test)]
    pub fn plain(name: &str, major: u32, minor: u32) -> Self {
        let disk = Disk {
            name: name.into(),
            major,
            minor,
        };
        Self {
            top: Some(disk.clone()),
            leaves: vec![disk],
            note: None,
        }
    }

    /// The leaves' device numbers, or None when unknown (then every device counts).
    pub fn devs(&self) -> Option<Vec<(u32, u32)>> {
        (!self.leaves.is_empty()).then(|| self.leaves.iter().map(Disk::dev).collect())
    }
}
