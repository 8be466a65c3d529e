//! Internal consistency checks, for tests and simulators.

use crate::ids::{PcpuId, VcpuId};
use crate::scheduler::{Place, Scheduler};

impl Scheduler {
    /// Checks the scheduler's internal consistency at a quiescent point (every
    /// tickled pCPU has rescheduled): each vCPU is in exactly the place its
    /// state says, run queues are ordered by priority, active counts match,
    /// and no pCPU is idle while a vCPU waits in a run queue. Returns the
    /// first violation found.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut seen = vec![0u8; self.vcpus.len()];
        for (p, pc) in self.pcpus.iter().enumerate() {
            let p = PcpuId(p as u32);
            if let Some(c) = pc.current {
                let vc = self.vcpu(c);
                if vc.place != Place::Running || vc.pcpu != p {
                    return Err(format!(
                        "{c} current on {p} but {:?} on {}",
                        vc.place, vc.pcpu
                    ));
                }
                if vc.blocked || vc.parked || vc.removed {
                    return Err(format!("{c} runs on {p} while blocked/parked/removed"));
                }
                seen[c.0 as usize] += 1;
            }
            let mut last = None;
            for v in pc.runq.iter() {
                let vc = self.vcpu(v);
                if vc.place != Place::Queued || vc.pcpu != p {
                    return Err(format!(
                        "{v} queued on {p} but {:?} on {}",
                        vc.place, vc.pcpu
                    ));
                }
                if vc.blocked || vc.parked || vc.removed {
                    return Err(format!("{v} queued on {p} while blocked/parked/removed"));
                }
                if last.is_some_and(|l| l < vc.pri) {
                    return Err(format!("run queue of {p} out of priority order at {v}"));
                }
                last = Some(vc.pri);
                seen[v.0 as usize] += 1;
            }
            if pc.current.is_none() && self.pcpus.iter().any(|q| !q.runq.is_empty()) {
                return Err(format!("{p} idle while vCPUs wait"));
            }
        }
        for (i, vc) in self.vcpus.iter().enumerate() {
            let v = VcpuId(i as u32);
            let want = u8::from(vc.place != Place::Off);
            if seen[i] != want {
                return Err(format!("{v} ({:?}) found {} times", vc.place, seen[i]));
            }
        }
        for (i, d) in self.domains.iter().enumerate() {
            let active = d.vcpus.iter().filter(|v| self.vcpu(**v).active).count() as u32;
            let listed = self
                .active_doms
                .iter()
                .filter(|x| x.0 as usize == i)
                .count();
            if active != d.active_vcpus || listed != usize::from(active > 0) {
                return Err(format!(
                    "d{i}: {active} active vCPUs, count {}, listed {listed}",
                    d.active_vcpus
                ));
            }
        }
        Ok(())
    }
}
