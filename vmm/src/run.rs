//! Runs a VM the way the command line asked and turns its ending into kumo's exit status.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use hv::builder::Backends;
use hv::{GuestExit, RunOutcome, Vm, VmConfig};
use npb::Spec;
use serde::Serialize;

use crate::guest::{self, EMBEDDED_GUEST};
pub use crate::launch::{check_guest_vcpus, embedded_config};
use crate::protocol::{Event, GuestFields, LineParser, Probe, WithGuest};
use crate::report::{self, Ending, Verdict};
use crate::spec::vm::VmSpec;

/// Why a run has no result here: its VM went to a snapshot or another kumo.
pub const HANDED_OFF: &str = "the VM was handed off (snapshot or migration) and finishes elsewhere";

/// What a single-VM run prints and which KVM it opens: the options that are not the
/// VM's (its [`VmSpec`] says the rest).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub kvm_device: PathBuf,
    /// JSON lines instead of a table.
    pub json: bool,
    /// KVM's own counters when the VM ends.
    pub kvm_stats: bool,
}

/// Boots the embedded NPB guest `spec` describes, runs its benchmarks and reports them.
pub fn run_embedded(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    let verdict = run_spec(spec, &options.kvm_device, epoch)?;
    report::print(&verdict, options.json);
    if let (true, Some(stats)) = (options.kvm_stats, &verdict.kvm_stats) {
        crate::kvm_stats::print(stats, options.json);
    }
    Ok(verdict.exit_code())
}

/// One VM of the embedded guest running `specs` in order, judged.
pub fn run_guest(
    specs: &[Spec],
    vcpus: u32,
    memory: Option<u64>,
    kvm_device: &Path,
    epoch: Instant,
) -> Result<Verdict> {
    let mut spec = npb_spec(specs, vcpus);
    spec.machine.memory_mib = memory;
    run_spec(&spec, kvm_device, epoch)
}

/// The embedded guest running `specs` on `vcpus`, everything else default.
pub fn npb_spec(specs: &[Spec], vcpus: u32) -> VmSpec {
    let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    VmSpec::npb(vcpus, &names)
}

/// The credit scheduler driving one VM on every host CPU, with domain 0 (the
/// thread that started it, which runs the VM and stops it, and whoever joins `dom0`).
/// Fields drop in order: the scheduler first (it returns every thread to normal
/// scheduling), then domain 0's membership.
pub struct Credit {
    pub driver: Arc<hv::credit::CreditDriver>,
    pub dom0: Arc<hv::placement::ThreadGroup>,
    pub member: hv::placement::Membership,
}

/// Starts the credit scheduler for `vm` alone (the single-VM form of a node), its
/// domain of `weight` and `cap`.
pub fn start_credit_driver(
    vm: &Vm,
    params: sched::Params,
    domain: &crate::spec::vm::Sched,
) -> Result<Credit> {
    let dom0 = hv::placement::ThreadGroup::new();
    let member = dom0.join_current();
    let dom0_weight = crate::spec::node::DEFAULT_WEIGHT as u16;
    let driver = hv::credit::CreditDriver::start(
        params,
        (0..guest::host_cpus()).collect(),
        None,
        vec![hv::credit::DomainSpec {
            name: "guest".into(),
            weight: u16::try_from(domain.weight).unwrap_or(u16::MAX),
            cap: domain.cap,
            control: vm.control(),
        }],
        Some(hv::credit::Dom0Spec {
            weight: dom0_weight,
            threads: dom0.clone(),
        }),
        hv::credit::DriverPlace::Auto,
    )?;
    Ok(Credit {
        driver: Arc::new(driver),
        dom0,
        member,
    })
}

/// [`start_credit_driver`], with its control socket at the default path.
fn start_credit(
    vm: &Vm,
    params: sched::Params,
    domain: &crate::spec::vm::Sched,
) -> Result<(
    hv::placement::Membership,
    crate::api::Server,
    Arc<hv::credit::CreditDriver>,
)> {
    let credit = start_credit_driver(vm, params, domain)?;
    let socket = crate::api::default_socket_path();
    let server = crate::sched_control::serve(
        Some(credit.driver.clone()),
        Vec::new(),
        &socket,
        credit.dom0,
    )?;
    // Dropped in this order: the server (it holds the scheduler too), the scheduler
    // (it returns every thread to normal scheduling), the membership.
    Ok((credit.member, server, credit.driver))
}

/// Runs the embedded guest `spec` describes (built by [`crate::launch`]), under the
/// credit scheduler if it asks, and judges it.
pub fn run_spec(spec: &VmSpec, kvm_device: &Path, epoch: Instant) -> Result<Verdict> {
    let built = crate::launch::build(spec, kvm_device, Backends::default())?;
    guest::tell_host_cpus(&built.vm);
    let scheduler = built
        .sched
        .as_ref()
        .map(|(params, domain)| start_credit(&built.vm, *params, domain))
        .transpose();
    let run = run_collecting(built.vm, epoch)?;
    drop(built.attached);
    if let Some((member, server, driver)) = scheduler? {
        drop(server);
        drop(driver);
        drop(member);
    }
    let vcpus = spec.machine.vcpus;
    let mut verdict = run.judge(&built.benchmarks, vcpus);
    verdict.kvm_stats = Some(run.outcome.kvm_stats);
    Ok(verdict)
}

