//! The scheduler state and its event handlers (Xen `csched_*` hooks).

use crate::auto_slice::AutoSlice;
use crate::error::DomainError;
use crate::ids::{DomainId, MAX_PCPUS, PcpuId, Tickles, VcpuId};
use crate::params::{Accounting, NS_PER_MCREDIT, ParamError, Params};
use crate::runq::RunQueue;
use crate::stats::{DomainStats, Priority, VcpuState, VcpuStats};
use crate::topology::Modules;

/// Xen `CSCHED_DEFAULT_WEIGHT`.
pub const DEFAULT_WEIGHT: u16 = 256;

/// The answer of [`Scheduler::schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// vCPU to run on this pCPU, `None` = idle.
    pub run: Option<VcpuId>,
    /// When the driver must call `tick` on this pCPU next (the earliest of the
    /// slice end, the ratelimit end, the next tick and, on the master, the
    /// next accounting). `u64::MAX` when nothing is due.
    pub until_ns: u64,
    /// Other pCPUs to reschedule now (an idle pCPU that should steal the vCPU
    /// this decision left queued).
    pub tickles: Tickles,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Running,
    Queued,
    /// Neither: blocked and/or parked.
    Off,
}

#[derive(Clone, Debug)]
pub(crate) struct Domain {
    pub(crate) weight: u16,
    pub(crate) cap: u32,
    pub(crate) vcpus: Vec<VcpuId>,
    pub(crate) active_vcpus: u32,
    pub(crate) run_ns: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Vcpu {
    pub(crate) dom: DomainId,
    pub(crate) pcpu: PcpuId,
    pub(crate) place: Place,
    pub(crate) blocked: bool,
    pub(crate) parked: bool,
    pub(crate) yielding: bool,
    pub(crate) active: bool,
    pub(crate) pri: Priority,
    /// Milli-credits.
    pub(crate) credit: i64,
    /// Run time not yet worth a whole milli-credit (Xen `residual`).
    pub(crate) residual_ns: u64,
    /// Run time is burnt from here on (Xen `start_time`).
    pub(crate) last_burn_ns: u64,
    /// When it was switched in (Xen `state_entry_time`, for ratelimit).
    pub(crate) dispatched_ns: u64,
    /// When it last left a pCPU (Xen `last_sched_time`, for migration delay).
    pub(crate) descheduled_ns: u64,
    pub(crate) run_ns: u64,
    /// Removed: never runs again; its id is not reused.
    pub(crate) removed: bool,
    /// Times a directed yield BOOSTed it (`hints.rs`).
    pub(crate) directed_boosts: u64,
}

#[derive(Clone, Debug)]
pub(crate) struct Pcpu {
    pub(crate) current: Option<VcpuId>,
    pub(crate) runq: RunQueue,
    /// Next credit tick; `u64::MAX` while idle (Xen stops the ticker).
    pub(crate) next_tick_ns: u64,
    /// End of the current slice or ratelimit window; `u64::MAX` while idle.
    pub(crate) slice_end_ns: u64,
    /// Tickled and not yet rescheduled: not offered to other wake-ups.
    pub(crate) tickled: bool,
}

/// Xen credit1 for one pool of pCPUs.
#[derive(Clone, Debug)]
pub struct Scheduler {
    pub(crate) params: Params,
    pub(crate) domains: Vec<Domain>,
    pub(crate) vcpus: Vec<Vcpu>,
    pub(crate) pcpus: Vec<Pcpu>,
    /// Xen `active_sdom`: domains with active vCPUs, in Xen's list order.
    pub(crate) active_doms: Vec<DomainId>,
    /// Xen `credit_balance`: sum of active credits after the last accounting.
    pub(crate) credit_balance: i64,
    pub(crate) next_acct_ns: u64,
    pub(crate) scratch: Vec<VcpuId>,
    /// Set: picks are module-aware ([`Self::set_modules`]).
    pub(crate) modules: Option<Modules>,
    /// Set: the scheduler picks its own slice ([`Self::set_auto`]).
    pub(crate) auto: Option<AutoSlice>,
    /// The host's speed in percent of its pCPUs ([`Self::set_speed_percent`]; 100 = full).
    pub(crate) speed_percent: u32,
}

/// The accounting master (Xen `prv->master`, the first pCPU of the pool).
pub(crate) const MASTER: PcpuId = PcpuId(0);

impl Scheduler {
    /// A scheduler for `pcpus` pCPUs whose clock starts at `now`; the first
    /// accounting is one slice later.
    pub fn new(params: Params, pcpus: u32, now: u64) -> Result<Self, ParamError> {
        params.validate()?;
        if pcpus == 0 || pcpus > MAX_PCPUS {
            return Err(ParamError::Pcpus(pcpus));
        }
        let pcpu = Pcpu {
            current: None,
            runq: RunQueue::default(),
            next_tick_ns: u64::MAX,
            slice_end_ns: u64::MAX,
            tickled: false,
        };
        Ok(Self {
            params,
            domains: Vec::new(),
            vcpus: Vec::new(),
            pcpus: vec![pcpu; pcpus as usize],
            active_doms: Vec::new(),
            credit_balance: 0,
            next_acct_ns: now.saturating_add(params.tslice_ns),
            scratch: Vec::new(),
            modules: None,
            auto: None,
            speed_percent: 100,
        })
    }

