//! `kumo node --config node.toml`: several VMs (domains) in one kumo process, sharing
//! the node's host CPUs, each running its NPB list; reports each domain's results and
//! the CPU time each domain and domain 0 (kumo's own threads) received.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use hv::Vm;
use hv::placement::VcpuControl;
use serde::Serialize;

use devices::net::switch::SwitchStats;
use hv::credit::{CreditDriver, Dom0Spec, DomainSpec, ParamChange};
use hv::placement::ThreadGroup;

use crate::api;
use crate::args::LimitArgs;
use crate::node_move::{Movable, NodeControl, Slot, Watch};
use crate::protocol::{GuestFields, Probe, WithGuest};
use crate::report::{self, Verdict};
use crate::run::{self, GuestRun};
use crate::spec::control::SchedParams;
use crate::spec::node::{self as config, Domain, Node};
use crate::spec::sched as sched_params;
use crate::spec::vm::{self, VmSpec};
use crate::wire::WireAttach;
use hv::builder::Backends;

/// How long to wait for a domain's vCPU threads to start before placing them.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// One domain's outcome.
pub struct DomainReport {
    pub domain: Domain,
    pub verdict: Verdict,
    /// Host CPU time of the domain's vCPU threads over the whole run.
    pub cpu: Duration,
    /// The same, up to the moment the first domain finished: the window in which every
    /// domain competed, where shares show what the scheduler decided.
    pub cpu_contended: Duration,
    /// Times the credit scheduler's directed yield BOOSTed one of its vCPUs.
    pub directed_boosts: u64,
    /// Probe results the guest printed (`@kumo wakeprobe ...`), by kind.
    pub measurements: Vec<(String, std::collections::BTreeMap<String, String>)>,
    /// It was migrated to this address (`kumo ctl migrate --domain`) and finished
    /// there: no results here.
    pub migrated_to: Option<String>,
    /// It arrived by migration on this address (`incoming` in the node file).
    pub arrived_on: Option<String>,
}

pub fn run_node(args: &NodeArgs, epoch: Instant) -> Result<u8> {
    let node = config::load(&args.config)?;
    let socket = args
        .api_socket
        .clone()
        .unwrap_or_else(api::default_socket_path);
    let outcome = run(&node, &args.kvm_device, Some(&socket), epoch)?;
    print(&node, &outcome, args.json)?;
    let code = outcome
        .reports
        .iter()
        .map(|r| r.verdict.exit_code())
        .max()
        .unwrap_or(report::EXIT_OK);
    Ok(code)
}

/// What a node run produced.
pub struct NodeOutcome {
    pub reports: Vec<DomainReport>,
    pub overhead: Overhead,
    pub wall: Duration,
    /// The switch's counters at the end, if the node had a network.
    pub switch: Option<SwitchStats>,
    /// The credit scheduler's parameter changes made while it ran (`kumo ctl
    /// sched-credit`).
    pub changes: Vec<ParamChange>,
    /// The auto slice's record, if it was on at the end.
    pub auto_slice: Option<AutoSliceLine>,
}

impl NodeOutcome {
    /// The first benchmark result any of its domains reported (in an MPI job, rank
    /// 0's: the other ranks report none).
    pub fn first_result(&self) -> Option<&crate::protocol::BenchResult> {
        self.reports
            .iter()
            .flat_map(|r| r.verdict.rows.iter())
            .find_map(|row| row.result.as_ref())
    }
}

/// Creates every domain's VM, runs them together on the node's CPUs under the node's
/// scheduler (serving the control socket at `socket`, if given) and waits for all.
/// The devices of `domain`'s VM: its interrupt test device and its own passthrough
/// devices from the file; and, in the node's MPI job and without devices of its own,
/// a NIC per rank: a port of the NIC `server` if there is one, else one on domain 0's
/// switch.
fn domain_devices(
    node: &Node,
    domain: &Domain,
    server: &Option<crate::nic_server::ServerProcess>,
) -> vm::Devices {
    let mut devices = vm::Devices {
        irq_test: domain.irq_path.map(|path| vm::IrqTest {
            irq_path: path,
            rounds: None,
        }),
        passthrough: domain
            .passthrough
            .iter()
            .map(|spec| vm::Passthrough {
                device: spec.to_string(),
                irq_path: domain.passthrough_irq_path,
            })
            .collect(),
        ..vm::Devices::default()
    };
    if let Some(net) = &node.network
        && domain.passthrough.is_empty()
    {
        match server {
            Some(server) => {
                devices
                    .passthrough
                    .extend(domain.ranks().map(|rank| {
                        vm::Passthrough {
                            device: hv::passthrough::PassthroughSpec::VfioUser(server.socket(rank))
                                .to_string(),
                            irq_path: net.irq_path,
                        }
                    }))
            }
            None => {
                devices.nics = domain
                    .ranks()
                    .map(|rank| vm::Nic {
                        mac: crate::spec::job::mac(rank),
                        irq_path: net.irq_path,
                    })
                    .collect();
            }
        }
    }
    devices
}

