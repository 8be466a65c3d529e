//! The simulation file (`kumo sim --config sim.toml`): scheduler parameters, costs
//! calibrated on real runs, the cluster (nodes, their pCPUs, domain 0 and the
//! domains), the programs the ranks run, and the scenarios to compare. Parsed
//! strictly, like node files: an unknown key is an error (a misspelt `weigth` must
//! not silently become the default), and every error names the field, the item
//! (node, domain, program, scenario) and the allowed range.
//!
//! Ranks run on the domains' vCPUs (domain 0 excluded), `ranks_per_vcpu` on each,
//! numbered node by node, domain by domain in file order, and inside a domain as
//! kumo's guest numbers them (`guests/user/src/main.rs`, `MpiJob::run`): vCPU v runs
//! ranks FIRST + v*R .. FIRST + v*R + R - 1, its task k rank FIRST + v*R + k. With
//! S1's cluster of 1-vCPU DomUs and R = 1, ranks 0 and 1 run on the first node, 2
//! and 3 on the second; with R = 2, ranks 0-1 share u0's vCPU on the first node,
//! 2-3 u1's, 4-7 the second node's.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::program::{self, Pattern, Phase, Step};
use kumo_vmm::ctl::SchedUpdate;
use kumo_vmm::spec::job::{MAX_GUEST_HZ, MAX_RANKS_PER_VCPU, Wait};
use kumo_vmm::spec::node::{DEFAULT_WEIGHT, WEIGHT_RANGE};
use kumo_vmm::spec::sched as sched_params;

/// Domain 0's name in reports and scenario overrides (as in `kumo node`).
pub const DOM0: &str = "dom0";
/// Most ranks (domain vCPUs) in one cluster: the model keeps a mailbox per pair.
pub const MAX_RANKS: u32 = 1024;
/// Most vCPUs of one domain (as many as one scheduler's pCPUs).
const MAX_VCPUS: u32 = sched::MAX_PCPUS;
/// The guest's tick when a domain runs several ranks per vCPU and gives none (a 2009
/// Linux guest's HZ, as kumo's guest: `docs/guests-multirank.md`).
pub const DEFAULT_GUEST_HZ: u32 = 250;
/// The longest guest slice: 1000 ticks, 4 s at 250 Hz.
pub const MAX_GUEST_SLICE_TICKS: u32 = 1000;
/// Payload bytes in one frame of kumo's guest MPI: a 9014-byte frame less the
/// Ethernet (14) and kumo (32) headers (`guests/user/src/mpi.rs`, `PAYLOAD`).
pub const GUEST_FRAME_PAYLOAD: f64 = 8968.0;
/// Longest simulated time of one run (one day).
const MAX_DURATION_S: f64 = 86_400.0;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    /// Cut every run at this much simulated time, finished or not.
    duration_s: Option<f64>,
    #[serde(default)]
    scheduler: SchedulerFile,
    #[serde(default)]
    costs: Costs,
    #[serde(rename = "node", default)]
    nodes: Vec<NodeFile>,
    #[serde(rename = "program", default)]
    programs: Vec<ProgramFile>,
    #[serde(rename = "scenario", default)]
    scenarios: Vec<ScenarioFile>,
}

/// The keys of a node file's `[scheduler]` (its `kind` has no meaning here).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchedulerFile {
    tslice_ms: Option<f64>,
    tick_ms: Option<f64>,
    ratelimit_us: Option<u64>,
    /// "exact" (default) or "tick" (Xen 3.4's per-tick debit, no ratelimit).
    accounting: Option<kumo_vmm::ctl::Accounting>,
    /// Directed yield (see the scenario's key of that name).
    directed_yield: Option<bool>,
}

