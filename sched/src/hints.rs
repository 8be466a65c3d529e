//! Directed yield: a paravirtual "I wait for these vCPUs" hint.
//!
//! A guest thread waiting at a barrier (or for a lock holder, or for a message) can do
//! nothing until the vCPUs it waits for get somewhere. Credit1 does not know that: it
//! runs the waiter's siblings in round robin with every other domain's vCPUs, one
//! slice each, so a barrier of an oversubscribed VM that competes with another domain
//! completes only as fast as its last, queued vCPU gets a slice. The hint names the
//! vCPUs the waiter needs (a barrier's laggards: the siblings not waiting at it); with
//! [`crate::Params::directed_yield`] on, [`Scheduler::yield_to`] answers it as KVM's
//! pause-loop exit and Xen's `yield_to` would, but with knowledge of the barrier:
//!
//! - each named sibling that is **queued and UNDER** is BOOSTed (as Xen BOOSTs a
//!   wake-up): it runs ahead of other domains' UNDER and OVER vCPUs, and preempts one
//!   of them if every pCPU is busy, but never a vCPU of its own domain (the waiter
//!   needs those too, a preemption would only add a switch);
//! - the first of them goes to the waiter's own pCPU if the waiter is still current
//!   there (spinning, or halted and not yet rescheduled), which yields: the waiter's
//!   CPU time goes straight to the vCPU it waits for.
//!
//! Credit stays fair: BOOST ends at the first tick that finds the vCPU running and at
//! accounting, the boosted vCPUs burn their own domain's credit, and an OVER sibling
//! (its domain has used its share) is never boosted. Siblings that are running,
//! blocked, parked, already BOOSTed, removed, and vCPUs of other domains are left
//! alone: a domain can only hurry itself, within its share.

use crate::ids::{Tickles, VcpuId};
use crate::scheduler::{Place, Scheduler};
use crate::stats::Priority;

impl Scheduler {
    /// `waiter` waits for `targets` (paravirtual hint, e.g. a barrier's laggards).
    /// With [`crate::Params::directed_yield`] off, or for targets that cannot be
    /// hurried (see the module documentation), nothing changes. Hints may arrive in
    /// any order and repeat; out-of-range ids are ignored. Returns the pCPUs to
    /// reschedule.
    pub fn yield_to(&mut self, _now: u64, waiter: VcpuId, targets: &[VcpuId]) -> Tickles {
        let mut t = Tickles::new();
        if !self.params.directed_yield || waiter.0 as usize >= self.vcpus.len() {
            return t;
        }
        let dom = self.vcpu(waiter).dom;
        // The waiter's pCPU, if it is still current there: the first target takes it.
        let mut handover =
            (self.vcpu(waiter).place == Place::Running).then(|| self.vcpu(waiter).pcpu);
        for &v in targets {
            let Some(vc) = self.vcpus.get(v.0 as usize) else {
                continue;
            };
            let hurry = v != waiter
                && vc.dom == dom
                && vc.place == Place::Queued
                && vc.pri == Priority::Under
                && !vc.removed;
            if !hurry {
                continue;
            }
            let from = vc.pcpu;
            self.pcpu_mut(from).runq.remove(v);
            let vc = self.vcpu_mut(v);
            vc.pri = Priority::Boost;
            vc.directed_boosts += 1;
            match handover.take() {
                Some(p) => {
                    vc.pcpu = p;
                    self.pcpu_mut(p).runq.push_back(v, Priority::Boost);
                    self.vcpu_mut(waiter).yielding = true;
                    self.tickle(p, &mut t);
                }
                None => self.enqueue_sparing(v, Some(dom), &mut t),
            }
        }
        t
    }
}
