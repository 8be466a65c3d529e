//! The one entry from a [`VmSpec`] to a VM: [`resolve`] turns the spec into what `hv`'s
//! builder takes (a `VmConfig`, a `DeviceSpec`, a dirty-log mode) and checks it against
//! this host; [`build`] hands that to `hv::builder`. Every command that boots a VM
//! (the single-VM run, `--kernel`, `--api-socket`, `--irq-check`, node domains, MPI
//! jobs and `kumo mpi` ranks) and the incoming side of a migration ([`receive`]) come
//! through here, so an option a spec allows works in each of them.

use std::io::Read;
use std::path::Path;

use anyhow::{Result, bail};
use hv::builder::{AttachedDevices, Backends, DeviceSpec};
use hv::migration::dirty::DirtyLogMode;
use hv::{Vm, VmConfig};

use crate::guest::{self, EMBEDDED_GUEST};
use crate::spec::vm::{self, Guest, VmSpec};

/// Guest memory of an interrupt-check run (the guest needs no heap for it).
pub const IRQ_CHECK_MEMORY_MIB: u64 = 64;

/// Memory of a `--kernel` run without `memory_mib`.
pub const KERNEL_DEFAULT_MEMORY_MIB: u64 = 256;

/// A spec made concrete for `hv::builder`.
pub struct Resolved {
    pub config: VmConfig,
    pub devices: DeviceSpec,
    pub dirty: DirtyLogMode,
    /// The embedded guest's benchmarks, parsed (empty for a kernel or an irq check).
    pub benchmarks: Vec<npb::Spec>,
    /// The credit scheduler's parameters, with the domain's weight and cap.
    pub sched: Option<(sched::Params, vm::Sched)>,
}

/// A VM built from a spec, with its devices' backends (keep them until the VM has
/// ended: dropping them stops their threads) and what the spec resolved to.
pub struct Built {
    pub vm: Vm,
    pub attached: AttachedDevices,
    pub benchmarks: Vec<npb::Spec>,
    pub sched: Option<(sched::Params, vm::Sched)>,
}

/// Builds the VM `spec` describes, its devices served by `backends`.
pub fn build(spec: &VmSpec, kvm_device: &Path, backends: Backends<'_>) -> Result<Built> {
    build_resolved(resolve(spec, kvm_device)?, backends)
}

/// Builds a resolved spec (for a caller that attaches some of its devices itself).
pub fn build_resolved(resolved: Resolved, backends: Backends<'_>) -> Result<Built> {
    let (vm, attached) = hv::builder::build_with_devices_dirty_log(
        resolved.config,
        &resolved.devices,
        backends,
        resolved.dirty,
    )?;
    Ok(Built {
        vm,
        attached,
        benchmarks: resolved.benchmarks,
        sched: resolved.sched,
    })
}

/// Builds the VM a live migration's stream carries (the incoming side of a
/// migration, `--incoming` and a node's incoming domains): `applied(round)` is called
/// once each round is in RAM. A moved VM keeps its machine and devices.
pub fn receive(
    stream: &mut impl Read,
    kvm_device: &Path,
    applied: impl FnMut(u32) -> Result<(), hv::Error>,
) -> Result<(Vm, hv::migration::Meta)> {
    Ok(hv::builder::build_incoming(stream, kvm_device, applied)?)
}

/// Builds the VM a snapshot file holds (`--restore`).
pub fn restore(stream: &mut impl Read, kvm_device: &Path) -> Result<(Vm, hv::migration::Meta)> {
    Ok(hv::builder::build_from_snapshot(stream, kvm_device)?)
}

/// Refuses what a snapshot or incoming spec cannot have, with one line: a restored or
/// migrated VM brings its own machine, devices and dirty log.
pub fn refuse_for_saved(spec: &VmSpec) -> Result<()> {
    let d = &spec.devices;
    if d.irq_test.is_some()
        || !d.disks.is_empty()
        || !d.passthrough.is_empty()
        || !d.nics.is_empty()
    {
        bail!("a restored or migrated VM keeps the devices it was saved with: give it none");
    }
    if spec.machine.memory_mib.is_some() || spec.machine.huge_pages {
        bail!("a restored or migrated VM keeps the memory it was saved with");
    }
    if spec.sched.is_some() {
        bail!("sched does not apply to a restored or migrated VM");
    }
    if spec.migration.dirty_log != vm::DirtyLog::Bitmap {
        bail!("dirty_log does not apply to a restored or migrated VM (it keeps its own)");
    }
    Ok(())
}

