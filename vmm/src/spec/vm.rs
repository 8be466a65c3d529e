//! `VmSpec`: everything about one VM in one serde type. Every command turns its flags
//! or its file into `VmSpec`s and hands them to `crate::launch`, the one place they
//! become a `hv::VmConfig`, a `hv::builder::DeviceSpec` and a dirty-log mode.
//!
//! Plain types only (serde's, and the four value enums of the guest, hv's disks and
//! hv's interrupt paths, which carry serde themselves): values are checked against
//! the host (KVM's vCPU limit, VFIO devices, disk files) when the spec is launched.
//! `kumo --print-spec ...` prints the spec a command line makes; `kumo --spec FILE`
//! boots one (docs/json.md has the schema, docs/usage.md the flags).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::guest::{BarrierWait, VcpuBalloon};
pub use hv::block::DiskIo;
pub use hv::irq::IrqPath;

/// One VM: its machine, what it boots, its devices, how it is scheduled and migrated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub machine: Machine,
    pub guest: Guest,
    #[serde(default)]
    pub devices: Devices,
    /// Under kumo's credit scheduler (None: the host schedules the vCPU threads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched: Option<Sched>,
    #[serde(default)]
    pub migration: Migration,
}

/// The virtual machine's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// Virtual CPUs (may exceed the host's cores).
    pub vcpus: u32,
    /// Guest RAM in MiB. None: sized for the workload (the embedded guest: what its
    /// benchmarks need on these vCPUs, at least 64 MiB; a kernel: 256 MiB).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Guest RAM on the host's 2 MiB huge pages (hugetlbfs); an explicit size must
    /// then be even.
    #[serde(default)]
    pub huge_pages: bool,
}

/// What the VM runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Guest {
    /// kumo's embedded guest running NPB benchmarks one after another.
    Npb {
        /// `kernel.class` items (`"ep.S"`, `"cg.W"`); empty: the default list (or none
        /// with `devices.irq_test`, whose check the guest then runs).
        #[serde(default)]
        benchmarks: Vec<String>,
        #[serde(default)]
        barrier_wait: BarrierWait,
        #[serde(default)]
        vcpu_balloon: VcpuBalloon,
        /// The guest's whole command line as a command composed it (a node's domains
        /// and `kumo mpi`'s ranks add idle, probe, irq and mpi keys); None: built from
        /// the fields above.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cmdline: Option<String>,
    },
    /// Any PVH ELF kernel: its console is kumo's stdout, its debug-exit value kumo's
    /// exit status.
    Kernel {
        path: PathBuf,
        #[serde(default)]
        cmdline: String,
        /// Blobs handed over through `hvm_start_info`, in order.
        #[serde(default)]
        modules: Vec<PathBuf>,
    },
    /// A VM saved by `kumo ctl ... snapshot`, run on from where it was saved (it keeps
    /// the machine it was saved with).
    Snapshot { path: PathBuf },
    /// One VM migrated to `addr` (`tcp:HOST:PORT`); `token_file` holds the secret the
    /// source must prove it knows.
    Incoming {
        addr: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_file: Option<PathBuf>,
    },
}

/// Devices besides the platform's (serial, timers, PCI host), attached in this order:
/// the interrupt test device, disks, passthrough devices, NICs (so a VM described
/// twice the same way has each device in the same PCI slot).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Devices {
    /// kumo's interrupt test device (with the embedded guest and no benchmarks: its
    /// delivery check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq_test: Option<IrqTest>,
    /// virtio-blk disks on raw image files, in slot order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    /// PCI devices from outside kumo, in slot order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough: Vec<Passthrough>,
    /// virtio-net NICs on domain 0's switch, in slot order (a command that has a
    /// switch: a node, an MPI job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<Nic>,
}

/// The interrupt test device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IrqTest {
    #[serde(default)]
    pub irq_path: IrqPath,
    /// Doorbell rounds on vector 0 instead of the delivery check (`--irq-rounds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds: Option<u32>,
}

/// A PCI device from outside kumo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Passthrough {
    /// `vfio-user:PATH` (a device served over vfio-user at that UNIX socket) or a
    /// host PCI address `DDDD:BB:DD.F` for the kernel's VFIO.
    pub device: String,
    #[serde(default)]
    pub irq_path: IrqPath,
}

/// One disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disk {
    pub path: PathBuf,
    /// The guest's writes are refused.
    #[serde(default)]
    pub readonly: bool,
    /// Which thread serves its requests.
    #[serde(default)]
    pub io: DiskIo,
}

/// One NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nic {
    /// Its MAC address, six numbers.
    pub mac: [u8; 6],
    #[serde(default)]
    pub irq_path: IrqPath,
}

/// The VM's domain under the credit scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sched {
    /// The scheduler's parameters as `--sched` takes them (`credit`,
    /// `credit:tslice=1ms,tick=1ms,ratelimit=100us`).
    #[serde(default = "default_credit")]
    pub credit: String,
    /// The domain's weight (Xen's default 256).
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The domain's cap, percent of one CPU (0: none).
    #[serde(default)]
    pub cap: u32,
}

impl Default for Sched {
    /// Xen's defaults: `credit`, weight 256, no cap.
    fn default() -> Sched {
        Sched {
            credit: default_credit(),
            weight: default_weight(),
            cap: 0,
        }
    }
}