/// A domain of `node` as the VM it boots.
fn domain_spec(
    node: &Node,
    domain: &Domain,
    server: &Option<crate::nic_server::ServerProcess>,
) -> VmSpec {
    VmSpec {
        machine: vm::Machine {
            vcpus: domain.vcpus,
            memory_mib: Some(domain.memory_mib),
            huge_pages: false,
        },
        guest: vm::Guest::Npb {
            benchmarks: domain.specs.iter().map(ToString::to_string).collect(),
            barrier_wait: domain.barrier_wait,
            vcpu_balloon: if domain.vcpu_balloon {
                vm::VcpuBalloon::On
            } else {
                vm::VcpuBalloon::Off
            },
            cmdline: Some(domain.cmdline()),
        },
        devices: domain_devices(node, domain, server),
        // The node's credit driver schedules every domain together (below).
        sched: None,
        migration: vm::Migration::default(),
    }
}

/// Where a passthrough NIC's server (the hardware) runs: under the credit scheduler
/// the node's CPUs belong to its vCPUs (real-time threads that would starve it), so
/// the server gets the host's other CPUs, and there must be one.
fn server_cpus(node: &Node) -> Result<Vec<usize>> {
    if !node.uses_credit() {
        return Ok(Vec::new());
    }
    let others: Vec<usize> = (0..crate::guest::host_cpus())
        .filter(|cpu| !node.pcpus.contains(cpu))
        .collect();
    if others.is_empty() {
        anyhow::bail!(
            "[network] nic = \"passthrough\": the NIC server (the hardware) needs a host CPU outside pcpus, which takes all {} of this host's",
            crate::guest::host_cpus()
        );
    }
    Ok(others)
}

