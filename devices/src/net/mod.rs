//! Networking between kumo's VMs that is not a device model: the learning Ethernet
//! switch ([`switch`]) that domain 0's backend threads run between virtio-net NICs.
//! Pure logic, no threads and no guest memory, so it can be tested and benchmarked
//! alone and driven by whatever threading the VMM picks.

pub mod switch;

/// Largest Ethernet frame kumo's NICs and switch carry (no virtio header): a 64 KiB IP
/// packet plus Ethernet and VLAN headers.
pub const MAX_FRAME_LEN: usize = 65550;
