//! A deterministic discrete-event driver: synthetic vCPU workloads on top of
//! a [`Scheduler`], used by the tests and reusable by simulators.
//!
//! Each step advances to the earliest pending event (a pCPU deadline, a vCPU
//! finishing its CPU burst, a wake-up), delivers every event due at that
//! instant in a fixed order (bursts ending by pCPU, wake-ups by vCPU, timers
//! by pCPU), then runs `schedule` on tickled pCPUs (lowest first) until none
//! is left. The observer sees the state after each such quiescent instant.

use crate::ids::{PcpuId, Tickles, VcpuId};
use crate::scheduler::Scheduler;
use crate::stats::{Priority, VcpuState};

/// What a simulated vCPU does with the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Always runnable (a CPU hog, or MPI busy-waiting).
    Busy,
    /// Runs `run_ns` of CPU time, then blocks for `sleep_ns` (I/O-bound).
    Periodic { run_ns: u64, sleep_ns: u64 },
    /// Runs `run_ns` of CPU time, then yields, forever.
    Yielder { run_ns: u64 },
}

#[derive(Clone, Debug)]
struct SimVcpu {
    workload: Workload,
    /// CPU time left in the current burst (`u64::MAX` = endless).
    burst_left: u64,
    /// Running since (for burst and run-time bookkeeping).
    running_since: Option<u64>,
    wake_at: Option<u64>,
    run_ns: u64,
    /// Runnable but not running since (wait tracking).
    waiting_since: Option<u64>,
    max_wait_ns: u64,
    /// Time of the last wake-up and whether it was boosted, until dispatched.
    pending_wake: Option<(u64, bool)>,
    max_boosted_wake_latency_ns: u64,
    boosted_wakes: u64,
}

/// The simulator.
#[derive(Clone, Debug)]
pub struct Sim {
    sched: Scheduler,
    now: u64,
    running: Vec<Option<VcpuId>>,
    vcpus: Vec<SimVcpu>,
    pending: Tickles,
}

impl Sim {
    /// Simulates `sched` starting at time `now`. vCPUs must be added through
    /// [`Sim::add_vcpu`].
    pub fn new(sched: Scheduler, now: u64) -> Self {
        let n = sched.pcpus() as usize;
        Self {
            sched,
            now,
            running: vec![None; n],
            vcpus: Vec::new(),
            pending: Tickles::new(),
        }
    }

    /// Adds a vCPU to `dom` with `workload`, and wakes it now.
    pub fn add_vcpu(&mut self, dom: crate::DomainId, workload: Workload) -> VcpuId {
        let v = self.sched.add_vcpu(self.now, dom).expect("domain exists");
        self.vcpus.push(SimVcpu {
            workload,
            burst_left: Self::burst(workload),
            running_since: None,
            wake_at: Some(self.now),
            run_ns: 0,
            waiting_since: None,
            max_wait_ns: 0,
            pending_wake: None,
            max_boosted_wake_latency_ns: 0,
            boosted_wakes: 0,
        });
        v
    }

    fn burst(w: Workload) -> u64 {
        match w {
            Workload::Busy => u64::MAX,
            Workload::Periodic { run_ns, .. } | Workload::Yielder { run_ns } => run_ns,
        }
    }

    /// The scheduler (for stats and run-time control).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Ends the simulation, keeping the scheduler in its current state.
    pub fn into_scheduler(self) -> Scheduler {
        self.sched
    }

    /// The scheduler, mutably (e.g. `set_params`); returned tickles must be
    /// handed to [`Sim::reschedule`].
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// Queues pCPUs to reschedule at the next step.
    pub fn reschedule(&mut self, t: Tickles) {
        self.pending.extend(t);
    }

    /// Current simulated time.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Exact CPU time `v` received up to now.
    pub fn run_ns(&self, v: VcpuId) -> u64 {
        let s = &self.vcpus[v.0 as usize];
        s.run_ns + s.running_since.map_or(0, |t| self.now - t)
    }

    /// Longest time `v` waited runnable (queued, not parked) before running.
    /// Includes a wait still in progress.
    pub fn max_wait_ns(&self, v: VcpuId) -> u64 {
        let s = &self.vcpus[v.0 as usize];
        s.max_wait_ns
            .max(s.waiting_since.map_or(0, |w| self.now - w))
    }

    /// Longest wake-to-run latency over wake-ups that were BOOSTed and still
    /// BOOST when dispatched, and the number of such wake-ups.
    pub fn boosted_wake_latency(&self, v: VcpuId) -> (u64, u64) {
        let s = &self.vcpus[v.0 as usize];
        (s.max_boosted_wake_latency_ns, s.boosted_wakes)
    }

