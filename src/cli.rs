//! The command line. Its shape is relied on by tests and later subcommands: keep it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use crate::spec::job::{NicKind, Wait, WireSpec};

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
    /// Inspect and change a running kumo node through its control socket.
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

#[derive(Args, Debug)]
pub struct DiskImageArgs {
    /// The image file to write (replaced if it exists).
    #[arg(long, value_name = "IMG")]
    pub out: PathBuf,

    /// Benchmarks the guest runs, comma-separated kernel.class items [default: every
    /// kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// More of the guest's command line, after `npb=` (docs/guest-abi.md).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
}

#[derive(Args, Debug)]
pub struct ExperimentArgs {
    /// The experiment: s1 (credit-scheduler slice, tick and domain-0 weight for MPI
    /// ranks that busy-wait), s2 (MPI latency and throughput through passthrough and
    /// emulated NICs), s4 (a passthrough NIC and its fast interrupt path) or migrate
    /// (S1's migration of a VM of a running MPI job, default against tuned slice).
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Shorter: s1 runs its seven benchmarks at class W (BT, LU, SP at S; EP at A)
    /// instead of A, and only Xen 3.4.2's baseline and the settings the paper gives
    /// numbers for; s2 runs 3 message sizes instead of 6;
    /// s4 runs CG and IS at class S; migrate runs CG.W instead of CG.A, and no
    /// migration and one stop-and-copy one only.
    #[arg(long)]
    pub quick: bool,

    /// Runs of each scenario (interleaved: every scenario once per round).
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub runs: u32,

    /// Print the whole report as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Write the JSON report, the simulation file and the SVG figure here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct NicServerArgs {
    /// Directory for the ports' sockets (`DIR/port-K.sock`).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,

    /// Ports (NICs) to serve.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub ports: u32,

    /// The MPI rank of port 0's MAC (port K has rank R+K's MAC, as `kumo mpi` gives).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub first_rank: u32,

    /// Host CPUs the server's threads may run on, comma-separated [default: any].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub cpus: Vec<usize>,

    /// Microseconds the switch thread polls for doorbells after its last frame before
    /// it sleeps (hardware does not sleep; give it only with CPUs of its own).
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub poll_us: u64,
}

/// A switch: `on` or `off`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn is_on(self) -> bool {
        self == OnOff::On
    }
}

#[derive(Args, Debug)]
pub struct MpiArgs {
    /// VMs of this host in the job.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vms: u32,

    /// vCPUs of each VM: one MPI rank per vCPU, each with its own NIC.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub vcpus: u32,

    /// MPI ranks per vCPU (1 to 16), multiplexed by the guest's own preemptive
    /// scheduler; ranks of one VM then talk through its shared memory.
    #[arg(long, value_name = "R", default_value_t = 1)]
    pub ranks_per_vcpu: u32,

    /// The guest scheduler's tick in Hz (1 to 5000) [default: 250 with
    /// --ranks-per-vcpu above 1, else no tick].
    #[arg(long, value_name = "HZ")]
    pub guest_hz: Option<u32>,

    /// Ranks of the whole job, when some run across --wire [default: --vms x --vcpus].
    #[arg(long, value_name = "S")]
    pub job_size: Option<u32>,

    /// The rank of this process's first VM's first vCPU (the others follow).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub first_rank: u32,

    /// A wire to VMs outside this process, in QEMU's `-netdev stream` framing:
    /// `unix:PATH` or `tcp:HOST:PORT` connects (to QEMU's `server=on`; an IPv6 HOST in
    /// brackets), `listen:unix:PATH` or `listen:tcp:HOST:PORT` waits for a peer (QEMU's
    /// `server=off`, or another kumo's `unix:`/`tcp:`) and, when it leaves,
    /// takes the next one on the same port (a rank VM migrated elsewhere rejoining).
    #[arg(long, value_name = "SPEC")]
    pub wire: Option<WireSpec>,

    /// Seconds the wire waits for its peer (to listen, or to connect).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = seconds)]
    pub wire_wait: f64,

    /// How ranks wait for messages.
    #[arg(long, value_enum, default_value_t = Wait::Spin)]
    pub wait: Wait,

