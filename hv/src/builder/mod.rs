//! The one place a [`Vm`] is made: booted from a kernel ([`build_for_boot`]), restored
//! from a snapshot file ([`build_from_snapshot`]) or received from a live migration
//! ([`build_incoming`]). Each returns a VM ready to run; a new VM's devices are
//! described once ([`DeviceSpec`]) and attached by [`build_with_devices`].

mod devices;
mod from_stream;

use std::sync::Arc;

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;

pub use devices::{
    AttachedDevices, Backends, DeviceSpec, build_with_devices, build_with_devices_dirty_log,
};
pub use from_stream::{build_from_snapshot, build_incoming};

use crate::kvm::{self, ioctl};
use crate::layout::*;
use crate::machine::{create_memory, machine_on, set_cpuid, write};
use crate::memory_map;
use crate::migration::Hub;
use crate::migration::dirty::DirtyLogMode;
use crate::placement::VcpuControl;
use crate::{Error, Vm, VmConfig, acpi, boot, cpuid, elf, regs};

/// Validates the configuration, opens KVM, creates the VM with memfd-backed RAM, the
/// in-kernel irqchip and the vCPUs (CPUID policy), loads the kernel and modules,
/// writes the boot information and ACPI tables and sets the BSP's PVH entry state.
pub fn build_for_boot(config: VmConfig) -> Result<Vm, Error> {
    build_for_boot_with_dirty_log(config, DirtyLogMode::default())
}

/// As [`build_for_boot`], tracking written pages (for a live migration) with `dirty`:
/// the dirty ring can only be chosen when the VM is made.
pub fn build_for_boot_with_dirty_log(config: VmConfig, dirty: DirtyLogMode) -> Result<Vm, Error> {
    // Everything that needs no KVM first, so bad input fails fast.
    if config.vcpus == 0 {
        return Err(Error::NoVcpus);
    }
    // Before the multiplication below can overflow (restore checks in `machine`).
    memory_map::check_size(config.memory_mib)?;
    let mem_size = config.memory_mib * MIB;
    let low_ram = memory_map::low_ram_bytes(mem_size);
    let info = elf::inspect(&config.kernel)?;
    let sizes: Vec<u64> = config.modules.iter().map(|m| m.len() as u64).collect();
    let (modules, modules_end) = boot::place_modules(info.end, &sizes)
        .ok_or_else(|| Error::KernelLayout("the modules do not fit in the address space".into()))?;
    let blobs = boot::boot_blobs(mem_size, &config.cmdline, &modules)?;
    let needed = info.end.max(modules_end).max(HIGH_RAM_START);
    if needed > low_ram {
        let needed_mib = needed.div_ceil(MIB);
        if needed > memory_map::LOW_RAM_MAX {
            return Err(Error::KernelLayout(format!(
                "the kernel and modules end at {needed:#x}, above the RAM below the 32-bit hole ({} MiB)",
                memory_map::LOW_RAM_MAX / MIB
            )));
        }
        return Err(Error::MemoryTooSmall {
            memory_mib: config.memory_mib,
            needed_mib,
        });
    }
    elf::check_layout(&info, low_ram)?;
    let acpi_blob = acpi::build(config.vcpus, ACPI_START);
    if ACPI_START + acpi_blob.len() as u64 > HIGH_RAM_START {
        return Err(Error::KernelLayout(format!(
            "ACPI tables for {} vCPUs do not fit below 1 MiB",
            config.vcpus
        )));
    }

    let (memory, memfd) = create_memory(mem_size, config.huge_pages)?;
    tracing::debug!("boot: RAM mapped");
    let kvm = kvm::open(&config.kvm_device)?;
    tracing::debug!("boot: KVM opened");
    // The kernel, modules and tables go into RAM, and KVM's CPUID is read, on a second
    // thread while KVM makes the VM and its vCPUs: neither needs the other, and each
    // took ~0.9-1.5 ms of boot.
    let (loaded, made) = std::thread::scope(|scope| {
        let loader = scope.spawn(|| {
            let entry = elf::load(&memory, &config.kernel, &info)?;
            for ((addr, _), bytes) in modules.iter().zip(&config.modules) {
                write(&memory, *addr, bytes)?;
            }
            for (addr, bytes) in &blobs {
                write(&memory, *addr, bytes)?;
            }
            write(&memory, ACPI_START, &acpi_blob)?;
            tracing::debug!("boot: kernel loaded");
            let supported = kvm
                .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
                .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
            tracing::debug!("boot: supported CPUID read");
            crate::seccomp::prepare(&[
                crate::seccomp::ThreadKind::Vcpu,
                crate::seccomp::ThreadKind::Coordinator,
            ]);
            tracing::debug!("boot: seccomp filters compiled");
            Ok::<_, Error>((entry, supported))
        });
        let made = make_vm_and_vcpus(&kvm, &config, &memory, mem_size, dirty);
        (loader.join(), made)
    });
    let (vm, vcpus, tsc_khz) = made?;
    let (entry, supported) =
        loaded.map_err(|_| Error::KernelLayout("loading the kernel panicked".into()))??;
    for (index, vcpu) in (0..config.vcpus).zip(&vcpus) {
        let entries = cpuid::vcpu_cpuid(supported.as_slice(), index, config.vcpus, tsc_khz);
        set_cpuid(vcpu, &entries)?;
    }
    tracing::debug!("boot: vCPUs' CPUID set");

    let bsp = &vcpus[0];
    let sregs = bsp.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    bsp.set_sregs(&regs::entry_sregs(&sregs))
        .map_err(ioctl("KVM_SET_SREGS"))?;
    bsp.set_regs(&regs::entry_regs(entry))
        .map_err(ioctl("KVM_SET_REGS"))?;
    tracing::debug!(
        vcpus = config.vcpus,
        memory_mib = config.memory_mib,
        entry = format_args!("{entry:#x}"),
        tsc_khz,
        "VM created"
    );
    finish(kvm, vm, vcpus, dirty, memory, memfd)
}

