//! S1 on real VMs (`../shared/research/SEEDS.md`): how the credit scheduler's slice,
//! tick, accounting and domain 0's weight change an MPI job whose ranks busy-wait,
//! with domain 0 (kumo's switch) carrying every message between VMs.
//!
//! The node is S1's: this host's first two CPUs (S1's nodes were dual-core), domain 0,
//! and two DomUs of one vCPU with two MPI ranks each, multiplexed by the guest's own
//! scheduler at its 250 Hz tick (`ranks_per_vcpu = 2`, as S1's Linux DomUs ran two
//! MPICH processes each): 4 ranks that busy-wait in `MPI_Wait` and hand the vCPU to
//! the other rank while they do ([`DEFAULT_WAIT`], `--wait`). Ranks of one DomU talk
//! through guest shared memory; messages between the DomUs go through domain 0. S1
//! ran two such nodes (8 ranks); this is one of them.
//!
//! Each scenario runs the same job under different credit parameters; speed-ups are
//! over the scenario family's baseline (Xen 3.4.2's 30/10 ms with tick accounting for
//! the paper's sweep, Xen 4's 30/10 ms with exact accounting and 1 ms ratelimit for
//! today's). Domain 0's cost per frame and per KiB is measured on the switch by two
//! ping-pong runs, and the simulator runs the same node with those costs, and each
//! benchmark's traffic as the real runs measured it, beside the real runs.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use npb::{Class, Kernel, Spec};
use serde::Serialize;

use super::plot;
use super::process::{Process, RunDir};
use super::{Progress, Summary, interleaved, node_problems, run_node_text, summary_cell};
use crate::experiment::ExperimentArgs;
use kumo_vmm::ctl::Accounting;
use kumo_vmm::node;
use kumo_vmm::spec::job::Wait;
use kumo_vmm::spec::node::BackendCost;
use kumo_vmm::stats;

/// DomUs of the node, each with one vCPU.
const DOMUS: usize = 2;
/// MPI ranks on each DomU's vCPU, and the guest's tick that multiplexes them.
pub const RANKS_PER_VCPU: u32 = 2;
pub const GUEST_HZ: u32 = 250;
/// How ranks wait unless `--wait` says: polling, handing the vCPU to the other rank
/// (as a Linux process in `sched_yield()`), so the DomU's vCPU stays busy, as S1's
/// waiting VMs did. Spinning until the guest's tick switches ranks cannot be S1's:
/// with Linux 2.6's 100 ms slice it makes CG 25 times slower and no slice setting
/// moves it (docs/results/2026-11-29-s1-guest-wait.md).
pub const DEFAULT_WAIT: Wait = Wait::Yield;

/// How ranks that wait `wait` are described in a table's heading.
pub fn wait_phrase(wait: Wait) -> &'static str {
    match wait {
        Wait::Spin => "spin-waiting",
        Wait::Yield => "yielding to each other while they wait",
        Wait::Block => "blocking while they wait",
    }
}

/// Ranks of the job.
const RANKS: usize = DOMUS * RANKS_PER_VCPU as usize;
/// Host CPUs of the node, as S1's dual-core nodes.
const NODE_CPUS: usize = 2;

/// Which domain 0 a scenario runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dom0 {
    /// kumo's own: the switch, 1-2 % of a CPU in S1's node.
    Kumo,
    /// "loaded domain 0": the switch with a modelled backend cost per TCP segment
    /// ([`LOADED_DOM0_COST`]) that puts it in S1's regime.
    Loaded,
}

/// `--dom0`: the scenario families a run covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dom0Families {
    Kumo,
    Loaded,
    Both,
}

impl Dom0 {
    /// Its name in rows and figures: the JSON's (`serde`'s), which a test holds them to.
    pub fn name(self) -> &'static str {
        match self {
            Dom0::Kumo => "kumo",
            Dom0::Loaded => "loaded",
        }
    }

    /// The backend its node files add to the switch (none for kumo's own).
    pub fn backend(self) -> Option<BackendCost> {
        match self {
            Dom0::Kumo => None,
            Dom0::Loaded => Some(LOADED_DOM0_COST),
        }
    }

    /// The name of its simulation file in the output directory.
    fn sim_file(self) -> &'static str {
        match self {
            Dom0::Kumo => "s1-sim.toml",
            Dom0::Loaded => "s1-sim-loaded.toml",
        }
    }
}

impl Dom0Families {
    pub fn only(dom0: Dom0) -> Dom0Families {
        match dom0 {
            Dom0::Kumo => Dom0Families::Kumo,
            Dom0::Loaded => Dom0Families::Loaded,
        }
    }

    pub fn covers(self, dom0: Dom0) -> bool {
        matches!(
            (self, dom0),
            (Dom0Families::Both, _)
                | (Dom0Families::Kumo, Dom0::Kumo)
                | (Dom0Families::Loaded, Dom0::Loaded)
        )
    }
}

/// The loaded domain 0's modelled backend CPU per TCP segment it forwards, in µs. A
/// model of S1's domain 0 cost, not a measurement of Xen: S1's Xen 3.4 domain 0 ran
/// netback, the bridge, the NIC's driver and TCP for every packet, and its cost went by
/// packets, which over S1's gigabit Ethernet (MTU 1500) carry [`S1_SEGMENT_BYTES`] of
/// data each. kumo's guest MPI sends frames of up to 9 KiB instead, so a cost per frame
/// would charge LU's 240-byte messages as much as six segments of SP's data; charged so
/// (300 µs a frame), LU.S gained +44 % at 1/1 where S1 saw little change.
///
/// The size: the same domain-0 CPU in all, on BT.S, CG.W and SP.S at 30/10, as the
/// 300 µs a frame that S1's weight-64 observation calibrated ("large slow-downs for
/// every benchmark but EP": the smallest of 50-1000 µs a frame that gave BT.S, CG.W and
/// SP.S at weight 64 at least 1.5x as slow as at 256 in every round here). Of the
/// sizes tried (60, 100, 150 µs), 100 is the one at which both put 4.5 s of domain-0
/// CPU into those three runs; per segment, BT's and SP's small
/// messages cost less and CG's large ones more (`examples/s1-dom0-load-sweep.py`,
/// `docs/results/2026-11-29-s1-dom0-per-segment.md`).
pub const LOADED_SEGMENT_COST_US: f64 = 100.0;
/// The data one TCP segment carries over a 1500-byte Ethernet MTU: 1500 less 20 bytes
/// of IP header, 20 of TCP and 12 of TCP timestamps.
pub const S1_SEGMENT_BYTES: f64 = 1448.0;
/// What the switch charges for that, in its terms (`[dom0] frame_cost_us` and
/// `kib_cost_us`): a segment's cost for each frame, and one for every 1448 bytes it
/// carries (a linear stand-in for the number of segments).
pub const LOADED_DOM0_COST: BackendCost = BackendCost {
    frame_us: LOADED_SEGMENT_COST_US,
    kib_us: LOADED_SEGMENT_COST_US * 1024.0 / S1_SEGMENT_BYTES,
};
// A node file refuses costs above its limit: checked when this compiles.
const _: () = assert!(
    LOADED_DOM0_COST.frame_us <= kumo_vmm::spec::node::MAX_BACKEND_COST_US
        && LOADED_DOM0_COST.kib_us <= kumo_vmm::spec::node::MAX_BACKEND_COST_US
);

/// The lines of a node file's `[dom0]` that set `cost`.
pub fn dom0_cost_toml(cost: BackendCost) -> String {
    format!(
        "frame_cost_us = {}\nkib_cost_us = {:.3}\n",
        cost.frame_us, cost.kib_us
    )
}

/// One setting of the credit scheduler.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    /// kumo's own domain 0, or one loaded to S1's regime.
    pub dom0: Dom0,
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    pub accounting: Accounting,
    pub dom0_weight: u32,
    /// The scenario speed-ups are over (itself for a baseline).
    pub baseline: &'static str,
    /// Run with `--quick` too.
    #[serde(skip)]
    quick: bool,
    /// The scheduler picks its slice (`tslice_ms = "auto"`, issue 31): the slice and
    /// tick above are its long setting.
    pub auto_slice: bool,
}

const XEN4: &str = "xen4-30/10";
pub const XEN34: &str = "xen3.4-30/10";
pub const XEN34_TUNED: &str = "xen3.4-1/1-dom0-1024";
/// The loaded family's names: kumo's with this prefix.
const LOADED_PREFIX: &str = "loaded-";
const LOADED_XEN34: &str = "loaded-xen3.4-30/10";

const fn xen34(
    name: &'static str,
    (tslice_ms, tick_ms): (f64, f64),
    dom0_weight: u32,
    quick: bool,
) -> Scenario {
    Scenario {
        name,
        tslice_ms,
        tick_ms,
        ratelimit_us: 0,
        accounting: Accounting::Tick,
        dom0_weight,
        baseline: XEN34,
        quick,
        dom0: Dom0::Kumo,
        auto_slice: false,
    }
}

/// The same Xen 3.4.2 setting with a loaded domain 0 (its baseline the loaded
/// family's 30/10).
const fn loaded(
    name: &'static str,
    slice_tick: (f64, f64),
    dom0_weight: u32,
    quick: bool,
) -> Scenario {
    Scenario {
        baseline: LOADED_XEN34,
        dom0: Dom0::Loaded,
        ..xen34(name, slice_tick, dom0_weight, quick)
    }
}

const fn xen4(name: &'static str, (tslice_ms, tick_ms, ratelimit_us): (f64, f64, u64)) -> Scenario {
    Scenario {
        name,
        tslice_ms,
        tick_ms,
        ratelimit_us,
        accounting: Accounting::Exact,
        dom0_weight: 256,
        baseline: XEN4,
        quick: false,
        dom0: Dom0::Kumo,
        auto_slice: false,
    }
}

impl Scenario {
    /// Its slice in a node file: milliseconds, or "auto".
    fn slice_toml(&self) -> String {
        if self.auto_slice {
            "\"auto\"".into()
        } else {
            self.tslice_ms.to_string()
        }
    }

    /// Its slice and tick in the table.
    fn slice_tick(&self) -> String {
        if self.auto_slice {
            format!("auto ({}/{} ms)", self.tslice_ms, self.tick_ms)
        } else {
            format!("{}/{} ms", self.tslice_ms, self.tick_ms)
        }
    }
}

/// `scenario` with the auto slice, its long setting the scenario's slice and tick.
/// Not one of S1's settings: the scheduler answering S1's question itself.
const fn auto_slice(scenario: Scenario) -> Scenario {
    Scenario {
        auto_slice: true,
        ..scenario
    }
}

