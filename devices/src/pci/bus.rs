//! PCI bus 0: a host bridge and up to 31 devices, reached through ECAM (a memory
//! window the ACPI MCFG table describes) or the legacy 0xCF8/0xCFC ports, and the
//! routing of memory accesses to the device whose BAR decodes them.
//!
//! The bus is built before the vCPUs run and shared by them read-only; only the table
//! of decoded BAR regions changes at run time (after a configuration write, when the
//! guest may have moved a BAR or toggled memory decoding), behind a `RwLock` that the
//! data path only reads. Devices lock their own state.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use super::config::{BarRegion, ConfigSpace, ECAM_FUNCTION_SIZE};
use crate::state::{DeviceStateError, PciDeviceState};
use crate::{IoAction, PioDevice};

/// Devices (slots) on a bus.
pub const SLOTS: usize = 32;
/// Bytes of ECAM for one bus: 32 devices x 8 functions x 4 KiB.
pub const ECAM_BUS_SIZE: u64 = 1 << 20;

/// A PCI function on kumo's bus. Offsets are relative to the configuration space or
/// to the BAR; data is 1 to 8 bytes. Called from vCPU threads concurrently: a device
/// locks its own state.
pub trait PciDevice: Send + Sync {
    fn config_read(&self, offset: usize, data: &mut [u8]);
    fn config_write(&self, offset: usize, data: &[u8]);
    /// Its memory BARs that decode now (see [`ConfigSpace::memory_regions`]).
    fn memory_regions(&self) -> Vec<BarRegion>;
    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]);
    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]);
    /// Its doorbells: places in its memory BARs where a guest write only signals, for
    /// the VMM to serve without an exit (see [`DoorbellWiring`]). A write that reaches
    /// [`bar_write`](Self::bar_write) there must ring the doorbell all the same.
    fn doorbells(&self) -> Vec<Doorbell> {
        Vec::new()
    }
    /// Its direct windows: pieces of its memory BARs that the VMM maps straight into
    /// the guest (device memory behind them, see [`WindowWiring`]); guest accesses
    /// there never reach [`bar_read`](Self::bar_read) or [`bar_write`](Self::bar_write).
    fn direct_windows(&self) -> Vec<DirectWindow> {
        Vec::new()
    }
    /// Its state for a snapshot. A model without state support says so, and a VM
    /// holding it cannot be saved.
    fn save_state(&self) -> Result<PciDeviceState, DeviceStateError> {
        Err(DeviceStateError::Unsupported {
            device: "a PCI device",
        })
    }
    /// Puts saved state back (before the guest runs again).
    fn restore_state(&self, _state: &PciDeviceState) -> Result<(), DeviceStateError> {
        Err(DeviceStateError::Unsupported {
            device: "a PCI device",
        })
    }
}

/// Bus 0 as a snapshot holds it: the state of the device in each slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciBusState {
    pub slots: Vec<Option<PciDeviceState>>,
}

/// A doorbell of a device: a guest write of any size at `offset` in memory BAR `bar`
/// whose only effect is to signal doorbell `id` (a queue notify, a test device's ring).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doorbell {
    pub bar: u8,
    pub offset: u64,
    /// The device's own number for it (what the VMM signals).
    pub id: u32,
}

/// Where the VMM serves doorbells (in kumo, KVM ioeventfds). The bus keeps it in step
/// with the decoded BARs: a doorbell is attached exactly while its BAR decodes, at the
/// address where it decodes, and moves with the BAR. Calls come in order (detach before
/// attach), from whichever thread wrote the configuration.
pub trait DoorbellWiring: Send + Sync {
    /// Doorbell `id` of the device in `slot` now decodes at guest-physical `address`.
    fn attach(&self, slot: u8, id: u32, address: u64);
    /// Doorbell `id` of the device in `slot` no longer decodes at `address`.
    fn detach(&self, slot: u8, id: u32, address: u64);
}

/// A direct window of a device: `size` bytes at `offset` in memory BAR `bar` that the
/// VMM maps into the guest as memory (a passthrough device's registers or memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectWindow {
    pub bar: u8,
    pub offset: u64,
    pub size: u64,
    /// The device's own number for it (what the VMM maps).
    pub id: u32,
}

