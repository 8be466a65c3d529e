//! Public views of the scheduler state for tests, control APIs and reports.

use crate::ids::{DomainId, PcpuId};

/// Xen credit1 priorities, ordered worst to best (`Ord` follows Xen's values:
/// IDLE -64 < OVER -2 < UNDER -1 < BOOST 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Idle,
    Over,
    Under,
    Boost,
}

impl Priority {
    /// Run-queue buckets, best first.
    pub(crate) const BUCKETS: [Priority; 3] = [Priority::Boost, Priority::Under, Priority::Over];

    pub(crate) fn bucket(self) -> usize {
        match self {
            Priority::Boost => 0,
            Priority::Under => 1,
            Priority::Over => 2,
            Priority::Idle => unreachable!("the idle priority is never queued"),
        }
    }

    /// Xen's numeric value (`CSCHED_PRI_*`).
    pub fn xen_value(self) -> i32 {
        match self {
            Priority::Idle => -64,
            Priority::Over => -2,
            Priority::Under => -1,
            Priority::Boost => 0,
        }
    }
}

/// Where a vCPU is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VcpuState {
    /// Current on its pCPU.
    Running,
    /// Waiting on its pCPU's run queue.
    Runnable,
    /// Halted by the guest (after `block`, before `wake`).
    Blocked,
    /// Not blocked, but held off the CPU by its domain's cap.
    Parked,
    /// Removed with `remove_vcpu`/`remove_domain`.
    Removed,
}

/// Snapshot of one vCPU. Credit and run time are as of the last burn (the last
/// tick or deschedule), as in Xen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VcpuStats {
    pub domain: DomainId,
    pub state: VcpuState,
    pub priority: Priority,
    /// Credit in Xen credits (10 per ms), truncated toward zero.
    pub credit: i64,
    /// Credit in milli-credits (1 = 100 ns of run time).
    pub credit_milli: i64,
    /// pCPU it runs on, is queued on, or last ran on.
    pub pcpu: PcpuId,
    /// Parked by the cap (may also be blocked).
    pub parked: bool,
    /// On its domain's active list (earns credit at accounting).
    pub active: bool,
    /// Total run time burnt.
    pub run_ns: u64,
    /// Times a directed yield ([`crate::Scheduler::yield_to`]) BOOSTed it.
    pub directed_boosts: u64,
}

/// Snapshot of one domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainStats {
    pub weight: u16,
    /// % of one pCPU, 0 = uncapped.
    pub cap: u32,
    /// vCPUs created (removed ones included).
    pub vcpus: u32,
    pub active_vcpus: u32,
    /// Sum of its vCPUs' run time.
    pub run_ns: u64,
}
