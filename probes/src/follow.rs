//! Which processes attach mode follows: those named by pid (with the children they already
//! have), a cgroup's (and its sub-cgroups'), or every process with a given name. Read from
//! `/proc` and the cgroup filesystem under a root directory, so tests feed fixture trees; the
//! session's map holds the result ([`crate::ProbeSession::follow`]), and children forked later
//! join it in the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The initial pid namespace's inode number (PROC_PID_INIT_INO): the followed map holds the
/// kernel's own tgids, which `/proc` shows only from there.
const INIT_PIDNS_INO: u64 = 0xEFFF_FFFC;

/// What to attach to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachTarget {
    /// These processes, their threads and their children.
    Pids(Vec<u32>),
    /// Every process in this cgroup or below it (v2, or a v1 hierarchy).
    Cgroup(PathBuf),
    /// Every process with this name (`/proc/PID/comm`, which the kernel cuts at 15 bytes).
    Comm(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FollowError {
    #[error("--pid {0}: no such process, or it has exited (list processes with `ps -e`, or find one by name with `pgrep NAME`)")]
    NoSuchPid(u32),
    #[error("--cgroup {0}: no such cgroup (give a directory under /sys/fs/cgroup that has a cgroup.procs file, or a path relative to it)")]
    NoSuchCgroup(PathBuf),
    #[error("--cgroup {0}: no process in it or below it (start the workload in it first)")]
    EmptyCgroup(PathBuf),
    #[error("--comm {0}: no process has that name (names are cut at 15 characters; `ps -e -o comm` lists them)")]
    NoSuchComm(String),
    #[error(
        "--comm {0}: longer than the 15 characters the kernel keeps of a name; give its first 15"
    )]
    CommTooLong(String),
    #[error("attaching to processes needs virtgap in the host's pid namespace (this one numbers processes differently from the kernel); run it outside the container, e.g. with --pid=host")]
    NotInitialPidNamespace,
}

/// A process as `/proc/PID/stat` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Process {
    ppid: u32,
    comm: String,
}

/// Every process under `root`/proc: tgid → (parent, name).
fn processes(root: &Path) -> BTreeMap<u32, Process> {
    let Ok(dir) = fs::read_dir(root.join("proc")) else {
        return BTreeMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let tgid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            Some((tgid, parse_stat(&stat)?))
        })
        .collect()
}

/// `PID (COMM) STATE PPID …`; the name may hold spaces and parentheses, so it ends at the last
/// ')'. None for a process that has exited (a zombie, or dead): it does no more I/O.
fn parse_stat(stat: &str) -> Option<Process> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    if matches!(rest.next()?, "Z" | "X" | "x") {
        return None;
    }
    let ppid = rest.next()?.parse().ok()?;
    Some(Process { ppid, comm })
}

/// Whether `tgid` is a live process under `root`: a thread's id is not, nor a process that has
/// exited and waits for its parent to reap it (a zombie does no more I/O; following it would
/// keep a run going for nothing).
pub fn alive(root: &Path, tgid: u32) -> bool {
    let Ok(status) = fs::read_to_string(root.join(format!("proc/{tgid}/status"))) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let exited = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    !exited && field("Tgid:").and_then(|v| v.parse::<u32>().ok()) == Some(tgid)
}

/// Checks this process can name processes as the kernel does (its pid namespace is the
/// initial one); `/proc/self/ns/pid` unreadable is taken as the initial one.
pub fn check_pid_namespace(root: &Path) -> Result<(), FollowError> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(root.join("proc/self/ns/pid")) {
        Ok(m) if m.ino() != INIT_PIDNS_INO => Err(FollowError::NotInitialPidNamespace),
        _ => Ok(()),
    }
}

impl AttachTarget {
    /// What it names now, checked: every named pid exists, the cgroup exists and holds a
    /// process, some process has the name. Pids come with the children they already have.
    pub fn resolve(&self, root: &Path) -> Result<Vec<u32>, FollowError> {
        match self {
            Self::Pids(pids) => {
                if let Some(&gone) = pids.iter().find(|&&p| !alive(root, p)) {
                    return Err(FollowError::NoSuchPid(gone));
                }
            }
            Self::Cgroup(path) => {
                let dir = cgroup_dir(root, path)?;
                if cgroup_procs(&dir).is_empty() {
                    return Err(FollowError::EmptyCgroup(path.clone()));
                }
            }
            Self::Comm(name) => {
                if name.len() > 15 {
                    return Err(FollowError::CommTooLong(name.clone()));
                }
            }
        }
        let now = self.current(root);
        match self {
            Self::Comm(name) if now.is_empty() => Err(FollowError::NoSuchComm(name.clone())),
            _ => Ok(now),
        }
    }