pub fn run(
    node: &Node,
    kvm_device: &std::path::Path,
    socket: Option<&std::path::Path>,
    epoch: Instant,
) -> Result<NodeOutcome> {
    let process_cpu_before = process_cpu_time();
    let nic_server_cpus = match &node.network {
        Some(net) if net.nic == crate::args::NicKind::Passthrough => Some(server_cpus(node)?),
        _ => None,
    };
    // Domain 0: the threads that run each VM (and stop it), the control socket's, and
    // the device threads (event loops, the test devices' responders).
    let dom0 = ThreadGroup::new();
    // Passthrough NICs: a port each of a NIC server (the hardware, another process,
    // outside the scheduler); kumo's generic-path interrupt threads stay domain 0's.
    // The switch then carries nothing. Both exist before the VMs that plug into them.
    let server = match (&node.network, &nic_server_cpus) {
        (Some(_), Some(cpus)) => {
            let ranks: u32 = node.domains.iter().map(|d| d.ranks().len() as u32).sum();
            Some(crate::nic_server::ServerProcess::start(ranks, 0, cpus)?)
        }
        _ => None,
    };
    // The node's switch: its thread is domain 0's work, as netback is Xen's; so are
    // the wire's threads to ranks outside the node.
    let network = match &node.network {
        Some(_) => {
            let network = hv::net::Network::new(devices::net::switch::SwitchConfig::default())?;
            let us = |us: f64| Duration::from_secs_f64(us / 1e6);
            network.model_backend_cost(us(node.dom0_cost.frame_us), us(node.dom0_cost.kib_us));
            Some(network)
        }
        None => None,
    };
    // Domains that arrive by migration: their listeners now, so that a source can
    // connect as soon as the node runs.
    let arrivals = node
        .domains
        .iter()
        .map(crate::node_move::listen)
        .collect::<Result<Vec<_>>>()?;
    let mut vms = Vec::new();
    // Every VM's device backends, kept until every VM has ended (their threads feed
    // the VMs' interrupts).
    let mut attached = Vec::new();
    for domain in &node.domains {
        if domain.incoming.is_some() {
            vms.push(None);
            continue;
        }
        let backends = Backends {
            network: network.as_ref(),
            dom0: Some(&dom0),
        };
        let built = crate::launch::build(&domain_spec(node, domain, &server), kvm_device, backends)
            .with_context(|| format!("domain '{}'", domain.name))?;
        let (vm, devices) = (built.vm, built.attached);
        // What a ballooning guest runs its teams on: the node's CPUs.
        let pcpus = u32::try_from(node.pcpus.len()).unwrap_or(u32::MAX);
        vm.control().host_cpus().set(pcpus);
        vms.push(Some(vm));
        attached.push(devices);
    }
    // The network stays at hand while its switch runs: domains that arrive plug
    // their NICs into it.
    let (running, _wire) = match (&network, &node.network) {
        (Some(network), Some(net)) => {
            let wire = net
                .wire
                .as_ref()
                .map(|spec| spec.attach(network, net.wire_wait, Some(&dom0)))
                .transpose()?;
            (Some(network.start(Some(dom0.clone()))?), wire)
        }
        _ => (None, None),
    };
    let controls: Vec<Option<Arc<VcpuControl>>> =
        vms.iter().map(|vm| vm.as_ref().map(Vm::control)).collect();
    let credit = node.uses_credit();
    let driver = if credit {
        let specs = node
            .domains
            .iter()
            .zip(&controls)
            .filter_map(|(d, control)| control.as_ref().map(|control| (d, control)))
            .map(|(d, control)| DomainSpec {
                name: d.name.clone(),
                weight: d.weight as u16,
                cap: d.cap,
                control: control.clone(),
            })
            .collect();
        let driver = CreditDriver::start(
            node.params,
            node.pcpus.clone(),
            node.scheduler.modules(node.pcpus.len())?,
            specs,
            Some(Dom0Spec {
                weight: node.dom0_weight as u16,
                threads: dom0.clone(),
            }),
            node.driver,
        )?;
        if node.auto_slice {
            driver.set_auto(true);
        }
        if node.speed_percent < 100 {
            driver
                .set_speed_percent(node.speed_percent)
                .context("[scheduler] speed_percent")?;
        }
        Some(Arc::new(driver))
    } else {
        None
    };
    // Each domain's console, recorded so that a migration carries it; and what the
    // control socket may move.
    let consoles: Vec<Arc<std::sync::Mutex<Vec<u8>>>> = node
        .domains
        .iter()
        .map(|_| Arc::new(std::sync::Mutex::new(Vec::new())))
        .collect();
    let mut watches = Vec::new();
    let slots = node
        .domains
        .iter()
        .zip(&vms)
        .zip(&consoles)
        .map(|((d, vm), console)| {
            let slot = match vm {
                None => Slot::Waiting,
                Some(vm) => {
                    let watch = Watch::new(vm, console.clone());
                    watches.push((d.name.clone(), watch.clone()));
                    match crate::node_move::app_of(node, d) {
                        Ok(app) => Slot::Movable(Arc::new(Movable::new(vm, watch, app))),
                        Err(why) => Slot::Fixed(why),
                    }
                }
            };
            (d.name.clone(), slot)
        })
        .collect();
    let node_control = Arc::new(NodeControl::new(
        crate::sched_control::SchedControl::new(
            driver.clone(),
            node.domains
                .iter()
                .cloned()
                .zip(controls.clone())
                .filter_map(|(d, control)| control.map(|control| (d, control)))
                .collect(),
        ),
        driver.clone(),
        slots,
        watches,
    ));
    let _server = match socket {
        Some(path) => Some(crate::node_move::serve(
            node_control.clone(),
            path,
            dom0.clone(),
        )?),
        None => None,
    };
    let destination = crate::node_move::Destination {
        node,
        network: network.as_ref(),
        dom0: &dom0,
        driver: driver.as_ref(),
        control: &node_control,
        kvm_device,
        epoch,
    };
    let start = Instant::now();
    // One deadline for the node: its VMs start one after another, and a --timeout
    // counted from each one's own start would end the node late.
    for vm in vms.iter_mut().flatten() {
        vm.set_limits(hv::RunLimits {
            since: Some(start),
            ..hv::stop::default_limits()
        });
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let mut contended = vec![Duration::ZERO; node.domains.len()];
    let runs: Vec<Result<Ran>> = std::thread::scope(|scope| {
        let handles: Vec<_> = vms
            .into_iter()
            .zip(arrivals)
            .zip(&consoles)
            .zip(&node.domains)
            .map(|(((vm, arrival), console), domain)| {
                let done = done_tx.clone();
                let dom0 = dom0.clone();
                let destination = &destination;
                scope.spawn(move || {
                    let _member = dom0.join_current();
                    let ran = match (vm, arrival) {
                        (Some(vm), _) => {
                            run::run_collecting_recorded(vm, epoch, Some(console.clone()), &[])
                                .map(|run| Ran::Here(Box::new(run)))
                        }
                        // A domain whose VM never arrived is that domain's failure,
                        // not the node's.
                        (None, Some(arrival)) => Ok(
                            match crate::node_move::receive_and_run(destination, domain, arrival) {
                                Ok(Some(arrived)) => Ran::Arrived(Box::new(arrived)),
                                Ok(None) => Ran::NeverArrived(None),
                                Err(e) => Ran::NeverArrived(Some(format!("{e:#}"))),
                            },
                        ),
                        (None, None) => Err(anyhow!("an incoming domain without its listener")),
                    };
                    let _ = done.send(());
                    ran
                })
            })
            .collect();
        // Without kumo's scheduler, confine every vCPU thread to the node's CPUs as
        // soon as it exists and let the host share them (the driver places them
        // itself otherwise).
        let started = controls.iter().zip(&node.domains);
        let started = started.filter_map(|(c, d)| c.as_ref().map(|c| (c, d)));
        for (control, domain) in started.filter(|_| !credit) {
            if !control.wait_started(START_TIMEOUT) {
                tracing::warn!("domain '{}': vCPU threads did not all start", domain.name);
            }
            for vcpu in 0..control.vcpus() {
                if let Err(e) = control.confine(vcpu, &node.pcpus) {
                    // A domain that already finished has no threads left to confine.
                    tracing::debug!("domain '{}' vCPU {vcpu}: {e}", domain.name);
                }
            }
        }
        // The first vCPU to finish ends the contended window (not the end of its VM's
        // teardown, during which the others keep running alone).
        loop {
            let ended = controls
                .iter()
                .flatten()
                .any(|c| (0..c.vcpus()).any(|v| c.has_ended(v)));
            if ended {
                break;
            }
            match done_rx.recv_timeout(Duration::from_millis(2)) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => break,
            }
        }
        for (slot, control) in contended.iter_mut().zip(&controls) {
            let Some(control) = control else { continue };
            *slot = (0..control.vcpus())
                .filter_map(|v| control.cpu_time(v))
                .sum();
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a domain's thread panicked")))
            })
            .collect()
    });
    let wall = start.elapsed();
    let switch = running.as_ref().map(|n| n.switch_stats());
    // Weights and caps may have changed at run time: report the final ones.
    let final_views = driver.as_ref().map(|d| d.domains()).unwrap_or_default();
    let changes = driver
        .as_ref()
        .map(|d| d.param_changes())
        .unwrap_or_default();
    let driver_stats = driver.as_ref().map(|d| d.stats());
    let auto_slice = driver
        .as_ref()
        .and_then(|d| d.auto_slice())
        .map(|a| AutoSliceLine::of(&a, node.pcpus.len() as u32));
    // Where each domain was sent, if it was (a migration sets it before it starts).
    let sent_to: Vec<Option<String>> = node
        .domains
        .iter()
        .map(|d| match node_control.slot(&d.name) {
            Some(Slot::Movable(m)) => m.migrated_to(),
            _ => None,
        })
        .collect();
    drop(_server);
    // The control holds the scheduler too: both go before the domains' threads'
    // scheduling is given back.
    drop(node_control);
    drop(driver);
    let mut reports = Vec::new();
    let mut vcpu_cpu_total = Duration::ZERO;
    for (i, ((run, domain), cpu_contended)) in runs
        .into_iter()
        .zip(&node.domains)
        .zip(contended)
        .enumerate()
    {
        let ran = run.with_context(|| format!("domain '{}'", domain.name))?;
        let mut domain = domain.clone();
        let view = final_views.iter().rfind(|v| v.name == domain.name);
        if let Some(view) = view {
            domain.weight = u32::from(view.weight);
            domain.cap = view.cap;
        }
        let arrived_on = domain.incoming.as_ref().map(|i| i.address.clone());
        let (run, verdict) = match ran {
            Ran::Here(run) => {
                let run = *run;
                let verdict = if node.domains[i].mpi.is_some() {
                    run.judge_ranks(&node.domains[i].specs, node.domains[i].vcpus)
                } else {
                    run.judge(&node.domains[i].specs, node.domains[i].vcpus)
                };
                (run, verdict)
            }
            Ran::Arrived(arrived) => {
                let specs = arrived.specs();
                domain.vcpus = arrived.app.vcpus;
                let verdict = if arrived.app.rank.is_some() {
                    arrived.run.judge_ranks(&specs, domain.vcpus)
                } else {
                    arrived.run.judge(&specs, domain.vcpus)
                };
                domain.specs = specs;
                (arrived.run, verdict)
            }
            Ran::NeverArrived(error) => {
                // Not sent before the node stopped: nothing arrived on that address.
                let arrived_on = arrived_on.filter(|_| error.is_some());
                reports.push(DomainReport {
                    verdict: moved_verdict(domain.vcpus, error.into_iter().collect()),
                    domain,
                    cpu: Duration::ZERO,
                    cpu_contended: Duration::ZERO,
                    directed_boosts: 0,
                    measurements: Vec::new(),
                    migrated_to: None,
                    arrived_on,
                });
                continue;
            }
        };
        // A domain that moved on finishes (and is judged) where it went.
        let migrated_to = (run.outcome.exit == hv::GuestExit::HandedOff)
            .then(|| sent_to[i].clone().unwrap_or_else(|| "another node".into()));
        let verdict = match &migrated_to {
            Some(_) => moved_verdict(domain.vcpus, Vec::new()),
            None => verdict,
        };
        let cpu: Duration = run.outcome.vcpu_cpu_time.iter().sum();
        vcpu_cpu_total += cpu;
        reports.push(DomainReport {
            domain,
            verdict,
            cpu,
            cpu_contended,
            directed_boosts: view.map_or(0, |v| v.directed_boosts),
            measurements: run
                .events
                .iter()
                .filter_map(|e| match e {
                    crate::protocol::Event::Measurement { kind, fields } => {
                        Some((kind.clone(), fields.clone()))
                    }
                    _ => None,
                })
                .collect(),
            migrated_to,
            arrived_on,
        });
    }
    let dom0_cpu = dom0.cpu_time();
    let vmm = process_cpu_time()
        .saturating_sub(process_cpu_before)
        .saturating_sub(vcpu_cpu_total)
        .saturating_sub(dom0_cpu);
    Ok(NodeOutcome {
        reports,
        overhead: Overhead {
            dom0: dom0_cpu,
            vmm,
            driver: driver_stats,
        },
        wall,
        switch,
        changes,
        auto_slice,
    })
}