/// S1's sweep on Xen 3.4.2 (tick accounting, no ratelimit): slice/tick 60/10, 30/15,
/// 30/10, 10/5, 10/2 and 1/1 ms with domain 0 at 256; domain 0 at 64, 128, 512 and
/// 1024 at 30/10; and S1's tuned setting, 1/1 with domain 0 at 1024. Then today's
/// defaults (Xen 4) and 1/1 under them.
pub const SCENARIOS: &[Scenario] = &[
    xen34(XEN34, (30.0, 10.0), 256, true),
    xen34("xen3.4-60/10", (60.0, 10.0), 256, false),
    xen34("xen3.4-30/15", (30.0, 15.0), 256, false),
    xen34("xen3.4-10/5", (10.0, 5.0), 256, false),
    xen34("xen3.4-10/2", (10.0, 2.0), 256, false),
    xen34("xen3.4-1/1", (1.0, 1.0), 256, true),
    xen34(XEN34_TUNED, (1.0, 1.0), 1024, true),
    xen34("xen3.4-30/10-dom0-64", (30.0, 10.0), 64, false),
    xen34("xen3.4-30/10-dom0-128", (30.0, 10.0), 128, false),
    xen34("xen3.4-30/10-dom0-512", (30.0, 10.0), 512, false),
    xen34("xen3.4-30/10-dom0-1024", (30.0, 10.0), 1024, false),
    // Not S1's: the scheduler picks 30/10 or 1/1 itself (`tslice_ms = "auto"`).
    auto_slice(xen34("xen3.4-auto", (30.0, 10.0), 256, false)),
    xen4(XEN4, (30.0, 10.0, 1000)),
    // A slice not above the ratelimit turns it off, as `xl sched-credit` must.
    xen4("xen4-1/1", (1.0, 1.0, 0)),
    // S1's sweep again with a loaded domain 0. `--quick`: the baseline, 1/1 and 1/1
    // at 1024 (domain 0 at 64, the observation the load is calibrated by, would take
    // `--quick` past 5 minutes: a third of its runs' time).
    loaded(LOADED_XEN34, (30.0, 10.0), 256, true),
    loaded("loaded-xen3.4-60/10", (60.0, 10.0), 256, false),
    loaded("loaded-xen3.4-30/15", (30.0, 15.0), 256, false),
    loaded("loaded-xen3.4-10/5", (10.0, 5.0), 256, false),
    loaded("loaded-xen3.4-10/2", (10.0, 2.0), 256, false),
    loaded("loaded-xen3.4-1/1", (1.0, 1.0), 256, true),
    loaded("loaded-xen3.4-1/1-dom0-1024", (1.0, 1.0), 1024, true),
    loaded("loaded-xen3.4-30/10-dom0-64", (30.0, 10.0), 64, false),
    loaded("loaded-xen3.4-30/10-dom0-128", (30.0, 10.0), 128, false),
    loaded("loaded-xen3.4-30/10-dom0-512", (30.0, 10.0), 512, false),
    loaded("loaded-xen3.4-30/10-dom0-1024", (30.0, 10.0), 1024, false),
    auto_slice(loaded("loaded-xen3.4-auto", (30.0, 10.0), 256, false)),
];

/// S1's published speed-up (percent over 30/10 ms, domain 0 at 256) of `kernel` under
/// `scenario`, where it gives a number: BT +28.9, CG +45.3, SP +33.4 and EP none at
/// 1/1 ms; CG +51 and SP +35 at 1/1 with domain 0 at 1024. (LU: "little change", and
/// domain 0 at 64 or 128: "large slow-downs", without numbers.) The loaded family's
/// scenarios stand beside the same numbers.
pub fn paper_pct(scenario: &str, kernel: Kernel) -> Option<f64> {
    match (scenario.trim_start_matches(LOADED_PREFIX), kernel) {
        (XEN34, _) => Some(0.0),
        ("xen3.4-1/1", Kernel::Bt) => Some(28.9),
        ("xen3.4-1/1", Kernel::Cg) => Some(45.3),
        ("xen3.4-1/1", Kernel::Sp) => Some(33.4),
        ("xen3.4-1/1", Kernel::Ep) => Some(0.0),
        (XEN34_TUNED, Kernel::Cg) => Some(51.0),
        (XEN34_TUNED, Kernel::Sp) => Some(35.0),
        _ => None,
    }
}

/// The scenarios a run covers, of the families `dom0` names (kumo's first).
pub fn scenarios(quick: bool, dom0: Dom0Families) -> Vec<Scenario> {
    SCENARIOS
        .iter()
        .filter(|s| (s.quick || !quick) && dom0.covers(s.dom0))
        .copied()
        .collect()
}

/// S1's seven benchmarks (NPB-MPI BT, CG, EP, FT, LU, MG and SP), class A. `--quick`
/// takes class W, but BT, LU and SP at S (their time in this shape is their message
/// count times the guest's tick: S has a third to a sixth of W's steps) and EP at A
/// (its seconds of compute make the end's wait for a descheduled rank the small part
/// it was in S1).
pub fn benchmarks(quick: bool) -> Vec<Spec> {
    let class = |kernel| match (quick, kernel) {
        (false, _) | (true, Kernel::Ep) => Class::A,
        (true, Kernel::Bt | Kernel::Lu | Kernel::Sp) => Class::S,
        (true, _) => Class::W,
    };
    [
        Kernel::Bt,
        Kernel::Cg,
        Kernel::Ep,
        Kernel::Ft,
        Kernel::Lu,
        Kernel::Mg,
        Kernel::Sp,
    ]
    .into_iter()
    .map(|kernel| Spec {
        kernel,
        class: class(kernel),
    })
    .collect()
}

/// `--bench`'s benchmarks (None: each family's own), each an NPB-MPI form.
pub fn chosen_benchmarks(items: &[String]) -> Result<Option<Vec<Spec>>> {
    if items.is_empty() {
        return Ok(None);
    }
    let mut specs = Vec::new();
    for item in items {
        let spec: Spec = item
            .parse()
            .map_err(|e| anyhow::anyhow!("--bench {item}: {e}"))?;
        if !benchmarks(false).iter().any(|s| s.kernel == spec.kernel) {
            bail!("--bench {item}: S1 runs only BT, CG, EP, FT, LU, MG and SP");
        }
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    Ok(Some(specs))
}

/// The benchmarks a family runs: all of [`benchmarks`], but with `--quick` the loaded
/// family runs only those S1 gives numbers for (BT, CG, SP), to keep `--quick` within
/// 5 minutes: its runs take longer (domain 0 is busy), and EP, which sends a few dozen
/// frames, loads domain 0 no more than kumo's family does (0.01 s of CPU a run).
pub fn family_benchmarks(dom0: Dom0, quick: bool) -> Vec<Spec> {
    benchmarks(quick)
        .into_iter()
        .filter(|s| {
            dom0 == Dom0::Kumo || !quick || matches!(s.kernel, Kernel::Bt | Kernel::Cg | Kernel::Sp)
        })
        .collect()
}

/// The node's CPUs: the host's first two (one on a single-CPU host).
fn node_cpus() -> Vec<usize> {
    let host = hv::placement::host_cpus();
    (0..host.min(NODE_CPUS)).collect()
}

fn cpus_toml(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
    format!("pcpus = [{}]\n", list.join(", "))
}

/// `count` MPI domains of one vCPU with `ranks_per_vcpu` ranks on it.
fn domains_toml(count: usize, ranks_per_vcpu: u32) -> String {
    (0..count)
        .map(|i| {
            let mut domain = format!("[[domain]]\nname = \"u{i}\"\nmpi = true\n");
            if ranks_per_vcpu > 1 {
                domain.push_str(&format!(
                    "ranks_per_vcpu = {ranks_per_vcpu}\nguest_hz = {GUEST_HZ}\n"
                ));
            }
            domain
        })
        .collect()
}

/// The node file of one real run: S1's node, its ranks waiting as `wait` says.
pub fn node_toml(scenario: &Scenario, spec: Spec, cpus: &[usize], wait: Wait) -> String {
    rank_node_toml(scenario, spec, cpus, (DOMUS, RANKS_PER_VCPU, wait), "")
}

/// S1's two nodes: the host's first four CPUs, two a node (None on a smaller host).
pub fn two_node_cpus(host_cpus: usize) -> Option<[Vec<usize>; 2]> {
    (host_cpus >= 2 * NODE_CPUS).then(|| {
        [
            (0..NODE_CPUS).collect(),
            (NODE_CPUS..2 * NODE_CPUS).collect(),
        ]
    })
}

/// The node files of S1's two-node shape: ranks 0-3 on the first node, which listens
/// on `wire` (`unix:PATH`, or `tcp:HOST:PORT` where two hosts run them), and 4-7 on
/// the second, which connects to it.
pub fn two_node_tomls(
    scenario: &Scenario,
    spec: Spec,
    cpus: &[Vec<usize>; 2],
    wire: &str,
    wait: Wait,
) -> [String; 2] {
    let size = 2 * RANKS;
    let shape = (DOMUS, RANKS_PER_VCPU, wait);
    [
        rank_node_toml(
            scenario,
            spec,
            &cpus[0],
            shape,
            &format!("job_size = {size}\nwire = \"listen:{wire}\"\n"),
        ),
        rank_node_toml(
            scenario,
            spec,
            &cpus[1],
            shape,
            &format!("job_size = {size}\nfirst_rank = {RANKS}\nwire = \"{wire}\"\n"),
        ),
    ]
}

/// A node of `domains` single-vCPU rank VMs of `spec`, `ranks_per_vcpu` ranks each
/// waiting as `wait` says, under `scenario`'s credit parameters, with
/// `network_extra` lines in its `[network]` (a wire to ranks outside the node).
pub fn rank_node_toml(
    scenario: &Scenario,
    spec: Spec,
    cpus: &[usize],
    (domains, ranks_per_vcpu, wait): (usize, u32, Wait),
    network_extra: &str,
) -> String {
    let load = scenario
        .dom0
        .backend()
        .map_or(String::new(), dom0_cost_toml);
    format!(
        "{}[scheduler]\nkind = \"credit\"\ntslice_ms = {}\ntick_ms = {}\nratelimit_us = {}\n\
         accounting = \"{}\"\n[dom0]\nweight = {}\n{load}[network]\nnpb = \"{spec}\"\n\
         wait = \"{}\"\n{network_extra}{}",
        cpus_toml(cpus),
        scenario.slice_toml(),
        scenario.tick_ms,
        scenario.ratelimit_us,
        scenario.accounting.name(),
        scenario.dom0_weight,
        wait.name(),
        domains_toml(domains, ranks_per_vcpu),
    )
}

/// What one real run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RealRun {
    /// 1: S1's node; 2: S1's two nodes joined by a wire (the first node's measures).
    pub nodes: u32,
    pub scenario: String,
    pub dom0: Dom0,
    pub benchmark: String,
    pub round: u32,
    /// The job's time as rank 0 reports it (None: no result).
    pub time_s: Option<f64>,
    pub verified: bool,
    /// Host CPU time of each DomU, and the time each rank spent inside blocking MPI
    /// calls (S1's MPI_Wait time: spinning, or descheduled while waiting).
    pub domain_cpu_s: Vec<f64>,
    pub rank_wait_s: Vec<f64>,
    pub dom0_cpu_s: f64,
    /// kumo's own CPU: the credit driver (it runs on the node's CPUs at every tick)
    /// and the VMs' set-up.
    pub vmm_cpu_s: f64,
    pub frames: u64,
    pub bytes: u64,
    pub wall_s: f64,
    pub problems: Vec<String>,
}

fn field(fields: &std::collections::BTreeMap<String, String>, key: &str) -> Option<f64> {
    fields.get(key).and_then(|v| v.parse::<f64>().ok())
}

