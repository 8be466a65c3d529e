//! The command line: the top-level parser and its subcommands (each command's
//! arguments live in the command's own module), and which top-level options each
//! run without a subcommand reads.

use clap::{Parser, Subcommand};
use kumo_lab::experiment::ExperimentArgs;
use kumo_lab::native::NativeArgs;
use kumo_lab::sim::SimArgs;
use kumo_vmm::args::VmArgs;
use kumo_vmm::ctl::CtlArgs;
use kumo_vmm::irq::IrqBenchArgs;
use kumo_vmm::nic_server::NicServerArgs;
use kumo_vmm::node::NodeArgs;

use crate::bench::api::ApiArgs;
use crate::bench::compare::CompareArgs;
use crate::bench::migrate::MigrateBenchArgs;
use crate::bench::overhead::OverheadArgs;
use crate::bench::oversub::OversubArgs;
use crate::bench::preempt::PreemptArgs;
use crate::bench::process::ProcessBenchArgs;
use crate::bench::soak::SoakArgs;
use crate::bench::suite::RecordArgs;
use crate::bench::switch::SwitchArgs;
use crate::bench::wake::WakeArgs;
use crate::disk_image::DiskImageArgs;
use crate::mpi::{MpiArgs, NetBenchArgs};

#[derive(Parser, Debug)]
#[command(
    name = "kumo",
    version,
    about = "A research hypervisor for HPC experiments: boots PVH guests on KVM and runs NPB in them",
    after_help = "With no arguments kumo boots its embedded NPB guest on 2 vCPUs and runs every \
                  benchmark it has, class S.\nGuest protocol and boot ABI: docs/guest-abi.md.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub vm: VmArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the same NPB code as ordinary host threads: the baseline for overhead figures.
    Native(NativeArgs),
    /// Measurements (benchmarks, not tests).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run several VMs (domains) on a set of host CPUs, from a node file.
    Node(NodeArgs),
    /// Inspect and change a running kumo (VM or node) through its HTTP API socket.
    Ctl(CtlArgs),
    /// Simulate a cluster under the credit scheduler (the same scheduler code).
    Sim(SimArgs),
    /// An MPI job across VMs of this host, on domain 0's switch.
    Mpi(MpiArgs),
    /// Rerun a seed experiment on real VMs and the simulator, beside the paper's numbers.
    Experiment(ExperimentArgs),
    /// Serve NIC ports (virtio-net PCI functions on one Ethernet) over vfio-user, one
    /// UNIX socket per port: the hardware for `--passthrough vfio-user:PATH`.
    NicServer(NicServerArgs),
    /// Write a raw disk image (GPT, an EFI system partition holding the NPB guest as a
    /// bzImage and a Boot Loader Specification entry) that a firmware boots:
    /// `kumo --kernel hypervisor-fw --disk IMG`.
    DiskImage(DiskImageArgs),
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Guest/native time ratio per benchmark, from alternating native and guest runs.
    Overhead(OverheadArgs),
    /// The HTTP control API: GET vm.info round trips, and what 100 clients polling
    /// vm.counters cost a guest (runs with and without them, alternated).
    Api(ApiArgs),
    /// Cost of switching a host CPU between two vCPUs, per scheduling mechanism.
    Switch(SwitchArgs),
    /// Wake-up latency of a halted vCPU beside a busy one, per credit slice.
    Wake(WakeArgs),
    /// What one preemption costs a guest and its native twin running the same
    /// benchmark: each beside a waker thread on one host CPU, and without it.
    Preempt(PreemptArgs),
    /// Interrupt latency of the test device, generic path vs fast path.
    Irq(IrqBenchArgs),
    /// Live migration on loopback: host downtime beside the downtime the guest saw.
    Migrate(MigrateBenchArgs),
    /// Ping-pong latency and bandwidth between two VMs through domain 0's switch.
    Net(NetBenchArgs),
    /// Whole-process cost of booting a trivial kernel, start to exit, beside QEMU's
    /// microvm on the same ELF when QEMU is installed.
    Process(ProcessBenchArgs),
    /// Where the time goes at barriers when vCPUs outnumber host CPUs: guest (each
    /// wait mechanism) beside native threads, interleaved.
    Oversub(OversubArgs),
    /// Many boots and loopback live migrations in one process: fails if RSS, open
    /// file descriptors or threads grow after the warm-up.
    Soak(SoakArgs),
    /// Run a fixed, short suite of kumo's primitives (boot, process start, exits,
    /// interrupts, vCPU switches, messages, dirty log, migration, NPB guest/native)
    /// and write a performance record (JSON) for `kumo bench compare`.
    Record(RecordArgs),
    /// Compare two performance records: each figure's change against a noise band from
    /// the records' own spread; exit 1 if any figure got worse beyond it.
    Compare(CompareArgs),
}

/// The runs `kumo` makes without a subcommand, and which top-level options each reads.
/// An option given on the command line that the chosen run does not read is refused
/// with one line naming it: a new option must be listed for the runs that read it, or
/// every run refuses it. (Subcommands have options of their own and need no table.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The embedded NPB guest (no mode option given).
    Embedded,
    Kernel,
    IrqCheck,
    DumpGuest,
    /// `--restore FILE`.
    Restore,
    /// `--incoming ADDR`.
    Incoming,
}

