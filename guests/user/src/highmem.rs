//! RAM above 4 GiB: the supervisor leaves it unmapped and hands ring 3 zeroed room for
//! its page directories (`BootInfo::high_tables`), because filling 512 entries per GiB
//! costs ~2,000 emulated instructions in ring 0 on PVM hosts and nothing here. Run
//! once, by the master, before any CPU touches the range.

use kumo_abi::{BootInfo, high_table_count};

const GIB: u64 = 1 << 30;
const PAGE_2M: u64 = 2 << 20;
/// A page directory entry or table link: P | RW | US; PS for a 2 MiB page.
const TABLE_FLAGS: u64 = 0x7;
const PAGE_2M_FLAGS: u64 = 0x87;

/// Identity-maps `[high_start, high_end)` with 2 MiB pages.
pub fn map(info: &BootInfo) {
    let (start, end) = (info.high_start, info.high_end);
    if start >= end || info.high_tables == 0 {
        return;
    }
    let first_gib = start / GIB;
    for table in 0..high_table_count(start, end) {
        let gib = first_gib + table;
        let directory = (info.high_tables + table * 4096) as *mut u64;
        for entry in 0..512u64 {
            let address = gib * GIB + entry * PAGE_2M;
            if (start..end).contains(&address) {
                // SAFETY: the supervisor reserved these zeroed pages below the low
                // heap for this; nothing else uses them.
                unsafe {
                    directory
                        .add(entry as usize)
                        .write_volatile(address | PAGE_2M_FLAGS)
                };
            }
        }
        // SAFETY: `pdpt` is the live PDPT (identity-mapped, writable from ring 3);
        // entry `gib` (>= 4) was not present, and a not-present entry becoming
        // present needs no TLB flush on any CPU.
        unsafe {
            (info.pdpt as *mut u64)
                .add(gib as usize)
                .write_volatile(directory as u64 | TABLE_FLAGS)
        };
    }
}

/// `[start, end)` of RAM above 4 GiB (mapped by [`map`]) if it holds `bytes`: where
/// workloads' arenas go first, as OSes keep low memory for what needs 32-bit addresses.
pub fn room(info: &BootInfo, bytes: u64) -> Option<(u64, u64)> {
    let (start, end) = (info.high_start, info.high_end);
    (start < end && end - start >= bytes).then_some((start, end))
}