/// KVM's side of a new VM: the VM with `memory` as its RAM, the dirty log `dirty`
/// needs, and its vCPUs (their CPUID is the caller's to set, before they run).
/// Returns them with the TSC rate.
fn make_vm_and_vcpus(
    kvm: &kvm_ioctls::Kvm,
    config: &VmConfig,
    memory: &vm_memory::GuestMemoryMmap,
    mem_size: u64,
    dirty: DirtyLogMode,
) -> Result<(kvm_ioctls::VmFd, Vec<kvm_ioctls::VcpuFd>, u32), Error> {
    let vm = machine_on(kvm, config.vcpus, memory, mem_size)?;
    enable_dirty_log(&vm, dirty)?;
    let mut vcpus = Vec::with_capacity(config.vcpus as usize);
    let mut tsc_khz = 0;
    for index in 0..config.vcpus {
        let vcpu = vm
            .create_vcpu(u64::from(index))
            .map_err(ioctl("KVM_CREATE_VCPU"))?;
        if index == 0 {
            tsc_khz = vcpu.get_tsc_khz().unwrap_or_else(|e| {
                tracing::warn!("KVM_GET_TSC_KHZ failed ({e}); CPUID leaf 0x40000010 reports 0");
                0
            });
        }
        vcpus.push(vcpu);
    }
    tracing::debug!("boot: vCPUs made");
    Ok((vm, vcpus, tsc_khz))
}

/// A VM of these parts, with the control of its vCPU threads and its migration hub:
/// the last step of every builder.
fn finish(
    kvm: kvm_ioctls::Kvm,
    vm: kvm_ioctls::VmFd,
    vcpus: Vec<kvm_ioctls::VcpuFd>,
    dirty: DirtyLogMode,
    memory: vm_memory::GuestMemoryMmap,
    memfd: std::fs::File,
) -> Result<Vm, Error> {
    let vm = Arc::new(vm);
    let control = Arc::new(VcpuControl::new(vcpus.len()));
    let hub = Arc::new(Hub::new(
        &kvm,
        &vcpus,
        dirty,
        vm.clone(),
        memory.clone(),
        &memfd,
        control.clone(),
    )?);
    Ok(Vm::assemble(kvm, vm, vcpus, control, hub, memory, memfd))
}

/// Turns on what `dirty` needs before the first vCPU exists (the dirty ring; the
/// bitmap needs nothing until a migration starts).
fn enable_dirty_log(vm: &kvm_ioctls::VmFd, dirty: DirtyLogMode) -> Result<(), Error> {
    if dirty == DirtyLogMode::Ring {
        crate::migration::dirty::enable_ring(vm)?;
    }
    Ok(())
}
