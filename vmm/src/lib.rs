//! kumo's VMM layer: everything between a command and `hv`. Plain types at the bottom
//! (the guest's `@kumo` protocol, `spec/`: control messages, scheduler parameters, job
//! and node shapes), then launch and collection: a VM of the embedded guest or a
//! `--kernel` (`run`), an MPI job's VMs (`job`, `rank`), a node of domains (`node`),
//! movable VMs (`migrate`), the control socket (`ctl`, `sched_control`), the NIC server,
//! the interrupt check, and how results are judged and printed (`report`, `output`).
//!
//! The commands (`src/` of the `kumo` package) and the research harness (`lab/`) sit
//! above it; nothing here imports them, and Cargo enforces that.

pub mod api;
pub mod args;
pub mod ctl;
pub mod guest;
pub mod input;
pub mod irq;
pub mod job;
pub mod kvm_stats;
pub mod launch;
pub mod migrate;
pub mod nic_server;
pub mod node;
pub mod node_move;
pub mod output;
pub mod protocol;
pub mod rank;
pub mod report;
pub mod run;
pub mod sched_control;
pub mod signals;
pub mod spec;
pub mod stats;
pub mod vm_command;
pub mod vm_pause;
pub mod wire;