/// How a domain's thread ended: its VM ran here (to its end, or until it moved on),
/// or arrived by migration and ran here, or never arrived: why, or None if the node
/// was told to stop before a source came (a standby left unused is not a failure).
enum Ran {
    Here(Box<GuestRun>),
    Arrived(Box<crate::node_move::Arrived>),
    NeverArrived(Option<String>),
}

/// The verdict on a domain that has no results here: it moved to another node (no
/// problems: it is judged there), or its VM never came (`problems`).
fn moved_verdict(vcpus: u32, problems: Vec<String>) -> Verdict {
    Verdict {
        rows: Vec::new(),
        vcpus,
        boot_ms: None,
        problems,
        crashed: false,
        stopped: None,
        native: false,
        kvm_stats: None,
    }
}

/// CPU time that went to neither domain's vCPUs.
#[derive(Debug, Clone, Copy)]
pub struct Overhead {
    /// Domain 0: the threads that run and stop each VM, the control socket.
    pub dom0: Duration,
    /// The rest of kumo: the credit scheduler's driver, set-up and teardown.
    pub vmm: Duration,
    /// How often the credit scheduler's driver ran and slept tickless.
    pub driver: Option<hv::credit::DriverStats>,
}

/// User plus system CPU time of the whole process.
fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A domain's line of `kumo node --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DomainLine {
    pub domain: String,
    pub weight: u32,
    pub cap: u32,
    pub vcpus: u32,
    pub cpu_s: f64,
    pub cpu_contended_s: f64,
    pub directed_boosts: u64,
    /// Where the domain moved to (`kumo ctl migrate --domain`), if it did.
    pub migrated_to: Option<String>,
    /// Where the domain arrived from, if it came by migration.
    pub arrived_on: Option<String>,
    pub ok: bool,
    pub problems: Vec<String>,
    /// The domain's benchmark rows, as `kumo --json` prints them.
    pub results: Vec<WithGuest<report::BenchRow>>,
    /// Each measurement line of the guest: its kind, then its fields.
    pub probes: Vec<WithGuest<Probe>>,
}

