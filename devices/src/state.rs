//! Device state for snapshots and migration: plain serde structs, one per device kind,
//! taken with `state()` and put back with `from_state()` / `restore_state()`. Nothing
//! here knows the stream format (that is `hv`'s); a state that does not fit the device
//! it is restored into (another vector count, another identity) is an error, never a
//! panic, because a state may come from a peer.

use serde::{Deserialize, Serialize};

use crate::pci::config::ConfigSpaceState;
use crate::pci::msix::MsixState;

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
    pub virtio: Option<crate::virtio::transport::VirtioState>,
}
