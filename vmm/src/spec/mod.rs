//! The leaf layer: plain types and their parsing, shared by the rest of the program
//! and importing nothing from it but the other leaves (`guest`, `protocol`, `input`):
//! the control protocol, credit-scheduler parameters, the shape of an MPI job, node
//! files and the devices a run names.

pub mod control;
pub mod devices;
pub mod job;
pub mod node;
pub mod sched;
pub mod vm;