/// Scheduler parameters from a moment on (`at_s`: seconds since the scheduler
/// started).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SchedChange {
    #[serde(flatten)]
    pub params: SchedParams,
    pub at_s: f64,
}

/// Domain 0's switch: frames and bytes it received, frames it held, frames it dropped
/// for a source MAC their port does not own.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SwitchLine {
    pub frames: u64,
    pub bytes: u64,
    pub held: u64,
    pub spoofed: u64,
}

/// The node's line, after its domains'.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeLine {
    /// Always `true`: tells this line from a domain's.
    pub node: bool,
    pub pcpus: Vec<usize>,
    /// `"credit"` or `"host"`.
    pub scheduler: &'static str,
    /// What was in force at the end (`null` without the credit scheduler).
    pub sched: Option<SchedParams>,
    /// What the node started with.
    pub sched_initial: Option<SchedParams>,
    pub sched_changes: Vec<SchedChange>,
    pub dom0_weight: u32,
    pub dom0_frame_cost_us: f64,
    pub dom0_kib_cost_us: f64,
    pub dom0_cpu_s: f64,
    pub vmm_cpu_s: f64,
    /// The credit driver's runs and tickless sleeps (`null` without it).
    pub credit_driver: Option<hv::credit::DriverStats>,
    pub wall_s: f64,
    pub switch: Option<SwitchLine>,
    /// What the auto slice chose (`null` unless it was on at the end).
    pub auto_slice: Option<AutoSliceLine>,
    /// The pool's speed in percent of its host CPUs (`[scheduler] speed_percent`).
    pub speed_percent: u32,
}