    fn check_domain(&self, weight: u16, cap: u32) -> Result<(), DomainError> {
        if weight == 0 {
            return Err(DomainError::Weight);
        }
        let max = 100 * self.pcpus.len() as u32;
        if cap > max {
            return Err(DomainError::Cap { cap, max });
        }
        Ok(())
    }

    /// A new domain with `weight` (1..=65535, Xen default 256) and `cap`
    /// (% of one pCPU, 0 = none, up to 100 per pCPU).
    pub fn add_domain(&mut self, weight: u16, cap: u32) -> Result<DomainId, DomainError> {
        self.check_domain(weight, cap)?;
        self.domains.push(Domain {
            weight,
            cap,
            vcpus: Vec::new(),
            active_vcpus: 0,
            run_ns: 0,
        });
        Ok(DomainId(self.domains.len() as u32 - 1))
    }

    /// A new vCPU of `dom`. It starts **blocked** with 0 credit, UNDER and not
    /// active (as Xen's `csched_alloc_udata`); call [`Self::wake`] to start it,
    /// which boosts it. Its home pCPU is chosen round robin by vCPU index.
    pub fn add_vcpu(&mut self, now: u64, dom: DomainId) -> Result<VcpuId, DomainError> {
        let d = self
            .domains
            .get_mut(dom.0 as usize)
            .ok_or(DomainError::NoSuchDomain(dom))?;
        let id = VcpuId(self.vcpus.len() as u32);
        d.vcpus.push(id);
        let pcpu = PcpuId(id.0 % self.pcpus.len() as u32);
        self.vcpus.push(Vcpu {
            dom,
            pcpu,
            place: Place::Off,
            blocked: true,
            parked: false,
            yielding: false,
            active: false,
            pri: Priority::Under,
            credit: 0,
            residual_ns: 0,
            last_burn_ns: now,
            dispatched_ns: now,
            descheduled_ns: now,
            run_ns: 0,
            removed: false,
            directed_boosts: 0,
        });
        Ok(id)
    }

    /// Removes `v` for good (Xen `csched_unit_remove`): it stops earning and
    /// is descheduled (its pCPU is tickled if it was running). Its id stays
    /// valid for statistics and is not reused.
    pub fn remove_vcpu(&mut self, now: u64, v: VcpuId) -> Tickles {
        let t = self.block(now, v);
        let vc = self.vcpu_mut(v);
        vc.removed = true;
        vc.parked = false;
        if vc.active {
            vc.active = false;
            let dom = vc.dom;
            let d = &mut self.domains[dom.0 as usize];
            d.active_vcpus -= 1;
            if d.active_vcpus == 0 {
                self.active_doms.retain(|x| *x != dom);
            }
        }
        t
    }

    /// Removes every vCPU of `dom` (destroying a VM). The domain stays listed
    /// with its statistics; its id is not reused.
    pub fn remove_domain(&mut self, now: u64, dom: DomainId) -> Result<Tickles, DomainError> {
        let d = self
            .domains
            .get(dom.0 as usize)
            .ok_or(DomainError::NoSuchDomain(dom))?;
        let mut t = Tickles::new();
        for v in d.vcpus.clone() {
            t.extend(self.remove_vcpu(now, v));
        }
        Ok(t)
    }

