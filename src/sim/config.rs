//! The simulator's file (`kumo sim --config sim.toml`): costs calibrated on real runs,
//! the cluster (nodes, their pCPUs, domain 0 and the domains), one MPI-like program
//! that every domain vCPU runs as one rank, and the scenarios to compare (scheduler
//! parameters and domain 0's weight). Parsed strictly, like node files.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::ctl::SchedUpdate;
use crate::node_config::{DEFAULT_WEIGHT, WEIGHT_RANGE};
use crate::sched_params;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    /// Stop after this much simulated time even if the program has not finished.
    #[serde(default = "default_duration")]
    duration_s: f64,
    #[serde(default)]
    costs: Costs,
    #[serde(rename = "node")]
    nodes: Vec<NodeFile>,
    program: Program,
    #[serde(rename = "scenario")]
    scenarios: Vec<ScenarioFile>,
}

fn default_duration() -> f64 {
    600.0
}

/// What things cost, in microseconds of CPU (or of latency). The defaults are this
/// host's measurements (README, "Measured"): see each field.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Costs {
    /// Handing a pCPU to another vCPU (`kumo bench switch --mechanism fifo`, median).
    pub switch_us: f64,
    /// From a message's arrival to the waiting vCPU noticing it when it is halted:
    /// the interrupt path (`kumo bench irq --path fast`, median).
    pub notify_us: f64,
    /// A DomU vCPU's own CPU to hand a message to its driver (netfront).
    pub send_us: f64,
    /// Domain 0's CPU per message and side (netback), plus per KiB copied.
    pub dom0_per_message_us: f64,
    pub dom0_per_kib_us: f64,
    /// Between nodes: wire latency and bandwidth (1 GbE: 125 MB/s).
    pub network_latency_us: f64,
    pub network_mb_s: f64,
}

