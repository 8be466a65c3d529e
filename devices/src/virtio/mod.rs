//! Virtio 1.x devices for kumo's guests.
//!
//! Split as Firecracker and Cloud Hypervisor split it, so a second device (virtio-blk)
//! reuses everything but its own file:
//! - [`transport`]: the PCI function a guest driver sees (vendor capabilities for the
//!   common, notify, ISR and device-specific configuration, MSI-X, feature negotiation,
//!   queue setup, status and reset). It knows no device type; it drives a
//!   [`VirtioDevice`] and tells the VMM what to do through returned actions.
//! - [`chain`]: validated walks of descriptor chains (through the rust-vmm
//!   `virtio-queue` crate), so every device refuses malformed chains the same way.
//! - [`net`]: virtio-net on top.
//!
//! KVM-free: guest memory is any `vm_memory::GuestMemory`, interrupts leave through
//! [`crate::pci::MsixSink`], queue notifications arrive as calls from the VMM (which
//! normally serves the notify doorbells with ioeventfds).

use std::sync::Arc;

use virtio_queue::Queue;

pub mod chain;
pub mod net;
pub mod transport;

pub use transport::{NotifyDoorbell, TransportAction, VirtioPciDevice};

/// PCI vendor ID of every virtio device.
pub const VIRTIO_VENDOR_ID: u16 = 0x1af4;
/// Modern (1.x, non-transitional) devices are 0x1040 + device type.
pub const VIRTIO_DEVICE_ID_BASE: u16 = 0x1040;

/// Device types (virtio 1.2 section 5).
pub const TYPE_NET: u16 = 1;
pub const TYPE_BLOCK: u16 = 2;

/// Device status bits (virtio 1.2 section 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u8 = 1;
    pub const DRIVER: u8 = 2;
    pub const DRIVER_OK: u8 = 4;
    pub const FEATURES_OK: u8 = 8;
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    pub const FAILED: u8 = 0x80;
}

/// Transport-level feature bits (virtio 1.2 section 6).
pub mod features {
    /// Descriptors with `VIRTQ_DESC_F_INDIRECT`.
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    /// `used_event` / `avail_event` interrupt suppression.
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// A virtio 1.x device (kumo's devices are modern only and require it).
    pub const VERSION_1: u64 = 1 << 32;
}

/// Why an interrupt is raised (the transport maps it to an MSI-X vector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptCause {
    /// The device put buffers in queue `.0`'s used ring.
    Queue(u16),
    /// The device-specific configuration changed.
    Config,
}

/// How a device raises interrupts: given to it at activation by the transport, which
/// maps the cause to the vector the driver chose and honours MSI-X masking (held in
/// the PBA, sent on unmask).
pub trait VirtioInterrupt: Send + Sync {
    fn trigger(&self, cause: InterruptCause);
}

/// What a device gets when the driver sets DRIVER_OK.
pub struct Activation {
    /// The features both sides agreed on.
    pub features: u64,
    /// One per queue the device declared, in order; a queue the driver did not enable
    /// is present but not ready (`QueueT::ready` is false).
    pub queues: Vec<Queue>,
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

/// Why a device refused to activate (the transport then sets DEVICE_NEEDS_RESET).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ActivateError {
    #[error("queue {0} is required but was not enabled or does not fit guest memory")]
    QueueInvalid(u16),
    #[error("expected {expected} queues, got {got}")]
    QueueCount { expected: usize, got: usize },
}

/// A virtio device behind a transport: what makes a NIC a NIC (features, its
/// configuration space, its queues' meaning). Called by the transport with its own
/// lock held, so implementations must not call back into the transport.
pub trait VirtioDevice: Send + Sync {
    /// Virtio device type ([`TYPE_NET`], ...).
    fn device_type(&self) -> u16;
    /// Maximum size of each queue (a power of two); the count is the number of queues.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Features the device offers (including [`features::VERSION_1`]).
    fn features(&self) -> u64;
    /// Whether the device can work with `features` (already a subset of
    /// [`VirtioDevice::features`] with VERSION_1); e.g. a feature that requires another.
    fn accepts_features(&self, _features: u64) -> bool {
        true
    }
    /// Bytes of the device-specific configuration structure.
    fn config_len(&self) -> u64;
    /// Reads the device-specific configuration at `offset` (bytes past the end read 0).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration (read-only fields ignore writes).
    fn write_config(&self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: start using these queues.
    fn activate(&self, activation: Activation) -> Result<(), ActivateError>;
    /// The driver reset the device: drop the queues and anything in flight that
    /// belongs to the old driver instance.
    fn reset(&self);
}
