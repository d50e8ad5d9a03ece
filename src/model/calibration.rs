//! Calibrated costs of operations that exit to the hypervisor (or would on some hosts), as
//! `virtgap calibrate` prints them and `record --calibrate` keeps them in a profile.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One calibrated operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Figure {
    pub name: String,
    pub what: String,
    pub median_ns: f64,
    pub p99_ns: f64,
    pub samples: usize,
}

/// What `calibrate` measured on a host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Calibration {
    pub clocksource: Option<String>,
    pub figures: Vec<Figure>,
}
