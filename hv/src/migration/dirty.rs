//! Which pages the vCPUs wrote: the two trackers KVM offers, behind one interface.
//!
//! - **Bitmap** (`KVM_GET_DIRTY_LOG`): one call returns (and clears) a bit per page
//!   of the slot; its cost grows with RAM size, however few pages were written.
//! - **Ring** (`KVM_CAP_DIRTY_LOG_RING`): KVM appends each first write of a page to
//!   the writing vCPU's ring, a shared mapping; harvesting reads the new entries and
//!   `KVM_RESET_DIRTY_RINGS` re-protects those pages. Its cost grows with the pages
//!   written. A full ring stops its vCPU (`KVM_EXIT_DIRTY_RING_FULL`) until harvested:
//!   the vCPU thread harvests then, into the set the migration takes next.
//!
//! The ring must be enabled before the VM's first vCPU exists, so the choice is made
//! when the VM is created ([`DirtyLogMode`]); both need `KVM_MEM_LOG_DIRTY_PAGES` on
//! the slot while a migration runs (see `live::DirtyLog`).

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use kvm_bindings::{
    KVM_CAP_DIRTY_LOG_RING, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_DIRTY_LOG_PAGE_OFFSET,
    kvm_dirty_gfn, kvm_enable_cap,
};
use kvm_ioctls::{VcpuFd, VmFd};

use super::stream::PAGE_SIZE;
use crate::Error;
use crate::kvm::ioctl;
use crate::memory_map::RamRegion;

/// How a VM tracks the pages its vCPUs write (`--dirty-log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyLogMode {
    #[default]
    Bitmap,
    Ring,
}

impl DirtyLogMode {
    pub fn name(self) -> &'static str {
        match self {
            DirtyLogMode::Bitmap => "bitmap",
            DirtyLogMode::Ring => "ring",
        }
    }
}

impl std::str::FromStr for DirtyLogMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bitmap" => Ok(DirtyLogMode::Bitmap),
            "ring" => Ok(DirtyLogMode::Ring),
            _ => Err(format!("unknown dirty log '{s}' (known: bitmap, ring)")),
        }
    }
}

/// Entries per vCPU ring (16 bytes each: 256 KiB a vCPU). A power of two; KVM
/// accepts up to 64 Ki entries here.
const RING_ENTRIES: u32 = 16 * 1024;
/// `kvm_dirty_gfn.flags`: KVM wrote the entry / userspace harvested it.
const GFN_DIRTY: u32 = 1;
const GFN_RESET: u32 = 2;

/// `_IO(KVMIO, 0xc7)`.
const KVM_RESET_DIRTY_RINGS: libc::c_ulong = 0xAEC7;

/// Turns the dirty ring on for `vm` (before any vCPU is created).
pub(crate) fn enable_ring(vm: &VmFd) -> Result<(), Error> {
    let bytes = u64::from(RING_ENTRIES) * std::mem::size_of::<kvm_dirty_gfn>() as u64;
    // The ACQ_REL flavour (entries published with release semantics) where the
    // kernel has it; the plain one otherwise (x86 orders stores anyway).
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_DIRTY_LOG_RING_ACQ_REL,
        ..Default::default()
    };
    cap.args[0] = bytes;
    if vm.enable_cap(&cap).is_ok() {
        return Ok(());
    }
    cap.cap = KVM_CAP_DIRTY_LOG_RING;
    vm.enable_cap(&cap)
        .map_err(ioctl("KVM_ENABLE_CAP(KVM_CAP_DIRTY_LOG_RING)"))
}

/// One vCPU's ring, mapped from its fd.
struct Ring {
    entries: *mut kvm_dirty_gfn,
    /// The next entry to look at (KVM fills them in order, wrapping).
    next: u32,
}

// SAFETY: the mapping is plain shared memory that lives as long as the `Ring`; every
// access goes through the tracker's mutex (or atomics, for the flags KVM shares).
unsafe impl Send for Ring {}

