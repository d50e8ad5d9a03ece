//! The fuzz targets: a short seeded run in every `cargo test`, a timed one behind `just fuzz`
//! (see the crate's doc for the knobs).

use virtgap_fuzz::json::Profiles;
use virtgap_fuzz::workload::Specs;

/// Cases per `cargo test`: about two seconds each in a debug build.
const PROFILE_CASES: u32 = 384;
const SPEC_CASES: u32 = 4096;

#[test]
fn profile() {
    virtgap_fuzz::fuzz(&Profiles::load(), PROFILE_CASES, 2.0 / 3.0);
}

#[test]
fn spec() {
    virtgap_fuzz::fuzz(&Specs::load(), SPEC_CASES, 1.0 / 3.0);
}
