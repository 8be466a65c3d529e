//! The devices a new VM is built with: one description for every kind of run, attached
//! in one fixed order (the interrupt test device, disks, passthrough devices, NICs), so
//! that a VM described twice the same way has each device in the same PCI slot.

use std::sync::Arc;

use crate::block::{self, Disk, DiskSetup};
use crate::irq::IrqPath;
use crate::irq_device::{self, IrqDeviceSetup, IrqDevices};
use crate::migration::dirty::DirtyLogMode;
use crate::net::{Network, NicSetup};
use crate::passthrough::{self, Attached, PassthroughSpec};
use crate::placement::ThreadGroup;
use crate::{Error, Vm, VmConfig};

/// What devices a VM gets besides its platform devices (serial, timers, PCI host).
#[derive(Debug, Clone, Default)]
pub struct DeviceSpec {
    /// kumo's interrupt test device.
    pub irq_test: Option<IrqDeviceSetup>,
    /// virtio-blk disks, in slot order.
    pub disks: Vec<DiskSetup>,
    /// Devices given to the guest, each with its interrupt path.
    pub passthrough: Vec<(PassthroughSpec, IrqPath)>,
    /// virtio-net NICs on [`Backends::network`], in slot order.
    pub nics: Vec<NicSetup>,
}

/// What a VM's devices are served by outside the VM.
#[derive(Clone, Copy, Default)]
pub struct Backends<'a> {
    /// The switch the NICs plug into (domain 0's).
    pub network: Option<&'a Network>,
    /// Domain 0: the threads that serve the devices join it.
    pub dom0: Option<&'a Arc<ThreadGroup>>,
}

/// The running backends of a VM's devices. Keep it until the VM has ended: dropping
/// it stops the devices' threads and closes their connections.
#[must_use]
#[derive(Default)]
pub struct AttachedDevices {
    pub irq_test: Option<IrqDevices>,
    pub disks: Vec<Disk>,
    pub passthrough: Vec<Attached>,
}

/// Boots a VM from `config` (as [`super::build_for_boot`]) with `devices` attached.
/// Disk images are opened first, so a bad path fails before any VM exists.
pub fn build_with_devices(
    config: VmConfig,
    devices: &DeviceSpec,
    backends: Backends<'_>,
) -> Result<(Vm, AttachedDevices), Error> {
    build_with_devices_dirty_log(config, devices, backends, DirtyLogMode::default())
}

/// As [`build_with_devices`], tracking written pages with `dirty` (as
/// [`super::build_for_boot_with_dirty_log`]).
pub fn build_with_devices_dirty_log(
    config: VmConfig,
    devices: &DeviceSpec,
    backends: Backends<'_>,
    dirty: DirtyLogMode,
) -> Result<(Vm, AttachedDevices), Error> {
    if !devices.nics.is_empty() && backends.network.is_none() {
        return Err(Error::Device(
            "NICs were asked for without a network to plug them into".into(),
        ));
    }
    let disks = block::open(&devices.disks)?;
    let mut vm = super::build_for_boot_with_dirty_log(config, dirty)?;
    let irq_test = devices
        .irq_test
        .as_ref()
        .map(|setup| irq_device::attach(&mut vm, setup, backends.dom0))
        .transpose()?;
    let disks = block::attach(&mut vm, disks)?;
    let passthrough = devices
        .passthrough
        .iter()
        .map(|(spec, path)| passthrough::attach(&mut vm, spec, *path, backends.dom0))
        .collect::<Result<Vec<_>, Error>>()?;
    if let Some(network) = backends.network {
        for nic in &devices.nics {
            network.attach(&mut vm, nic, backends.dom0)?;
        }
    }
    Ok((
        vm,
        AttachedDevices {
            irq_test,
            disks,
            passthrough,
        },
    ))
}