/// What things cost, in microseconds (of CPU, or of latency for the wire). The
/// defaults are the values of `examples/sim-s1.toml`, which says where each comes from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// CPU lost when a pCPU starts running another vCPU than the one it ran last.
    pub switch_us: f64,
    /// From the event that wakes a halted vCPU (work for domain 0, a message for a
    /// blocked receive, a timer) to the scheduler's wake-up.
    pub wake_us: f64,
    /// CPU lost on a busy pCPU at each scheduler timer interrupt.
    pub tick_us: f64,
    /// A rank's own CPU to hand a message to its driver (netfront).
    pub send_us: f64,
    /// Domain 0's CPU per message and side (netback), plus per KiB copied.
    pub dom0_per_message_us: f64,
    pub dom0_per_kib_us: f64,
    /// Domain 0's CPU per frame it forwards, plus per KiB of those frames, charged
    /// once where kumo's switch charges it (a frame entering a node's switch: from the
    /// sender's NIC, or from the wire): a node file's `[dom0] frame_cost_us` and
    /// `kib_cost_us`.
    pub dom0_per_frame_us: f64,
    pub dom0_per_frame_kib_us: f64,
    /// Message bytes one data frame carries: kumo's guest MPI's jumbo payload
    /// (`guests/user/src/mpi.rs`, `PAYLOAD`). A message of B bytes is
    /// ceil((B + 16) / this) frames (16: its header in the stream).
    pub frame_payload_bytes: f64,
    /// Frames per message besides its data (the receiver's acknowledgements, probes),
    /// each a minimum-size frame, calibrated on a real run's `mpistats` counters.
    pub extra_frames_per_message: f64,
    /// The guest MPI's first retransmission timeout (10 ms in kumo's guest; 0: none
    /// modelled): a message domain 0 forwards later than this after it was sent
    /// costs domain 0 the frames the sender's timer adds (`model.rs`, `dom0_resend`).
    pub retransmit_after_ms: f64,
    /// A DomU's receive ring, in frames (0: unlimited, kumo's switch, which queues
    /// for a slow reader). A message domain 0 delivers to a DomU whose vCPU is not
    /// running takes ring slots until that vCPU runs again and drains them; one that
    /// does not fit is lost (a netback dropping for a full ring: 256 slots in Xen
    /// 3.4's netfront, 64 posted at first) and its sender's TCP resends it after
    /// `lost_resend_ms`.
    pub rx_ring_frames: f64,
    /// A lost message's resend, in ms: Linux TCP's minimum retransmission timeout
    /// (200), doubling for each loss of the same message, up to 120 s.
    pub lost_resend_ms: f64,
    /// Between nodes: latency of the wire and switch, and each node's link rate.
    pub network_latency_us: f64,
    pub network_mb_s: f64,
    /// CPU a guest tick takes from the vCPU it interrupts (the guest scheduler's
    /// timer interrupt: ring 0 is emulated on kumo's hosts).
    pub guest_tick_us: f64,
    /// A rank switch inside the guest, on top of the tick when a tick switches, or
    /// on a yield or block.
    pub guest_switch_us: f64,
    /// A message between ranks of one domain through shared memory (several ranks
    /// per vCPU), charged to the sender.
    pub shm_us: f64,
    /// With `wait = "yield"`: how long a rank that starts waiting polls before it
    /// hands its vCPU to another rank that is not blocked, a poller too, so ranks
    /// that all wait take turns (the guest MPI's `spin_us`: 50 µs where ranks share a
    /// vCPU). 0: it hands over at once, and only to a rank that can go on.
    pub yield_spin_us: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            switch_us: 29.0,
            wake_us: 46.0,
            tick_us: 0.0,
            send_us: 5.0,
            dom0_per_message_us: 20.0,
            dom0_per_kib_us: 5.0,
            // Per frame: none in files written before it (unchanged results).
            dom0_per_frame_us: 0.0,
            dom0_per_frame_kib_us: 0.0,
            frame_payload_bytes: GUEST_FRAME_PAYLOAD,
            extra_frames_per_message: 0.0,
            retransmit_after_ms: 0.0,
            rx_ring_frames: 0.0,
            lost_resend_ms: 200.0,
            network_latency_us: 30.0,
            network_mb_s: 117.0,
            // No guest scheduler in files written before it: unchanged results.
            guest_tick_us: 0.0,
            guest_switch_us: 0.0,
            shm_us: 0.0,
            yield_spin_us: 0.0,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: String,
    pcpus: u32,
    #[serde(default = "one")]
    dom0_vcpus: u32,
    #[serde(default = "default_weight")]
    dom0_weight: u32,
    #[serde(rename = "domain", default)]
    domains: Vec<DomainFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    name: String,
    #[serde(default = "one")]
    vcpus: u32,
    #[serde(default = "default_weight")]
    weight: u32,
    #[serde(default)]
    cap: u32,
    /// MPI ranks multiplexed on each vCPU by the guest's scheduler.
    #[serde(default = "one")]
    ranks_per_vcpu: u32,
    /// The guest's tick in Hz (default [`DEFAULT_GUEST_HZ`] when `ranks_per_vcpu` > 1;
    /// none with one rank per vCPU unless given).
    guest_hz: Option<u32>,
    /// Guest ticks a spinning rank keeps its vCPU before the guest switches (default
    /// 1, kumo's guest; Linux 2.6's O(1) scheduler gave a CPU-bound task 100 ms, 25
    /// ticks at 250 Hz).
    guest_slice_ticks: Option<u32>,
}

fn one() -> u32 {
    1
}

fn default_weight() -> u32 {
    DEFAULT_WEIGHT
}

/// A program: the same phase list for every rank (`phases`, or the shorthand
/// `compute_ms` + `pattern` + `message_bytes`), or lists for chosen ranks
/// (`[[program.rank]]`), repeated `iterations` times.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProgramFile {
    name: String,
    #[serde(default = "one_u64")]
    iterations: u64,
    /// How its ranks wait for a message or for domain 0's I/O, as the guest's ranks
    /// do (`kumo_vmm::spec::job::Wait`): spin keeps the vCPU runnable, burning its pCPU
    /// (S1's case); block halts until it arrives (with several ranks per vCPU the
    /// others run; the vCPU halts when all sleep); yield hands the vCPU to another
    /// rank of it after every idle poll (alone, as spinning).
    #[serde(default = "spin")]
    wait: Wait,
    compute_ms: Option<f64>,
    pattern: Option<String>,
    message_bytes: Option<u64>,
    phases: Option<Vec<String>>,
    #[serde(rename = "rank", default)]
    ranks: Vec<RankFile>,
}

/// MPI's busy-wait: a program's way of waiting unless it says otherwise.
fn spin() -> Wait {
    Wait::Spin
}

