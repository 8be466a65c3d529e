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
//! - a vCPU the scheduler parks (cap) is held at its gate, outside KVM_RUN;
//! - with directed yield on (`Params::directed_yield`), a queued vCPU the scheduler
//!   BOOSTed gets [`RANK_HURRIED`], above the other queued ones: between two runs of
//!   the driver, whenever a running vCPU blocks, the kernel runs the vCPUs a barrier
//!   waits for before other domains' queued ones.
//!
//! Directed yield's hint is the paravirtual wait page: a vCPU blocked there on a word
//! (a barrier's generation, `VcpuControl::pv_waiting_on`) waits for its siblings that
//! are runnable and not blocked on that word; the driver hands that to
//! `Scheduler::yield_to` at each run.
//!
//! The driver runs every tick (and at every slice end and accounting): it reads which
//! vCPU threads are runnable or halted (`/proc`), reports wake-ups and blocks, runs
//! the scheduler's ticks and decisions, and applies the ranks that changed.
//!
//! Tickless while nothing can change: each run of the driver on a node CPU preempts a
//! vCPU (two switches, 30-60 us on kvm_pvm), which at a 1 ms tick is 5-10 % of a CPU.
//! When every pCPU has at most one vCPU that runs or could wake there, no domain is
//! capped, and domain 0 has slept for [`QUIET_BEFORE_TICKLESS`], no tick or slice end
//! can change which vCPU runs where: the driver then sleeps up to [`TICKLESS_SLEEP`],
//! woken at once by domain 0's next wake-up (its backend threads say so:
//! `ThreadGroup::note_activity`). On waking it first replays the ticks, slice ends
//! and accountings it slept through, in order, as they would have run (nothing it
//! observes changed in between, or it would not have slept), so credits and
//! decisions are those of the ticking driver.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sched::{DomainId, Params, PcpuId, Priority, Scheduler, Tickles, VcpuId, VcpuState};

use crate::Error;
use crate::placement::{self, Policy, ThreadGroup, VcpuControl};

/// Real-time priorities (SCHED_FIFO; SCHED_RR for domain 0's threads), low to high.
pub const RANK_QUEUED: u8 = 2;
/// A queued vCPU a directed yield BOOSTed (only with `Params::directed_yield`).
pub const RANK_HURRIED: u8 = 3;
pub const RANK_RUNNING: u8 = 4;
pub const RANK_BOOST: u8 = 6;
/// The driver itself, above every vCPU so that it runs when due.
pub const RANK_DRIVER: u8 = 8;

/// How long domain 0 must have slept, with nothing else to decide, before the driver
/// stops ticking: a workload that messages more often than this keeps it ticking, so
/// domain 0's wake-ups never cost a driver run more than the ticks would.
pub const QUIET_BEFORE_TICKLESS: Duration = Duration::from_millis(10);
/// The longest tickless sleep (unless the tick is longer): bounds how late the driver
/// notices what no thread reports (a vCPU that halts, a VM that ends).
pub const TICKLESS_SLEEP: Duration = Duration::from_millis(10);

/// A domain handed to the driver.
pub struct DomainSpec {
    pub name: String,
    pub weight: u16,
    pub cap: u32,
    pub control: Arc<VcpuControl>,
}

/// Domain 0: the VMM's backend threads, scheduled as one vCPU with its own weight
/// (as Xen's dom0 competes with guests for pCPUs). It cannot be capped: its threads
/// have no gate to park at.
pub struct Dom0Spec {
    pub weight: u16,
    pub threads: Arc<ThreadGroup>,
}

/// What runs for one scheduler vCPU: a VM's vCPU thread, or domain 0's threads.
enum Runner {
    Vcpu {
        control: Arc<VcpuControl>,
        index: usize,
    },
    Dom0(Arc<ThreadGroup>),
}

impl Runner {
    /// Whether it says when it wakes (domain 0's threads do); a guest vCPU that halts
    /// wakes inside KVM, unseen until the driver looks.
    fn reports_wakeups(&self) -> bool {
        matches!(self, Runner::Dom0(_))
    }

    /// `wakes_run_at_once`: see `VcpuControl::runnable`.
    fn runnable(&self, wakes_run_at_once: bool) -> Option<bool> {
        match self {
            Runner::Vcpu { control, index } => control.runnable(*index, wakes_run_at_once),
            Runner::Dom0(group) => group.runnable(wakes_run_at_once),
        }
    }

    fn has_ended(&self) -> bool {
        match self {
            Runner::Vcpu { control, index } => control.has_ended(*index),
            Runner::Dom0(_) => false,
        }
    }

    fn is_parked(&self) -> bool {
        match self {
            Runner::Vcpu { control, index } => control.is_parked(*index),
            Runner::Dom0(_) => false,
        }
    }

    fn pin(&self, cpu: usize) -> Result<(), Error> {
        match self {
            Runner::Vcpu { control, index } => control.pin(*index, cpu),
            Runner::Dom0(group) => group.confine(&[cpu]),
        }
    }

