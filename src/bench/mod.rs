//! `kumo bench ...`: measurements of kumo's mechanisms, printed as tables or JSON.
//! (`bench irq` lives with the interrupt check in `irq.rs`, `bench net` with the MPI
//! jobs in `mpi.rs`: each shares its machinery with a command of its own.)
//! `bench record` runs a suite of them into a performance record (`suite.rs`,
//! `record.rs`), and `bench compare` sets two records side by side (`compare.rs`).

pub mod api;
pub mod compare;
pub mod exit;
pub mod handover;
pub mod migrate;
pub mod migrate_qemu;
pub mod overhead;
pub mod oversub;
pub mod preempt;
pub mod process;
pub mod record;
pub mod soak;
pub mod suite;
pub mod switch;
mod switch_native;
pub mod wake;