fn one_u64() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RankFile {
    ranks: Vec<u32>,
    phases: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: String,
    tslice_ms: Option<f64>,
    tick_ms: Option<f64>,
    ratelimit_us: Option<u64>,
    /// "exact" (default) or "tick" (Xen 3.4's per-tick debit, no ratelimit).
    accounting: Option<kumo_vmm::ctl::Accounting>,
    /// Directed yield: a rank waiting for a message BOOSTs the sender's vCPU when it
    /// is a queued sibling in its own domain (`sched::Params::directed_yield`).
    directed_yield: Option<bool>,
    /// The scheduler picks its slice (`sched::auto_slice`), from the scenario's
    /// parameters as its long setting.
    auto_slice: Option<bool>,
    /// Domain 0's weight on every node.
    dom0_weight: Option<u32>,
    /// Overrides every program's way of waiting.
    wait: Option<Wait>,
    /// Every domain's guest tick in Hz (a domain of one rank per vCPU then ticks too).
    guest_hz: Option<u32>,
    /// Every domain's guest slice in ticks.
    guest_slice_ticks: Option<u32>,
    #[serde(rename = "domain", default)]
    domains: Vec<ScenarioDomainFile>,
}

/// A scenario's change to domains named `name` (on every node, or on `node`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioDomainFile {
    name: String,
    node: Option<String>,
    weight: Option<u32>,
    cap: Option<u32>,
}

/// A validated simulation.
#[derive(Debug, Clone)]
pub struct Sim {
    pub duration_ns: u64,
    pub costs: Costs,
    pub nodes: Vec<Node>,
    /// Where each rank runs, in rank order.
    pub ranks: Vec<RankPlace>,
    pub programs: Vec<Program>,
    pub scenarios: Vec<Scenario>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub pcpus: u32,
    pub dom0_vcpus: u32,
    /// Domain 0 first (index 0, named [`DOM0`]), then the file's domains.
    pub domains: Vec<Domain>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    pub name: String,
    pub vcpus: u32,
    pub weight: u32,
    pub cap: u32,
    /// Ranks on each vCPU (1 for domain 0, which runs none).
    pub ranks_per_vcpu: u32,
    /// The guest's tick (`None`: not modelled).
    pub guest_hz: Option<u32>,
    /// Ticks a task keeps the vCPU before the guest switches round robin.
    pub guest_slice_ticks: u32,
}

/// A rank's node, domain (index into `Node::domains`) and vCPU within the domain
/// (its task on that vCPU is its rank minus the vCPU's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankPlace {
    pub node: usize,
    pub domain: usize,
    pub vcpu: u32,
}

#[derive(Debug, Clone)]
pub struct Program {
    pub name: String,
    pub iterations: u64,
    pub wait: Wait,
    /// One iteration of each rank, in rank order (empty: the rank does nothing).
    pub bodies: Vec<Vec<Phase>>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub params: sched::Params,
    /// The scheduler picks its slice (`sched::auto_slice`); `params` is its long
    /// setting.
    pub auto_slice: bool,
    pub wait: Option<Wait>,
    /// Overrides every domain's guest tick.
    pub guest_hz: Option<u32>,
    /// Overrides every domain's guest slice.
    pub guest_slice_ticks: Option<u32>,
    /// Weight and cap of every domain of every node (same shape as `Node::domains`).
    pub shares: Vec<Vec<(u32, u32)>>,
}

impl Scenario {
    /// `domain`'s guest tick and guest slice in this scenario: the scenario's
    /// overrides, else the domain's own.
    pub fn guest(&self, domain: &Domain) -> (Option<u32>, u32) {
        (
            self.guest_hz.or(domain.guest_hz),
            self.guest_slice_ticks.unwrap_or(domain.guest_slice_ticks),
        )
    }
}

pub fn load(path: &Path) -> Result<Sim> {
    let text = kumo_vmm::input::read_config("simulation file", path)?;
    parse(&text).with_context(|| format!("in simulation file {}", path.display()))
}

/// Parses and validates a simulation file's text.
pub fn parse(text: &str) -> Result<Sim> {
    let file: SimFile = toml::from_str(text).map_err(|e| one_line(text, &e))?;
    validate(file)
}

/// TOML errors come as a multi-line excerpt; kumo reports bad input on one line.
fn one_line(text: &str, e: &toml::de::Error) -> anyhow::Error {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            anyhow!("line {line}: {message}")
        }
        None => anyhow!("{message}"),
    }
}

fn check_weight(what: &str, weight: u32) -> Result<()> {
    if !(WEIGHT_RANGE.0..=WEIGHT_RANGE.1).contains(&weight) {
        bail!(
            "{what}: weight {weight} is outside {}..={}",
            WEIGHT_RANGE.0,
            WEIGHT_RANGE.1
        );
    }
    Ok(())
}

fn check_cap(what: &str, cap: u32, pcpus: u32) -> Result<()> {
    if cap > 100 * pcpus {
        bail!(
            "{what}: cap {cap} is above {} (100 per pCPU of the node; 0 = no cap)",
            100 * pcpus
        );
    }
    Ok(())
}

fn check_guest_slice(what: &str, ticks: u32) -> Result<()> {
    if !(1..=MAX_GUEST_SLICE_TICKS).contains(&ticks) {
        bail!("{what}: guest_slice_ticks {ticks} is outside 1..={MAX_GUEST_SLICE_TICKS}");
    }
    Ok(())
}

fn check_guest_hz(what: &str, hz: u32) -> Result<()> {
    if !(1..=MAX_GUEST_HZ).contains(&hz) {
        bail!("{what}: guest_hz {hz} is outside 1..={MAX_GUEST_HZ}");
    }
    Ok(())
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("{what} name '{name}' must be one non-empty word");
    }
    Ok(())
}

