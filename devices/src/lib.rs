//! kumo's device models. This crate knows nothing of KVM or of `hv`: a device is driven
//! through [`PioDevice`] and tells its caller what to do next through [`IoAction`].
//!
//! Port map (see `docs/guest-abi.md`):
//! - `0x3F8..=0x3FF` COM1 ([`serial::Com1`])
//! - `0xF4..=0xF7` debug-exit ([`debug_exit::DebugExit`])
//! - `0x80` boot-timer ([`boot_timer::BootTimer`])
//! - `0xCF8..=0xCFF` PCI configuration ports ([`pci::ConfigPorts`])
//!
//! PCI ([`pci`]): bus 0 through ECAM (a memory window) or the ports above; devices'
//! memory BARs are routed by [`pci::PciBus::mmio_read`] / [`pci::PciBus::mmio_write`].
//!
//! Any other port reads as all ones and ignores writes.
//!
//! Network ([`virtio`], [`net`]): virtio-net behind a virtio 1.x PCI transport, and the
//! learning Ethernet switch domain 0 runs between NICs.

pub mod boot_timer;
pub mod bus;
pub mod debug_exit;
pub mod guest_errors;
pub mod interrupt;
pub mod irq_test;
pub mod net;
pub mod pci;
pub mod serial;
pub mod state;
pub mod vfio_user;
pub mod virtio;

pub use boot_timer::BootTimer;
pub use bus::{BusError, PioBus, PioRange};
pub use debug_exit::DebugExit;
pub use serial::Com1;
pub use state::{DeviceStateError, PciDeviceState};

/// What the caller (the vCPU loop) must do after a device handled an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum IoAction {
    /// Resume the guest.
    Continue,
    /// End the VM: the guest asked to exit with this value (debug-exit).
    Exit(u32),
}

/// A device on the port-I/O bus. `offset` is relative to the start of the range the
/// device was registered at. Devices shared by several vCPUs synchronise internally.
pub trait PioDevice: Send + Sync {
    /// Fills `data` (1, 2 or 4 bytes) with the value read at `offset`.
    fn read(&self, offset: u16, data: &mut [u8]);
    /// Handles a write of `data` (1, 2 or 4 bytes) at `offset`.
    fn write(&self, offset: u16, data: &[u8]) -> IoAction;
}

/// Little-endian value of an access of 1..=4 bytes (longer accesses are truncated).
pub(crate) fn le_value(data: &[u8]) -> u32 {
    data.iter()
        .take(4)
        .enumerate()
        .fold(0u32, |v, (i, b)| v | (u32::from(*b) << (8 * i)))
}
