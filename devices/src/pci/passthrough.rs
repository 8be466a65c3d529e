//! A PCI function that lives elsewhere (a kernel VFIO device, a vfio-user server),
//! mediated for the guest. Shared by every passthrough backend: the backend only moves
//! bytes of the device's regions; this module decides what the guest sees.
//!
//! - Header (bytes `0..0x40`): kumo's own [`ConfigSpace`] with the device's identity
//!   and BAR sizes, so BARs are placed and relocated by kumo's allocator and the
//!   guest (the device's own BAR addresses never matter); the command register is
//!   kept here and also forwarded, so the device sees memory and bus-master enable.
//! - The MSI-X capability: virtualized. Its message control (enable, function mask)
//!   is kumo's; the table and PBA in the BAR are trapped and served by kumo's
//!   [`Msix`], whose route changes go to the VMM's [`InterruptSourceGroup`] (irqfd routes on the
//!   fast path). The device signals vector `v` by its eventfd; it never sees the table.
//! - Every other capability byte and every other BAR byte: forwarded to the device,
//!   except where the backend can map the BAR into this process: those pages become
//!   direct windows the VMM maps into the guest (VFIO's BAR mmap), all but the pages
//!   holding the MSI-X table and PBA, which stay trapped.
//!
//! Nothing the device reports is trusted: BAR sizes must be powers of two in range,
//! the capability list is walked with a bound and must stay in the capability area,
//! and the MSI-X table and PBA must lie inside their BARs.

use std::sync::{Arc, Mutex, MutexGuard};

use super::bus::{DirectWindow, Doorbell, PciDevice};
use super::config::{
    self, Bar, BarKind, BarRegion, COMMAND, CONFIG_SIZE, ConfigError, ConfigSpace, STATUS,
};
use super::msix::{self, Msix, Update};
use crate::interrupt::InterruptSourceGroup;

/// Largest BAR kumo places for a passthrough device.
pub const MAX_BAR_SIZE: u64 = 1 << 30;
/// Where the capability area starts.
const CAPABILITIES_START: usize = 0x40;
/// The granule of direct windows: the host's and the guest's page.
pub const WINDOW_PAGE: u64 = 4096;

/// Moves bytes of the real device's regions (index 0-5: BARs, 7: configuration
/// space, as VFIO numbers them). Errors mean the device is gone or refused.
pub trait RegionAccess: Send + Sync {
    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String>;
    fn region_write(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), String>;
}

/// VFIO's region index of configuration space.
pub const CONFIG_REGION: u32 = 7;

/// Why a device cannot be mediated (it reported something kumo will not trust).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PassthroughError {
    #[error("BAR {index}: size {size:#x} is not a power of two between 16 bytes and 1 GiB")]
    BarSize { index: usize, size: u64 },
    #[error("BAR {index} is an I/O BAR (only memory BARs are supported)")]
    IoBar { index: usize },
    #[error("the capability list is malformed ({0})")]
    Capabilities(&'static str),
    #[error("the device has no MSI-X capability")]
    NoMsix,
    #[error("MSI-X {what} (BAR {bar}, offset {offset:#x}, {len} bytes) lies outside its BAR")]
    MsixPlacement {
        what: &'static str,
        bar: u8,
        offset: u64,
        len: u64,
    },
    #[error("MSI-X: the device has {irqs} interrupt vectors, its table {table}")]
    MsixCount { irqs: u32, table: u16 },
    #[error("doorbell at BAR {bar} offset {offset:#x} lies outside the BAR")]
    Doorbell { bar: u8, offset: u64 },
    #[error("configuration space: {0}")]
    Config(#[from] ConfigError),
}

/// What the device reported about itself, read by the backend at attach.
#[derive(Debug, Clone)]
pub struct DeviceLayout {
    /// The first 256 bytes of its configuration space.
    pub config: [u8; CONFIG_SIZE],
    /// Region size of BARs 0-5 (0: absent).
    pub bar_sizes: [u64; 6],
    /// MSI-X vectors the device can signal.
    pub msix_irqs: u32,
    /// Places in BARs where a write only signals (served by eventfds): (bar, offset).
    pub doorbells: Vec<(u8, u64)>,
    /// Parts of BARs the backend can map into this process: (bar, offset, size).
    pub mappable: Vec<(u8, u64, u64)>,
}

/// Where the MSI-X table and PBA are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MsixLayout {
    cap: usize,
    table_bar: u8,
    table_offset: u64,
    pba_bar: u8,
    pba_offset: u64,
}