    /// Changes a domain's weight and cap at run time (Xen `csched_dom_cntl`).
    /// New shares apply from the next accounting. Removing the cap unparks the
    /// domain's vCPUs at once (Xen would wait until their credit is >= 0).
    pub fn set_domain(
        &mut self,
        dom: DomainId,
        weight: u16,
        cap: u32,
    ) -> Result<Tickles, DomainError> {
        self.check_domain(weight, cap)?;
        let d = self
            .domains
            .get_mut(dom.0 as usize)
            .ok_or(DomainError::NoSuchDomain(dom))?;
        d.weight = weight;
        d.cap = cap;
        let mut t = Tickles::new();
        if cap == 0 {
            for i in 0..self.domains[dom.0 as usize].vcpus.len() {
                let v = self.domains[dom.0 as usize].vcpus[i];
                if self.vcpu(v).parked {
                    self.unpark(v, &mut t);
                }
            }
        }
        Ok(t)
    }

    /// Changes the global parameters at run time (Xen `csched_sys_cntl`, plus
    /// the tick). Credits already held are kept; the new per-slice amount and
    /// clamps apply from the next accounting. Pending deadlines are pulled in
    /// so none lies further away than the new period.
    ///
    /// Fixed parameters turn [`Self::set_auto`] off.
    pub fn set_params(&mut self, now: u64, params: Params) -> Result<(), ParamError> {
        params.validate()?;
        self.auto = None;
        self.apply_params(now, params);
        Ok(())
    }

    /// Turns the auto slice on (from the parameters in force, the long setting) or
    /// off (back to the long setting's parameters). See [`crate::auto_slice`].
    pub fn set_auto(&mut self, now: u64, on: bool) {
        match (on, self.auto.take()) {
            (true, Some(auto)) => self.auto = Some(auto),
            (true, None) => self.auto = Some(AutoSlice::new(self.params, now)),
            (false, Some(auto)) => self.apply_params(now, auto.long()),
            (false, None) => {}
        }
    }

    /// Counts `n` wake-ups the scheduler did not see as [`Self::wake`] calls, for the
    /// auto slice's message signal: a real driver's domain 0 threads wake inside the
    /// host kernel, many times between two of its observations.
    pub fn note_wakes(&mut self, n: u64) {
        if let Some(auto) = &mut self.auto {
            auto.note_wakes(n);
        }
    }

    /// The auto slice's state, while it is on.
    pub fn auto(&self) -> Option<&AutoSlice> {
        self.auto.as_ref()
    }

    /// Puts valid parameters in force.
    fn apply_params(&mut self, now: u64, params: Params) {
        self.params = params;
        self.next_acct_ns = self.next_acct_ns.min(now.saturating_add(params.tslice_ns));
        for p in &mut self.pcpus {
            if p.current.is_some() {
                p.next_tick_ns = p.next_tick_ns.min(now.saturating_add(params.tick_ns));
                p.slice_end_ns = p.slice_end_ns.min(now.saturating_add(params.tslice_ns));
            }
        }
    }

    pub(crate) fn vcpu(&self, v: VcpuId) -> &Vcpu {
        &self.vcpus[v.0 as usize]
    }

    pub(crate) fn vcpu_mut(&mut self, v: VcpuId) -> &mut Vcpu {
        &mut self.vcpus[v.0 as usize]
    }

    pub(crate) fn pcpu_mut(&mut self, p: PcpuId) -> &mut Pcpu {
        &mut self.pcpus[p.0 as usize]
    }

    pub(crate) fn tickle(&mut self, p: PcpuId, t: &mut Tickles) {
        self.pcpu_mut(p).tickled = true;
        t.insert(p);
    }

    /// Idle and not already tickled: free to take new work.
    fn is_free(&self, p: PcpuId) -> bool {
        let pc = &self.pcpus[p.0 as usize];
        pc.current.is_none() && !pc.tickled
    }

    /// First free pCPU, scanning cyclically from `from` (Xen cycles over the
    /// idlers mask starting after the last tickled one). Module-aware: the first
    /// free one whose module siblings are all free, if any.
    fn find_free(&self, from: PcpuId) -> Option<PcpuId> {
        let n = self.pcpus.len() as u32;
        let cyclic = (0..n).map(|i| PcpuId((from.0 + i) % n));
        if let Some(m) = &self.modules
            && let Some(p) = cyclic
                .clone()
                .find(|p| self.is_free(*p) && m.siblings(*p).all(|q| self.is_free(q)))
        {
            return Some(p);
        }
        cyclic.into_iter().find(|p| self.is_free(*p))
    }