/// The auto slice's record (`sched::auto_slice`): its epochs and every change of
/// setting with the signals that made it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoSliceLine {
    pub epoch_ms: f64,
    pub epochs: u64,
    pub short_epochs: u64,
    /// "long" or "short", at the end.
    pub setting: &'static str,
    pub changes: Vec<AutoSliceChange>,
    /// The signals over the whole run: credit ticks that found a vCPU running, those
    /// that found another queued, and wake-ups per pCPU and second.
    pub ticks: u64,
    pub queued_ticks: u64,
    pub wakes_per_pcpu_s: f64,
    /// Changes beyond the record's bound, not listed.
    pub unrecorded_changes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoSliceChange {
    /// Seconds since the scheduler started.
    pub at_s: f64,
    pub setting: &'static str,
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    /// The deciding epoch's signals: credit ticks that found a vCPU running, those
    /// that found another queued, and wake-ups.
    pub ticks: u64,
    pub queued_ticks: u64,
    pub wakes_per_pcpu_s: f64,
}

impl AutoSliceLine {
    pub fn of(auto: &sched::auto_slice::AutoSlice, pcpus: u32) -> AutoSliceLine {
        let (epochs, short_epochs) = auto.epochs();
        let total = auto.total();
        AutoSliceLine {
            ticks: total.ticks,
            queued_ticks: total.queued,
            wakes_per_pcpu_s: total.wakes_per_pcpu_s(pcpus),
            epoch_ms: sched::auto_slice::EPOCH_NS as f64 / 1e6,
            epochs,
            short_epochs,
            setting: auto.setting().name(),
            changes: auto
                .changes()
                .iter()
                .map(|c| {
                    let p = sched_params::view(c.params);
                    AutoSliceChange {
                        at_s: c.at_ns as f64 / 1e9,
                        setting: c.setting.name(),
                        tslice_ms: p.tslice_ms,
                        tick_ms: p.tick_ms,
                        ratelimit_us: p.ratelimit_us,
                        ticks: c.signals.ticks,
                        queued_ticks: c.signals.queued,
                        wakes_per_pcpu_s: c.signals.wakes_per_pcpu_s(pcpus),
                    }
                })
                .collect(),
            unrecorded_changes: auto.dropped(),
        }
    }
}

