//! Boot, faults, bad input and the guest's own checks: one VM at a time, booted by the real binary.
//!
//! One test binary per area (each links the whole program once); each file below is
//! a module, and `common` holds what they share.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod bad_input;
mod boot;
mod disk;
mod faults;
mod firmware_boot;
mod guest_memory_functions;
mod high_memory;
mod huge_pages;
mod irq;
mod json_numbers;
mod native_and_bench;
mod perf_record;
mod pvh_kernels;
mod robustness;
mod seccomp;
mod soak;
mod spec;