fn validate(file: SimFile) -> Result<Sim> {
    let duration_s = file.duration_s.unwrap_or(600.0);
    if !(duration_s > 0.0 && duration_s <= MAX_DURATION_S) {
        bail!("duration_s {duration_s} is outside (0, {MAX_DURATION_S}] seconds");
    }
    let costs = check_costs(file.costs)?;
    let base = sched_params::from_update(SchedUpdate {
        tslice_ms: file.scheduler.tslice_ms,
        tick_ms: file.scheduler.tick_ms,
        ratelimit_us: file.scheduler.ratelimit_us,
        accounting: file.scheduler.accounting,
        directed_yield: file.scheduler.directed_yield,
        auto_slice: None,
    })
    .context("[scheduler]")?;
    let (nodes, ranks) = check_nodes(file.nodes)?;
    let programs = check_programs(file.programs, ranks.len() as u32)?;
    let scenarios = check_scenarios(file.scenarios, base, &nodes)?;
    Ok(Sim {
        duration_ns: (duration_s * 1e9).round() as u64,
        costs,
        nodes,
        ranks,
        programs,
        scenarios,
    })
}

fn check_costs(c: Costs) -> Result<Costs> {
    let named = [
        ("switch_us", c.switch_us),
        ("wake_us", c.wake_us),
        ("tick_us", c.tick_us),
        ("send_us", c.send_us),
        ("dom0_per_message_us", c.dom0_per_message_us),
        ("dom0_per_kib_us", c.dom0_per_kib_us),
        ("dom0_per_frame_us", c.dom0_per_frame_us),
        ("dom0_per_frame_kib_us", c.dom0_per_frame_kib_us),
        ("extra_frames_per_message", c.extra_frames_per_message),
        ("retransmit_after_ms", c.retransmit_after_ms),
        ("lost_resend_ms", c.lost_resend_ms),
        ("network_latency_us", c.network_latency_us),
        ("guest_tick_us", c.guest_tick_us),
        ("guest_switch_us", c.guest_switch_us),
        ("shm_us", c.shm_us),
        ("yield_spin_us", c.yield_spin_us),
    ];
    for (name, value) in named {
        if !(0.0..=1e6).contains(&value) {
            bail!("costs.{name} {value} is outside 0..=1000000 (microseconds)");
        }
    }
    if !(c.frame_payload_bytes >= 1.0 && c.frame_payload_bytes <= 1e6) {
        bail!(
            "costs.frame_payload_bytes {} is outside 1..=1000000 (bytes)",
            c.frame_payload_bytes
        );
    }
    if !(0.0..=1e6).contains(&c.rx_ring_frames) {
        bail!(
            "costs.rx_ring_frames {} is outside 0..=1000000 (frames; 0: unlimited)",
            c.rx_ring_frames
        );
    }
    if c.rx_ring_frames > 0.0 && c.lost_resend_ms <= 0.0 {
        bail!("costs.lost_resend_ms must be above 0 with a finite rx_ring_frames");
    }
    if !(c.network_mb_s > 0.0 && c.network_mb_s <= 1e7) {
        bail!(
            "costs.network_mb_s {} is outside (0, 10000000] (MB/s)",
            c.network_mb_s
        );
    }
    Ok(c)
}

fn check_nodes(files: Vec<NodeFile>) -> Result<(Vec<Node>, Vec<RankPlace>)> {
    if files.is_empty() {
        bail!("no [[node]]: a cluster needs at least one");
    }
    let mut names = BTreeSet::new();
    let mut nodes = Vec::new();
    let mut ranks = Vec::new();
    for n in files {
        check_name("node", &n.name)?;
        let what = format!("node '{}'", n.name);
        if !names.insert(n.name.clone()) {
            bail!("two nodes are named '{}'", n.name);
        }
        if !(1..=sched::MAX_PCPUS).contains(&n.pcpus) {
            bail!(
                "{what}: pcpus {} is outside 1..={}",
                n.pcpus,
                sched::MAX_PCPUS
            );
        }
        if !(1..=MAX_VCPUS).contains(&n.dom0_vcpus) {
            bail!(
                "{what}: dom0_vcpus {} is outside 1..={MAX_VCPUS}",
                n.dom0_vcpus
            );
        }
        check_weight(&format!("{what} dom0"), n.dom0_weight)?;
        let mut domains = vec![Domain {
            name: DOM0.into(),
            vcpus: n.dom0_vcpus,
            weight: n.dom0_weight,
            cap: 0,
            ranks_per_vcpu: 1,
            guest_hz: None,
            guest_slice_ticks: 1,
        }];
        for d in n.domains {
            check_name("domain", &d.name)?;
            let what = format!("{what} domain '{}'", d.name);
            if d.name == DOM0 {
                bail!("{what}: the name is domain 0's (set dom0_weight, dom0_vcpus on the node)");
            }
            if domains.iter().any(|x| x.name == d.name) {
                bail!("{what}: two domains of the node have this name");
            }
            check_weight(&what, d.weight)?;
            check_cap(&what, d.cap, n.pcpus)?;
            if !(1..=MAX_VCPUS).contains(&d.vcpus) {
                bail!("{what}: vcpus {} is outside 1..={MAX_VCPUS}", d.vcpus);
            }
            if !(1..=MAX_RANKS_PER_VCPU).contains(&d.ranks_per_vcpu) {
                bail!(
                    "{what}: ranks_per_vcpu {} is outside 1..={MAX_RANKS_PER_VCPU}",
                    d.ranks_per_vcpu
                );
            }
            if let Some(hz) = d.guest_hz {
                check_guest_hz(&what, hz)?;
            }
            if let Some(ticks) = d.guest_slice_ticks {
                check_guest_slice(&what, ticks)?;
            }
            // vCPU v runs ranks first + v*R + k, k < R: the guest's own numbering.
            for vcpu in 0..d.vcpus {
                for _ in 0..d.ranks_per_vcpu {
                    ranks.push(RankPlace {
                        node: nodes.len(),
                        domain: domains.len(),
                        vcpu,
                    });
                }
            }
            let guest_hz = match d.guest_hz {
                None if d.ranks_per_vcpu > 1 => Some(DEFAULT_GUEST_HZ),
                hz => hz,
            };
            domains.push(Domain {
                name: d.name,
                vcpus: d.vcpus,
                weight: d.weight,
                cap: d.cap,
                ranks_per_vcpu: d.ranks_per_vcpu,
                guest_hz,
                guest_slice_ticks: d.guest_slice_ticks.unwrap_or(1),
            });
        }
        nodes.push(Node {
            name: n.name,
            pcpus: n.pcpus,
            dom0_vcpus: n.dom0_vcpus,
            domains,
        });
    }
    if ranks.is_empty() {
        bail!("no [[node.domain]]: the ranks run on the domains' vCPUs, and there are none");
    }
    if ranks.len() > MAX_RANKS as usize {
        bail!("{} ranks: at most {MAX_RANKS} are simulated", ranks.len());
    }
    Ok((nodes, ranks))
}

