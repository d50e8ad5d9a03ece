//! Skips for tests that need something of the host (root, BPF, tmux, FUSE, a kernel feature).
//!
//! A test that returns early passes as "ok", so a skip must be said elsewhere: every skip is
//! printed and, when `VIRTGAP_SKIP_LOG` names a file (`just test` sets it), appended to it as
//! one line, which `just test` lists after the run. Under CI (`CI` set) a missing capability
//! the project's CI machines have fails the test instead: a test that skips in CI cannot fail.
// Test helpers: their notes go to the harness's stderr, where eprintln! is fine.
#![allow(clippy::disallowed_macros)]

use std::fmt::Display;
use std::io::Write;

pub mod block;
pub mod chart;
pub mod proc_stat;

/// Whether this is a CI run (`CI` set, as `.ci/run` and most CI services do).
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// `Ok`: go on. `Err(why)`: under CI, panic ("`what` must run in CI: why"); elsewhere record
/// a skip and return false. For capabilities every CI machine has.
pub fn require<E: Display>(what: &str, ready: Result<(), E>) -> bool {
    match ready {
        Ok(()) => true,
        Err(why) if in_ci() => panic!("{what} must run in CI, but: {why}"),
        Err(why) => {
            skip(what, why);
            false
        }
    }
}

/// `require` for a setup step that yields what the test needs: `Some(value)`, or (after the
/// failure under CI or the recorded skip) `None`.
pub fn ready<T, E: Display>(what: &str, setup: Result<T, E>) -> Option<T> {
    match setup {
        Ok(value) => Some(value),
        Err(why) => {
            require(what, Err(why));
            None
        }
    }
}

/// Records a skip that is right on any machine, CI included: a host condition the test
/// cannot create (one CPU, a kernel older than the feature).
pub fn skip(what: &str, why: impl Display) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let line = format!("{test}: {what}: {why}");
    eprintln!("SKIPPED {line}");
    if let Some(path) = std::env::var_os("VIRTGAP_SKIP_LOG") {
        // One write per line to an O_APPEND file: test threads and binaries do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "(could not add the skip to {}: {e})",
                path.to_string_lossy()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_one_line_in_the_log() {
        let dir = std::env::temp_dir().join(format!("vg-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.log");
        // The only test here that sets or reads this variable.
        std::env::set_var("VIRTGAP_SKIP_LOG", &log);
        skip("the thing", "no such device");
        skip("another", 42);
        std::env::remove_var("VIRTGAP_SKIP_LOG");
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with(": the thing: no such device"), "{text}");
        assert!(lines[0].contains("a_skip_is_one_line_in_the_log"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_ready_capability_is_not_a_skip_and_a_missing_one_fails_in_ci() {
        assert!(require::<String>("x", Ok(())));
        // The only test here that sets or reads CI.
        let was = std::env::var_os("CI");
        std::env::set_var("CI", "1");
        let outcome = std::panic::catch_unwind(|| require("the probe test", Err("no BPF")));
        match was {
            Some(v) => std::env::set_var("CI", v),
            None => std::env::remove_var("CI"),
        }
        let msg = outcome.expect_err("a missing capability fails under CI");
        let msg = msg.downcast_ref::<String>().unwrap();
        assert_eq!(msg, "the probe test must run in CI, but: no BPF");
    }
}