/// `spec` as `hv::builder` takes it, checked: vCPUs against KVM and the guest,
/// memory against the workload, passthrough devices against the host. A snapshot or
/// an incoming VM is not booted ([`receive`]).
pub fn resolve(spec: &VmSpec, kvm_device: &Path) -> Result<Resolved> {
    let machine = &spec.machine;
    let devices = device_spec(&spec.devices)?;
    let dirty = match spec.migration.dirty_log {
        vm::DirtyLog::Bitmap => DirtyLogMode::Bitmap,
        vm::DirtyLog::Ring => DirtyLogMode::Ring,
    };
    let sched = spec
        .sched
        .as_ref()
        .map(|s| Ok::<_, anyhow::Error>((crate::spec::sched::parse_spec(&s.credit)?, s.clone())))
        .transpose()?;
    let (config, benchmarks) = match &spec.guest {
        Guest::Npb {
            benchmarks,
            barrier_wait,
            vcpu_balloon,
            cmdline,
        } => {
            check_guest_vcpus(machine.vcpus, kvm_device)?;
            let irq_check = spec.devices.irq_test.is_some() && benchmarks.is_empty();
            let specs = if benchmarks.is_empty() && (irq_check || cmdline.is_some()) {
                Vec::new()
            } else if benchmarks.is_empty() {
                guest::default_specs()
            } else {
                guest::parse_specs(&benchmarks.join(","))?
            };
            let (memory_mib, line) = if let (Some(line), _) = (cmdline, irq_check) {
                // A composed command line (a node's domain, an MPI rank) runs what its
                // keys say: the command sized its memory.
                let Some(mib) = machine.memory_mib else {
                    bail!("a guest with its own cmdline needs machine.memory_mib");
                };
                (mib, line.clone())
            } else if irq_check {
                let rounds = spec.devices.irq_test.and_then(|t| t.rounds);
                (
                    machine.memory_mib.unwrap_or(IRQ_CHECK_MEMORY_MIB),
                    irq_check_cmdline(rounds),
                )
            } else {
                (
                    guest::choose_memory_mib_paged(
                        machine.memory_mib,
                        &specs,
                        machine.vcpus,
                        machine.huge_pages,
                    )?,
                    guest::npb_cmdline(&specs, machine.vcpus, *barrier_wait, *vcpu_balloon),
                )
            };
            let mut config = embedded_config(machine.vcpus, memory_mib, line, kvm_device);
            config.huge_pages = machine.huge_pages;
            (config, specs)
        }
        Guest::Kernel {
            path,
            cmdline,
            modules,
        } => {
            check_vcpus(machine.vcpus, kvm_device)?;
            let memory_mib = machine.memory_mib.unwrap_or(KERNEL_DEFAULT_MEMORY_MIB);
            // Nothing larger than guest RAM below the hole can be loaded into it: the
            // bound on every read.
            let limit = hv::memory_map::low_ram_bytes(memory_mib.saturating_mul(1 << 20));
            let image = crate::input::read_bounded("kernel", path, limit)?;
            let modules = modules
                .iter()
                .map(|path| crate::input::read_bounded("module", path, limit))
                .collect::<Result<Vec<_>>>()?;
            let config = VmConfig {
                vcpus: machine.vcpus,
                memory_mib,
                kernel: image.into(),
                cmdline: cmdline.clone(),
                modules,
                kvm_device: kvm_device.to_path_buf(),
                huge_pages: machine.huge_pages,
            };
            (config, Vec::new())
        }
        Guest::Snapshot { .. } | Guest::Incoming { .. } => {
            bail!("a snapshot or incoming VM is received, not booted")
        }
    };
    Ok(Resolved {
        config,
        devices,
        dirty,
        benchmarks,
        sched,
    })
}

/// The devices of a spec as the builder takes them; passthrough devices are checked
/// against the host (a kernel VFIO device must exist and open).
pub fn device_spec(devices: &vm::Devices) -> Result<DeviceSpec> {
    Ok(DeviceSpec {
        irq_test: devices.irq_test.map(|test| hv::irq_device::IrqDeviceSetup {
            path: test.irq_path,
            delay: std::time::Duration::ZERO,
            noise_hz: None,
        }),
        disks: devices
            .disks
            .iter()
            .map(|d| hv::block::DiskSetup {
                path: d.path.clone(),
                readonly: d.readonly,
                io: d.io,
            })
            .collect(),
        passthrough: devices
            .passthrough
            .iter()
            .map(|p| {
                Ok((
                    crate::spec::devices::passthrough_spec(&p.device)?,
                    p.irq_path,
                ))
            })
            .collect::<Result<_>>()?,
        nics: devices
            .nics
            .iter()
            .map(|nic| hv::net::NicSetup {
                mac: nic.mac,
                irq_path: nic.irq_path,
            })
            .collect(),
    })
}

/// The interrupt check's guest command line: the delivery check, or `rounds` doorbell
/// rounds on vector 0.
pub fn irq_check_cmdline(rounds: Option<u32>) -> String {
    match rounds {
        None => "irq=check".into(),
        Some(rounds) => format!("irq=bench:{rounds}:0"),
    }
}

/// Checks a vCPU count for the embedded guest: KVM's limit, then the guest's.
pub fn check_guest_vcpus(vcpus: u32, kvm_device: &Path) -> Result<()> {
    check_vcpus(vcpus, kvm_device)?;
    guest::check_vcpus(vcpus)
}

/// Rejects a vCPU count KVM cannot give before sizing memory for it.
pub fn check_vcpus(vcpus: u32, kvm_device: &Path) -> Result<()> {
    if vcpus == 0 {
        bail!("--vcpus must be at least 1");
    }
    let max = hv::max_vcpus(kvm_device)?;
    if vcpus > max {
        bail!("--vcpus {vcpus} is above this host's KVM limit of {max} vCPUs");
    }
    Ok(())
}

/// The embedded guest on `vcpus` vCPUs with `cmdline` (benches that measure the
/// builder itself take this to `hv::builder` directly).
pub fn embedded_config(
    vcpus: u32,
    memory_mib: u64,
    cmdline: String,
    kvm_device: &Path,
) -> VmConfig {
    VmConfig {
        vcpus,
        memory_mib,
        kernel: EMBEDDED_GUEST.into(),
        cmdline,
        modules: Vec::new(),
        kvm_device: kvm_device.to_path_buf(),
        huge_pages: false,
    }
}

pub fn disk_to_spec(disk: &hv::block::DiskSetup) -> vm::Disk {
    vm::Disk {
        path: disk.path.clone(),
        readonly: disk.readonly,
        io: disk.io,
    }
}
