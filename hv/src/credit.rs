//! The credit scheduler's mechanism: a driver thread that runs `sched::Scheduler` (the
//! policy, told the time and events) against real vCPU threads.
//!
//! Mechanism, chosen by measurement (`kumo bench switch`: a SCHED_FIFO re-rank hands a
//! host CPU over in ~29 us median, parking and unparking in ~43 us): every vCPU thread
//! is pinned to the host CPU of its scheduler pCPU and ranked with SCHED_FIFO so that
//! the kernel does the dispatching the scheduler decided:
//! - the vCPU the scheduler runs on a pCPU gets [`RANK_RUNNING`];
//! - queued vCPUs get [`RANK_QUEUED`]: they run only if the chosen one halts, until
//!   the driver notices (work-conserving in between, like Xen picking the next one);
//! - a halted vCPU that would wake UNDER gets [`RANK_BOOST`], above the running one:
//!   its wake-up preempts at once, which is Xen's BOOST (the kernel does not apply the
//!   ratelimit here; the scheduler does from the next decision on);
//! - a vCPU the scheduler parks (cap) is held at its gate, outside KVM_RUN.
//!
//! The driver runs every tick (and at every slice end and accounting): it reads which
//! vCPU threads are runnable or halted (`/proc`), reports wake-ups and blocks, runs
//! the scheduler's ticks and decisions, and applies the ranks that changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sched::{DomainId, Params, PcpuId, Priority, Scheduler, Tickles, VcpuId, VcpuState};

use crate::Error;
use crate::placement::{self, Policy, VcpuControl};

/// SCHED_FIFO priorities, low to high.
pub const RANK_QUEUED: u8 = 2;
pub const RANK_RUNNING: u8 = 4;
pub const RANK_BOOST: u8 = 6;
/// The driver itself, above every vCPU so that it runs when due.
pub const RANK_DRIVER: u8 = 8;

/// A domain handed to the driver.
pub struct DomainSpec {
    pub name: String,
    pub weight: u16,
    pub cap: u32,
    pub control: Arc<VcpuControl>,
}

/// A domain as the driver reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainView {
    pub name: String,
    pub weight: u16,
    pub cap: u32,
    pub vcpus: u32,
    /// Host CPU time its vCPU threads used so far.
    pub cpu: Duration,
}

struct Dom {
    name: String,
    id: DomainId,
    control: Arc<VcpuControl>,
    /// Scheduler ids of its vCPUs, in vCPU order.
    vcpus: Vec<VcpuId>,
}

/// Where the driver last put a vCPU thread, to skip syscalls that change nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Applied {
    host_cpu: usize,
    rank: u8,
    parked: bool,
}

struct VcpuRef {
    dom: usize,
    index: usize,
    /// As last reported to the scheduler.
    blocked: bool,
    /// Its thread ended (the VM finished): removed from the scheduler.
    removed: bool,
    applied: Option<Applied>,
}

struct State {
    sched: Scheduler,
    host_cpus: Vec<usize>,
    doms: Vec<Dom>,
    /// Indexed by `VcpuId.0`.
    vcpus: Vec<VcpuRef>,
    epoch: Instant,
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    /// Pokes the driver early (a parameter or domain change).
    poke: Condvar,
}

