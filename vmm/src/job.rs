//! Running an MPI job's VMs of this process: each VM boots the embedded guest with one
//! NIC per rank on one network (domain 0's switch, or ports of a NIC server), the
//! wire to ranks elsewhere is opened, and the runs are collected and judged. The
//! `kumo mpi` command (`kumo::mpi`) and the experiments (`kumo_lab`) drive it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use devices::net::switch::SwitchConfig;
use hv::builder::Backends;
use hv::irq::IrqPath;
use hv::net::{Network, WorkerStats};
use hv::passthrough::PassthroughSpec;
use npb::Spec;
use serde::Serialize;

use crate::nic_server::ServerProcess;
use crate::protocol::{OkLine, WithGuest};
use crate::run::{self, GuestRun};
use crate::spec::job::{MAX_RANKS, MAX_VMS, MEMORY_MIB, NicKind, Wait, WireSpec, mac};
use crate::spec::vm::{self, VmSpec};
use crate::wire::WireAttach;

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
pub fn run_job_in(
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
        // The guest gives its k-th NIC (in slot order, the order attached) to rank
        // first + k, on vCPU k.
        let ranks = first..first + local;
        let path = irq_path;
        let devices = match &server {
            None => vm::Devices {
                nics: ranks
                    .map(|rank| vm::Nic {
                        mac: mac(rank),
                        irq_path: path,
                    })
                    .collect(),
                ..vm::Devices::default()
            },
            Some(server) => vm::Devices {
                passthrough: ranks
                    .map(|rank| vm::Passthrough {
                        device: PassthroughSpec::VfioUser(server.socket(rank - job.first_rank))
                            .to_string(),
                        irq_path: path,
                    })
                    .collect(),
                ..vm::Devices::default()
            },
        };
        let spec = VmSpec {
            machine: vm::Machine {
                vcpus,
                memory_mib: Some(memory_mib),
                huge_pages: false,
            },
            guest: vm::Guest::Npb {
                benchmarks: Vec::new(),
                barrier_wait: vm::BarrierWait::Auto,
                vcpu_balloon: vm::VcpuBalloon::Auto,
                cmdline: Some(format!("mpi={first}:{size}:{local} {extra}")),
            },
            devices,
            sched: None,
            migration: vm::Migration::default(),
        };
        let backends = Backends {
            network: Some(&network),
            dom0: None,
        };
        let built = crate::launch::build(&spec, kvm_device, backends)
            .with_context(|| format!("the VM of ranks {first}..{}", first + local))?;
        let (vm, devices) = (built.vm, built.attached);
        attached.push(devices);
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
    let clients = attached.iter().map(|a| a.passthrough.len()).sum();
    drop(attached);
    if let Some(server) = &server {
        switch = server.stats_after(clients);
    }
    drop(server);
    tracing::debug!(?stats, ?switch, "switch");
    if stats.spoofed > 0 {
        tracing::warn!(
            frames = stats.spoofed,
            "the switch dropped frames from a source MAC their port may not send from"
        );
    }
    let runs = runs
        .into_iter()
        .enumerate()
        .map(|(rank, run)| run.with_context(|| format!("rank {rank}")))
        .collect::<Result<_>>()?;
    Ok(JobRun { runs, switch })
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
        let objects: Vec<WithGuest<NpbMpiRow>> = rows
            .iter()
            .map(|row| {
                let (result, guest) = crate::report::ResultFields::of(row.result.as_ref());
                let kumo = NpbMpiRow {
                    benchmark: row.spec.kernel.name(),
                    class: row.spec.class.letter().to_string(),
                    ranks,
                    vms: self.vms,
                    vcpus: self.vcpus,
                    ranks_per_vcpu: self.ranks_per_vcpu,
                    nic: self.nic.name(),
                    result,
                };
                WithGuest::new(kumo, guest)
            })
            .collect();
        if self.json {
            for obj in &objects {
                crate::output::json_line(obj);
            }
            crate::output::json_line(&OkLine { ok });
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
                let row = &obj.kumo;
                let number = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
                crate::outln!(
                    "{:<10} {:<5} {:>5} {:>4} {:>12} {:>12}  {}",
                    row.benchmark,
                    row.class,
                    ranks,
                    self.vms,
                    number(row.result.time_s),
                    number(row.result.mops),
                    if row.result.verified { "yes" } else { "NO" }
                );
            }
            crate::outln!(
                "NPB-MPI: {} ranks, {} per vCPU ({} VMs x {} vCPUs here), wait={}, irq path {}, nic {}",
                ranks,
                self.ranks_per_vcpu,
                self.vms,
                self.vcpus,
                Wait::name(self.wait),
                self.irq_path.name(),
                self.nic.name()
            );
        }
        code
    }
}

/// A benchmark's row of `kumo mpi --npb LIST --json` (rank 0's result).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NpbMpiRow {
    pub benchmark: &'static str,
    pub class: String,
    pub ranks: u32,
    pub vms: u32,
    pub vcpus: u32,
    pub ranks_per_vcpu: u32,
    /// `"emulated"` or `"passthrough"`.
    pub nic: &'static str,
    #[serde(flatten)]
    pub result: crate::report::ResultFields,
}
