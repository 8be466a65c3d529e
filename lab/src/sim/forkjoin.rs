//! A fork-join, task-parallel workload on one VM of a machine with a topology: S3's
//! question (`../shared/research/SEEDS.md`) of how the pCPUs behind a VM's vCPUs
//! decide how it scales. A simulation file with a `[forkjoin]` table (see
//! `examples/sim-s3.toml`) runs here instead of the MPI model.
//!
//! # The model
//! - The machine is `[topology]` ([`super::topology`]): a core runs
//!   `1 - module_contention` as fast while another core of its module is busy
//!   (running any vCPU; a spinning idle worker is busy too).
//! - The VM has `vcpus` vCPUs; the guest runs `threads` workers, worker w on vCPU w
//!   (the guest's placement of its threads is not modelled: a worker stays on its vCPU).
//!   The VM's other vCPUs stay halted.
//! - The work is Fibonacci as Tascell runs it: `fib(k)` at or above `cutoff` costs
//!   `spawn_ns`, leaves `fib(k-2)` on its worker's deque and goes on with `fib(k-1)`;
//!   below `cutoff` it is a sequential leaf of `2 fib(k+1) - 1` calls at `ns_per_call`
//!   each. A worker takes its own newest task; with none, it spends `steal_ns` on a
//!   steal attempt and takes the oldest task of the first worker after it that has
//!   one, or tries again. Joins cost nothing and never make a worker wait while work
//!   is left (a greedy scheduler), so the run ends when the last leaf ends.
//! - A `[[placement]]` gives the pCPUs the VM may use. `pin = true`: vCPU i on the
//!   i-th listed pCPU for good (as `xl vcpu-pin` 1:1; one vCPU per pCPU, so there is
//!   nothing left for the scheduler to decide). Otherwise `sched`'s credit scheduler
//!   places the vCPUs on those pCPUs (a pool of them), module-aware with
//!   `module_aware = true` ([`sched::Scheduler::set_modules`]).
//!
//! Times are simulated integer nanoseconds; no randomness, so a file gives the same
//! bytes every time. What it leaves out: caches and memory beyond the module's shared
//! front end and L2 (sockets only number the pCPUs), turbo frequencies, the guest's
//! own scheduler, and the guest's idle vCPUs waking for timers.

use std::collections::VecDeque;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::topology::{Topology, TopologyFile, parse_pcpus};
use kumo_vmm::ctl::SchedUpdate;
use kumo_vmm::spec::sched as sched_params;
use sched::{PcpuId, Scheduler, Tickles, VcpuId};

/// Largest `fib - cutoff`: about 2.7 million tasks, a few seconds of simulation.
const MAX_DEPTH: u32 = 30;
/// Largest `fib`: its call count still fits a u64 and a day of simulated time at 1 ns.
const MAX_FIB: u32 = 60;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkJoinFile {
    topology: TopologyFile,
    #[serde(default)]
    scheduler: SchedUpdate,
    forkjoin: WorkloadFile,
    #[serde(rename = "placement", default)]
    placements: Vec<PlacementFile>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// The VM's vCPUs.
    pub vcpus: u32,
    /// Worker counts to run, one run each per placement.
    pub threads: Vec<u32>,
    /// The Fibonacci number computed.
    pub fib: u32,
    /// Below this, a call is a sequential leaf.
    pub cutoff: u32,
    /// One call of the sequential recursion, on a core alone in its module.
    pub ns_per_call: f64,
    /// One spawn (a task put on the deque).
    pub spawn_ns: f64,
    /// One steal attempt (request and answer).
    pub steal_ns: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlacementFile {
    name: String,
    /// pCPU list, `0-7,16-23`.
    pcpus: String,
    #[serde(default)]
    pin: bool,
    #[serde(default)]
    module_aware: bool,
}

/// A validated fork-join simulation.
#[derive(Debug, Clone)]
pub struct ForkJoinSim {
    pub topology: Topology,
    pub params: sched::Params,
    pub workload: WorkloadFile,
    pub placements: Vec<Placement>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub name: String,
    /// Machine pCPUs, in the order vCPUs are pinned or the scheduler numbers them.
    pub pcpus: Vec<u32>,
    pub pin: bool,
    pub module_aware: bool,
}

/// True if a simulation file's text is a fork-join one (has `[forkjoin]`).
pub fn is_forkjoin(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("forkjoin"))
}

