//! PVH boot information: `hvm_start_info`, the module list, the memory map and the
//! command line, as byte blobs placed at the addresses of `docs/guest-abi.md`. Pure.

use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};

use crate::Error;
use crate::layout::*;
use crate::memory_map::ram_regions;

pub const XEN_HVM_START_MAGIC: u32 = 0x336e_c578;
pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

const START_INFO_SIZE: usize = 56;
const MODLIST_ENTRY_SIZE: usize = 32;
const MEMMAP_ENTRY_SIZE: usize = 24;
// The blobs below are laid out by hand; check them against the PVH structs.
const _: () = assert!(size_of::<hvm_start_info>() == START_INFO_SIZE);
const _: () = assert!(size_of::<hvm_modlist_entry>() == MODLIST_ENTRY_SIZE);
const _: () = assert!(size_of::<hvm_memmap_table_entry>() == MEMMAP_ENTRY_SIZE);

/// Most modules the list at `MODLIST..MODLIST_END` holds.
/// (The clock offset word, `CLOCK_OFFSET`, ends the page: the list stops before it.)
pub const MAX_MODULES: usize = (CLOCK_OFFSET - MODLIST) as usize / MODLIST_ENTRY_SIZE;
const _: () = assert!(CLOCK_OFFSET + 8 <= MODLIST_END);
/// Longest command line (its NUL must fit too).
pub const MAX_CMDLINE: usize = CMDLINE_MAX as usize - 1;

/// One E820-typed range of the memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemRange {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// The memory map for `mem_size` bytes of RAM ([`ram_regions`]), in address order.
pub fn memory_map(mem_size: u64) -> Vec<MemRange> {
    let regions = ram_regions(mem_size);
    let low_end = regions[0].end();
    let mut map = vec![
        MemRange {
            addr: 0,
            size: LOW_RAM_END,
            kind: E820_RAM,
        },
        MemRange {
            addr: LOW_RAM_END,
            size: HIGH_RAM_START - LOW_RAM_END,
            kind: E820_RESERVED,
        },
    ];
    if low_end > HIGH_RAM_START {
        map.push(MemRange {
            addr: HIGH_RAM_START,
            size: low_end - HIGH_RAM_START,
            kind: E820_RAM,
        });
    }
    // As firmware does for the MCFG's region, so no OS takes it for anything else.
    map.push(MemRange {
        addr: PCI_ECAM_BASE,
        size: PCI_ECAM_SIZE,
        kind: E820_RESERVED,
    });
    // RAM above the 32-bit hole.
    map.extend(regions[1..].iter().map(|r| MemRange {
        addr: r.gpa,
        size: r.size,
        kind: E820_RAM,
    }));
    map
}

/// Places modules of `sizes` bytes page-aligned after `kernel_end` (and never below
/// 1 MiB, where kumo's boot data lives). Returns `(paddr, size)` per module and the
/// end of the last one.
pub fn place_modules(kernel_end: u64, sizes: &[u64]) -> Option<(Vec<(u64, u64)>, u64)> {
    let mut at = align_up(kernel_end.max(HIGH_RAM_START), PAGE_SIZE)?;
    let mut placed = Vec::with_capacity(sizes.len());
    let mut end = kernel_end;
    for &size in sizes {
        placed.push((at, size));
        end = at.checked_add(size)?;
        at = align_up(end, PAGE_SIZE)?;
    }
    Some((placed, end))
}

/// The NUL-terminated command line.
pub fn cmdline_bytes(cmdline: &str) -> Result<Vec<u8>, Error> {
    if cmdline.len() > MAX_CMDLINE {
        return Err(Error::CmdlineTooLong {
            len: cmdline.len(),
            max: MAX_CMDLINE,
        });
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(Error::CmdlineNul);
    }
    let mut b = Vec::with_capacity(cmdline.len() + 1);
    b.extend_from_slice(cmdline.as_bytes());
    b.push(0);
    Ok(b)
}

