//! virtgap as a library: the profile model, the diff and the renderers for tests and benches to
//! call directly, and the commands the `virtgap` binary dispatches to.

// No function longer than clippy.toml's threshold outside tests (code lines, comments apart).
#![warn(clippy::too_many_lines)]
#![cfg_attr(test, allow(clippy::too_many_lines))]

// First, so that `say!` and `progress!` are in scope in every module below.
#[macro_use]
pub mod stderr;

pub mod analysis;
pub mod cli;
pub mod cmd;
pub mod model;
pub mod render;
pub mod run;
pub mod tui;