struct State {
    config: ConfigSpace,
    msix: Msix,
}

/// The mediated function on kumo's bus.
pub struct PassthroughDevice {
    access: Arc<dyn RegionAccess>,
    state: Mutex<State>,
    layout: MsixLayout,
    /// The MSI-X capability's bytes `[cap, cap + 12)`, as the device has them.
    msix_cap_bytes: [u8; 12],
    sink: Arc<dyn InterruptSourceGroup>,
    doorbells: Vec<Doorbell>,
    windows: Vec<DirectWindow>,
}

fn word(config: &[u8; CONFIG_SIZE], at: usize) -> u16 {
    u16::from_le_bytes([config[at], config[at + 1]])
}

fn dword(config: &[u8; CONFIG_SIZE], at: usize) -> u32 {
    u32::from_le_bytes([config[at], config[at + 1], config[at + 2], config[at + 3]])
}

/// Walks the device's capability list (at most 48 entries, each in the capability
/// area, 4-byte aligned) and returns the MSI-X capability's offset.
fn find_msix(config: &[u8; CONFIG_SIZE]) -> Result<usize, PassthroughError> {
    if word(config, STATUS) & config::STATUS_CAPABILITIES == 0 {
        return Err(PassthroughError::NoMsix);
    }
    let mut at = usize::from(config[config::CAPABILITIES_POINTER]);
    for _ in 0..48 {
        if at == 0 {
            return Err(PassthroughError::NoMsix);
        }
        if at < CAPABILITIES_START || at + 12 > CONFIG_SIZE || !at.is_multiple_of(4) {
            return Err(PassthroughError::Capabilities(
                "a capability lies outside the capability area",
            ));
        }
        if config[at] == msix::CAPABILITY_ID {
            return Ok(at);
        }
        at = usize::from(config[at + 1]);
    }
    Err(PassthroughError::Capabilities("the list loops"))
}

