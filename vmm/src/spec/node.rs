//! The node file (`kumo node --config node.toml`): which host CPUs the node owns, the
//! scheduler's parameters, and its domains. Parsed strictly (unknown keys are errors:
//! a misspelt `weigth` must not silently become the default) and validated with
//! messages that name the domain and the allowed range.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use npb::Spec;
use serde::{Deserialize, Serialize};

use super::control::SchedUpdate;
use super::sched as sched_params;
use crate::guest;

/// Xen's defaults and `xl sched-credit` ranges.
pub const DEFAULT_WEIGHT: u32 = 256;
pub const WEIGHT_RANGE: (u32, u32) = (1, 65535);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    /// Host CPUs the node's vCPUs run on.
    pub pcpus: Vec<usize>,
    /// Scheduler parameters (absent: Xen's defaults).
    #[serde(default)]
    pub scheduler: SchedulerFile,
    #[serde(rename = "domain", default)]
    pub domains: Vec<DomainFile>,
    /// Domain 0: kumo's own backend threads, scheduled as one vCPU.
    #[serde(default)]
    pub dom0: Dom0File,
    pub network: Option<NetworkFile>,
}

/// `[network]`: one switch on domain 0's threads; every domain with `mpi = true` gets a
/// NIC on it and is a rank (in file order) of the node's MPI job.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// What the job runs: the guest's `net=` items (default "check").
    pub net: Option<String>,
    /// Or NPB-MPI benchmarks (`kumo mpi --npb`), judged on rank 0's domain.
    pub npb: Option<String>,
    /// How ranks wait: "spin" (default), "block" or "yield".
    pub wait: Option<String>,
    /// The NICs' interrupt path: "generic" (default) or "fast".
    pub irq_path: Option<String>,
    /// The NICs: "emulated" (default: domain 0's switch) or "passthrough" (a port each
    /// of a `kumo nic-server` the node starts: the hardware, outside the scheduler).
    pub nic: Option<String>,
    /// Ranks of the whole job when some run outside the node (default: the node's).
    pub job_size: Option<u32>,
    /// The rank of the node's first MPI domain (default 0).
    pub first_rank: Option<u32>,
    /// The wire to the job's other ranks, as `kumo mpi --wire`: `unix:PATH` or
    /// `tcp:HOST:PORT` connects, `listen:unix:PATH` or `listen:tcp:HOST:PORT` listens
    /// and takes a rank VM that moved as the same port.
    pub wire: Option<String>,
    /// Seconds the wire waits for its peer (default 30).
    pub wire_wait_s: Option<f64>,
}

/// The node's network, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    pub net: String,
    pub npb: Option<String>,
    pub wait: String,
    pub irq_path: hv::irq::IrqPath,
    pub nic: crate::spec::job::NicKind,
    /// Ranks of the whole job (None: the node's own).
    pub job_size: Option<u32>,
    pub first_rank: u32,
    pub wire: Option<crate::spec::job::WireSpec>,
    pub wire_wait: std::time::Duration,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dom0File {
    /// Its credit weight (default 256, as Xen's dom0).
    pub weight: Option<u32>,
    /// A modelled backend's CPU per frame the switch takes in, and per KiB, in
    /// microseconds (default 0: kumo's own cost only; see `docs/network.md`).
    pub frame_cost_us: Option<f64>,
    pub kib_cost_us: Option<f64>,
}

/// Largest modelled backend cost per frame or per KiB, in microseconds.
pub const MAX_BACKEND_COST_US: f64 = 1000.0;

/// Domain 0's modelled backend cost (zero: none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BackendCost {
    pub frame_us: f64,
    pub kib_us: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerFile {
    /// `credit` (default) or `host` (no kumo scheduler: Linux shares the pCPUs).
    pub kind: Option<String>,
    /// Milliseconds, or "auto": the scheduler picks it (`sched::auto_slice`).
    /// `tslice = "auto"` says the same.
    #[serde(alias = "tslice")]
    pub tslice_ms: Option<SliceFile>,
    pub tick_ms: Option<f64>,
    pub ratelimit_us: Option<u64>,
    /// "exact" (default) or "tick" (Xen 3.4).
    pub accounting: Option<super::control::Accounting>,
    /// Directed yield at barriers (default false).
    pub directed_yield: Option<bool>,
    /// Declared topology: every `cores_per_module` consecutive entries of `pcpus`
    /// share a module (a front end and L2, or SMT siblings), and the credit scheduler
    /// picks module-aware (`sched::Scheduler::set_modules`). Absent: no topology.
    pub cores_per_module: Option<u32>,
    /// The node's speed in percent of its pCPUs (1 to 100, default 100): a slower
    /// host, every domain capped at its weight share of this fraction of the pool
    /// (`sched::Scheduler::set_speed_percent`). Needs the credit scheduler.
    pub speed_percent: Option<u32>,
    /// Where the credit driver's thread runs: "auto" (default: beside the node where
    /// the process has a CPU outside it, else on the node), "beside" or "node"
    /// (`hv::credit::DriverPlace`).
    pub driver: Option<String>,
}

/// `tslice_ms`: a number of milliseconds, or "auto".
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum SliceFile {
    Ms(f64),
    Word(String),
}

impl SchedulerFile {
    /// The fixed slice the file gives (None: Xen's default, or auto's long setting),
    /// and whether it asks for the auto slice.
    pub fn slice(&self) -> Result<(Option<f64>, bool)> {
        match &self.tslice_ms {
            None => Ok((None, false)),
            Some(SliceFile::Ms(ms)) => Ok((Some(*ms), false)),
            Some(SliceFile::Word(w)) if w == "auto" => Ok((None, true)),
            Some(SliceFile::Word(w)) => {
                bail!("[scheduler] tslice_ms = \"{w}\": give milliseconds or \"auto\"")
            }
        }
    }