    /// Makes picks module-aware (`Some`) or not (`None`, the default, Xen's): a
    /// waking vCPU, or an idle pCPU tickled to steal queued work, prefers a free
    /// pCPU whose module siblings are free too, so two busy vCPUs share a module
    /// only when every module already has a busy core. Running vCPUs are not moved.
    pub fn set_modules(&mut self, modules: Option<Modules>) -> Result<(), ParamError> {
        if let Some(m) = &modules
            && m.pcpus() != self.pcpus.len() as u32
        {
            return Err(ParamError::ModulesSize {
                given: m.pcpus(),
                pcpus: self.pcpus.len() as u32,
            });
        }
        self.modules = modules;
        Ok(())
    }

    /// The module topology picks follow, if any.
    pub fn modules(&self) -> Option<&Modules> {
        self.modules.as_ref()
    }

    /// Burns the running vCPU's credit for the time since its last burn
    /// (Xen `burn_credits`: 10 credits per ms, the remainder carried over).
    pub(crate) fn burn(&mut self, v: VcpuId, now: u64) {
        let exact = self.params.accounting == Accounting::Exact;
        let vc = self.vcpu_mut(v);
        if now <= vc.last_burn_ns {
            return;
        }
        let delta = now - vc.last_burn_ns;
        // Tick accounting debits at ticks only (`tick_running`); run time still counts.
        if exact {
            let total = delta + vc.residual_ns;
            vc.credit -= (total / NS_PER_MCREDIT) as i64;
            vc.residual_ns = total % NS_PER_MCREDIT;
        }
        vc.last_burn_ns = now;
        vc.run_ns += delta;
        let dom = vc.dom;
        self.domains[dom.0 as usize].run_ns += delta;
    }

    /// Queues a runnable vCPU (Xen `runq_insert` + `__runq_tickle`): on a free
    /// pCPU if there is one (its home first), else on the pCPU whose current
    /// vCPU has the lowest priority below its own (preemption; the ratelimit is
    /// enforced by that pCPU's `schedule`), else at home without a tickle.
    pub(crate) fn enqueue_and_tickle(&mut self, v: VcpuId, t: &mut Tickles) {
        self.enqueue_sparing(v, None, t);
    }

    /// [`Self::enqueue_and_tickle`] that never preempts a vCPU of `spare` (a directed
    /// yield must not preempt one vCPU its waiter needs for another).
    pub(crate) fn enqueue_sparing(&mut self, v: VcpuId, spare: Option<DomainId>, t: &mut Tickles) {
        let home = self.vcpu(v).pcpu;
        let pri = self.vcpu(v).pri;
        let (target, tickle) = if let Some(p) = self.find_free(home) {
            (p, true)
        } else {
            let n = self.pcpus.len() as u32;
            let spared = |p: PcpuId| {
                spare.is_some()
                    && self.pcpus[p.0 as usize].current.map(|c| self.vcpu(c).dom) == spare
            };
            let mut best: Option<(PcpuId, Priority)> = None;
            for i in 0..n {
                let p = PcpuId((home.0 + i) % n);
                if spared(p) {
                    continue;
                }
                let cp = self.current_priority(p);
                if best.is_none_or(|(_, b)| cp < b) {
                    best = Some((p, cp));
                }
            }
            match best {
                Some((p, cp)) if cp < pri => (p, true),
                _ => (home, false),
            }
        };
        let vc = self.vcpu_mut(v);
        vc.pcpu = target;
        vc.place = Place::Queued;
        self.pcpu_mut(target).runq.push_back(v, pri);
        if tickle {
            self.tickle(target, t);
        }
    }

    /// Priority of what runs on `p` (Idle if nothing).
    fn current_priority(&self, p: PcpuId) -> Priority {
        self.pcpus[p.0 as usize]
            .current
            .map_or(Priority::Idle, |c| self.vcpu(c).pri)
    }

    /// The guest made `v` runnable (Xen `csched_unit_wake`). A vCPU waking
    /// UNDER is BOOSTed. No effect unless it was blocked; a parked vCPU only
    /// records that it is runnable and is queued when unparked.
    pub fn wake(&mut self, _now: u64, v: VcpuId) -> Tickles {
        let mut t = Tickles::new();
        let vc = self.vcpu_mut(v);
        if !vc.blocked || vc.removed {
            return t;
        }
        vc.blocked = false;
        // Still current (blocked, its pCPU not yet rescheduled): it simply
        // keeps running, as Xen's wake returns early for a running unit.
        let stays = vc.parked || vc.place != Place::Off;
        if let Some(auto) = &mut self.auto {
            auto.note_wake();
        }
        if stays {
            return t;
        }
        let vc = self.vcpu_mut(v);
        if vc.pri == Priority::Under {
            vc.pri = Priority::Boost;
        }
        self.enqueue_and_tickle(v, &mut t);
        t
    }

