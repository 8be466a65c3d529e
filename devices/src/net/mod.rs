//! Networking between kumo's VMs that is not a device model: the learning Ethernet
//! switch ([`switch`]) that domain 0's backend threads run between virtio-net NICs.
//! Pure logic, no threads and no guest memory, so it can be tested and benchmarked
//! alone and driven by whatever threading the VMM picks.

pub mod switch;
