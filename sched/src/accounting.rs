//! Credit accounting, once per slice on the master pCPU (Xen `csched_acct`).
//!
//! The arithmetic is Xen's, line for line, on milli-credits and with 128-bit
//! intermediates (Xen uses 32 bits and relies on small totals).

use crate::ids::Tickles;
use crate::scheduler::Scheduler;
use crate::stats::Priority;

/// `ceil(a / b)` for the non-negative values Xen rounds up.
fn div_ceil(a: i128, b: i128) -> i128 {
    (a + b - 1) / b
}

impl Scheduler {
    /// Shares `credits_per_tslice * pcpus` among the active domains in
    /// proportion to weight x active vCPUs, clamps capped domains and hands
    /// what they leave to the domains after them, then recomputes priorities,
    /// parks/unparks capped vCPUs and deactivates vCPUs holding more than one
    /// slice of credit (their credit is halved). Tickles go to pCPUs that must
    /// drop a parked vCPU or pick up an unparked one.
    pub(crate) fn account(&mut self, now: u64, t: &mut Tickles) {
        // Unless configured as Xen (which reads each running vCPU's credit as
        // of its pCPU's last tick), burn the running vCPUs first: with a tick
        // independent of (up to equal to) the slice, that lag plus the -1
        // slice clamp lets capped domains overrun their cap by more than two
        // slices per window (see tests/unit.rs `xen_accounting_lag_...`).
        if self.params.sync_accounting {
            for p in 0..self.pcpus.len() {
                if let Some(c) = self.pcpus[p].current {
                    self.burn(c, now);
                }
            }
        }
        let cpt = i128::from(self.params.mcredits_per_tslice());
        let weight_total: i128 = self
            .active_doms
            .iter()
            .map(|d| {
                let d = &self.domains[d.0 as usize];
                i128::from(d.weight) * i128::from(d.active_vcpus)
            })
            .sum();
        let mut credit_total = cpt * self.pcpus.len() as i128;
        let balance = i128::from(self.credit_balance);
        // Converge the balance towards 0 when it drops negative.
        if balance < 0 {
            credit_total -= balance;
        }
        if weight_total == 0 {
            self.credit_balance = 0;
            return;
        }

        let mut weight_left = weight_total;
        let mut new_balance: i128 = 0;
        let mut credit_xtra = false;
        let mut i = 0;
        while i < self.active_doms.len() {
            let dom = self.active_doms[i];
            let (weight, cap, n) = {
                let d = &self.domains[dom.0 as usize];
                (
                    i128::from(d.weight),
                    i128::from(d.cap),
                    i128::from(d.active_vcpus),
                )
            };
            weight_left -= weight * n;

            // At most one slice per active vCPU, more only while the system
            // balance is negative.
            let mut peak = n * cpt;
            if balance < 0 {
                peak += div_ceil(-balance * weight * n, weight_total);
            }
            // A slower host caps every domain at its weight share of the host's speed.
            let cap = self.speed_capped(cap, weight * n, weight_total);
            let mut cap_per_vcpu = 0;
            if cap != 0 {
                let credit_cap = div_ceil(cap * cpt, 100);
                peak = peak.min(credit_cap);
                cap_per_vcpu = div_ceil(credit_cap, n);
            }

            let mut fair = div_ceil(credit_total * weight * n, weight_total);
            let mut pos = i;
            if fair < peak {
                credit_xtra = true;
            } else {
                // Give the domains after this one its unused credit.
                if weight_left != 0 {
                    credit_total += div_ceil((fair - peak) * weight_total, weight_left);
                }
                if credit_xtra {
                    // Xen keeps domains with spare credit at the list head.
                    self.active_doms.remove(i);
                    self.active_doms.insert(0, dom);
                    pos = 0;
                }
                fair = peak;
            }
            let fair_per_vcpu = div_ceil(fair, n) as i64;
            new_balance +=
                i128::from(self.credit_vcpus(dom, fair_per_vcpu, cap_per_vcpu as i64, t));

            if self.domains[dom.0 as usize].active_vcpus == 0 {
                self.active_doms.remove(pos);
            } else {
                i += 1;
            }
        }
        self.credit_balance = new_balance as i64;

        // Xen `csched_runq_sort`: queued vCPUs follow their new priority.
        let mut scratch = std::mem::take(&mut self.scratch);
        for p in 0..self.pcpus.len() {
            let vcpus = &self.vcpus;
            self.pcpus[p]
                .runq
                .resort(&mut scratch, |v| vcpus[v.0 as usize].pri);
        }
        self.scratch = scratch;
    }

    /// A domain's cap under [`Scheduler::set_speed_percent`]: its own `cap` (0 = none)
    /// or its share `share / total` of `speed% x pCPUs`, whichever is lower (at least 1).
    fn speed_capped(&self, cap: i128, share: i128, total: i128) -> i128 {
        if self.speed_percent >= 100 {
            return cap;
        }
        let pool = i128::from(self.speed_percent) * self.pcpus.len() as i128;
        let slow = (pool * share / total).max(1);
        if cap == 0 { slow } else { cap.min(slow) }
    }

    /// Credits the active vCPUs of `dom` with `fair` each; returns the sum of
    /// their credit afterwards (Xen's `credit_balance` contribution).
    fn credit_vcpus(
        &mut self,
        dom: crate::ids::DomainId,
        fair: i64,
        cap_per_vcpu: i64,
        t: &mut Tickles,
    ) -> i64 {
        let cpt = self.params.mcredits_per_tslice();
        // Capped by its own cap or by the pool's speed (cap_per_vcpu > 0 either way).
        let capped = cap_per_vcpu != 0;
        let mut sum = 0;
        for k in 0..self.domains[dom.0 as usize].vcpus.len() {
            let v = self.domains[dom.0 as usize].vcpus[k];
            if !self.vcpu(v).active {
                continue;
            }
            let vc = self.vcpu_mut(v);
            vc.credit += fair;
            let mut credit = vc.credit;
            if credit < 0 {
                vc.pri = Priority::Over;
                // Capped-out vCPUs are parked until their credit recovers.
                if capped && credit < -cap_per_vcpu && !vc.parked {
                    self.park(v, t);
                }
                // Lower bound on credit: at most one slice of debt.
                if credit < -cpt {
                    credit = -cpt;
                    self.vcpu_mut(v).credit = credit;
                }
            } else {
                vc.pri = Priority::Under;
                if vc.parked {
                    self.unpark(v, t);
                }
                // Upper bound: stop earning; halve so it restarts "ahead".
                if credit > cpt {
                    let vc = self.vcpu_mut(v);
                    vc.active = false;
                    credit /= 2;
                    vc.credit = credit;
                    self.domains[dom.0 as usize].active_vcpus -= 1;
                }
            }
            sum += credit;
        }
        sum
    }
}
