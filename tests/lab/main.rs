//! The research harness: `kumo experiment` on real VMs and `kumo sim`.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.

#[path = "../common/mod.rs"]
mod common;

mod experiment;
mod sim;