fn parse_list(list: &[String]) -> Result<Vec<Step>> {
    list.iter()
        .map(|s| program::parse_step(s).map_err(|e| anyhow!("phase '{s}': {e}")))
        .collect()
}

fn expand(steps: &[Step], rank: u32, ranks: u32, list: &[String]) -> Result<Vec<Phase>> {
    // Report the first phase that does not fit this rank, by its text.
    for (step, text) in steps.iter().zip(list) {
        program::expand(std::slice::from_ref(step), rank, ranks)
            .map_err(|e| anyhow!("phase '{text}' on rank {rank}: {e}"))?;
    }
    program::expand(steps, rank, ranks).map_err(|e| anyhow!("rank {rank}: {e}"))
}

fn check_programs(files: Vec<ProgramFile>, ranks: u32) -> Result<Vec<Program>> {
    if files.is_empty() {
        bail!("no [[program]]: give at least one (name, iterations, phases)");
    }
    let mut names = BTreeSet::new();
    let mut programs = Vec::new();
    for p in files {
        check_name("program", &p.name)?;
        let what = format!("program '{}'", p.name);
        if !names.insert(p.name.clone()) {
            bail!("two programs are named '{}'", p.name);
        }
        if !(1..=1_000_000_000).contains(&p.iterations) {
            bail!(
                "{what}: iterations {} is outside 1..=1000000000",
                p.iterations
            );
        }
        let shorthand = p.compute_ms.is_some() || p.pattern.is_some() || p.message_bytes.is_some();
        let kinds = [shorthand, p.phases.is_some(), !p.ranks.is_empty()];
        if kinds.iter().filter(|k| **k).count() != 1 {
            bail!(
                "{what}: give exactly one of compute_ms/pattern/message_bytes, phases, \
                 or [[program.rank]] lists"
            );
        }
        let bodies = if shorthand {
            let list = shorthand_list(&p).with_context(|| what.clone())?;
            let steps = parse_list(&list).with_context(|| what.clone())?;
            (0..ranks)
                .map(|r| expand(&steps, r, ranks, &list))
                .collect::<Result<Vec<_>>>()
                .with_context(|| what.clone())?
        } else if let Some(list) = &p.phases {
            let steps = parse_list(list).with_context(|| what.clone())?;
            (0..ranks)
                .map(|r| expand(&steps, r, ranks, list))
                .collect::<Result<Vec<_>>>()
                .with_context(|| what.clone())?
        } else {
            let mut bodies: Vec<Option<Vec<Phase>>> = vec![None; ranks as usize];
            for (i, entry) in p.ranks.iter().enumerate() {
                let what = format!("{what} [[program.rank]] {}", i + 1);
                if entry.ranks.is_empty() {
                    bail!("{what}: ranks is empty");
                }
                let steps = parse_list(&entry.phases).with_context(|| what.clone())?;
                for &r in &entry.ranks {
                    if r >= ranks {
                        bail!(
                            "{what}: rank {r} is out of range (ranks are 0..={})",
                            ranks - 1
                        );
                    }
                    if bodies[r as usize].is_some() {
                        bail!("{what}: rank {r} already has a phase list");
                    }
                    let body =
                        expand(&steps, r, ranks, &entry.phases).with_context(|| what.clone())?;
                    bodies[r as usize] = Some(body);
                }
            }
            bodies.into_iter().map(Option::unwrap_or_default).collect()
        };
        programs.push(Program {
            name: p.name,
            iterations: p.iterations,
            wait: p.wait,
            bodies,
        });
    }
    Ok(programs)
}

