//! Filling the kv store before a measured run: every key written once to the spec's fill
//! fraction, then overwritten until defrag reaches its steady state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};

use super::store::{KvConfig, KvError, KvStore};
use crate::spec::WorkloadSpec;
use crate::target::Target;

/// How far along the load is.
#[derive(Clone, Copy, Debug)]
pub struct FillProgress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

/// A loaded store and what loading it took.
#[derive(Debug)]
pub struct LoadedStore {
    pub store: Arc<KvStore>,
    pub keys: u64,
    /// Overwrites after the first write of every key, to bring defrag to its steady state.
    pub aging_overwrites: u64,
    pub seconds: f64,
}

/// Overwrites run after loading, as a multiple of the key count. A freshly loaded store has
/// every block full; uniform overwrites then drain them all at once, and defrag swings
/// (measured: large-block reads per write 1.2, then 0.8, ...) until about 2.5 rewrites of the
/// key space have spread the blocks' ages; from there the ratio stays within ±3% of 1.
const AGING_ROUNDS: u64 = 3;

fn config(spec: &WorkloadSpec) -> KvConfig {
    let kv = spec.kv.as_ref().expect("a kv spec");
    KvConfig {
        record_bytes: kv.record_bytes.0,
        record_bytes_max: kv.record_bytes_max.map_or(kv.record_bytes.0, |m| m.0),
        lb_bytes: spec.bs.0,
        defrag_lwm_pct: kv.defrag_lwm_pct,
        dsync: kv.dsync,
    }
}

/// Builds the store on `target` and loads it to the spec's fill fraction, then ages it with
/// overwrites. Ok(None): `stop` was set first.
pub fn prepare(
    spec: &WorkloadSpec,
    target: &Target,
    stop: &AtomicBool,
    mut progress: impl FnMut(FillProgress),
) -> Result<Option<LoadedStore>, KvError> {
    let kv = spec.kv.as_ref().expect("a kv spec");
    let cfg = config(spec);
    let blocks = target.size / cfg.lb_bytes;
    let keys = blocks * cfg.records_per_block() * kv.fill_pct / 100;
    if keys == 0 {
        return Err(KvError::TooSmall { blocks });
    }
    let store = Arc::new(KvStore::new(
        Arc::clone(&target.file),
        target.size,
        target.align as usize,
        cfg,
        keys,
    )?);
    let started = Instant::now();
    let aging = keys * AGING_ROUNDS;
    let total = keys + aging;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x6b76);
    let interrupted = std::thread::scope(|s| -> Result<bool, KvError> {
        store.start_background();
        let writer = s.spawn(|| store.run_writer(|_, _| {}));
        let defrag = s.spawn(|| store.run_defrag(|_, _| {}));
        let mut result = Ok(false);
        for i in 0..total {
            if i % 4096 == 0 {
                if stop.load(Ordering::Relaxed) {
                    result = Ok(true);
                    break;
                }
                let phase = if i < keys { "loading" } else { "aging" };
                progress(FillProgress {
                    phase,
                    done: i,
                    total,
                });
            }
            let key = if i < keys {
                i
            } else {
                rng.random_range(0..keys)
            };
            if let Err(e) = store.put(key) {
                result = Err(e);
                break;
            }
            // Unpaced loading would outrun defrag and leave a backlog of candidates (and a
            // store with no free blocks) that the measured run then works off.
            if i % 64 == 0 {
                store.wait_caught_up(2, 2);
            }
        }
        store.stop_background();
        let w = writer.join().expect("the writer does not panic");
        let d = defrag.join().expect("the defragmenter does not panic");
        let interrupted = result?;
        w?;
        d?;
        Ok(interrupted)
    })?;
    if interrupted {
        return Ok(None);
    }
    Ok(Some(LoadedStore {
        store,
        keys,
        aging_overwrites: aging,
        seconds: started.elapsed().as_secs_f64(),
    }))
}