    fn set_policy(&self, policy: Policy) -> Result<(), Error> {
        match self {
            Runner::Vcpu { control, index } => control.set_policy(*index, policy),
            Runner::Dom0(group) => group.set_policy(policy),
        }
    }

    /// Gives it scheduler rank `rank` on its host CPU. Domain 0's threads share one
    /// rank and one CPU, so they take turns (SCHED_RR), as a dom0 vCPU's kernel shares
    /// it among its processes: under SCHED_FIFO one busy member (a migration's
    /// sender) kept the others (the API, the switch) off the CPU until it blocked.
    fn set_rank(&self, rank: u8) -> Result<(), Error> {
        match self {
            Runner::Vcpu { .. } => self.set_policy(Policy::Fifo(rank)),
            Runner::Dom0(_) => self.set_policy(Policy::RoundRobin(rank)),
        }
    }

    fn park(&self) -> Result<(), Error> {
        match self {
            Runner::Vcpu { control, index } => control.park(*index),
            Runner::Dom0(_) => Ok(()),
        }
    }

    fn unpark(&self) {
        if let Runner::Vcpu { control, index } = self {
            control.unpark(*index);
        }
    }

    fn confine(&self, cpus: &[usize]) {
        let _ = match self {
            Runner::Vcpu { control, index } => control.confine(*index, cpus),
            Runner::Dom0(group) => group.confine(cpus),
        };
    }

    /// Changes when the set of threads changes (a newcomer must be placed).
    fn generation(&self) -> u64 {
        match self {
            Runner::Vcpu { .. } => 0,
            Runner::Dom0(group) => group.joins(),
        }
    }

    /// The word it is blocked on in the paravirtual wait page (a barrier).
    fn pv_waiting_on(&self) -> Option<u64> {
        match self {
            Runner::Vcpu { control, index } => control.pv_waiting_on(*index),
            Runner::Dom0(_) => None,
        }
    }

    fn cpu_time(&self) -> Duration {
        match self {
            Runner::Vcpu { control, index } => control.cpu_time(*index).unwrap_or_default(),
            Runner::Dom0(group) => group.cpu_time(),
        }
    }
}

/// The name domain 0 has in reports and the control API.
pub const DOM0_NAME: &str = "dom0";

/// A domain as the driver reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainView {
    pub name: String,
    pub weight: u16,
    pub cap: u32,
    pub vcpus: u32,
    /// Host CPU time its vCPU threads used so far.
    pub cpu: Duration,
    /// Times a directed yield BOOSTed one of its vCPUs (`Params::directed_yield`).
    pub directed_boosts: u64,
}

struct Dom {
    name: String,
    id: DomainId,
    /// Scheduler ids of its vCPUs, in vCPU order.
    vcpus: Vec<VcpuId>,
}

/// Where the driver last put a vCPU thread, to skip syscalls that change nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Applied {
    host_cpu: usize,
    rank: u8,
    parked: bool,
    generation: u64,
}

struct VcpuRef {
    runner: Runner,
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
    /// The latest time handed to the scheduler: replayed deadlines never go back
    /// before it.
    last_ns: u64,
    /// Every change of the parameters at run time, in order.
    changes: Vec<ParamChange>,
    /// Reused by [`State::hint_barriers`], so the driver's loop does not allocate once
    /// they have grown to the domains' size.
    barrier_words: Vec<u64>,
    laggards: Vec<VcpuId>,
}

/// A change of the scheduler's parameters while it ran: when (since the driver
/// started) and what was in force from then on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamChange {
    pub at: Duration,
    pub params: Params,
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    /// The driver's thread: unparked to run early (a parameter or domain change, the
    /// end), and by domain 0's wake-ups while it sleeps tickless.
    driver: OnceLock<std::thread::Thread>,
    /// The driver thread's kernel id, for its CPU time (0 until it starts).
    driver_tid: AtomicI32,
    /// Whether it runs on the node's own CPUs (the host has none to spare).
    on_node_cpus: AtomicBool,
    /// Its CPU time in microseconds, recorded as it ends.
    final_cpu_us: AtomicU64,
    counts: DriverCounts,
}

impl Shared {
    fn poke(&self) {
        if let Some(driver) = self.driver.get() {
            driver.unpark();
        }
    }
}

/// How often the driver ran, and how it slept.
#[derive(Default)]
struct DriverCounts {
    runs: AtomicU64,
    tickless: AtomicU64,
    woken_by_dom0: AtomicU64,
}

/// What the driver did so far: a measure of its own cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DriverStats {
    /// Times it ran (each on a node CPU when the host has none to spare).
    pub runs: u64,
    /// Times it slept tickless.
    pub tickless_sleeps: u64,
    /// Tickless sleeps that domain 0's wake-up ended early.
    pub woken_by_dom0: u64,
    /// CPU time its thread used so far, in microseconds.
    pub cpu_us: u64,
    /// Whether it runs on the node's own CPUs, preempting a vCPU at each run (the host
    /// has no CPU to spare), rather than beside them.
    pub on_node_cpus: bool,
}

