//! Kernel memory of the probes' BPF maps: the kernel's own figure where it reports one, and an
//! estimate from each map's definition that can be projected to hosts with more CPUs (per-CPU
//! maps, and maps sized by the CPU count, grow with them).

use libbpf_rs::{MapCore, MapType, Object};

use crate::report::{Family, MapMemory};

/// What sizes a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapShape {
    pub map_type: MapType,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

const BPF_F_NO_PREALLOC: u32 = 1;

fn round8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Bytes the kernel allocates for a map of `shape` on a host with `possible_cpus`, following the
/// kernel's allocation (array values rounded to 8 bytes; hash elements carry a 48-byte header,
/// one preallocated spare per CPU, and a bucket array rounded up to a power of two; per-CPU
/// values once per possible CPU). Page rounding and allocator slack are left out.
pub fn map_bytes(shape: &MapShape, possible_cpus: u64) -> u64 {
    let entries = u64::from(shape.max_entries);
    let key = round8(u64::from(shape.key_size));
    let value = round8(u64::from(shape.value_size));
    const HTAB_ELEM: u64 = 48;
    const BUCKET: u64 = 16;
    match shape.map_type {
        MapType::Array => entries * value,
        MapType::PercpuArray => entries * value * possible_cpus + entries * 8,
        MapType::Hash | MapType::LruHash => {
            let spares = if shape.map_type == MapType::Hash {
                possible_cpus
            } else {
                0
            };
            let elems = if shape.flags & BPF_F_NO_PREALLOC != 0 {
                0
            } else {
                (entries + spares) * (HTAB_ELEM + key + value)
            };
            elems + entries.next_power_of_two() * BUCKET
        }
        MapType::PercpuHash | MapType::LruPercpuHash => {
            let prealloc = shape.flags & BPF_F_NO_PREALLOC == 0;
            let per_entry = HTAB_ELEM + key + 8 + if prealloc { value * possible_cpus } else { 0 };
            entries * per_entry + entries.next_power_of_two() * BUCKET
        }
        // Small maps of other kinds (.rodata/.bss are arrays): their value size.
        _ => entries * value,
    }
}

/// Possible CPUs on this host.
pub fn possible_cpus() -> u64 {
    libbpf_rs::num_possible_cpus().map_or(1, |n| n as u64)
}

/// Memory of every map of a loaded object. `cpu_sized` names the maps whose entry count is
/// the possible-CPU count, so the projections scale them too.
pub fn object_maps(family: Family, object: &Object, cpu_sized: &[&str]) -> Vec<MapMemory> {
    let here = possible_cpus();
    object
        .maps()
        .map(|m| {
            let name = m.name().to_string_lossy().into_owned();
            // fdinfo's memlock is the kernel's real usage since Linux 6.4, its own estimate before.
            let fdinfo = m.query_fdinfo().ok();
            let shape = MapShape {
                map_type: m.map_type(),
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries: m.max_entries(),
                flags: fdinfo.as_ref().and_then(|i| i.map_flags).unwrap_or(0),
            };
            let scaled = |cpus: u64| {
                let mut s = shape;
                if cpu_sized.contains(&name.as_str()) {
                    s.max_entries = cpus as u32;
                }
                map_bytes(&s, cpus)
            };
            MapMemory {
                family,
                kernel_bytes: fdinfo.and_then(|i| i.memlock),
                estimated_bytes: map_bytes(&shape, here),
                estimated_bytes_64_cpus: scaled(64),
                estimated_bytes_192_cpus: scaled(192),
                map: name,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(map_type: MapType, key: u32, value: u32, entries: u32) -> MapShape {
        MapShape {
            map_type,
            key_size: key,
            value_size: value,
            max_entries: entries,
            flags: 0,
        }
    }

    #[test]
    fn per_cpu_maps_grow_with_the_cpu_count_and_shared_ones_do_not() {
        let hist = 2576;
        let shared = shape(MapType::Hash, 8, hist, 256);
        let per_cpu = shape(MapType::PercpuHash, 8, hist, 256);
        assert_eq!(
            map_bytes(&shared, 64),
            map_bytes(&shared, 2) + 62 * (48 + 8 + 2576)
        );
        assert!(map_bytes(&per_cpu, 192) > 190 * map_bytes(&per_cpu, 1) / 2);
        // The old layout: a per-CPU histogram hash of 1024 entries on 192 CPUs is ~0.5 GB.
        let old = shape(MapType::PercpuHash, 8, hist, 1024);
        assert!(map_bytes(&old, 192) > 500_000_000);
    }

    #[test]
    fn no_prealloc_hashes_hold_only_their_buckets_up_front() {
        let mut s = shape(MapType::Hash, 8, 2576, 1024);
        s.flags = BPF_F_NO_PREALLOC;
        assert_eq!(map_bytes(&s, 8), 1024 * 16);
    }
}
