//! The credit scheduler on real vCPU threads (pinned, SCHED_FIFO): nodes, oversubscription and vCPU switches.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.
//!
//! Every test here takes its turn (`common::take_turn`): the credit tests measure CPU
//! shares, and another test's SCHED_FIFO vCPUs on the same CPU skew them (CI, 2026-11-28:
//! equal weights gave 1.81). Run one at a time, the binary takes as long as in parallel
//! (37.6 s against 36.3 s).

#[path = "../common/mod.rs"]
mod common;

mod credit;
mod oversub;
mod switch;