    /// NPB-MPI kernels to run across the ranks, comma-separated (`ep.S,is.S,cg.S`;
    /// kernels with an MPI form: ep, is, cg, ft, mg, lu, sp, bt). Without it: the MPI
    /// self-check.
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// Interrupt path of every NIC.
    #[arg(long, value_name = "PATH", default_value = "generic", value_parser = irq_path)]
    pub irq_path: hv::irq::IrqPath,

    /// The VMs' NIC: emulated (domain 0's switch) or passthrough (a port each of a
    /// `kumo nic-server` this run starts, or of the one at --nic-server).
    #[arg(long, value_enum, default_value_t = NicKind::Emulated)]
    pub nic: NicKind,

    /// With --nic passthrough: use the running `kumo nic-server --dir DIR` instead of
    /// starting one (rank R on port R - first rank).
    #[arg(long, value_name = "DIR")]
    pub nic_server: Option<PathBuf>,

    /// Print one JSON object per rank, then one for the job.
    #[arg(long)]
    pub json: bool,

    /// Serve the control socket (mode 0600) of this process's one VM (--vms 1, with
    /// --npb): `kumo ctl ... migrate` moves the rank to a `kumo --incoming`, which
    /// rejoins the job on the same wire (the VM's side must connect: --wire unix:PATH).
    #[arg(long, value_name = "PATH")]
    pub ctl_socket: Option<PathBuf>,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Args, Debug)]
pub struct NetBenchArgs {
    /// Message sizes, comma-separated (K and M are binary units).
    #[arg(long, value_name = "LIST", default_value = "8,1K,64K,1M")]
    pub sizes: String,

    /// Interrupt path of both NICs [default: both, side by side].
    #[arg(long, value_name = "PATH", value_parser = irq_path)]
    pub irq_path: Option<hv::irq::IrqPath>,

    /// How the ranks wait [default: both, side by side].
    #[arg(long, value_enum)]
    pub wait: Option<Wait>,

    /// Round trips per size [default: the guest's, 32 MiB / max(size, 16 KiB) + 10].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,

    /// NIC of both VMs [default: emulated and passthrough, side by side].
    #[arg(long, value_enum)]
    pub nic: Option<NicKind>,

    /// Also run the same guest and sizes on two QEMU VMs (virtio-net-pci on a
    /// `-netdev stream` wire), beside kumo's rows.
    #[arg(long)]
    pub qemu: bool,

    /// Print one JSON object per size and setting.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// The simulation file (TOML; see examples/sim-s1.toml).
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Print one JSON object (every run) instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The node's control socket (printed by `kumo node` at start).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,