pub fn parse(text: &str) -> Result<ForkJoinSim> {
    let file: ForkJoinFile = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let message = e.message().trim().replace('\n', " ");
        match line {
            Some(line) => anyhow::anyhow!("line {line}: {message}"),
            None => anyhow::anyhow!("{message}"),
        }
    })?;
    let topology = Topology::new(file.topology)?;
    let params = sched_params::from_update(file.scheduler).context("[scheduler]")?;
    let w = file.forkjoin;
    if !(1..=sched::MAX_PCPUS).contains(&w.vcpus) {
        bail!(
            "[forkjoin]: vcpus {} is outside 1..={}",
            w.vcpus,
            sched::MAX_PCPUS
        );
    }
    if w.threads.is_empty() || w.threads.iter().any(|t| !(1..=w.vcpus).contains(t)) {
        bail!(
            "[forkjoin]: threads must list worker counts in 1..={} (the vCPUs)",
            w.vcpus
        );
    }
    if w.fib > MAX_FIB || w.cutoff < 2 || w.fib.saturating_sub(w.cutoff) > MAX_DEPTH {
        bail!(
            "[forkjoin]: fib {} and cutoff {}: need cutoff >= 2, fib <= {MAX_FIB} and \
             fib - cutoff <= {MAX_DEPTH}",
            w.fib,
            w.cutoff
        );
    }
    let positive = |v: f64| v.is_finite() && v > 0.0 && v <= 1e9;
    if !positive(w.ns_per_call)
        || !positive(w.steal_ns)
        || !(positive(w.spawn_ns) || w.spawn_ns == 0.0)
    {
        bail!("[forkjoin]: ns_per_call and steal_ns must be in (0, 1e9] ns, spawn_ns in [0, 1e9]");
    }
    if file.placements.is_empty() {
        bail!("no [[placement]]: nothing to run");
    }
    let mut placements: Vec<Placement> = Vec::new();
    for p in file.placements {
        let what = format!("placement '{}'", p.name);
        if p.name.is_empty() || p.name.chars().any(char::is_control) {
            bail!("a placement needs a printable name");
        }
        if placements.iter().any(|q| q.name == p.name) {
            bail!("{what} is given twice");
        }
        let pcpus = parse_pcpus(&p.pcpus, topology.pcpus()).context(what.clone())?;
        if p.pin && pcpus.len() != w.vcpus as usize {
            bail!(
                "{what}: pin = true needs one pCPU per vCPU ({}), not {}",
                w.vcpus,
                pcpus.len()
            );
        }
        if p.pin && p.module_aware {
            bail!("{what}: module_aware has no meaning for pinned vCPUs");
        }
        placements.push(Placement {
            name: p.name,
            pcpus,
            pin: p.pin,
            module_aware: p.module_aware,
        });
    }
    Ok(ForkJoinSim {
        topology,
        params,
        workload: w,
        placements,
    })
}

/// Calls of the naive recursion for `fib(k)`: 2 fib(k+1) - 1.
pub fn calls(k: u32) -> u64 {
    let (mut a, mut b) = (0u64, 1u64);
    for _ in 0..=k {
        (a, b) = (b, a + b);
    }
    2 * a - 1
}

/// One run: a placement at a worker count.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub placement: String,
    pub threads: u32,
    pub time_ms: f64,
    /// The sequential time (one core alone, no spawns or steals) over this run's.
    pub speedup: f64,
    /// Speedup per worker (1: ideal).
    pub efficiency: f64,
    /// Modules with two busy cores, averaged over the run's time.
    pub contended_modules: f64,
    pub contended_modules_max: u32,
    pub steals: u64,
    /// Times a worker's vCPU started on another pCPU than it last ran on.
    pub migrations: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ForkJoinReport {
    /// Always true: no real VM ran.
    pub simulated: bool,
    pub topology: TopologyView,
    pub workload: WorkloadFile,
    pub sequential_ms: f64,
    pub placements: Vec<Placement>,
    pub runs: Vec<Run>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopologyView {
    pub sockets: u32,
    pub cores_per_socket: u32,
    pub cores_per_module: u32,
    pub module_contention: f64,
}

/// Every placement at every worker count, placements outermost.
pub fn run(sim: &ForkJoinSim) -> Result<ForkJoinReport> {
    let mut runs = Vec::new();
    for placement in &sim.placements {
        for threads in &sim.workload.threads {
            runs.push(
                simulate(sim, placement, *threads).with_context(|| {
                    format!("placement '{}', {threads} threads", placement.name)
                })?,
            );
        }
    }
    let t = &sim.topology;
    Ok(ForkJoinReport {
        simulated: true,
        topology: TopologyView {
            sockets: t.sockets,
            cores_per_socket: t.cores_per_socket,
            cores_per_module: t.cores_per_module,
            module_contention: t.module_contention,
        },
        workload: sim.workload.clone(),
        sequential_ms: sequential_ns(&sim.workload) / 1e6,
        placements: sim.placements.clone(),
        runs,
    })
}

fn sequential_ns(w: &WorkloadFile) -> f64 {
    calls(w.fib) as f64 * w.ns_per_call
}

/// What a worker is doing: a spawn or leaf of `fib(k)`, or a steal attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Spawn(u32),
    Leaf(u32),
    Steal,
}

