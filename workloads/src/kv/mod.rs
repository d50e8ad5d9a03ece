//! The kv workload: a log-structured key-value store with Aerospike's I/O pattern (`store`,
//! over a lock-free `index`), its settings (`spec`), and the ACT-style run on top of it
//! (`runner`), whose client operations go through io_uring rings (`ring`) or, as ACT's do,
//! synchronous service threads.

mod index;
mod ring;
mod runner;
pub mod spec;
pub mod store;

pub use runner::{
    prepare, start, Behind, FillProgress, Judged, KvOutcome, KvVerdict, LoadedStore, SliceResult,
    DELIVERED_MIN, SLIPPED_LAG,
};
pub use store::{KvConfig, KvCounters, KvError, KvStore};