    /// The guest halted `v` (Xen `csched_unit_sleep`). If it is running, its
    /// pCPU is tickled and ends its run at `schedule` (no ratelimit).
    pub fn block(&mut self, _now: u64, v: VcpuId) -> Tickles {
        let mut t = Tickles::new();
        let vc = self.vcpu_mut(v);
        vc.blocked = true;
        match vc.place {
            Place::Running => {
                let p = vc.pcpu;
                self.tickle(p, &mut t);
            }
            Place::Queued => {
                vc.place = Place::Off;
                let p = vc.pcpu;
                self.pcpu_mut(p).runq.remove(v);
            }
            Place::Off => {}
        }
        t
    }

    /// `v` yields its pCPU (Xen `csched_unit_yield`): at the next `schedule`
    /// it is not protected by the ratelimit and goes behind the other queued
    /// vCPUs of its priority. No effect unless it is running.
    pub fn yield_vcpu(&mut self, _now: u64, v: VcpuId) -> Tickles {
        let mut t = Tickles::new();
        let vc = self.vcpu_mut(v);
        if vc.place == Place::Running {
            vc.yielding = true;
            let p = vc.pcpu;
            self.tickle(p, &mut t);
        }
        t
    }

    /// Timer interrupt on `p`, called at (or after) [`Self::next_deadline`].
    /// Runs what is due: the credit tick (Xen `csched_tick`: burn, drop
    /// BOOST, activate), the accounting on the master (Xen `csched_acct`),
    /// and the slice end (then `p` itself is in the returned tickles).
    pub fn tick(&mut self, now: u64, p: PcpuId) -> Tickles {
        let mut t = Tickles::new();
        let tick_ns = self.params.tick_ns;
        let pc = &mut self.pcpus[p.0 as usize];
        if now >= pc.next_tick_ns {
            match pc.current {
                Some(c) => {
                    pc.next_tick_ns += tick_ns;
                    if pc.next_tick_ns <= now {
                        pc.next_tick_ns = now + tick_ns;
                    }
                    if let Some(auto) = &mut self.auto {
                        // Does the vCPU running here make another wait?
                        auto.note_tick(!pc.runq.is_empty());
                    }
                    self.tick_running(c, now);
                }
                None => pc.next_tick_ns = u64::MAX,
            }
        }
        if p == MASTER && now >= self.next_acct_ns {
            self.next_acct_ns += self.params.tslice_ns;
            if self.next_acct_ns <= now {
                self.next_acct_ns = now + self.params.tslice_ns;
            }
            self.account(now, &mut t);
        }
        if p == MASTER
            && let Some(auto) = &mut self.auto
            && let Some(params) = auto.decide(now, self.pcpus.len() as u32)
        {
            self.apply_params(now, params);
        }
        if now >= self.pcpus[p.0 as usize].slice_end_ns {
            self.tickle(p, &mut t);
        }
        t
    }

    /// Xen `csched_unit_acct` for the vCPU a tick finds running.
    fn tick_running(&mut self, c: VcpuId, now: u64) {
        let vc = self.vcpu_mut(c);
        // A vCPU still running at a tick consumes real CPU: no more BOOST.
        if vc.pri == Priority::Boost {
            vc.pri = Priority::Under;
        }
        self.burn(c, now);
        if self.params.accounting == Accounting::Tick {
            // Xen 3.4 `csched_vcpu_acct`: a whole tick, whatever ran since the last.
            let debit = self.params.mcredits_per_tick();
            self.vcpu_mut(c).credit -= debit;
        }
        if !self.vcpu(c).active {
            self.acct_start(c);
        }
    }

