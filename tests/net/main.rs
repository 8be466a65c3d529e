//! NICs and MPI between VMs: domain 0's switch, passthrough through `kumo nic-server`, and QEMU as a peer.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.

#[path = "../common/mod.rs"]
mod common;

/// The guest's MPI built for the host, where `guests/user/src/comm.rs` expects it.
use kumo_lab::guest_mpi as mpi;

/// The guest's `Comm` adapter (NPB-MPI over the guest MPI), the same source file.
#[path = "../../guests/user/src/comm.rs"]
mod comm;

mod guest_net_input;
mod mpi_protocol;
mod mpi_shared;
mod multirank;
mod net;
mod npb_mpi;
mod npb_mpi_protocol;
mod passthrough;
mod qemu_net;
mod qemu_peer;
mod wire_tcp;