fn real_run(
    scenario: &Scenario,
    spec: Spec,
    round: u32,
    (cpus, wait): (&[usize], Wait),
    kvm_device: &Path,
    epoch: Instant,
) -> Result<RealRun> {
    let outcome = run_node_text(&node_toml(scenario, spec, cpus, wait), kvm_device, epoch)
        .with_context(|| format!("scenario {} {spec}", scenario.name))?;
    Ok(measured(1, scenario, spec, round, &outcome))
}

/// S1's two nodes: the first node runs in this process, the second as a child
/// `kumo node`, joined by a wire; the run is the first node's (rank 0's) measures,
/// and a problem if the second did not end well.
fn real_run_two_nodes(
    scenario: &Scenario,
    spec: Spec,
    round: u32,
    (cpus, wait): (&[Vec<usize>; 2], Wait),
    kvm_device: &Path,
    epoch: Instant,
) -> Result<RealRun> {
    let dir = RunDir::new()?;
    let wire = format!("unix:{}", dir.0.join("wire.sock").display());
    let [first, second] = two_node_tomls(scenario, spec, cpus, &wire, wait);
    let second_file = dir.0.join("second-node.toml");
    std::fs::write(&second_file, second)
        .with_context(|| format!("writing {}", second_file.display()))?;
    let mut other = Process::start(
        "the second node",
        &dir.0,
        &[
            "node".into(),
            "--config".into(),
            second_file.display().to_string(),
            "--kvm-device".into(),
            kvm_device.display().to_string(),
        ],
    )?;
    let outcome = run_node_text(&first, kvm_device, epoch)
        .with_context(|| format!("scenario {} {spec} on two nodes", scenario.name))?;
    let mut run = measured(2, scenario, spec, round, &outcome);
    if let Some(problem) = other.finish(&AtomicBool::new(true), SECOND_NODE_PATIENCE) {
        run.verified = false;
        run.problems.push(problem);
    }
    Ok(run)
}

/// How long the second node may take to end after the first.
const SECOND_NODE_PATIENCE: Duration = Duration::from_secs(30);

fn measured(
    nodes: u32,
    scenario: &Scenario,
    spec: Spec,
    round: u32,
    outcome: &node::NodeOutcome,
) -> RealRun {
    let result = outcome.first_result().cloned();
    let waits = |r: &node::DomainReport| -> Vec<f64> {
        r.measurements
            .iter()
            .filter(|(kind, _)| kind == "mpistats")
            .filter_map(|(_, f)| field(f, "wait_us"))
            .map(|us| us / 1e6)
            .collect()
    };
    let switch = outcome.switch.unwrap_or_default();
    RealRun {
        nodes,
        scenario: scenario.name.to_string(),
        dom0: scenario.dom0,
        benchmark: spec.to_string(),
        round,
        time_s: result.as_ref().map(|r| r.time_s),
        verified: result.as_ref().is_some_and(|r| r.verified),
        domain_cpu_s: outcome
            .reports
            .iter()
            .map(|r| r.cpu.as_secs_f64())
            .collect(),
        rank_wait_s: outcome.reports.iter().flat_map(waits).collect(),
        dom0_cpu_s: outcome.overhead.dom0.as_secs_f64(),
        vmm_cpu_s: outcome.overhead.vmm.as_secs_f64(),
        frames: switch.received,
        bytes: switch.received_bytes,
        wall_s: outcome.wall.as_secs_f64(),
        problems: node_problems(outcome),
    }
}

/// Domain 0's CPU per frame and per KiB through the switch, fitted to two ping-pong
/// runs (small and large messages) of two VMs on the node's CPUs; and the credit
/// driver's cost, from a third under 1/1 ms.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub per_frame_us: f64,
    pub per_kib_us: f64,
    pub points: Vec<CalibrationPoint>,
    pub driver: DriverCost,
}

/// What the credit driver costs the node's CPUs, measured on the small-message
/// ping-pong under S1's 1/1 ms (Xen 3.4's tick accounting): the driver ran `runs`
/// times for `cpu_us` of its own CPU in `wall_s`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DriverCost {
    pub runs: u64,
    pub cpu_us: u64,
    pub wall_s: f64,
    /// It ran on the node's CPUs (the host has no CPU to spare), preempting a vCPU at
    /// each run; beside them it costs the node nothing.
    pub on_node_cpus: bool,
    /// The simulator's `tick_us` this gives (`DriverCost::tick_us_for`).
    pub tick_us: f64,
}

impl DriverCost {
    fn measured(stats: hv::credit::DriverStats, wall: Duration, pcpus: usize) -> DriverCost {
        let mut cost = DriverCost {
            runs: stats.runs,
            cpu_us: stats.cpu_us,
            wall_s: wall.as_secs_f64(),
            on_node_cpus: stats.on_node_cpus,
            tick_us: 0.0,
        };
        cost.tick_us = cost.tick_us_for(pcpus);
        cost
    }

    /// The model's cost per tick of a busy pCPU: what a run takes from the vCPU it
    /// preempts (the driver's own CPU and two vCPU switches, `switch_us` each), times
    /// the runs per pCPU tick (one run can serve both pCPUs' ticks; domain 0's
    /// wake-ups add runs): the runs' whole cost spread over the ticks. 0 when the
    /// driver has a CPU of its own.
    fn tick_us_for(&self, pcpus: usize) -> f64 {
        let ticks = self.wall_s * 1e3 / CALIBRATION_TICK_MS * pcpus as f64;
        if !self.on_node_cpus || ticks <= 0.0 {
            return 0.0;
        }
        (self.cpu_us as f64 + 2.0 * SWITCH_US * self.runs as f64) / ticks
    }
}

/// The vCPU switch the simulator charges (`kumo bench switch --mechanism fifo`'s
/// median on this host).
const SWITCH_US: f64 = 29.0;
/// The slice and tick of the driver's calibration run: S1's 1/1 ms.
const CALIBRATION_TICK_MS: f64 = 1.0;

#[derive(Debug, Clone, Serialize)]
pub struct CalibrationPoint {
    pub message_bytes: u64,
    pub frames: u64,
    pub kib: f64,
    pub dom0_cpu_s: f64,
}

/// Sizes of the two calibration runs: one frame of almost nothing, and messages of
/// many full jumbo frames.
const CALIBRATION_SIZES: [(u64, &str); 2] = [(8, "8"), (65536, "65536")];

/// One calibration run: two single-rank VMs ping-ponging `bytes`-byte messages on the
/// node's CPUs under `scheduler` (its `[scheduler]` keys); any problem fails it.
fn calibration_run(
    cpus: &[usize],
    scheduler: &str,
    bytes: &str,
    what: &str,
    (kvm_device, epoch): (&Path, Instant),
) -> Result<node::NodeOutcome> {
    let toml = format!(
        "{}[scheduler]\n{scheduler}[network]\nnet = \"pingpong:{bytes}\"\nwait = \"spin\"\n{}",
        cpus_toml(cpus),
        domains_toml(2, 1),
    );
    let outcome = run_node_text(&toml, kvm_device, epoch).context(what.to_string())?;
    if let Some(problem) = outcome
        .reports
        .iter()
        .flat_map(|r| &r.verdict.problems)
        .next()
    {
        bail!("{what}: {problem}");
    }
    Ok(outcome)
}

fn calibrate(cpus: &[usize], kvm_device: &Path, epoch: Instant) -> Result<Calibration> {
    let mut points = Vec::new();
    for (bytes, text) in CALIBRATION_SIZES {
        let outcome = calibration_run(
            cpus,
            "kind = \"host\"\n",
            text,
            &format!("calibration ping-pong of {text} bytes"),
            (kvm_device, epoch),
        )?;
        let switch = outcome.switch.unwrap_or_default();
        points.push(CalibrationPoint {
            message_bytes: bytes,
            frames: switch.received,
            kib: switch.received_bytes as f64 / 1024.0,
            dom0_cpu_s: outcome.overhead.dom0.as_secs_f64(),
        });
    }
    let (per_frame_us, per_kib_us) = fit(&points);
    // The driver under S1's 1/1 ms, on the small messages' ping-pong.
    let outcome = calibration_run(
        cpus,
        &format!(
            "kind = \"credit\"\ntslice_ms = {CALIBRATION_TICK_MS}\ntick_ms = {CALIBRATION_TICK_MS}\n\
             ratelimit_us = 0\naccounting = \"tick\"\n"
        ),
        "8",
        "calibration of the credit driver (ping-pong at 1/1 ms)",
        (kvm_device, epoch),
    )?;
    let driver = DriverCost::measured(
        outcome.overhead.driver.unwrap_or_default(),
        outcome.wall,
        cpus.len(),
    );
    Ok(Calibration {
        per_frame_us,
        per_kib_us,
        points,
        driver,
    })
}

/// Solves `cpu = a * frames + b * kib` through the small-message point (first) and
/// the large-message one, neither cost negative. Domain 0's cost is mostly its
/// wake-ups, and a stream of large frames is forwarded in batches with fewer of them,
/// so the large point can cost less per frame than the small one: then `a` comes from
/// the small point alone (the one that looks like CG's traffic) and `b` is 0.
pub fn fit(points: &[CalibrationPoint]) -> (f64, f64) {
    let us = |p: &CalibrationPoint| p.dom0_cpu_s * 1e6;
    let Some(small) = points.first().filter(|p| p.frames > 0) else {
        return (0.0, 0.0);
    };
    if let [p, q] = points {
        let (f1, k1, f2, k2) = (p.frames as f64, p.kib, q.frames as f64, q.kib);
        let det = f1 * k2 - f2 * k1;
        if det.abs() > f64::EPSILON {
            let a = (us(p) * k2 - us(q) * k1) / det;
            let b = (f1 * us(q) - f2 * us(p)) / det;
            if a >= 0.0 && b >= 0.0 {
                return (a, b);
            }
        }
    }
    (us(small) / small.frames as f64, 0.0)
}

/// A benchmark's serial time in kumo's guest, for the simulator's compute phases:
/// one thread in a VM of one vCPU alone on the node's first CPU, the timed section as
/// the guest reports it (as the real runs time only that: CG's set-up, `makea`, is a
/// third of CG.W's CPU). The guest, not the host: EP.A takes 8 % longer in it than
/// the same code on a host thread (7.09 s against 6.55 s, 2026-11-29).
fn guest_serial_seconds(
    spec: Spec,
    cpu: usize,
    (kvm_device, epoch): (&Path, Instant),
) -> Result<f64> {
    let toml = format!(
        "{}[scheduler]\nkind = \"host\"\n[[domain]]\nname = \"serial\"\nnpb = \"{spec}\"\n",
        cpus_toml(&[cpu]),
    );
    let what = format!("{spec} on one vCPU, for the simulator");
    let outcome = run_node_text(&toml, kvm_device, epoch).context(what.clone())?;
    if let Some(problem) = node_problems(&outcome).first() {
        bail!("{what}: {problem}");
    }
    outcome
        .first_result()
        .filter(|r| r.verified)
        .map(|r| r.time_s)
        .with_context(|| format!("{what}: no verified result"))
}