/// What a run of the embedded guest printed and how it ended.
pub struct GuestRun {
    pub events: Vec<Event>,
    pub outcome: RunOutcome,
}

impl GuestRun {
    /// The verdict on an NPB run of `specs` on `vcpus` vCPUs.
    pub fn judge(&self, specs: &[Spec], vcpus: u32) -> Verdict {
        self.judge_threads(specs, vcpus, vcpus)
    }

    /// The verdict on a VM of `vcpus` vCPUs running NPB-MPI ranks: each result is one
    /// rank's, one thread.
    pub fn judge_ranks(&self, specs: &[Spec], vcpus: u32) -> Verdict {
        self.judge_threads(specs, vcpus, 1)
    }

    fn judge_threads(&self, specs: &[Spec], vcpus: u32, threads: u32) -> Verdict {
        let fault_text;
        let ending = match &self.outcome.exit {
            GuestExit::DebugExit(v) => Ending::DebugExit(*v),
            GuestExit::Fault(report) => {
                fault_text = report.to_string();
                Ending::Fault(&fault_text)
            }
            GuestExit::HandedOff => Ending::Fault(HANDED_OFF),
            GuestExit::Stopped(cause) => Ending::Stopped(*cause),
        };
        let boot_ms = self.outcome.workload_started.map(|d| d.as_secs_f64() * 1e3);
        report::judge(specs, vcpus, threads, &self.events, ending, boot_ms)
    }

    /// The fields of the first `@kumo <kind>` measurement line, or why there is none.
    pub fn measurement(&self, kind: &str) -> Result<&std::collections::BTreeMap<String, String>> {
        self.measurement_where(kind, |_| true)
    }

    /// As [`GuestRun::measurement`], the line of MPI rank `rank` (a VM runs one rank per
    /// vCPU, each printing its own).
    pub fn rank_measurement(
        &self,
        kind: &str,
        rank: u32,
    ) -> Result<&std::collections::BTreeMap<String, String>> {
        let rank = rank.to_string();
        self.measurement_where(kind, |fields| fields.get("rank") == Some(&rank))
    }

    fn measurement_where(
        &self,
        kind: &str,
        wanted: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
    ) -> Result<&std::collections::BTreeMap<String, String>> {
        let found = self.events.iter().find_map(|e| match e {
            Event::Measurement { kind: k, fields } if k == kind && wanted(fields) => Some(fields),
            _ => None,
        });
        if let Some(fields) = found {
            return Ok(fields);
        }
        let problems: Vec<String> = self
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Error { fields } | Event::Fault { fields } => Some(format!("{fields:?}")),
                Event::Malformed(line) => Some(line.clone()),
                _ => None,
            })
            .collect();
        match &self.outcome.exit {
            GuestExit::Fault(report) => bail!("the guest crashed: {report}"),
            GuestExit::HandedOff => bail!("{HANDED_OFF} before it reported {kind}"),
            GuestExit::Stopped(cause) => bail!("kumo stopped the VM: {cause}"),
            GuestExit::DebugExit(status) => bail!(
                "the guest reported no {kind} result (exit status {status}; {})",
                if problems.is_empty() {
                    "no error lines".to_string()
                } else {
                    problems.join("; ")
                }
            ),
        }
    }
}

/// Boots `config` (the embedded guest), handing the created VM to `prepare` before it
/// runs (to attach devices, take interrupt or placement handles), and collects its
/// events.
pub fn boot_embedded<T>(
    config: VmConfig,
    epoch: Instant,
    prepare: impl FnOnce(&mut Vm) -> T,
) -> Result<(GuestRun, T)> {
    let mut vm = hv::builder::build_for_boot(config)?;
    let prepared = prepare(&mut vm);
    Ok((run_collecting(vm, epoch)?, prepared))
}

/// Runs a created VM of the embedded guest and collects its events.
pub fn run_collecting(vm: Vm, epoch: Instant) -> Result<GuestRun> {
    run_collecting_recorded(vm, epoch, None, &[])
}

/// As [`run_collecting`], with every console byte also appended to `record` (what a
/// snapshot carries), after `replay` (an earlier part of the same guest's console,
/// from a snapshot) was parsed for its events without being echoed.
pub fn run_collecting_recorded(
    vm: Vm,
    epoch: Instant,
    record: Option<Arc<Mutex<Vec<u8>>>>,
    replay: &[u8],
) -> Result<GuestRun> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut console = GuestConsole {
        parser: LineParser::default(),
        events: Arc::clone(&events),
        record,
    };
    console.parser.feed(replay, |_, event| {
        if let Some(event) = event {
            events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
        }
    });
    let outcome = vm.run(Box::new(console), epoch)?;
    let events = std::mem::take(&mut *events.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(GuestRun { events, outcome })
}

