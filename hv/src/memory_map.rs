//! Where a guest's RAM lies: the one place that turns a memory size into RAM regions
//! (used by the VM builder, the PVH memory map, migration, restore and passthrough),
//! and the host's limit on that size.
//!
//! RAM fills guest-physical `[0, 3 GiB)` first; whatever does not fit continues at
//! 4 GiB, above the 32-bit hole (PCI BARs, ECAM, I/O APIC, local APIC), as firmware
//! lays out PCs. Both regions are one memfd: the low region at file offset 0, the high
//! one right after it, so a size of N bytes is always an N-byte file.

use crate::Error;
use crate::layout::{MIB, PAGE_SIZE, PCI_MMIO_START};

/// End of RAM below the 32-bit hole (the hole starts where kumo assigns PCI BARs).
pub const LOW_RAM_MAX: u64 = PCI_MMIO_START;
/// Start of RAM above the hole.
pub const HIGH_RAM_BASE: u64 = 4 << 30;
/// The largest guest kumo builds, whatever the host: 256 GiB. The guest's page tables
/// cover 512 GiB of physical space with one PDPT, and KVM's dirty bitmap for it
/// (8 MiB) stays cheap to fetch each migration round.
pub const MAX_MEMORY_MIB: u64 = 256 << 10;

/// One contiguous range of guest RAM, backed by the memfd from `file_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamRegion {
    /// Its KVM memory slot.
    pub slot: u32,
    pub gpa: u64,
    pub size: u64,
    pub file_offset: u64,
}

impl RamRegion {
    pub fn end(&self) -> u64 {
        self.gpa + self.size
    }

    pub fn contains(&self, gpa: u64) -> bool {
        (self.gpa..self.end()).contains(&gpa)
    }
}

/// The RAM regions of a guest with `size` bytes (at most [`MAX_MEMORY_MIB`]): one
/// below the hole, and a second at [`HIGH_RAM_BASE`] if `size` exceeds [`LOW_RAM_MAX`].
pub fn ram_regions(size: u64) -> Vec<RamRegion> {
    let low = size.min(LOW_RAM_MAX);
    let mut regions = vec![RamRegion {
        slot: 0,
        gpa: 0,
        size: low,
        file_offset: 0,
    }];
    if size > low {
        regions.push(RamRegion {
            slot: 1,
            gpa: HIGH_RAM_BASE,
            size: size - low,
            file_offset: low,
        });
    }
    regions
}

/// RAM below the hole: where kernels, modules and boot data must lie.
pub fn low_ram_bytes(size: u64) -> u64 {
    size.min(LOW_RAM_MAX)
}

/// Whether the page at `gpa` is RAM in `regions`.
pub fn is_ram_page(regions: &[RamRegion], gpa: u64) -> bool {
    gpa.is_multiple_of(PAGE_SIZE)
        && regions
            .iter()
            .any(|r| r.contains(gpa) && gpa + PAGE_SIZE <= r.end())
}

/// The guest-physical ranges that memfd range `[start, end)` backs, in order.
pub fn file_to_guest(size: u64, start: u64, end: u64) -> Vec<(u64, u64)> {
    ram_regions(size)
        .iter()
        .filter_map(|r| {
            let lo = start.max(r.file_offset);
            let hi = end.min(r.file_offset + r.size);
            (lo < hi).then(|| (r.gpa + lo - r.file_offset, r.gpa + hi - r.file_offset))
        })
        .collect()
}

/// Why guest memory of a size cannot be built here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimit {
    pub max_mib: u64,
    pub what: &'static str,
}

/// The most guest memory this host allows: the smallest of [`MAX_MEMORY_MIB`], the
/// host's physical RAM (guest RAM is populated lazily, so a guest costs what it
/// touches; but a guest larger than the host could never be backed) and the process's
/// address-space limit (`ulimit -v`: the guest RAM is one mapping).
pub fn host_limit() -> HostLimit {
    // Read once per process: a VM is checked against it twice as it is built.
    static LIMIT: std::sync::OnceLock<HostLimit> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(read_host_limit)
}

