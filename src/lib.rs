//! virtgap as a library: the profile model, the diff and the renderers for tests and benches to
//! call directly, and the commands the `virtgap` binary dispatches to.

pub mod analysis;
pub mod cli;
pub mod cmd;
#[cfg(test)]
mod fuzz;
pub mod model;
pub mod render;
pub mod run;
pub mod tui;
