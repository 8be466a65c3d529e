//! Device state for snapshots and migration: plain serde structs, one per device kind,
//! taken with `state()` and put back with `from_state()` / `restore_state()`. Nothing
//! here knows the stream format (that is `hv`'s); a state that does not fit the device
//! it is restored into (another vector count, another identity) is an error, never a
//! panic, because a state may come from a peer.

use serde::{Deserialize, Serialize};

/// Why a saved state cannot be put into a device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceStateError {
    #[error("{device}: saved state does not fit: {why}")]
    Mismatch { device: &'static str, why: String },
    #[error("{device} cannot be saved (it has no state support)")]
    Unsupported { device: &'static str },
}

impl DeviceStateError {
    pub(crate) fn mismatch(device: &'static str, why: impl Into<String>) -> Self {
        DeviceStateError::Mismatch {
            device,
            why: why.into(),
        }
    }
}

/// One PCI function: its configuration registers and, if it has MSI-X, its table and
/// PBA. The device kind says which model the state belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDeviceState {
    pub kind: String,
    pub config: ConfigSpaceState,
    #[serde(default)]
    pub msix: Option<MsixState>,
    /// A virtio function's transport registers and its device's place in the queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtio: Option<VirtioState>,
}

/// The registers of a configuration space as a snapshot holds them (the layout, masks
/// and BAR sizes belong to the device model and are rebuilt by it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSpaceState {
    pub bytes: Vec<u8>,
}

/// A function's MSI-X table, PBA and control bits as a snapshot holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    /// Per vector: address low, address high, data, vector control.
    pub entries: Vec<[u32; 4]>,
    pub pending: Vec<u64>,
    pub enabled: bool,
    pub function_masked: bool,
}

/// One queue in a snapshot: the driver's setup and the device's place in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    pub size: u16,
    pub enabled: bool,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
    /// The device's next avail and used indices (0 unless the device was live).
    pub next_avail: u16,
    pub next_used: u16,
}

/// A virtio function's transport registers, and the live device's own state, in a
/// snapshot ([`PciDeviceState::virtio`]); the configuration space and MSI-X are
/// saved beside it as for any PCI function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioState {
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub status: u8,
    pub config_generation: u8,
    pub queue_select: u16,
    pub queues: Vec<QueueState>,
    pub isr: u8,
    pub config_vector: u16,
    pub queue_vectors: Vec<u16>,
    /// The virtio device's `LiveState::words` (empty unless the device was live).
    pub device: Vec<u64>,
}