fn read_host_limit() -> HostLimit {
    let mut limit = HostLimit {
        max_mib: MAX_MEMORY_MIB,
        what: "kumo's maximum",
    };
    if let Some(total) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total_kib(&m))
    {
        let mib = total / 1024;
        if mib < limit.max_mib {
            limit = HostLimit {
                max_mib: mib,
                what: "this host's physical RAM",
            };
        }
    }
    let mut rlimit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rlimit) } == 0
        && rlimit.rlim_cur != libc::RLIM_INFINITY
    {
        let mib = rlimit.rlim_cur / MIB;
        if mib < limit.max_mib {
            limit = HostLimit {
                max_mib: mib,
                what: "this process's address-space limit (ulimit -v)",
            };
        }
    }
    limit
}

/// Refuses `memory_mib` above [`host_limit`].
pub fn check_size(memory_mib: u64) -> Result<(), Error> {
    let limit = host_limit();
    if memory_mib > limit.max_mib {
        return Err(Error::MemoryTooLarge {
            memory_mib,
            max_mib: limit.max_mib,
            what: limit.what,
        });
    }
    Ok(())
}

/// `MemTotal` of `/proc/meminfo`, in KiB.
fn mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn small_guests_have_one_region_at_zero() {
        assert_eq!(
            ram_regions(64 * MIB),
            vec![RamRegion {
                slot: 0,
                gpa: 0,
                size: 64 * MIB,
                file_offset: 0
            }]
        );
        assert_eq!(
            ram_regions(3 * GIB).len(),
            1,
            "3 GiB still fits below the hole"
        );
    }

    #[test]
    fn the_rest_goes_above_4_gib_after_the_low_region_in_the_file() {
        let r = ram_regions(4608 * MIB);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].gpa, r[0].size), (0, 3 * GIB));
        assert_eq!(
            r[1],
            RamRegion {
                slot: 1,
                gpa: 4 * GIB,
                size: 1536 * MIB,
                file_offset: 3 * GIB
            }
        );
        assert_eq!(r.iter().map(|r| r.size).sum::<u64>(), 4608 * MIB);
        assert_eq!(low_ram_bytes(4608 * MIB), 3 * GIB);
    }

    #[test]
    fn pages_are_ram_only_inside_a_region() {
        let r = ram_regions(4 * GIB);
        assert!(is_ram_page(&r, 0));
        assert!(is_ram_page(&r, 3 * GIB - PAGE_SIZE));
        assert!(!is_ram_page(&r, 3 * GIB), "the hole");
        assert!(is_ram_page(&r, 4 * GIB));
        assert!(is_ram_page(&r, 5 * GIB - PAGE_SIZE));
        assert!(!is_ram_page(&r, 5 * GIB));
        assert!(!is_ram_page(&r, 4 * GIB + 1), "unaligned");
        assert!(!is_ram_page(&ram_regions(64 * MIB), 64 * MIB));
    }

    #[test]
    fn file_ranges_map_to_guest_ranges_across_the_hole() {
        let size = 4 * GIB;
        assert_eq!(file_to_guest(size, 0, 4096), vec![(0, 4096)]);
        assert_eq!(
            file_to_guest(size, 3 * GIB - 4096, 3 * GIB + 8192),
            vec![(3 * GIB - 4096, 3 * GIB), (4 * GIB, 4 * GIB + 8192)]
        );
        assert!(file_to_guest(size, 4 * GIB, 5 * GIB).is_empty());
    }

    #[test]
    fn meminfo_total_is_read_in_kib() {
        let m = "MemTotal:       24567890 kB\nMemFree:  1 kB\n";
        assert_eq!(mem_total_kib(m), Some(24_567_890));
        assert_eq!(mem_total_kib("MemFree: 1 kB\n"), None);
        let limit = host_limit();
        assert!(limit.max_mib > 0 && limit.max_mib <= MAX_MEMORY_MIB);
    }
}
