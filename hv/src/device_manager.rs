//! A VM's devices: PCI bus 0 and its wiring to KVM (doorbells as ioeventfds that
//! follow their BARs, direct windows as memory slots), BAR placement, the fast path's
//! GSI routing table, and, when the VM runs, the fixed port devices (COM1, debug exit,
//! boot timer, PCI configuration ports) built fresh or from a snapshot's state.
//!
//! Devices are plugged in while the VM is built (`Vm::add_pci_device*` delegate here);
//! [`DeviceManager::start`] turns them into what the vCPU threads use.

use std::sync::Arc;

use devices::boot_timer::BOOT_TIMER_PORT;
use devices::debug_exit::{DEBUG_EXIT_LEN, DEBUG_EXIT_PORT};
use devices::pci::{BarAllocator, ConfigPorts, PciBus, PciDevice};
use devices::serial::{COM1_LEN, COM1_PORT};
use devices::{BootTimer, Com1, DebugExit, PioBus, PioRange};
use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::EventFd;

use crate::Error;
use crate::bar_windows::{HostWindow, MemoryWindows};
use crate::doorbells::IoEventWiring;
use crate::irq::GsiRouter;
use crate::layout::{PCI_ECAM_BASE, PCI_MMIO_END, PCI_MMIO_START};
use crate::migration::{DeviceStates, Devices, Hub};

/// The devices of a VM that has not run yet.
pub struct DeviceManager {
    /// Bus 0, filled before the VM runs.
    pci: PciBus,
    /// The eventfds behind devices' doorbells, wired where their BARs decode.
    doorbells: Arc<IoEventWiring>,
    /// Devices' direct windows, mapped as memory slots where their BARs decode.
    windows: Arc<MemoryWindows>,
    /// The VM's one GSI routing table: every fast-path vector of every device has its
    /// own GSI in it (KVM_SET_GSI_ROUTING replaces the whole table).
    gsi: Arc<GsiRouter>,
    /// Where memory BARs are placed, as firmware would place them.
    bar_window: BarAllocator,
    /// Device state a restored VM's devices start from (see `crate::migration`).
    restored: Option<DeviceStates>,
}

/// The devices as the running VM's vCPUs use them.
pub(crate) struct RunningDevices {
    pub bus: PioBus,
    pub pci: Arc<PciBus>,
    pub com1: Arc<Com1>,
    pub timer: Arc<BootTimer>,
}

impl DeviceManager {
    /// An empty bus 0 wired to `vm`.
    pub(crate) fn new(vm: &Arc<VmFd>) -> DeviceManager {
        let doorbells = Arc::new(IoEventWiring::new(vm.clone()));
        let windows = Arc::new(MemoryWindows::new(vm.clone()));
        let mut pci = PciBus::new(PCI_ECAM_BASE);
        pci.set_doorbell_wiring(doorbells.clone());
        pci.set_window_wiring(windows.clone());
        DeviceManager {
            pci,
            doorbells,
            windows,
            gsi: GsiRouter::new(vm.clone()),
            bar_window: BarAllocator::new(PCI_MMIO_START, PCI_MMIO_END),
            restored: None,
        }
    }

    /// The devices start from `states` (a snapshot's or a migration's) when the VM runs.
    pub(crate) fn restore_from(&mut self, states: DeviceStates) {
        self.restored = Some(states);
    }

    /// The fast path's GSI routing table.
    pub fn gsi_router(&self) -> Arc<GsiRouter> {
        self.gsi.clone()
    }

    /// Plugs `device` into bus 0; returns its slot.
    pub fn add_pci_device(&mut self, device: Arc<dyn PciDevice>) -> Result<u8, Error> {
        self.pci
            .add(device)
            .map_err(|e| Error::Device(e.to_string()))
    }

    /// A guest-physical address for a memory BAR of `size` bytes.
    pub fn allocate_bar(&mut self, size: u64) -> Result<u64, Error> {
        self.bar_window
            .allocate(size)
            .map_err(|e| Error::Device(e.to_string()))
    }

    /// Plugs `device` into bus 0 with doorbell `id` served by `doorbells[id]` and
    /// direct window `id` mapped from `windows[id]` wherever its BAR decodes.
    pub fn add_pci_device_wired(
        &mut self,
        device: Arc<dyn PciDevice>,
        doorbells: Vec<EventFd>,
        windows: Vec<HostWindow>,
    ) -> Result<u8, Error> {
        let slot = self
            .pci
            .free_slot()
            .ok_or_else(|| Error::Device(devices::pci::PciError::Full.to_string()))?;
        for (id, fd) in doorbells.into_iter().enumerate() {
            self.doorbells.provide(slot, id as u32, fd);
        }
        for (id, window) in windows.into_iter().enumerate() {
            self.windows.provide(slot, id as u32, window);
        }
        self.add_pci_device(device)
    }

    /// The port devices beside the PCI bus, fresh or restored (PCI functions' state
    /// goes back into the bus first), handed to `hub` so a snapshot can save them.
    /// COM1 writes to `console`.
    pub(crate) fn start(
        self,
        console: Box<dyn std::io::Write + Send>,
        hub: &Hub,
    ) -> Result<RunningDevices, Error> {
        let pci = Arc::new(self.pci);
        let ports = Arc::new(ConfigPorts::new(pci.clone()));
        let (com1, timer) = match &self.restored {
            None => (Com1::new(console), BootTimer::new()),
            Some(saved) => {
                let bad = |e: devices::DeviceStateError| Error::Migration(e.to_string());
                pci.restore_state(&saved.pci).map_err(bad)?;
                ports.set_address(saved.pci_address);
                (
                    Com1::from_state(console, &saved.com1).map_err(bad)?,
                    BootTimer::from_state(&saved.boot_timer),
                )
            }
        };
        let (com1, timer) = (Arc::new(com1), Arc::new(timer));
        hub.attach(Devices {
            com1: com1.clone(),
            timer: timer.clone(),
            ports: ports.clone(),
            pci: pci.clone(),
        });
        let mut bus = PioBus::new();
        let fixed: [(u16, u16, Arc<dyn devices::PioDevice>); 4] = [
            (COM1_PORT, COM1_LEN, com1.clone()),
            (DEBUG_EXIT_PORT, DEBUG_EXIT_LEN, Arc::new(DebugExit)),
            (BOOT_TIMER_PORT, 1, timer.clone()),
            (
                devices::pci::bus::CONFIG_PORTS_BASE,
                devices::pci::bus::CONFIG_PORTS_LEN,
                ports,
            ),
        ];
        for (base, len, device) in fixed {
            bus.insert(PioRange::new(base, len), device)
                .expect("the fixed port map does not overlap");
        }
        Ok(RunningDevices {
            bus,
            pci,
            com1,
            timer,
        })
    }
}
