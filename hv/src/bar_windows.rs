//! Direct windows: pieces of a passthrough device's BARs mapped into the guest as KVM
//! memory slots (VFIO's BAR mmap), so the guest reaches the device's registers and
//! memory with no exit at all. The PCI bus says where each window decodes now
//! (`WindowWiring`), and this wiring moves the slot with the BAR, as
//! [`crate::doorbells`] moves ioeventfds.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use devices::pci::WindowWiring;
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;

/// KVM memory slots for windows start here (guest RAM takes the slots of
/// [`crate::memory_map::ram_regions`], far below).
const FIRST_WINDOW_SLOT: u32 = 32;
/// At most this many windows are mapped at once per VM (KVM has at least 509 slots).
const MAX_WINDOWS: u32 = 256;

/// `len` bytes of a device mapped into this process (`mmap` of a VFIO device or a
/// vfio-user region's descriptor), unmapped when dropped; `offset` is where they
/// start in the device's region.
#[derive(Debug)]
pub struct DeviceMapping {
    host: NonNull<u8>,
    len: u64,
    offset: u64,
}

// SAFETY: the mapping is plain shared memory owned by this value; every access to it
// goes through KVM (the guest) or the device, never through a Rust reference.
unsafe impl Send for DeviceMapping {}
// SAFETY: as above; `&DeviceMapping` exposes only the address and lengths.
unsafe impl Sync for DeviceMapping {}

impl DeviceMapping {
    /// Maps `len` bytes of `fd` from `file_offset`, shared and writable; they are
    /// bytes `offset..offset + len` of the device's region.
    pub fn map(fd: i32, file_offset: u64, len: u64, offset: u64) -> Result<DeviceMapping, String> {
        if len == 0 || !len.is_multiple_of(devices::pci::passthrough::WINDOW_PAGE) {
            return Err(format!("cannot map {len:#x} bytes (not whole pages)"));
        }
        let file_offset =
            libc::off_t::try_from(file_offset).map_err(|_| "offset out of range".to_string())?;
        // SAFETY: a fresh shared mapping chosen by the kernel (no fixed address, so no
        // existing mapping is replaced); the result is checked.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                file_offset,
            )
        };
        if host == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Ok(DeviceMapping {
            host: NonNull::new(host.cast()).ok_or("mmap returned null")?,
            len,
            offset,
        })
    }

    /// Where the mapping starts in the device's region, and its length.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.len
    }
}

impl Drop for DeviceMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `map` made, unmapped once; KVM no longer uses it
        // (`MemoryWindows` deletes its slots before it lets go of the mapping).
        unsafe { libc::munmap(self.host.as_ptr().cast(), self.len as usize) };
    }
}

/// A window as the VMM holds it: `size` bytes of `mapping` from `offset` in it.
#[derive(Debug, Clone)]
pub struct HostWindow {
    pub mapping: Arc<DeviceMapping>,
    pub offset: u64,
    pub size: u64,
}

impl HostWindow {
    /// The window `start..start + size` of the device's region, inside `mapping`.
    pub fn of(mapping: &Arc<DeviceMapping>, start: u64, size: u64) -> Option<HostWindow> {
        let range = mapping.range();
        let end = start.checked_add(size)?;
        (range.start <= start && end <= range.end).then(|| HostWindow {
            mapping: mapping.clone(),
            offset: start - range.start,
            size,
        })
    }

    fn host_address(&self) -> u64 {
        self.mapping.host.as_ptr() as u64 + self.offset
    }
}

#[derive(Default)]
struct Slots {
    /// Every device's windows, by (PCI slot, window id).
    windows: HashMap<(u8, u32), HostWindow>,
    /// The KVM slot of each window mapped now.
    mapped: HashMap<(u8, u32), u32>,
    free: Vec<u32>,
    next: u32,
}