/// Where the driver thread runs. Each of its runs on a node CPU preempts a vCPU (its
/// own CPU and two switches), so beside the node it costs the node nothing; on a
/// one-CPU node, beside against on it moved 1/1 ms by 7-11 % and the 30/10 baseline
/// by 26-32 % (docs/results/2026-11-29-driver-sensing.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DriverPlace {
    /// Beside the node where the process has a CPU outside it, else on the node.
    #[default]
    Auto,
    /// On CPUs outside the node; refused where the process has none.
    Beside,
    /// On the node's own CPUs, even where a CPU outside it is free: what a host with
    /// no CPU to spare does, measured on one that has.
    Node,
}

impl DriverPlace {
    /// The host CPUs the driver may run on, of `process_cpus`, for a node on
    /// `node_cpus`.
    fn home(self, node_cpus: &[usize], process_cpus: &[usize]) -> Result<Vec<usize>, Error> {
        let spare: Vec<usize> = process_cpus
            .iter()
            .copied()
            .filter(|c| !node_cpus.contains(c))
            .collect();
        match self {
            DriverPlace::Node => Ok(node_cpus.to_vec()),
            DriverPlace::Auto if spare.is_empty() => Ok(node_cpus.to_vec()),
            DriverPlace::Auto => Ok(spare),
            DriverPlace::Beside if spare.is_empty() => Err(Error::Scheduler(format!(
                "the credit driver cannot run beside the node: the process may use host CPUs \
                 {process_cpus:?}, all of them the node's"
            ))),
            DriverPlace::Beside => Ok(spare),
        }
    }
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
    /// `modules` (pCPUs grouped as `host_cpus` is ordered) makes picks module-aware
    /// from the first wake-up on. The driver itself runs where `place` says.
    pub fn start(
        params: Params,
        host_cpus: Vec<usize>,
        modules: Option<sched::Modules>,
        domains: Vec<DomainSpec>,
        dom0: Option<Dom0Spec>,
        place: DriverPlace,
    ) -> Result<CreditDriver, Error> {
        let home = place.home(&host_cpus, &placement::process_cpus())?;
        let epoch = Instant::now();
        let mut sched = Scheduler::new(params, host_cpus.len() as u32, 0)
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        sched
            .set_modules(modules)
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        let mut doms = Vec::new();
        let mut vcpus = Vec::new();
        let mut add = |name: String, weight: u16, cap: u32, runners: Vec<Runner>| {
            let id = sched
                .add_domain(weight, cap)
                .map_err(|e| Error::Scheduler(format!("domain '{name}': {e}")))?;
            let mut ids = Vec::new();
            for runner in runners {
                let v = sched
                    .add_vcpu(0, id)
                    .map_err(|e| Error::Scheduler(e.to_string()))?;
                // Created blocked; a thread about to run is runnable (if it is not,
                // the first observation reports it).
                let _ = sched.wake(0, v);
                ids.push(v);
                vcpus.push(VcpuRef {
                    runner,
                    blocked: false,
                    removed: false,
                    applied: None,
                });
            }
            doms.push(Dom {
                name,
                id,
                vcpus: ids,
            });
            Ok::<(), Error>(())
        };
        if let Some(dom0) = dom0 {
            add(
                DOM0_NAME.into(),
                dom0.weight,
                0,
                vec![Runner::Dom0(dom0.threads)],
            )?;
        }
        for spec in domains {
            let runners = (0..spec.control.vcpus())
                .map(|index| Runner::Vcpu {
                    control: spec.control.clone(),
                    index,
                })
                .collect();
            add(spec.name, spec.weight, spec.cap, runners)?;
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
                last_ns: 0,
                changes: Vec::new(),
                barrier_words: Vec::new(),
                laggards: Vec::new(),
            }),
            stop: AtomicBool::new(false),
            driver: OnceLock::new(),
            driver_tid: AtomicI32::new(0),
            on_node_cpus: AtomicBool::new(false),
            final_cpu_us: AtomicU64::new(0),
            counts: DriverCounts::default(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("credit".into())
            .spawn(move || drive(&thread_shared, home))
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

    /// The parameter changes made so far ([`CreditDriver::set_params`]), in order.
    pub fn param_changes(&self) -> Vec<ParamChange> {
        self.lock().changes.clone()
    }

    /// Changes the slice, tick or ratelimit of the running scheduler.
    pub fn set_params(&self, params: Params) -> Result<(), Error> {
        let mut state = self.lock();
        let now = state.stamp();
        state
            .sched
            .set_params(now, params)
            .map_err(|e| Error::Scheduler(e.to_string()))?;
        let at = state.epoch.elapsed();
        state.changes.push(ParamChange { at, params });
        drop(state);
        self.shared.poke();
        Ok(())
    }

    /// Turns the auto slice on (from the parameters in force: its long setting) or off
    /// (back to them). See `sched::auto_slice`.
    pub fn set_auto(&self, on: bool) {
        let mut state = self.lock();
        let now = state.stamp();
        state.sched.set_auto(now, on);
        drop(state);
        self.shared.poke();
    }

    /// Runs the pool at `percent` of its pCPUs' speed, as a slower host
    /// (`sched::Scheduler::set_speed_percent`; 100: full speed).
    pub fn set_speed_percent(&self, percent: u32) -> Result<(), Error> {
        let result = self.lock().sched.set_speed_percent(percent);
        self.shared.poke();
        result.map_err(|e| Error::Scheduler(e.to_string()))
    }

    /// The auto slice's state and record (None while it is off). Its times are
    /// scheduler times: nanoseconds since the driver started.
    pub fn auto_slice(&self) -> Option<sched::auto_slice::AutoSlice> {
        self.lock().sched.auto().cloned()
    }

    /// Whether picks are module-aware, and over how many modules.
    pub fn modules(&self) -> Option<u32> {
        self.lock().sched.modules().map(sched::Modules::modules)
    }

    /// Adds a domain to the running scheduler (a node's domain that arrived by
    /// migration): its vCPUs start runnable with no credit, and are placed once
    /// their threads exist. A name may be reused only by a domain whose earlier
    /// holder ended (moved away); changes then apply to the newest.
    pub fn add_domain(&self, spec: DomainSpec) -> Result<(), Error> {
        let mut state = self.lock();
        let live =
            |state: &State, d: &Dom| d.vcpus.iter().any(|v| !state.vcpus[v.0 as usize].removed);
        if state
            .doms
            .iter()
            .any(|d| d.name == spec.name && live(&state, d))
        {
            return Err(Error::Scheduler(format!(
                "domain '{}' is already scheduled here",
                spec.name
            )));
        }
        let now = state.stamp();
        let id = state
            .sched
            .add_domain(spec.weight, spec.cap)
            .map_err(|e| Error::Scheduler(format!("domain '{}': {e}", spec.name)))?;
        let mut ids = Vec::new();
        let mut tickles = Tickles::new();
        for index in 0..spec.control.vcpus() {
            let v = state
                .sched
                .add_vcpu(now, id)
                .map_err(|e| Error::Scheduler(e.to_string()))?;
            debug_assert_eq!(v.0 as usize, state.vcpus.len(), "vCPU ids in order");
            tickles.extend(state.sched.wake(now, v));
            ids.push(v);
            state.vcpus.push(VcpuRef {
                runner: Runner::Vcpu {
                    control: spec.control.clone(),
                    index,
                },
                blocked: false,
                removed: false,
                applied: None,
            });
        }
        state.doms.push(Dom {
            name: spec.name,
            id,
            vcpus: ids,
        });
        state.reschedule(now, tickles);
        drop(state);
        self.shared.poke();
        Ok(())
    }

    /// How often it ran and slept tickless so far.
    pub fn stats(&self) -> DriverStats {
        let c = &self.shared.counts;
        DriverStats {
            runs: c.runs.load(Ordering::Relaxed),
            tickless_sleeps: c.tickless.load(Ordering::Relaxed),
            woken_by_dom0: c.woken_by_dom0.load(Ordering::Relaxed),
            cpu_us: match self.shared.driver_tid.load(Ordering::Acquire) {
                0 => 0,
                tid => placement::cpu_time_of(tid).map_or_else(
                    || self.shared.final_cpu_us.load(Ordering::Acquire),
                    |t| t.as_micros() as u64,
                ),
            },
            on_node_cpus: self.shared.on_node_cpus.load(Ordering::Relaxed),
        }
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
        let Some(d) = state.doms.iter().rposition(|d| d.name == name) else {
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
        let now = state.stamp();
        state.reschedule(now, tickles);
        let view = state.view(&state.doms[d]);
        drop(state);
        self.shared.poke();
        Ok(view)
    }
}

impl Drop for CreditDriver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.poke();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Whatever is left of the domains goes back to the host's scheduler.
        let state = self.lock();
        for r in &state.vcpus {
            r.runner.unpark();
            let _ = r.runner.set_policy(Policy::Normal);
            r.runner.confine(&state.host_cpus);
        }
    }
}

