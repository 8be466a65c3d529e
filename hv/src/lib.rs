//! kumo's VMM core: a KVM VM with memfd-backed RAM, the in-kernel irqchip and one
//! thread per vCPU, booting a PVH ELF kernel as `docs/guest-abi.md` describes.
//!
//! ```no_run
//! let config = hv::VmConfig {
//!     vcpus: 1,
//!     memory_mib: 64,
//!     kernel: hv::testing::PvhImage::new(&[0xb0, 0x2a, 0xe6, 0xf4]).build().into(),
//!     cmdline: String::new(),
//!     modules: Vec::new(),
//!     kvm_device: "/dev/kvm".into(),
//!     huge_pages: false,
//! };
//! let outcome = hv::builder::build_for_boot(config)?.run(Box::new(std::io::stdout()), std::time::Instant::now())?;
//! assert!(matches!(outcome.exit, hv::GuestExit::DebugExit(0x2a)));
//! # Ok::<(), hv::Error>(())
//! ```

pub mod acpi;
pub mod backend_worker;
pub mod bar_windows;
pub mod block;
pub mod boot;
pub mod builder;
pub mod coordinator;
pub mod cpuid;
pub mod credit;
pub mod device_manager;
mod doorbells;
pub mod elf;
mod fault;
pub mod halt;
pub mod irq;
pub mod irq_device;
mod kick;
mod kvm;
pub mod kvm_stats;
pub mod layout;
mod machine;
pub mod memory_map;
pub mod migration;
pub mod net;
pub mod passthrough;
pub mod placement;
pub mod presence;
pub mod pvwait;
pub mod regs;
pub mod seccomp;
pub mod stop;
pub mod teardown;
pub mod testing;
mod vcpu;
mod vm;
pub mod watchdog;
mod wire;
pub mod wire_socket;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use coordinator::DeviceHealth;
pub use fault::{CpuMode, FaultReason, FaultReport, Registers};
pub use kvm::host_tsc_khz;
pub use stop::{RunLimits, StopCause};
pub use vm::Vm;

/// What to boot and on how much.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The PVH ELF kernel's bytes: borrowed when they are the program's own (copying
    /// kumo's 820 KiB guest into a fresh allocation cost ~0.7 ms of boot in page
    /// faults), owned when read from a file.
    pub kernel: std::borrow::Cow<'static, [u8]>,
    pub cmdline: String,
    /// Loaded page-aligned after the kernel and listed in `hvm_start_info`.
    pub modules: Vec<Vec<u8>>,
    /// Normally `/dev/kvm`.
    pub kvm_device: PathBuf,
    /// Back guest RAM with the host's 2 MiB hugetlbfs pages (the pool of
    /// `/proc/sys/vm/nr_hugepages`), all taken when the VM is created, instead of
    /// 4 KiB shared-memory pages taken as the guest touches them.
    pub huge_pages: bool,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    pub exit: GuestExit,
    /// From `epoch` to the guest's first boot-timer write of 0x01, if it made one.
    pub workload_started: Option<Duration>,
    /// Host CPU time each vCPU thread used (guest execution plus exit handling).
    pub vcpu_cpu_time: Vec<Duration>,
    /// How long each vCPU thread was runnable but waited for a host CPU.
    pub vcpu_run_delay: Vec<Duration>,
    /// What the paravirtual wait page did (all zero if the guest never used it).
    pub pvwait: pvwait::Snapshot,
    /// What KVM counted in the kernel for the VM and each vCPU (exits, halts, faults).
    pub kvm_stats: kvm_stats::KvmStats,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // made once per run; unboxed keeps matching simple
pub enum GuestExit {
    /// The guest wrote this value to the debug-exit port.
    DebugExit(u32),
    /// The guest crashed (or did something kumo cannot continue from, or made no
    /// progress for the watchdog's bound).
    Fault(FaultReport),
    /// The VM was paused and handed off (a snapshot with stop, or a migration whose
    /// destination runs it now): it did not finish here.
    HandedOff,
    /// kumo stopped the VM: its time limit, or a signal.
    Stopped(StopCause),
}

/// Errors creating or running a VM. Each message is one line a person can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: KVM is not available on this host (no such device; load the kvm module or enable nested virtualization)", path.display())]
    KvmMissing { path: PathBuf },
    #[error("{}: permission denied opening the KVM device: run as root or join the kvm group", path.display())]
    KvmPermission { path: PathBuf },
    #[error("cannot open the KVM device {}: {source}", path.display())]
    KvmOpen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("KVM API version {0} is not supported (kumo needs 12)")]
    KvmApiVersion(i32),
    #[error("seccomp: {0}")]
    Seccomp(#[from] crate::seccomp::Error),
    #[error("the VM needs at least 1 vCPU")]
    NoVcpus,
    #[error("{requested} vCPUs is above this host's KVM limit of {max} vCPUs")]
    TooManyVcpus { requested: u32, max: u32 },
    #[error(
        "guest memory of {memory_mib} MiB is too small: the kernel image, modules and boot data need at least {needed_mib} MiB"
    )]
    MemoryTooSmall { memory_mib: u64, needed_mib: u64 },
    #[error("guest memory of {memory_mib} MiB is above {what}: at most {max_mib} MiB")]
    MemoryTooLarge {
        memory_mib: u64,
        max_mib: u64,
        what: &'static str,
    },
    #[error("the kernel is not an ELF file (it does not start with \\x7fELF)")]
    NotElf,
    #[error("no XEN_ELFNOTE_PHYS32_ENTRY note: not a PVH kernel")]
    NoPvhNote,
    #[error("malformed kernel ELF: {0}")]
    MalformedElf(String),
    #[error("the kernel cannot be placed: {0}")]
    KernelLayout(String),
    #[error("the command line is {len} bytes long; at most {max} fit")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("the command line contains a NUL byte")]
    CmdlineNul,
    #[error("{count} modules given; the module list holds at most {max}")]
    TooManyModules { count: usize, max: usize },
    #[error("KVM ioctl {ioctl} failed: {source}")]
    Kvm {
        ioctl: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("{what} failed: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("guest memory: {0}")]
    GuestMemory(String),
    #[error(
        "guest memory of {memory_mib} MiB on 2 MiB huge pages needs {needed} of them and the host has {free} free: reserve more (echo N > /proc/sys/vm/nr_hugepages) or leave out huge pages"
    )]
    HugePagesShort {
        memory_mib: u64,
        needed: u64,
        free: u64,
    },
    #[error("guest memory of {memory_mib} MiB is not a whole number of 2 MiB huge pages")]
    HugePagesOdd { memory_mib: u64 },
    #[error("vCPU {index} thread failed: {why}")]
    VcpuThread { index: u32, why: String },
    #[error("credit scheduler: {0}")]
    Scheduler(String),
    #[error("PCI: {0}")]
    Device(String),
    #[error("disk image {}: {why}", path.display())]
    Disk { path: PathBuf, why: String },
    #[error("{0}")]
    Migration(String),
    #[error("VM stream: {0}")]
    Stream(#[from] migration::StreamError),
}

/// The most vCPUs one VM may have on this host (KVM_CAP_MAX_VCPUS, else
/// KVM_CAP_NR_VCPUS).
pub fn max_vcpus(kvm_device: &Path) -> Result<u32, Error> {
    let kvm = kvm::open(kvm_device)?;
    Ok(kvm::max_vcpus(&kvm))
}
