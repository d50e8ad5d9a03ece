//! The subcommands other than the TUI: `record` (and `workloads`), `diff`, `doctor` and
//! `calibrate`. Each parses nothing itself (`cli.rs` does) and returns the exit code.

pub mod calibrate;
pub mod diff;
pub mod doctor;
pub mod record;