/// Where the VMM maps direct windows (in kumo, KVM memory slots), kept in step with
/// the decoded BARs as [`DoorbellWiring`] is: a window is mapped exactly while its BAR
/// decodes, where it decodes, and moves with the BAR.
pub trait WindowWiring: Send + Sync {
    /// Window `id` of the device in `slot` now decodes at guest-physical `address`.
    fn attach(&self, slot: u8, id: u32, address: u64);
    /// Window `id` of the device in `slot` no longer decodes at `address`.
    fn detach(&self, slot: u8, id: u32, address: u64);
}

/// An attached doorbell or window: (slot, id, address).
type Wired = (u8, u32, u64);

/// What the bus has attached through its wirings now.
#[derive(Default)]
struct Attached {
    doorbells: Vec<Wired>,
    windows: Vec<Wired>,
}

/// Detaches what `old` has and `new` lacks, then attaches what `new` adds.
fn rewire(old: &[Wired], new: &[Wired], detach: impl Fn(&Wired), attach: impl Fn(&Wired)) {
    old.iter().filter(|w| !new.contains(w)).for_each(detach);
    new.iter().filter(|w| !old.contains(w)).for_each(attach);
}

/// Errors building a bus (VMM configuration mistakes).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciError {
    #[error("PCI bus 0 is full ({SLOTS} slots)")]
    Full,
    #[error("no room for a {size:#x}-byte BAR in the PCI memory window")]
    WindowFull { size: u64 },
}

/// The host bridge in slot 0: identity only (Intel's Q35 MCH IDs, which guests know).
pub struct HostBridge {
    config: ConfigSpace,
}

impl HostBridge {
    pub fn new() -> HostBridge {
        HostBridge {
            config: ConfigSpace::new(0x8086, 0x29c0, 0x06_00_00, 0),
        }
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        HostBridge::new()
    }
}

impl PciDevice for HostBridge {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        self.config.read(offset, data);
    }
    // Nothing in the bridge's header is writable that kumo models.
    fn config_write(&self, _offset: usize, _data: &[u8]) {}
    fn memory_regions(&self) -> Vec<BarRegion> {
        Vec::new()
    }
    fn bar_read(&self, _bar: u8, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn bar_write(&self, _bar: u8, _offset: u64, _data: &[u8]) {}
    fn save_state(&self) -> Result<PciDeviceState, DeviceStateError> {
        Ok(PciDeviceState {
            kind: HOST_BRIDGE_KIND.into(),
            config: self.config.state(),
            msix: None,
            virtio: None,
        })
    }
    fn restore_state(&self, state: &PciDeviceState) -> Result<(), DeviceStateError> {
        if state.kind != HOST_BRIDGE_KIND || state.msix.is_some() || state.virtio.is_some() {
            return Err(DeviceStateError::mismatch(
                "host bridge",
                format!("the state is a '{}'s", state.kind),
            ));
        }
        // Nothing in the bridge changes at run time: the saved registers must be its own.
        let mut check = self.config.clone();
        check.restore_state(&state.config)?;
        if check.state() != self.config.state() {
            return Err(DeviceStateError::mismatch(
                "host bridge",
                "registers differ from the bridge's fixed ones",
            ));
        }
        Ok(())
    }
}

const HOST_BRIDGE_KIND: &str = "host-bridge";

/// A decoded BAR: where, and whose.
#[derive(Debug, Clone, Copy)]
struct Route {
    region: BarRegion,
    slot: usize,
}

/// Where a memory access lands: a function's configuration register (bus, slot,
/// function, register) or an offset in one of a device's BARs.
enum Target {
    Config(u32, u32, u32, usize),
    Bar(Arc<dyn PciDevice>, u8, u64),
}

/// Bus 0.
pub struct PciBus {
    slots: Vec<Option<Arc<dyn PciDevice>>>,
    ecam_base: u64,
    routes: RwLock<Vec<Route>>,
    wiring: Option<Arc<dyn DoorbellWiring>>,
    windows: Option<Arc<dyn WindowWiring>>,
    /// The doorbells and windows attached now; its lock also orders route refreshes.
    wired: Mutex<Attached>,
}

