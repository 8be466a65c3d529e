//! Identifiers handed out by the scheduler and the tickle set.

use std::fmt;

/// Largest number of pCPUs one scheduler instance manages (size of [`Tickles`]).
pub const MAX_PCPUS: u32 = 256;

/// A domain (a VM); dense index in creation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainId(pub u32);

/// A virtual CPU; dense index in creation order, unique across domains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VcpuId(pub u32);

/// A physical CPU, `0..pcpus`. pCPU 0 is the accounting master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PcpuId(pub u32);

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "d{}", self.0)
    }
}
impl fmt::Display for VcpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}
impl fmt::Display for PcpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// The set of pCPUs that must call `Scheduler::schedule` now (Xen raises
/// SCHEDULE_SOFTIRQ on them). A fixed bitmap: no allocation, ascending order.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Tickles([u64; (MAX_PCPUS / 64) as usize]);

impl Tickles {
    /// No pCPU.
    pub const fn new() -> Self {
        Self([0; (MAX_PCPUS / 64) as usize])
    }
    pub fn insert(&mut self, p: PcpuId) {
        self.0[(p.0 / 64) as usize] |= 1 << (p.0 % 64);
    }
    pub fn remove(&mut self, p: PcpuId) {
        self.0[(p.0 / 64) as usize] &= !(1 << (p.0 % 64));
    }
    pub fn contains(&self, p: PcpuId) -> bool {
        p.0 < MAX_PCPUS && self.0[(p.0 / 64) as usize] & (1 << (p.0 % 64)) != 0
    }
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// Adds every pCPU of `other`.
    pub fn extend(&mut self, other: Tickles) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }
    /// Removes and returns the lowest pCPU.
    pub fn pop_first(&mut self) -> Option<PcpuId> {
        let p = self.first()?;
        self.remove(p);
        Some(p)
    }
    /// The lowest pCPU in the set.
    pub fn first(&self) -> Option<PcpuId> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| PcpuId(i as u32 * 64 + w.trailing_zeros()))
    }
    /// pCPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = PcpuId> + '_ {
        let mut rest = *self;
        std::iter::from_fn(move || rest.pop_first())
    }
}

impl fmt::Debug for Tickles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}