    /// Picks what `p` runs next (Xen `csched_schedule`). Burns the current
    /// vCPU; keeps it if it is runnable, not yielding and has run less than
    /// the ratelimit; otherwise requeues it at the tail of its priority and
    /// takes the best local vCPU, stealing from peers when that one is OVER
    /// or there is none.
    pub fn schedule(&mut self, now: u64, p: PcpuId) -> Decision {
        let mut t = Tickles::new();
        let rl = self.params.ratelimit_ns;
        self.pcpu_mut(p).tickled = false;
        let cur = self.pcpus[p.0 as usize].current;
        if let Some(c) = cur {
            self.burn(c, now);
            let vc = self.vcpu_mut(c);
            let runnable = !vc.blocked && !vc.parked;
            if runnable && !vc.yielding && rl != 0 && now - vc.dispatched_ns < rl {
                let end = vc.dispatched_ns + rl;
                self.pcpu_mut(p).slice_end_ns = end;
                return Decision {
                    run: Some(c),
                    until_ns: self.next_deadline(p),
                    tickles: t,
                };
            }
            vc.descheduled_ns = now;
            vc.yielding = false;
            if runnable {
                vc.place = Place::Queued;
                let pri = vc.pri;
                self.pcpu_mut(p).runq.push_back(c, pri);
            } else {
                vc.place = Place::Off;
            }
            self.pcpu_mut(p).current = None;
        }

        let local = self.pcpus[p.0 as usize].runq.best_priority();
        let mut next = None;
        if local <= Priority::Over {
            next = self.steal(now, p, local);
        }
        if next.is_none() {
            next = self.pcpu_mut(p).runq.pop_front();
        }

        let tick_ns = self.params.tick_ns;
        let tslice = self.params.tslice_ns;
        match next {
            Some(n) => {
                let vc = self.vcpu_mut(n);
                vc.place = Place::Running;
                vc.pcpu = p;
                if cur != Some(n) {
                    vc.dispatched_ns = now;
                    vc.last_burn_ns = now;
                }
                let pc = self.pcpu_mut(p);
                pc.current = Some(n);
                pc.slice_end_ns = now + tslice;
                if pc.next_tick_ns == u64::MAX {
                    // Xen restarts the ticker aligned to the tick period.
                    pc.next_tick_ns = now + tick_ns - now % tick_ns;
                }
                if !pc.runq.is_empty()
                    && let Some(q) = self.find_free(PcpuId((p.0 + 1) % self.pcpus.len() as u32))
                {
                    self.tickle(q, &mut t);
                }
            }
            None => {
                let pc = self.pcpu_mut(p);
                pc.next_tick_ns = u64::MAX;
                pc.slice_end_ns = u64::MAX;
            }
        }
        Decision {
            run: next,
            until_ns: self.next_deadline(p),
            tickles: t,
        }
    }

    /// Xen `csched_load_balance`: the first queued vCPU of strictly higher
    /// priority than `floor` on a peer (scanning from `p + 1`), skipping
    /// cache-hot ones (descheduled less than `migration_delay` ago).
    fn steal(&mut self, now: u64, p: PcpuId, floor: Priority) -> Option<VcpuId> {
        let n = self.pcpus.len() as u32;
        let delay = self.params.migration_delay_ns;
        for i in 1..n {
            let q = PcpuId((p.0 + i) % n);
            let vcpus = &self.vcpus;
            let peer = &mut self.pcpus[q.0 as usize];
            if peer.runq.best_priority() <= floor {
                continue;
            }
            let hot = |v: VcpuId| now.saturating_sub(vcpus[v.0 as usize].descheduled_ns) < delay;
            if let Some(v) = peer.runq.take_first_above(floor, |v| !hot(v)) {
                return Some(v);
            }
        }
        None
    }

    /// When the driver must call [`Self::tick`] on `p` next.
    pub fn next_deadline(&self, p: PcpuId) -> u64 {
        let pc = &self.pcpus[p.0 as usize];
        let d = pc.next_tick_ns.min(pc.slice_end_ns);
        if p == MASTER {
            d.min(self.next_acct_ns)
        } else {
            d
        }
    }

    /// Xen `__csched_unit_acct_start`: `v` and its domain become active.
    pub(crate) fn acct_start(&mut self, v: VcpuId) {
        let vc = self.vcpu_mut(v);
        vc.active = true;
        let dom = vc.dom;
        let d = &mut self.domains[dom.0 as usize];
        d.active_vcpus += 1;
        if d.active_vcpus == 1 {
            // Xen adds newly active domains at the head of `active_sdom`.
            self.active_doms.insert(0, dom);
        }
    }