impl PassthroughDevice {
    /// Mediates the device `layout` describes, reached through `access`; its MSI-X
    /// vectors go to `sink`. Doorbell ids are the indices of `layout.doorbells`.
    pub fn new(
        access: Arc<dyn RegionAccess>,
        layout: &DeviceLayout,
        sink: Arc<dyn InterruptSourceGroup>,
    ) -> Result<PassthroughDevice, PassthroughError> {
        let c = &layout.config;
        let class = dword(c, config::REVISION) >> 8;
        let mut space = ConfigSpace::new(
            word(c, config::VENDOR_ID),
            word(c, config::DEVICE_ID),
            class,
            c[config::REVISION],
        );
        space.put(0x2c, &c[0x2c..0x30]);
        space.put(
            config::CAPABILITIES_POINTER,
            &[c[config::CAPABILITIES_POINTER]],
        );
        space.put(
            STATUS,
            &(word(c, STATUS) & config::STATUS_CAPABILITIES).to_le_bytes(),
        );
        let mut index = 0;
        while index < 6 {
            let size = layout.bar_sizes[index];
            let register = dword(c, config::BAR0 + 4 * index);
            let kind = if register & 1 == 1 {
                BarKind::Io
            } else if register & 0b110 == 0b100 {
                BarKind::Memory64
            } else {
                BarKind::Memory32
            };
            if size == 0 {
                index += 1;
                continue;
            }
            if kind == BarKind::Io {
                return Err(PassthroughError::IoBar { index });
            }
            if !size.is_power_of_two() || !(16..=MAX_BAR_SIZE).contains(&size) {
                return Err(PassthroughError::BarSize { index, size });
            }
            space.add_bar(index, Bar { kind, size })?;
            index += if kind == BarKind::Memory64 { 2 } else { 1 };
        }
        let cap = find_msix(c)?;
        let control = word(c, cap + 2);
        let vectors = (control & 0x7ff) + 1;
        if layout.msix_irqs != u32::from(vectors) {
            return Err(PassthroughError::MsixCount {
                irqs: layout.msix_irqs,
                table: vectors,
            });
        }
        let (table, pba) = (dword(c, cap + 4), dword(c, cap + 8));
        let msix_layout = MsixLayout {
            cap,
            table_bar: (table & 7) as u8,
            table_offset: u64::from(table & !7),
            pba_bar: (pba & 7) as u8,
            pba_offset: u64::from(pba & !7),
        };
        let msix = Msix::new(vectors);
        let inside = |what, bar: u8, offset: u64, len: u64| {
            let size = layout.bar_sizes.get(usize::from(bar)).copied().unwrap_or(0);
            if offset.checked_add(len).is_some_and(|end| end <= size) {
                Ok(())
            } else {
                Err(PassthroughError::MsixPlacement {
                    what,
                    bar,
                    offset,
                    len,
                })
            }
        };
        inside(
            "table",
            msix_layout.table_bar,
            msix_layout.table_offset,
            msix.table_size(),
        )?;
        inside(
            "PBA",
            msix_layout.pba_bar,
            msix_layout.pba_offset,
            msix.pba_size(),
        )?;
        let doorbells = layout
            .doorbells
            .iter()
            .enumerate()
            .map(|(id, &(bar, offset))| {
                let size = layout.bar_sizes.get(usize::from(bar)).copied().unwrap_or(0);
                if offset.checked_add(4).is_some_and(|end| end <= size) {
                    Ok(Doorbell {
                        bar,
                        offset,
                        id: id as u32,
                    })
                } else {
                    Err(PassthroughError::Doorbell { bar, offset })
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let trapped = [
            (
                msix_layout.table_bar,
                msix_layout.table_offset,
                msix.table_size(),
            ),
            (msix_layout.pba_bar, msix_layout.pba_offset, msix.pba_size()),
        ];
        let windows = direct_windows(&layout.mappable, &layout.bar_sizes, &trapped);
        let mut msix_cap_bytes = [0; 12];
        msix_cap_bytes.copy_from_slice(&c[cap..cap + 12]);
        Ok(PassthroughDevice {
            access,
            state: Mutex::new(State {
                config: space,
                msix,
            }),
            layout: msix_layout,
            msix_cap_bytes,
            sink,
            doorbells,
            windows,
        })
    }

    /// Its direct windows (ids are their indices).
    pub fn windows(&self) -> &[DirectWindow] {
        &self.windows
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Places BAR `index` (before the guest runs, as firmware does).
    pub fn place_bar(&self, index: usize, address: u64) {
        self.state().config.set_bar_address(index, address);
    }

    /// The BARs kumo must place: (index, size).
    pub fn bars(&self) -> Vec<(usize, u64)> {
        let state = self.state();
        (0..6)
            .filter_map(|i| Some((i, state.config.bar_size(i)?)))
            .collect()
    }

    /// The device signalled `vector` (the generic path: the VMM read its eventfd).
    /// Held in the PBA while masked, as the table says.
    pub fn fire(&self, vector: u16) {
        let mut state = self.state();
        if state.msix.fire(vector).is_some() {
            self.sink.trigger(vector);
        }
    }

    /// Route changes go to the sink with the state locked, so a concurrent
    /// [`fire`](Self::fire) sees the new route.
    fn apply(&self, update: Update) {
        update.apply_to(&*self.sink);
    }

    /// Message control as the guest reads it: the device's table size, kumo's enable
    /// and function-mask bits.
    fn control(&self, msix: &Msix) -> u16 {
        let mut control =
            u16::from_le_bytes([self.msix_cap_bytes[2], self.msix_cap_bytes[3]]) & 0x7ff;
        if msix.enabled() {
            control |= msix::CONTROL_ENABLE;
        }
        if msix.function_masked() {
            control |= msix::CONTROL_FUNCTION_MASK;
        }
        control
    }

    fn msix_cap_range(&self) -> std::ops::Range<usize> {
        self.layout.cap..self.layout.cap + 12
    }

    fn table_range(&self, state: &State) -> (u8, std::ops::Range<u64>) {
        let start = self.layout.table_offset;
        (
            self.layout.table_bar,
            start..start + state.msix.table_size(),
        )
    }

    fn pba_range(&self, state: &State) -> (u8, std::ops::Range<u64>) {
        let start = self.layout.pba_offset;
        (self.layout.pba_bar, start..start + state.msix.pba_size())
    }

    fn forward_read(&self, region: u32, offset: u64, data: &mut [u8]) {
        if let Err(e) = self.access.region_read(region, offset, data) {
            // A device that is gone reads as all ones, as on a PCIe surprise removal.
            tracing::debug!("passthrough read of region {region} at {offset:#x}: {e}");
            data.fill(0xff);
        }
    }

    fn forward_write(&self, region: u32, offset: u64, data: &[u8]) {
        if let Err(e) = self.access.region_write(region, offset, data) {
            tracing::debug!("passthrough write of region {region} at {offset:#x}: {e}");
        }
    }
}

impl PciDevice for PassthroughDevice {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        let end = offset.saturating_add(data.len());
        let cap = self.msix_cap_range();
        if offset >= CAPABILITIES_START
            && end <= CONFIG_SIZE
            && (end <= cap.start || offset >= cap.end)
        {
            // Wholly the device's: one access, not one per byte.
            self.forward_read(CONFIG_REGION, offset as u64, data);
            return;
        }
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset + i;
            *byte = if at < CAPABILITIES_START {
                self.state().config.byte(at)
            } else if self.msix_cap_range().contains(&at) {
                let state = self.state();
                let rel = at - self.layout.cap;
                let control = self.control(&state.msix);
                match rel {
                    2 => control as u8,
                    3 => (control >> 8) as u8,
                    _ => self.msix_cap_bytes[rel],
                }
            } else if at < CONFIG_SIZE {
                let mut b = [0u8];
                self.forward_read(CONFIG_REGION, at as u64, &mut b);
                b[0]
            } else {
                0
            };
        }
    }

    fn config_write(&self, offset: usize, data: &[u8]) {
        let end = offset.saturating_add(data.len());
        if end <= CAPABILITIES_START {
            self.state().config.write(offset, data);
            if offset < COMMAND + 2 && COMMAND < end {
                let command = self.state().config.command();
                self.forward_write(CONFIG_REGION, COMMAND as u64, &command.to_le_bytes());
            }
            return;
        }
        let cap = self.msix_cap_range();
        if offset < cap.end && cap.start < end {
            // Only message control is writable; the rest of the capability is not.
            let control_at = cap.start + 2;
            let mut control = self.control(&self.state().msix).to_le_bytes();
            for (i, &value) in data.iter().enumerate() {
                let at = offset + i;
                if (control_at..control_at + 2).contains(&at) {
                    control[at - control_at] = value;
                }
            }
            let mut state = self.state();
            let update = state.msix.set_control(u16::from_le_bytes(control));
            self.apply(update);
            return;
        }
        if end <= CONFIG_SIZE {
            self.forward_write(CONFIG_REGION, offset as u64, data);
        }
    }

    fn memory_regions(&self) -> Vec<BarRegion> {
        self.state().config.memory_regions().collect()
    }

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        {
            let state = self.state();
            let (table_bar, table) = self.table_range(&state);
            if bar == table_bar && table.contains(&offset) {
                state.msix.table_read(offset - table.start, data);
                return;
            }
            let (pba_bar, pba) = self.pba_range(&state);
            if bar == pba_bar && pba.contains(&offset) {
                state.msix.pba_read(offset - pba.start, data);
                return;
            }
        }
        self.forward_read(u32::from(bar), offset, data);
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        {
            let mut state = self.state();
            let (table_bar, table) = self.table_range(&state);
            if bar == table_bar && table.contains(&offset) {
                let update = state.msix.table_write(offset - table.start, data);
                self.apply(update);
                return;
            }
            let (pba_bar, pba) = self.pba_range(&state);
            if bar == pba_bar && pba.contains(&offset) {
                return; // read-only
            }
        }
        self.forward_write(u32::from(bar), offset, data);
    }

    fn doorbells(&self) -> Vec<Doorbell> {
        self.doorbells.clone()
    }

    fn direct_windows(&self) -> Vec<DirectWindow> {
        self.windows.clone()
    }
}

/// The whole pages of the `mappable` parts of BARs (bar, offset, size) that hold none
/// of the `trapped` ranges (bar, offset, len): what the guest may reach without kumo.
/// Parts outside their BAR are cut to it; what is left of a page is trapped.
fn direct_windows(
    mappable: &[(u8, u64, u64)],
    bar_sizes: &[u64; 6],
    trapped: &[(u8, u64, u64)],
) -> Vec<DirectWindow> {
    let mut windows = Vec::new();
    for &(bar, offset, size) in mappable {
        let bar_size = bar_sizes.get(usize::from(bar)).copied().unwrap_or(0);
        let start = offset.min(bar_size).next_multiple_of(WINDOW_PAGE);
        let end = offset.saturating_add(size).min(bar_size) / WINDOW_PAGE * WINDOW_PAGE;
        // Cut the trapped ranges out, each widened to whole pages.
        let mut holes: Vec<(u64, u64)> = trapped
            .iter()
            .filter(|&&(b, _, len)| b == bar && len > 0)
            .map(|&(_, at, len)| {
                let hole_end = at.saturating_add(len).next_multiple_of(WINDOW_PAGE);
                (at / WINDOW_PAGE * WINDOW_PAGE, hole_end)
            })
            .collect();
        holes.sort_unstable();
        let mut from = start;
        for (hole_start, hole_end) in holes.into_iter().chain([(end, end)]) {
            let to = hole_start.min(end);
            if to > from {
                windows.push(DirectWindow {
                    bar,
                    offset: from,
                    size: to - from,
                    id: windows.len() as u32,
                });
            }
            from = from.max(hole_end);
        }
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::MsiMessage;
    use crate::virtio::VirtioPciDevice;
    use crate::virtio::net::{NetConfig, VirtioNet};
    use crate::virtio::transport::{self, ActionSink, TransportAction};
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// What reached a sink: (vector, route) per reroute, vectors sent.
    #[derive(Default)]
    struct Recorder {
        reroutes: Mutex<Vec<(u16, Option<MsiMessage>)>>,
        sent: Mutex<Vec<u16>>,
    }

    impl InterruptSourceGroup for Recorder {
        fn trigger(&self, vector: u16) {
            self.sent.lock().unwrap().push(vector);
        }
        fn update(&self, vector: u16, route: Option<MsiMessage>) {
            self.reroutes.lock().unwrap().push((vector, route));
        }
    }

    impl ActionSink for Recorder {
        fn act(&self, _action: TransportAction) {}
    }

    /// The "real device": kumo's own virtio-net transport, reached as regions.
    struct Real(VirtioPciDevice, std::sync::atomic::AtomicBool);

    impl RegionAccess for Real {
        fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String> {
            if self.1.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("gone".into());
            }
            match region {
                0 => self.0.read_bar(0, offset, data),
                CONFIG_REGION => self.0.read_config(offset as usize, data),
                _ => return Err("no such region".into()),
            }
            Ok(())
        }
        fn region_write(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), String> {
            match region {
                0 => drop(self.0.write_bar(0, offset, data)),
                CONFIG_REGION => drop(self.0.write_config(offset as usize, data)),
                _ => return Err("no such region".into()),
            }
            Ok(())
        }
    }

    fn real() -> Arc<Real> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let net = Arc::new(
            VirtioNet::new(
                NetConfig {
                    mac: [2, 0, 0, 0, 0, 1],
                    queue_pairs: 1,
                    queue_size: 16,
                },
                mem,
            )
            .unwrap(),
        );
        let recorder = Arc::new(Recorder::default());
        Arc::new(Real(
            VirtioPciDevice::new(net, recorder.clone(), recorder).unwrap(),
            Default::default(),
        ))
    }

