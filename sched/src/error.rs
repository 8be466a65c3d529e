//! Errors of the per-domain control operations.

use thiserror::Error;

use crate::ids::DomainId;

/// An invalid domain operation (Xen `xl sched-credit -w/-c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DomainError {
    #[error("weight = 0: must be in 1..=65535")]
    Weight,
    #[error("cap = {cap}: must be 0 (none) or in 1..={max} (% of one pCPU, 100 per pCPU)")]
    Cap { cap: u32, max: u32 },
    #[error("domain {0} does not exist")]
    NoSuchDomain(DomainId),
}
