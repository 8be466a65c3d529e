//! Per-pCPU run queue: ordered by priority, FIFO (round robin) within one.
//!
//! Xen keeps one sorted list and inserts a vCPU after the last one of equal
//! priority (`__runq_insert`); one FIFO per priority gives the same order with
//! O(1) insertion.

use std::collections::VecDeque;

use crate::ids::VcpuId;
use crate::stats::Priority;

#[derive(Clone, Debug, Default)]
pub(crate) struct RunQueue {
    /// Indexed by `Priority::bucket`: BOOST, UNDER, OVER.
    buckets: [VecDeque<VcpuId>; 3],
}

impl RunQueue {
    /// Tail of its priority: where Xen puts a woken, preempted or expired vCPU.
    pub(crate) fn push_back(&mut self, v: VcpuId, pri: Priority) {
        self.buckets[pri.bucket()].push_back(v);
    }

    pub(crate) fn pop_front(&mut self) -> Option<VcpuId> {
        self.buckets.iter_mut().find_map(|b| b.pop_front())
    }

    /// Priority of the head, `Idle` when empty.
    pub(crate) fn best_priority(&self) -> Priority {
        Priority::BUCKETS
            .iter()
            .zip(&self.buckets)
            .find(|(_, b)| !b.is_empty())
            .map_or(Priority::Idle, |(p, _)| *p)
    }

    pub(crate) fn len(&self) -> usize {
        self.buckets.iter().map(VecDeque::len).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.iter().all(VecDeque::is_empty)
    }

    /// Removes `v` wherever it is; true if it was queued.
    pub(crate) fn remove(&mut self, v: VcpuId) -> bool {
        for b in &mut self.buckets {
            if let Some(i) = b.iter().position(|x| *x == v) {
                b.remove(i);
                return true;
            }
        }
        false
    }

    /// First queued vCPU of priority strictly above `floor` accepted by `ok`,
    /// removed from the queue (Xen `csched_runq_steal`).
    pub(crate) fn take_first_above(
        &mut self,
        floor: Priority,
        mut ok: impl FnMut(VcpuId) -> bool,
    ) -> Option<VcpuId> {
        for (pri, b) in Priority::BUCKETS.iter().zip(&mut self.buckets) {
            if *pri <= floor {
                break;
            }
            if let Some(i) = b.iter().position(|v| ok(*v)) {
                return b.remove(i);
            }
        }
        None
    }

    /// Queued vCPUs, best first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = VcpuId> + '_ {
        self.buckets.iter().flatten().copied()
    }

    /// Re-files every vCPU under its current priority, keeping relative order
    /// (Xen `csched_runq_sort` after accounting changed priorities).
    pub(crate) fn resort(&mut self, scratch: &mut Vec<VcpuId>, pri: impl Fn(VcpuId) -> Priority) {
        let filed = |(i, b): (usize, &VecDeque<VcpuId>)| b.iter().all(|v| pri(*v).bucket() == i);
        if self.buckets.iter().enumerate().all(filed) {
            return;
        }
        scratch.clear();
        for b in &mut self.buckets {
            scratch.extend(b.drain(..));
        }
        for v in scratch.iter() {
            self.buckets[pri(*v).bucket()].push_back(*v);
        }
    }
}
