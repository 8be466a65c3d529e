//! MPI jobs across VMs of this host: `kumo mpi` (the guests' MPI self-check and, as
//! they arrive, NPB-MPI kernels) and `kumo bench net` (ping-pong latency and
//! streaming bandwidth between two VMs). Every VM boots the embedded guest with a
//! virtio-net NIC on one switch, served by domain 0's switch thread (`hv::net`).

use std::collections::BTreeMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use devices::net::switch::SwitchConfig;
use hv::irq::IrqPath;
use hv::net::{Network, NicSetup, WorkerStats};
use hv::passthrough::PassthroughSpec;
use hv::placement::ThreadGroup;
use npb::Spec;
use serde_json::{Value, json};

use crate::cli::{MpiArgs, NetBenchArgs, NicKind, Wait};
use crate::nic_server::ServerProcess;
use crate::run::{self, GuestRun};

/// Guest memory of each VM: the MPI runtime's per-peer rings and the check's 16 MiB
/// exchange fit with room to spare.
pub const MEMORY_MIB: u64 = 256;
/// Most ranks in one job (the guest's MPI takes at most 64), so most VMs too.
pub const MAX_RANKS: u32 = 64;
pub const MAX_VMS: u32 = MAX_RANKS;

/// The MAC of rank `rank`'s NIC: locally administered, "ku" and the rank.
pub fn mac(rank: u32) -> [u8; 6] {
    [0x02, 0x6b, 0x75, 0x00, (rank >> 8) as u8, rank as u8]
}

/// Which ranks of a job this process runs, and the wire to the others.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// Ranks in the whole job (this process's VMs, and those across the wire).
    pub size: u32,
    /// The rank of this process's first VM.
    pub first_rank: u32,
    pub wire: Option<WireSpec>,
    /// How long the wire waits for its peer.
    pub wire_patience: Duration,
    /// The VMs' NIC.
    pub nic: NicKind,
    /// With a passthrough NIC: a running server's directory (else the job starts one).
    pub nic_server: Option<PathBuf>,
}

impl Job {
    /// Checks that `vms` VMs of `vcpus` ranks each fit the job; returns its size.
    pub fn check_shape(&self, vms: u32, vcpus: u32) -> Result<u32> {
        if !(1..=MAX_VMS).contains(&vms) {
            bail!("--vms must be between 1 and {MAX_VMS}, not {vms}");
        }
        let here = vms.saturating_mul(vcpus);
        let size = if self.size == 0 { here } else { self.size };
        if !(2..=MAX_RANKS).contains(&size) {
            bail!("an MPI job needs 2 to {MAX_RANKS} ranks (one per vCPU), not {size}");
        }
        if self.first_rank.saturating_add(here) > size {
            bail!(
                "ranks {}..{} ({vms} VMs x {vcpus} vCPUs) do not fit a job of {size} ranks",
                self.first_rank,
                self.first_rank.saturating_add(here)
            );
        }
        if size > here && self.wire.is_none() {
            bail!(
                "{} of the job's {size} ranks run elsewhere: give a --wire to reach them",
                size - here
            );
        }
        Ok(size)
    }
}

/// The other end of a wire: a UNIX socket in QEMU's stream framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireSpec {
    /// Connect to a listener (QEMU's `-netdev stream,server=on`, another kumo's
    /// `listen:`), retrying while it is not there yet.
    Connect(PathBuf),
    /// Listen (QEMU's `server=off`, another kumo's `unix:`): one peer at a time, the
    /// next taking the port when one leaves.
    Listen(PathBuf),
}

impl std::str::FromStr for WireSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<WireSpec, String> {
        let (listen, rest) = match text.strip_prefix("listen:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        match rest.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(if listen {
                WireSpec::Listen(path.into())
            } else {
                WireSpec::Connect(path.into())
            }),
            _ => Err(format!("{text:?}: a wire is unix:PATH or listen:unix:PATH")),
        }
    }
}

