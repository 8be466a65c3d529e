//! The flags every VM run shares (`kumo` without a subcommand, and the runs that
//! take its VM options), bounds on a run, and the value parsers commands share.

use std::path::PathBuf;

use clap::Args;

pub use crate::spec::job::{NicKind, Wait, WireSpec};

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
    /// or migrate the VM mid-run with --api-socket).
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

    /// Serve the HTTP control API for this VM on the UNIX socket PATH (mode 0600):
    /// `kumo ctl --socket PATH snapshot|migrate|...`, or `curl --unix-socket PATH
    /// http://localhost/api/v1/vm.info` (docs/api.md). `--ctl-socket` is an alias.
    #[arg(long, value_name = "PATH", alias = "ctl-socket", conflicts_with_all = ["kernel", "dump_guest", "passthrough"])]
    pub api_socket: Option<PathBuf>,

    /// How a --api-socket VM tracks the pages its vCPUs write while it migrates:
    /// bitmap (KVM_GET_DIRTY_LOG) or ring (KVM's dirty ring, chosen when the VM is made).
    #[arg(long, value_name = "KIND", value_parser = dirty_log, requires = "api_socket")]
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

    /// Print the VM these flags describe (a VmSpec, as JSON: docs/json.md) and exit
    /// without booting it.
    #[arg(long)]
    pub print_spec: bool,

    /// Boot the VM a VmSpec JSON file describes (as `--print-spec` prints it); the
    /// VM's flags are then refused (only --json, --kvm-stats, --kvm-device,
    /// --timeout, --watchdog, --seccomp and --print-spec go with it).
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,

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

    /// A seccomp filter per thread kind (vCPU, backend, coordinator, API, migration,
    /// credit driver), on once each thread is set up: kill (a forbidden call ends kumo
    /// with status 3 and names the thread and the call), log (the kernel logs it), off.
    #[arg(long, value_name = "MODE", default_value = "kill", value_parser = seccomp_mode)]
    pub seccomp: hv::seccomp::Mode,
}

impl LimitArgs {
    pub fn limits(&self) -> hv::RunLimits {
        let duration = |s: f64| (s > 0.0).then(|| std::time::Duration::from_secs_f64(s));
        hv::RunLimits {
            timeout: self.timeout.and_then(duration),
            since: None,
            watchdog: duration(self.watchdog),
        }
    }
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

pub fn irq_path(text: &str) -> Result<hv::irq::IrqPath, String> {
    text.parse()
}

pub fn seccomp_mode(text: &str) -> Result<hv::seccomp::Mode, String> {
    text.parse()
}

pub fn dirty_log(text: &str) -> Result<hv::migration::dirty::DirtyLogMode, String> {
    text.parse()
}

pub fn seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.0..=1e6).contains(&s) => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0 to 1000000"
        )),
    }
}
