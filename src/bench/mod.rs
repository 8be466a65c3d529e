//! `kumo bench ...`: measurements of kumo's mechanisms, printed as tables or JSON.
//! (`bench irq` lives with the interrupt check in `irq.rs`, `bench net` with the MPI
//! jobs in `mpi.rs`: each shares its machinery with a command of its own.)

pub mod migrate;
pub mod migrate_qemu;
pub mod overhead;
pub mod oversub;
pub mod preempt;
pub mod process;
pub mod switch;
pub mod wake;