    /// The module topology of `pcpus` host CPUs that `cores_per_module` declares.
    pub fn modules(&self, pcpus: usize) -> Result<Option<sched::Modules>> {
        self.cores_per_module
            .map(|n| {
                sched::Modules::uniform(pcpus as u32, n).map_err(|e| anyhow!("[scheduler] {e}"))
            })
            .transpose()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainFile {
    pub name: String,
    #[serde(default = "one")]
    pub vcpus: u32,
    pub memory_mib: Option<u64>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Percent of one pCPU; 0 = no cap.
    #[serde(default)]
    pub cap: u32,
    /// NPB list, as `--npb`.
    #[serde(default)]
    pub npb: String,
    /// After the benchmarks, halt every vCPU for this long (a domain that exists but
    /// wants no CPU).
    pub idle_ms: Option<u64>,
    /// A guest probe after the benchmarks: `wake:MS:PERIOD_US` (wake-up latency of a
    /// halted vCPU), `busy:MS` (spin on every vCPU), `switch:MS`.
    pub probe: Option<String>,
    /// Drive kumo's interrupt test device: `check` or `bench:ROUNDS:CPU`.
    pub irq: Option<String>,
    /// The test device's interrupt path, `generic` (default) or `fast`; giving it
    /// attaches the device even without `irq`.
    pub irq_path: Option<String>,
    /// A rank of the node's MPI job (needs `[network]`).
    #[serde(default)]
    pub mpi: bool,
    /// MPI ranks per vCPU (1 to 16, with `mpi = true`), multiplexed by the guest's own
    /// scheduler (ranks of the domain talk through its shared memory).
    pub ranks_per_vcpu: Option<u32>,
    /// The guest scheduler's tick in Hz (1 to 5000; default 250 with ranks_per_vcpu
    /// above 1, else no tick).
    pub guest_hz: Option<u32>,
    /// How the guest's threads sleep at barriers: `hlt` (default) or `pv` (blocked
    /// in kumo through the paravirtual wait page).
    pub barrier_wait: Option<String>,
    /// vCPU ballooning (`kumo --vcpu-balloon`): `on` runs the guest's teams on as
    /// many vCPUs as the node has pcpus, `off` (default, as nodes were calibrated) one
    /// thread per vCPU, `auto` on when the domain's vCPUs outnumber the pcpus.
    pub vcpu_balloon: Option<String>,
    /// PCI devices assigned to the domain, as `--passthrough` (`vfio-user:PATH` or a
    /// host PCI address). In the MPI job: its ranks' NICs, one per vCPU, instead of
    /// the node's.
    #[serde(default)]
    pub passthrough: Vec<String>,
    /// Their interrupt path (default: `[network]`'s, else generic).
    pub passthrough_irq_path: Option<String>,
    /// A domain that arrives by migration: `tcp:HOST:PORT` where the node waits for
    /// it (`kumo ctl ... migrate --domain NAME --to tcp:HOST:PORT` on its node). Its
    /// vCPUs, memory, workload and NICs come with it; it runs under this node's
    /// scheduler with this entry's weight and cap, its NICs on this node's switch.
    pub incoming: Option<String>,
    /// With `incoming`: the file holding the secret the source must prove it knows
    /// (as `kumo --incoming --token-file`).
    pub token_file: Option<std::path::PathBuf>,
}

fn one() -> u32 {
    1
}

fn default_weight() -> u32 {
    DEFAULT_WEIGHT
}

/// A domain ready to run.
#[derive(Debug, Clone)]
pub struct Domain {
    pub name: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub weight: u32,
    pub cap: u32,
    pub specs: Vec<Spec>,
    pub idle_ms: Option<u64>,
    pub probe: Option<String>,
    pub irq: Option<String>,
    /// Attach the interrupt test device on this path.
    pub irq_path: Option<hv::irq::IrqPath>,
    /// The guest's barrier spin (short: domains share the node's CPUs).
    pub spin_us: u64,
    /// How the guest's threads sleep at barriers after the spin.
    pub barrier_wait: guest::BarrierWait,
    /// Whether the guest balloons (resolved against the node's pcpus).
    pub vcpu_balloon: bool,
    /// The domain's part of the node's MPI job, if it is in it.
    pub mpi: Option<MpiPart>,
    /// MPI ranks per vCPU, and the guest's tick (`ranks_per_vcpu=`, `guest_hz=`).
    pub ranks_per_vcpu: u32,
    pub guest_hz: Option<u32>,
    /// Its assigned devices (its ranks' NICs if it is in the MPI job).
    pub passthrough: Vec<hv::passthrough::PassthroughSpec>,
    pub passthrough_irq_path: hv::irq::IrqPath,
    /// It arrives by migration (nothing above but its name, weight and cap applies
    /// until it does).
    pub incoming: Option<Incoming>,
}

/// Where an incoming domain waits for its VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// `tcp:HOST:PORT`, as written.
    pub address: String,
    pub token_file: Option<std::path::PathBuf>,
}

/// Whether `address` is `tcp:HOST:PORT`.
fn is_tcp_address(address: &str) -> bool {
    address.strip_prefix("tcp:").is_some_and(|rest| {
        rest.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
    })
}

/// A domain's ranks in the node's MPI job: one per vCPU from `first`, each with a NIC.
#[derive(Debug, Clone, Default)]
pub struct MpiPart {
    pub first: u32,
    /// Ranks in the whole job.
    pub size: u32,
    /// The job's guest keys (`wait=`, `npb=` or `net=`).
    pub keys: String,
}

impl Domain {
    /// This domain's MPI ranks, in order (none if it is not in the job).
    pub fn ranks(&self) -> std::ops::Range<u32> {
        self.mpi
            .as_ref()
            .map_or(0..0, |part| part.first..part.first + self.local_ranks())
    }

    /// MPI ranks the domain runs if it is in the job: `ranks_per_vcpu` per vCPU.
    pub fn local_ranks(&self) -> u32 {
        self.vcpus * self.ranks_per_vcpu
    }