/// `compute_ms` + `pattern` + `message_bytes` as a phase list.
fn shorthand_list(p: &ProgramFile) -> Result<Vec<String>> {
    let Some(ms) = p.compute_ms else {
        bail!("compute_ms is missing (pattern and message_bytes go with it)");
    };
    let mut list = vec![format!("compute:{ms}")];
    match p.pattern.as_deref().unwrap_or("none") {
        "none" => {
            if p.message_bytes.is_some() {
                bail!("message_bytes without a pattern (ring, pairs, alltoall)");
            }
        }
        name => {
            let pattern = Pattern::parse(name).map_err(|e| anyhow!("{e}, or none"))?;
            list.push(format!(
                "exchange:{pattern}:{}",
                p.message_bytes.unwrap_or(0)
            ));
        }
    }
    Ok(list)
}

fn check_scenarios(
    files: Vec<ScenarioFile>,
    base: sched::Params,
    nodes: &[Node],
) -> Result<Vec<Scenario>> {
    let file_shares: Vec<Vec<(u32, u32)>> = nodes
        .iter()
        .map(|n| n.domains.iter().map(|d| (d.weight, d.cap)).collect())
        .collect();
    if files.is_empty() {
        return Ok(vec![Scenario {
            name: "base".into(),
            params: base,
            auto_slice: false,
            wait: None,
            guest_hz: None,
            guest_slice_ticks: None,
            shares: file_shares,
        }]);
    }
    let mut names = BTreeSet::new();
    let mut scenarios = Vec::new();
    for s in files {
        check_name("scenario", &s.name)?;
        let what = format!("scenario '{}'", s.name);
        if !names.insert(s.name.clone()) {
            bail!("two scenarios are named '{}'", s.name);
        }
        let params = sched_params::apply(
            base,
            SchedUpdate {
                tslice_ms: s.tslice_ms,
                tick_ms: s.tick_ms,
                ratelimit_us: s.ratelimit_us,
                accounting: s.accounting,
                directed_yield: s.directed_yield,
                auto_slice: None,
            },
        )
        .with_context(|| what.clone())?;
        if let Some(hz) = s.guest_hz {
            check_guest_hz(&what, hz)?;
        }
        if let Some(ticks) = s.guest_slice_ticks {
            check_guest_slice(&what, ticks)?;
        }
        let mut shares = file_shares.clone();
        if let Some(w) = s.dom0_weight {
            check_weight(&format!("{what} dom0"), w)?;
            for node in &mut shares {
                node[0].0 = w;
            }
        }
        for d in &s.domains {
            let dwhat = format!("{what} domain '{}'", d.name);
            if d.weight.is_none() && d.cap.is_none() {
                bail!("{dwhat}: give weight and/or cap");
            }
            if let Some(node) = &d.node
                && !nodes.iter().any(|n| &n.name == node)
            {
                let known: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                bail!("{dwhat}: no node '{node}' (nodes: {})", known.join(", "));
            }
            let mut found = false;
            for (n, node) in nodes.iter().enumerate() {
                if d.node.as_ref().is_some_and(|name| name != &node.name) {
                    continue;
                }
                for (i, domain) in node.domains.iter().enumerate() {
                    if domain.name != d.name {
                        continue;
                    }
                    found = true;
                    if let Some(w) = d.weight {
                        check_weight(&dwhat, w)?;
                        shares[n][i].0 = w;
                    }
                    if let Some(c) = d.cap {
                        check_cap(&dwhat, c, node.pcpus)?;
                        shares[n][i].1 = c;
                    }
                }
            }
            if !found {
                let mut known: Vec<String> = nodes
                    .iter()
                    .flat_map(|n| n.domains.iter().map(|d| d.name.clone()))
                    .collect();
                known.sort();
                known.dedup();
                bail!("{dwhat}: no such domain (domains: {})", known.join(", "));
            }
        }
        scenarios.push(Scenario {
            name: s.name,
            params,
            auto_slice: s.auto_slice.unwrap_or(false),
            wait: s.wait,
            guest_hz: s.guest_hz,
            guest_slice_ticks: s.guest_slice_ticks,
            shares,
        });
    }
    Ok(scenarios)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = r#"
[[node]]
name = "n0"
pcpus = 2
[[node.domain]]
name = "a"
[[node.domain]]
name = "b"
vcpus = 2
weight = 512

[[node]]
name = "n1"
pcpus = 1
dom0_weight = 64
[[node.domain]]
name = "a"

[[program]]
name = "ring"
iterations = 3
phases = ["compute:1.5", "exchange:ring:100"]
"#;

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn a_small_cluster_parses_with_defaults() {
        let sim = parse(SMALL).unwrap();
        assert_eq!(sim.duration_ns, 600_000_000_000);
        assert_eq!(sim.costs, Costs::default());
        assert_eq!(sim.nodes.len(), 2);
        assert_eq!(sim.nodes[0].domains[0].name, DOM0);
        assert_eq!(sim.nodes[1].domains[0].weight, 64);
        let places: Vec<(usize, usize, u32)> = sim
            .ranks
            .iter()
            .map(|r| (r.node, r.domain, r.vcpu))
            .collect();
        assert_eq!(places, [(0, 1, 0), (0, 2, 0), (0, 2, 1), (1, 1, 0)]);
        let p = &sim.programs[0];
        assert_eq!((p.iterations, p.wait), (3, Wait::Spin));
        assert_eq!(
            p.bodies[0],
            [
                Phase::Compute(1_500_000),
                Phase::Send { to: 1, bytes: 100 },
                Phase::Recv { from: 3 }
            ]
        );
        assert_eq!(sim.scenarios.len(), 1);
        assert_eq!(sim.scenarios[0].name, "base");
        assert_eq!(sim.scenarios[0].params, sched::Params::default());
        assert_eq!(
            sim.scenarios[0].shares,
            [vec![(256, 0), (256, 0), (512, 0)], vec![(64, 0), (256, 0)]]
        );
    }

    #[test]
    fn scenarios_override_the_scheduler_and_shares() {
        let text = format!(
            "{SMALL}\n[scheduler]\nratelimit_us = 0\n\
             [[scenario]]\nname = \"short\"\ntslice_ms = 1\ndom0_weight = 1024\nwait = \"block\"\n\
             [[scenario.domain]]\nname = \"a\"\nnode = \"n1\"\ncap = 50\n\
             [[scenario.domain]]\nname = \"b\"\nweight = 128\n"
        );
        let sim = parse(&text).unwrap();
        let s = &sim.scenarios[0];
        assert_eq!(
            (s.params.tslice_ns, s.params.tick_ns, s.params.ratelimit_ns),
            (1_000_000, 1_000_000, 0)
        );
        assert_eq!(s.wait, Some(Wait::Block));
        assert_eq!(
            s.shares,
            [
                vec![(1024, 0), (256, 0), (128, 0)],
                vec![(1024, 0), (256, 50)]
            ]
        );
    }

    #[test]
    fn ranks_per_vcpu_number_ranks_as_the_guest_and_default_its_tick() {
        let text = SMALL
            .replace(
                "name = \"b\"\nvcpus = 2",
                "name = \"b\"\nvcpus = 2\nranks_per_vcpu = 3",
            )
            .replace(
                "dom0_weight = 64\n[[node.domain]]\nname = \"a\"",
                "dom0_weight = 64\n[[node.domain]]\nname = \"a\"\nguest_hz = 1000",
            );
        let text = format!(
            "{text}[[scenario]]\nname = \"base\"\n[[scenario]]\nname = \"fast\"\nguest_hz = 5000\n"
        );
        let sim = parse(&text).unwrap();
        // vCPU v of b runs ranks FIRST + 3v .. FIRST + 3v + 2 (FIRST = 1).
        let places: Vec<(usize, usize, u32)> = sim
            .ranks
            .iter()
            .map(|r| (r.node, r.domain, r.vcpu))
            .collect();
        assert_eq!(
            places,
            [
                (0, 1, 0),
                (0, 2, 0),
                (0, 2, 0),
                (0, 2, 0),
                (0, 2, 1),
                (0, 2, 1),
                (0, 2, 1),
                (1, 1, 0)
            ]
        );
        let hz = |n: usize, d: usize| {
            let d = &sim.nodes[n].domains[d];
            (d.ranks_per_vcpu, d.guest_hz)
        };
        assert_eq!(hz(0, 0), (1, None));
        assert_eq!(hz(0, 1), (1, None));
        assert_eq!(hz(0, 2), (3, Some(DEFAULT_GUEST_HZ)));
        assert_eq!(hz(1, 1), (1, Some(1000)));
        assert_eq!(sim.scenarios[0].guest_hz, None);
        assert_eq!(sim.scenarios[1].guest_hz, Some(5000));
        assert_eq!(sim.programs[0].bodies.len(), 8);
    }

    #[test]
    fn bad_guest_values_are_refused_naming_the_item_and_range() {
        let cases = [
            (
                "ranks_per_vcpu = 0",
                "node 'n0' domain 'b': ranks_per_vcpu 0 is outside 1..=16",
            ),
            (
                "ranks_per_vcpu = 17",
                "node 'n0' domain 'b': ranks_per_vcpu 17 is outside 1..=16",
            ),
            (
                "guest_hz = 0",
                "node 'n0' domain 'b': guest_hz 0 is outside 1..=5000",
            ),
            (
                "guest_hz = 5001",
                "node 'n0' domain 'b': guest_hz 5001 is outside 1..=5000",
            ),
            (
                "guest_slice_ticks = 0",
                "node 'n0' domain 'b': guest_slice_ticks 0 is outside 1..=1000",
            ),
            ("ranks_per_vcpu = -1", "invalid value: integer `-1`"),
            ("ranks = 2", "unknown field `ranks`"),
        ];
        for (key, message) in cases {
            let text = SMALL.replace("weight = 512", &format!("weight = 512\n{key}"));
            let e = error(&text);
            if message.starts_with("node") {
                assert_eq!(e, message);
            } else {
                assert!(e.contains(message), "{e:?} lacks {message:?}");
            }
        }
        assert_eq!(
            error(&format!(
                "{SMALL}[[scenario]]\nname = \"x\"\nguest_hz = 9000\n"
            )),
            "scenario 'x': guest_hz 9000 is outside 1..=5000"
        );
        assert_eq!(
            error(&format!(
                "{SMALL}[[scenario]]\nname = \"x\"\nguest_slice_ticks = 1001\n"
            )),
            "scenario 'x': guest_slice_ticks 1001 is outside 1..=1000"
        );
        assert_eq!(
            error(&format!("{SMALL}[costs]\nyield_spin_us = -50\n")),
            "costs.yield_spin_us -50 is outside 0..=1000000 (microseconds)"
        );
        assert_eq!(
            error(&format!("{SMALL}[costs]\nguest_switch_us = -94\n")),
            "costs.guest_switch_us -94 is outside 0..=1000000 (microseconds)"
        );
        assert!(error(&format!("{SMALL}[costs]\nshm_us = 2e6\n")).contains("costs.shm_us"));
        // 2 vCPUs x 16 ranks x 33 domains is above the simulated 1024.
        let mut many = String::from("[[node]]\nname = \"n\"\npcpus = 2\n");
        for i in 0..33 {
            many.push_str(&format!(
                "[[node.domain]]\nname = \"d{i}\"\nvcpus = 2\nranks_per_vcpu = 16\n"
            ));
        }
        many.push_str("[[program]]\nname = \"p\"\nphases = [\"compute:1\"]\n");
        assert_eq!(error(&many), "1056 ranks: at most 1024 are simulated");
    }

    #[test]
    fn rank_lists_and_the_shorthand_give_bodies() {
        let text = SMALL.replace(
            "phases = [\"compute:1.5\", \"exchange:ring:100\"]",
            "[[program.rank]]\nranks = [0, 3]\nphases = [\"send:+1:8\", \"recv:-1\"]",
        );
        let sim = parse(&text).unwrap();
        let b = &sim.programs[0].bodies;
        assert_eq!(
            b[3],
            [Phase::Send { to: 0, bytes: 8 }, Phase::Recv { from: 2 }]
        );
        assert!(b[1].is_empty() && b[2].is_empty());
        let text = SMALL.replace(
            "phases = [\"compute:1.5\", \"exchange:ring:100\"]",
            "compute_ms = 2\npattern = \"pairs\"\nmessage_bytes = 10",
        );
        let sim = parse(&text).unwrap();
        assert_eq!(
            sim.programs[0].bodies[1],
            [
                Phase::Compute(2_000_000),
                Phase::Send { to: 3, bytes: 10 },
                Phase::Recv { from: 3 }
            ]
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            (
                SMALL.replace("pcpus = 2", "pcpus = 2\nweigth = 1"),
                "line 5: unknown field `weigth`",
            ),
            (
                SMALL.replace("pcpus = 2", "pcpus = 0"),
                "node 'n0': pcpus 0 is outside 1..=256",
            ),
            (
                SMALL.replace("weight = 512", "weight = 0"),
                "domain 'b': weight 0 is outside 1..=65535",
            ),
            (
                SMALL.replace("weight = 512", "cap = 300"),
                "cap 300 is above 200",
            ),
            (SMALL.replace("name = \"b\"", "name = \"a\""), "two domains"),
            (
                SMALL.replace("name = \"b\"", "name = \"dom0\""),
                "domain 0's",
            ),
            (
                SMALL.replace("exchange:ring:100", "send:4:1"),
                "rank 4 is out of range (ranks are 0..=3)",
            ),
            (SMALL.replace("exchange:ring:100", "recv:+4"), "itself"),
            (
                SMALL.replace("exchange:ring:100", "exchange:pairs:1\", \"spin:1"),
                "phase 'spin:1'",
            ),
            (
                SMALL.replace("iterations = 3", "iterations = 0"),
                "iterations 0 is outside",
            ),
            (
                SMALL.replace("iterations = 3", "compute_ms = 3"),
                "exactly one of",
            ),
            (
                format!("{SMALL}[scheduler]\ntslice_ms = 5000\n"),
                "[scheduler]: tslice_ns",
            ),
            (
                format!("{SMALL}[[scenario]]\nname = \"x\"\ntick_ms = 50\n"),
                "scenario 'x': tick_ns",
            ),
            (
                format!(
                    "{SMALL}[[scenario]]\nname = \"x\"\n[[scenario.domain]]\nname = \"c\"\nweight = 1\n"
                ),
                "scenario 'x' domain 'c': no such domain (domains: a, b, dom0)",
            ),
            (
                format!(
                    "{SMALL}[[scenario]]\nname = \"x\"\n[[scenario.domain]]\nname = \"a\"\nnode = \"n7\"\ncap = 1\n"
                ),
                "no node 'n7'",
            ),
            (
                format!("{SMALL}[costs]\nswitch_us = -1\n"),
                "costs.switch_us -1 is outside",
            ),
            (
                format!("{SMALL}[costs]\nrx_ring_frames = -64\n"),
                "costs.rx_ring_frames -64 is outside",
            ),
            (
                format!("{SMALL}[costs]\nrx_ring_frames = 64\nlost_resend_ms = 0\n"),
                "lost_resend_ms must be above 0",
            ),
            (
                format!("duration_s = 0\n{SMALL}"),
                "duration_s 0 is outside",
            ),
            (
                SMALL.replace("[[program]]", "[[programme]]"),
                "unknown field `programme`",
            ),
        ];
        for (text, needle) in cases {
            let e = error(&text);
            assert!(e.contains(needle), "{e:?} lacks {needle:?}");
            assert!(!e.contains('\n'), "{e:?} is not one line");
        }
        let rank = SMALL.replace(
            "phases = [\"compute:1.5\", \"exchange:ring:100\"]",
            "[[program.rank]]\nranks = [4]\nphases = []",
        );
        assert!(error(&rank).contains("[[program.rank]] 1: rank 4 is out of range"));
    }
}