impl WireSpec {
    /// Opens the wire and plugs it into `network`: a connection to a listener, or the
    /// first peer of this side's listener, which keeps listening (and its socket file
    /// stays) until the returned guard is dropped: when that peer's connection closes
    /// (its VM moved to another process), the next one takes the same switch port.
    pub fn attach(
        &self,
        network: &Network,
        patience: Duration,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<WireGuard> {
        let deadline = Instant::now() + patience;
        match self {
            WireSpec::Connect(path) => loop {
                match UnixStream::connect(path) {
                    Ok(stream) => {
                        network.attach_wire(stream, dom0)?;
                        return Ok(WireGuard { listening: None });
                    }
                    Err(e) if Instant::now() < deadline => {
                        tracing::debug!("wire {}: {e}; retrying", path.display());
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => bail!(
                        "cannot reach the wire {} within {:.1} s: {e}",
                        path.display(),
                        patience.as_secs_f64()
                    ),
                }
            },
            WireSpec::Listen(path) => {
                let listener = UnixListener::bind(path)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                crate::signals::track_socket(path.clone());
                let guard = WireGuard {
                    listening: Some(path.clone()),
                };
                listener.set_nonblocking(true)?;
                let stream = loop {
                    match listener.accept() {
                        Ok((stream, _)) => break stream,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                && Instant::now() < deadline
                                && hv::stop::requested().is_none() =>
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => bail!(
                            "no peer connected to {} within {:.1} s ({e})",
                            path.display(),
                            patience.as_secs_f64()
                        ),
                    }
                };
                stream.set_nonblocking(false)?;
                network.attach_listening_wire(stream, listener, dom0)?;
                Ok(guard)
            }
        }
    }
}

/// A listening wire's socket file, removed when the job ends.
pub struct WireGuard {
    listening: Option<PathBuf>,
}

impl Drop for WireGuard {
    fn drop(&mut self) {
        if let Some(path) = self.listening.take() {
            let _ = std::fs::remove_file(&path);
            crate::signals::untrack_socket(&path);
        }
    }
}

/// What a job's VMs did, and the switch thread's work (domain 0's, or the NIC
/// server's) if it was measured.
pub struct JobRun {
    pub runs: Vec<GuestRun>,
    pub switch: Option<WorkerStats>,
}

/// `vms` VMs of `vcpus` vCPUs, one rank per vCPU, each rank with its own NIC, all on one
/// network (and the wire, if any); each VM boots with `mpi=FIRST:SIZE:VCPUS` and
/// `extra`. Returns each VM's run, in rank order.
pub fn run_job(
    vms: u32,
    vcpus: u32,
    irq_path: IrqPath,
    extra: &str,
    job: &Job,
    kvm_device: &std::path::Path,
    epoch: Instant,
) -> Result<JobRun> {
    run_job_in(
        vms,
        (vcpus, vcpus),
        irq_path,
        extra,
        job,
        kvm_device,
        epoch,
        MEMORY_MIB * u64::from(vcpus),
    )
}

/// As [`run_job`], with `(vcpus, ranks)`: `ranks` ranks per VM (a multiple of its
/// vCPUs, each with its own NIC), and `memory_mib` of guest memory per VM.
#[allow(clippy::too_many_arguments)]
fn run_job_in(
    vms: u32,
    (vcpus, local): (u32, u32),
    irq_path: IrqPath,
    extra: &str,
    job: &Job,
    kvm_device: &std::path::Path,
    epoch: Instant,
    memory_mib: u64,
) -> Result<JobRun> {
    let size = job.check_shape(vms, local)?;
    run::check_guest_vcpus(vcpus, kvm_device)?;
    let here = vms * local;
    let network = Network::new(SwitchConfig::default())?;
    let server = match (job.nic, &job.nic_server) {
        (NicKind::Emulated, None) => None,
        (NicKind::Emulated, Some(_)) => bail!("--nic-server applies to --nic passthrough only"),
        (NicKind::Passthrough, _) if job.wire.is_some() => {
            bail!("--wire joins domain 0's switch: it does not apply to --nic passthrough")
        }
        (NicKind::Passthrough, Some(dir)) => Some(ServerProcess::running_at(dir)),
        (NicKind::Passthrough, None) => Some(ServerProcess::start(here, job.first_rank, &[])?),
    };
    let mut attached = Vec::new();
    let mut machines = Vec::new();
    for first in (0..vms).map(|i| job.first_rank + i * local) {
        let config = run::embedded_config(
            vcpus,
            memory_mib,
            format!("mpi={first}:{size}:{local} {extra}"),
            kvm_device,
        );
        let mut vm = hv::Vm::new(config)?;
        // The guest gives its k-th NIC (in slot order, the order attached) to rank
        // first + k, on vCPU k.
        for rank in first..first + local {
            match &server {
                None => {
                    network
                        .attach(
                            &mut vm,
                            &NicSetup {
                                mac: mac(rank),
                                irq_path,
                            },
                            None,
                        )
                        .with_context(|| format!("attaching rank {rank}'s NIC"))?;
                }
                Some(server) => {
                    let spec = PassthroughSpec::VfioUser(server.socket(rank - job.first_rank));
                    attached.push(
                        hv::passthrough::attach(&mut vm, &spec, irq_path, None)
                            .with_context(|| format!("attaching rank {rank}'s NIC"))?,
                    );
                }
            }
        }
        machines.push(vm);
    }
    let _wire = job
        .wire
        .as_ref()
        .map(|wire| wire.attach(&network, job.wire_patience, None))
        .transpose()?;
    let running = network.start(None)?;
    let runs: Vec<Result<GuestRun>> = std::thread::scope(|scope| {
        let handles: Vec<_> = machines
            .into_iter()
            .map(|vm| scope.spawn(move || run::run_collecting(vm, epoch)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a VM's thread panicked")))
            })
            .collect()
    });
    let stats = running.switch_stats();
    let mut switch = Some(running.worker_stats());
    drop(running);
    let clients = attached.len();
    drop(attached);
    if let Some(server) = &server {
        switch = server.stats_after(clients);
    }
    drop(server);
    tracing::debug!(?stats, ?switch, "switch");
    let runs = runs
        .into_iter()
        .enumerate()
        .map(|(rank, run)| run.with_context(|| format!("rank {rank}")))
        .collect::<Result<_>>()?;
    Ok(JobRun { runs, switch })
}

fn wait_name(wait: Wait) -> &'static str {
    match wait {
        Wait::Spin => "spin",
        Wait::Block => "block",
        Wait::Yield => "yield",
    }
}

/// Most ranks the guest multiplexes on one vCPU (`kumo_abi::sched::MAX_TASKS`).
pub const MAX_RANKS_PER_VCPU: u32 = 16;
/// The guest tick's range: the LAPIC timer's period is at least 200 µs on some hosts.
pub const MAX_GUEST_HZ: u32 = 5000;

/// The guest's words for `ranks_per_vcpu` ranks per vCPU and its tick (`guest_hz`),
/// checked (empty: one rank per vCPU, no tick).
pub fn sched_words(ranks_per_vcpu: u32, guest_hz: Option<u32>) -> Result<String> {
    if !(1..=MAX_RANKS_PER_VCPU).contains(&ranks_per_vcpu) {
        bail!("--ranks-per-vcpu must be between 1 and {MAX_RANKS_PER_VCPU}, not {ranks_per_vcpu}");
    }
    let mut words = String::new();
    if ranks_per_vcpu > 1 {
        words.push_str(&format!(" ranks_per_vcpu={ranks_per_vcpu}"));
    }
    if let Some(hz) = guest_hz {
        if !(1..=MAX_GUEST_HZ).contains(&hz) {
            bail!("--guest-hz must be between 1 and {MAX_GUEST_HZ}, not {hz}");
        }
        words.push_str(&format!(" guest_hz={hz}"));
    }
    Ok(words)
}

/// Why rank `rank`'s run has no `kind` line, or its fields.
fn measurement<'a>(
    run: &'a GuestRun,
    kind: &str,
    rank: usize,
) -> Result<&'a BTreeMap<String, String>> {
    run.measurement(kind)
        .with_context(|| format!("rank {rank}"))
}