    /// The embedded guest's command line for this domain.
    pub fn cmdline(&self) -> String {
        let names: Vec<String> = self.specs.iter().map(ToString::to_string).collect();
        // In an NPB-MPI job the job's keys name the benchmarks for every rank.
        let mut line = match &self.mpi {
            Some(part) if part.keys.contains("npb=") => {
                guest::barrier_keys(self.spin_us, self.barrier_wait)
            }
            _ => format!(
                "npb={} {}{}",
                names.join(","),
                guest::barrier_keys(self.spin_us, self.barrier_wait),
                guest::balloon_keys(self.vcpu_balloon)
            ),
        };
        if let Some(ms) = self.idle_ms {
            line.push_str(&format!(" idle={ms}"));
        }
        if let Some(probe) = &self.probe {
            line.push_str(&format!(" probe={probe}"));
        }
        if let Some(irq) = &self.irq {
            line.push_str(&format!(" irq={irq}"));
        }
        if let Some(part) = &self.mpi {
            line.push_str(&format!(
                " mpi={}:{}:{} {}",
                part.first,
                part.size,
                self.local_ranks(),
                part.keys
            ));
        }
        if self.ranks_per_vcpu > 1 {
            line.push_str(&format!(" ranks_per_vcpu={}", self.ranks_per_vcpu));
        }
        if let Some(hz) = self.guest_hz {
            line.push_str(&format!(" guest_hz={hz}"));
        }
        line
    }
}

/// `check`, or `bench:ROUNDS:CPU` with numbers (the guest checks their ranges).
fn valid_irq_action(text: &str) -> bool {
    match text.split(':').collect::<Vec<_>>()[..] {
        ["check"] => true,
        ["bench", rounds, cpu] => rounds.parse::<u32>().is_ok() && cpu.parse::<u32>().is_ok(),
        _ => false,
    }
}

/// A validated node.
#[derive(Debug, Clone)]
pub struct Node {
    pub pcpus: Vec<usize>,
    pub scheduler: SchedulerFile,
    /// The credit scheduler's parameters (Xen's defaults for what the file omits).
    /// With `auto_slice`, those of its long setting.
    pub params: sched::Params,
    /// `tslice_ms = "auto"`: the scheduler picks its slice (`sched::auto_slice`).
    pub auto_slice: bool,
    /// `speed_percent`: the pool runs at this fraction of its pCPUs (100: full).
    pub speed_percent: u32,
    /// `driver`: where the credit driver runs.
    pub driver: hv::credit::DriverPlace,
    pub domains: Vec<Domain>,
    pub dom0_weight: u32,
    pub dom0_cost: BackendCost,
    pub network: Option<Network>,
}

impl Node {
    /// Whether kumo's credit scheduler runs the node (else the host shares the CPUs).
    pub fn uses_credit(&self) -> bool {
        self.scheduler.kind.as_deref() != Some("host")
    }
}

pub fn load(path: &Path) -> Result<Node> {
    let text = crate::input::read_config("node file", path)?;
    parse(&text).with_context(|| format!("in node file {}", path.display()))
}

/// Parses and validates a node file's text.
pub fn parse(text: &str) -> Result<Node> {
    let file: NodeFile = toml::from_str(text)?;
    let host_cpus = hv::placement::host_cpus();
    validate(file, host_cpus)
}

fn validate(file: NodeFile, host_cpus: usize) -> Result<Node> {
    if file.pcpus.is_empty() {
        bail!("pcpus is empty: name at least one host CPU");
    }
    let mut seen = BTreeSet::new();
    for &cpu in &file.pcpus {
        if cpu >= host_cpus {
            bail!(
                "pcpus names CPU {cpu}, but this host has CPUs 0..={}",
                host_cpus - 1
            );
        }
        if !seen.insert(cpu) {
            bail!("pcpus names CPU {cpu} twice");
        }
    }
    if let Some(kind) = &file.scheduler.kind
        && kind != "credit"
        && kind != "host"
    {
        bail!("scheduler.kind '{kind}' is unknown (known: credit, host)");
    }
    let (tslice_ms, auto_slice) = file.scheduler.slice()?;
    let params = sched_params::from_update(SchedUpdate {
        tslice_ms,
        tick_ms: file.scheduler.tick_ms,
        ratelimit_us: file.scheduler.ratelimit_us,
        accounting: file.scheduler.accounting,
        directed_yield: file.scheduler.directed_yield,
        auto_slice: None,
    })
    .context("[scheduler]")?;
    file.scheduler.modules(file.pcpus.len())?;
    let speed_percent = file.scheduler.speed_percent.unwrap_or(100);
    if !(1..=100).contains(&speed_percent) {
        bail!("[scheduler] speed_percent = {speed_percent}: give 1 to 100 (percent of the pCPUs)");
    }
    let driver = match file.scheduler.driver.as_deref() {
        None | Some("auto") => hv::credit::DriverPlace::Auto,
        Some("beside") => hv::credit::DriverPlace::Beside,
        Some("node") => hv::credit::DriverPlace::Node,
        Some(other) => bail!(
            "[scheduler] driver = {other:?}: give \"auto\", \"beside\" (the credit driver on a \
             CPU outside the node) or \"node\" (on the node's own CPUs)"
        ),
    };
    if driver != hv::credit::DriverPlace::Auto && file.scheduler.kind.as_deref() == Some("host") {
        bail!("[scheduler] driver needs kumo's credit scheduler (kind = \"host\" has none)");
    }
    if speed_percent < 100 && file.scheduler.kind.as_deref() == Some("host") {
        bail!("[scheduler] speed_percent needs kumo's credit scheduler (kind = \"host\" has none)");
    }
    let dom0_weight = file.dom0.weight.unwrap_or(DEFAULT_WEIGHT);
    if !(WEIGHT_RANGE.0..=WEIGHT_RANGE.1).contains(&dom0_weight) {
        bail!(
            "dom0: weight {dom0_weight} is outside {}..={}",
            WEIGHT_RANGE.0,
            WEIGHT_RANGE.1
        );
    }
    let cost = |what: &str, value: Option<f64>| -> Result<f64> {
        let us = value.unwrap_or(0.0);
        if !(0.0..=MAX_BACKEND_COST_US).contains(&us) {
            bail!("dom0: {what} {us} is outside 0..={MAX_BACKEND_COST_US} us");
        }
        Ok(us)
    };
    let dom0_cost = BackendCost {
        frame_us: cost("frame_cost_us", file.dom0.frame_cost_us)?,
        kib_us: cost("kib_cost_us", file.dom0.kib_cost_us)?,
    };
    if dom0_cost != BackendCost::default() && file.network.is_none() {
        bail!("dom0: frame_cost_us and kib_cost_us need a [network] (they cost its frames)");
    }
    if file.domains.is_empty() {
        bail!("no [[domain]]: a node needs at least one");
    }
    let max_cap = 100 * file.pcpus.len() as u32;
    let mut names = BTreeSet::new();
    let mut domains = Vec::new();
    for d in file.domains {
        let name = d.name.trim().to_string();
        if name.is_empty() || name.contains(char::is_whitespace) {
            bail!("domain name '{}' must be one non-empty word", d.name);
        }
        if name == hv::credit::DOM0_NAME {
            bail!("domain name '{name}' is reserved for domain 0 ([dom0] in the file)");
        }
        if !names.insert(name.clone()) {
            bail!("two domains are named '{name}'");
        }
        if !(WEIGHT_RANGE.0..=WEIGHT_RANGE.1).contains(&d.weight) {
            bail!(
                "domain '{name}': weight {} is outside {}..={}",
                d.weight,
                WEIGHT_RANGE.0,
                WEIGHT_RANGE.1
            );
        }
        if d.cap > max_cap {
            bail!(
                "domain '{name}': cap {} is above {max_cap} (100 per pCPU of the node; 0 = no cap)",
                d.cap
            );
        }
        if let Some(address) = &d.incoming {
            domains.push(incoming_domain(name, address, &d)?);
            continue;
        }
        if d.token_file.is_some() {
            bail!("domain '{name}': token_file applies to an incoming domain only");
        }
        guest::check_vcpus(d.vcpus).with_context(|| format!("domain '{name}'"))?;
        if d.vcpus == 0 {
            bail!("domain '{name}': vcpus must be at least 1");
        }
        let specs = if d.npb.trim().is_empty() {
            Vec::new()
        } else {
            guest::parse_specs(&d.npb).with_context(|| format!("domain '{name}'"))?
        };
        if specs.is_empty() && d.idle_ms.is_none() && d.probe.is_none() && d.irq.is_none() && !d.mpi
        {
            bail!("domain '{name}' has no workload: give npb, idle_ms, probe, irq and/or mpi");
        }
        if d.mpi && file.network.is_none() {
            bail!("domain '{name}': mpi = true needs a [network]");
        }
        let ranks_per_vcpu = d.ranks_per_vcpu.unwrap_or(1);
        if !(1..=crate::spec::job::MAX_RANKS_PER_VCPU).contains(&ranks_per_vcpu) {
            bail!(
                "domain '{name}': ranks_per_vcpu must be between 1 and {}, not {ranks_per_vcpu}",
                crate::spec::job::MAX_RANKS_PER_VCPU
            );
        }
        if ranks_per_vcpu > 1 && !d.mpi {
            bail!("domain '{name}': ranks_per_vcpu needs mpi = true");
        }
        if let Some(hz) = d.guest_hz
            && !(1..=crate::spec::job::MAX_GUEST_HZ).contains(&hz)
        {
            bail!(
                "domain '{name}': guest_hz must be between 1 and {}, not {hz}",
                crate::spec::job::MAX_GUEST_HZ
            );
        }
        if let Some(irq) = &d.irq
            && !valid_irq_action(irq)
        {
            bail!("domain '{name}': irq '{irq}' is not 'check' or 'bench:ROUNDS:CPU'");
        }
        let irq_path = match (&d.irq_path, &d.irq) {
            (Some(path), _) => Some(
                path.parse::<hv::irq::IrqPath>()
                    .map_err(|e| anyhow::anyhow!("domain '{name}': irq_path: {e}"))?,
            ),
            (None, Some(_)) => Some(hv::irq::IrqPath::Generic),
            (None, None) => None,
        };
        if let Some(probe) = &d.probe
            && (probe.is_empty() || !probe.chars().all(|c| c.is_ascii_alphanumeric() || c == ':'))
        {
            bail!("domain '{name}': probe '{probe}' is not of the form kind:number[:number]");
        }
        if d.idle_ms.is_some_and(|ms| ms > 3_600_000) {
            bail!("domain '{name}': idle_ms is above 3600000 (one hour)");
        }
        let memory_mib = guest::choose_memory_mib(d.memory_mib, &specs, d.vcpus)
            .with_context(|| format!("domain '{name}'"))?;
        // Nodes halt unless told otherwise: their CPU sharing (and S1's calibration
        // runs) was measured that way; `pv` is measured for single VMs so far.
        let barrier_wait = match d.barrier_wait.as_deref() {
            None | Some("hlt") => guest::BarrierWait::Hlt,
            Some("pv") => guest::BarrierWait::Pv,
            Some(other) => bail!("domain '{name}': barrier_wait '{other}' is not 'pv' or 'hlt'"),
        };
        let vcpu_balloon = match d.vcpu_balloon.as_deref() {
            None | Some("off") => false,
            Some("on") => true,
            Some("auto") => d.vcpus as usize > file.pcpus.len(),
            Some(other) => {
                bail!("domain '{name}': vcpu_balloon '{other}' is not 'on', 'off' or 'auto'")
            }
        };
        if vcpu_balloon && d.mpi {
            bail!(
                "domain '{name}': vcpu_balloon is for its NPB teams; an MPI rank runs on each \
                 vCPU (leave vcpu_balloon out)"
            );
        }
        let passthrough = d
            .passthrough
            .iter()
            .map(|text| super::devices::passthrough_spec(text))
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("domain '{name}'"))?;
        let local = d.vcpus.saturating_mul(ranks_per_vcpu);
        if d.mpi && !passthrough.is_empty() && passthrough.len() != local as usize {
            bail!(
                "domain '{name}': its passthrough devices are its ranks' NICs: give one per \
                 rank ({local}), not {}",
                passthrough.len()
            );
        }
        let network_path = file.network.as_ref().and_then(|n| n.irq_path.clone());
        let passthrough_irq_path = d
            .passthrough_irq_path
            .or(network_path)
            .map(|path| path.parse::<hv::irq::IrqPath>())
            .transpose()
            .map_err(|e| anyhow::anyhow!("domain '{name}': passthrough_irq_path: {e}"))?
            .unwrap_or(hv::irq::IrqPath::Generic);
        domains.push(Domain {
            name,
            vcpus: d.vcpus,
            memory_mib,
            weight: d.weight,
            cap: d.cap,
            specs,
            idle_ms: d.idle_ms,
            probe: d.probe,
            irq: d.irq,
            irq_path,
            spin_us: 0,
            barrier_wait,
            vcpu_balloon,
            mpi: d.mpi.then(MpiPart::default),
            ranks_per_vcpu,
            guest_hz: d.guest_hz,
            passthrough,
            passthrough_irq_path,
            incoming: None,
        });
    }
    let network = file.network.map(validate_network).transpose()?;
    if let Some(network) = &network {
        // ranks_per_vcpu ranks per vCPU of every domain in the job.
        let ranks: u32 = domains
            .iter()
            .filter(|d| d.mpi.is_some())
            .map(Domain::local_ranks)
            .sum();
        let here = ranks;
        let ranks = network
            .job_size
            .unwrap_or(network.first_rank.saturating_add(here));
        if !(2..=crate::spec::job::MAX_RANKS).contains(&ranks) {
            bail!(
                "[network]: the MPI job needs 2 to {} ranks (one per vCPU of the domains with \
                 mpi = true, or job_size), not {ranks}",
                crate::spec::job::MAX_RANKS
            );
        }
        if network.first_rank.saturating_add(here) > ranks {
            bail!(
                "[network]: the node's {here} ranks from first_rank {} do not fit a job of {ranks}",
                network.first_rank
            );
        }
        if here < ranks && network.wire.is_none() {
            bail!(
                "[network]: {} of the job's {ranks} ranks run outside the node: give a wire",
                ranks - here
            );
        }
        let (keys, npb) = match &network.npb {
            Some(list) => {
                let specs = crate::spec::job::parse_npb(list, ranks).context("[network]")?;
                let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
                (
                    format!("wait={} npb={}", network.wait, names.join(",")),
                    Some(specs),
                )
            }
            None => (format!("wait={} net={}", network.wait, network.net), None),
        };
        let mut first = network.first_rank;
        for d in domains.iter_mut().filter(|d| d.mpi.is_some()) {
            // The domain's memory: each rank's part of the largest kernel, or the MPI
            // runtime's rings and the check's 16 MiB exchange.
            let need = match &npb {
                Some(specs) => {
                    if !d.specs.is_empty() {
                        bail!(
                            "domain '{}': a domain in the node's NPB-MPI job has no npb of its own",
                            d.name
                        );
                    }
                    // Rank 0 prints the job's results: its domain is judged on them.
                    if first == 0 {
                        d.specs = specs.clone();
                    }
                    crate::spec::job::npb_memory_mib(specs, ranks, d.local_ranks())
                }
                None => crate::spec::job::MEMORY_MIB * u64::from(d.local_ranks()),
            };
            d.memory_mib = d.memory_mib.max(need);
            d.mpi = Some(MpiPart {
                first,
                size: ranks,
                keys: keys.clone(),
            });
            first += d.local_ranks();
        }
    }
    // Domains share the node's CPUs unless every vCPU has one of its own.
    let total_vcpus: u32 = domains
        .iter()
        .filter(|d| d.incoming.is_none())
        .map(|d| d.vcpus)
        .sum();
    let spin = guest::barrier_spin_us(total_vcpus, file.pcpus.len());
    for d in &mut domains {
        // Ranks that share a vCPU wait for each other on it: a wait that yields must
        // hand it over soon, whatever the node's density.
        d.spin_us = if d.ranks_per_vcpu > 1 {
            guest::SHARED_SPIN_US
        } else {
            spin
        };
    }
    Ok(Node {
        pcpus: file.pcpus,
        scheduler: file.scheduler,
        params,
        auto_slice,
        speed_percent,
        driver,
        domains,
        dom0_weight,
        dom0_cost,
        network,
    })
}

