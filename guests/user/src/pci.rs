//! PCI from ring 3: configuration space through ECAM (bus 0), BARs, capabilities, MSI-X
//! tables, and the supervisor's interrupt records. Shared by the drivers of kumo's
//! interrupt test device (`irq.rs`) and of virtio-net (`virtio.rs`, `net.rs`).
//!
//! Every access here is a plain memory access to an identity-mapped address below
//! 4 GiB (ECAM and BARs are mapped for ring 3); each one exits to the VMM, which is fine
//! at setup. Fast paths (doorbells, virtqueue notifications) should be ioeventfds.

use core::ptr::{read_volatile, write_volatile};

use kumo_abi::{BootInfo, DEVICE_VECTOR_BASE, DEVICE_VECTORS, IrqRecord};

use crate::sys;

pub const CAP_MSIX: u8 = 0x11;
pub const CAP_VENDOR: u8 = 0x09;

pub fn read8(addr: u64) -> u8 {
    // SAFETY: addresses come from the ECAM base and BARs the machine describes; the
    // identity map covers them (below 4 GiB) for ring 3.
    unsafe { read_volatile(addr as *const u8) }
}

pub fn read16(addr: u64) -> u16 {
    // SAFETY: as in `read8`.
    unsafe { read_volatile(addr as *const u16) }
}

pub fn read32(addr: u64) -> u32 {
    // SAFETY: as in `read8`.
    unsafe { read_volatile(addr as *const u32) }
}

pub fn write8(addr: u64, value: u8) {
    // SAFETY: as in `read8`.
    unsafe { write_volatile(addr as *mut u8, value) }
}

pub fn write16(addr: u64, value: u16) {
    // SAFETY: as in `read8`.
    unsafe { write_volatile(addr as *mut u16, value) }
}

pub fn write32(addr: u64, value: u32) {
    // SAFETY: as in `read8`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

/// A 64-bit register written as two 32-bit halves, low first (virtio allows this).
pub fn write64(addr: u64, value: u64) {
    write32(addr, value as u32);
    write32(addr + 4, (value >> 32) as u32);
}

/// One function on bus 0, found by its IDs.
pub struct Function {
    /// Its 4 KiB of configuration space in ECAM.
    pub cfg: u64,
}

impl Function {
    /// Every function on bus 0 (function 0 of each slot) with these IDs, in slot order.
    pub fn find_all(
        ecam: u64,
        vendor: u16,
        device: u16,
    ) -> impl Iterator<Item = Function> + 'static {
        let want = u32::from(vendor) | (u32::from(device) << 16);
        (0..32u64)
            .map(move |slot| ecam + (slot << 15))
            .filter(move |&cfg| read32(cfg) == want)
            .map(|cfg| Function { cfg })
    }

    /// Every function 0 on bus 0 of vendor `vendor`, in slot order.
    pub fn find_vendor(ecam: u64, vendor: u16) -> impl Iterator<Item = Function> + 'static {
        (0..32u64)
            .map(move |slot| ecam + (slot << 15))
            .filter(move |&cfg| read32(cfg) & 0xFFFF == u32::from(vendor))
            .map(|cfg| Function { cfg })
    }

    /// Memory space decode and bus mastering on (the status half is written 0: its
    /// bits are write-1-to-clear, so nothing changes there).
    pub fn enable(&self) {
        write32(self.cfg + 4, (read32(self.cfg + 4) & 0xFFFF) | 0x6);
    }

    /// The address BAR `index` decodes (memory BARs; 64-bit ones span two registers).
    pub fn bar(&self, index: u8) -> Option<u64> {
        if index > 5 {
            return None;
        }
        let at = self.cfg + 0x10 + 4 * u64::from(index);
        let low = read32(at);
        if low & 1 != 0 {
            return None; // I/O space: unreachable from ring 3
        }
        let mut base = u64::from(low & !0xF);
        if low & 0x6 == 0x4 && index < 5 {
            base |= u64::from(read32(at + 4)) << 32;
        }
        (base != 0).then_some(base)
    }

    /// Places every memory BAR that firmware left unassigned (0) in `[*next, end)`,
    /// naturally aligned, advancing `*next`; BARs already assigned stay. Firmware that
    /// does not assign BARs (qboot) leaves this to the OS. Memory decode is off while
    /// sizing. False if a BAR does not fit.
    pub fn assign_bars(&self, next: &mut u64, end: u64) -> bool {
        let command = read32(self.cfg + 4) & 0xFFFF;
        let mut index = 0u64;
        while index < 6 {
            let at = self.cfg + 0x10 + 4 * index;
            let low = read32(at);
            let wide = low & 0x7 == 0x4;
            let step = if wide { 2 } else { 1 };
            if low & 1 != 0 || low & !0xF != 0 || (wide && read32(at + 4) != 0) {
                index += step; // I/O space, or assigned
                continue;
            }
            write32(self.cfg + 4, command & !0x2);
            write32(at, 0xFFFF_FFFF);
            let mut mask = u64::from(read32(at) & !0xF);
            if mask == 0 && !wide {
                write32(at, low); // not implemented
                index += step;
                continue;
            }
            if wide {
                write32(at + 4, 0xFFFF_FFFF);
                mask |= u64::from(read32(at + 4)) << 32;
            } else {
                mask |= 0xFFFF_FFFF_0000_0000;
            }
            let size = (!mask).wrapping_add(1);
            write32(at, low);
            if wide {
                write32(at + 4, 0);
            }
            if mask != 0 && size != 0 {
                let base = (*next + size - 1) & !(size - 1);
                if base + size > end {
                    write32(self.cfg + 4, command);
                    return false;
                }
                write32(at, base as u32 | (low & 0xF));
                if wide {
                    write32(at + 4, (base >> 32) as u32);
                }
                *next = base + size;
            }
            index += step;
        }
        write32(self.cfg + 4, command);
        true
    }

    /// Configuration-space offsets of every capability with this ID, in chain order.
    pub fn capabilities(&self, id: u8) -> impl Iterator<Item = u64> + '_ {
        let has_list = read32(self.cfg + 4) & (1 << 20) != 0;
        let mut at = if has_list {
            u64::from(read32(self.cfg + 0x34) & 0xFC)
        } else {
            0
        };
        // Bounded: a broken chain must not hang us (48 capabilities fill 192 bytes).
        let mut left = 48;
        core::iter::from_fn(move || {
            while at >= 0x40 && left > 0 {
                left -= 1;
                let here = self.cfg + at;
                // Whole dwords only: the simplest configuration-space access.
                let header = read32(here);
                at = u64::from((header >> 8) & 0xFC);
                if header & 0xFF == u32::from(id) {
                    return Some(here);
                }
            }
            None
        })
    }

    /// Enables MSI-X (function unmasked; every entry starts masked) and returns its
    /// table and pending-bit array.
    pub fn msix(&self) -> Option<Msix> {
        let cap = self.capabilities(CAP_MSIX).next()?;
        let header = read32(cap);
        let vectors = ((header >> 16) & 0x7FF) as usize + 1;
        let table = read32(cap + 4);
        let pba = read32(cap + 8);
        let table = self.bar((table & 7) as u8)? + u64::from(table & !7);
        let pba = self.bar((pba & 7) as u8)? + u64::from(pba & !7);
        for entry in 0..vectors {
            write32(table + 16 * entry as u64 + 12, 1);
        }
        // Message control (the upper half): enable (bit 15), function mask (bit 14)
        // clear.
        write32(cap, (header & !(0xC000 << 16)) | (0x8000 << 16));
        Some(Msix {
            table,
            pba,
            vectors,
        })
    }
}

