//! The credit scheduler on real vCPU threads (pinned, SCHED_FIFO): nodes, oversubscription and vCPU switches.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.

#[path = "../common/mod.rs"]
mod common;

mod credit;
mod oversub;
mod switch;