/// Boots the PVH kernel `spec` names: its console is kumo's stdout, its debug-exit
/// value kumo's exit status.
pub fn run_kernel(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    // One VM, then kumo exits: its destruction need not hold up the exit.
    hv::teardown::defer_vm_destruction();
    let json = options.json;
    // Kept until the run ends (their backend threads stop when dropped).
    let built = crate::launch::build(spec, &options.kvm_device, Backends::default())?;
    let (vm, attached) = (built.vm, built.attached);
    // The console never fails: a closed stdout loses output, not the verdict below.
    // With --json the guest's `@kumo` lines are collected (the rest goes to stderr)
    // and printed as JSON rows once it ends.
    let events = Arc::new(Mutex::new(Vec::new()));
    let console: Box<dyn Write + Send> = if json {
        Box::new(GuestConsole {
            parser: LineParser::default(),
            events: Arc::clone(&events),
            record: None,
        })
    } else {
        Box::new(crate::output::Stdout)
    };
    let outcome = vm.run(console, epoch)?;
    for (index, disk) in attached.disks.iter().enumerate() {
        tracing::debug!("disk {index}: {:?}", disk.stats());
    }
    drop(attached);
    if options.kvm_stats {
        crate::kvm_stats::print(&outcome.kvm_stats, json);
    }
    if let Some(d) = outcome.workload_started {
        eprintln!(
            "kumo: workload started {:.1} ms after kumo started",
            d.as_secs_f64() * 1e3
        );
    }
    let code = match outcome.exit {
        GuestExit::DebugExit(v) => (v & 0xff) as u8,
        GuestExit::Fault(report) => {
            let what = match report.reason {
                hv::FaultReason::HaltedForever { .. } => "ended",
                _ => "crashed",
            };
            eprintln!("kumo: the VM {what}: {report}");
            report::EXIT_FAULT
        }
        GuestExit::HandedOff => {
            eprintln!("kumo: {HANDED_OFF}");
            report::EXIT_OK
        }
        GuestExit::Stopped(cause) => {
            eprintln!("kumo: {cause}");
            report::stop_status(cause)
        }
    };
    if json {
        let events = std::mem::take(&mut *events.lock().unwrap_or_else(|e| e.into_inner()));
        print_kernel_json(&events, code);
    }
    Ok(code)
}

/// A `--kernel` run's result row: the guest's benchmark, class and threads, then its
/// result (as `kumo --json`'s rows).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelResultRow {
    pub benchmark: String,
    pub class: String,
    pub threads: u32,
    #[serde(flatten)]
    pub result: report::ResultFields,
}

/// A line of a `--kernel` run's `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum KernelJsonLine {
    Result(WithGuest<KernelResultRow>),
    Measurement(WithGuest<Probe>),
    /// The last line: kumo's exit status, and whether it is 0.
    End {
        ok: bool,
        status: u8,
    },
}

/// A `--kernel` run's `--json`: a row per `@kumo result` line (as `kumo --json` prints
/// the embedded guest's) and per measurement line, then `{"ok", "status"}`.
fn print_kernel_json(events: &[Event], status: u8) {
    for event in events {
        let line = match event {
            Event::Result(r) => {
                let (result, guest) = report::ResultFields::of(Some(r));
                let kumo = KernelResultRow {
                    benchmark: r.benchmark.clone(),
                    class: r.class.clone(),
                    threads: r.threads,
                    result,
                };
                KernelJsonLine::Result(WithGuest::new(kumo, guest))
            }
            Event::Measurement { kind, fields } => KernelJsonLine::Measurement(WithGuest::new(
                Probe {
                    probe: kind.clone(),
                },
                GuestFields::of(fields),
            )),
            _ => continue,
        };
        crate::output::json_line(&line);
    }
    crate::output::json_line(&KernelJsonLine::End {
        ok: status == report::EXIT_OK,
        status,
    });
}

/// Writes the embedded guest ELF to `path`.
pub fn dump_guest(path: &Path) -> Result<u8> {
    std::fs::write(path, EMBEDDED_GUEST)
        .with_context(|| format!("cannot write the guest to {}", path.display()))?;
    Ok(report::EXIT_OK)
}

/// The embedded guest's console: structured lines become events, the rest is echoed to
/// stderr so the guest's own messages stay visible.
struct GuestConsole {
    parser: LineParser,
    events: Arc<Mutex<Vec<Event>>>,
    record: Option<Arc<Mutex<Vec<u8>>>>,
}

impl GuestConsole {
    fn take_line(events: &Mutex<Vec<Event>>, text: &str, event: Option<Event>) {
        match event {
            Some(event) => events.lock().unwrap_or_else(|e| e.into_inner()).push(event),
            None if !text.trim().is_empty() => eprintln!("guest: {text}"),
            None => {}
        }
    }
}

impl Write for GuestConsole {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(record) = &self.record {
            record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
        }
        let events = &self.events;
        self.parser
            .feed(buf, |text, event| Self::take_line(events, text, event));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for GuestConsole {
    fn drop(&mut self) {
        let events = &self.events;
        self.parser
            .finish(|text, event| Self::take_line(events, text, event));
    }
}