/// Options every VM run reads.
const VM_RUN: [&str; 6] = [
    "vcpus",
    "kvm_device",
    "timeout",
    "watchdog",
    "seccomp",
    "print_spec",
];

/// The options that go with `--spec FILE`: how the run is bounded and printed, not
/// what the VM is (the file says that).
const WITH_SPEC: [&str; 8] = [
    "spec",
    "print_spec",
    "json",
    "kvm_stats",
    "kvm_device",
    "timeout",
    "watchdog",
    "seccomp",
];

impl Mode {
    const ALL: [Mode; 6] = [
        Mode::Embedded,
        Mode::Kernel,
        Mode::IrqCheck,
        Mode::DumpGuest,
        Mode::Restore,
        Mode::Incoming,
    ];

    pub fn of(vm: &VmArgs) -> Mode {
        if vm.dump_guest.is_some() {
            Mode::DumpGuest
        } else if vm.irq_check {
            Mode::IrqCheck
        } else if vm.kernel.is_some() {
            Mode::Kernel
        } else if vm.restore.is_some() {
            Mode::Restore
        } else if vm.incoming.is_some() {
            Mode::Incoming
        } else {
            Mode::Embedded
        }
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Embedded => "runs of the embedded NPB guest",
            Mode::Kernel => "--kernel runs",
            Mode::IrqCheck => "--irq-check runs",
            Mode::DumpGuest => "--dump-guest",
            Mode::Restore => "--restore runs",
            Mode::Incoming => "--incoming runs",
        }
    }

    /// The options (clap ids: field names) this run reads besides [`VM_RUN`].
    fn own_options(self) -> &'static [&'static str] {
        match self {
            Mode::Embedded => &[
                "memory",
                "npb",
                "json",
                "sched",
                "api_socket",
                "dirty_log",
                "passthrough",
                "irq_path",
                "barrier_wait",
                "vcpu_balloon",
                "kvm_stats",
                "huge_pages",
            ],
            Mode::Kernel => &[
                "kernel",
                "json",
                "memory",
                "huge_pages",
                "cmdline",
                "module",
                "disk",
                "passthrough",
                "irq_path",
                "kvm_stats",
            ],
            Mode::IrqCheck => &[
                "irq_check",
                "irq_path",
                "irq_rounds",
                "json",
                "api_socket",
                "dirty_log",
            ],
            Mode::DumpGuest => &["dump_guest"],
            Mode::Restore => &["restore", "json", "api_socket"],
            Mode::Incoming => &["incoming", "token_file", "json", "api_socket"],
        }
    }

    fn reads(self, id: &str) -> bool {
        // A restored or migrated VM keeps the vCPUs it was saved with.
        let saved_shape = matches!(self, Mode::Restore | Mode::Incoming) && id == "vcpus";
        self.own_options().contains(&id)
            || (self != Mode::DumpGuest && VM_RUN.contains(&id) && !saved_shape)
    }
}

/// Parses the command line (clap reports its own errors and exits), then refuses any
/// top-level option the chosen run would ignore.
pub fn parse() -> Result<Cli, String> {
    use clap::parser::ValueSource;
    use clap::{CommandFactory, FromArgMatches};
    let command = Cli::command();
    let args: Vec<(String, String)> = command
        .get_arguments()
        .map(|a| {
            let flag = a
                .get_long()
                .map_or_else(|| a.get_id().to_string(), |l| format!("--{l}"));
            (a.get_id().to_string(), flag)
        })
        .collect();
    let matches = command.get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if matches.subcommand().is_none() && cli.vm.spec.is_some() {
        for (id, flag) in &args {
            let given = matches.value_source(id) == Some(ValueSource::CommandLine);
            if given && !WITH_SPEC.contains(&id.as_str()) {
                return Err(format!(
                    "{flag} does not go with --spec: the file describes the VM (only --json, \
                     --kvm-stats, --kvm-device, --timeout, --watchdog, --seccomp and \
                     --print-spec do)"
                ));
            }
        }
    } else if matches.subcommand().is_none() {
        let mode = Mode::of(&cli.vm);
        for (id, flag) in &args {
            let given = matches.value_source(id) == Some(ValueSource::CommandLine);
            if given && !mode.reads(id) {
                let readers: Vec<&str> = Mode::ALL
                    .iter()
                    .filter(|m| m.reads(id))
                    .map(|m| m.name())
                    .collect();
                return Err(format!(
                    "{flag} does not apply to {} (only to {})",
                    mode.name(),
                    readers.join(", ")
                ));
            }
        }
        // VM runs read --irq-path only for their --passthrough devices.
        let irq_path_given = matches.value_source("irq_path") == Some(ValueSource::CommandLine);
        if irq_path_given && !cli.vm.irq_check && cli.vm.passthrough.is_empty() {
            return Err(
                "--irq-path applies to --passthrough devices and --irq-check runs".to_string(),
            );
        }
    }
    Ok(cli)
}