/// What a benchmark sent between the DomUs in one run (domain 0's frames and bytes),
/// the median over its baseline runs: the simulator's message count and size.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Traffic {
    pub frames: f64,
    pub bytes: f64,
    /// Ring exchanges a time step in the simulation, where fitted to the real
    /// baseline's time (else derived from `frames`).
    pub exchanges_per_step: Option<u64>,
    /// CG: guest CPU a rank spends a step beyond its share of the serial compute, in
    /// µs, fitted to the real baseline's time (the guest's cost of a step's messages
    /// through shared memory, which the model's switch and tick costs do not cover).
    pub guest_us_per_step: Option<u64>,
}

/// What the simulation of one benchmark was built from.
#[derive(Debug, Clone, Serialize)]
pub struct SimInput {
    pub benchmark: String,
    /// Serial time of the timed section in a one-vCPU VM: the median of one run a
    /// round.
    pub serial_s: f64,
    pub traffic: Traffic,
    /// The real baseline's median time the exchanges were fitted to.
    pub fitted_to_s: Option<f64>,
}

/// Most ring exchanges a time step the fit tries.
const MAX_EXCHANGES: u64 = 256;
/// Most guest CPU a CG step the fit tries, in µs.
const MAX_GUEST_US_PER_STEP: u64 = 4000;

/// Time steps of a benchmark's main loop, each a compute phase and its messages in
/// the simulation (CG: 25 inner iterations and a normalisation per outer one).
fn steps(spec: Spec) -> u64 {
    let steps = match spec.kernel {
        Kernel::Bt => npb::bt::params(spec.class).1,
        Kernel::Sp => npb::sp::params(spec.class).1,
        Kernel::Lu => npb::lu::params(spec.class).1,
        Kernel::Cg => npb::cg::params(spec.class).niter * 26,
        // FT: 6 iterations and MG: 4 at classes S to A (NPB's parameters).
        Kernel::Ft => 6,
        Kernel::Mg => 4,
        _ => 1,
    };
    steps as u64
}

/// The guest MPI's first retransmission timeout (`guests/user/src/mpi.rs`,
/// `RTO_MIN_MS`).
const GUEST_MPI_RETRANSMIT_MS: u64 = 10;

/// Measured guest costs (`docs/guests-multirank.md`): a tick that does not switch
/// (ring-0 work, emulated on this host), and a switch between ranks.
const GUEST_TICK_US: f64 = 56.0;
const GUEST_SWITCH_US: f64 = 94.0;

/// The simulation file of the same node: two domains of one vCPU with two ranks each
/// and the guest's tick on the node's CPUs, domain 0 with one vCPU, its costs from
/// the calibration and `backend`'s (the loaded family's) on top, and each benchmark
/// as the phases its MPI form runs: CG its messages rank by rank
/// ([`cg_rank_phases`]); EP its share, then three reductions; the others per time
/// step their compute, then ring exchanges (in this numbering half of a ring's
/// messages cross between the DomUs) as many and as large as `traffic` says the real
/// runs sent.
pub fn sim_toml(
    (cpus, wait): (usize, Wait),
    calibration: &Calibration,
    backend: Option<BackendCost>,
    compute: &[(Spec, f64, Traffic)],
    scenarios: &[Scenario],
) -> String {
    // Domain 0 is charged per message, not per frame, although kumo's switch handles
    // frames: its cost is per wake-up, and a wake-up forwards a batch. The calibration
    // measured 23.9 us a frame with 8-byte messages and 6.5 us with 64 KiB ones, and
    // real FT.W's baseline spent 4.7 us a frame: charged per frame at the calibrated
    // cost, FT.W's simulated baseline took 0.225 s against a real 0.104 s (2026-11-28).
    // In the model domain 0 works on both sides of a message: half the cost per side.
    let mut text = format!(
        "duration_s = 3600\n[scheduler]\ntslice_ms = 30\ntick_ms = 10\nratelimit_us = 1000\n\
         [costs]\nswitch_us = {SWITCH_US}\nwake_us = 46\ntick_us = {:.1}\nsend_us = 5\n\
         guest_tick_us = {GUEST_TICK_US}\nguest_switch_us = {GUEST_SWITCH_US}\n\
         yield_spin_us = {}\n\
         dom0_per_message_us = {:.3}\ndom0_per_kib_us = {:.3}\nnetwork_latency_us = 0\n\
         network_mb_s = 100000\n",
        calibration.driver.tick_us,
        kumo_vmm::guest::SHARED_SPIN_US,
        calibration.per_frame_us / 2.0,
        calibration.per_kib_us / 2.0,
    );
    // The loaded family's modelled backend, per frame as the switch charges it, with
    // the guest MPI's retransmission timer (a late acknowledgement costs frames).
    if let Some(cost) = backend {
        text.push_str(&format!(
            "dom0_per_frame_us = {}\ndom0_per_frame_kib_us = {}\nretransmit_after_ms = {}\n",
            cost.frame_us, cost.kib_us, GUEST_MPI_RETRANSMIT_MS
        ));
    }
    text.push_str(&format!(
        "[[node]]\nname = \"node\"\npcpus = {cpus}\ndom0_vcpus = 1\n"
    ));
    for i in 0..DOMUS {
        text.push_str(&format!(
            "[[node.domain]]\nname = \"u{i}\"\nranks_per_vcpu = {RANKS_PER_VCPU}\n\
             guest_hz = {GUEST_HZ}\n"
        ));
    }
    for &(spec, serial_s, traffic) in compute {
        let per_rank_ms = serial_s * 1e3 / RANKS as f64;
        let steps = steps(spec);
        let step_ms = per_rank_ms / steps as f64;
        let phases = match spec.kernel {
            Kernel::Cg => {
                let guest_ms = traffic.guest_us_per_step.unwrap_or(0) as f64 / 1e3;
                cg_rank_phases(spec, step_ms, guest_ms)
            }
            Kernel::Ep => format!(
                "phases = [\"compute:{per_rank_ms:.3}\", \"allreduce:8\", \"allreduce:8\", \
                 \"allreduce:80\"]\n"
            ),
            _ => {
                // Two of a ring's four messages cross between the DomUs.
                let exchanges = traffic.exchanges_per_step.unwrap_or_else(|| {
                    ((traffic.frames / steps as f64 / 2.0).round() as u64).clamp(1, MAX_EXCHANGES)
                });
                let messages = (2 * steps * exchanges) as f64;
                let bytes = (traffic.bytes / messages).round().max(8.0) as u64;
                let mut list = format!("\"compute:{step_ms:.4}\"");
                for _ in 0..exchanges {
                    list.push_str(&format!(", \"exchange:ring:{bytes}\""));
                }
                format!("phases = [{list}]\n")
            }
        };
        text.push_str(&format!(
            "[[program]]\nname = \"{spec}\"\niterations = {steps}\nwait = \"{}\"\n{phases}",
            wait.name()
        ));
    }
    for s in scenarios {
        text.push_str(&format!(
            "[[scenario]]\nname = \"{}\"\ntslice_ms = {}\ntick_ms = {}\nratelimit_us = {}\n\
             accounting = \"{}\"\ndom0_weight = {}\nauto_slice = {}\n",
            s.name,
            s.tslice_ms,
            s.tick_ms,
            s.ratelimit_us,
            s.accounting.name(),
            s.dom0_weight,
            s.auto_slice,
        ));
    }
    text
}

/// CG's phases rank by rank, as its MPI form runs them (`npb::mpi::cg::Traffic`):
/// each iteration the product (nine tenths of a step's compute) with its row sums and
/// transpose, a dot product's sums, the vector updates, and another dot product. On
/// S1's node the row sums stay in a DomU (shared memory) and only ranks 1 and 2 trade
/// transposes through domain 0.
fn cg_rank_phases(spec: Spec, step_ms: f64, guest_ms: f64) -> String {
    let n = npb::cg::params(spec.class).na;
    let exchange =
        |partner: usize, bytes: usize| format!(", \"send:{partner}:{bytes}\", \"recv:{partner}\"");
    let mut out = String::new();
    for me in 0..RANKS {
        let traffic = npb::mpi::cg::Traffic::of(n, me, RANKS);
        let dot: String = traffic
            .dot_partners()
            .iter()
            .map(|&p| exchange(p, 8))
            .collect();
        let mut list = format!("\"compute:{:.4}\"", step_ms * 0.9 + guest_ms);
        for x in traffic.product() {
            list.push_str(&exchange(x.partner, x.bytes));
        }
        list.push_str(&format!("{dot}, \"compute:{:.4}\"{dot}", step_ms * 0.1));
        out.push_str(&format!(
            "[[program.rank]]\nranks = [{me}]\nphases = [{list}]\n"
        ));
    }
    out
}

/// Each benchmark's traffic: the median over its baseline's runs (the first
/// scenario's, if its baseline did not run).
pub fn traffic(runs: &[RealRun], spec: Spec, baseline: &str) -> Traffic {
    let bench = spec.to_string();
    let of = |scenario: &str| -> Vec<&RealRun> {
        runs.iter()
            .filter(|r| r.benchmark == bench && r.scenario == scenario && r.verified)
            .collect()
    };
    let mut mine = of(baseline);
    if mine.is_empty() {
        mine = runs
            .iter()
            .filter(|r| r.benchmark == bench && r.verified)
            .collect();
    }
    Traffic {
        frames: stats::median_of(mine.iter().map(|r| r.frames as f64)).unwrap_or(0.0),
        bytes: stats::median_of(mine.iter().map(|r| r.bytes as f64)).unwrap_or(0.0),
        exchanges_per_step: None,
        guest_us_per_step: None,
    }
}

/// The simulated time of `spec` alone under `scenario`, on a node of `node.0` pCPUs
/// whose ranks wait as `node.1` says.
fn simulated_s(
    node: (usize, Wait),
    calibration: &Calibration,
    program: (Spec, f64, Traffic),
    scenario: &Scenario,
) -> Result<Option<f64>> {
    let text = sim_toml(
        node,
        calibration,
        scenario.dom0.backend(),
        &[program],
        std::slice::from_ref(scenario),
    );
    let report = crate::sim::run(&crate::sim::config::parse(&text)?)?;
    Ok(report.runs.first().and_then(|r| r.time_s))
}