impl State {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The time now, for a call that hands it to the scheduler.
    fn stamp(&mut self) -> u64 {
        let now = self.now();
        self.last_ns = self.last_ns.max(now);
        now
    }

    /// Domain 0's threads, if it is scheduled.
    fn dom0(&self) -> Option<Arc<ThreadGroup>> {
        self.vcpus.iter().find_map(|r| match &r.runner {
            Runner::Dom0(group) => Some(group.clone()),
            Runner::Vcpu { .. } => None,
        })
    }

    /// Runs every tick, slice end and accounting due by `now`, each at its own time
    /// and in order, on what was last observed: after a tickless sleep this is what
    /// the ticking driver would have done (it would have observed no change).
    fn catch_up(&mut self, now: u64) {
        // Bounded: a 10 ms sleep at a 1 ms tick is ~10 deadlines a pCPU.
        for _ in 0..MAX_REPLAYED_DEADLINES {
            let due = (0..self.host_cpus.len())
                .map(|p| self.sched.next_deadline(PcpuId(p as u32)))
                .min()
                .unwrap_or(u64::MAX);
            if due > now {
                return;
            }
            let at = due.max(self.last_ns);
            self.last_ns = at;
            let tickles = self.ticks(at);
            self.reschedule(at, tickles);
        }
        // Far behind (the host stalled the driver): the rest collapse into one.
        let tickles = self.ticks(now);
        self.reschedule(now, tickles);
    }

