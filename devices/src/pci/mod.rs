//! PCI for guests: configuration space with its write masks ([`config`]), MSI-X
//! ([`msix`]), and bus 0 with ECAM, the legacy configuration ports and BAR routing
//! ([`bus`]). KVM-free: the VMM feeds guest accesses in and turns MSI-X messages and
//! route changes into injections.

pub mod bus;
pub mod config;
pub mod msix;
pub mod passthrough;

pub use bus::{
    BarAllocator, ConfigPorts, DirectWindow, Doorbell, DoorbellWiring, HostBridge, PciBus,
    PciBusState, PciDevice, PciError, WindowWiring,
};
pub use config::{Bar, BarKind, BarRegion, ConfigError, ConfigSpace, ConfigSpaceState};
pub use msix::{Msix, MsixState, Update};