/// The running driver; dropping it stops it and returns every vCPU thread to the
/// host's normal scheduling.
pub struct CreditDriver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl CreditDriver {
    /// Starts scheduling `domains` on `host_cpus` (scheduler pCPU `i` is host CPU
    /// `host_cpus[i]`). vCPU threads not started yet are placed once they exist.
    pub fn start(
        params: Params,
        host_cpus: Vec<usize>,
        domains: Vec<DomainSpec>,
    ) -> Result<CreditDriver, Error> {
        let epoch = Instant::now();
        let mut sched = Scheduler::new(params, host_cpus.len() as u32, 0)
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        let mut doms = Vec::new();
        let mut vcpus = Vec::new();
        for (d, spec) in domains.into_iter().enumerate() {
            let id = sched
                .add_domain(spec.weight, spec.cap)
                .map_err(|e| Error::Scheduler(format!("domain '{}': {e}", spec.name)))?;
            let mut ids = Vec::new();
            for index in 0..spec.control.vcpus() {
                let v = sched
                    .add_vcpu(0, id)
                    .map_err(|e| Error::Scheduler(e.to_string()))?;
                // Created blocked; a vCPU thread about to run is runnable.
                let _ = sched.wake(0, v);
                ids.push(v);
                vcpus.push(VcpuRef {
                    dom: d,
                    index,
                    blocked: false,
                    removed: false,
                    applied: None,
                });
            }
            doms.push(Dom {
                name: spec.name,
                id,
                control: spec.control,
                vcpus: ids,
            });
        }
        for p in 0..host_cpus.len() {
            let _ = sched.schedule(0, PcpuId(p as u32));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                sched,
                host_cpus,
                doms,
                vcpus,
                epoch,
            }),
            stop: AtomicBool::new(false),
            poke: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("credit".into())
            .spawn(move || drive(&thread_shared))
            .map_err(|source| Error::Os {
                what: "spawning the credit scheduler thread",
                source,
            })?;
        Ok(CreditDriver {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn params(&self) -> Params {
        self.lock().sched.params()
    }

    /// Changes the slice, tick or ratelimit of the running scheduler.
    pub fn set_params(&self, params: Params) -> Result<(), Error> {
        let mut state = self.lock();
        let now = state.now();
        state
            .sched
            .set_params(now, params)
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        drop(state);
        self.shared.poke.notify_all();
        Ok(())
    }

    pub fn domains(&self) -> Vec<DomainView> {
        let state = self.lock();
        state.doms.iter().map(|d| state.view(d)).collect()
    }

    /// Changes a domain's weight and/or cap at run time.
    pub fn set_domain(
        &self,
        name: &str,
        weight: Option<u16>,
        cap: Option<u32>,
    ) -> Result<DomainView, Error> {
        let mut state = self.lock();
        let Some(d) = state.doms.iter().position(|d| d.name == name) else {
            return Err(Error::Scheduler(format!("no domain '{name}'")));
        };
        let id = state.doms[d].id;
        let now_stats = state.sched.domain_stats(id);
        let tickles = state
            .sched
            .set_domain(
                id,
                weight.unwrap_or(now_stats.weight),
                cap.unwrap_or(now_stats.cap),
            )
            .map_err(|e| Error::Scheduler(format!("domain '{name}': {e}")))?;
        let now = state.now();
        state.reschedule(now, tickles);
        let view = state.view(&state.doms[d]);
        drop(state);
        self.shared.poke.notify_all();
        Ok(view)
    }
}

impl Drop for CreditDriver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.poke.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Whatever is left of the domains goes back to the host's scheduler.
        let state = self.lock();
        for r in &state.vcpus {
            let control = &state.doms[r.dom].control;
            control.unpark(r.index);
            let _ = control.set_policy(r.index, Policy::Normal);
            let _ = control.confine(r.index, &state.host_cpus);
        }
    }
}

impl State {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn view(&self, d: &Dom) -> DomainView {
        let stats = self.sched.domain_stats(d.id);
        DomainView {
            name: d.name.clone(),
            weight: stats.weight,
            cap: stats.cap,
            vcpus: d.vcpus.len() as u32,
            cpu: (0..d.control.vcpus())
                .filter_map(|i| d.control.cpu_time(i))
                .sum(),
        }
    }

    /// Schedules every tickled pCPU, and the ones those decisions tickle.
    fn reschedule(&mut self, now: u64, mut tickles: Tickles) {
        // Bounded: each decision can tickle only other pCPUs' idle ones.
        for _ in 0..4 * self.host_cpus.len() + 4 {
            let Some(p) = tickles.pop_first() else {
                return;
            };
            let decision = self.sched.schedule(now, p);
            tickles.extend(decision.tickles);
        }
    }