/// The benchmark's one free parameter, fitted so that its simulated time under
/// `baseline` is nearest `target_s`, the real baseline's median: for the ring
/// benchmarks the ring exchanges a time step (1 to [`MAX_EXCHANGES`]: the model cannot
/// count from the traffic how many of a step's messages a rank waits for, as messages
/// between ranks of one DomU use shared memory, which domain 0 never sees); for CG,
/// whose messages are its MPI form's, the guest's CPU a step (0 to
/// [`MAX_GUEST_US_PER_STEP`]). None for EP (its compute is all there is). The simulated
/// time grows with either (in small steps, where guest ticks fall), so it is a
/// bisection.
fn fit_to_baseline(
    node: (usize, Wait),
    calibration: &Calibration,
    (spec, serial_s, traffic): (Spec, f64, Traffic),
    baseline: &Scenario,
    target_s: f64,
) -> Result<Traffic> {
    let with = |k: u64| match spec.kernel {
        Kernel::Cg => Traffic {
            guest_us_per_step: Some(k),
            ..traffic
        },
        _ => Traffic {
            exchanges_per_step: Some(k),
            ..traffic
        },
    };
    let (mut low, mut high) = match spec.kernel {
        Kernel::Ep => return Ok(traffic),
        Kernel::Cg => (0, MAX_GUEST_US_PER_STEP),
        _ => (1, MAX_EXCHANGES),
    };
    let first = low;
    let time = |k: u64| -> Result<f64> {
        Ok(
            simulated_s(node, calibration, (spec, serial_s, with(k)), baseline)?
                .unwrap_or(f64::MAX),
        )
    };
    while low < high {
        let mid = (low + high) / 2;
        if time(mid)? < target_s {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    // `low` is the first at or above the target; its predecessor may be nearer.
    if low > first && (time(low - 1)? - target_s).abs() < (time(low)? - target_s).abs() {
        low -= 1;
    }
    Ok(with(low))
}

/// One row of the table: a scenario and a benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// 1: S1's node; 2: S1's two nodes.
    pub nodes: u32,
    pub scenario: Scenario,
    pub benchmark: String,
    pub time_s: Option<Summary>,
    /// Percent faster than the baseline's median (50 = the baseline takes 1.5x as long).
    pub speedup_pct: Option<f64>,
    pub paper_pct: Option<f64>,
    pub sim_time_s: Option<f64>,
    pub sim_speedup_pct: Option<f64>,
    /// Medians over the runs, summed over ranks.
    pub wait_s: Option<f64>,
    pub domain_cpu_s: Option<f64>,
    pub dom0_cpu_s: Option<f64>,
    pub vmm_cpu_s: Option<f64>,
    pub verified: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub experiment: &'static str,
    pub quick: bool,
    pub runs_per_scenario: u32,
    pub node_cpus: Vec<usize>,
    pub domus: usize,
    pub ranks_per_vcpu: u32,
    pub guest_hz: u32,
    /// How the ranks wait for a message (`--wait`).
    pub wait: Wait,
    pub ranks: usize,
    /// Whether S1's two-node shape ran, and where (or why not).
    pub two_nodes: String,
    /// The scenario families that ran (`--dom0`), kumo's first.
    pub dom0_families: Vec<Dom0>,
    /// The loaded family's modelled domain 0 cost (None: it did not run).
    pub loaded_dom0_cost: Option<BackendCost>,
    pub calibration: Calibration,
    pub sim_inputs: Vec<SimInput>,
    pub rows: Vec<Row>,
    pub real_runs: Vec<RealRun>,
    pub ok: bool,
}

pub(super) fn speedup_pct(base: Option<f64>, time: Option<f64>) -> Option<f64> {
    match (base, time) {
        (Some(b), Some(t)) if t > 0.0 => Some((b / t - 1.0) * 100.0),
        _ => None,
    }
}

/// The table's rows from every real run and the simulation (of the one-node shape),
/// for each shape in `shapes` (1 or 2 nodes).
pub fn rows(
    scenarios: &[Scenario],
    specs: &[Spec],
    shapes: &[u32],
    runs: &[RealRun],
    sim: &[(String, String, Option<f64>)],
) -> Vec<Row> {
    let mut out = Vec::new();
    for &nodes in shapes {
        let runs_of = |scenario: &str, bench: &str| -> Vec<&RealRun> {
            runs.iter()
                .filter(|r| r.nodes == nodes && r.scenario == scenario && r.benchmark == bench)
                .collect()
        };
        let time_of = |scenario: &str, bench: &str| {
            let times: Vec<f64> = runs_of(scenario, bench)
                .iter()
                .filter_map(|r| r.time_s)
                .collect();
            Summary::of(&times)
        };
        let sim_of = |scenario: &str, bench: &str| {
            sim.iter()
                .filter(|_| nodes == 1)
                .find(|(s, b, _)| s == scenario && b == bench)
                .and_then(|(_, _, t)| *t)
        };
        for spec in specs {
            let bench = spec.to_string();
            for s in scenarios {
                let mine = runs_of(s.name, &bench);
                let time = time_of(s.name, &bench);
                let base = time_of(s.baseline, &bench).map(|b| b.median);
                out.push(Row {
                    nodes,
                    scenario: *s,
                    benchmark: bench.clone(),
                    time_s: time,
                    speedup_pct: speedup_pct(base, time.map(|t| t.median)),
                    paper_pct: paper_pct(s.name, spec.kernel),
                    sim_time_s: sim_of(s.name, &bench),
                    sim_speedup_pct: speedup_pct(
                        sim_of(s.baseline, &bench),
                        sim_of(s.name, &bench),
                    ),
                    wait_s: stats::median_of(mine.iter().map(|r| r.rank_wait_s.iter().sum())),
                    domain_cpu_s: stats::median_of(
                        mine.iter().map(|r| r.domain_cpu_s.iter().sum()),
                    ),
                    dom0_cpu_s: stats::median_of(mine.iter().map(|r| r.dom0_cpu_s)),
                    vmm_cpu_s: stats::median_of(mine.iter().map(|r| r.vmm_cpu_s)),
                    verified: !mine.is_empty() && mine.iter().all(|r| r.verified),
                });
            }
        }
    }
    out
}

pub fn run(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    let cpus = node_cpus();
    let wait = args.wait.unwrap_or(DEFAULT_WAIT);
    let families: Vec<Dom0> = [Dom0::Kumo, Dom0::Loaded]
        .into_iter()
        .filter(|&d| args.dom0.unwrap_or(Dom0Families::Both).covers(d))
        .collect();
    let chosen = chosen_benchmarks(&args.bench)?;
    // Each family: its scenarios and its benchmarks.
    let family_plan: Vec<(Vec<Scenario>, Vec<Spec>)> = families
        .iter()
        .map(|&d| {
            (
                scenarios(args.quick, Dom0Families::only(d)),
                chosen
                    .clone()
                    .unwrap_or_else(|| family_benchmarks(d, args.quick)),
            )
        })
        .collect();
    let two_nodes = two_node_cpus(hv::placement::host_cpus());
    let shapes: Vec<u32> = if two_nodes.is_some() {
        vec![1, 2]
    } else {
        vec![1]
    };
    // Every (shape, scenario, benchmark) once a round, families one after another.
    let items: Vec<(u32, Scenario, Spec)> = shapes
        .iter()
        .flat_map(|&nodes| {
            family_plan.iter().flat_map(move |(scenarios, specs)| {
                scenarios
                    .iter()
                    .flat_map(move |&s| specs.iter().map(move |&spec| (nodes, s, spec)))
            })
        })
        .collect();
    let plan: Vec<(u32, usize)> = interleaved(items.len(), args.runs);
    // The simulator's input for each benchmark comes from the first family that runs
    // it (its baseline's traffic and time); every family is then simulated with it.
    let mut sim_plan: Vec<(Spec, &Scenario)> = Vec::new();
    for (scenarios, specs) in &family_plan {
        for &spec in specs {
            if !sim_plan.iter().any(|&(s, _)| s == spec) {
                sim_plan.push((spec, &scenarios[0]));
            }
        }
    }
    // Calibration (3 runs), the plan with each round's serial times, the fits and
    // the simulations.
    let progress = Progress::new(plan.len() + 3 + sim_plan.len() * (args.runs as usize + 1) + 1);

    progress.step("calibrating domain 0 on the switch, and the credit driver");
    let calibration = calibrate(&cpus, &args.kvm_device, epoch)?;
    for _ in 0..3 {
        progress.done_one();
    }

    let mut real_runs = Vec::new();
    // Each benchmark's serial time in a VM, once a round: the host's speed state
    // changes within a run, so the simulator's compute is taken in the same rounds as
    // the times it is set beside.
    let mut serial_s: Vec<Vec<f64>> = vec![Vec::new(); sim_plan.len()];
    let mut serial_round = None;
    for (round, item) in plan {
        if hv::stop::requested().is_some() {
            break;
        }
        if serial_round != Some(round) {
            serial_round = Some(round);
            for (&(spec, _), times) in sim_plan.iter().zip(&mut serial_s) {
                progress.step(&format!(
                    "round {} of {}: serial {spec} in a VM, for the simulator",
                    round + 1,
                    args.runs
                ));
                times.push(guest_serial_seconds(
                    spec,
                    cpus[0],
                    (&args.kvm_device, epoch),
                )?);
                progress.done_one();
            }
        }
        let (nodes, scenario, spec) = &items[item];
        let (nodes, spec) = (*nodes, *spec);
        progress.step(&format!(
            "run {} of {}: {} {spec}{}",
            round + 1,
            args.runs,
            scenario.name,
            if nodes == 2 { " on two nodes" } else { "" }
        ));
        let run = match &two_nodes {
            Some(pair) if nodes == 2 => {
                real_run_two_nodes(scenario, spec, round, (pair, wait), &args.kvm_device, epoch)?
            }
            _ => real_run(
                scenario,
                spec,
                round,
                (&cpus, wait),
                &args.kvm_device,
                epoch,
            )?,
        };
        real_runs.push(run);
        progress.done_one();
    }

    let mut compute = Vec::new();
    let mut sim_inputs = Vec::new();
    for (&(spec, baseline), serial) in sim_plan.iter().zip(&serial_s) {
        progress.step(&format!("fitting {spec}'s simulation to its baseline"));
        let mut traffic = traffic(&real_runs, spec, baseline.baseline);
        let serial_s = stats::median_of(serial.iter().copied()).unwrap_or(0.0);
        let bench = spec.to_string();
        let target_s = stats::median_of(
            real_runs
                .iter()
                .filter(|r| r.nodes == 1 && r.scenario == baseline.name && r.benchmark == bench)
                .filter_map(|r| r.time_s),
        )
        .filter(|_| spec.kernel != Kernel::Ep);
        if let Some(target_s) = target_s {
            traffic = fit_to_baseline(
                (cpus.len(), wait),
                &calibration,
                (spec, serial_s, traffic),
                baseline,
                target_s,
            )?;
        }
        compute.push((spec, serial_s, traffic));
        sim_inputs.push(SimInput {
            benchmark: bench,
            serial_s,
            traffic,
            fitted_to_s: target_s,
        });
        progress.done_one();
    }
    // One simulation per family: its scenarios, its benchmarks, its domain 0.
    let mut sim_files = Vec::new();
    let mut sim_times: Vec<(String, String, Option<f64>)> = Vec::new();
    progress.step("simulating the same node");
    for (&family, (scenarios, specs)) in families.iter().zip(&family_plan) {
        let programs: Vec<(Spec, f64, Traffic)> = compute
            .iter()
            .filter(|(spec, ..)| specs.contains(spec))
            .copied()
            .collect();
        let text = sim_toml(
            (cpus.len(), wait),
            &calibration,
            family.backend(),
            &programs,
            scenarios,
        );
        let sim = crate::sim::config::parse(&text).context("the experiment's simulation")?;
        let sim_report = crate::sim::run(&sim)?;
        sim_times.extend(
            sim_report
                .runs
                .iter()
                .map(|r| (r.scenario.clone(), r.program.clone(), r.time_s)),
        );
        sim_files.push((family.sim_file(), text));
    }
    progress.done_one();
    progress.finish();

    let rows: Vec<Row> = family_plan
        .iter()
        .flat_map(|(scenarios, specs)| rows(scenarios, specs, &shapes, &real_runs, &sim_times))
        .collect();
    let complete = real_runs.len() == items.len() * args.runs as usize;
    let ok = complete && rows.iter().all(|r| r.verified);
    let report = Report {
        experiment: "s1",
        quick: args.quick,
        runs_per_scenario: args.runs,
        node_cpus: cpus,
        domus: DOMUS,
        ranks_per_vcpu: RANKS_PER_VCPU,
        guest_hz: GUEST_HZ,
        wait,
        ranks: RANKS,
        two_nodes: match &two_nodes {
            Some(pair) => format!("ran on host CPUs {:?} and {:?}", pair[0], pair[1]),
            None => format!(
                "not run: S1's two nodes need {} host CPUs, this host has {}",
                2 * NODE_CPUS,
                hv::placement::host_cpus()
            ),
        },
        loaded_dom0_cost: families.contains(&Dom0::Loaded).then_some(LOADED_DOM0_COST),
        dom0_families: families,
        calibration,
        sim_inputs,
        rows,
        real_runs,
        ok,
    };
    let problems: Vec<String> = report
        .real_runs
        .iter()
        .filter(|r| !r.verified)
        .map(|run| {
            format!(
                "{} {} (run {}) did not verify: {}",
                run.scenario,
                run.benchmark,
                run.round + 1,
                run.problems.join("; ")
            )
        })
        .collect();
    super::conclude(
        args,
        &report,
        text,
        |r| {
            let svg = speedups(
                "S1: speed-up over each family's 30/10 ms baseline (log scale)",
                &r.rows,
            )?;
            let mut files = vec![("s1-speedup.svg", svg)];
            files.extend(sim_files);
            Ok(files)
        },
        &problems,
        ok,
    )
}

pub(super) fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |p| format!("{p:+.1} %"))
}

