//! Where each I/O goes: uniform or zipf random block offsets over the whole target, or one
//! sequential stream per worker over its own disjoint region.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution as _, Zipf};

use crate::spec::Pattern;
use crate::values::Distribution;

/// Produces the byte offset of each I/O for one worker.
#[derive(Debug)]
pub struct OffsetGenerator {
    bs: u64,
    rng: SmallRng,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Uniform {
        blocks: u64,
    },
    Zipf {
        blocks: u64,
        zipf: Zipf<f64>,
    },
    Sequential {
        first_block: u64,
        blocks: u64,
        next: u64,
    },
}

impl OffsetGenerator {
    /// `size` bytes of target, `bs` per I/O, worker `worker` of `workers`.
    pub fn new(
        pattern: Pattern,
        distribution: Distribution,
        size: u64,
        bs: u64,
        worker: u32,
        workers: u32,
        seed: u64,
    ) -> Self {
        let blocks = (size / bs).max(1);
        let kind = match (pattern, distribution) {
            (Pattern::Random | Pattern::Kv, Distribution::Uniform) => Kind::Uniform { blocks },
            (Pattern::Random | Pattern::Kv, Distribution::Zipf(theta)) => Kind::Zipf {
                blocks,
                zipf: Zipf::new(blocks as f64, theta).expect("validated zipf parameters"),
            },
            (Pattern::Sequential, _) => {
                let per_worker = (blocks / u64::from(workers)).max(1);
                Kind::Sequential {
                    first_block: per_worker * u64::from(worker),
                    blocks: per_worker,
                    next: 0,
                }
            }
        };
        Self {
            bs,
            rng: SmallRng::seed_from_u64(seed ^ u64::from(worker).wrapping_mul(0x9e37_79b9)),
            kind,
        }
    }

    /// The next offset in bytes, aligned to the block size.
    #[inline]
    pub fn next_offset(&mut self) -> u64 {
        let block = match &mut self.kind {
            Kind::Uniform { blocks } => self.rng.random_range(0..*blocks),
            Kind::Zipf { blocks, zipf } => {
                // Rank 1 is the hottest; scatter ranks over the target so hot blocks are not all
                // at its start (YCSB's scrambled zipfian does the same with FNV).
                let rank = zipf.sample(&mut self.rng) as u64;
                fnv1a64(rank) % *blocks
            }
            Kind::Sequential {
                first_block,
                blocks,
                next,
            } => {
                let b = *first_block + *next;
                *next = (*next + 1) % *blocks;
                b
            }
        };
        block * self.bs
    }

    /// A uniform draw in 0..100, for choosing read or write in a mix.
    #[inline]
    pub fn percent(&mut self) -> u8 {
        self.rng.random_range(0..100)
    }
}

fn fnv1a64(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in x.to_le_bytes() {
        h ^= u64::from(byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn uniform_offsets_are_aligned_and_in_range() {
        let mut g = OffsetGenerator::new(
            Pattern::Random,
            Distribution::Uniform,
            1 << 20,
            4096,
            0,
            1,
            7,
        );
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let o = g.next_offset();
            assert_eq!(o % 4096, 0);
            assert!(o + 4096 <= 1 << 20);
            seen.insert(o);
        }
        assert_eq!(seen.len(), 256, "10k draws over 256 blocks touch them all");
    }

    #[test]
    fn sequential_workers_own_disjoint_regions_and_wrap() {
        let size = 8 * 4096;
        let mut a = OffsetGenerator::new(
            Pattern::Sequential,
            Distribution::Uniform,
            size,
            4096,
            0,
            2,
            1,
        );
        let mut b = OffsetGenerator::new(
            Pattern::Sequential,
            Distribution::Uniform,
            size,
            4096,
            1,
            2,
            1,
        );
        let a_offs: Vec<u64> = (0..5).map(|_| a.next_offset()).collect();
        let b_offs: Vec<u64> = (0..5).map(|_| b.next_offset()).collect();
        assert_eq!(a_offs, [0, 4096, 8192, 12288, 0]);
        assert_eq!(b_offs, [16384, 20480, 24576, 28672, 16384]);
    }

    #[test]
    fn zipf_concentrates_on_few_blocks() {
        let mut g = OffsetGenerator::new(
            Pattern::Random,
            Distribution::Zipf(0.99),
            1 << 30,
            4096,
            0,
            1,
            3,
        );
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let o = g.next_offset();
            assert!(o < 1 << 30 && o.is_multiple_of(4096));
            *counts.entry(o).or_insert(0u32) += 1;
        }
        let mut v: Vec<u32> = counts.into_values().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let top100: u32 = v.iter().take(100).sum();
        // Under uniform draws over 262,144 blocks the top 100 would hold well under 1%.
        assert!(
            top100 > 20_000,
            "top 100 blocks got only {top100} of 100k draws"
        );
    }
}
