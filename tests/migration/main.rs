//! Snapshots and live migration of whole VMs and of rank VMs of a running MPI job.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.

#[path = "../common/mod.rs"]
mod common;

mod migration;
mod node_domain;
mod seccomp;
mod snapshot;