    /// Whether no tick or slice end can change which vCPU runs where until a thread
    /// wakes that says so: every pCPU has at most one vCPU that runs there or could
    /// wake there unseen, nothing is parked and no domain is capped.
    fn nothing_to_decide(&self) -> bool {
        // A bitmap, not a Vec: the driver runs this every time it runs, and must not
        // allocate (a malloc lock held by a preempted thread would stall it).
        let mut occupied = Tickles::new();
        for (v, r) in self.vcpus.iter().enumerate() {
            if r.removed {
                continue;
            }
            let stats = self.sched.vcpu_stats(VcpuId(v as u32));
            if r.applied.is_none() || stats.state == VcpuState::Parked || r.runner.is_parked() {
                return false;
            }
            if r.blocked && r.runner.reports_wakeups() {
                continue;
            }
            if stats.pcpu.0 as usize >= self.host_cpus.len() || occupied.contains(stats.pcpu) {
                return false;
            }
            occupied.insert(stats.pcpu);
        }
        self.doms
            .iter()
            .all(|d| self.sched.domain_stats(d.id).cap == 0)
    }

    fn view(&self, d: &Dom) -> DomainView {
        let stats = self.sched.domain_stats(d.id);
        DomainView {
            name: d.name.clone(),
            weight: stats.weight,
            cap: stats.cap,
            vcpus: d.vcpus.len() as u32,
            cpu: d
                .vcpus
                .iter()
                .map(|v| self.vcpus[v.0 as usize].runner.cpu_time())
                .sum(),
            directed_boosts: d
                .vcpus
                .iter()
                .map(|v| self.sched.vcpu_stats(*v).directed_boosts)
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
            if r.removed {
                continue;
            }
            let id = VcpuId(v as u32);
            if r.runner.has_ended() {
                // The VM is over: its vCPUs leave the scheduler (Xen destroys the
                // domain's units), so others get the pCPUs at once.
                tickles.extend(self.sched.remove_vcpu(now, id));
                self.vcpus[v].removed = true;
                continue;
            }
            // Parked threads sleep at the gate: that is not the guest halting.
            if r.runner.is_parked() {
                continue;
            }
            // Ranked to run or to preempt, a thread that wakes runs at once (only this
            // driver ranks above it), so its own word and KVM's say whether it sleeps;
            // a queued one may have woken and still wait, which only `/proc` shows.
            let wakes_run_at_once = r
                .applied
                .is_some_and(|a| a.rank >= RANK_RUNNING && !a.parked);
            let Some(runnable) = r.runner.runnable(wakes_run_at_once) else {
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
        if self.sched.params().directed_yield {
            tickles.extend(self.hint_barriers(now));
        }
        tickles
    }

    /// Directed yield's hints: in each domain, the first vCPU found blocked on a word
    /// of the paravirtual wait page waits for its siblings that are runnable and not
    /// blocked on that word (the barrier's laggards). One hint per word and pass:
    /// further waiters at the same barrier would name the same laggards.
    fn hint_barriers(&mut self, now: u64) -> Tickles {
        let mut tickles = Tickles::new();
        let mut words = std::mem::take(&mut self.barrier_words);
        let mut laggards = std::mem::take(&mut self.laggards);
        for d in &self.doms {
            words.clear();
            for &waiter in &d.vcpus {
                let r = &self.vcpus[waiter.0 as usize];
                if r.removed || !r.blocked {
                    continue;
                }
                let Some(word) = r.runner.pv_waiting_on() else {
                    continue;
                };
                if words.contains(&word) {
                    continue;
                }
                words.push(word);
                laggards.clear();
                laggards.extend(d.vcpus.iter().copied().filter(|v| {
                    let r = &self.vcpus[v.0 as usize];
                    !r.removed && !r.blocked && r.runner.pv_waiting_on() != Some(word)
                }));
                tickles.extend(self.sched.yield_to(now, waiter, &laggards));
            }
        }
        self.barrier_words = words;
        self.laggards = laggards;
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
        let hurry = self.sched.params().directed_yield;
        for v in 0..self.vcpus.len() {
            let stats = self.sched.vcpu_stats(VcpuId(v as u32));
            let want = Applied {
                host_cpu: self.host_cpus[stats.pcpu.0 as usize],
                rank: match stats.state {
                    VcpuState::Running => RANK_RUNNING,
                    VcpuState::Blocked if stats.priority >= Priority::Under => RANK_BOOST,
                    VcpuState::Runnable if hurry && stats.priority == Priority::Boost => {
                        RANK_HURRIED
                    }
                    _ => RANK_QUEUED,
                },
                parked: stats.state == VcpuState::Parked,
                generation: self.vcpus[v].runner.generation(),
            };
            let r = &self.vcpus[v];
            if r.removed || r.applied == Some(want) {
                continue;
            }
            let runner = &r.runner;
            let before = r.applied;
            // A thread that has not started (or has ended) cannot be placed yet.
            let same_threads = before.map(|a| a.generation) == Some(want.generation);
            let placed = (same_threads && before.map(|a| a.host_cpu) == Some(want.host_cpu)
                || runner.pin(want.host_cpu).is_ok())
                && (same_threads && before.map(|a| a.rank) == Some(want.rank)
                    || runner.set_rank(want.rank).is_ok());
            if !placed {
                continue;
            }
            if want.parked && !runner.is_parked() {
                if runner.park().is_err() {
                    continue;
                }
            } else if !want.parked && runner.is_parked() {
                runner.unpark();
            }
            self.vcpus[v].applied = Some(want);
        }
    }

    /// One run of the driver at `now`: what fell due, what the threads show, the
    /// decisions, and the threads made to follow them. It must not allocate (see
    /// `the_drivers_run_does_not_allocate_once_warm`): a malloc lock held by a thread
    /// the driver itself preempted would stall it.
    fn step(&mut self, now: u64) {
        self.catch_up(now);
        let tickles = self.observe(now);
        self.reschedule(now, tickles);
        self.apply();
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

/// A bound on the deadlines one run replays (see [`State::catch_up`]).
const MAX_REPLAYED_DEADLINES: usize = 4096;

/// The driver's thread, confined to `home` (`DriverPlace::home`).
fn drive(shared: &Shared, home: Vec<usize>) {
    let _ = shared.driver.set(std::thread::current());
    if let Err(e) = placement::set_policy(0, Policy::Fifo(RANK_DRIVER)) {
        tracing::warn!("the credit driver runs without real-time priority: {e}");
    }
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    shared
        .on_node_cpus
        .store(home == state.host_cpus, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    shared
        .driver_tid
        .store(unsafe { libc::gettid() }, Ordering::Release);
    if let Err(e) = placement::confine_thread(0, &home) {
        tracing::warn!("cannot confine the credit driver: {e}");
    }
    crate::seccomp::apply_or_exit(crate::seccomp::ThreadKind::Credit);
    let dom0 = state.dom0();
    let mut seen_activity = dom0.as_ref().map_or(0, |g| g.activity());
    let mut quiet_since: Option<u64> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        shared.counts.runs.fetch_add(1, Ordering::Relaxed);
        let now = state.stamp();
        state.step(now);

        let activity = dom0.as_ref().map_or(0, |g| g.activity());
        // Domain 0's wake-ups since the last run: the auto slice's message signal.
        state.sched.note_wakes(activity.wrapping_sub(seen_activity));
        let quiet = activity == seen_activity && state.nothing_to_decide();
        seen_activity = activity;
        quiet_since = quiet.then(|| quiet_since.unwrap_or(now));
        let tick = state.sched.params().tick_ns;
        let tickless = quiet_since
            .is_some_and(|since| now - since >= QUIET_BEFORE_TICKLESS.as_nanos() as u64)
            && dom0.as_ref().is_none_or(|g| g.watch(activity));
        let until = if tickless {
            shared.counts.tickless.fetch_add(1, Ordering::Relaxed);
            now + (TICKLESS_SLEEP.as_nanos() as u64).max(tick)
        } else {
            state.next_run(now)
        };
        let wait = Duration::from_nanos(until.saturating_sub(state.now()));
        drop(state);
        std::thread::park_timeout(wait);
        if tickless && let Some(group) = &dom0 {
            group.unwatch();
            if group.activity() != seen_activity {
                shared.counts.woken_by_dom0.fetch_add(1, Ordering::Relaxed);
            }
        }
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    }
    shared.final_cpu_us.store(
        placement::thread_cpu_time().as_micros() as u64,
        Ordering::Release,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver's state on one pCPU, without threads: `guests` single-vCPU domains
    /// (capped at `cap`) and domain 0, every vCPU placed and runnable.
    fn one_pcpu(guests: usize, cap: u32) -> State {
        // Xen 3.4's tick accounting, a 1 ms tick, and no refill within the tests.
        let params = Params {
            tslice_ns: 1_000_000_000,
            tick_ns: 1_000_000,
            ratelimit_ns: 0,
            accounting: sched::Accounting::Tick,
            ..Params::default()
        };
        let mut sched = Scheduler::new(params, 1, 0).unwrap();
        let mut doms = Vec::new();
        let mut vcpus = Vec::new();
        let runners = std::iter::once((DOM0_NAME.to_string(), Runner::Dom0(ThreadGroup::new())))
            .chain((0..guests).map(|i| {
                let runner = Runner::Vcpu {
                    control: Arc::new(VcpuControl::new(1)),
                    index: 0,
                };
                (format!("g{i}"), runner)
            }));
        for (name, runner) in runners {
            let cap = if name == DOM0_NAME { 0 } else { cap };
            let id = sched.add_domain(256, cap).unwrap();
            let v = sched.add_vcpu(0, id).unwrap();
            let _ = sched.wake(0, v);
            vcpus.push(VcpuRef {
                runner,
                blocked: false,
                removed: false,
                applied: Some(Applied {
                    host_cpu: 0,
                    rank: RANK_QUEUED,
                    parked: false,
                    generation: 0,
                }),
            });
            doms.push(Dom {
                name,
                id,
                vcpus: vec![v],
            });
        }
        let _ = sched.schedule(0, PcpuId(0));
        State {
            sched,
            host_cpus: vec![0],
            doms,
            vcpus,
            epoch: Instant::now(),
            last_ns: 0,
            changes: Vec::new(),
            barrier_words: Vec::new(),
            laggards: Vec::new(),
        }
    }

    fn block(state: &mut State, v: usize) {
        let tickles = state.sched.block(0, VcpuId(v as u32));
        state.reschedule(0, tickles);
        state.vcpus[v].blocked = true;
    }

    /// Counts the allocations made on the calling thread (other tests' threads do
    /// not disturb a count).
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub struct Counting;

        thread_local! {
            static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
        }

        // SAFETY: every call is passed on to the system allocator unchanged; the
        // count is a const-initialised thread-local Cell, which never allocates.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                ALLOCATIONS.with(|a| a.set(a.get() + 1));
                // SAFETY: the caller's contract is System's.
                unsafe { System.alloc(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: `ptr` came from `alloc` above, that is from System.
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                ALLOCATIONS.with(|a| a.set(a.get() + 1));
                // SAFETY: as for dealloc; the caller's contract is System's.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        pub fn on_this_thread() -> u64 {
            ALLOCATIONS.with(Cell::get)
        }
    }

    #[global_allocator]
    static COUNTING: counting::Counting = counting::Counting;

    #[test]
    fn the_drivers_run_does_not_allocate_once_warm() {
        for (directed_yield, auto) in [(false, false), (true, false), (false, true)] {
            let mut state = one_pcpu(3, 0);
            let params = Params {
                directed_yield,
                ..state.sched.params()
            };
            state.sched.set_params(0, params).unwrap();
            // The auto slice decides every 100 ms: ten times in this run.
            state.sched.set_auto(0, auto);
            block(&mut state, 2);
            // Each vCPU is a thread that sleeps, as a halted vCPU does: the driver pins
            // it and sets its class like a real one.
            let (stop, sleep) = std::sync::mpsc::channel::<()>();
            let sleep = Arc::new(Mutex::new(sleep));
            let sleepers: Vec<_> = state
                .vcpus
                .iter()
                .filter_map(|r| match &r.runner {
                    Runner::Vcpu { control, index } => Some((control.clone(), *index)),
                    Runner::Dom0(_) => None,
                })
                .map(|(control, index)| {
                    let (sleep, (started, up)) = (sleep.clone(), std::sync::mpsc::channel());
                    let thread = std::thread::spawn(move || {
                        control.register(index, None);
                        let _ = started.send(());
                        let _ = sleep.lock().unwrap().recv();
                    });
                    up.recv().unwrap();
                    thread
                })
                .collect();
            let tick = params.tick_ns;
            // Warm-up: buffers grow to their size once.
            state.step(tick);
            let before = counting::on_this_thread();
            for i in 2..200 {
                let now = i * tick / 2;
                state.step(now);
                state.sched.note_wakes(3);
                let _ = state.nothing_to_decide();
                let _ = state.next_run(now);
            }
            let made = counting::on_this_thread() - before;
            drop(stop);
            for thread in sleepers {
                thread.join().unwrap();
            }
            assert_eq!(
                made, 0,
                "directed_yield {directed_yield}, auto {auto}: {made} allocations"
            );
        }
    }

    #[test]
    fn the_driver_runs_beside_the_node_only_where_a_cpu_is_spare_or_where_told() {
        let (node, host) = (&[0, 1][..], &[0, 1, 2, 3][..]);
        assert_eq!(DriverPlace::Auto.home(node, host).unwrap(), vec![2, 3]);
        assert_eq!(DriverPlace::Beside.home(node, host).unwrap(), vec![2, 3]);
        assert_eq!(DriverPlace::Node.home(node, host).unwrap(), vec![0, 1]);
        let full = &[0, 1][..];
        assert_eq!(DriverPlace::Auto.home(node, full).unwrap(), vec![0, 1]);
        assert_eq!(DriverPlace::Node.home(node, full).unwrap(), vec![0, 1]);
        let refused = DriverPlace::Beside
            .home(node, full)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("cannot run beside the node"), "{refused}");
    }

    #[test]
    fn one_vcpu_beside_a_sleeping_domain_0_leaves_nothing_to_decide() {
        let mut state = one_pcpu(1, 0);
        block(&mut state, 0);
        assert!(state.nothing_to_decide());
    }

    #[test]
    fn a_runnable_domain_0_beside_a_vcpu_is_a_decision() {
        let state = one_pcpu(1, 0);
        assert!(!state.nothing_to_decide());
    }

    #[test]
    fn two_runnable_vcpus_on_one_cpu_are_a_decision() {
        let mut state = one_pcpu(2, 0);
        block(&mut state, 0);
        assert!(!state.nothing_to_decide());
    }

    /// A halted guest vCPU wakes inside KVM, unseen: beside a running one, its wake
    /// would preempt with no driver to account for it.
    #[test]
    fn a_halted_guest_vcpu_beside_a_running_one_is_a_decision() {
        let mut state = one_pcpu(2, 0);
        block(&mut state, 0);
        block(&mut state, 2);
        assert!(!state.nothing_to_decide());
        // Once it has ended, the running one is alone.
        state.vcpus[2].removed = true;
        assert!(state.nothing_to_decide());
    }

    #[test]
    fn a_capped_domain_needs_ticks() {
        let mut state = one_pcpu(1, 50);
        block(&mut state, 0);
        assert!(!state.nothing_to_decide());
    }

    #[test]
    fn a_vcpu_not_placed_yet_needs_the_driver() {
        let mut state = one_pcpu(1, 0);
        block(&mut state, 0);
        state.vcpus[1].applied = None;
        assert!(!state.nothing_to_decide());
    }

    /// After a sleep, every deadline is replayed at its own time: the ticks a 1 ms
    /// driver would have run, not one collapsed tick.
    #[test]
    fn catching_up_replays_each_tick_it_slept_through() {
        let mut state = one_pcpu(1, 0);
        block(&mut state, 0);
        let tick = state.sched.params().tick_ns;
        let before = state.sched.vcpu_stats(VcpuId(1)).credit;
        state.catch_up(10 * tick + tick / 2);
        let after_replay = state.sched.vcpu_stats(VcpuId(1)).credit;

        let mut collapsed = one_pcpu(1, 0);
        block(&mut collapsed, 0);
        let tickles = collapsed.ticks(10 * tick + tick / 2);
        collapsed.reschedule(10 * tick + tick / 2, tickles);
        let after_one = collapsed.sched.vcpu_stats(VcpuId(1)).credit;
        assert!(
            before - after_replay > before - after_one,
            "replayed {before} -> {after_replay}, collapsed {before} -> {after_one}"
        );
    }

    /// Waits (up to 5 s) until the calling thread has a real-time policy, as the
    /// driver gives domain 0's members once it has placed them.
    fn placed_by_the_driver() -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            // SAFETY: sched_getscheduler(0) reads the calling thread's policy.
            let policy = unsafe { libc::sched_getscheduler(0) } & !libc::SCHED_RESET_ON_FORK;
            if policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Domain 0's threads share its CPU: while one of them computes without blocking
    /// (a migration's sender), another that wakes (the API, the switch) still runs.
    /// Under SCHED_FIFO the waking one waited for the busy one to block.
    #[test]
    fn domain_0s_threads_take_turns_on_its_cpu() {
        let host_cpu = placement::host_cpus() - 1;
        let group = ThreadGroup::new();
        let params = Params {
            tslice_ns: 30_000_000,
            tick_ns: 10_000_000,
            ..Params::default()
        };
        let dom0 = Dom0Spec {
            weight: 256,
            threads: group.clone(),
        };
        let driver = CreditDriver::start(
            params,
            vec![host_cpu],
            None,
            vec![],
            Some(dom0),
            DriverPlace::Auto,
        )
        .unwrap();
        let answered = Arc::new(AtomicBool::new(false));
        let busy = {
            let (group, answered) = (group.clone(), answered.clone());
            std::thread::spawn(move || {
                let _member = group.join_current();
                if !placed_by_the_driver() {
                    return None;
                }
                // Busy until the other member ran, or for 3 s.
                let until = Instant::now() + Duration::from_secs(3);
                while !answered.load(Ordering::SeqCst) && Instant::now() < until {
                    std::hint::spin_loop();
                }
                Some(answered.load(Ordering::SeqCst))
            })
        };
        let waking = {
            let (group, answered) = (group.clone(), answered.clone());
            std::thread::spawn(move || {
                let _member = group.join_current();
                if !placed_by_the_driver() {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
                answered.store(true, Ordering::SeqCst);
                true
            })
        };
        let placed = waking.join().unwrap();
        let answered_while_busy = busy.join().unwrap();
        drop(driver);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            // Real-time policies need root (or CAP_SYS_NICE): nothing to check.
            return;
        }
        assert!(placed, "the driver did not place domain 0's threads");
        assert_eq!(
            answered_while_busy,
            Some(true),
            "the waking thread ran only once the busy one stopped"
        );
    }
}