/// A line of `kumo node --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum NodeJsonLine {
    Domain(Box<DomainLine>),
    Node(Box<NodeLine>),
}

/// One JSON object per domain, then the node's line.
pub fn json_lines(node: &Node, outcome: &NodeOutcome) -> Vec<NodeJsonLine> {
    let (reports, overhead, wall) = (&outcome.reports, outcome.overhead, outcome.wall);
    let (switch, changes) = (outcome.switch, &outcome.changes);
    let mut lines: Vec<NodeJsonLine> = reports
        .iter()
        .map(|r| {
            let results = r
                .verdict
                .json_lines()
                .into_iter()
                .filter_map(|line| match line {
                    report::JsonLine::Bench(row) => Some(row),
                    report::JsonLine::Summary(_) => None,
                })
                .collect();
            let probes = r
                .measurements
                .iter()
                .map(|(kind, fields)| {
                    WithGuest::new(
                        Probe {
                            probe: kind.clone(),
                        },
                        GuestFields::of(fields),
                    )
                })
                .collect();
            NodeJsonLine::Domain(Box::new(DomainLine {
                domain: r.domain.name.clone(),
                weight: r.domain.weight,
                cap: r.domain.cap,
                vcpus: r.domain.vcpus,
                cpu_s: r.cpu.as_secs_f64(),
                cpu_contended_s: r.cpu_contended.as_secs_f64(),
                directed_boosts: r.directed_boosts,
                migrated_to: r.migrated_to.clone(),
                arrived_on: r.arrived_on.clone(),
                ok: r.verdict.problems.is_empty(),
                problems: r.verdict.problems.clone(),
                results,
                probes,
            }))
        })
        .collect();
    let credit = node.uses_credit();
    lines.push(NodeJsonLine::Node(Box::new(NodeLine {
        node: true,
        pcpus: node.pcpus.clone(),
        scheduler: if credit { "credit" } else { "host" },
        sched: credit.then(|| SchedParams {
            auto_slice: outcome.auto_slice.is_some(),
            ..sched_params::view(changes.last().map_or(node.params, |c| c.params))
        }),
        sched_initial: credit.then(|| sched_params::view(node.params)),
        sched_changes: changes
            .iter()
            .map(|c| SchedChange {
                params: sched_params::view(c.params),
                at_s: c.at.as_secs_f64(),
            })
            .collect(),
        dom0_weight: node.dom0_weight,
        dom0_frame_cost_us: node.dom0_cost.frame_us,
        dom0_kib_cost_us: node.dom0_cost.kib_us,
        dom0_cpu_s: overhead.dom0.as_secs_f64(),
        vmm_cpu_s: overhead.vmm.as_secs_f64(),
        credit_driver: overhead.driver,
        wall_s: wall.as_secs_f64(),
        switch: switch.map(|s| SwitchLine {
            frames: s.received,
            bytes: s.received_bytes,
            held: s.held,
            spoofed: s.spoofed,
        }),
        auto_slice: outcome.auto_slice.clone(),
        speed_percent: node.speed_percent,
    })));
    lines
}