    /// What it names now, unchecked (for the refresh during a run): the named pids still
    /// alive and their descendants, the cgroup's processes, the processes with the name.
    pub fn current(&self, root: &Path) -> Vec<u32> {
        match self {
            Self::Pids(pids) => {
                let all = processes(root);
                let mut found: BTreeSet<u32> = pids
                    .iter()
                    .copied()
                    .filter(|p| all.contains_key(p))
                    .collect();
                // Descendants: parents come before children only by chance, so repeat until
                // nothing joins.
                loop {
                    let joined: Vec<u32> = all
                        .iter()
                        .filter(|(t, p)| !found.contains(t) && found.contains(&p.ppid))
                        .map(|(&t, _)| t)
                        .collect();
                    if joined.is_empty() {
                        break;
                    }
                    found.extend(joined);
                }
                found.into_iter().collect()
            }
            Self::Cgroup(path) => cgroup_dir(root, path)
                .map(|d| cgroup_procs(&d))
                .unwrap_or_default(),
            Self::Comm(name) => processes(root)
                .into_iter()
                .filter(|(_, p)| &p.comm == name)
                .map(|(t, _)| t)
                .collect(),
        }
    }

    /// In words, for the summary and the profile.
    pub fn describe(&self) -> String {
        match self {
            Self::Pids(pids) => {
                let list: Vec<String> = pids.iter().map(u32::to_string).collect();
                format!("pid {} and children", list.join(","))
            }
            Self::Cgroup(p) => format!("cgroup {}", p.display()),
            Self::Comm(c) => format!("processes named {c}"),
        }
    }
}

/// The cgroup directory `path` names: itself when it holds `cgroup.procs`, else the same path
/// under the cgroup mount (v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified; else the first v1
/// hierarchy that has it).
fn cgroup_dir(root: &Path, path: &Path) -> Result<PathBuf, FollowError> {
    let holds = |d: &Path| d.join("cgroup.procs").is_file();
    let rooted = root.join(path.strip_prefix("/").unwrap_or(path));
    if path.is_absolute() && holds(&rooted) {
        return Ok(rooted);
    }
    let relative = path
        .strip_prefix("/sys/fs/cgroup")
        .or_else(|_| path.strip_prefix("/"))
        .unwrap_or(path);
    let mount = root.join("sys/fs/cgroup");
    let mut candidates = vec![mount.join(relative), mount.join("unified").join(relative)];
    if let Ok(hierarchies) = fs::read_dir(&mount) {
        let mut v1: Vec<PathBuf> = hierarchies
            .filter_map(Result::ok)
            .map(|e| e.path().join(relative))
            .collect();
        v1.sort();
        candidates.extend(v1);
    }
    candidates
        .into_iter()
        .find(|d| holds(d))
        .ok_or_else(|| FollowError::NoSuchCgroup(path.to_path_buf()))
}