struct Worker {
    step: Step,
    /// Work left in the step, in ns of a core alone in its module.
    left: f64,
    deque: VecDeque<u32>,
    /// Pool index of the pCPU it last ran on.
    last_pcpu: Option<usize>,
}

/// Where each vCPU runs: pinned, or wherever the credit scheduler put it.
enum Host {
    Pinned,
    Credit(Box<Scheduler>),
}

impl Host {
    /// Fills `on[w]` with the pool index of the pCPU running worker w's vCPU, if any.
    fn running(&self, pool: usize, on: &mut [Option<usize>]) {
        match self {
            Host::Pinned => on.iter_mut().enumerate().for_each(|(i, o)| *o = Some(i)),
            Host::Credit(s) => {
                on.iter_mut().for_each(|o| *o = None);
                for p in 0..pool {
                    if let Some(v) = s.current(PcpuId(p as u32))
                        && (v.0 as usize) < on.len()
                    {
                        on[v.0 as usize] = Some(p);
                    }
                }
            }
        }
    }
}

fn settle(s: &mut Scheduler, now: u64, mut t: Tickles) {
    while let Some(p) = t.pop_first() {
        t.extend(s.schedule(now, p).tickles);
    }
}

/// One placement at one worker count.
pub fn simulate(sim: &ForkJoinSim, placement: &Placement, threads: u32) -> Result<Run> {
    let w = &sim.workload;
    let topo = &sim.topology;
    let pool = &placement.pcpus;
    let n = threads as usize;
    let step_work = |s: Step| match s {
        Step::Spawn(_) => w.spawn_ns,
        Step::Leaf(k) => calls(k) as f64 * w.ns_per_call,
        Step::Steal => w.steal_ns,
    };
    let task = |k: u32| {
        if k >= w.cutoff {
            Step::Spawn(k)
        } else {
            Step::Leaf(k)
        }
    };

    let mut host = if placement.pin {
        Host::Pinned
    } else {
        let mut s = Scheduler::new(sim.params, pool.len() as u32, 0)?;
        if placement.module_aware {
            s.set_modules(Some(topo.sched_modules(pool)))?;
        }
        let dom = s.add_domain(sched::DEFAULT_WEIGHT, 0)?;
        let vcpus: Vec<VcpuId> = (0..w.vcpus)
            .map(|_| s.add_vcpu(0, dom))
            .collect::<Result<_, _>>()?;
        for v in &vcpus[..n] {
            let t = s.wake(0, *v);
            settle(&mut s, 0, t);
        }
        Host::Credit(Box::new(s))
    };

    let mut workers: Vec<Worker> = (0..n)
        .map(|i| {
            let step = if i == 0 { task(w.fib) } else { Step::Steal };
            Worker {
                step,
                left: step_work(step),
                deque: VecDeque::new(),
                last_pcpu: None,
            }
        })
        .collect();
    // Tasks not yet finished (on deques or being run); the run ends at 0.
    let mut live: u64 = 1;
    let (mut steals, mut migrations) = (0u64, 0u64);
    let mut now: u64 = 0;
    let mut contended_ns: f64 = 0.0;
    let mut contended_max = 0u32;
    let mut on: Vec<Option<usize>> = vec![None; n];
    let mut busy = vec![false; topo.pcpus() as usize];
    let mut speed = vec![0.0f64; n];

    while live > 0 {
        host.running(pool.len(), &mut on);
        busy.iter_mut().for_each(|b| *b = false);
        match &host {
            Host::Pinned => on
                .iter()
                .flatten()
                .for_each(|p| busy[pool[*p] as usize] = true),
            Host::Credit(s) => (0..pool.len())
                .filter(|p| s.current(PcpuId(*p as u32)).is_some())
                .for_each(|p| busy[pool[p] as usize] = true),
        }
        for (i, wk) in workers.iter_mut().enumerate() {
            speed[i] = match on[i] {
                Some(p) => {
                    if wk.last_pcpu.is_some_and(|l| l != p) {
                        migrations += 1;
                    }
                    wk.last_pcpu = Some(p);
                    topo.speed(pool[p], |q| busy[q as usize])
                }
                None => 0.0,
            };
        }
        let contended = topo.contended(|q| busy[q as usize]);
        contended_max = contended_max.max(contended);

        // The next event: a step's end or a scheduler deadline.
        let mut next = u64::MAX;
        for (i, wk) in workers.iter().enumerate() {
            if speed[i] > 0.0 {
                let dt = (wk.left.max(0.0) / speed[i]).ceil().max(1.0);
                next = next.min(now.saturating_add(dt as u64));
            }
        }
        if let Host::Credit(s) = &host {
            for p in 0..pool.len() {
                next = next.min(s.next_deadline(PcpuId(p as u32)).max(now + 1));
            }
        }
        if next == u64::MAX {
            bail!("no worker can run and no scheduler event is due (stalled at {now} ns)");
        }
        let dt = next - now;
        now = next;
        contended_ns += contended as f64 * dt as f64;
        for (i, wk) in workers.iter_mut().enumerate() {
            wk.left -= speed[i] * dt as f64;
        }

        // Steps that ended, in worker order.
        for i in 0..n {
            if speed[i] == 0.0 || workers[i].left > 1e-6 {
                continue;
            }
            let next_step = match workers[i].step {
                Step::Spawn(k) => {
                    workers[i].deque.push_back(k - 2);
                    live += 1;
                    task(k - 1)
                }
                Step::Leaf(_) => {
                    live -= 1;
                    match workers[i].deque.pop_back() {
                        Some(k) => task(k),
                        None => Step::Steal,
                    }
                }
                Step::Steal => {
                    let victim = (1..n)
                        .map(|d| (i + d) % n)
                        .find(|v| !workers[*v].deque.is_empty());
                    match victim.and_then(|v| workers[v].deque.pop_front()) {
                        Some(k) => {
                            steals += 1;
                            task(k)
                        }
                        None => Step::Steal,
                    }
                }
            };
            workers[i].step = next_step;
            workers[i].left = step_work(next_step);
        }

        if let Host::Credit(s) = &mut host {
            for p in 0..pool.len() as u32 {
                if s.next_deadline(PcpuId(p)) <= now {
                    let t = s.tick(now, PcpuId(p));
                    settle(s, now, t);
                }
            }
        }
    }

    let time_ns = now as f64;
    let speedup = sequential_ns(w) / time_ns;
    Ok(Run {
        placement: placement.name.clone(),
        threads,
        time_ms: time_ns / 1e6,
        speedup,
        efficiency: speedup / threads as f64,
        contended_modules: contended_ns / time_ns,
        contended_modules_max: contended_max,
        steals,
        migrations,
    })
}