    /// Print the node's JSON reply instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Show the credit scheduler's parameters, or set some of them.
    SchedCredit {
        /// Time slice in milliseconds.
        #[arg(long, value_name = "MS")]
        tslice_ms: Option<f64>,
        /// Accounting tick in milliseconds.
        #[arg(long, value_name = "MS")]
        tick_ms: Option<f64>,
        /// Minimum run time before preemption in microseconds (0 = off).
        #[arg(long, value_name = "US")]
        ratelimit_us: Option<u64>,
        /// exact, or tick (Xen 3.4: each tick debits a whole tick from the vCPU it
        /// finds running; no ratelimit).
        #[arg(long, value_name = "MODE")]
        accounting: Option<sched::Accounting>,
        /// on: a vCPU blocked at a barrier (paravirtual wait page) BOOSTs its
        /// domain's queued vCPUs that have not arrived; off (default): ignore it.
        #[arg(long, value_name = "on|off")]
        directed_yield: Option<OnOff>,
    },
    /// Domains of the node.
    #[command(subcommand)]
    Domain(DomainCommand),
    /// vCPU ballooning (`kumo --vcpu-balloon`): show how many host CPUs the running
    /// VM's guest is told it has, or change it; a ballooning guest then runs its
    /// team on that many vCPUs from its next barrier and parks the others.
    VcpuBalloon {
        /// The node's domain (a node has several VMs; a single VM needs none).
        #[arg(long, value_name = "NAME")]
        domain: Option<String>,
        /// Host CPUs for the guest (1 up to its vCPU count).
        #[arg(long, value_name = "N")]
        active: Option<u32>,
    },
    /// Save the running VM to a file (`kumo --restore PATH` runs it again).
    Snapshot {
        /// The snapshot file to write (mode 0600).
        path: PathBuf,
        /// End the VM once it is saved (otherwise it runs on).
        #[arg(long)]
        stop: bool,
    },
    /// Move the running VM to another kumo started with `--incoming`; the source
    /// ends only once the destination runs it.
    Migrate {
        /// The destination, tcp:HOST:PORT.
        target: String,
        /// A file holding the secret both ends share.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Iterate copy rounds until the last one would take at most this long.
        #[arg(long, value_name = "MS")]
        max_downtime_ms: Option<u64>,
        /// Give up, the VM running on here, if the destination does not acknowledge
        /// a copy round within this long (default 30000).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ack_timeout_ms: Option<u64>,
        /// Pause the VM first and copy it once (non-live): the downtime is the whole
        /// transfer.
        #[arg(long, conflicts_with = "max_downtime_ms")]
        stop_and_copy: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum DomainCommand {
    /// Every domain with its weight, cap and CPU time so far.
    List,
    /// Change a domain's weight and/or cap.
    Set {
        /// The domain's name.
        name: String,
        #[arg(long, value_name = "W")]
        weight: Option<u32>,
        /// Percent of one host CPU; 0 = no cap.
        #[arg(long, value_name = "C")]
        cap: Option<u32>,
    },
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node file (TOML; see examples/).
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Where to create the control socket [default: $XDG_RUNTIME_DIR or /tmp,
    /// kumo-<pid>.sock].
    #[arg(long, value_name = "PATH")]
    pub ctl_socket: Option<PathBuf>,

    /// Print one JSON object per domain, then one for the node.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Guest/native time ratio per benchmark, from alternating native and guest runs.
    Overhead(OverheadArgs),
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
    /// Run a fixed, short suite of kumo's primitives (boot, process start, exits,
    /// interrupts, vCPU switches, messages, dirty log, migration, NPB guest/native)
    /// and write a performance record (JSON) for `kumo bench compare`.
    Record(RecordArgs),
    /// Compare two performance records: each figure's change against a noise band from
    /// the records' own spread; exit 1 if any figure got worse beyond it.
    Compare(CompareArgs),
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// The record to write (docs/results/perf/YYYY-MM-DD-<short commit>.json for one to
    /// keep).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Rounds of the suite; each runs every primitive once (with its reference) [default:
    /// 20, under 3 minutes on a quiet 2-core host; 1 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,

    /// A much shorter suite (smaller inputs, fewer repetitions, class S instead of W):
    /// for tests, not a record to compare with a full one.
    #[arg(long)]
    pub quick: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The record before the change.
    #[arg(value_name = "OLD.json")]
    pub old: PathBuf,

    /// The record after it.
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ProcessBenchArgs {
    /// The PVH ELF to boot [default: a trivial kernel that prints a line and exits].
    #[arg(long, value_name = "ELF")]
    pub kernel: Option<PathBuf>,

    /// The exit status --kernel's kernel ends with (its debug-exit value).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "kernel")]
    pub status: u8,

    /// Guest memory of both VMMs, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub memory: u64,

    /// Runs of each VMM (interleaved).
    #[arg(long, value_name = "R", default_value_t = 20)]
    pub runs: u32,

    /// Leave QEMU out even if it is installed.
    #[arg(long)]
    pub no_qemu: bool,

    /// Print one JSON object per VMM and one for the comparison.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct OversubArgs {
    /// Benchmarks, comma-separated kernel.class items.
    #[arg(long, value_name = "LIST", default_value = "cg.W")]
    pub npb: String,

    /// vCPU (and native thread) counts, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "2,12")]
    pub vcpus: String,

    /// Guest wait mechanisms to compare, comma-separated (pv, hlt).
    #[arg(long, value_name = "LIST", default_value = "pv,hlt")]
    pub wait: String,

    /// Rounds; each runs every setting once, in turn.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub runs: u32,

    /// vCPU ballooning settings to compare for each guest run, comma-separated (off,
    /// on, auto: on when the vCPUs outnumber the host CPUs).
    #[arg(long, value_name = "LIST", default_value = "off,auto")]
    pub balloon: String,

    /// Barrier spins to compare, comma-separated: `team` (kumo's for a VM alone:
    /// none when vCPUs outnumber host CPUs), `shared` (the spin before issue 16 and
    /// of nodes: 50 us when they do), or microseconds. Both with a CPU per thread:
    /// 2000 us.
    #[arg(long, value_name = "LIST", default_value = "team")]
    pub spin: String,

    /// Print one JSON object per setting instead of a table.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct MigrateBenchArgs {
    /// vCPUs of the guest.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub memory: u64,

    /// Migrate this long after the VM starts, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub after_ms: u64,

    /// Downtime target of the copy rounds [default: 300, QEMU's].
    #[arg(long, value_name = "MS")]
    pub max_downtime_ms: Option<u64>,

    /// Migrations to make (one VM each).
    #[arg(long, value_name = "R", default_value_t = 5)]
    pub runs: u32,

    /// Dirty-page trackers to measure, comma-separated, taken in turn run after run
    /// (interleaved): bitmap (KVM_GET_DIRTY_LOG), ring (KVM's dirty ring).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "bitmap,ring", value_parser = dirty_log)]
    pub dirty_log: Vec<hv::migration::dirty::DirtyLogMode>,

    /// Run these NPB benchmarks in the guest instead of the TSC gap probe (the
    /// destination must verify them; there is no guest-seen downtime then).
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// After each kumo run, QEMU migrates the same guest (PVH on microvm, QMP
    /// `migrate` to `-incoming tcp:` on loopback): its total time and downtime beside.
    #[arg(long)]
    pub qemu: bool,

    /// Print one JSON object per run and a summary.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

fn irq_path(text: &str) -> Result<hv::irq::IrqPath, String> {
    text.parse()
}

fn dirty_log(text: &str) -> Result<hv::migration::dirty::DirtyLogMode, String> {
    text.parse()
}

#[derive(Args, Debug)]
pub struct IrqBenchArgs {
    /// The path to measure: generic (one event-loop thread, KVM_SIGNAL_MSI) or fast
    /// (irqfd per vector) [default: both, side by side].
    #[arg(long, value_name = "PATH", value_parser = irq_path)]
    pub path: Option<hv::irq::IrqPath>,

    /// Interrupts per second of a second, noisy device on the generic path (0: none).
    #[arg(long, value_name = "HZ", default_value_t = 0.0)]
    pub noise_rate: f64,

    /// vCPUs of the guest.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// The vCPU the test vector is aimed at.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub target_vcpu: u32,

    /// Doorbell rounds (one interrupt outstanding at a time).
    #[arg(long, value_name = "R", default_value_t = 2000)]
    pub rounds: u32,

    /// The device's delay between doorbell and interrupt, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub delay_us: u64,

    /// Print one JSON object per path.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct WakeArgs {
    /// Credit slices to compare, in milliseconds, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "30,1")]
    pub tslice_ms: String,

    /// How long each setting measures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    pub millis: u64,

    /// The sleeper's timer period, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    pub period_us: u64,

    /// The host CPU both domains share.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Print one JSON object per setting.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct PreemptArgs {
    /// Benchmarks, comma-separated kernel.class items, each run on one thread / vCPU.
    #[arg(long, value_name = "LIST", default_value = "ep.W,bt.W")]
    pub npb: String,

    /// The waker's wake-ups per second.
    #[arg(long, value_name = "HZ", default_value_t = 2000)]
    pub hz: u32,

    /// vCPUs of the guest and threads of the native twin. With 1, everything runs on
    /// `--pcpu`; with more, only the waker does.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u32,

    /// Rounds (each: native, guest, native with the waker, guest with the waker).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: u32,

    /// The host CPU the waker (and with one vCPU, everything) runs on.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Print one JSON object per benchmark.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

/// How a scheduler hands a host CPU from one vCPU to another (`hv::placement`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// SCHED_FIFO ranks: the kernel preempts inside KVM_RUN.
    Fifo,
    /// Park the running vCPU outside KVM_RUN (signal kick), unpark the next.
    Park,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fifo => "fifo",
            Mechanism::Park => "park",
        }
    }
}

#[derive(Args, Debug)]
pub struct SwitchArgs {
    /// The mechanism to measure.
    #[arg(long, value_enum, default_value_t = Mechanism::Fifo)]
    pub mechanism: Mechanism,

    /// Time each vCPU holds the host CPU before the switch, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    pub slice_us: u64,

    /// How long the guest measures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub millis: u64,

    /// The host CPU both vCPUs share (the controller runs on the next one).
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct OverheadArgs {
    /// Benchmarks, comma-separated kernel.class items [default: every kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// vCPUs of the guest and threads of the native run.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Native/guest pairs per benchmark.
    #[arg(long, value_name = "R", default_value_t = 5)]
    pub runs: u32,

    /// Also run the same guest on QEMU (same vCPUs, memory and command line, RAM on a
    /// memfd as kumo's) in every round, after the native and kumo runs.
    #[arg(long)]
    pub qemu: bool,

    /// Both sides on the host's 2 MiB huge pages: the guest's RAM (`kumo --huge-pages`,
    /// and QEMU's with `--qemu`) and the native arena (`kumo native --huge-pages`).
    #[arg(long)]
    pub huge_pages: bool,

    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[derive(Args, Debug)]
pub struct NativeArgs {
    /// Benchmarks, comma-separated kernel.class items [default: every kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// Worker threads [default: 2, like the VM's default vCPUs].
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub threads: u32,

    /// Run the NPB-MPI forms (`kumo mpi --npb`) on N ranks, one host thread each,
    /// messages over in-process channels: the native twin of an MPI job.
    #[arg(long, value_name = "N", conflicts_with = "threads")]
    pub mpi_ranks: Option<u32>,

    /// Put the team's arena on the host's 2 MiB huge pages (`MAP_HUGETLB`, from the
    /// pool of /proc/sys/vm/nr_hugepages): the native side of `kumo --huge-pages`.
    #[arg(long, conflicts_with = "mpi_ranks")]
    pub huge_pages: bool,

    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Running a VM: the embedded NPB guest, or any PVH kernel with --kernel.
#[derive(Args, Debug)]
pub struct VmArgs {
    /// Number of virtual CPUs (may exceed the host's cores).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Guest memory in MiB [default: what the workload needs, at least 64].
    #[arg(long, value_name = "MIB")]
    pub memory: Option<u64>,

    /// Back guest RAM with the host's 2 MiB huge pages (hugetlbfs, from the pool of
    /// /proc/sys/vm/nr_hugepages), all taken at start; --memory must then be even.
    #[arg(long)]
    pub huge_pages: bool,

    /// Benchmarks for the embedded guest, comma-separated kernel.class items (ep.S,ep.W).
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,

    /// When the VM ends, also print what KVM counted in the kernel for it and for each
    /// vCPU (exits, halts, page faults, TLB flushes): the exits kumo never sees.
    #[arg(long)]
    pub kvm_stats: bool,

    /// Boot this PVH ELF instead of the embedded guest; its console goes to stdout and
    /// kumo exits with the status the guest writes to the debug-exit port.
    #[arg(long, value_name = "ELF")]
    pub kernel: Option<PathBuf>,

    /// Command line for --kernel (the embedded guest's is built from --npb).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,

    /// A module (initrd-like blob) handed to --kernel through hvm_start_info; repeatable.
    #[arg(long, value_name = "PATH")]
    pub module: Vec<PathBuf>,

    /// A virtio-blk disk for --kernel on a raw image file; repeatable. `readonly`
    /// refuses the guest's writes; `io=` says which thread serves its requests.
    #[arg(long, value_name = "PATH[,readonly][,io=vcpu|thread]")]
    pub disk: Vec<hv::block::DiskSetup>,

    /// Schedule the vCPUs with kumo's credit scheduler on every host CPU, e.g.
    /// `credit` (Xen's defaults) or `credit:tslice=1ms,tick=1ms,ratelimit=100us`.
    #[arg(long, value_name = "SPEC")]
    pub sched: Option<String>,

    /// How the guest's threads sleep at a barrier after their spin: pv (blocked in
    /// kumo on the barrier's word through the paravirtual wait page), hlt (halt
    /// until an IPI), or auto (pv when the vCPUs outnumber the host's CPUs).
    #[arg(long, value_enum, default_value_t = crate::guest::BarrierWait::Auto)]
    pub barrier_wait: crate::guest::BarrierWait,

    /// vCPU ballooning: the guest runs its team's threads as green threads on only as
    /// many vCPUs as kumo may use host CPUs and parks the rest (same threads, same
    /// results); on, off, or auto (on when the vCPUs outnumber those CPUs).
    /// `kumo ctl vcpu-balloon` changes the count while it runs.
    #[arg(long, value_enum, default_value_t = crate::guest::VcpuBalloon::Auto)]
    pub vcpu_balloon: crate::guest::VcpuBalloon,

    /// Attach kumo's interrupt test device and run the guest's delivery check instead
    /// of NPB: every vector to every vCPU (re-targeted live), masking and the PBA.
    #[arg(long)]
    pub irq_check: bool,

    /// Interrupt path of the test device or the --passthrough devices: generic (one
    /// event-loop thread, KVM_SIGNAL_MSI) or fast (an irqfd per vector, routed where the
    /// guest aims it).
    #[arg(long, value_name = "PATH", default_value = "generic", value_parser = irq_path)]
    pub irq_path: hv::irq::IrqPath,

    /// With --irq-check: instead of the delivery check, N doorbell rounds on vector 0,
    /// one interrupt outstanding at a time, lost ones counted (long enough to snapshot
    /// or migrate the VM mid-run with --ctl-socket).
    #[arg(long, value_name = "N", requires = "irq_check")]
    pub irq_rounds: Option<u32>,

    /// Attach a PCI device that lives outside kumo (repeatable): `vfio-user:PATH`, a
    /// device served over vfio-user at the UNIX socket PATH (e.g. a port of `kumo
    /// nic-server`), or a host device `DDDD:BB:DD.F` through the kernel's VFIO. Its
    /// interrupts take --irq-path.
    #[arg(long, value_name = "SPEC")]
    pub passthrough: Vec<String>,

    /// Write the embedded guest ELF to PATH and exit (boot it elsewhere: QEMU, Xen).
    #[arg(long, value_name = "PATH")]
    pub dump_guest: Option<PathBuf>,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    /// Serve a control socket for this VM at PATH (mode 0600): `kumo ctl --socket
    /// PATH snapshot|migrate`.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["kernel", "dump_guest", "passthrough"])]
    pub ctl_socket: Option<PathBuf>,

    /// How a --ctl-socket VM tracks the pages its vCPUs write while it migrates:
    /// bitmap (KVM_GET_DIRTY_LOG) or ring (KVM's dirty ring, chosen when the VM is made).
    #[arg(long, value_name = "KIND", value_parser = dirty_log, requires = "ctl_socket")]
    pub dirty_log: Option<hv::migration::dirty::DirtyLogMode>,

    /// Run the VM saved in PATH (by `kumo ctl ... snapshot`) from where it was saved.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["kernel", "npb", "irq_check", "sched", "dump_guest", "incoming"])]
    pub restore: Option<PathBuf>,

    /// Wait for one VM migrated to tcp:HOST:PORT and run it.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["kernel", "npb", "irq_check", "sched", "dump_guest"])]
    pub incoming: Option<String>,

    /// With --incoming: the file holding the secret the source must prove it knows.
    #[arg(long, value_name = "FILE", requires = "incoming")]
    pub token_file: Option<PathBuf>,

    #[command(flatten)]
    pub limits: LimitArgs,
}

/// Bounds on a run of VMs.
#[derive(Args, Debug, Clone, Copy)]
pub struct LimitArgs {
    /// Stop each VM after this many seconds of wall time (exit status 4).
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub timeout: Option<f64>,

    /// End a VM (exit status 3, with a report) when one of its vCPUs uses this many
    /// seconds of CPU time with no exit and no change of its registers; 0: no watchdog.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0, value_parser = seconds)]
    pub watchdog: f64,
}

impl LimitArgs {
    pub fn limits(&self) -> hv::RunLimits {
        let duration = |s: f64| (s > 0.0).then(|| std::time::Duration::from_secs_f64(s));
        hv::RunLimits {
            timeout: self.timeout.and_then(duration),
            watchdog: duration(self.watchdog),
        }
    }
}

fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.0..=1e6).contains(&s) => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0 to 1000000"
        )),
    }
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
const VM_RUN: [&str; 4] = ["vcpus", "kvm_device", "timeout", "watchdog"];

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
                "ctl_socket",
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
                "ctl_socket",
                "dirty_log",
            ],
            Mode::DumpGuest => &["dump_guest"],
            Mode::Restore => &["restore", "json", "ctl_socket"],
            Mode::Incoming => &["incoming", "token_file", "json", "ctl_socket"],
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
    if matches.subcommand().is_none() {
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