/// `hvm_start_info` (version 1).
pub fn start_info_bytes(nr_modules: u32, memmap_entries: u32, rsdp: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(START_INFO_SIZE);
    b.extend_from_slice(&XEN_HVM_START_MAGIC.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // version
    b.extend_from_slice(&0u32.to_le_bytes()); // flags
    b.extend_from_slice(&nr_modules.to_le_bytes());
    b.extend_from_slice(&(if nr_modules > 0 { MODLIST } else { 0 }).to_le_bytes());
    b.extend_from_slice(&CMDLINE.to_le_bytes());
    b.extend_from_slice(&rsdp.to_le_bytes());
    b.extend_from_slice(&MEMMAP.to_le_bytes());
    b.extend_from_slice(&memmap_entries.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes()); // reserved
    debug_assert_eq!(b.len(), START_INFO_SIZE);
    b
}

/// The module list (`hvm_modlist_entry` per module, no per-module command line).
pub fn modlist_bytes(modules: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(modules.len() * MODLIST_ENTRY_SIZE);
    for &(paddr, size) in modules {
        b.extend_from_slice(&paddr.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes()); // cmdline_paddr
        b.extend_from_slice(&0u64.to_le_bytes()); // reserved
    }
    b
}

/// The memory map (`hvm_memmap_table_entry` per range).
pub fn memmap_bytes(map: &[MemRange]) -> Vec<u8> {
    let mut b = Vec::with_capacity(map.len() * MEMMAP_ENTRY_SIZE);
    for r in map {
        b.extend_from_slice(&r.addr.to_le_bytes());
        b.extend_from_slice(&r.size.to_le_bytes());
        b.extend_from_slice(&r.kind.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
    }
    b
}

/// Everything kumo writes at boot except the kernel, modules and ACPI tables:
/// `(guest address, bytes)`.
pub fn boot_blobs(
    mem_size: u64,
    cmdline: &str,
    modules: &[(u64, u64)],
) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    if modules.len() > MAX_MODULES {
        return Err(Error::TooManyModules {
            count: modules.len(),
            max: MAX_MODULES,
        });
    }
    let map = memory_map(mem_size);
    Ok(vec![
        (
            START_INFO,
            start_info_bytes(modules.len() as u32, map.len() as u32, ACPI_START),
        ),
        (MODLIST, modlist_bytes(modules)),
        (MEMMAP, memmap_bytes(&map)),
        (CMDLINE, cmdline_bytes(cmdline)?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    #[test]
    fn start_info_fields_sit_at_their_pvh_offsets() {
        let b = start_info_bytes(2, 3, ACPI_START);
        assert_eq!(b.len(), 56);
        assert_eq!(u32_at(&b, 0), 0x336e_c578);
        assert_eq!(u32_at(&b, 4), 1);
        assert_eq!(u32_at(&b, 8), 0);
        assert_eq!(u32_at(&b, 12), 2);
        assert_eq!(u64_at(&b, 16), 0x6040);
        assert_eq!(u64_at(&b, 24), 0x20000);
        assert_eq!(u64_at(&b, 32), 0xe0000);
        assert_eq!(u64_at(&b, 40), 0x7000);
        assert_eq!(u32_at(&b, 48), 3);
        assert_eq!(
            u64_at(&start_info_bytes(0, 3, ACPI_START), 16),
            0,
            "no modules: no list"
        );
    }

    #[test]
    fn memory_map_is_low_ram_reserved_high_ram_then_ecam() {
        let map = memory_map(64 * MIB);
        assert_eq!(
            map,
            vec![
                MemRange {
                    addr: 0,
                    size: 0x9fc00,
                    kind: E820_RAM
                },
                MemRange {
                    addr: 0x9fc00,
                    size: 0x60400,
                    kind: E820_RESERVED
                },
                MemRange {
                    addr: 0x100000,
                    size: 63 * MIB,
                    kind: E820_RAM
                },
                MemRange {
                    addr: 0xe000_0000,
                    size: MIB,
                    kind: E820_RESERVED
                },
            ]
        );
        let b = memmap_bytes(&map);
        assert_eq!(b.len(), 4 * 24);
        assert_eq!(u64_at(&b, 72), 0xe000_0000);
        assert_eq!(u64_at(&b, 48), 0x100000);
        assert_eq!(u64_at(&b, 56), 63 * MIB);
        assert_eq!(u32_at(&b, 64), E820_RAM);
        assert_eq!(u32_at(&b, 24 + 16), E820_RESERVED);
        assert_eq!(memory_map(MIB).len(), 3, "no empty high-RAM entry");
    }

    #[test]
    fn memory_beyond_3_gib_is_listed_above_4_gib() {
        let map = memory_map(4608 * MIB);
        assert_eq!(map.len(), 5);
        assert_eq!(
            (map[2].addr, map[2].size),
            (0x100000, 3072 * MIB - 0x100000)
        );
        assert_eq!(map[3].addr, PCI_ECAM_BASE);
        assert_eq!(
            map[4],
            MemRange {
                addr: 4 << 30,
                size: 1536 * MIB,
                kind: E820_RAM
            }
        );
        let ram: u64 = map
            .iter()
            .filter(|r| r.kind == E820_RAM)
            .map(|r| r.size)
            .sum();
        assert_eq!(ram, 4608 * MIB - (HIGH_RAM_START - LOW_RAM_END));
        assert!(memmap_bytes(&map).len() as u64 <= MEMMAP_END - MEMMAP);
    }

    #[test]
    fn modules_are_page_aligned_after_the_kernel() {
        let (placed, end) = place_modules(0x123456, &[10, 0x1000, 1]).unwrap();
        assert_eq!(
            placed,
            vec![(0x124000, 10), (0x125000, 0x1000), (0x126000, 1)]
        );
        assert_eq!(end, 0x126001);
        let (placed, _) = place_modules(0x30000, &[5]).unwrap();
        assert_eq!(placed, vec![(0x100000, 5)], "never among the boot data");
        let (placed, end) = place_modules(0x200000, &[]).unwrap();
        assert!(placed.is_empty());
        assert_eq!(end, 0x200000);
        assert!(place_modules(u64::MAX - 10, &[1]).is_none());

        let b = modlist_bytes(&[(0x124000, 10), (0x125000, 0x1000)]);
        assert_eq!(b.len(), 64);
        assert_eq!(u64_at(&b, 32), 0x125000);
        assert_eq!(u64_at(&b, 40), 0x1000);
        assert_eq!(u64_at(&b, 48), 0);
    }

    #[test]
    fn cmdline_is_nul_terminated_and_bounded() {
        assert_eq!(cmdline_bytes("npb=ep.S").unwrap(), b"npb=ep.S\0");
        assert_eq!(cmdline_bytes("").unwrap(), b"\0");
        assert_eq!(cmdline_bytes(&"x".repeat(4095)).unwrap().len(), 4096);
        assert!(matches!(
            cmdline_bytes(&"x".repeat(4096)),
            Err(Error::CmdlineTooLong {
                len: 4096,
                max: 4095
            })
        ));
        assert!(matches!(cmdline_bytes("a\0b"), Err(Error::CmdlineNul)));
    }

    #[test]
    fn blobs_fit_their_slots() {
        let mods: Vec<(u64, u64)> = (0..MAX_MODULES as u64)
            .map(|i| (0x200000 + i * 0x1000, 1))
            .collect();
        let blobs = boot_blobs(64 * MIB, "a b", &mods).unwrap();
        let limits = [
            (START_INFO, MODLIST),
            (MODLIST, MODLIST_END),
            (MEMMAP, MEMMAP_END),
            (CMDLINE, CMDLINE + CMDLINE_MAX),
        ];
        for ((addr, bytes), (lo, hi)) in blobs.iter().zip(limits) {
            assert_eq!(*addr, lo);
            assert!(
                addr + bytes.len() as u64 <= hi,
                "{addr:#x}: {} bytes",
                bytes.len()
            );
        }
        let too_many: Vec<(u64, u64)> = (0..=MAX_MODULES as u64).map(|i| (i, 1)).collect();
        assert!(matches!(
            boot_blobs(64 * MIB, "", &too_many),
            Err(Error::TooManyModules { .. })
        ));
    }
}
