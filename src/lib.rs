//! kumo: a research hypervisor for HPC experiments. This crate is the program: the
//! command line, the embedded NPB guest and how its results are judged and printed.
//! The VMM itself lives in `hv`, device models in `devices`, NPB in `guests/npb`.

pub mod bench;
pub mod bzimage;
pub mod cli;
pub mod ctl;
pub mod disk_image;
pub mod experiment;
pub mod guest;
/// The guest's MPI (`guests/user/src/mpi.rs`, the same source file) built for the host:
/// over [`loopback`] it is the bare-metal twin of the guests' network stack.
#[path = "../guests/user/src/mpi.rs"]
pub mod guest_mpi;
pub mod input;
pub mod irq;
pub mod job;
pub mod kvm_stats;
pub mod loopback;
pub mod migrate;
pub mod mpi;
pub mod native;
pub mod nic_server;
pub mod node;
pub mod output;
pub mod protocol;
pub mod qemu;
pub mod rank;
pub mod report;
pub mod run;
pub mod sched_control;
pub mod signals;
pub mod sim;
pub mod spec;
pub mod wire;