impl PciBus {
    /// A bus with its host bridge, whose ECAM window starts at `ecam_base`.
    pub fn new(ecam_base: u64) -> PciBus {
        let mut slots: Vec<Option<Arc<dyn PciDevice>>> = vec![None; SLOTS];
        slots[0] = Some(Arc::new(HostBridge::new()));
        PciBus {
            slots,
            ecam_base,
            routes: RwLock::new(Vec::new()),
            wiring: None,
            windows: None,
            wired: Mutex::new(Attached::default()),
        }
    }

    /// Has the bus keep devices' doorbells wired through `wiring` (set before adding
    /// devices that have doorbells).
    pub fn set_doorbell_wiring(&mut self, wiring: Arc<dyn DoorbellWiring>) {
        self.wiring = Some(wiring);
        self.refresh_routes();
    }

    /// Has the bus keep devices' direct windows mapped through `wiring` (set before
    /// adding devices that have windows).
    pub fn set_window_wiring(&mut self, wiring: Arc<dyn WindowWiring>) {
        self.windows = Some(wiring);
        self.refresh_routes();
    }

    /// The slot the next [`add`](Self::add) will use, if any is free.
    pub fn free_slot(&self) -> Option<u8> {
        self.slots.iter().position(Option::is_none).map(|s| s as u8)
    }

    /// Plugs `device` into the first free slot; returns the slot.
    pub fn add(&mut self, device: Arc<dyn PciDevice>) -> Result<u8, PciError> {
        let slot = self
            .slots
            .iter()
            .position(Option::is_none)
            .ok_or(PciError::Full)?;
        self.slots[slot] = Some(device);
        self.refresh_routes();
        Ok(slot as u8)
    }

    /// Every slot's device state (a VM with a device that cannot be saved cannot be).
    pub fn save_state(&self) -> Result<PciBusState, DeviceStateError> {
        let slots = self
            .slots
            .iter()
            .map(|d| d.as_ref().map(|d| d.save_state()).transpose())
            .collect::<Result<_, _>>()?;
        Ok(PciBusState { slots })
    }

    /// Puts every slot's state back into the devices this bus was built with (the same
    /// slots must be filled) and re-derives the BAR routes.
    pub fn restore_state(&self, state: &PciBusState) -> Result<(), DeviceStateError> {
        if state.slots.len() != self.slots.len() {
            return Err(DeviceStateError::mismatch(
                "PCI bus",
                format!(
                    "{} slots saved, bus 0 has {}",
                    state.slots.len(),
                    self.slots.len()
                ),
            ));
        }
        for (slot, (device, saved)) in self.slots.iter().zip(&state.slots).enumerate() {
            match (device, saved) {
                (Some(device), Some(saved)) => device.restore_state(saved)?,
                (None, None) => {}
                (Some(_), None) | (None, Some(_)) => {
                    return Err(DeviceStateError::mismatch(
                        "PCI bus",
                        format!("slot {slot} is filled on one side only"),
                    ));
                }
            }
        }
        self.refresh_routes();
        Ok(())
    }

    fn device(&self, bus: u32, slot: u32, function: u32) -> Option<&Arc<dyn PciDevice>> {
        if bus != 0 || function != 0 {
            return None;
        }
        self.slots.get(slot as usize)?.as_ref()
    }

    /// Reads configuration space; nothing there reads as all ones.
    pub fn config_read(&self, bus: u32, slot: u32, function: u32, offset: usize, data: &mut [u8]) {
        match self.device(bus, slot, function) {
            Some(device) if offset + data.len() <= ECAM_FUNCTION_SIZE => {
                device.config_read(offset, data)
            }
            _ => data.fill(0xff),
        }
    }

    /// Writes configuration space (ignored where nothing answers).
    pub fn config_write(&self, bus: u32, slot: u32, function: u32, offset: usize, data: &[u8]) {
        if let Some(device) = self.device(bus, slot, function)
            && offset + data.len() <= ECAM_FUNCTION_SIZE
        {
            device.config_write(offset, data);
            // The write may have moved a BAR or switched decoding.
            self.refresh_routes();
        }
    }

