//! kumo: a research hypervisor for HPC experiments. This crate is the program's
//! commands: the command line (`cli`), `kumo mpi` and `kumo bench net` (`mpi`), the
//! benchmarks (`bench`) and `kumo disk-image`; `main.rs` dispatches each.
//!
//! Below it: the research harness (`kumo-lab`: experiments, simulator, native twin,
//! QEMU), the VMM layer (`kumo-vmm`: launch, control, reports), the VMM core (`hv`),
//! device models (`devices`) and the credit scheduler (`sched`); NPB is `guests/npb`.

pub mod bench;
pub mod bzimage;
pub mod cli;
pub mod disk_image;
pub mod heap;
pub mod mpi;