/// `kumo mpi`: the MPI self-check across `--vms` VMs, or with `--npb` the NPB-MPI
/// kernels.
pub fn run_mpi(args: &MpiArgs, epoch: Instant) -> Result<u8> {
    if let Some(list) = &args.npb {
        return run_npb(args, list, epoch);
    }
    if args.ctl_socket.is_some() {
        bail!("--ctl-socket applies to --npb jobs (a rank VM that can move)");
    }
    let sched = sched_words(args.ranks_per_vcpu, args.guest_hz)?;
    let local = args.vcpus.saturating_mul(args.ranks_per_vcpu);
    let extra = format!("wait={} net=check{sched}", wait_name(args.wait));
    let job = Job {
        size: args.job_size.unwrap_or(args.vms.saturating_mul(local)),
        first_rank: args.first_rank,
        wire: args.wire.clone(),
        wire_patience: Duration::from_secs_f64(args.wire_wait),
        nic: args.nic,
        nic_server: args.nic_server.clone(),
    };
    let runs = run_job_in(
        args.vms,
        (args.vcpus, local),
        args.irq_path,
        &extra,
        &job,
        &args.kvm_device,
        epoch,
        MEMORY_MIB * u64::from(local),
    )?
    .runs;
    let mut ok = true;
    let mut rows = Vec::new();
    let ranks = runs.iter().enumerate().flat_map(|(vm, run)| {
        (0..local).map(move |k| (job.first_rank + vm as u32 * local + k, run))
    });
    for (rank, run) in ranks {
        let (verified, fields) = match run.rank_measurement("netcheck", rank) {
            Ok(fields) => (
                fields.get("verified").map(String::as_str) == Some("true"),
                Some(fields),
            ),
            Err(e) => {
                eprintln!("kumo: rank {rank}: {e:#}");
                (false, None)
            }
        };
        ok &= verified;
        let mut row = serde_json::Map::new();
        row.insert("rank".into(), json!(rank));
        row.insert("vms".into(), json!(args.vms));
        row.insert("vcpus".into(), json!(args.vcpus));
        row.insert("wait".into(), json!(wait_name(args.wait)));
        row.insert("irq_path".into(), json!(args.irq_path.name()));
        row.insert("nic".into(), json!(args.nic.name()));
        row.insert("verified".into(), json!(verified));
        for (k, v) in fields.into_iter().flatten() {
            row.entry(k.clone()).or_insert_with(|| json!(v));
        }
        rows.push(row);
    }
    if args.json {
        for row in &rows {
            crate::outln!("{}", Value::Object(row.clone()));
        }
        crate::outln!("{}", json!({ "ok": ok }));
    } else {
        crate::outln!("rank  messages        bytes  stress_s  verified");
        for row in &rows {
            crate::outln!(
                "{:<5} {:>8} {:>12} {:>9} {:>9}",
                row["rank"],
                text(row, "messages"),
                text(row, "bytes"),
                text(row, "stress_s"),
                if row["verified"] == json!(true) {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        crate::outln!(
            "MPI check: {} VMs x {} ranks here (of {} ranks), wait={}, irq path {}, nic {}",
            args.vms,
            args.vcpus,
            job.size,
            wait_name(args.wait),
            args.irq_path.name(),
            args.nic.name()
        );
    }
    Ok(if ok {
        crate::report::EXIT_OK
    } else {
        crate::report::EXIT_UNVERIFIED
    })
}

/// `--npb LIST`: the benchmarks, each checked against the job's rank count.
pub fn parse_npb(list: &str, ranks: u32) -> Result<Vec<Spec>> {
    let specs = list
        .split(',')
        .map(|item| {
            item.trim()
                .parse::<Spec>()
                .map_err(|e| anyhow::anyhow!("--npb: {e}"))
        })
        .collect::<Result<Vec<Spec>>>()?;
    for spec in &specs {
        if let Err(why) = npb::mpi::supports(*spec, ranks as usize) {
            bail!("{spec} cannot run on {ranks} MPI ranks: {why}");
        }
    }
    Ok(specs)
}

/// Guest memory of a VM running `local` of the job's `ranks` ranks of `specs`: per rank,
/// the largest kernel's heap, the MPI's rings (a send and a receive ring of 1 MiB per
/// peer) and the runtime, at least [`MEMORY_MIB`]; the heaps all below the PCI hole or
/// all above it (the guest gives each rank its share of either).
pub fn npb_memory_mib(specs: &[Spec], ranks: u32, local: u32) -> u64 {
    let heap = specs
        .iter()
        .map(|&spec| npb::mpi::heap_bytes(spec, ranks as usize))
        .max()
        .unwrap_or(0) as u64;
    let local = u64::from(local.max(1));
    crate::guest::memory_with_heap_mib(
        local * (2 * u64::from(ranks) + 96),
        local * heap.div_ceil(1 << 20),
    )
    .max(local * MEMORY_MIB)
}

/// `kumo mpi --npb LIST`: one job running every benchmark in turn; rank 0's results
/// judged as `kumo`'s, the other ranks' runs must end cleanly.
fn run_npb(args: &MpiArgs, list: &str, epoch: Instant) -> Result<u8> {
    let sched = sched_words(args.ranks_per_vcpu, args.guest_hz)?;
    let local = args.vcpus.saturating_mul(args.ranks_per_vcpu);
    let ranks = args.job_size.unwrap_or(args.vms.saturating_mul(local));
    let specs = parse_npb(list, ranks)?;
    if args.ctl_socket.is_some() {
        if !sched.is_empty() {
            bail!("--ranks-per-vcpu and --guest-hz do not apply to --ctl-socket rank VMs");
        }
        return crate::rank::run_controlled(args, &specs, epoch);
    }
    let job = Job {
        size: ranks,
        first_rank: args.first_rank,
        wire: args.wire.clone(),
        wire_patience: Duration::from_secs_f64(args.wire_wait),
        nic: args.nic,
        nic_server: args.nic_server.clone(),
    };
    let runs = run_job_in(
        args.vms,
        (args.vcpus, local),
        args.irq_path,
        &(npb_extra(&specs, args.wait) + &sched),
        &job,
        &args.kvm_device,
        epoch,
        npb_memory_mib(&specs, ranks, local),
    )?
    .runs;
    let report = NpbReport {
        specs: &specs,
        ranks,
        vms: args.vms,
        vcpus: args.vcpus,
        ranks_per_vcpu: args.ranks_per_vcpu,
        wait: args.wait,
        irq_path: args.irq_path,
        nic: args.nic,
        json: args.json,
    };
    let firsts = (0..).map(|i: u32| job.first_rank + i * local);
    Ok(report.print(firsts.zip(&runs)))
}

/// The guest's command-line words for an NPB-MPI job (beside `mpi=`).
pub fn npb_extra(specs: &[Spec], wait: Wait) -> String {
    let items: Vec<String> = specs.iter().map(Spec::to_string).collect();
    format!("wait={} npb={}", wait_name(wait), items.join(","))
}

/// How an NPB-MPI job's VMs of this process are judged and printed.
pub struct NpbReport<'a> {
    pub specs: &'a [Spec],
    /// Ranks of the whole job.
    pub ranks: u32,
    pub vms: u32,
    pub vcpus: u32,
    /// Ranks per vCPU (the guest's scheduler multiplexes them).
    pub ranks_per_vcpu: u32,
    pub wait: Wait,
    pub irq_path: IrqPath,
    pub nic: NicKind,
    pub json: bool,
}

impl NpbReport<'_> {
    /// Judges each VM's run (with its first rank): rank 0 prints the results (if it
    /// runs here, on its VM's vCPU 0); every VM must end cleanly. Prints the table
    /// (or JSON lines) and returns the exit status.
    pub fn print<'r>(&self, runs: impl IntoIterator<Item = (u32, &'r GuestRun)>) -> u8 {
        let ranks = self.ranks;
        let specs = self.specs;
        let mut code = crate::report::EXIT_OK;
        let mut rows = Vec::new();
        for (first, run) in runs {
            let verdict = if first == 0 {
                run.judge_ranks(specs, self.vcpus)
            } else {
                run.judge_ranks(&[], self.vcpus)
            };
            for problem in &verdict.problems {
                let last = first + self.vcpus * self.ranks_per_vcpu - 1;
                if first == last {
                    eprintln!("kumo: rank {first}: {problem}");
                } else {
                    eprintln!("kumo: ranks {first}-{last}: {problem}");
                }
            }
            if code == crate::report::EXIT_OK {
                code = verdict.exit_code();
            }
            if first == 0 {
                rows = verdict.rows;
            }
        }
        let ok = code == crate::report::EXIT_OK;
        let objects: Vec<serde_json::Map<String, Value>> = rows
            .iter()
            .map(|row| {
                let mut obj = serde_json::Map::new();
                obj.insert("benchmark".into(), json!(row.spec.kernel.name()));
                obj.insert("class".into(), json!(row.spec.class.letter().to_string()));
                obj.insert("ranks".into(), json!(ranks));
                obj.insert("vms".into(), json!(self.vms));
                obj.insert("vcpus".into(), json!(self.vcpus));
                obj.insert("ranks_per_vcpu".into(), json!(self.ranks_per_vcpu));
                obj.insert("nic".into(), json!(self.nic.name()));
                crate::report::insert_result(&mut obj, row.result.as_ref());
                obj
            })
            .collect();
        if self.json {
            for obj in &objects {
                crate::outln!("{}", Value::Object(obj.clone()));
            }
            crate::outln!("{}", json!({ "ok": ok }));
        } else {
            crate::outln!(
                "{:<10} {:<5} {:>5} {:>4} {:>12} {:>12}  verified",
                "benchmark",
                "class",
                "ranks",
                "vms",
                "time (s)",
                "Mop/s"
            );
            for obj in &objects {
                let number = |key: &str| {
                    obj[key]
                        .as_f64()
                        .map_or("-".to_string(), |v| format!("{v:.3}"))
                };
                crate::outln!(
                    "{:<10} {:<5} {:>5} {:>4} {:>12} {:>12}  {}",
                    obj["benchmark"].as_str().unwrap_or("-"),
                    obj["class"].as_str().unwrap_or("-"),
                    ranks,
                    self.vms,
                    number("time_s"),
                    number("mops"),
                    if obj["verified"] == json!(true) {
                        "yes"
                    } else {
                        "NO"
                    }
                );
            }
            crate::outln!(
                "NPB-MPI: {} ranks, {} per vCPU ({} VMs x {} vCPUs here), wait={}, irq path {}, nic {}",
                ranks,
                self.ranks_per_vcpu,
                self.vms,
                self.vcpus,
                wait_name(self.wait),
                self.irq_path.name(),
                self.nic.name()
            );
        }
        code
    }
}

