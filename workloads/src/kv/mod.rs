//! The kv workload: a log-structured key-value store with Aerospike's I/O pattern, and the
//! ACT-style run on top of it.
//!
//! - `store` (over a lock-free `index`): the store itself; `spec`: the `[kv]` table.
//! - `fill`: loading and ageing the store before a run (`prepare`).
//! - `coordinator`: the run (`start`): its threads, the report every interval, the outcome.
//! - `inflight`: how many reads a ring keeps in flight, and how much of their time was queueing.
//! - `client`: what every client thread shares; `ring` (io_uring) and `service` (synchronous,
//!   as ACT's service threads) are the two client engines.
//! - `shared`: the state the kv threads share while the run goes on.
//! - `act_log`: ACT's text log; `verdict`: slices, the outcome and ACT's verdict on it.

mod act_log;
mod client;
mod coordinator;
mod fill;
mod index;
pub mod inflight;
mod ring;
mod service;
mod shared;
pub mod spec;
pub mod store;
mod verdict;

pub use coordinator::start;
pub use fill::{prepare, FillProgress, LoadedStore};
pub use store::{KvConfig, KvCounters, KvError, KvStore};
pub use verdict::{Behind, KvOutcome, KvVerdict, SliceResult, DELIVERED_MIN};
