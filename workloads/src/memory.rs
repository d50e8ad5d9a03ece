//! How much memory this process may still take before something kills it: the host's
//! MemAvailable, or its memory cgroup's limit minus what the cgroup uses, whichever is smaller.
//! A container's limit is far below the host's free memory, and going over it gets the process
//! killed (exit 137) with nothing said.
//!
//! Every path is read under a root directory (`/` on a real system) so tests can feed fixture
//! trees of /proc and /sys/fs/cgroup.

use std::fmt;
use std::path::{Path, PathBuf};

/// At or above this a cgroup v1 limit means "none": the kernel writes its page counter's
/// maximum, 9223372036854771712 with 4 KiB pages (a little less with larger pages).
const V1_UNLIMITED: u64 = 1 << 62;

/// The memory this process may still use, and what sets that figure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    pub bytes: u64,
    pub limited_by: Limit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The host's MemAvailable (/proc/meminfo).
    Host,
    /// A memory cgroup this process is in (its own or an ancestor, the tightest of them):
    /// `path` is its directory as the system names it, `limit` its memory.max (v2) or
    /// memory.limit_in_bytes (v1), `used` its usage less the page cache it can drop.
    Cgroup {
        path: PathBuf,
        limit: u64,
        used: u64,
    },
}

impl fmt::Display for Limit {
    /// What set the budget, to follow "N bytes available to this process under …".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Host => f.write_str("the host's available memory (MemAvailable)"),
            Limit::Cgroup { path, limit, used } => write!(
                f,
                "the memory cgroup {}'s limit of {} ({} in use)",
                crate::units::printable(&path.display().to_string()),
                crate::units::bytes(*limit),
                crate::units::bytes(*used)
            ),
        }
    }
}

/// The memory this process may still use: the smaller of the host's MemAvailable and, for each
/// memory cgroup it is in (cgroup v2 and v1, the cgroup itself and every ancestor up to its
/// hierarchy's root), the limit minus the usage (less inactive page cache, which the kernel
/// drops before it kills). None when neither can be read.
pub fn available(root: &Path) -> Option<MemoryBudget> {
    let host = mem_available(root).map(|bytes| MemoryBudget {
        bytes,
        limited_by: Limit::Host,
    });
    let cgroup = cgroup_budget(root);
    match (host, cgroup) {
        (Some(h), Some(c)) => Some(if c.bytes < h.bytes { c } else { h }),
        (h, c) => h.or(c),
    }
}

/// Reads a file under `root` (`rel` is absolute on the real system).
fn read(root: &Path, rel: &Path) -> Option<String> {
    std::fs::read_to_string(under(root, rel)).ok()
}

fn under(root: &Path, rel: &Path) -> PathBuf {
    root.join(rel.strip_prefix("/").unwrap_or(rel))
}

/// MemAvailable from /proc/meminfo, in bytes.
fn mem_available(root: &Path) -> Option<u64> {
    let text = read(root, Path::new("/proc/meminfo"))?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A cgroup hierarchy mounted somewhere: `root` is the hierarchy's directory the mount shows
/// (not `/` inside a container without a cgroup namespace), `mountpoint` where.
#[derive(Debug)]
struct CgroupMount {
    version: Version,
    root: String,
    mountpoint: PathBuf,
}

/// The tightest memory cgroup over this process, across both hierarchies.
fn cgroup_budget(root: &Path) -> Option<MemoryBudget> {
    let membership = read(root, Path::new("/proc/self/cgroup"))?;
    let mounts = cgroup_mounts(&read(root, Path::new("/proc/self/mountinfo"))?);
    let mut best: Option<MemoryBudget> = None;
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let version = if id == "0" && controllers.is_empty() {
            Version::V2
        } else if controllers.split(',').any(|c| c == "memory") {
            Version::V1
        } else {
            continue;
        };
        for m in mounts.iter().filter(|m| m.version == version) {
            let Some(dir) = cgroup_dir(m, path) else {
                continue;
            };
            for candidate in chain(root, m, &dir, version) {
                if best.as_ref().is_none_or(|b| candidate.bytes < b.bytes) {
                    best = Some(candidate);
                }
            }
            // The same hierarchy mounted twice shows the same cgroups.
            break;
        }
    }
    best
}

