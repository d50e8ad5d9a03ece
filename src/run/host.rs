//! Reading this host: its fingerprint (CPUID, DMI, clocksource, kernel, block devices with
//! their queues and IRQs) and the disks a target's I/O reaches. Everything is read under a root
//! directory so tests feed fixture trees of real /proc and /sys layouts; only the CPUID
//! signature comes from the CPU itself and is passed in.

use std::fs;
use std::path::{Path, PathBuf};

use crate::model::host::{
    BlockDeviceInfo, Cpuid, Disk, Dmi, Fingerprint, HwQueue, QueueIrq, TargetDisks,
};

/// Reads the running CPU.
pub fn cpuid() -> Cpuid {
    let evidence = virtgap_probes::virt::detect_hypervisor(Path::new("/"));
    Cpuid {
        hypervisor_bit: evidence.hypervisor_bit,
        signature: evidence
            .leaves
            .iter()
            .find(|l| l.leaf == 0x4000_0000)
            .map(|l| l.signature.clone()),
        leaves: evidence.leaves,
        features: evidence.features,
    }
}

/// The hypervisor this host runs on, as its fingerprint names it (CPUID and
/// `/sys/hypervisor/type`), without reading the rest of the fingerprint.
pub fn this_hypervisor() -> virtgap_probes::hypervisor::Hypervisor {
    let sys_type = read(Path::new("/"), "sys/hypervisor/type");
    virtgap_probes::hypervisor::Hypervisor::of_name(&hypervisor_of(
        &cpuid(),
        sys_type.as_deref().map(str::trim),
    ))
}