/// A function's MSI-X table, enabled.
pub struct Msix {
    table: u64,
    pba: u64,
    pub vectors: usize,
}

impl Msix {
    /// Points entry `entry` at `apic_id` with IDT vector `DEVICE_VECTOR_BASE + record`
    /// (so the supervisor fills [`IrqRecord`] `record`), masked or not.
    pub fn program(&self, entry: usize, apic_id: u32, record: usize, masked: bool) {
        let at = self.table + 16 * entry as u64;
        write32(at + 12, 1); // mask while rewriting
        write32(
            at,
            0xFEE0_0000 | ((apic_id & 0xFF) << 12) | (((apic_id >> 8) & 0x7F) << 5),
        );
        write32(at + 4, 0);
        write32(at + 8, DEVICE_VECTOR_BASE + record as u32);
        write32(at + 12, u32::from(masked));
    }

    pub fn mask(&self, entry: usize, masked: bool) {
        write32(self.table + 16 * entry as u64 + 12, u32::from(masked));
    }

    pub fn pending(&self, entry: usize) -> bool {
        let word = read32(self.pba + 4 * (entry as u64 / 32));
        word & (1 << (entry % 32)) != 0
    }
}

/// The APIC ID of CPU `cpu`, from the supervisor's APIC ID -> CPU table (not CPUID:
/// in ring 3 it may run natively and report the host's APIC ID).
pub fn apic_id(info: &BootInfo, cpu: u32) -> Option<u32> {
    // SAFETY: the supervisor's 256-byte table, identity-mapped and read-only to us,
    // written before ring 3 started.
    let table = unsafe { core::slice::from_raw_parts(info.apic_to_cpu as *const u8, 256) };
    table
        .iter()
        .position(|&c| u32::from(c) == cpu)
        .map(|id| id as u32)
}

/// The supervisor's interrupt records, one per device vector.
pub fn records(info: &BootInfo) -> &'static [IrqRecord] {
    // SAFETY: the supervisor's log, DEVICE_VECTORS records, identity-mapped; ring 0
    // writes it from interrupt handlers, so fields are only read with volatile loads.
    unsafe { core::slice::from_raw_parts(info.irq_log as *const IrqRecord, DEVICE_VECTORS) }
}

/// Interrupts taken so far on a record's vector.
pub fn count(record: &IrqRecord) -> u64 {
    // SAFETY: a field of a live record; volatile because ring 0 updates it.
    unsafe { read_volatile(&record.count) }
}

/// Sleeps in the supervisor until an interrupt arrives on `record`'s vector (or any
/// other interrupt, or `until_tsc`), unless its count has already moved past `seen`
/// (the low 32 bits are compared with interrupts off: no wake-up can be missed).
/// False if the machine has no TSC-deadline timer (nothing slept; poll instead).
pub fn wait_for_interrupt(record: &IrqRecord, seen: u64, until_tsc: u64) -> bool {
    sys::wait_until(
        (&raw const record.count).cast::<u32>(),
        seen as u32,
        until_tsc,
    )
}