pub(super) fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.3}"))
}

/// The table beside S1's figures.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "S1 on real VMs: {} DomUs x 1 vCPU x {} ranks (guest tick {} Hz) {} on \
         host CPUs {:?}, domain 0 = kumo's switch; {} run(s) per scenario, medians [min-max]\n\
         domain 0 measured on the switch: {:.2} us per frame + {:.2} us per KiB\n\n",
        report.domus,
        report.ranks_per_vcpu,
        report.guest_hz,
        wait_phrase(report.wait),
        report.node_cpus,
        report.runs_per_scenario,
        report.calibration.per_frame_us,
        report.calibration.per_kib_us,
    );
    if let Some(cost) = report.loaded_dom0_cost {
        out.push_str(&format!(
            "loaded domain 0 (scenarios loaded-*): the switch plus a modelled backend of {} us \
             a frame and {:.1} us a KiB, {} us for each TCP segment S1's MTU of 1500 would \
             carry (S1's domain 0 load modelled, not Xen measured; sized by S1's weight-64 \
             slow-downs)\n",
            cost.frame_us, cost.kib_us, LOADED_SEGMENT_COST_US
        ));
    }
    out.push_str(&format!(
        "two nodes (2 x 4 ranks, a wire between them): {}\n",
        report.two_nodes
    ));
    let fitted: Vec<String> = report
        .sim_inputs
        .iter()
        .filter(|i| i.fitted_to_s.is_some())
        .filter_map(|i| {
            let t = i.traffic;
            match (t.exchanges_per_step, t.guest_us_per_step) {
                (_, Some(us)) => Some(format!("{} {us} us", i.benchmark)),
                (Some(k), None) => Some(format!("{} {k}", i.benchmark)),
                (None, None) => None,
            }
        })
        .collect();
    out.push_str(&format!(
        "simulator: EP as it runs, CG's messages as its MPI form sends them; fitted to the \
         real baseline: ring exchanges a step, or CG's guest CPU a step: {}\n\n",
        if fitted.is_empty() {
            "none".to_string()
        } else {
            fitted.join(", ")
        }
    ));
    let mut table = vec![
        [
            "nodes",
            "benchmark",
            "dom0",
            "scenario",
            "slice/tick",
            "rl",
            "acct",
            "dom0 w",
            "time (s)",
            "speed-up",
            "S1 paper",
            "sim (s)",
            "sim speed-up",
            "MPI wait (s)",
            "dom0 cpu (s)",
            "kumo cpu (s)",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &report.rows {
        let s = &r.scenario;
        table.push(vec![
            r.nodes.to_string(),
            r.benchmark.clone(),
            s.dom0.name().to_string(),
            s.name.to_string(),
            s.slice_tick(),
            format!("{} us", s.ratelimit_us),
            s.accounting.name().to_string(),
            s.dom0_weight.to_string(),
            summary_cell(r.time_s),
            pct(r.speedup_pct),
            pct(r.paper_pct),
            secs(r.sim_time_s),
            pct(r.sim_speedup_pct),
            secs(r.wait_s),
            secs(r.dom0_cpu_s),
            secs(r.vmm_cpu_s),
        ]);
    }
    out.push_str(&kumo_vmm::output::table(&table, 8));
    out.push_str(
        "\nspeed-up: over the scenario family's 30/10 ms baseline (xen3.4-* over xen3.4-30/10, \
         xen4-* over xen4-30/10, loaded-* over loaded-xen3.4-30/10). dom0: kumo's own, or \
         loaded to S1's regime (each family simulated with its own). S1 paper: Xen 3.4.2, 2 nodes x 4 processes, class A; LU \
         \"little change\", domain 0 at 64 and 128 \"large slow-downs\" (no numbers). MPI wait: \
         the ranks' time in blocking MPI calls, summed. kumo cpu: the credit driver (on the \
         node's CPUs) and set-up.\n",
    );
    out
}

// S1's figure.
/// The series of the speed-up figure: what, and how to read it from a row.
type Series = (&'static str, fn(&Row) -> Option<f64>);

const SERIES: &[Series] = &[
    ("kumo, real VMs", |r| r.speedup_pct),
    ("kumo sim", |r| r.sim_speedup_pct),
    ("S1 paper (Xen 3.4.2)", |r| r.paper_pct),
];

/// Speed-up factor (baseline time / time) from a percentage.
fn factor(pct: f64) -> f64 {
    1.0 + pct / 100.0
}

/// S1's figure: one group per (benchmark, scenario) that is not a baseline, one bar per
/// series, heights as speed-up factors (1 = as fast as the baseline; bars go down for
/// slow-downs).
pub fn speedups(title: &str, rows: &[Row]) -> Result<String> {
    let groups: Vec<&Row> = rows
        .iter()
        .filter(|r| r.scenario.name != r.scenario.baseline)
        .collect();
    let labels: Vec<String> = groups
        .iter()
        .map(|r| {
            format!(
                "{}{}{} {}",
                if r.nodes == 2 { "2 nodes " } else { "" },
                match r.scenario.dom0 {
                    Dom0::Kumo => "",
                    Dom0::Loaded => "loaded dom0 ",
                },
                r.benchmark,
                r.scenario
                    .name
                    .trim_start_matches(LOADED_PREFIX)
                    .trim_start_matches("xen")
            )
        })
        .collect();
    let series: Vec<plot::BarSeries> = SERIES
        .iter()
        .map(|&(name, get)| plot::BarSeries {
            name: name.to_string(),
            values: groups.iter().map(|r| get(r).map(factor)).collect(),
        })
        .collect();
    plot::bars(title, "speed-up (baseline time / time)", &labels, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        text.parse().unwrap()
    }

    #[test]
    fn quick_keeps_both_baselines_and_the_papers_settings() {
        let quick: Vec<&str> = scenarios(true, Dom0Families::Both)
            .iter()
            .map(|s| s.name)
            .collect();
        for needed in [
            XEN34,
            "xen3.4-1/1",
            "xen3.4-1/1-dom0-1024",
            LOADED_XEN34,
            "loaded-xen3.4-1/1",
            "loaded-xen3.4-1/1-dom0-1024",
        ] {
            assert!(quick.contains(&needed), "{needed} missing from {quick:?}");
        }
        assert!(scenarios(false, Dom0Families::Both).len() > quick.len());
        // Every baseline a scenario names runs whenever the scenario does, in its
        // own family.
        for q in [true, false] {
            for families in [Dom0Families::Kumo, Dom0Families::Loaded, Dom0Families::Both] {
                let all = scenarios(q, families);
                assert!(!all.is_empty());
                for s in &all {
                    assert!(families.covers(s.dom0), "{}", s.name);
                    let base = all.iter().find(|b| b.name == s.baseline);
                    assert_eq!(base.map(|b| b.dom0), Some(s.dom0), "{}", s.name);
                }
            }
        }
    }

    #[test]
    fn the_loaded_family_is_s1s_sweep_after_kumos_own() {
        let all = scenarios(false, Dom0Families::Both);
        let first_loaded = all.iter().position(|s| s.dom0 == Dom0::Loaded).unwrap();
        assert_eq!(all[0].name, XEN34, "kumo's family stays first");
        assert!(all[first_loaded..].iter().all(|s| s.dom0 == Dom0::Loaded));
        let loaded = scenarios(false, Dom0Families::Loaded);
        assert_eq!(loaded[0].name, LOADED_XEN34);
        for s in &loaded {
            assert!(s.name.starts_with("loaded-xen3.4-"), "{}", s.name);
            assert_eq!(s.accounting, Accounting::Tick);
        }
        let sweep: Vec<(f64, f64)> = loaded
            .iter()
            .filter(|s| s.dom0_weight == 256)
            .map(|s| (s.tslice_ms, s.tick_ms))
            .collect();
        for needed in [
            (60.0, 10.0),
            (30.0, 15.0),
            (30.0, 10.0),
            (10.0, 5.0),
            (10.0, 2.0),
        ] {
            assert!(sweep.contains(&needed), "{needed:?}");
        }
        for weight in [64, 128, 512, 1024] {
            assert!(
                loaded
                    .iter()
                    .any(|s| s.dom0_weight == weight && s.tslice_ms == 30.0),
                "{weight}"
            );
        }
        assert!(
            loaded
                .iter()
                .any(|s| (s.tslice_ms, s.dom0_weight) == (1.0, 1024))
        );
        // The paper's numbers stand beside the loaded family's rows too.
        assert_eq!(paper_pct("loaded-xen3.4-1/1", Kernel::Cg), Some(45.3));
        assert_eq!(
            paper_pct("loaded-xen3.4-1/1-dom0-1024", Kernel::Sp),
            Some(35.0)
        );
        // With --quick it runs S1's numbered benchmarks, kumo's family all seven.
        let kernels = |d| -> Vec<Kernel> {
            family_benchmarks(d, true)
                .iter()
                .map(|s| s.kernel)
                .collect()
        };
        assert_eq!(kernels(Dom0::Loaded), [Kernel::Bt, Kernel::Cg, Kernel::Sp]);
        assert_eq!(kernels(Dom0::Kumo).len(), 7);
        assert_eq!(family_benchmarks(Dom0::Loaded, false), benchmarks(false));
    }

    #[test]
    fn the_loaded_familys_node_file_costs_every_segment_and_kumos_does_not() {
        let base = |dom0| *SCENARIOS.iter().find(|s| s.dom0 == dom0).unwrap();
        let loaded = node_toml(&base(Dom0::Loaded), spec("cg.W"), &[0, 1], Wait::Spin);
        assert!(
            loaded.contains(&format!(
                "[dom0]\nweight = 256\n{}[network]\n",
                dom0_cost_toml(LOADED_DOM0_COST)
            )),
            "{loaded}"
        );
        let node =
            kumo_vmm::spec::node::parse(&loaded).unwrap_or_else(|e| panic!("{loaded}\n{e:#}"));
        assert_eq!(node.dom0_cost.frame_us, LOADED_SEGMENT_COST_US);
        // A full segment's worth of bytes costs one more segment, to the file's rounding.
        let segment_us = node.dom0_cost.kib_us * S1_SEGMENT_BYTES / 1024.0;
        assert!(
            (segment_us - LOADED_SEGMENT_COST_US).abs() < 0.01,
            "{segment_us}"
        );
        let own = node_toml(&base(Dom0::Kumo), spec("cg.W"), &[0, 1], Wait::Spin);
        assert!(!own.contains("cost"), "{own}");
        // The loaded node is the same node otherwise.
        let strip = |t: &str| t.replace(&dom0_cost_toml(LOADED_DOM0_COST), "");
        assert_eq!(strip(&loaded), own);
    }

    #[test]
    fn the_dom0_flag_takes_kumo_loaded_or_both() {
        use clap::ValueEnum;
        let parse = |t: &str| Dom0Families::from_str(t, false);
        assert_eq!(parse("kumo"), Ok(Dom0Families::Kumo));
        assert_eq!(parse("loaded"), Ok(Dom0Families::Loaded));
        assert_eq!(parse("both"), Ok(Dom0Families::Both));
        assert!(parse("xen").is_err());
        assert!(Dom0Families::Both.covers(Dom0::Kumo) && Dom0Families::Both.covers(Dom0::Loaded));
        assert!(!Dom0Families::Kumo.covers(Dom0::Loaded));
        assert!(!Dom0Families::Loaded.covers(Dom0::Kumo));
        // Rows and figures name a family as the JSON does.
        for d in [Dom0::Kumo, Dom0::Loaded] {
            assert_eq!(serde_json::to_value(d).unwrap(), d.name());
        }
    }

    #[test]
    fn bench_picks_s1s_benchmarks_and_refuses_others() {
        let list =
            |items: &[&str]| -> Vec<String> { items.iter().map(|s| s.to_string()).collect() };
        assert_eq!(chosen_benchmarks(&[]).unwrap(), None);
        assert_eq!(
            chosen_benchmarks(&list(&["cg.A", "ep.A", "cg.A"])).unwrap(),
            Some(vec![spec("cg.A"), spec("ep.A")])
        );
        let err = chosen_benchmarks(&list(&["is.A"])).unwrap_err();
        assert!(format!("{err:#}").contains("S1 runs only"), "{err:#}");
        let err = chosen_benchmarks(&list(&["cg"])).unwrap_err();
        assert!(format!("{err:#}").starts_with("--bench cg: "), "{err:#}");
    }

    #[test]
    fn the_json_report_names_each_rows_and_runs_domain_0() {
        let loaded = *SCENARIOS.iter().find(|s| s.name == LOADED_XEN34).unwrap();
        let runs = vec![
            real_run_of(XEN34, 3.0),
            RealRun {
                dom0: Dom0::Loaded,
                ..real_run_of(LOADED_XEN34, 6.0)
            },
            RealRun {
                dom0: Dom0::Loaded,
                ..real_run_of("loaded-xen3.4-1/1", 4.0)
            },
        ];
        let loaded_family = scenarios(true, Dom0Families::Loaded);
        let rows = rows(&loaded_family, &[spec("cg.W")], &[1], &runs, &[]);
        let row = |name: &str| rows.iter().find(|r| r.scenario.name == name).unwrap();
        assert_eq!(row("loaded-xen3.4-1/1").speedup_pct, Some(50.0));
        let json = serde_json::to_value(row("loaded-xen3.4-1/1")).unwrap();
        assert_eq!(json["scenario"]["dom0"], "loaded", "{json}");
        assert_eq!(json["scenario"]["baseline"], LOADED_XEN34, "{json}");
        assert_eq!(json["paper_pct"], 45.3, "{json}");
        let json = serde_json::to_value(&runs[1]).unwrap();
        assert_eq!(json["dom0"], "loaded", "{json}");
        let json = serde_json::to_value(&runs[0]).unwrap();
        assert_eq!(json["dom0"], "kumo", "{json}");
        assert_eq!(serde_json::to_value(loaded).unwrap()["dom0"], "loaded");
    }

    #[test]
    fn every_real_node_file_is_a_valid_node() {
        for (s, wait) in SCENARIOS
            .iter()
            .zip([Wait::Spin, Wait::Yield, Wait::Block].iter().cycle())
        {
            let text = node_toml(s, spec("cg.W"), &[0], *wait);
            let node =
                kumo_vmm::spec::node::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
            assert_eq!(node.domains.len(), DOMUS);
            for d in &node.domains {
                assert_eq!((d.vcpus, d.ranks_per_vcpu), (1, RANKS_PER_VCPU));
                assert_eq!(d.guest_hz, Some(GUEST_HZ));
                let want = format!("wait={}", wait.name());
                assert!(d.cmdline().contains(&want), "{}", d.cmdline());
            }
            assert_eq!(node.dom0_weight, s.dom0_weight);
            assert_eq!(node.params.accounting, s.accounting.into());
            let cost = match s.dom0 {
                Dom0::Kumo => 0.0,
                Dom0::Loaded => LOADED_SEGMENT_COST_US,
            };
            assert_eq!(node.dom0_cost.frame_us, cost, "{}", s.name);
            assert_eq!(
                node.dom0_cost.kib_us > 0.0,
                s.dom0 == Dom0::Loaded,
                "{}",
                s.name
            );
            // The auto slice's node files ask for it, from 30/10 ms; the others do not.
            assert_eq!(node.auto_slice, s.auto_slice, "{}", s.name);
            assert_eq!(
                node.params.tslice_ns,
                (s.tslice_ms * 1e6) as u64,
                "{}",
                s.name
            );
        }
        let auto: Vec<&str> = SCENARIOS
            .iter()
            .filter(|s| s.auto_slice)
            .map(|s| s.name)
            .collect();
        assert_eq!(auto, ["xen3.4-auto", "loaded-xen3.4-auto"]);
        assert!(
            scenarios(true, Dom0Families::Both)
                .iter()
                .all(|s| !s.auto_slice)
        );
        assert_eq!(paper_pct("xen3.4-auto", Kernel::Cg), None);
    }

    #[test]
    fn s1s_two_nodes_are_two_node_files_joined_by_the_wire() {
        assert_eq!(two_node_cpus(2), None);
        let cpus = two_node_cpus(4).unwrap();
        assert_eq!(cpus, [vec![0, 1], vec![2, 3]]);
        let [first, second] = two_node_tomls(
            &SCENARIOS[0],
            spec("cg.S"),
            &cpus,
            "unix:/tmp/w",
            Wait::Spin,
        );
        let first =
            kumo_vmm::spec::node::parse(&first).unwrap_or_else(|e| panic!("{first}\n{e:#}"));
        // This host may not have CPUs 2 and 3: the second file is checked on 0 and 1.
        assert!(second.starts_with("pcpus = [2, 3]\n"), "{second}");
        let second = second.replace("pcpus = [2, 3]", "pcpus = [0, 1]");
        let second =
            kumo_vmm::spec::node::parse(&second).unwrap_or_else(|e| panic!("{second}\n{e:#}"));
        let ranks = |n: &kumo_vmm::spec::node::Node| -> Vec<u32> {
            n.domains.iter().flat_map(|d| d.ranks()).collect()
        };
        assert_eq!(ranks(&first), [0, 1, 2, 3]);
        assert_eq!(ranks(&second), [4, 5, 6, 7]);
        assert_eq!(first.pcpus, [0, 1]);
        let wire = |n: &kumo_vmm::spec::node::Node| n.network.as_ref().unwrap().wire.clone();
        assert_eq!(wire(&first), Some("listen:unix:/tmp/w".parse().unwrap()));
        assert_eq!(wire(&second), Some("unix:/tmp/w".parse().unwrap()));
        assert!(
            second.domains[0].cmdline().contains(" mpi=4:8:2 "),
            "{}",
            second.domains[0].cmdline()
        );
    }

    #[test]
    fn the_fit_recovers_known_costs() {
        let point = |frames: u64, kib: f64| CalibrationPoint {
            message_bytes: 0,
            frames,
            kib,
            dom0_cpu_s: (frames as f64 * 3.0 + kib * 0.5) / 1e6,
        };
        let (a, b) = fit(&[point(1000, 50.0), point(800, 7000.0)]);
        assert!((a - 3.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9, "{a} {b}");
        // Large frames cheaper per frame than small ones (batched wake-ups): the small
        // point alone gives the per-frame cost.
        let mut batched = [point(1000, 50.0), point(800, 7000.0)];
        batched[1].dom0_cpu_s = 0.001;
        let (a, b) = fit(&batched);
        assert!((a - 3.025).abs() < 1e-9 && b == 0.0, "{a} {b}");
    }

    #[test]
    fn the_simulation_file_is_s1s_node_and_runs_every_benchmark_and_scenario() {
        let calibration = Calibration {
            per_frame_us: 4.0,
            per_kib_us: 0.3,
            points: vec![],
            driver: DriverCost::default(),
        };
        let all = scenarios(true, Dom0Families::Kumo);
        let traffic = Traffic {
            frames: 4000.0,
            bytes: 4000.0 * 900.0,
            exchanges_per_step: None,
            guest_us_per_step: None,
        };
        let compute: Vec<(Spec, f64, Traffic)> = benchmarks(true)
            .into_iter()
            .map(|spec| {
                (
                    Spec {
                        class: Class::S,
                        ..spec
                    },
                    0.05,
                    traffic,
                )
            })
            .collect();
        let text = sim_toml((2, Wait::Spin), &calibration, None, &compute, &all);
        let sim = crate::sim::config::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
        assert!(sim.programs.iter().all(|p| p.wait == Wait::Spin));
        assert_eq!(
            sim.costs.dom0_per_frame_us, 0.0,
            "kumo's domain 0 is the switch"
        );
        let yielding = sim_toml((2, Wait::Yield), &calibration, None, &compute, &all);
        let yielding = crate::sim::config::parse(&yielding).unwrap();
        assert!(yielding.programs.iter().all(|p| p.wait == Wait::Yield));
        assert_eq!(
            sim.nodes[0].domains.len(),
            1 + DOMUS,
            "domain 0 and the DomUs"
        );
        assert_eq!(sim.ranks.len(), RANKS, "two ranks on each DomU's vCPU");
        // BT.S: 60 steps, 4000 frames of which two per ring exchange cross: 33 a step,
        // the bytes spread over the 2 x 60 x 33 crossing messages.
        assert!(
            text.contains("name = \"bt.S\"\niterations = 60\n"),
            "{text}"
        );
        let bt = text
            .lines()
            .find(|l| l.contains("exchange:ring:909"))
            .unwrap();
        assert_eq!(bt.matches("exchange:ring:909").count(), 33, "{bt}");
        // CG.S (order 1400) as its MPI form: rows sum through shared memory, and only
        // ranks 1 and 2 trade transposes (700 values) across the DomUs.
        let cg = |rank: u32| {
            let p = sim.programs.iter().find(|p| p.name == "cg.S").unwrap();
            p.bodies[rank as usize].clone()
        };
        let sends = |rank| -> Vec<(u32, u64)> {
            cg(rank)
                .iter()
                .filter_map(|p| match *p {
                    crate::sim::program::Phase::Send { to, bytes } => Some((to, bytes)),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(sends(0), [(1, 5600), (1, 8), (1, 8)]);
        assert_eq!(sends(1), [(0, 5600), (2, 5600), (0, 8), (0, 8)]);
        let report = crate::sim::run(&sim).unwrap();
        assert_eq!(report.runs.len(), compute.len() * all.len());
        assert!(report.runs.iter().all(|r| r.finished), "{}", report.text());
        // The loaded family: the same programs, domain 0 charged per frame as the
        // switch charges it, with the guest MPI's resend timer.
        let loaded = scenarios(true, Dom0Families::Loaded);
        let text = sim_toml(
            (2, Wait::Yield),
            &calibration,
            Dom0::Loaded.backend(),
            &compute,
            &loaded,
        );
        let sim = crate::sim::config::parse(&text).unwrap();
        assert_eq!(sim.costs.dom0_per_frame_us, LOADED_DOM0_COST.frame_us);
        assert_eq!(sim.costs.dom0_per_frame_kib_us, LOADED_DOM0_COST.kib_us);
        assert_eq!(sim.costs.retransmit_after_ms, 10.0);
        let report = crate::sim::run(&sim).unwrap();
        assert_eq!(report.runs.len(), compute.len() * loaded.len());
        assert!(report.runs.iter().all(|r| r.finished), "{}", report.text());
    }

    /// The driver's cost per pCPU tick: its CPU and two switches a run, spread over
    /// the pCPUs' ticks; nothing when it has a CPU of its own.
    #[test]
    fn the_drivers_tick_cost_is_its_run_and_two_switches_per_tick_it_served() {
        let stats = |on_node_cpus| hv::credit::DriverStats {
            runs: 2000,
            cpu_us: 200_000,
            on_node_cpus,
            ..Default::default()
        };
        // 2 s at 1 ms on 2 pCPUs: 4000 pCPU ticks, a run for every two.
        let cost = DriverCost::measured(stats(true), Duration::from_secs(2), 2);
        assert!(
            (cost.tick_us - (100.0 + 2.0 * SWITCH_US) / 2.0).abs() < 1e-9,
            "{cost:?}"
        );
        // More runs than ticks (domain 0's wake-ups): all of their cost is charged.
        let busy = DriverCost::measured(stats(true), Duration::from_millis(500), 2);
        assert!(
            (busy.tick_us - 2.0 * (100.0 + 2.0 * SWITCH_US)).abs() < 1e-9,
            "{busy:?}"
        );
        let beside = DriverCost::measured(stats(false), Duration::from_secs(2), 2);
        assert_eq!(beside.tick_us, 0.0);
        let idle = DriverCost::measured(hv::credit::DriverStats::default(), Duration::ZERO, 2);
        assert_eq!(idle.tick_us, 0.0);
    }

    #[test]
    fn the_fit_finds_the_exchanges_that_give_the_baselines_time() {
        let calibration = Calibration {
            per_frame_us: 4.0,
            per_kib_us: 0.0,
            points: vec![],
            driver: DriverCost::default(),
        };
        let traffic = |k, us| Traffic {
            frames: 600.0,
            bytes: 600.0 * 500.0,
            exchanges_per_step: k,
            guest_us_per_step: us,
        };
        let base = &SCENARIOS[0];
        let time = |name: &str, wait: Wait, t: Traffic| {
            simulated_s((2, wait), &calibration, (spec(name), 0.02, t), base)
                .unwrap()
                .unwrap()
        };
        let fit = |name: &str, wait: Wait, truth: Traffic| {
            let target = time(name, wait, truth);
            let start = traffic(None, None);
            let fitted = fit_to_baseline(
                (2, wait),
                &calibration,
                (spec(name), 0.02, start),
                base,
                target,
            )
            .unwrap();
            (fitted, target)
        };
        for k in [1, 5, 12] {
            let (fitted, _) = fit("mg.S", Wait::Spin, traffic(Some(k), None));
            assert_eq!(
                (fitted.exchanges_per_step, fitted.guest_us_per_step),
                (Some(k), None)
            );
        }
        // CG: its guest CPU a step, in whole µs. The simulated time grows with it in
        // small steps (where a guest tick falls), so the fit lands near it, at a time
        // near the target.
        for us in [0, 40, 300] {
            let (fitted, target) = fit("cg.S", Wait::Yield, traffic(None, Some(us)));
            let found = fitted.guest_us_per_step.unwrap();
            assert_eq!(fitted.exchanges_per_step, None);
            assert!(found.abs_diff(us) <= us / 5, "{found} for {us}");
            let again = time("cg.S", Wait::Yield, fitted);
            assert!(
                (again / target - 1.0).abs() < 0.02,
                "{found} us: {again} s for {target} s ({us} us)"
            );
        }
        // EP has nothing to fit.
        let (fitted, _) = fit("ep.S", Wait::Yield, traffic(None, None));
        assert_eq!(
            (fitted.exchanges_per_step, fitted.guest_us_per_step),
            (None, None)
        );
    }

    #[test]
    fn traffic_is_the_baselines_median_and_falls_back_to_any_verified_run() {
        let run = |scenario: &str, frames: u64| RealRun {
            frames,
            bytes: frames * 100,
            ..real_run_of(scenario, 1.0)
        };
        let runs = vec![
            run(XEN34, 10),
            run(XEN34, 30),
            run(XEN34, 20),
            run("xen3.4-1/1", 99),
        ];
        let t = traffic(&runs, spec("cg.W"), XEN34);
        assert_eq!((t.frames, t.bytes), (20.0, 2000.0));
        let t = traffic(&runs[3..], spec("cg.W"), XEN34);
        assert_eq!(t.frames, 99.0);
        assert_eq!(traffic(&runs, spec("ep.A"), XEN34).frames, 0.0);
    }

    #[test]
    fn the_papers_numbers_are_s1s() {
        assert_eq!(paper_pct("xen3.4-1/1", Kernel::Cg), Some(45.3));
        assert_eq!(paper_pct("xen3.4-1/1", Kernel::Bt), Some(28.9));
        assert_eq!(paper_pct("xen3.4-1/1", Kernel::Sp), Some(33.4));
        assert_eq!(paper_pct(XEN34_TUNED, Kernel::Sp), Some(35.0));
        assert_eq!(paper_pct("xen3.4-1/1", Kernel::Lu), None);
        assert_eq!(paper_pct(XEN34, Kernel::Mg), Some(0.0));
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        for sweep in ["60/10", "30/15", "30/10", "10/5", "10/2", "1/1"] {
            assert!(
                names.contains(&format!("xen3.4-{sweep}").as_str()),
                "{sweep}"
            );
        }
        for weight in [64, 128, 512, 1024] {
            assert!(
                SCENARIOS
                    .iter()
                    .any(|s| s.dom0_weight == weight && s.tslice_ms == 30.0)
            );
        }
        let kernels: Vec<Kernel> = benchmarks(false).iter().map(|s| s.kernel).collect();
        assert_eq!(kernels.len(), 7);
        assert!(benchmarks(false).iter().all(|s| s.class == Class::A));
    }

    fn real_run_of(scenario: &str, time: f64) -> RealRun {
        RealRun {
            nodes: 1,
            scenario: scenario.into(),
            dom0: Dom0::Kumo,
            benchmark: "cg.W".into(),
            round: 0,
            time_s: Some(time),
            verified: true,
            domain_cpu_s: vec![1.0; 2],
            rank_wait_s: vec![0.5; 4],
            dom0_cpu_s: 0.1,
            vmm_cpu_s: 0.05,
            frames: 1,
            bytes: 1,
            wall_s: time,
            problems: vec![],
        }
    }

    #[test]
    fn rows_take_speed_ups_over_their_own_baseline() {
        let run = real_run_of;
        let runs = vec![
            run(XEN34, 3.0),
            run("xen3.4-1/1", 2.0),
            run("xen3.4-1/1-dom0-1024", 1.5),
            run(XEN4, 4.0),
            run("xen4-1/1", 4.0),
        ];
        let all = scenarios(false, Dom0Families::Kumo);
        let rows = rows(&all, &[spec("cg.W")], &[1], &runs, &[]);
        let get = |name: &str| rows.iter().find(|r| r.scenario.name == name).unwrap();
        assert_eq!(get("xen3.4-1/1").speedup_pct, Some(50.0));
        assert_eq!(get("xen3.4-1/1-dom0-1024").speedup_pct, Some(100.0));
        assert_eq!(get("xen4-1/1").speedup_pct, Some(0.0));
        assert_eq!(get(XEN34).speedup_pct, Some(0.0));
        assert_eq!(get("xen3.4-1/1").paper_pct, Some(45.3));
        assert_eq!(get("xen3.4-1/1").wait_s, Some(2.0));
        assert!(
            rows.iter()
                .filter(|r| r.time_s.is_some())
                .all(|r| r.verified)
        );
        assert!(
            !get("xen3.4-10/5").verified,
            "a scenario without runs is not verified"
        );
    }

    fn row(name: &str, speedup: Option<f64>, paper: Option<f64>) -> Row {
        let scenario = *SCENARIOS.iter().find(|s| s.name == name).unwrap();
        Row {
            nodes: 1,
            scenario,
            benchmark: "cg.W".into(),
            time_s: None,
            speedup_pct: speedup,
            paper_pct: paper,
            sim_time_s: None,
            sim_speedup_pct: Some(12.0),
            wait_s: None,
            domain_cpu_s: None,
            dom0_cpu_s: None,
            vmm_cpu_s: None,
            verified: true,
        }
    }

    #[test]
    fn the_figure_is_well_formed_svg_with_a_bar_per_known_value() {
        let rows = vec![
            row("xen3.4-30/10", Some(0.0), Some(0.0)),
            row("xen3.4-1/1", Some(900.0), Some(45.3)),
            row("xen3.4-1/1-dom0-1024", Some(-20.0), None),
            row("loaded-xen3.4-1/1", Some(10.0), None),
        ];
        let svg = speedups("test", &rows).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let text: String = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        assert!(text.contains("cg.W 3.4-1/1"), "group labels: {text}");
        assert!(
            text.contains("loaded dom0 cg.W 3.4-1/1"),
            "the loaded family is named: {text}"
        );
        assert!(text.contains("S1 paper"), "legend: {text}");
        assert!(
            !text.contains("cg.W 3.4-30/10"),
            "the baseline is not a group"
        );
        // Bars: 3 groups x (kumo, sim) + 1 paper value, plus the legend's 3 swatches.
        let filled = |colour: plotters::style::RGBColor| {
            let hex = format!("#{:02X}{:02X}{:02X}", colour.0, colour.1, colour.2);
            doc.descendants()
                .filter(|n| n.tag_name().name() == "rect")
                .filter(|n| {
                    n.attribute("fill")
                        .is_some_and(|f| f.eq_ignore_ascii_case(&hex))
                })
                .count()
        };
        assert_eq!(filled(plot::PALETTE[0]), 3 + 1);
        assert_eq!(filled(plot::PALETTE[1]), 3 + 1);
        assert_eq!(filled(plot::PALETTE[2]), 1 + 1);
    }
}