impl ForkJoinReport {
    /// One row per worker count: each placement's speedup and mean contended modules.
    pub fn text(&self) -> String {
        let mut out = format!(
            "SIMULATED (no real VM ran): fib({}) on a {}-vCPU VM, {} sockets x {} cores, \
             modules of {}, module_contention {}; sequential {:.1} ms\n\
             speedup over one core alone [mean contended modules]\n",
            self.workload.fib,
            self.workload.vcpus,
            self.topology.sockets,
            self.topology.cores_per_socket,
            self.topology.cores_per_module,
            self.topology.module_contention,
            self.sequential_ms
        );
        let width = self
            .placements
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0)
            .max(14);
        out.push_str(&format!("{:>7}", "threads"));
        for p in &self.placements {
            out.push_str(&format!("  {:>width$}", p.name));
        }
        out.push('\n');
        for t in &self.workload.threads {
            out.push_str(&format!("{t:>7}"));
            for p in &self.placements {
                let cell = self
                    .runs
                    .iter()
                    .find(|r| r.placement == p.name && r.threads == *t)
                    .map_or_else(
                        || "-".to_string(),
                        |r| format!("{:.2} [{:.1}]", r.speedup, r.contended_modules),
                    );
                out.push_str(&format!("  {cell:>width$}"));
            }
            out.push('\n');
        }
        out
    }

    pub fn run_of(&self, placement: &str, threads: u32) -> Option<&Run> {
        self.runs
            .iter()
            .find(|r| r.placement == placement && r.threads == threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SMALL: &str = r#"
[topology]
sockets = 2
cores_per_socket = 4
cores_per_module = 2
module_contention = 0.25

[forkjoin]
vcpus = 4
threads = [1, 2, 4]
fib = 24
cutoff = 14
ns_per_call = 2.0
spawn_ns = 100
steal_ns = 500

[[placement]]
name = "packed"
pcpus = "0-3"
pin = true

[[placement]]
name = "spread"
pcpus = "0,2,4,6"
pin = true

[[placement]]
name = "free"
pcpus = "0-7"

[[placement]]
name = "aware"
pcpus = "0-7"
module_aware = true
"#;

    /// Calls made inside the leaves of `fib(k)` cut at `cutoff`.
    fn tree_leaf_calls(k: u32, cutoff: u32) -> u64 {
        if k < cutoff {
            calls(k)
        } else {
            tree_leaf_calls(k - 1, cutoff) + tree_leaf_calls(k - 2, cutoff)
        }
    }

    #[test]
    fn calls_count_the_naive_recursion() {
        assert_eq!([calls(0), calls(1), calls(2), calls(3)], [1, 1, 3, 5]);
        assert_eq!(calls(20), 21_891);
    }

    #[test]
    fn one_worker_alone_takes_its_work_plus_spawns() {
        let sim = parse(SMALL).unwrap();
        let r = simulate(&sim, &sim.placements[1], 1).unwrap();
        // The leaves' calls plus one spawn per call at or above the cutoff: the
        // sequential count includes those calls at ns_per_call, the run at spawn_ns.
        let spawns = calls(24) - tree_leaf_calls(24, 14);
        let expect = tree_leaf_calls(24, 14) as f64 * 2.0 + spawns as f64 * 100.0;
        assert!((r.time_ms * 1e6 - expect).abs() <= 2.0, "{r:?} {expect}");
        assert_eq!((r.contended_modules, r.steals, r.migrations), (0.0, 0, 0));
    }

    #[test]
    fn a_contended_module_slows_its_cores_by_the_factor() {
        let sim = parse(SMALL).unwrap();
        let packed = simulate(&sim, &sim.placements[0], 2).unwrap();
        let spread = simulate(&sim, &sim.placements[1], 2).unwrap();
        assert_eq!(packed.contended_modules_max, 1);
        assert_eq!(spread.contended_modules_max, 0);
        let ratio = packed.time_ms / spread.time_ms;
        // Both cores busy all along (the idle one spins): exactly 1 / 0.75, give or
        // take the start and the tail.
        assert!((ratio - 1.0 / 0.75).abs() < 0.02, "{ratio}");
        assert!(packed.contended_modules > 0.95, "{packed:?}");
    }

    #[test]
    fn the_module_aware_scheduler_spreads_where_xens_pick_packs() {
        let sim = parse(SMALL).unwrap();
        let free = simulate(&sim, &sim.placements[2], 4).unwrap();
        let aware = simulate(&sim, &sim.placements[3], 4).unwrap();
        assert_eq!(free.contended_modules_max, 2);
        assert_eq!(aware.contended_modules_max, 0);
        assert!(aware.time_ms < free.time_ms, "{aware:?} {free:?}");
    }

    #[test]
    fn runs_are_deterministic_and_report_every_pair() {
        let sim = parse(SMALL).unwrap();
        let a = serde_json::to_string(&run(&sim).unwrap()).unwrap();
        let b = serde_json::to_string(&run(&sim).unwrap()).unwrap();
        assert_eq!(a, b);
        let r = run(&sim).unwrap();
        assert_eq!(r.runs.len(), 4 * 3);
        assert!(r.text().starts_with("SIMULATED"));
    }

    #[test]
    fn bad_files_are_refused_naming_the_key() {
        for (from, to, why) in [
            ("threads = [1, 2, 4]", "threads = [1, 5]", "threads"),
            ("cutoff = 14", "cutoff = 1", "cutoff"),
            ("steal_ns = 500", "steal_ns = 0", "steal_ns"),
            ("pcpus = \"0-3\"", "pcpus = \"0-2\"", "one pCPU per vCPU"),
            ("name = \"spread\"", "name = \"packed\"", "twice"),
            (
                "module_contention = 0.25",
                "module_contention = 1.5",
                "module_contention",
            ),
            ("vcpus = 4", "vcpus = 4\nvcpu = 3", "unknown field"),
        ] {
            let text = SMALL.replacen(from, to, 1);
            let err = format!("{:#}", parse(&text).unwrap_err());
            assert!(err.contains(why), "{to}: {err}");
        }
        assert!(is_forkjoin(SMALL));
        assert!(!is_forkjoin("[[node]]\nname = \"n\""));
    }
}