    /// Re-derives the decoded BARs from every device's configuration (after a write
    /// that may have moved a BAR or switched decoding), and moves the doorbells and
    /// windows with them.
    fn refresh_routes(&self) {
        let mut wired = self.wired.lock().unwrap_or_else(|e| e.into_inner());
        let routes: Vec<Route> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, d)| Some((slot, d.as_ref()?)))
            .flat_map(|(slot, d)| {
                d.memory_regions()
                    .into_iter()
                    .map(move |region| Route { region, slot })
            })
            .collect();
        let doorbells = self.wiring.as_ref().map(|wiring| {
            let wanted = self.placed(&routes, |d| {
                d.doorbells()
                    .into_iter()
                    .map(|b| (b.bar, b.offset, 1, b.id))
                    .collect()
            });
            (wiring, wanted)
        });
        let windows = self.windows.as_ref().map(|wiring| {
            let wanted = self.placed(&routes, |d| {
                d.direct_windows()
                    .into_iter()
                    .map(|w| (w.bar, w.offset, w.size, w.id))
                    .collect()
            });
            (wiring, wanted)
        });
        *self.routes.write().unwrap_or_else(|e| e.into_inner()) = routes;
        if let Some((wiring, wanted)) = doorbells {
            rewire(
                &wired.doorbells,
                &wanted,
                |&(slot, id, at)| wiring.detach(slot, id, at),
                |&(slot, id, at)| wiring.attach(slot, id, at),
            );
            wired.doorbells = wanted;
        }
        if let Some((wiring, wanted)) = windows {
            rewire(
                &wired.windows,
                &wanted,
                |&(slot, id, at)| wiring.detach(slot, id, at),
                |&(slot, id, at)| wiring.attach(slot, id, at),
            );
            wired.windows = wanted;
        }
    }

    /// Where the pieces `of` each device lists, `(bar, offset, size, id)`, decode
    /// under `routes` (a piece decodes only wholly inside its decoded BAR).
    fn placed(
        &self,
        routes: &[Route],
        of: impl Fn(&dyn PciDevice) -> Vec<(u8, u64, u64, u32)>,
    ) -> Vec<Wired> {
        let mut found = Vec::new();
        for route in routes {
            let Some(device) = &self.slots[route.slot] else {
                continue;
            };
            for (bar, offset, size, id) in of(device.as_ref()) {
                let inside = offset
                    .checked_add(size)
                    .is_some_and(|end| end <= route.region.size);
                if bar == route.region.index && inside {
                    found.push((route.slot as u8, id, route.region.address + offset));
                }
            }
        }
        found
    }

    /// Splits an ECAM offset into (bus, slot, function, register).
    fn ecam_decode(offset: u64) -> (u32, u32, u32, usize) {
        (
            (offset >> 20) as u32,
            ((offset >> 15) & 0x1f) as u32,
            ((offset >> 12) & 0x7) as u32,
            (offset & 0xfff) as usize,
        )
    }

    fn ecam_offset(&self, addr: u64) -> Option<u64> {
        addr.checked_sub(self.ecam_base)
            .filter(|&off| off < ECAM_BUS_SIZE)
    }

    /// A memory read: ECAM or a device's BAR. False if nothing decodes `addr`.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.decode(addr, data.len()) {
            Some(Target::Config(b, s, f, reg)) => self.config_read(b, s, f, reg, data),
            Some(Target::Bar(device, bar, offset)) => device.bar_read(bar, offset, data),
            None => return false,
        }
        true
    }

    /// A memory write: ECAM or a device's BAR. False if nothing decodes `addr`.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        match self.decode(addr, data.len()) {
            Some(Target::Config(b, s, f, reg)) => self.config_write(b, s, f, reg, data),
            Some(Target::Bar(device, bar, offset)) => device.bar_write(bar, offset, data),
            None => return false,
        }
        true
    }

    /// What a memory access of `len` bytes at `addr` reaches, if anything.
    fn decode(&self, addr: u64, len: usize) -> Option<Target> {
        if let Some(off) = self.ecam_offset(addr) {
            let (bus, slot, function, reg) = Self::ecam_decode(off);
            return Some(Target::Config(bus, slot, function, reg));
        }
        let (device, bar, offset) = self.route(addr, len)?;
        Some(Target::Bar(device, bar, offset))
    }

    /// The device, BAR and offset of an access wholly inside one decoded BAR.
    fn route(&self, addr: u64, len: usize) -> Option<(Arc<dyn PciDevice>, u8, u64)> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let route = routes.iter().find(|r| {
            addr.checked_sub(r.region.address)
                .is_some_and(|off| off.saturating_add(len as u64) <= r.region.size)
        })?;
        let device = self.slots[route.slot].clone()?;
        Some((device, route.region.index, addr - route.region.address))
    }
}