    fn layout_of(real: &Real) -> DeviceLayout {
        let mut config = [0u8; CONFIG_SIZE];
        real.0.read_config(0, &mut config);
        DeviceLayout {
            config,
            bar_sizes: [transport::BAR_SIZE, 0, 0, 0, 0, 0],
            msix_irqs: 3,
            doorbells: vec![(0, transport::NOTIFY_OFFSET)],
            mappable: Vec::new(),
        }
    }

    fn mediated() -> (Arc<Real>, PassthroughDevice, Arc<Recorder>) {
        let real = real();
        let sink = Arc::new(Recorder::default());
        let device = PassthroughDevice::new(real.clone(), &layout_of(&real), sink.clone()).unwrap();
        (real, device, sink)
    }

    fn read32(device: &PassthroughDevice, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        device.config_read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn identity_passes_and_bars_are_kumos() {
        let (real, device, _) = mediated();
        assert_eq!(
            read32(&device, 0),
            read32_real(&real, 0),
            "vendor and device"
        );
        assert_eq!(device.bars(), vec![(0, transport::BAR_SIZE)]);
        // The sizing protocol: all ones reads back the size mask.
        device.config_write(config::BAR0, &u32::MAX.to_le_bytes());
        assert_eq!(
            read32(&device, config::BAR0),
            !(transport::BAR_SIZE as u32 - 1)
        );
        // Relocated by kumo; the device's own BAR never moves.
        device.place_bar(0, 0xc000_0000);
        device.config_write(COMMAND, &config::COMMAND_MEMORY.to_le_bytes());
        assert_eq!(
            device.memory_regions(),
            vec![BarRegion {
                index: 0,
                address: 0xc000_0000,
                size: transport::BAR_SIZE
            }]
        );
        assert_eq!(real.0.bar_address(), Some(0));
        // The command register reached the device too.
        assert_eq!(
            read32_real(&real, COMMAND) as u16 & config::COMMAND_MEMORY,
            config::COMMAND_MEMORY
        );
    }

    fn read32_real(real: &Real, offset: usize) -> u32 {
        let mut b = [0u8; 4];
        real.0.read_config(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn msix_is_virtualized_and_trapped() {
        let (real, device, sink) = mediated();
        let cap = device.layout.cap;
        // Enabling MSI-X is kumo's business: the device's own control is untouched.
        device.config_write(cap + 2, &msix::CONTROL_ENABLE.to_le_bytes());
        assert_eq!(
            read32(&device, cap) >> 16,
            u32::from(msix::CONTROL_ENABLE) | 2
        );
        assert_eq!(read32_real(&real, cap) >> 16, 2);
        // Programming and unmasking entry 1 reroutes it, in kumo's table only.
        let entry = transport::MSIX_TABLE_OFFSET + 16;
        device.bar_write(0, entry, &0xfee0_1000u32.to_le_bytes());
        device.bar_write(0, entry + 8, &0x41u32.to_le_bytes());
        device.bar_write(0, entry + 12, &0u32.to_le_bytes());
        let route = MsiMessage {
            address: 0xfee0_1000,
            data: 0x41,
        };
        assert_eq!(
            sink.reroutes.lock().unwrap().last(),
            Some(&(1, Some(route)))
        );
        let mut b = [0u8; 4];
        real.0.read_bar(0, entry, &mut b);
        assert_eq!(
            u32::from_le_bytes(b),
            0,
            "the device's table is not written"
        );
        device.bar_read(0, entry + 8, &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x41);
        // Masked: held in kumo's PBA, sent on unmask.
        device.bar_write(0, entry + 12, &1u32.to_le_bytes());
        device.fire(1);
        assert!(sink.sent.lock().unwrap().is_empty());
        device.bar_read(0, transport::MSIX_PBA_OFFSET, &mut b);
        assert_eq!(b[0], 0b10);
        device.bar_write(0, entry + 12, &0u32.to_le_bytes());
        assert_eq!(*sink.sent.lock().unwrap(), vec![1]);
    }

    #[test]
    fn other_accesses_reach_the_device() {
        let (real, device, _) = mediated();
        // Common configuration: select feature word 1, read VERSION_1's bit back.
        device.bar_write(0, 0, &1u32.to_le_bytes());
        let mut b = [0u8; 4];
        device.bar_read(0, 4, &mut b);
        assert_eq!(u32::from_le_bytes(b) & 1, 1);
        // A vendor capability (past MSI-X) reads what the device has.
        let next = usize::from(layout_of(&real).config[device.layout.cap + 1]);
        assert_eq!(read32(&device, next), read32_real(&real, next));
        assert_eq!(device.doorbells()[0].offset, transport::NOTIFY_OFFSET);
        // A device that is gone reads all ones.
        real.1.store(true, std::sync::atomic::Ordering::SeqCst);
        device.bar_read(0, 4, &mut b);
        assert_eq!(b, [0xff; 4]);
    }

    #[test]
    fn untrustworthy_layouts_are_refused() {
        let real = real();
        let sink: Arc<dyn InterruptSourceGroup> = Arc::new(Recorder::default());
        let try_with = |edit: &dyn Fn(&mut DeviceLayout)| {
            let mut layout = layout_of(&real);
            edit(&mut layout);
            PassthroughDevice::new(real.clone(), &layout, sink.clone()).err()
        };
        assert!(try_with(&|_| {}).is_none());
        assert!(matches!(
            try_with(&|l| l.bar_sizes[0] = 0x7000),
            Some(PassthroughError::BarSize { .. })
        ));
        assert!(matches!(
            try_with(&|l| l.bar_sizes[0] = 0x4000),
            Some(PassthroughError::MsixPlacement { .. })
        ));
        assert!(matches!(
            try_with(&|l| l.msix_irqs = 64),
            Some(PassthroughError::MsixCount { .. })
        ));
        assert!(matches!(
            try_with(&|l| l.doorbells.push((0, transport::BAR_SIZE - 2))),
            Some(PassthroughError::Doorbell { .. })
        ));
        assert!(matches!(
            try_with(&|l| l.doorbells.push((3, 0))),
            Some(PassthroughError::Doorbell { .. })
        ));
        // A capability list that points at itself, or outside the area.
        let cap = find_msix(&layout_of(&real).config).unwrap();
        assert!(matches!(
            try_with(&|l| {
                l.config[config::CAPABILITIES_POINTER] = 0x50;
                l.config[0x50] = 0x09;
                l.config[0x51] = 0x50;
            }),
            Some(PassthroughError::Capabilities(_))
        ));
        assert!(matches!(
            try_with(&|l| {
                l.config[cap] = 0x09;
                l.config[cap + 1] = 0xfc;
            }),
            Some(PassthroughError::Capabilities(_))
        ));
        assert!(matches!(
            try_with(&|l| l.config[config::CAPABILITIES_POINTER] = 0x10),
            Some(PassthroughError::Capabilities(_))
        ));
        assert!(matches!(
            try_with(&|l| l.config[config::BAR0] |= 1),
            Some(PassthroughError::IoBar { .. })
        ));
    }

    fn window(bar: u8, offset: u64, size: u64, id: u32) -> DirectWindow {
        DirectWindow {
            bar,
            offset,
            size,
            id,
        }
    }

    #[test]
    fn direct_windows_are_the_mappable_pages_without_the_msix_pages() {
        let sizes = [0x10000, 0x1000, 0x800, 0, 0, 0];
        const PAGE: u64 = WINDOW_PAGE;
        // Table at 0x8000 (64 bytes) and PBA at 0x8800 share one page of BAR 0.
        let trapped = [(0, 0x8000, 64), (0, 0x8800, 8)];
        assert_eq!(
            direct_windows(&[(0, 0, 0x10000)], &sizes, &trapped),
            vec![window(0, 0, 0x8000, 0), window(0, 0x9000, 0x7000, 1)]
        );
        // A PBA on its own page, straddling into the next: both pages trapped.
        let trapped = [(0, 0, 16), (0, 0x3ffc, 8)];
        assert_eq!(
            direct_windows(&[(0, 0, 0x10000)], &sizes, &trapped),
            vec![window(0, PAGE, 0x2000, 0), window(0, 0x5000, 0xb000, 1)]
        );
        // Parts are cut to whole pages and to their BAR; a BAR under a page has none;
        // another BAR's MSI-X pages do not matter.
        assert_eq!(
            direct_windows(
                &[(0, 0x800, 0x2000), (1, 0, 0x4000), (2, 0, 0x800)],
                &sizes,
                &[(2, 0, 16)]
            ),
            vec![window(0, PAGE, PAGE, 0), window(1, 0, PAGE, 1)]
        );
        // Nothing mappable, or a part wholly trapped: no windows.
        assert!(direct_windows(&[], &sizes, &trapped).is_empty());
        assert!(direct_windows(&[(0, 0, PAGE)], &sizes, &[(0, 0, 16)]).is_empty());
        // Absurd parts (past the BAR, overflowing) give nothing, never a panic.
        assert!(direct_windows(&[(0, u64::MAX - 5, 100), (9, 0, PAGE)], &sizes, &[]).is_empty());
    }

    #[test]
    fn a_mappable_bar_is_offered_to_the_bus_as_windows_and_still_traps_msix() {
        let real = real();
        let mut layout = layout_of(&real);
        layout.mappable = vec![(0, 0, transport::BAR_SIZE)];
        let sink = Arc::new(Recorder::default());
        let device = PassthroughDevice::new(real.clone(), &layout, sink).unwrap();
        let windows = device.direct_windows();
        assert!(!windows.is_empty());
        assert_eq!(windows, device.windows());
        let (table_bar, table) = device.table_range(&device.state());
        for w in &windows {
            assert!(w.size >= WINDOW_PAGE && w.offset % WINDOW_PAGE == 0);
            assert!(w.offset + w.size <= transport::BAR_SIZE);
            let overlaps =
                w.bar == table_bar && w.offset < table.end && table.start < w.offset + w.size;
            assert!(!overlaps, "{w:?} covers the MSI-X table {table:?}");
        }
    }
}