impl Ring {
    fn map(vcpu: &VcpuFd) -> Result<Ring, Error> {
        let len = RING_ENTRIES as usize * std::mem::size_of::<kvm_dirty_gfn>();
        let offset = i64::from(KVM_DIRTY_LOG_PAGE_OFFSET) * PAGE_SIZE as i64;
        // SAFETY: a fresh shared mapping of the vCPU fd's ring area, of the size the
        // ring was enabled with; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::Os {
                what: "mapping a vCPU's dirty ring",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Ring {
            entries: ptr.cast(),
            next: 0,
        })
    }

    /// Moves the entries KVM has written since the last call into `into`; `regions`
    /// name each slot's base.
    fn harvest(&mut self, regions: &[RamRegion], into: &mut BTreeSet<u64>) {
        loop {
            let index = (self.next % RING_ENTRIES) as usize;
            // SAFETY: `index` < RING_ENTRIES, inside the mapping; `flags` is a u32 at
            // the entry's start, aligned, and shared with KVM: accessed atomically.
            let entry = unsafe { self.entries.add(index) };
            // SAFETY: as above.
            let flags = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*entry).flags)) };
            if flags.load(Ordering::Acquire) & GFN_DIRTY == 0 {
                return;
            }
            // SAFETY: KVM wrote the entry before setting DIRTY (acquire above); it does
            // not touch it again until userspace resets it.
            let (slot, offset) = unsafe { ((*entry).slot, (*entry).offset) };
            if let Some(base) = slot_base(regions, slot) {
                into.insert(base + offset * PAGE_SIZE as u64);
            }
            flags.store(GFN_RESET, Ordering::Release);
            self.next = self.next.wrapping_add(1);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let len = RING_ENTRIES as usize * std::mem::size_of::<kvm_dirty_gfn>();
        // SAFETY: unmaps exactly the mapping made in `map`, used by nothing after this.
        unsafe { libc::munmap(self.entries.cast(), len) };
    }
}

/// The guest-physical base of a RAM slot (`kvm_dirty_gfn.slot`: address space in
/// the high 16 bits, slot id below; kumo uses address space 0).
fn slot_base(regions: &[RamRegion], slot: u32) -> Option<u64> {
    regions.iter().find(|r| r.slot == slot).map(|r| r.gpa)
}

/// Every vCPU's ring and the pages harvested from them not yet taken.
pub(crate) struct Rings {
    state: Mutex<RingsState>,
}

struct RingsState {
    rings: Vec<Ring>,
    /// The VM's RAM slots, to turn ring entries into addresses.
    regions: Vec<RamRegion>,
    harvested: BTreeSet<u64>,
}

impl Rings {
    pub(crate) fn map(vcpus: &[VcpuFd], regions: Vec<RamRegion>) -> Result<Rings, Error> {
        let rings = vcpus.iter().map(Ring::map).collect::<Result<_, _>>()?;
        Ok(Rings {
            state: Mutex::new(RingsState {
                rings,
                regions,
                harvested: BTreeSet::new(),
            }),
        })
    }

    /// Harvests every ring and has KVM re-protect the harvested pages. Called by the
    /// migration and by a vCPU whose ring filled up (it may not run on before).
    pub(crate) fn harvest(&self, vm: &VmFd) -> Result<(), Error> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let RingsState {
            rings,
            regions,
            harvested,
        } = &mut *st;
        for ring in rings.iter_mut() {
            ring.harvest(regions, harvested);
        }
        // SAFETY: an argument-less ioctl on the VM fd we own.
        let r = unsafe { libc::ioctl(vm.as_raw_fd(), KVM_RESET_DIRTY_RINGS as _) };
        if r < 0 {
            return Err(Error::Os {
                what: "KVM_RESET_DIRTY_RINGS",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// The pages written since the last take, in address order.
    pub(crate) fn take(&self, vm: &VmFd) -> Result<Vec<u64>, Error> {
        self.harvest(vm)?;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        Ok(std::mem::take(&mut st.harvested).into_iter().collect())
    }
}

/// The pages a `KVM_GET_DIRTY_LOG` bitmap of the slot at `base` marks, as
/// guest-physical addresses.
pub(crate) fn bitmap_pages(bitmap: &[u64], base: u64) -> Vec<u64> {
    let mut pages = Vec::new();
    for (word_index, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let bit = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            pages.push(base + (word_index as u64 * 64 + bit) * PAGE_SIZE as u64);
        }
    }
    pages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_bits_become_page_addresses_in_order() {
        let pages = bitmap_pages(&[0b1001, 0, 1 << 63], 0);
        let p = PAGE_SIZE as u64;
        assert_eq!(pages, [0, 3 * p, (2 * 64 + 63) * p]);
        let high = bitmap_pages(&[0b10], 1 << 32);
        assert_eq!(high, [(1 << 32) + p]);
    }

    #[test]
    fn modes_parse_by_name() {
        for mode in [DirtyLogMode::Bitmap, DirtyLogMode::Ring] {
            assert_eq!(mode.name().parse::<DirtyLogMode>(), Ok(mode));
        }
        assert!("both".parse::<DirtyLogMode>().is_err());
    }
}