fn text<'a>(row: &'a serde_json::Map<String, Value>, key: &str) -> &'a str {
    row.get(key).and_then(Value::as_str).unwrap_or("-")
}

/// `kumo bench net`: ping-pong between two VMs, one row per message size, for each
/// interrupt path and wait mode asked (side by side in one run).
pub fn run_bench(args: &NetBenchArgs, epoch: Instant) -> Result<u8> {
    let sizes = parse_sizes(&args.sizes)?;
    let paths = match args.irq_path {
        Some(p) => vec![p],
        None => vec![IrqPath::Generic, IrqPath::Fast],
    };
    let waits = match args.wait {
        Some(w) => vec![w],
        None => vec![Wait::Spin, Wait::Block],
    };
    let nics = match args.nic {
        Some(n) => vec![n],
        None => vec![NicKind::Emulated, NicKind::Passthrough],
    };
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let mut rows = Vec::new();
    for &wait in &waits {
        let mut extra = format!("wait={} net=pingpong:{}", wait_name(wait), list.join(","));
        if let Some(rounds) = args.rounds {
            extra.push_str(&format!(" net_rounds={rounds}"));
        }
        // kumo with each NIC on each path, then (if asked) QEMU with the same guest
        // and sizes.
        let mut settings: Vec<Option<(NicKind, IrqPath)>> = nics
            .iter()
            .flat_map(|&nic| paths.iter().map(move |&path| Some((nic, path))))
            .collect();
        if args.qemu {
            settings.push(None);
        }
        for setting in settings {
            let (events, switch) = match setting {
                Some((nic, path)) => {
                    let job = Job {
                        nic,
                        ..Job::default()
                    };
                    let mut job = run_job(2, 1, path, &extra, &job, &args.kvm_device, epoch)?;
                    measurement(&job.runs[0], "pingpong", 0)?;
                    (job.runs.swap_remove(0).events, job.switch)
                }
                None => (crate::qemu::run_pair(&extra)?, None),
            };
            let found: Vec<_> = events
                .into_iter()
                .filter_map(|e| match e {
                    crate::protocol::Event::Measurement { kind, fields } if kind == "pingpong" => {
                        Some(fields)
                    }
                    _ => None,
                })
                .collect();
            if found.len() != sizes.len() {
                bail!(
                    "rank 0 reported {} of {} ping-pong sizes",
                    found.len(),
                    sizes.len()
                );
            }
            for fields in found {
                let mut row: serde_json::Map<String, Value> =
                    fields.into_iter().map(|(k, v)| (k, json!(v))).collect();
                row.insert(
                    "irq_path".into(),
                    json!(setting.map_or("qemu", |(_, path)| path.name())),
                );
                row.insert(
                    "nic".into(),
                    json!(setting.map_or("qemu", |(nic, _)| nic.name())),
                );
                row.insert("wait".into(), json!(wait_name(wait)));
                if let Some(switch) = switch {
                    // The whole run's (every size): the switch thread's own time.
                    row.insert("switch_wakeups".into(), json!(switch.wakeups));
                    row.insert("switch_frames".into(), json!(switch.delivered));
                    row.insert(
                        "switch_busy_us".into(),
                        json!(switch.busy.as_secs_f64() * 1e6),
                    );
                }
                rows.push(row);
            }
        }
    }
    if args.json {
        for row in &rows {
            crate::outln!("{}", Value::Object(row.clone()));
        }
    } else {
        crate::outln!(
            "{:<12} {:<8} {:<6} {:>9} {:>7} {:>10} {:>10} {:>10} {:>12}",
            "nic",
            "path",
            "wait",
            "size",
            "rounds",
            "median_us",
            "p99_us",
            "MB/s",
            "sw_us/frame"
        );
        for row in &rows {
            let per_frame = match (
                row.get("switch_busy_us").and_then(Value::as_f64),
                row.get("switch_frames").and_then(Value::as_u64),
            ) {
                (Some(busy), Some(frames)) if frames > 0 => format!("{:.2}", busy / frames as f64),
                _ => "-".into(),
            };
            crate::outln!(
                "{:<12} {:<8} {:<6} {:>9} {:>7} {:>10} {:>10} {:>10} {:>12}",
                text(row, "nic"),
                text(row, "irq_path"),
                text(row, "wait"),
                text(row, "size"),
                text(row, "rounds"),
                text(row, "median_us"),
                text(row, "p99_us"),
                text(row, "mbps"),
                per_frame
            );
        }
        crate::outln!(
            "half round trip between two VMs (guest TSC); MB/s = size / half round trip;\n\
             nic emulated: domain 0's switch thread; nic passthrough: a port each of a kumo nic-server (vfio-user);\n\
             sw_us/frame: the switch thread's busy time (woken to done: both copies, the interrupt) per frame delivered, over the whole run (all sizes);\n\
             path qemu: the same guest on two QEMU VMs, virtio-net-pci on one -netdev stream wire"
        );
    }
    Ok(crate::report::EXIT_OK)
}