fn print(node: &Node, outcome: &NodeOutcome, json: bool) -> Result<()> {
    let (reports, overhead, wall) = (&outcome.reports, outcome.overhead, outcome.wall);
    if json {
        for line in json_lines(node, outcome) {
            crate::output::json_line(&line);
        }
        return Ok(());
    }
    let total: f64 = reports.iter().map(|r| r.cpu_contended.as_secs_f64()).sum();
    crate::outln!(
        "{:<12} {:>6} {:>4} {:>5} {:>9} {:>6}  results",
        "domain",
        "weight",
        "cap",
        "vCPUs",
        "cpu (s)",
        "share"
    );
    for r in reports {
        let contended = r.cpu_contended.as_secs_f64();
        let results: Vec<String> = r
            .verdict
            .rows
            .iter()
            .map(|row| match &row.result {
                Some(res) => format!(
                    "{} {:.3}s {}",
                    row.spec,
                    res.time_s,
                    if res.verified {
                        "verified"
                    } else {
                        "NOT VERIFIED"
                    }
                ),
                None => format!("{} no result", row.spec),
            })
            .chain(
                r.measurements
                    .iter()
                    .filter_map(|(kind, fields)| probe_summary(kind, fields)),
            )
            .collect();
        crate::outln!(
            "{:<12} {:>6} {:>4} {:>5} {:>9.3} {:>5.1}%  {}",
            r.domain.name,
            r.domain.weight,
            r.domain.cap,
            r.domain.vcpus,
            r.cpu.as_secs_f64(),
            if total > 0.0 {
                100.0 * contended / total
            } else {
                0.0
            },
            results.join(", ")
        );
        for problem in &r.verdict.problems {
            eprintln!("kumo: domain '{}': {problem}", r.domain.name);
        }
    }
    if node.dom0_cost != crate::spec::node::BackendCost::default() {
        crate::outln!(
            "domain 0 modelled a backend costing {} us per frame + {} us per KiB",
            node.dom0_cost.frame_us,
            node.dom0_cost.kib_us
        );
    }
    crate::outln!(
        "share: of the CPU time the domains received while all of them ran\n\
         node: host CPUs {:?}, {:.2} s wall; CPU: domain 0 (weight {}) {:.3} s, \
         kumo's scheduler and set-up {:.3} s",
        node.pcpus,
        wall.as_secs_f64(),
        node.dom0_weight,
        overhead.dom0.as_secs_f64(),
        overhead.vmm.as_secs_f64(),
    );
    if node.speed_percent < 100 {
        crate::outln!(
            "the node ran at {} % of its host CPUs' speed (speed_percent)",
            node.speed_percent
        );
    }
    if let Some(auto) = &outcome.auto_slice {
        crate::outln!(
            "auto slice: {} epochs of {} ms, {} in the short setting; ended {}",
            auto.epochs,
            auto.epoch_ms,
            auto.short_epochs,
            auto.setting
        );
        for c in &auto.changes {
            crate::outln!(
                "  {:.3} s: {} (slice {} ms): {} of {} ticks found a vCPU queued, \
                 {:.0} wake-ups per pCPU and second",
                c.at_s,
                c.setting,
                c.tslice_ms,
                c.queued_ticks,
                c.ticks,
                c.wakes_per_pcpu_s
            );
        }
    }
    for change in &outcome.changes {
        let p = sched_params::view(change.params);
        crate::outln!(
            "scheduler changed at {:.3} s: slice {} ms, tick {} ms, ratelimit {} us, {:?} accounting, \
             directed yield {}",
            change.at.as_secs_f64(),
            p.tslice_ms,
            p.tick_ms,
            p.ratelimit_us,
            p.accounting,
            if p.directed_yield { "on" } else { "off" }
        );
    }
    Ok(())
}

/// One line of a guest probe for the table: its kind and its headline numbers.
/// A measurement line's headline for the table (None: nothing worth a column).
fn probe_summary(
    kind: &str,
    fields: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let keys: &[&str] = match kind {
        "irqcheck" => &["verified", "delivered", "misrouted", "lost", "masked_held"],
        "irqbench" | "wakeprobe" => &["median_us", "p99_us", "max_us"],
        "netcheck" => &["verified", "messages", "bytes", "stress_s"],
        "pingpong" => &["size", "median_us", "p99_us"],
        "switchprobe" => &[],
        _ => return None,
    };
    let picked: Vec<String> = keys
        .iter()
        .filter_map(|k| fields.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    Some(format!("{kind} {}", picked.join(" ")))
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node file (TOML; see examples/).
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Where to create the API socket (HTTP, `kumo ctl`, `curl --unix-socket`)
    /// [default: $XDG_RUNTIME_DIR or /tmp, kumo-<pid>.sock].
    #[arg(long, value_name = "PATH", alias = "ctl-socket")]
    pub api_socket: Option<PathBuf>,

    /// Print one JSON object per domain, then one for the node.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    #[command(flatten)]
    pub limits: LimitArgs,
}