    /// Parks `v` (Xen `sched_unit_pause_nosync` from accounting).
    pub(crate) fn park(&mut self, v: VcpuId, t: &mut Tickles) {
        let vc = self.vcpu_mut(v);
        vc.parked = true;
        match vc.place {
            Place::Running => {
                let p = vc.pcpu;
                self.tickle(p, t);
            }
            Place::Queued => {
                vc.place = Place::Off;
                let p = vc.pcpu;
                self.pcpu_mut(p).runq.remove(v);
            }
            Place::Off => {}
        }
    }

    /// Unparks `v`; queues it without BOOST if it is not blocked (Xen clears
    /// the PARKED flag only after the unpause, so the wake does not boost).
    pub(crate) fn unpark(&mut self, v: VcpuId, t: &mut Tickles) {
        let vc = self.vcpu_mut(v);
        vc.parked = false;
        if !vc.blocked && vc.place == Place::Off {
            self.enqueue_and_tickle(v, t);
        }
    }

    /// Runs the whole pool at `percent` of its pCPUs' speed, as a slower host: at each
    /// accounting every active domain's cap becomes at most its weight share of
    /// `percent x pCPUs` (its own cap still applies if lower), so every domain runs at
    /// `percent` of the rate it would have on a full-speed pool, however many domains
    /// share it and as they come and go. 100 turns it off.
    pub fn set_speed_percent(&mut self, percent: u32) -> Result<(), ParamError> {
        if !(1..=100).contains(&percent) {
            return Err(ParamError::Speed(percent));
        }
        self.speed_percent = percent;
        Ok(())
    }

    /// The pool's speed in percent ([`Self::set_speed_percent`]).
    pub fn speed_percent(&self) -> u32 {
        self.speed_percent
    }

    // ---- introspection ----

    /// The current parameters.
    pub fn params(&self) -> Params {
        self.params
    }

    /// Number of pCPUs.
    pub fn pcpus(&self) -> u32 {
        self.pcpus.len() as u32
    }

    /// All domains, in creation order.
    pub fn domains(&self) -> impl Iterator<Item = DomainId> + '_ {
        (0..self.domains.len() as u32).map(DomainId)
    }

    /// All vCPUs, in creation order.
    pub fn vcpus(&self) -> impl Iterator<Item = VcpuId> + '_ {
        (0..self.vcpus.len() as u32).map(VcpuId)
    }

    /// vCPUs of `dom`.
    pub fn domain_vcpus(&self, dom: DomainId) -> &[VcpuId] {
        &self.domains[dom.0 as usize].vcpus
    }

    /// What `p` runs.
    pub fn current(&self, p: PcpuId) -> Option<VcpuId> {
        self.pcpus[p.0 as usize].current
    }

    /// Queued vCPUs of `p`, best first.
    pub fn runq(&self, p: PcpuId) -> impl Iterator<Item = VcpuId> + '_ {
        self.pcpus[p.0 as usize].runq.iter()
    }

    /// Number of queued vCPUs on `p`.
    pub fn runq_len(&self, p: PcpuId) -> usize {
        self.pcpus[p.0 as usize].runq.len()
    }

    /// When the next accounting is due (on pCPU 0).
    pub fn next_accounting(&self) -> u64 {
        self.next_acct_ns
    }

    /// Snapshot of `v`.
    pub fn vcpu_stats(&self, v: VcpuId) -> VcpuStats {
        let vc = self.vcpu(v);
        let state = match vc.place {
            Place::Running => VcpuState::Running,
            Place::Queued => VcpuState::Runnable,
            Place::Off if vc.removed => VcpuState::Removed,
            Place::Off if vc.blocked => VcpuState::Blocked,
            Place::Off => VcpuState::Parked,
        };
        VcpuStats {
            domain: vc.dom,
            state,
            priority: vc.pri,
            credit: vc.credit / crate::params::CREDIT_SCALE,
            credit_milli: vc.credit,
            pcpu: vc.pcpu,
            parked: vc.parked,
            active: vc.active,
            run_ns: vc.run_ns,
            directed_boosts: vc.directed_boosts,
        }
    }

    /// Snapshot of `dom`.
    pub fn domain_stats(&self, dom: DomainId) -> DomainStats {
        let d = &self.domains[dom.0 as usize];
        DomainStats {
            weight: d.weight,
            cap: d.cap,
            vcpus: d.vcpus.len() as u32,
            active_vcpus: d.active_vcpus,
            run_ns: d.run_ns,
        }
    }
}