    /// What the simulation believes `p` runs (mirrors the decisions).
    pub fn running(&self, p: PcpuId) -> Option<VcpuId> {
        self.running[p.0 as usize]
    }

    fn next_event(&self) -> u64 {
        let mut t = u64::MAX;
        for p in 0..self.running.len() {
            t = t.min(self.sched.next_deadline(PcpuId(p as u32)));
        }
        for s in &self.vcpus {
            if let Some(w) = s.wake_at {
                t = t.min(w);
            }
            if let Some(since) = s.running_since
                && s.burst_left != u64::MAX
            {
                t = t.min(since + s.burst_left);
            }
        }
        if !self.pending.is_empty() {
            t = t.min(self.now);
        }
        t
    }

    /// Runs until `end`, calling `observe` after every quiescent instant.
    pub fn run_until(&mut self, end: u64, mut observe: impl FnMut(&Sim)) {
        loop {
            let t = self.next_event();
            if t > end {
                self.now = end;
                return;
            }
            self.step(t);
            observe(self);
        }
    }

    fn step(&mut self, t: u64) {
        self.now = t;
        let mut tickles = std::mem::take(&mut self.pending);
        // Bursts ending: block or yield.
        for p in 0..self.running.len() {
            let Some(v) = self.running[p] else { continue };
            let s = &mut self.vcpus[v.0 as usize];
            let Some(since) = s.running_since else {
                continue;
            };
            if s.burst_left == u64::MAX || since + s.burst_left > t {
                continue;
            }
            match s.workload {
                Workload::Periodic { run_ns, sleep_ns } => {
                    s.wake_at = Some(t + sleep_ns);
                    s.burst_left = run_ns;
                    s.run_ns += t - since;
                    s.running_since = None;
                    tickles.extend(self.sched.block(t, v));
                }
                Workload::Yielder { run_ns } => {
                    s.run_ns += t - since;
                    s.running_since = Some(t);
                    s.burst_left = run_ns;
                    tickles.extend(self.sched.yield_vcpu(t, v));
                }
                Workload::Busy => {}
            }
        }
        for i in 0..self.vcpus.len() {
            if self.vcpus[i].wake_at.is_some_and(|w| w <= t) {
                self.vcpus[i].wake_at = None;
                let v = VcpuId(i as u32);
                tickles.extend(self.sched.wake(t, v));
                let boosted = self.sched.vcpu_stats(v).priority == Priority::Boost;
                self.vcpus[i].pending_wake = Some((t, boosted));
            }
        }
        for p in 0..self.running.len() {
            let p = PcpuId(p as u32);
            if self.sched.next_deadline(p) <= t {
                tickles.extend(self.sched.tick(t, p));
            }
        }
        while let Some(p) = tickles.pop_first() {
            let d = self.sched.schedule(t, p);
            tickles.extend(d.tickles);
            self.apply(t, p, d.run);
        }
        self.track_waits(t);
    }

    fn apply(&mut self, t: u64, p: PcpuId, run: Option<VcpuId>) {
        let prev = self.running[p.0 as usize];
        if prev == run {
            return;
        }
        if let Some(v) = prev {
            let s = &mut self.vcpus[v.0 as usize];
            if let Some(since) = s.running_since.take() {
                s.run_ns += t - since;
                if s.burst_left != u64::MAX {
                    s.burst_left -= t - since;
                }
            }
        }
        if let Some(v) = run {
            let s = &mut self.vcpus[v.0 as usize];
            s.running_since = Some(t);
            if let Some((w, true)) = s.pending_wake.take() {
                s.boosted_wakes += 1;
                s.max_boosted_wake_latency_ns = s.max_boosted_wake_latency_ns.max(t - w);
            }
        }
        self.running[p.0 as usize] = run;
    }

    fn track_waits(&mut self, t: u64) {
        for i in 0..self.vcpus.len() {
            let state = self.sched.vcpu_stats(VcpuId(i as u32)).state;
            let s = &mut self.vcpus[i];
            if state == VcpuState::Runnable {
                s.waiting_since.get_or_insert(t);
                // An accounting may re-derive a queued BOOST vCPU's priority
                // (Xen `csched_acct`); from then on it waits like any other.
                if let Some((w, true)) = s.pending_wake
                    && self.sched.vcpu_stats(VcpuId(i as u32)).priority != Priority::Boost
                {
                    s.pending_wake = Some((w, false));
                }
            } else if let Some(w) = s.waiting_since.take() {
                s.max_wait_ns = s.max_wait_ns.max(t - w);
            }
            if state != VcpuState::Runnable && state != VcpuState::Running {
                s.pending_wake = None;
            }
        }
    }
}