/// The windows of every device of a VM and the KVM slots they are mapped at.
pub(crate) struct MemoryWindows {
    vm: Arc<VmFd>,
    slots: Mutex<Slots>,
}

impl MemoryWindows {
    pub(crate) fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            slots: Mutex::new(Slots::default()),
        }
    }

    /// Window `id` of the device in `slot` is `window` (before the device decodes).
    pub(crate) fn provide(&self, slot: u8, id: u32, window: HostWindow) {
        self.lock().windows.insert((slot, id), window);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_slot(
        &self,
        slot: u32,
        address: u64,
        window: Option<&HostWindow>,
    ) -> std::io::Result<()> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: address,
            memory_size: window.map_or(0, |w| w.size),
            userspace_addr: window.map_or(0, HostWindow::host_address),
        };
        // SAFETY: a window's host range lies inside its mapping (`HostWindow::of`),
        // which this wiring holds until the slot is deleted (size 0, here or in
        // `drop`), so KVM never sees a range that could be unmapped and reused.
        unsafe { self.vm.set_user_memory_region(region) }.map_err(std::io::Error::from)
    }
}

impl WindowWiring for MemoryWindows {
    fn attach(&self, slot: u8, id: u32, address: u64) {
        let mut slots = self.lock();
        let Some(window) = slots.windows.get(&(slot, id)).cloned() else {
            return;
        };
        let kvm_slot = match slots.free.pop() {
            Some(s) => s,
            None if slots.next < MAX_WINDOWS => {
                slots.next += 1;
                FIRST_WINDOW_SLOT + slots.next - 1
            }
            None => {
                tracing::warn!("window {slot}.{id}: no KVM memory slot left; its accesses trap");
                return;
            }
        };
        match self.set_slot(kvm_slot, address, Some(&window)) {
            Ok(()) => {
                slots.mapped.insert((slot, id), kvm_slot);
            }
            Err(e) => {
                // E.g. the guest placed the BAR over RAM or another window: the
                // accesses then reach the device through the exit path.
                tracing::debug!("window {slot}.{id} at {address:#x}: KVM memory slot: {e}");
                slots.free.push(kvm_slot);
            }
        }
    }

    fn detach(&self, slot: u8, id: u32, address: u64) {
        let mut slots = self.lock();
        if let Some(kvm_slot) = slots.mapped.remove(&(slot, id)) {
            if let Err(e) = self.set_slot(kvm_slot, address, None) {
                tracing::warn!("window {slot}.{id} at {address:#x}: deleting its slot: {e}");
            }
            slots.free.push(kvm_slot);
        }
    }
}

impl Drop for MemoryWindows {
    /// Deletes every window's slot before the mappings can go.
    fn drop(&mut self) {
        let mapped: Vec<u32> = self.lock().mapped.drain().map(|(_, s)| s).collect();
        for kvm_slot in mapped {
            let _ = self.set_slot(kvm_slot, 0, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: u64) -> std::fs::File {
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"kumo-test-bar".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.set_len(len).unwrap();
        file
    }

    #[test]
    fn windows_lie_inside_their_mapping() {
        use std::os::fd::AsRawFd;
        let file = memfd(0x4000);
        let mapping = Arc::new(DeviceMapping::map(file.as_raw_fd(), 0, 0x4000, 0x2000).unwrap());
        assert_eq!(mapping.range(), 0x2000..0x6000);
        let w = HostWindow::of(&mapping, 0x3000, 0x1000).unwrap();
        assert_eq!(w.offset, 0x1000);
        assert!(HostWindow::of(&mapping, 0x1000, 0x1000).is_none());
        assert!(HostWindow::of(&mapping, 0x5000, 0x2000).is_none());
        assert!(HostWindow::of(&mapping, u64::MAX, 2).is_none());
        assert!(DeviceMapping::map(file.as_raw_fd(), 0, 0x800, 0).is_err());
        assert!(DeviceMapping::map(-1, 0, 0x1000, 0).is_err());
    }
}