    /// Reports wake-ups and blocks the threads show.
    fn observe(&mut self, now: u64) -> Tickles {
        let mut tickles = Tickles::new();
        for v in 0..self.vcpus.len() {
            let r = &self.vcpus[v];
            let control = &self.doms[r.dom].control;
            if r.removed {
                continue;
            }
            let id = VcpuId(v as u32);
            if control.has_ended(r.index) {
                // The VM is over: its vCPUs leave the scheduler (Xen destroys the
                // domain's units), so others get the pCPUs at once.
                tickles.extend(self.sched.remove_vcpu(now, id));
                self.vcpus[v].removed = true;
                continue;
            }
            // Parked threads sleep at the gate: that is not the guest halting.
            if control.is_parked(r.index) {
                continue;
            }
            let Some(runnable) = control.runnable(r.index) else {
                continue;
            };
            if runnable && r.blocked {
                tickles.extend(self.sched.wake(now, id));
                self.vcpus[v].blocked = false;
            } else if !runnable && !r.blocked {
                tickles.extend(self.sched.block(now, id));
                self.vcpus[v].blocked = true;
            }
        }
        tickles
    }

    /// Runs the ticks that are due.
    fn ticks(&mut self, now: u64) -> Tickles {
        let mut tickles = Tickles::new();
        for p in 0..self.host_cpus.len() {
            let p = PcpuId(p as u32);
            if self.sched.next_deadline(p) <= now {
                tickles.extend(self.sched.tick(now, p));
            }
        }
        tickles
    }

    /// Makes the threads follow the scheduler: pin, rank, park.
    fn apply(&mut self) {
        for v in 0..self.vcpus.len() {
            let stats = self.sched.vcpu_stats(VcpuId(v as u32));
            let want = Applied {
                host_cpu: self.host_cpus[stats.pcpu.0 as usize],
                rank: match stats.state {
                    VcpuState::Running => RANK_RUNNING,
                    VcpuState::Blocked if stats.priority >= Priority::Under => RANK_BOOST,
                    _ => RANK_QUEUED,
                },
                parked: stats.state == VcpuState::Parked,
            };
            let r = &self.vcpus[v];
            if r.removed || r.applied == Some(want) {
                continue;
            }
            let control = &self.doms[r.dom].control;
            let index = r.index;
            let before = r.applied;
            // A thread that has not started (or has ended) cannot be placed yet.
            let placed = (before.map(|a| a.host_cpu) == Some(want.host_cpu)
                || control.pin(index, want.host_cpu).is_ok())
                && (before.map(|a| a.rank) == Some(want.rank)
                    || control.set_policy(index, Policy::Fifo(want.rank)).is_ok());
            if !placed {
                continue;
            }
            if want.parked && !control.is_parked(index) {
                if control.park(index).is_err() {
                    continue;
                }
            } else if !want.parked && control.is_parked(index) {
                control.unpark(index);
            }
            self.vcpus[v].applied = Some(want);
        }
    }

    /// When the driver must run next: the earliest deadline, and at least every tick
    /// (to notice blocks and wake-ups).
    fn next_run(&self, now: u64) -> u64 {
        let tick = self.sched.params().tick_ns;
        (0..self.host_cpus.len())
            .map(|p| self.sched.next_deadline(PcpuId(p as u32)))
            .fold(now + tick, u64::min)
            .max(now + 50_000)
    }
}

fn drive(shared: &Shared) {
    if let Err(e) = placement::set_policy(0, Policy::Fifo(RANK_DRIVER)) {
        tracing::warn!("the credit driver runs without real-time priority: {e}");
    }
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    // Run beside the node where the host has a CPU to spare (each run of the driver on
    // a node CPU preempts a vCPU: two switches, ~60 us here), else on the node's CPUs.
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spare: Vec<usize> = (0..host_cpus)
        .filter(|c| !state.host_cpus.contains(c))
        .collect();
    let home = if spare.is_empty() {
        state.host_cpus.clone()
    } else {
        spare
    };
    if let Err(e) = placement::confine_thread(0, &home) {
        tracing::warn!("cannot confine the credit driver: {e}");
    }
    while !shared.stop.load(Ordering::SeqCst) {
        let now = state.now();
        let mut tickles = state.observe(now);
        tickles.extend(state.ticks(now));
        state.reschedule(now, tickles);
        state.apply();
        let wait = Duration::from_nanos(state.next_run(now).saturating_sub(state.now()));
        state = shared
            .poke
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}