fn default_credit() -> String {
    "credit".into()
}

fn default_weight() -> u32 {
    super::node::DEFAULT_WEIGHT
}

/// How the VM can be moved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Migration {
    /// How written pages are tracked while it migrates (chosen when the VM is made).
    #[serde(default)]
    pub dirty_log: DirtyLog,
    /// Serve the HTTP control API (snapshot, migrate, ...) on this UNIX socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_socket: Option<PathBuf>,
}

/// `--dirty-log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirtyLog {
    /// KVM_GET_DIRTY_LOG.
    #[default]
    Bitmap,
    /// KVM's dirty ring.
    Ring,
}

impl VmSpec {
    /// A spec read from JSON text, or one line saying what is wrong (serde's message
    /// names an unknown field and lists the known ones).
    pub fn from_json(text: &str) -> Result<VmSpec, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The embedded guest running `benchmarks` on `vcpus`, everything else default.
    pub fn npb(vcpus: u32, benchmarks: &[&str]) -> VmSpec {
        VmSpec {
            machine: Machine {
                vcpus,
                memory_mib: None,
                huge_pages: false,
            },
            guest: Guest::Npb {
                benchmarks: benchmarks.iter().map(|s| s.to_string()).collect(),
                barrier_wait: BarrierWait::Auto,
                vcpu_balloon: VcpuBalloon::Auto,
                cmdline: None,
            },
            devices: Devices::default(),
            sched: None,
            migration: Migration::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> VmSpec {
        VmSpec {
            machine: Machine {
                vcpus: 4,
                memory_mib: Some(512),
                huge_pages: true,
            },
            guest: Guest::Kernel {
                path: "/tmp/k.elf".into(),
                cmdline: "console=ttyS0".into(),
                modules: vec!["/tmp/initrd".into()],
            },
            devices: Devices {
                irq_test: Some(IrqTest {
                    irq_path: IrqPath::Fast,
                    rounds: Some(3),
                }),
                disks: vec![Disk {
                    path: "/tmp/d.img".into(),
                    readonly: true,
                    io: DiskIo::Vcpu,
                }],
                passthrough: vec![Passthrough {
                    device: "vfio-user:/tmp/p.sock".into(),
                    irq_path: IrqPath::Generic,
                }],
                nics: vec![Nic {
                    mac: [0x52, 0x54, 0, 0, 0, 1],
                    irq_path: IrqPath::Fast,
                }],
            },
            sched: Some(Sched {
                credit: "credit:tslice=1ms".into(),
                weight: 512,
                cap: 50,
            }),
            migration: Migration {
                dirty_log: DirtyLog::Ring,
                api_socket: Some("/tmp/api.sock".into()),
            },
        }
    }

    #[test]
    fn every_field_survives_a_json_round_trip() {
        for spec in [
            full(),
            VmSpec::npb(2, &["ep.S", "cg.W"]),
            VmSpec {
                guest: Guest::Incoming {
                    addr: "tcp:127.0.0.1:4444".into(),
                    token_file: Some("/tmp/t".into()),
                },
                ..VmSpec::npb(1, &[])
            },
            VmSpec {
                guest: Guest::Snapshot {
                    path: "/tmp/s".into(),
                },
                ..VmSpec::npb(1, &[])
            },
        ] {
            let text = serde_json::to_string(&spec).unwrap();
            assert_eq!(VmSpec::from_json(&text).unwrap(), spec, "{text}");
        }
    }

    #[test]
    fn omitted_fields_take_their_defaults() {
        let spec = VmSpec::from_json(r#"{"machine":{"vcpus":2},"guest":{"kind":"npb"}}"#).unwrap();
        assert_eq!(spec, VmSpec::npb(2, &[]));
        let sched =
            VmSpec::from_json(r#"{"machine":{"vcpus":1},"guest":{"kind":"npb"},"sched":{}}"#)
                .unwrap()
                .sched
                .unwrap();
        assert_eq!(sched.credit, "credit");
        assert_eq!(sched.weight, 256);
    }

    #[test]
    fn a_misspelt_field_is_refused_by_name() {
        for (text, typo) in [
            (r#"{"machine":{"vcpu":2},"guest":{"kind":"npb"}}"#, "vcpu"),
            (
                r#"{"machine":{"vcpus":2},"guest":{"kind":"npb","benchmark":["ep.S"]}}"#,
                "benchmark",
            ),
            (
                r#"{"machine":{"vcpus":2},"guest":{"kind":"npb"},"devicess":{}}"#,
                "devicess",
            ),
            (
                r#"{"machine":{"vcpus":2},"guest":{"kind":"npb"},"migration":{"dirtylog":"ring"}}"#,
                "dirtylog",
            ),
        ] {
            let error = VmSpec::from_json(text).unwrap_err();
            assert!(
                error.contains(&format!("unknown field `{typo}`")),
                "{text}: {error}"
            );
            assert!(!error.contains('\n'), "one line: {error}");
        }
        let error =
            VmSpec::from_json(r#"{"machine":{"vcpus":2},"guest":{"kind":"npbs"}}"#).unwrap_err();
        assert!(error.contains("unknown variant `npbs`"), "{error}");
    }
}