/// The cgroup hierarchies in /proc/self/mountinfo: v2, and v1 with the memory controller.
fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            let head: Vec<&str> = head.split(' ').collect();
            let mut tail = tail.split(' ');
            let (fstype, _source, options) = (tail.next()?, tail.next()?, tail.next()?);
            let version = match fstype {
                "cgroup2" => Version::V2,
                "cgroup" if options.split(',').any(|o| o == "memory") => Version::V1,
                _ => return None,
            };
            Some(CgroupMount {
                version,
                root: unescape(head.get(3)?),
                mountpoint: PathBuf::from(unescape(head.get(4)?)),
            })
        })
        .collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the cgroup at `path` in its hierarchy sits under mount `m` (None: outside what the
/// mount shows, as from inside a cgroup namespace whose root is below this process's cgroup).
fn cgroup_dir(m: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rest = if m.root == "/" {
        path
    } else {
        let rest = path.strip_prefix(m.root.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    let rest = Path::new(rest.trim_start_matches('/'));
    if rest
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(m.mountpoint.join(rest))
}

/// The budget under each limited cgroup from `dir` up to its mount's root.
fn chain(root: &Path, m: &CgroupMount, dir: &Path, version: Version) -> Vec<MemoryBudget> {
    let mut out = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if let Some(b) = budget_of(root, d, version) {
            out.push(b);
        }
        if d == m.mountpoint {
            break;
        }
        at = d.parent().filter(|p| p.starts_with(&m.mountpoint));
    }
    out
}

/// One cgroup's limit less its usage (None: no limit, or no memory controller there).
fn budget_of(root: &Path, dir: &Path, version: Version) -> Option<MemoryBudget> {
    let number = |name: &str| -> Option<String> {
        read(root, &dir.join(name)).map(|s| s.trim().to_string())
    };
    let (limit, usage, stat_key) = match version {
        Version::V2 => {
            let max = number("memory.max")?;
            if max == "max" {
                return None;
            }
            (
                max.parse::<u64>().ok()?,
                number("memory.current")?,
                "inactive_file",
            )
        }
        Version::V1 => {
            let limit = number("memory.limit_in_bytes")?.parse::<u64>().ok()?;
            if limit >= V1_UNLIMITED {
                return None;
            }
            (
                limit,
                number("memory.usage_in_bytes")?,
                "total_inactive_file",
            )
        }
    };
    let usage: u64 = usage.parse().ok()?;
    // Clean page cache is dropped before the cgroup's OOM killer runs: not in the way.
    let stat = read(root, &dir.join("memory.stat")).unwrap_or_default();
    let field = |key: &str| {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
    };
    let droppable = field(stat_key)
        .or_else(|| field("inactive_file"))
        .unwrap_or(0);
    let used = usage.saturating_sub(droppable);
    Some(MemoryBudget {
        bytes: limit.saturating_sub(used),
        limited_by: Limit::Cgroup {
            path: dir.to_path_buf(),
            limit,
            used,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree(tempfile::TempDir);

    impl Tree {
        fn new(meminfo_kib: u64) -> Self {
            let t = Tree(tempfile::tempdir().unwrap());
            t.write(
                "proc/meminfo",
                &format!(
                    "MemTotal:       24684000 kB\nMemFree:        20000000 kB\nMemAvailable:   {meminfo_kib} kB\n"
                ),
            );
            t
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.0.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }

        fn budget(&self) -> Option<MemoryBudget> {
            available(self.0.path())
        }
    }

    const MIB: u64 = 1 << 20;
    const V1_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_host_alone_without_cgroup_files() {
        let t = Tree::new(8 << 20);
        assert_eq!(
            t.budget(),
            Some(MemoryBudget {
                bytes: 8 << 30,
                limited_by: Limit::Host
            })
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(available(empty.path()), None);
    }

    #[test]
    fn a_v2_limit_below_the_host_wins_and_is_named() {
        let t = Tree::new(8 << 20);
        t.write("proc/self/cgroup", "0::/box/job\n");
        t.write(
            "proc/self/mountinfo",
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        t.write("sys/fs/cgroup/box/job/memory.max", "max\n");
        t.write("sys/fs/cgroup/box/job/memory.current", "1048576\n");
        t.write("sys/fs/cgroup/box/memory.max", &format!("{}\n", 64 * MIB));
        t.write(
            "sys/fs/cgroup/box/memory.current",
            &format!("{}\n", 20 * MIB),
        );
        t.write(
            "sys/fs/cgroup/box/memory.stat",
            &format!(
                "anon 4096\nfile 100\ninactive_file {}\nactive_file 0\n",
                12 * MIB
            ),
        );
        let b = t.budget().unwrap();
        let expect = Limit::Cgroup {
            path: PathBuf::from("/sys/fs/cgroup/box"),
            limit: 64 * MIB,
            used: 8 * MIB,
        };
        assert_eq!(
            b,
            MemoryBudget {
                bytes: 56 * MIB,
                limited_by: expect
            }
        );
        assert_eq!(
            b.limited_by.to_string(),
            "the memory cgroup /sys/fs/cgroup/box's limit of 64 MiB (8 MiB in use)"
        );
    }

    #[test]
    fn the_tightest_cgroup_of_the_chain_counts() {
        let t = Tree::new(8 << 20);
        t.write("proc/self/cgroup", "0::/a/b\n");
        t.write(
            "proc/self/mountinfo",
            "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        // b: 100 MiB limit, 10 used (90 left); a: 200 MiB, 150 used by b and its siblings (50).
        for (dir, max, cur) in [("a/b", 100, 10), ("a", 200, 150)] {
            t.write(
                &format!("sys/fs/cgroup/{dir}/memory.max"),
                &(max * MIB).to_string(),
            );
            t.write(
                &format!("sys/fs/cgroup/{dir}/memory.current"),
                &(cur * MIB).to_string(),
            );
        }
        let b = t.budget().unwrap();
        assert_eq!(b.bytes, 50 * MIB);
        assert!(
            matches!(&b.limited_by, Limit::Cgroup { path, .. } if path == Path::new("/sys/fs/cgroup/a"))
        );
    }

    #[test]
    fn a_v1_memory_cgroup_in_a_hybrid_layout() {
        let t = Tree::new(8 << 20);
        t.write(
            "proc/self/cgroup",
            "9:name=systemd:/\n4:memory:/jobs/one\n1:cpu:/\n0::/\n",
        );
        t.write("proc/self/mountinfo", V1_MOUNTS);
        let one = "sys/fs/cgroup/memory/jobs/one";
        t.write(
            &format!("{one}/memory.limit_in_bytes"),
            &(64 * MIB).to_string(),
        );
        t.write(
            &format!("{one}/memory.usage_in_bytes"),
            &(30 * MIB).to_string(),
        );
        t.write(
            &format!("{one}/memory.stat"),
            &format!(
                "cache 1\ninactive_file 0\ntotal_inactive_file {}\n",
                10 * MIB
            ),
        );
        // An "unlimited" parent and root are no limit.
        for dir in ["sys/fs/cgroup/memory/jobs", "sys/fs/cgroup/memory"] {
            t.write(
                &format!("{dir}/memory.limit_in_bytes"),
                "9223372036854771712\n",
            );
            t.write(&format!("{dir}/memory.usage_in_bytes"), "1000000000\n");
        }
        let b = t.budget().unwrap();
        assert_eq!(b.bytes, 44 * MIB);
        assert_eq!(
            b.limited_by,
            Limit::Cgroup {
                path: PathBuf::from("/sys/fs/cgroup/memory/jobs/one"),
                limit: 64 * MIB,
                used: 20 * MIB
            }
        );
    }

    #[test]
    fn unlimited_cgroups_leave_the_host_figure() {
        let t = Tree::new(1 << 20);
        t.write("proc/self/cgroup", "4:memory:/jobs/one\n0::/\n");
        t.write("proc/self/mountinfo", V1_MOUNTS);
        t.write(
            "sys/fs/cgroup/memory/jobs/one/memory.limit_in_bytes",
            "9223372036854710272\n",
        );
        t.write("sys/fs/cgroup/memory/jobs/one/memory.usage_in_bytes", "5\n");
        assert_eq!(t.budget().unwrap().limited_by, Limit::Host);
        // A limit above what the host has left is not the one in the way either.
        t.write(
            "sys/fs/cgroup/memory/jobs/one/memory.limit_in_bytes",
            &(4u64 << 30).to_string(),
        );
        assert_eq!(
            t.budget(),
            Some(MemoryBudget {
                bytes: 1 << 30,
                limited_by: Limit::Host
            })
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_followed_from_its_root() {
        // A container without a cgroup namespace: /proc/self/cgroup names the full path, the
        // mount shows only the container's part of the hierarchy.
        let t = Tree::new(8 << 20);
        t.write("proc/self/cgroup", "0::/docker/abc\n");
        t.write(
            "proc/self/mountinfo",
            "30 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
        );
        t.write("sys/fs/cgroup/memory.max", &(32 * MIB).to_string());
        t.write("sys/fs/cgroup/memory.current", &(2 * MIB).to_string());
        assert_eq!(t.budget().unwrap().bytes, 30 * MIB);
        // A cgroup outside what the mount shows is not guessed at.
        t.write("proc/self/cgroup", "0::/elsewhere\n");
        assert_eq!(t.budget().unwrap().limited_by, Limit::Host);
        t.write("proc/self/cgroup", "0::/docker/abc/../../x\n");
        assert_eq!(t.budget().unwrap().limited_by, Limit::Host);
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/my\040cgroups"), "/mnt/my cgroups");
        assert_eq!(unescape(r"a\134b"), r"a\b");
        assert_eq!(unescape(r"trailing\04"), r"trailing\04");
        let m = cgroup_mounts("1 2 0:1 / /x\\040y rw - cgroup2 none rw\n");
        assert_eq!(m[0].mountpoint, Path::new("/x y"));
    }

    #[test]
    fn this_host_reads_without_error() {
        // Whatever this machine is, the figure is there and no larger than MemAvailable, read
        // on both sides of it (the host's free memory moves between two reads).
        let before = mem_available(Path::new("/")).unwrap();
        let b = available(Path::new("/")).expect("/proc/meminfo is readable");
        let host = before.max(mem_available(Path::new("/")).unwrap());
        assert!(b.bytes <= host, "{b:?}");
    }
}