/// The legacy configuration mechanism: address register at 0xCF8, data at
/// 0xCFC..=0xCFF. Registered on the port bus for `0xCF8..0xD00`.
pub struct ConfigPorts {
    bus: Arc<PciBus>,
    address: AtomicU32,
}

/// First port of [`ConfigPorts`] and how many it takes.
pub const CONFIG_PORTS_BASE: u16 = 0xcf8;
pub const CONFIG_PORTS_LEN: u16 = 8;
const ENABLE: u32 = 1 << 31;

impl ConfigPorts {
    pub fn new(bus: Arc<PciBus>) -> ConfigPorts {
        ConfigPorts {
            bus,
            address: AtomicU32::new(0),
        }
    }

    /// The address register (the only state of the ports).
    pub fn address(&self) -> u32 {
        self.address.load(Ordering::SeqCst)
    }

    /// Restores the address register (masked as a guest write is).
    pub fn set_address(&self, value: u32) {
        self.address.store(value & 0x80ff_fffc, Ordering::SeqCst);
    }

    /// (bus, slot, function, register) the address register selects, if enabled.
    fn target(&self, port_offset: u16) -> Option<(u32, u32, u32, usize)> {
        let address = self.address.load(Ordering::SeqCst);
        (address & ENABLE != 0).then(|| {
            (
                (address >> 16) & 0xff,
                (address >> 11) & 0x1f,
                (address >> 8) & 0x7,
                (address & 0xfc) as usize + usize::from(port_offset - 4),
            )
        })
    }
}

impl PioDevice for ConfigPorts {
    fn read(&self, offset: u16, data: &mut [u8]) {
        match offset {
            0 if data.len() == 4 => {
                data.copy_from_slice(&self.address.load(Ordering::SeqCst).to_le_bytes())
            }
            4..=7 => match self.target(offset) {
                Some((bus, slot, function, reg)) => {
                    self.bus.config_read(bus, slot, function, reg, data)
                }
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&self, offset: u16, data: &[u8]) -> IoAction {
        match offset {
            0 if data.len() == 4 => {
                let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                self.address.store(value & 0x80ff_fffc, Ordering::SeqCst);
            }
            4..=7 => {
                if let Some((bus, slot, function, reg)) = self.target(offset) {
                    self.bus.config_write(bus, slot, function, reg, data);
                }
            }
            _ => {}
        }
        IoAction::Continue
    }
}

/// Hands out BAR addresses from a window, naturally aligned, as firmware does before
/// the guest boots.
#[derive(Debug, Clone)]
pub struct BarAllocator {
    next: u64,
    end: u64,
}

impl BarAllocator {
    /// The window `[start, end)`.
    pub fn new(start: u64, end: u64) -> BarAllocator {
        BarAllocator { next: start, end }
    }

    /// An address for a BAR of `size` (a power of two).
    pub fn allocate(&mut self, size: u64) -> Result<u64, PciError> {
        let fits = if size.is_power_of_two() {
            self.next
                .checked_next_multiple_of(size)
                .and_then(|at| Some((at, at.checked_add(size)?)))
                .filter(|&(_, end)| end <= self.end)
        } else {
            None
        };
        match fits {
            Some((at, end)) => {
                self.next = end;
                Ok(at)
            }
            None => Err(PciError::WindowFull { size }),
        }
    }
}
