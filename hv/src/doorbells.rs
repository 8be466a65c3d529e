//! Devices' doorbells served in the kernel: each is a KVM ioeventfd at the address where
//! the device's BAR decodes it now. The PCI bus tells this wiring when a doorbell
//! appears, moves or goes (memory decoding switched, BAR moved: `DoorbellWiring`), so
//! every BAR-backed device gets the same behaviour as real hardware: a write decodes
//! where the BAR is and nowhere else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use devices::pci::DoorbellWiring;
use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::EventFd;

/// The eventfds of the doorbells of every device of a VM, by (slot, doorbell id).
pub(crate) struct IoEventWiring {
    vm: Arc<VmFd>,
    fds: Mutex<HashMap<(u8, u32), EventFd>>,
}

impl IoEventWiring {
    pub(crate) fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            fds: Mutex::new(HashMap::new()),
        }
    }

    /// Doorbell `id` of the device in `slot` signals `fd` (before the device decodes).
    pub(crate) fn provide(&self, slot: u8, id: u32, fd: EventFd) {
        self.fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((slot, id), fd);
    }
}

impl DoorbellWiring for IoEventWiring {
    fn attach(&self, slot: u8, id: u32, address: u64) {
        let fds = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(fd) = fds.get(&(slot, id)) else {
            return; // a doorbell the VMM serves through the exit path only
        };
        if let Err(e) = self
            .vm
            .register_ioevent(fd, &IoEventAddress::Mmio(address), NoDatamatch)
        {
            // E.g. another device's doorbell already there (the guest placed two
            // BARs over each other). The write still reaches the device by an exit.
            tracing::debug!("doorbell {slot}.{id} at {address:#x}: KVM_IOEVENTFD: {e}");
        }
    }

    fn detach(&self, slot: u8, id: u32, address: u64) {
        let fds = self.fds.lock().unwrap_or_else(|e| e.into_inner());
        let Some(fd) = fds.get(&(slot, id)) else {
            return;
        };
        if let Err(e) = self
            .vm
            .unregister_ioevent(fd, &IoEventAddress::Mmio(address), NoDatamatch)
        {
            tracing::debug!("doorbell {slot}.{id} at {address:#x}: unregistering: {e}");
        }
    }
}