fn read(root: &Path, rel: &str) -> Option<String> {
    fs::read_to_string(root.join(rel))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The hypervisor the CPUID leaves and `/sys/hypervisor/type` point to (one rule for the
/// probes and the fingerprint: `virt::hypervisor_of`). A profile or fixture with only the first
/// leaf's signature is read as that one leaf.
fn hypervisor_of(cpuid: &Cpuid, sys_type: Option<&str>) -> String {
    use virtgap_probes::virt::{self, CpuidLeaf};
    let first_only;
    let leaves = if cpuid.leaves.is_empty() {
        first_only = cpuid
            .signature
            .iter()
            .map(|s| CpuidLeaf {
                leaf: 0x4000_0000,
                max_leaf: 0,
                signature: s.clone(),
            })
            .collect::<Vec<_>>();
        &first_only
    } else {
        &cpuid.leaves
    };
    virt::hypervisor_of(cpuid.hypervisor_bit, leaves, sys_type)
        .name()
        .to_string()
}

fn platform_of(hypervisor: &str, dmi: Option<&Dmi>) -> (String, Option<String>) {
    let vendor = dmi.and_then(|d| d.sys_vendor.as_deref()).unwrap_or("");
    let product = dmi.and_then(|d| d.product_name.clone());
    let bios = dmi.and_then(|d| d.bios_version.as_deref()).unwrap_or("");
    if vendor == "Amazon EC2" {
        let metal =
            product.as_deref().is_some_and(|p| p.ends_with(".metal")) || hypervisor == "none";
        return (
            if metal { "aws-metal" } else { "aws-nitro" }.into(),
            product,
        );
    }
    if hypervisor == "xen" && (bios.contains("amazon") || vendor == "Xen") {
        return ("aws-xen".into(), None);
    }
    match (hypervisor, dmi.is_some()) {
        ("none", _) => ("metal".into(), product),
        ("kvm", false) => ("microvm".into(), None),
        _ => ("unknown".into(), product),
    }
}

fn kind_of(driver_device: Option<&str>, name: &str) -> String {
    match driver_device {
        Some(d) if d.starts_with("virtio") => "virtio-blk".into(),
        Some(d) if d.starts_with("nvme") => "nvme".into(),
        _ if name.starts_with("nvme") => "nvme".into(),
        _ if name.starts_with("sd") => "scsi".into(),
        _ if name.starts_with("xvd") => "xen-blkfront".into(),
        _ => "other".into(),
    }
}

fn block_devices(root: &Path, interrupts: &str) -> Vec<BlockDeviceInfo> {
    let names = virtgap_probes::procfs::irq_names(interrupts);
    let chips = virtgap_probes::procfs::irq_chips(interrupts);
    let mut devs: Vec<String> = fs::read_dir(root.join("sys/block"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        // Virtual devices without hardware queues of their own.
        .filter(|n| {
            !["loop", "ram", "zram", "dm-", "md", "nbd"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    devs.sort();
    devs.into_iter()
        .map(|name| {
            let base = format!("sys/block/{name}");
            let driver_device = virtgap_probes::procfs::driver_device(&root.join(&base));
            // An NVMe namespace's device link points at the controller (nvme0).
            let scheduler = read(root, &format!("{base}/queue/scheduler")).map(|s| {
                s.split_whitespace()
                    .find(|w| w.starts_with('['))
                    .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
                    .unwrap_or(s)
            });
            let mut queues: Vec<HwQueue> = fs::read_dir(root.join(&base).join("mq"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let index: u32 = e.file_name().to_str()?.parse().ok()?;
                    let cpu_list =
                        read(root, &format!("{base}/mq/{index}/cpu_list")).unwrap_or_default();
                    let irq = driver_device.as_deref().and_then(|d| {
                        names
                            .iter()
                            .find(|(_, n)| {
                                virtgap_probes::procfs::queue_of_irq(d, n) == Some(index)
                            })
                            .map(|(&irq, n)| QueueIrq {
                                irq,
                                name: n.clone(),
                                chip: chips.get(&irq).cloned().unwrap_or_default(),
                                effective_affinity: read(
                                    root,
                                    &format!("proc/irq/{irq}/effective_affinity_list"),
                                ),
                            })
                    });
                    Some(HwQueue {
                        index,
                        cpu_list,
                        irq,
                    })
                })
                .collect();
            queues.sort_by_key(|q| q.index);
            BlockDeviceInfo {
                kind: kind_of(driver_device.as_deref(), &name),
                model: read(root, &format!("{base}/device/model")),
                scheduler,
                nr_requests: read(root, &format!("{base}/queue/nr_requests"))
                    .and_then(|s| s.parse().ok()),
                rq_affinity: read(root, &format!("{base}/queue/rq_affinity"))
                    .and_then(|s| s.parse().ok()),
                io_poll: read(root, &format!("{base}/queue/io_poll")).map(|s| s == "1"),
                logical_block_size: read(root, &format!("{base}/queue/logical_block_size"))
                    .and_then(|s| s.parse().ok()),
                driver_device,
                queues,
                name,
            }
        })
        .collect()
}

/// Reads the host under `root` ("/" in production).
pub fn fingerprint(root: &Path, cpuid: Cpuid) -> Fingerprint {
    let cpuinfo = read(root, "proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo.lines().find_map(|l| {
        l.strip_prefix("model name")
            .and_then(|r| r.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count() as u32;
    let cpuid = Cpuid {
        // /proc/cpuinfo's "hypervisor" flag is the same CPUID bit, readable from fixtures.
        hypervisor_bit: cpuid.hypervisor_bit
            || cpuinfo
                .lines()
                .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor")),
        signature: cpuid.signature,
        leaves: cpuid.leaves,
        features: cpuid.features,
    };
    let dmi_dir = "sys/class/dmi/id";
    let dmi = root.join(dmi_dir).is_dir().then(|| Dmi {
        sys_vendor: read(root, &format!("{dmi_dir}/sys_vendor")),
        product_name: read(root, &format!("{dmi_dir}/product_name")),
        bios_vendor: read(root, &format!("{dmi_dir}/bios_vendor")),
        bios_version: read(root, &format!("{dmi_dir}/bios_version")),
    });
    let sys_hypervisor_type = read(root, "sys/hypervisor/type");
    let hypervisor = hypervisor_of(&cpuid, sys_hypervisor_type.as_deref());
    let (platform, instance_type) = platform_of(&hypervisor, dmi.as_ref());
    let cs = "sys/devices/system/clocksource/clocksource0";
    let interrupts = read(root, "proc/interrupts").unwrap_or_default();
    Fingerprint {
        cpuid,
        hypervisor,
        platform,
        instance_type,
        dmi,
        sys_hypervisor_type,
        clocksource: read(root, &format!("{cs}/current_clocksource")),
        available_clocksources: read(root, &format!("{cs}/available_clocksource"))
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
        clockevent: read(
            root,
            "sys/devices/system/clockevents/clockevent0/current_device",
        ),
        kernel: read(root, "proc/sys/kernel/osrelease"),
        hostname: read(root, "proc/sys/kernel/hostname"),
        label: None,
        btf: root.join("sys/kernel/btf/vmlinux").exists(),
        cpu_model,
        cpus,
        smt_active: read(root, "sys/devices/system/cpu/smt/active").map(|s| s == "1"),
        block_devices: block_devices(root, &interrupts),
    }
}

/// This host.
pub fn this_host() -> Fingerprint {
    fingerprint(&PathBuf::from("/"), cpuid())
}

/// Every request-based disk under `root`/sys/block (those with hardware queues, where the
/// block stages are measured): what an attached run's I/O may reach.
pub fn every_disk(root: &Path) -> TargetDisks {
    let mut leaves: Vec<Disk> = fs::read_dir(root.join("sys/block"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.path().join("mq").is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dev = read(root, &format!("sys/block/{name}/dev"))?;
            let (major, minor) = dev.split_once(':')?;
            Some(Disk {
                name,
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
            })
        })
        .collect();
    leaves.sort_by(|a, b| a.name.cmp(&b.name));
    TargetDisks {
        top: None,
        leaves,
        note: None,
    }
}

/// The disks `names` name (each a name in `root`/sys/block; a stacked one stands for the
/// disks under it), for `--device`: None when no name is given. An error names the first
/// that is no disk of this host, in one line.
pub fn named_disks(root: &Path, names: &[String]) -> Result<Option<TargetDisks>, String> {
    let mut leaves: Vec<Disk> = Vec::new();
    let mut top = None;
    for name in names {
        let dev = (!name.is_empty() && !name.contains('/'))
            .then(|| read(root, &format!("sys/block/{name}/dev")))
            .flatten()
            .and_then(|d| {
                let (major, minor) = d.split_once(':')?;
                Some((major.parse().ok()?, minor.parse().ok()?))
            });
        let Some(dev) = dev else {
            let example = every_disk(root)
                .leaves
                .into_iter()
                .map(|d| d.name)
                .find(|n| !n.starts_with("loop") && !n.starts_with("ram"))
                .unwrap_or_else(|| "nvme0n1".into());
            return Err(format!(
                "--device {}: no such disk on this host; name one of /sys/block (e.g. {example})",
                virtgap_workloads::units::printable(name)
            ));
        };
        let disks = target_disks(root, dev);
        top = top.or(disks.top);
        leaves.extend(disks.leaves);
    }
    if names.is_empty() {
        return Ok(None);
    }
    leaves.sort_by(|a, b| a.name.cmp(&b.name));
    leaves.dedup();
    Ok(Some(TargetDisks {
        top: if names.len() == 1 { top } else { None },
        leaves,
        note: None,
    }))
}

/// Resolves device number `dev` (a file's st_dev or a block device's st_rdev) under `root`.
pub fn target_disks(root: &Path, (major, minor): (u32, u32)) -> TargetDisks {
    let Some(name) = fs::canonicalize(root.join(format!("sys/dev/block/{major}:{minor}")))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    else {
        return TargetDisks {
            note: Some(format!(
                "device {major}:{minor} is not a block device sysfs knows (a network or virtual filesystem?): block stages cannot be attributed to it"
            )),
            ..TargetDisks::default()
        };
    };
    let top_name = whole_disk(root, &name);
    let top = disk(root, &top_name);
    let mut leaves = Vec::new();
    let mut bio_based = Vec::new();
    collect_leaves(root, &top_name, 0, &mut leaves, &mut bio_based);
    leaves.sort_by(|a, b| a.name.cmp(&b.name));
    leaves.dedup();
    let stacked = leaves.len() != 1 || leaves.first().map(|d| &d.name) != Some(&top_name);
    let note = if !bio_based.is_empty() {
        Some(format!(
            "{} has no request queue (bio-based): its I/O has no block stages to measure",
            bio_based.join(", ")
        ))
    } else if stacked && !leaves.is_empty() {
        Some(format!(
            "{top_name} is stacked: block stages are measured on {} and summed",
            leaves
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        ))
    } else {
        None
    };
    TargetDisks { top, leaves, note }
}

/// The whole disk a block device name belongs to ("nvme0n1p2" -> "nvme0n1").
fn whole_disk(root: &Path, name: &str) -> String {
    let class = root.join("sys/class/block").join(name);
    if class.join("partition").exists() {
        if let Some(parent) = fs::canonicalize(&class).ok().and_then(|p| {
            p.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        }) {
            return parent;
        }
    }
    name.to_string()
}

fn disk(root: &Path, name: &str) -> Option<Disk> {
    let text = read(root, &format!("sys/block/{name}/dev"))?;
    let (a, b) = text.split_once(':')?;
    Some(Disk {
        name: name.to_string(),
        major: a.parse().ok()?,
        minor: b.parse().ok()?,
    })
}

/// Entries of a sysfs directory of links (slaves/, multipath/), sorted.
fn link_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

fn collect_leaves(
    root: &Path,
    name: &str,
    depth: u32,
    leaves: &mut Vec<Disk>,
    bio_based: &mut Vec<String>,
) {
    // md over dm over md… is a few levels at most; the bound guards against a cycle.
    if depth > 8 {
        return;
    }
    let base = root.join("sys/block").join(name);
    // md and dm list what they sit on in slaves/; an NVMe multipath head lists its paths.
    let below: Vec<String> = link_names(&base.join("slaves"))
        .into_iter()
        .chain(link_names(&base.join("multipath")))
        .map(|n| whole_disk(root, &n))
        .collect();
    if !below.is_empty() {
        for b in below {
            collect_leaves(root, &b, depth + 1, leaves, bio_based);
        }
        return;
    }
    match disk(root, name) {
        Some(d) if base.join("mq").is_dir() => leaves.push(d),
        _ => bio_based.push(name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hosts")
            .join(name)
    }

    fn cpuid(sig: Option<&str>) -> Cpuid {
        Cpuid {
            hypervisor_bit: sig.is_some(),
            signature: sig.map(str::to_string),
            leaves: vec![],
            features: vec![],
        }
    }

    /// A sysfs tree with md0 (RAID0 over two NVMe partitions), an NVMe multipath head with two
    /// paths, and a bio-based zram disk.
    fn stacked_sysfs() -> tempfile::TempDir {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let dev = |name: &str, parent: Option<&str>, num: &str, mq: bool| {
            let dir = match parent {
                Some(p) => sys.join("devices/virtual").join(p).join(name),
                None => sys.join("devices/virtual").join(name),
            };
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("dev"), format!("{num}\n")).unwrap();
            if parent.is_some() {
                fs::write(dir.join("partition"), "1\n").unwrap();
            } else {
                fs::create_dir_all(sys.join("block")).unwrap();
                symlink(&dir, sys.join("block").join(name)).unwrap();
            }
            if mq {
                fs::create_dir_all(dir.join("mq/0")).unwrap();
            }
            fs::create_dir_all(sys.join("class/block")).unwrap();
            symlink(&dir, sys.join("class/block").join(name)).unwrap();
            fs::create_dir_all(sys.join("dev/block")).unwrap();
            symlink(&dir, sys.join("dev/block").join(num)).unwrap();
            dir
        };
        dev("nvme0n1", None, "259:0", true);
        dev("nvme0n1p1", Some("nvme0n1"), "259:1", false);
        dev("nvme1n1", None, "259:2", true);
        dev("nvme1n1p1", Some("nvme1n1"), "259:3", false);
        let md = dev("md0", None, "9:0", false);
        fs::create_dir_all(md.join("slaves")).unwrap();
        symlink(
            sys.join("class/block/nvme0n1p1"),
            md.join("slaves/nvme0n1p1"),
        )
        .unwrap();
        symlink(
            sys.join("class/block/nvme1n1p1"),
            md.join("slaves/nvme1n1p1"),
        )
        .unwrap();
        let head = dev("nvme2n1", None, "259:4", false);
        dev("nvme2c0n1", None, "259:5", true);
        dev("nvme2c1n1", None, "259:6", true);
        fs::create_dir_all(head.join("multipath")).unwrap();
        symlink(
            sys.join("block/nvme2c0n1"),
            head.join("multipath/nvme2c0n1"),
        )
        .unwrap();
        symlink(
            sys.join("block/nvme2c1n1"),
            head.join("multipath/nvme2c1n1"),
        )
        .unwrap();
        dev("zram0", None, "252:0", false);
        dev("vda", None, "254:0", true);
        root
    }

    #[test]
    fn device_names_give_their_request_based_disks_and_a_stranger_is_refused() {
        let root = stacked_sysfs();
        let names = |t: &TargetDisks| t.leaves.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(named_disks(root.path(), &[]), Ok(None));
        let one = named_disks(root.path(), &["vda".into()]).unwrap().unwrap();
        assert_eq!(
            (one.top.clone().unwrap().name, names(&one)),
            ("vda".into(), vec!["vda".into()])
        );
        // md0 stands for the NVMe disks under it.
        let two = named_disks(root.path(), &["md0".into(), "vda".into()])
            .unwrap()
            .unwrap();
        assert_eq!(names(&two), ["nvme0n1", "nvme1n1", "vda"]);
        assert_eq!(two.devs(), Some(vec![(259, 0), (259, 2), (254, 0)]));
        for bad in ["sdz", "", "../vda", "nvme0n1/queue"] {
            let e = named_disks(root.path(), &[bad.into()]).unwrap_err();
            assert!(
                e.contains("no such disk on this host") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn stacked_targets_resolve_to_their_request_based_disks() {
        let root = stacked_sysfs();
        let names = |t: &TargetDisks| t.leaves.iter().map(|d| d.name.clone()).collect::<Vec<_>>();

        let md = target_disks(root.path(), (9, 0));
        assert_eq!(md.top.as_ref().unwrap().name, "md0");
        assert_eq!(names(&md), ["nvme0n1", "nvme1n1"]);
        assert_eq!(md.devs(), Some(vec![(259, 0), (259, 2)]));
        assert!(md.note.as_deref().unwrap().contains("nvme0n1 + nvme1n1"));

        let multipath = target_disks(root.path(), (259, 4));
        assert_eq!(names(&multipath), ["nvme2c0n1", "nvme2c1n1"]);

        // A filesystem on a partition is measured on the partition's disk, no note.
        let part = target_disks(root.path(), (259, 1));
        assert_eq!(part.top.as_ref().unwrap().name, "nvme0n1");
        assert_eq!(names(&part), ["nvme0n1"]);
        assert_eq!(part.note, None);

        let plain = target_disks(root.path(), (254, 0));
        assert_eq!(names(&plain), ["vda"]);

        let zram = target_disks(root.path(), (252, 0));
        assert!(zram.leaves.is_empty());
        assert!(zram.note.unwrap().contains("bio-based"));

        let unknown = target_disks(root.path(), (0, 44));
        assert_eq!(unknown.devs(), None);
        assert!(unknown.note.unwrap().contains("not a block device"));
    }

    #[test]
    fn this_machine_is_a_kvm_microvm_with_one_virtio_queue_on_cpu1() {
        let f = fingerprint(&fixture("kvm-microvm"), cpuid(Some("KVMKVMKVM")));
        assert_eq!(f.hypervisor, "kvm");
        assert_eq!(f.platform, "microvm");
        assert_eq!(f.cpus, 2);
        assert_eq!(f.clocksource.as_deref(), Some("tsc"));
        let vda = &f.block_devices[0];
        assert_eq!(vda.name, "vda");
        assert_eq!(vda.kind, "virtio-blk");
        assert_eq!(vda.scheduler.as_deref(), Some("mq-deadline"));
        assert_eq!(vda.queues.len(), 1);
        let irq = vda.queues[0].irq.as_ref().unwrap();
        assert_eq!((irq.irq, irq.name.as_str()), (36, "virtio1-req.0"));
        assert_eq!(irq.effective_affinity.as_deref(), Some("1"));
        assert_eq!(
            f.describe(),
            "KVM guest (microVM, no SMBIOS) · AMD EPYC · 2 vCPU · clocksource tsc · timer lapic-deadline · vda virtio-blk, 1 queue, IRQ on CPU 1"
        );
    }

    /// Xen with Viridian on shows Hyper-V's signature in the first leaf and its own in the
    /// second; KVM with Hyper-V enlightenments the same way. The host's own signature wins.
    #[test]
    fn a_guest_showing_hyperv_first_is_named_by_its_own_leaf() {
        let leaf = |leaf: u32, signature: &str| virtgap_probes::virt::CpuidLeaf {
            leaf,
            max_leaf: leaf + 5,
            signature: signature.into(),
        };
        let with = |leaves: Vec<_>| Cpuid {
            hypervisor_bit: true,
            signature: Some("Microsoft Hv".into()),
            leaves,
            features: vec![],
        };
        let root = fixture("aws-nitro-i4i");
        let xen = with(vec![
            leaf(0x4000_0000, "Microsoft Hv"),
            leaf(0x4000_0100, "XenVMMXenVMM"),
        ]);
        assert_eq!(fingerprint(&root, xen).hypervisor, "xen");
        let kvm = with(vec![
            leaf(0x4000_0000, "Microsoft Hv"),
            leaf(0x4000_0100, "KVMKVMKVM"),
        ]);
        assert_eq!(fingerprint(&root, kvm).hypervisor, "kvm");
        let hyperv = with(vec![leaf(0x4000_0000, "Microsoft Hv")]);
        let f = fingerprint(&root, hyperv);
        assert_eq!(f.hypervisor, "hyperv");
        assert_eq!(
            f.cpuid.leaves.len(),
            1,
            "the leaves are kept in the profile"
        );
    }

    #[test]
    fn recognises_an_i3_xen_guest_and_its_pirq_nvme_queues() {
        let f = fingerprint(&fixture("aws-xen-i3"), cpuid(Some("XenVMMXenVMM")));
        assert_eq!(f.hypervisor, "xen");
        assert_eq!(f.platform, "aws-xen");
        assert_eq!(f.sys_hypervisor_type.as_deref(), Some("xen"));
        assert_eq!(f.clocksource.as_deref(), Some("xen"));
        // Timers programmed by hypercall, not by a TSC-deadline write that exits.
        assert_eq!(f.clockevent.as_deref(), Some("xen"));
        let nvme = f
            .block_devices
            .iter()
            .find(|d| d.name == "nvme0n1")
            .unwrap();
        assert_eq!(nvme.kind, "nvme");
        assert_eq!(nvme.queues.len(), 2);
        let q1 = nvme.queues[1].irq.as_ref().unwrap();
        assert_eq!(q1.name, "nvme0q2");
        assert_eq!(q1.chip, "xen-pirq-msi-x");
        assert!(
            f.describe().starts_with("Xen HVM guest (EC2)"),
            "{}",
            f.describe()
        );
    }

    #[test]
    fn recognises_a_nitro_guest_with_its_instance_type() {
        let f = fingerprint(&fixture("aws-nitro-i4i"), cpuid(Some("KVMKVMKVM")));
        assert_eq!(f.platform, "aws-nitro");
        assert_eq!(f.instance_type.as_deref(), Some("i4i.32xlarge"));
        let nvme = f
            .block_devices
            .iter()
            .find(|d| d.name == "nvme1n1")
            .unwrap();
        assert_eq!(
            nvme.model.as_deref(),
            Some("Amazon EC2 NVMe Instance Storage")
        );
        assert!(nvme.queues[0]
            .irq
            .as_ref()
            .unwrap()
            .chip
            .starts_with("PCI-MSI"));
        assert!(f.describe().contains("Nitro guest (EC2 i4i.32xlarge)"));
    }

    #[test]
    fn recognises_metal() {
        let f = fingerprint(&fixture("aws-metal-i3"), cpuid(None));
        assert_eq!(f.hypervisor, "none");
        assert_eq!(f.platform, "aws-metal");
        assert_eq!(f.instance_type.as_deref(), Some("i3.metal"));
        let nvme = &f.block_devices[0];
        assert_eq!(
            nvme.queues[0].irq.as_ref().unwrap().chip,
            "IR-PCI-MSIX-0000:00:1e.0"
        );
        assert!(
            f.describe().starts_with("bare metal (EC2 i3.metal)"),
            "{}",
            f.describe()
        );
    }
}