/// Message sizes: `8,1K,64K,1M` (K and M are binary), 1 to 16 of them, each at most
/// 64 MiB (the guest's limits).
fn parse_sizes(list: &str) -> Result<Vec<u64>> {
    let sizes = list
        .split(',')
        .map(|item| {
            let item = item.trim();
            let (digits, unit) = match item.char_indices().last() {
                Some((at, 'K' | 'k')) => (&item[..at], 1u64 << 10),
                Some((at, 'M' | 'm')) => (&item[..at], 1 << 20),
                _ => (item, 1),
            };
            digits
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(unit))
                .filter(|&n| (1..=64 << 20).contains(&n))
                .with_context(|| format!("bad message size {item:?}: 1 byte to 64M"))
        })
        .collect::<Result<Vec<_>>>()?;
    if sizes.is_empty() || sizes.len() > 16 {
        bail!("--sizes takes 1 to 16 sizes");
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units_and_refuse_the_rest() {
        assert_eq!(
            parse_sizes("8,1K,64k,1M").unwrap(),
            [8, 1024, 65536, 1 << 20]
        );
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("65M").is_err());
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes(&vec!["8"; 17].join(",")).is_err());
    }

    #[test]
    fn npb_lists_parse_and_rank_counts_are_checked() {
        let specs = parse_npb("ep.S,is.S,cg.W", 2).unwrap();
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[2].to_string(), "cg.W");
        assert!(parse_npb("ep.S", 3).is_ok());
        let e = parse_npb("ep.S,is.S", 3).unwrap_err().to_string();
        assert_eq!(
            e,
            "is.S cannot run on 3 MPI ranks: needs a power-of-two number of ranks"
        );
        assert!(parse_npb("mg.S", 2).is_ok() && parse_npb("mg.S", 3).is_err());
        assert!(parse_npb("ft.W", 32).is_ok() && parse_npb("ft.W", 64).is_err());
        // FT class A's slabs need more than the default guest memory on 2 ranks.
        assert!(npb_memory_mib(&parse_npb("ft.A", 2).unwrap(), 2, 1) > MEMORY_MIB);
        assert_eq!(
            npb_memory_mib(&parse_npb("ep.S", 2).unwrap(), 2, 1),
            MEMORY_MIB
        );
        // A VM of two ranks holds two of everything.
        let ft = parse_npb("ft.A", 4).unwrap();
        assert!(npb_memory_mib(&ft, 4, 2) >= 2 * npb_memory_mib(&ft, 4, 1) - 96);
        assert!(parse_npb("xx.S", 2).is_err());
    }

    #[test]
    fn macs_are_local_unicast_and_distinct() {
        assert_eq!(mac(0)[0] & 0b11, 0b10);
        assert_ne!(mac(1), mac(257));
    }
}
