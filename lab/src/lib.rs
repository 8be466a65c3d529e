//! kumo's research harness: the seed experiments on real VMs (`experiment`), the
//! progress balancer that moves VMs between hosts of unequal speed (`balance`), the
//! simulator that runs the same credit-scheduler code (`sim`), the native twin
//! (`native`: the guest's NPB as host threads), the guest's MPI over an in-memory wire
//! (`loopback`, `guest_mpi`) and QEMU running the same guest (`qemu`, the yardstick).
//!
//! It stands on the VMM layer (`kumo-vmm`) and never the other way round: Cargo
//! refuses an arrow from the program back into the harness.

pub mod balance;
pub mod experiment;
/// The guest's MPI (`guests/user/src/mpi.rs`, the same source file) built for the host:
/// over [`loopback`] it is the bare-metal twin of the guests' network stack.
#[path = "../../guests/user/src/mpi.rs"]
pub mod guest_mpi;
pub mod loopback;
pub mod native;
pub mod qemu;
pub mod sim;