impl Default for Costs {
    fn default() -> Self {
        Costs {
            switch_us: 29.0,
            notify_us: 45.0,
            send_us: 5.0,
            dom0_per_message_us: 25.0,
            dom0_per_kib_us: 0.5,
            network_latency_us: 30.0,
            network_mb_s: 125.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    name: String,
    pcpus: u32,
    #[serde(default = "one")]
    dom0_vcpus: u32,
    #[serde(default = "default_weight")]
    dom0_weight: u32,
    #[serde(rename = "domain")]
    domains: Vec<DomainFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainFile {
    name: String,
    #[serde(default = "one")]
    vcpus: u32,
    #[serde(default = "default_weight")]
    weight: u32,
    #[serde(default)]
    cap: u32,
}

fn one() -> u32 {
    1
}

fn default_weight() -> u32 {
    DEFAULT_WEIGHT
}

/// The program every rank runs: `iterations` times, compute, then exchange messages
/// with its peers by `pattern`, waiting for theirs by `wait`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Program {
    pub iterations: u32,
    pub compute_ms: f64,
    #[serde(default)]
    pub message_bytes: u64,
    #[serde(default = "default_pattern")]
    pub pattern: Pattern,
    #[serde(default = "default_wait")]
    pub wait: Wait,
}

fn default_pattern() -> Pattern {
    Pattern::Alltoall
}

fn default_wait() -> Wait {
    Wait::Spin
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// No messages (EP).
    None,
    /// Send to the next rank, receive from the previous one.
    Ring,
    /// Send to and receive from every other rank (reductions, transposes).
    Alltoall,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// MPI's busy-wait: the vCPU stays runnable and burns its pCPU (S1's case).
    Spin,
    /// Block until the message arrives (an interrupt-driven receive).
    Block,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: String,
    tslice_ms: Option<f64>,
    tick_ms: Option<f64>,
    ratelimit_us: Option<u64>,
    /// Domain 0's weight on every node (default: each node's own).
    dom0_weight: Option<u32>,
}

/// A validated simulation.
#[derive(Debug, Clone)]
pub struct Sim {
    pub duration_ns: u64,
    pub costs: Costs,
    pub nodes: Vec<Node>,
    pub program: Program,
    pub scenarios: Vec<Scenario>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    pub pcpus: u32,
    pub dom0_vcpus: u32,
    pub dom0_weight: u32,
    pub domains: Vec<Domain>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    pub name: String,
    pub vcpus: u32,
    pub weight: u32,
    pub cap: u32,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub params: sched::Params,
    pub dom0_weight: Option<u32>,
}

pub fn load(path: &Path) -> Result<Sim> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read simulation file {}", path.display()))?;
    parse(&text).with_context(|| format!("in simulation file {}", path.display()))
}

pub fn parse(text: &str) -> Result<Sim> {
    let file: SimFile = toml::from_str(text)?;
    validate(file)
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

fn validate(file: SimFile) -> Result<Sim> {
    if !(file.duration_s > 0.0 && file.duration_s <= 86_400.0) {
        bail!("duration_s must be above 0 and at most 86400 (one day)");
    }
    let c = file.costs;
    let named = [
        ("switch_us", c.switch_us),
        ("notify_us", c.notify_us),
        ("send_us", c.send_us),
        ("dom0_per_message_us", c.dom0_per_message_us),
        ("dom0_per_kib_us", c.dom0_per_kib_us),
        ("network_latency_us", c.network_latency_us),
    ];
    for (name, value) in named {
        if !(0.0..=1e6).contains(&value) {
            bail!("costs.{name} must be between 0 and 1000000 us");
        }
    }
    if !(c.network_mb_s > 0.0 && c.network_mb_s.is_finite()) {
        bail!("costs.network_mb_s must be above 0");
    }
    if file.nodes.is_empty() {
        bail!("no [[node]]: a cluster needs at least one");
    }
    let mut nodes = Vec::new();
    let mut ranks = 0u32;
    for n in file.nodes {
        if !(1..=sched::MAX_PCPUS).contains(&n.pcpus) {
            bail!(
                "node '{}': pcpus must be between 1 and {}",
                n.name,
                sched::MAX_PCPUS
            );
        }
        if !(1..=64).contains(&n.dom0_vcpus) {
            bail!("node '{}': dom0_vcpus must be between 1 and 64", n.name);
        }
        check_weight(&format!("node '{}' dom0", n.name), n.dom0_weight)?;
        if n.domains.is_empty() {
            bail!("node '{}' has no [[node.domain]]", n.name);
        }
        let mut domains = Vec::new();
        for d in n.domains {
            check_weight(&format!("domain '{}'", d.name), d.weight)?;
            if !(1..=64).contains(&d.vcpus) {
                bail!("domain '{}': vcpus must be between 1 and 64", d.name);
            }
            if d.cap > 100 * n.pcpus {
                bail!(
                    "domain '{}': cap {} is above {} (100 per pCPU of the node; 0 = no cap)",
                    d.name,
                    d.cap,
                    100 * n.pcpus
                );
            }
            ranks += d.vcpus;
            domains.push(Domain {
                name: d.name,
                vcpus: d.vcpus,
                weight: d.weight,
                cap: d.cap,
            });
        }
        nodes.push(Node {
            name: n.name,
            pcpus: n.pcpus,
            dom0_vcpus: n.dom0_vcpus,
            dom0_weight: n.dom0_weight,
            domains,
        });
    }
    let p = &file.program;
    if !(1..=10_000_000).contains(&p.iterations) {
        bail!("program.iterations must be between 1 and 10000000");
    }
    if !(p.compute_ms >= 0.0 && p.compute_ms <= 60_000.0) {
        bail!("program.compute_ms must be between 0 and 60000");
    }
    if p.message_bytes > 1 << 30 {
        bail!("program.message_bytes must be at most 1 GiB");
    }
    if ranks < 2 && p.pattern != Pattern::None {
        bail!(
            "program.pattern '{:?}' needs at least 2 ranks (domain vCPUs)",
            p.pattern
        );
    }
    if file.scenarios.is_empty() {
        bail!("no [[scenario]]: name at least one (e.g. Xen's defaults)");
    }
    let mut scenarios = Vec::new();
    for s in file.scenarios {
        let params = sched_params::from_update(SchedUpdate {
            tslice_ms: s.tslice_ms,
            tick_ms: s.tick_ms,
            ratelimit_us: s.ratelimit_us,
        })
        .with_context(|| format!("scenario '{}'", s.name))?;
        if let Some(w) = s.dom0_weight {
            check_weight(&format!("scenario '{}' dom0", s.name), w)?;
        }
        scenarios.push(Scenario {
            name: s.name,
            params,
            dom0_weight: s.dom0_weight,
        });
    }
    Ok(Sim {
        duration_ns: (file.duration_s * 1e9) as u64,
        costs: c,
        nodes,
        program: file.program,
        scenarios,
    })
}
