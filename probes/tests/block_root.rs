//! Loads the block probe into the running kernel and checks it counts real O_DIRECT reads.
//! Needs root. Under CI (`CI` set) a missing capability fails the test; elsewhere it skips
//! with the reason printed.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

fn bpf_allowed() -> bool {
    match virtgap_probes::bpf_permission() {
        Ok(()) => true,
        Err(reason) if std::env::var_os("CI").is_some() => {
            panic!("BPF tests must run in CI, but: {reason}")
        }
        Err(reason) => {
            eprintln!("skipping BPF test: {reason}");
            false
        }
    }
}

/// The whole-disk device number (major, minor) holding `path`'s filesystem.
fn disk_of(path: &std::path::Path) -> (u32, u32) {
    let dev = std::fs::metadata(path).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).unwrap();
    let disk = if sys.join("partition").exists() {
        sys.parent().unwrap().to_path_buf()
    } else {
        sys
    };
    let text = std::fs::read_to_string(disk.join("dev")).unwrap();
    let (a, b) = text.trim().split_once(':').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

#[repr(align(4096))]
struct Block([u8; 4096]);

#[test]
fn counts_every_direct_read_on_the_disk() {
    if !bpf_allowed() {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("reads.bin");
    const BLOCKS: u64 = 256;
    {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![0x5a; (BLOCKS * 4096) as usize]).unwrap();
        f.sync_all().unwrap();
    }
    let disk = disk_of(dir.path());
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let mut block = Block([0; 4096]);
    let (done, counts, kind) = virtgap_probes::count_block_completions(|| {
        let mut n = 0u64;
        for i in 0..BLOCKS {
            // SAFETY: block is 4096 aligned bytes owned here, alive for the call.
            let r = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    block.0.as_mut_ptr().cast(),
                    4096,
                    (i * 4096) as i64,
                )
            };
            assert_eq!(r, 4096);
            n += 1;
        }
        n
    })
    .expect("the block probe loads and attaches");
    eprintln!(
        "block probe attached via {}; counts {counts:?}",
        kind.name()
    );
    let seen = counts.get(&disk).copied().unwrap_or_default();
    // Every direct read completes once on the disk; other processes may add more.
    assert!(
        seen.completions >= done,
        "{} completions for {done} reads on {disk:?}",
        seen.completions
    );
    assert!(seen.bytes >= done * 4096);
}