/// The guest's `net=` grammar (`guests/user/src/network.rs`, `parse_net`) with the
/// limits kernel, runtime and kumo share (`kumo_abi::net`). Checked here so a bad value
/// is one line before any guest runs, not an error from every guest.
fn check_net_items(net: &str) -> Result<(), String> {
    use kumo_abi::net::{MAX_ITEMS, MAX_MESSAGE as MAX_SIZE, MAX_SIZES};
    let items: Vec<&str> = net.split('+').collect();
    if items.len() > MAX_ITEMS {
        return Err(format!("{} items, at most {MAX_ITEMS}", items.len()));
    }
    for item in items {
        if item == "check" {
            continue;
        }
        let Some(sizes) = item
            .strip_prefix("pingpong:")
            .or_else(|| item.strip_prefix("bw:"))
        else {
            return Err(format!("'{item}' is not check, pingpong:SIZES or bw:SIZES"));
        };
        let sizes: Vec<&str> = sizes.split(',').collect();
        if sizes.len() > MAX_SIZES {
            return Err(format!(
                "'{item}' has {} sizes, at most {MAX_SIZES}",
                sizes.len()
            ));
        }
        for size in sizes {
            match size.parse::<u64>() {
                Ok(n) if n <= MAX_SIZE => {}
                _ => {
                    return Err(format!(
                        "'{size}' in '{item}' is not a size of at most {MAX_SIZE} bytes"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A domain that arrives by migration: its name, weight and cap from the file,
/// everything else from the VM it receives.
fn incoming_domain(name: String, address: &str, d: &DomainFile) -> Result<Domain> {
    if !is_tcp_address(address) {
        bail!("domain '{name}': incoming '{address}' is not tcp:HOST:PORT");
    }
    let given = [
        ("npb", !d.npb.trim().is_empty()),
        ("mpi", d.mpi),
        ("memory_mib", d.memory_mib.is_some()),
        ("idle_ms", d.idle_ms.is_some()),
        ("probe", d.probe.is_some()),
        ("irq", d.irq.is_some()),
        ("irq_path", d.irq_path.is_some()),
        ("ranks_per_vcpu", d.ranks_per_vcpu.is_some()),
        ("guest_hz", d.guest_hz.is_some()),
        ("barrier_wait", d.barrier_wait.is_some()),
        ("vcpu_balloon", d.vcpu_balloon.is_some()),
        ("passthrough", !d.passthrough.is_empty()),
        ("passthrough_irq_path", d.passthrough_irq_path.is_some()),
    ];
    if let Some((key, _)) = given.iter().find(|(_, set)| *set) {
        bail!(
            "domain '{name}': an incoming domain brings its workload, memory and devices \
             with it: leave out {key}"
        );
    }
    Ok(Domain {
        name,
        vcpus: d.vcpus,
        memory_mib: 0,
        weight: d.weight,
        cap: d.cap,
        specs: Vec::new(),
        idle_ms: None,
        probe: None,
        irq: None,
        irq_path: None,
        spin_us: 0,
        barrier_wait: guest::BarrierWait::Hlt,
        vcpu_balloon: false,
        mpi: None,
        ranks_per_vcpu: 1,
        guest_hz: None,
        passthrough: Vec::new(),
        passthrough_irq_path: hv::irq::IrqPath::Generic,
        incoming: Some(Incoming {
            address: address.to_string(),
            token_file: d.token_file.clone(),
        }),
    })
}

fn validate_network(file: NetworkFile) -> Result<Network> {
    if file.npb.is_some() && file.net.is_some() {
        bail!("[network]: give net (the guests' network workloads) or npb (NPB-MPI), not both");
    }
    let net = file.net.unwrap_or_else(|| "check".into());
    if let Err(problem) = check_net_items(&net) {
        bail!("[network]: net '{net}' is not a list of the guest's net= items: {problem}");
    }
    let wait = file.wait.unwrap_or_else(|| "spin".into());
    if wait != "spin" && wait != "block" && wait != "yield" {
        bail!("[network]: wait '{wait}' is not spin, block or yield");
    }
    let irq_path = match file.irq_path {
        Some(path) => path
            .parse()
            .map_err(|e| anyhow::anyhow!("[network]: irq_path: {e}"))?,
        None => hv::irq::IrqPath::Generic,
    };
    let nic = match file.nic.as_deref() {
        None | Some("emulated") => crate::spec::job::NicKind::Emulated,
        Some("passthrough") => crate::spec::job::NicKind::Passthrough,
        Some(other) => bail!("[network]: nic '{other}' is not emulated or passthrough"),
    };
    let wire = file
        .wire
        .map(|text| text.parse::<crate::spec::job::WireSpec>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("[network]: wire: {e}"))?;
    if wire.is_some() && nic == crate::spec::job::NicKind::Passthrough {
        bail!(
            "[network]: a wire joins domain 0's switch: it does not apply to nic = \"passthrough\""
        );
    }
    let wire_wait_s = file.wire_wait_s.unwrap_or(30.0);
    if !(0.0..=3600.0).contains(&wire_wait_s) {
        bail!("[network]: wire_wait_s {wire_wait_s} is not 0 to 3600");
    }
    Ok(Network {
        net,
        npb: file.npb,
        wait,
        irq_path,
        nic,
        job_size: file.job_size,
        first_rank: file.first_rank.unwrap_or(0),
        wire,
        wire_wait: std::time::Duration::from_secs_f64(wire_wait_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: &str) -> Result<Node> {
        validate(toml::from_str(text)?, 2)
    }

    const TWO: &str = r#"
pcpus = [0]
[[domain]]
name = "light"
weight = 256
npb = "ep.S"
[[domain]]
name = "heavy"
weight = 512
cap = 50
npb = "ep.S"
"#;

    #[test]
    fn a_two_domain_node_parses_with_defaults() {
        let n = node(TWO).unwrap();
        assert_eq!(n.pcpus, vec![0]);
        assert_eq!(n.domains.len(), 2);
        assert_eq!(n.domains[0].name, "light");
        assert_eq!(n.domains[0].vcpus, 1);
        assert_eq!(n.domains[0].cap, 0);
        assert_eq!(n.domains[1].weight, 512);
        assert_eq!(n.domains[1].cap, 50);
        assert!(n.domains[0].memory_mib >= 64);
        assert_eq!(n.scheduler.kind, None);
    }

    fn error(text: &str) -> String {
        format!("{:#}", node(text).unwrap_err())
    }

    #[test]
    fn the_driver_runs_where_the_file_says() {
        use hv::credit::DriverPlace;
        let d = "[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        let with = |line: &str| node(&format!("pcpus = [0]\n[scheduler]\n{line}\n{d}"));
        assert_eq!(node(TWO).unwrap().driver, DriverPlace::Auto);
        assert_eq!(with("driver = \"auto\"").unwrap().driver, DriverPlace::Auto);
        assert_eq!(
            with("driver = \"beside\"").unwrap().driver,
            DriverPlace::Beside
        );
        assert_eq!(with("driver = \"node\"").unwrap().driver, DriverPlace::Node);
        assert!(
            error(&format!("pcpus = [0]\n[scheduler]\ndriver = \"cpu1\"\n{d}"))
                .contains("\"beside\"")
        );
        assert!(
            error(&format!(
                "pcpus = [0]\n[scheduler]\nkind = \"host\"\ndriver = \"node\"\n{d}"
            ))
            .contains("needs kumo's credit scheduler")
        );
    }

    #[test]
    fn the_slice_is_milliseconds_or_auto() {
        let d = "[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        let with = |slice: &str| node(&format!("pcpus = [0]\n[scheduler]\n{slice}\n{d}"));
        let fixed = with("tslice_ms = 1").unwrap();
        assert!(!fixed.auto_slice);
        assert_eq!(fixed.params.tslice_ns, sched::NS_PER_MS);
        // Auto starts from the rest of the file: Xen's defaults here, a tick given.
        let auto = with("tslice_ms = \"auto\"").unwrap();
        assert!(auto.auto_slice);
        assert_eq!(auto.params, sched::Params::default());
        let auto = with("tslice_ms = \"auto\"\ntick_ms = 5\naccounting = \"tick\"").unwrap();
        assert!(auto.auto_slice);
        assert_eq!(auto.params.tick_ns, 5 * sched::NS_PER_MS);
        assert_eq!(auto.params.accounting, sched::Accounting::Tick);
        assert!(with("tslice = \"auto\"").unwrap().auto_slice);
        assert!(!node(TWO).unwrap().auto_slice);
        let e = format!("{:#}", with("tslice_ms = \"fast\"").unwrap_err());
        assert!(e.contains("give milliseconds or \"auto\""), "{e}");
    }

    #[test]
    fn the_speed_is_a_percentage_for_the_credit_scheduler() {
        let d = "[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        let with = |keys: &str| node(&format!("pcpus = [0]\n[scheduler]\n{keys}\n{d}"));
        assert_eq!(
            node(TWO).unwrap().speed_percent,
            100,
            "full speed by default"
        );
        assert_eq!(with("speed_percent = 50").unwrap().speed_percent, 50);
        for bad in ["speed_percent = 0", "speed_percent = 101"] {
            let e = format!("{:#}", with(bad).unwrap_err());
            assert!(e.contains("give 1 to 100"), "{bad}: {e}");
        }
        let e = format!(
            "{:#}",
            with("kind = \"host\"\nspeed_percent = 50").unwrap_err()
        );
        assert!(e.contains("needs kumo's credit scheduler"), "{e}");
    }

    #[test]
    fn a_declared_module_topology_is_checked_against_the_pcpus() {
        let d = "[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        let n = node(&format!("pcpus = [0]\n{d}")).unwrap();
        assert!(n.scheduler.modules(1).unwrap().is_none(), "off by default");
        let n = node(&format!(
            "pcpus = [0]\n[scheduler]\ncores_per_module = 1\n{d}"
        ))
        .unwrap();
        assert_eq!(
            n.scheduler.modules(1).unwrap().map(|m| m.modules()),
            Some(1)
        );
        // Two host CPUs as one module (this host's, declared): one module of two.
        assert_eq!(
            n.scheduler.modules(2).unwrap().map(|m| m.modules()),
            Some(2)
        );
        let two = SchedulerFile {
            cores_per_module: Some(2),
            ..SchedulerFile::default()
        };
        assert_eq!(two.modules(2).unwrap().map(|m| m.modules()), Some(1));
        let err = error(&format!(
            "pcpus = [0]\n[scheduler]\ncores_per_module = 2\n{d}"
        ));
        assert!(
            err.contains("cores_per_module = 2") && err.contains("divide"),
            "{err}"
        );
    }

    #[test]
    fn bad_nodes_are_refused_with_the_reason() {
        let d = "[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        assert!(error(&format!("pcpus = []\n{d}")).contains("pcpus is empty"));
        assert!(error(&format!("pcpus = [7]\n{d}")).contains("this host has CPUs 0..=1"));
        assert!(error(&format!("pcpus = [0, 0]\n{d}")).contains("CPU 0 twice"));
        assert!(error("pcpus = [0]\n").contains("no [[domain]]"));
        assert!(error(&format!("pcpus = [0]\n{d}{d}")).contains("two domains are named 'a'"));
        let weight = "pcpus = [0]\n[[domain]]\nname = \"a\"\nweight = 0\nnpb = \"ep.S\"\n";
        assert!(error(weight).contains("weight 0 is outside 1..=65535"));
        let cap = "pcpus = [0]\n[[domain]]\nname = \"a\"\ncap = 101\nnpb = \"ep.S\"\n";
        assert!(error(cap).contains("cap 101 is above 100"));
        let typo = "pcpus = [0]\n[[domain]]\nname = \"a\"\nweigth = 5\nnpb = \"ep.S\"\n";
        assert!(
            error(typo).contains("unknown field `weigth`"),
            "{}",
            error(typo)
        );
        let bench = "pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"xx.S\"\n";
        assert!(error(bench).contains("domain 'a'"));
        let cost = format!("pcpus = [0]\n[dom0]\nframe_cost_us = 20\n{d}");
        assert!(
            error(&cost).contains("need a [network]"),
            "{}",
            error(&cost)
        );
        let mpi = "[network]\nnpb = \"cg.S\"\n[[domain]]\nname = \"a\"\nmpi = true\nvcpus = 2\n";
        let cost = format!("pcpus = [0]\n[dom0]\nkib_cost_us = -1\n{mpi}");
        assert!(error(&cost).contains("kib_cost_us -1 is outside 0..=1000 us"));
        let cost = format!("pcpus = [0]\n[dom0]\nframe_cost_us = nan\n{mpi}");
        assert!(
            error(&cost).contains("frame_cost_us NaN is outside"),
            "{}",
            error(&cost)
        );
        let costed = node(&format!(
            "pcpus = [0]\n[dom0]\nframe_cost_us = 20\nkib_cost_us = 5\n{mpi}"
        ))
        .unwrap();
        assert_eq!(
            (costed.dom0_cost.frame_us, costed.dom0_cost.kib_us),
            (20.0, 5.0)
        );
        let kind = format!("pcpus = [0]\n[scheduler]\nkind = \"rr\"\n{d}");
        assert!(error(&kind).contains("unknown (known: credit, host)"));
        let vcpus = "pcpus = [0]\n[[domain]]\nname = \"a\"\nvcpus = 0\nnpb = \"ep.S\"\n";
        assert!(error(vcpus).contains("domain 'a'"));
        let nothing = "pcpus = [0]\n[[domain]]\nname = \"a\"\n";
        assert!(error(nothing).contains("has no workload"));
        let idle = node("pcpus = [0]\n[[domain]]\nname = \"a\"\nidle_ms = 500\n").unwrap();
        assert_eq!(idle.domains[0].cmdline(), "npb= spin_us=2000 idle=500");
        let wait =
            "pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\nbarrier_wait = \"spin\"\n";
        assert!(error(wait).contains("barrier_wait 'spin' is not 'pv' or 'hlt'"));
        let pv =
            node("pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\nbarrier_wait = \"pv\"\n")
                .unwrap();
        assert_eq!(pv.domains[0].cmdline(), "npb=ep.S spin_us=2000 pvwait=1");
    }

    #[test]
    fn vcpu_balloon_keys() {
        let domain = |key: &str| {
            format!("pcpus = [0]\n[[domain]]\nname = \"a\"\nvcpus = 4\nnpb = \"ep.S\"\n{key}")
        };
        for (key, on) in [
            ("", false),
            ("vcpu_balloon = \"off\"\n", false),
            ("vcpu_balloon = \"on\"\n", true),
            ("vcpu_balloon = \"auto\"\n", true),
        ] {
            let line = node(&domain(key)).unwrap().domains[0].cmdline();
            assert_eq!(line.contains(" balloon=1"), on, "{key}: {line}");
        }
        let bad = error(&domain("vcpu_balloon = \"yes\"\n"));
        assert!(bad.contains("vcpu_balloon 'yes' is not"), "{bad}");
    }

    #[test]
    fn interrupt_test_device_keys() {
        let base = "pcpus = [0]\n[[domain]]\nname = \"a\"\n";
        let check = node(&format!("{base}irq = \"check\"\nirq_path = \"fast\"\n")).unwrap();
        assert_eq!(check.domains[0].irq_path, Some(hv::irq::IrqPath::Fast));
        assert!(check.domains[0].cmdline().ends_with(" irq=check"));
        let bench = node(&format!("{base}irq = \"bench:100:0\"\n")).unwrap();
        assert_eq!(bench.domains[0].irq_path, Some(hv::irq::IrqPath::Generic));
        let device_only = node(&format!("{base}npb = \"ep.S\"\nirq_path = \"generic\"\n")).unwrap();
        assert_eq!(
            device_only.domains[0].irq_path,
            Some(hv::irq::IrqPath::Generic)
        );
        let plain = node(&format!("{base}npb = \"ep.S\"\n")).unwrap();
        assert_eq!(plain.domains[0].irq_path, None);
        let error = |extra: &str| format!("{:#}", node(&format!("{base}{extra}")).unwrap_err());
        assert!(error("irq = \"bench:x:0\"\n").contains("not 'check' or 'bench:ROUNDS:CPU'"));
        assert!(
            error("irq = \"check\"\nirq_path = \"posted\"\n")
                .contains("unknown interrupt path 'posted'")
        );
    }

    #[test]
    fn assigned_devices_are_checked_and_are_an_mpi_domains_nics() {
        let net = "pcpus = [0]\n[network]\nirq_path = \"fast\"\n";
        let two = "[[domain]]\nname = \"b\"\nmpi = true\n";
        let own = node(&format!(
            "{net}[[domain]]\nname = \"a\"\nmpi = true\nvcpus = 2\n\
             passthrough = [\"vfio-user:/tmp/p0.sock\", \"vfio-user:/tmp/p1.sock\"]\n{two}"
        ))
        .unwrap();
        let a = &own.domains[0];
        assert_eq!(a.passthrough.len(), 2);
        assert_eq!(a.passthrough[1].to_string(), "vfio-user:/tmp/p1.sock");
        assert_eq!(
            a.passthrough_irq_path,
            hv::irq::IrqPath::Fast,
            "[network]'s path"
        );
        assert!(own.domains[1].passthrough.is_empty());
        let alone = node(
            "pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n\
             passthrough = [\"vfio-user:/x\"]\n",
        )
        .unwrap();
        assert_eq!(
            alone.domains[0].passthrough_irq_path,
            hv::irq::IrqPath::Generic
        );
        let error = |text: &str| format!("{:#}", node(text).unwrap_err());
        let one_of_two = format!(
            "{net}[[domain]]\nname = \"a\"\nmpi = true\nvcpus = 2\n\
             passthrough = [\"vfio-user:/tmp/p0.sock\"]\n{two}"
        );
        assert!(error(&one_of_two).contains("give one per rank (2), not 1"));
        let base = "pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\n";
        assert!(
            error(&format!("{base}passthrough = [\"vfio-user:\"]\n"))
                .contains("domain 'a': --passthrough vfio-user: needs a socket path")
        );
        assert!(error(&format!("{base}passthrough = [\"0000:3:00.0\"]\n")).contains("domain 'a'"));
        assert!(
            error(&format!(
                "{base}passthrough = [\"vfio-user:/x\"]\npassthrough_irq_path = \"posted\"\n"
            ))
            .contains("passthrough_irq_path: unknown interrupt path 'posted'")
        );
    }

    #[test]
    fn a_network_numbers_its_mpi_domains_in_file_order() {
        let n = node(
            r#"
pcpus = [0]
[network]
wait = "block"
irq_path = "fast"
[[domain]]
name = "a"
mpi = true
[[domain]]
name = "other"
npb = "ep.S"
[[domain]]
name = "b"
mpi = true
"#,
        )
        .unwrap();
        let net = n.network.as_ref().unwrap();
        assert_eq!((net.net.as_str(), net.wait.as_str()), ("check", "block"));
        assert_eq!(net.irq_path, hv::irq::IrqPath::Fast);
        assert_eq!(net.nic, crate::spec::job::NicKind::Emulated);
        let two = "[[domain]]\nname = \"a\"\nmpi = true\n[[domain]]\nname = \"b\"\nmpi = true\n";
        let passthrough = node(&format!(
            "pcpus = [0]\n[network]\nnic = \"passthrough\"\n{two}"
        ))
        .unwrap();
        assert_eq!(
            passthrough.network.unwrap().nic,
            crate::spec::job::NicKind::Passthrough
        );
        let bad = node(&format!("pcpus = [0]\n[network]\nnic = \"sriov\"\n{two}")).unwrap_err();
        assert!(
            bad.to_string()
                .contains("nic 'sriov' is not emulated or passthrough"),
            "{bad}"
        );
        assert!(
            n.domains[0]
                .cmdline()
                .ends_with("mpi=0:2:1 wait=block net=check")
        );
        assert!(
            n.domains[2]
                .cmdline()
                .ends_with("mpi=1:2:1 wait=block net=check")
        );
        assert!(!n.domains[1].cmdline().contains("mpi="));
        assert!(n.domains[0].memory_mib >= crate::spec::job::MEMORY_MIB);
    }

    #[test]
    fn a_domain_runs_ranks_per_vcpu_ranks_on_each_vcpu_with_its_guest_tick() {
        let n = node(
            r#"
pcpus = [0]
[network]
npb = "cg.S"
[[domain]]
name = "a"
mpi = true
ranks_per_vcpu = 2
[[domain]]
name = "b"
mpi = true
vcpus = 2
ranks_per_vcpu = 3
guest_hz = 1000
"#,
        );
        // 2 + 2 x 3 = 8 ranks; CG takes powers of two.
        let n = n.unwrap();
        // Ranks sharing a vCPU hand it over after a short poll, even where every vCPU
        // has a host CPU of its own.
        let two_cpus = node(
            "pcpus = [0, 1]\n[network]\nnpb = \"cg.S\"\nwait = \"yield\"\n\
             [[domain]]\nname = \"a\"\nmpi = true\nranks_per_vcpu = 2\n\
             [[domain]]\nname = \"b\"\nmpi = true\nranks_per_vcpu = 2\n",
        )
        .unwrap();
        for d in &two_cpus.domains {
            assert!(
                d.cmdline()
                    .starts_with(&format!("spin_us={} ", guest::SHARED_SPIN_US)),
                "{}",
                d.cmdline()
            );
        }
        assert_eq!(n.domains[0].ranks(), 0..2);
        assert_eq!(n.domains[1].ranks(), 2..8);
        assert!(
            n.domains[0]
                .cmdline()
                .ends_with("mpi=0:8:2 wait=spin npb=cg.S ranks_per_vcpu=2"),
            "{}",
            n.domains[0].cmdline()
        );
        assert!(
            n.domains[1]
                .cmdline()
                .ends_with("mpi=2:8:6 wait=spin npb=cg.S ranks_per_vcpu=3 guest_hz=1000")
        );
        let base = "pcpus = [0]\n[network]\n[[domain]]\nname = \"a\"\n";
        for (key, needle) in [
            (
                "mpi = true\nranks_per_vcpu = 0\n",
                "domain 'a': ranks_per_vcpu must be between 1 and 16, not 0",
            ),
            (
                "mpi = true\nranks_per_vcpu = 17\n",
                "domain 'a': ranks_per_vcpu must be between 1 and 16, not 17",
            ),
            (
                "npb = \"ep.S\"\nranks_per_vcpu = 2\n",
                "domain 'a': ranks_per_vcpu needs mpi = true",
            ),
            (
                "mpi = true\nguest_hz = 0\n",
                "domain 'a': guest_hz must be between 1 and 5000, not 0",
            ),
        ] {
            let e = error(&format!("{base}{key}"));
            assert!(e.contains(needle), "{key}: {e}");
        }
    }

    #[test]
    fn a_node_can_hold_part_of_a_job_whose_other_ranks_are_across_a_wire() {
        let two = "[[domain]]\nname = \"a\"\nmpi = true\n[[domain]]\nname = \"b\"\nmpi = true\n";
        let net = "pcpus = [0]\n[network]\nnpb = \"cg.S\"\n";
        let n = node(&format!(
            "{net}job_size = 4\nfirst_rank = 1\nwire = \"unix:/tmp/w\"\nwire_wait_s = 5\n{two}"
        ))
        .unwrap();
        let network = n.network.as_ref().unwrap();
        assert_eq!(
            network.wire,
            Some(crate::spec::job::WireSpec::Connect(
                crate::spec::job::WireAddr::Unix("/tmp/w".into())
            ))
        );
        let tcp = node(&format!(
            "{net}job_size = 4\nfirst_rank = 1\nwire = \"listen:tcp:[::]:7000\"\n{two}"
        ))
        .unwrap();
        assert_eq!(
            tcp.network.unwrap().wire,
            Some(crate::spec::job::WireSpec::Listen(
                crate::spec::job::WireAddr::Tcp {
                    host: "::".into(),
                    port: 7000
                }
            ))
        );
        assert_eq!(network.wire_wait, std::time::Duration::from_secs(5));
        assert!(n.domains[0].cmdline().contains("mpi=1:4:1"));
        assert!(n.domains[1].cmdline().contains("mpi=2:4:1"));
        // Rank 0 runs elsewhere: no domain here is judged on the job's results.
        assert!(n.domains.iter().all(|d| d.specs.is_empty()));
        for (extra, needle) in [
            (
                "job_size = 4\n",
                "2 of the job's 4 ranks run outside the node: give a wire",
            ),
            (
                "job_size = 2\nfirst_rank = 1\nwire = \"unix:/w\"\n",
                "do not fit a job of 2",
            ),
            ("job_size = 99\nwire = \"unix:/w\"\n", "needs 2 to"),
            (
                "wire = \"tcp:x\"\n",
                "[network]: wire: \"tcp:x\": no :PORT; a wire is unix:PATH or tcp:HOST:PORT",
            ),
            ("wire = \"tcp:x:0\"\n", "port 0 names no peer to connect to"),
            (
                "wire = \"unix:/w\"\nwire_wait_s = -1\n",
                "wire_wait_s -1 is not 0 to 3600",
            ),
            (
                "wire = \"unix:/w\"\nnic = \"passthrough\"\n",
                "it does not apply to nic = \"passthrough\"",
            ),
        ] {
            let err = error(&format!("{net}{extra}{two}"));
            assert!(err.contains(needle), "{extra}: {err}");
        }
    }

    #[test]
    fn network_mistakes_are_named() {
        let one = "pcpus = [0]\n[network]\n[[domain]]\nname = \"a\"\nmpi = true\n";
        assert!(error(one).contains(
            "needs 2 to 64 ranks (one per vCPU of the domains with mpi = true, or job_size), not 1"
        ));
        let no_net = "pcpus = [0]\n[[domain]]\nname = \"a\"\nmpi = true\n";
        assert!(error(no_net).contains("mpi = true needs a [network]"));
        let wait = "pcpus = [0]\n[network]\nwait = \"nap\"\n[[domain]]\nname = \"a\"\nmpi = true\n";
        assert!(error(wait).contains("wait 'nap' is not spin, block or yield"));
        let net = "pcpus = [0]\n[network]\nnet = \"x y\"\n[[domain]]\nname = \"a\"\nmpi = true\n";
        assert!(error(net).contains("not a list of the guest's net= items"));
        // What the guest's parser refuses is refused here, naming the item.
        for (bad, named) in [
            ("chek", "'chek' is not check"),
            ("check+", "'' is not check"),
            ("pingpong:", "'' in 'pingpong:'"),
            ("bw:1,x", "'x' in 'bw:1,x'"),
            ("pingpong:67108865", "'67108865' in"),
            (
                "check+check+check+check+check+check+check+check+check",
                "9 items",
            ),
            ("pingpong:1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", "17 sizes"),
        ] {
            let file = format!(
                "pcpus = [0]\n[network]\nnet = \"{bad}\"\n[[domain]]\nname = \"a\"\nmpi = true\n"
            );
            let err = error(&file);
            assert!(err.contains(named), "{bad}: {err}");
        }
        for good in ["check", "pingpong:0,64,67108864+bw:1500+check"] {
            let file = format!(
                "pcpus = [0]\n[network]\nnet = \"{good}\"\n[[domain]]\nname = \"a\"\nmpi = true\nvcpus = 2\n"
            );
            if let Err(e) = node(&file) {
                panic!("{good} was refused: {e:#}");
            }
        }
    }

    #[test]
    fn every_vcpu_of_a_domain_in_the_job_is_a_rank() {
        let n = node(
            r#"
pcpus = [0, 1]
[network]
npb = "cg.S"
[[domain]]
name = "a"
vcpus = 2
mpi = true
[[domain]]
name = "b"
vcpus = 2
mpi = true
"#,
        )
        .unwrap();
        assert_eq!(n.domains[0].ranks(), 0..2);
        assert_eq!(n.domains[1].ranks(), 2..4);
        assert!(
            n.domains[1].cmdline().contains(" mpi=2:4:2 "),
            "{}",
            n.domains[1].cmdline()
        );
        let two_ranks = crate::spec::job::npb_memory_mib(&n.domains[0].specs, 4, 2);
        assert!(n.domains[1].memory_mib >= two_ranks);
        // cg needs a power-of-two rank count: 3 ranks are refused before any VM boots.
        let three = "pcpus = [0]\n[network]\nnpb = \"cg.S\"\n[[domain]]\nname = \"a\"\nvcpus = 2\nmpi = true\n[[domain]]\nname = \"b\"\nmpi = true\n";
        assert!(
            error(three).contains("cannot run on 3 MPI ranks"),
            "{}",
            error(three)
        );
    }

    #[test]
    fn an_npb_mpi_job_is_judged_on_rank_0_and_named_for_every_rank() {
        let n = node(
            r#"
pcpus = [0]
[network]
npb = "cg.S"
[[domain]]
name = "a"
mpi = true
[[domain]]
name = "b"
mpi = true
"#,
        )
        .unwrap();
        assert_eq!(n.domains[0].specs.len(), 1);
        assert!(n.domains[1].specs.is_empty());
        for d in &n.domains {
            assert!(d.cmdline().starts_with("spin_us="), "{}", d.cmdline());
            assert!(
                d.cmdline().contains("wait=spin npb=cg.S"),
                "{}",
                d.cmdline()
            );
        }
        let three = "pcpus = [0]\n[network]\nnpb = \"is.S\"\n[[domain]]\nname = \"a\"\nmpi = true\n[[domain]]\nname = \"b\"\nmpi = true\n[[domain]]\nname = \"c\"\nmpi = true\n";
        assert!(error(three).contains("is.S cannot run on 3 MPI ranks"));
        let both = "pcpus = [0]\n[network]\nnpb = \"ep.S\"\nnet = \"check\"\n[[domain]]\nname = \"a\"\nmpi = true\n[[domain]]\nname = \"b\"\nmpi = true\n";
        assert!(error(both).contains("not both"));
    }

    #[test]
    fn an_incoming_domain_takes_a_name_weight_cap_and_address_only() {
        let standby = "pcpus = [0]\n[network]\njob_size = 4\nwire = \"unix:/tmp/w\"\n\
            [[domain]]\nname = \"u1\"\nweight = 512\nincoming = \"tcp:127.0.0.1:4444\"\n\
            token_file = \"/tmp/tok\"\n";
        let n = node(standby).unwrap();
        let d = &n.domains[0];
        assert_eq!(d.weight, 512);
        assert_eq!(
            d.incoming,
            Some(Incoming {
                address: "tcp:127.0.0.1:4444".into(),
                token_file: Some("/tmp/tok".into()),
            })
        );
        assert!(d.mpi.is_none() && d.ranks().is_empty());
        // What comes with the VM cannot be given; the address must be TCP.
        let with =
            |extra: &str| standby.replace("weight = 512\n", &format!("weight = 512\n{extra}\n"));
        for (extra, key) in [
            ("npb = \"ep.S\"", "leave out npb"),
            ("mpi = true", "leave out mpi"),
            ("memory_mib = 256", "leave out memory_mib"),
            ("ranks_per_vcpu = 2", "leave out ranks_per_vcpu"),
            (
                "passthrough = [\"vfio-user:/tmp/x\"]",
                "leave out passthrough",
            ),
        ] {
            let e = error(&with(extra));
            assert!(
                e.contains("an incoming domain brings") && e.contains(key),
                "{e}"
            );
        }
        let e = error(&standby.replace("tcp:127.0.0.1:4444", "unix:/tmp/x"));
        assert!(
            e.contains("incoming 'unix:/tmp/x' is not tcp:HOST:PORT"),
            "{e}"
        );
        let e = error(&standby.replace("tcp:127.0.0.1:4444", "tcp:h:99999"));
        assert!(e.contains("is not tcp:HOST:PORT"), "{e}");
        let e =
            error("pcpus = [0]\n[[domain]]\nname = \"a\"\nnpb = \"ep.S\"\ntoken_file = \"/t\"\n");
        assert!(
            e.contains("token_file applies to an incoming domain only"),
            "{e}"
        );
    }
}
