//! Helpers shared by the end-to-end tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;

pub mod slow_device;

/// A scratch directory on the build tree's disk-backed filesystem (O_DIRECT works there).
pub fn scratch(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Root-only tests: in CI (`CI` set) not being root is a failure, elsewhere a recorded skip.
pub fn root_allowed(what: &str) -> bool {
    virtgap_testkit::require(what, if is_root() { Ok(()) } else { Err("needs root") })
}

/// The file names in `dir`, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