/// The processes of cgroup `dir` and every cgroup below it.
fn cgroup_procs(dir: &Path) -> Vec<u32> {
    let mut found = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    // Bounded: a cgroup tree is not deep, but a loop of bind mounts must not hang the run.
    let mut visited = 0;
    while let Some(d) = stack.pop() {
        visited += 1;
        if visited > 100_000 {
            break;
        }
        if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
            found.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    found.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /proc and cgroup tree: 100 (postgres) → 101, 102 (postgres) → 103 (sh); 200 (dd);
    /// thread 104 of 101. Cgroup v2 "db.slice" holds 100 and, below it, 101.
    fn tree() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let proc_ = |tgid: u32, ppid: u32, comm: &str| {
            let d = root.path().join(format!("proc/{tgid}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("stat"), format!("{tgid} ({comm}) S {ppid} 1 1 0")).unwrap();
            fs::write(d.join("status"), format!("Name:\t{comm}\nTgid:\t{tgid}\n")).unwrap();
        };
        proc_(1, 0, "init");
        proc_(100, 1, "postgres");
        proc_(101, 100, "postgres");
        proc_(102, 100, "postgres");
        proc_(103, 102, "sh");
        proc_(200, 1, "dd");
        // A thread: its own /proc entry (reachable by id), its process's Tgid.
        let t = root.path().join("proc/104");
        fs::create_dir_all(&t).unwrap();
        fs::write(t.join("status"), "Name:\tpostgres\nTgid:\t101\n").unwrap();
        let cg = root.path().join("sys/fs/cgroup/db.slice");
        fs::create_dir_all(cg.join("backend")).unwrap();
        fs::write(cg.join("cgroup.procs"), "100\n").unwrap();
        fs::write(cg.join("backend/cgroup.procs"), "101\n").unwrap();
        fs::write(root.path().join("sys/fs/cgroup/cgroup.procs"), "1\n200\n").unwrap();
        root
    }

    #[test]
    fn a_pid_comes_with_its_children_and_grandchildren() {
        let root = tree();
        let t = AttachTarget::Pids(vec![100]);
        assert_eq!(t.resolve(root.path()), Ok(vec![100, 101, 102, 103]));
        assert_eq!(
            AttachTarget::Pids(vec![102, 200]).resolve(root.path()),
            Ok(vec![102, 103, 200])
        );
    }

    #[test]
    fn a_missing_pid_or_a_threads_id_is_no_such_process() {
        let root = tree();
        assert_eq!(
            AttachTarget::Pids(vec![100, 999]).resolve(root.path()),
            Err(FollowError::NoSuchPid(999))
        );
        assert_eq!(
            AttachTarget::Pids(vec![104]).resolve(root.path()),
            Err(FollowError::NoSuchPid(104))
        );
        assert!(alive(root.path(), 101) && !alive(root.path(), 104));
        // A zombie has exited: nothing of it is left to follow.
        fs::write(
            root.path().join("proc/200/status"),
            "Name:\tdd\nState:\tZ (zombie)\nTgid:\t200\n",
        )
        .unwrap();
        assert!(!alive(root.path(), 200));
        assert_eq!(
            AttachTarget::Pids(vec![200]).resolve(root.path()),
            Err(FollowError::NoSuchPid(200))
        );
    }

    #[test]
    fn a_cgroup_is_found_by_path_or_relative_to_the_mount_with_what_is_below_it() {
        let root = tree();
        for path in ["db.slice", "/db.slice", "/sys/fs/cgroup/db.slice"] {
            let t = AttachTarget::Cgroup(path.into());
            assert_eq!(t.resolve(root.path()), Ok(vec![100, 101]), "{path}");
        }
        assert_eq!(
            AttachTarget::Cgroup("nope".into()).resolve(root.path()),
            Err(FollowError::NoSuchCgroup("nope".into()))
        );
        fs::create_dir_all(root.path().join("sys/fs/cgroup/empty")).unwrap();
        fs::write(root.path().join("sys/fs/cgroup/empty/cgroup.procs"), "").unwrap();
        assert_eq!(
            AttachTarget::Cgroup("empty".into()).resolve(root.path()),
            Err(FollowError::EmptyCgroup("empty".into()))
        );
    }

    #[test]
    fn a_v1_hierarchy_is_searched_when_there_is_no_v2_cgroup() {
        let root = tempfile::tempdir().unwrap();
        let cg = root.path().join("sys/fs/cgroup/blkio/docker/abc");
        fs::create_dir_all(&cg).unwrap();
        fs::write(cg.join("cgroup.procs"), "7\n8\n").unwrap();
        let t = AttachTarget::Cgroup("docker/abc".into());
        assert_eq!(t.resolve(root.path()), Ok(vec![7, 8]));
    }

    #[test]
    fn processes_are_found_by_name_and_names_over_15_bytes_are_refused() {
        let root = tree();
        let t = AttachTarget::Comm("postgres".into());
        assert_eq!(t.resolve(root.path()), Ok(vec![100, 101, 102]));
        assert_eq!(
            AttachTarget::Comm("mysqld".into()).resolve(root.path()),
            Err(FollowError::NoSuchComm("mysqld".into()))
        );
        assert!(matches!(
            AttachTarget::Comm("a_very_long_process_name".into()).resolve(root.path()),
            Err(FollowError::CommTooLong(_))
        ));
    }

    #[test]
    fn a_name_with_spaces_and_parentheses_is_read_whole() {
        let p = parse_stat("42 (my (odd) name) R 7 42 42 0").unwrap();
        assert_eq!((p.comm.as_str(), p.ppid), ("my (odd) name", 7));
    }
}
