//! The PCI bus as a guest reaches it: ECAM and the 0xCF8/0xCFC ports, BAR routing,
//! and arbitrary guest writes that must neither panic nor disturb other devices.

use std::sync::{Arc, Mutex};

use devices::PioDevice;
use devices::interrupt::{InterruptSourceGroup, MsiMessage};
use devices::irq_test::{self, Doorbell, IrqTestDevice};
use devices::pci::PciDevice;
use devices::pci::{BarAllocator, ConfigPorts, PciBus, PciError};
use proptest::prelude::*;

const ECAM: u64 = 0xe000_0000;

#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<u16>>,
    rung: Mutex<Vec<u16>>,
}

impl InterruptSourceGroup for Recorder {
    fn trigger(&self, vector: u16) {
        self.sent.lock().unwrap().push(vector);
    }
    fn update(&self, _vector: u16, _route: Option<MsiMessage>) {}
}

impl Doorbell for Recorder {
    fn ring(&self, vector: u16) {
        self.rung.lock().unwrap().push(vector);
    }
}

/// A bus with two test devices at BARs placed by the allocator.
fn bus() -> (Arc<PciBus>, [Arc<IrqTestDevice>; 2], Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let mut bus = PciBus::new(ECAM);
    let mut window = BarAllocator::new(0xc000_0000, 0xe000_0000);
    let make = |window: &mut BarAllocator| {
        let d = Arc::new(IrqTestDevice::new(16, recorder.clone(), recorder.clone()));
        d.place_bar0(window.allocate(irq_test::BAR0_SIZE).unwrap());
        d
    };
    let devices = [make(&mut window), make(&mut window)];
    for d in &devices {
        bus.add(d.clone()).unwrap();
    }
    (Arc::new(bus), devices, recorder)
}

fn ecam(slot: u64, reg: u64) -> u64 {
    ECAM + (slot << 15) + reg
}

fn read32(bus: &PciBus, addr: u64) -> u32 {
    let mut data = [0; 4];
    assert!(bus.mmio_read(addr, &mut data));
    u32::from_le_bytes(data)
}

fn write32(bus: &PciBus, addr: u64, value: u32) -> bool {
    bus.mmio_write(addr, &value.to_le_bytes())
}

#[test]
fn ecam_shows_the_host_bridge_and_the_devices_and_all_ones_elsewhere() {
    let (bus, _, _) = bus();
    assert_eq!(read32(&bus, ecam(0, 0)), 0x29c0_8086);
    assert_eq!(read32(&bus, ecam(0, 8)) >> 8, 0x06_00_00);
    assert_eq!(read32(&bus, ecam(1, 0)), 0x0001_4b55);
    assert_eq!(read32(&bus, ecam(2, 0)), 0x0001_4b55);
    assert_eq!(read32(&bus, ecam(3, 0)), 0xffff_ffff);
    // Function 1 and bus 1 do not exist.
    assert_eq!(read32(&bus, ecam(1, 0) + (1 << 12)), 0xffff_ffff);
    assert_eq!(read32(&bus, ECAM + (1 << 20) - 4), 0xffff_ffff);
    // Outside the one-bus window: not ECAM's.
    assert!(!bus.mmio_read(ECAM + (1 << 20), &mut [0; 4]));
}

#[test]
fn the_config_ports_reach_the_same_registers() {
    let (bus, _, _) = bus();
    let ports = ConfigPorts::new(bus.clone());
    let select = |slot: u32, reg: u32| {
        let _ = ports.write(0, &(0x8000_0000 | (slot << 11) | reg).to_le_bytes());
    };
    let mut data = [0; 4];
    select(1, 0);
    ports.read(4, &mut data);
    assert_eq!(u32::from_le_bytes(data), read32(&bus, ecam(1, 0)));
    // A 2-byte read at 0xCFE is the device ID.
    let mut word = [0; 2];
    ports.read(6, &mut word);
    assert_eq!(u16::from_le_bytes(word), 0x0001);
    // The address register reads back (reserved low bits dropped).
    let _ = ports.write(0, &0x8000_0813u32.to_le_bytes());
    ports.read(0, &mut data);
    assert_eq!(u32::from_le_bytes(data), 0x8000_0810);
    // Enable bit clear: nothing answers.
    let _ = ports.write(0, &0x0000_0800u32.to_le_bytes());
    ports.read(4, &mut data);
    assert_eq!(data, [0xff; 4]);
    // Writes through the ports land: command register of slot 1.
    select(1, 4);
    let _ = ports.write(4, &2u32.to_le_bytes());
    assert_eq!(read32(&bus, ecam(1, 4)) & 0xffff, 2);
}

#[test]
fn bar_accesses_reach_a_device_only_while_memory_decoding_is_on() {
    let (bus, [first, _], recorder) = bus();
    let bar = first.bar0().unwrap();
    assert!(!write32(&bus, bar, 1), "memory decoding is off after reset");
    assert!(write32(&bus, ecam(1, 4), 2));
    assert!(write32(&bus, bar + 8 * 2, 1));
    assert_eq!(*recorder.rung.lock().unwrap(), [2]);
    // An access straddling the BAR's end is not decoded.
    assert!(!bus.mmio_read(bar + irq_test::BAR0_SIZE - 2, &mut [0; 4]));
    // Moving the BAR moves the decoding.
    assert!(write32(&bus, ecam(1, 0x10), 0xd000_0000));
    assert!(!write32(&bus, bar, 1));
    assert!(write32(&bus, 0xd000_0000 + 8 * 3, 1));
    assert_eq!(*recorder.rung.lock().unwrap(), [2, 3]);
    // Sizing reads back the size mask and decodes nothing at all-ones.
    assert!(write32(&bus, ecam(1, 0x10), 0xffff_ffff));
    assert_eq!(read32(&bus, ecam(1, 0x10)), 0xffff_e000);
}

#[test]
fn allocator_places_bars_naturally_aligned_until_the_window_is_full() {
    let mut window = BarAllocator::new(0xc000_1000, 0xc001_0000);
    assert_eq!(window.allocate(0x2000), Ok(0xc000_2000));
    assert_eq!(window.allocate(0x1000), Ok(0xc000_4000));
    assert_eq!(
        window.allocate(0x1_0000),
        Err(PciError::WindowFull { size: 0x1_0000 })
    );
    assert_eq!(
        window.allocate(0x1800),
        Err(PciError::WindowFull { size: 0x1800 })
    );
}

#[test]
fn the_bus_has_thirty_one_free_slots() {
    let mut bus = PciBus::new(ECAM);
    let recorder = Arc::new(Recorder::default());
    for _ in 1..32 {
        bus.add(Arc::new(IrqTestDevice::new(
            1,
            recorder.clone(),
            recorder.clone(),
        )))
        .unwrap();
    }
    let extra = Arc::new(IrqTestDevice::new(1, recorder.clone(), recorder));
    assert_eq!(bus.add(extra).err(), Some(PciError::Full));
}

/// Everything a guest can see of a device: configuration space (through ECAM) and
/// its BAR's MSI-X table and PBA (from the device itself: another device may have been
/// moved over its BAR).
fn snapshot(bus: &PciBus, slot: u64, device: &IrqTestDevice) -> (Vec<u8>, Vec<u8>) {
    let mut config = vec![0; 256];
    assert!(bus.mmio_read(ecam(slot, 0), &mut config[..]));
    let mut table = vec![0; (irq_test::BAR0_SIZE - irq_test::MSIX_TABLE) as usize];
    for (i, chunk) in table.chunks_mut(4).enumerate() {
        device.bar_read(0, irq_test::MSIX_TABLE + 4 * i as u64, chunk);
    }
    (config, table)
}

#[derive(Debug, Clone)]
enum GuestWrite {
    Config { slot: u64, reg: u64, data: Vec<u8> },
    Bar { offset: u64, data: Vec<u8> },
    Port { port: u16, data: Vec<u8> },
}

fn guest_write() -> impl Strategy<Value = GuestWrite> {
    let data = prop::collection::vec(any::<u8>(), 1..=8);
    prop_oneof![
        (0..4u64, 0..4096u64, data.clone()).prop_map(|(slot, reg, data)| GuestWrite::Config {
            slot,
            reg,
            data
        }),
        (0..irq_test::BAR0_SIZE + 16, data.clone())
            .prop_map(|(offset, data)| GuestWrite::Bar { offset, data }),
        (0..8u16, data).prop_map(|(port, data)| GuestWrite::Port { port, data }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary writes aimed at device 1 (slot 1, its BAR, the ports selecting slot 1)
    /// never panic and never change device 2 (slot 2).
    #[test]
    fn guest_writes_never_panic_or_touch_another_device(
        writes in prop::collection::vec(guest_write(), 1..200)
    ) {
        let (bus, [first, second], _) = bus();
        let ports = ConfigPorts::new(bus.clone());
        // Both decode, and the second is programmed, so there is state to disturb.
        write32(&bus, ecam(1, 4), 2);
        write32(&bus, ecam(2, 4), 2);
        let bar2 = second.bar0().unwrap();
        write32(&bus, bar2 + irq_test::MSIX_TABLE, 0xfee0_1000);
        write32(&bus, bar2 + irq_test::MSIX_TABLE + 8, 0x41);
        let before = snapshot(&bus, 2, &second);
        let bar1 = first.bar0().unwrap();
        for write in writes {
            match write {
                // Slot 2 itself is off limits; slots 0, 1 and 3 (absent) are fair game.
                GuestWrite::Config { slot, reg, data } => {
                    let slot = if slot == 2 { 1 } else { slot };
                    bus.mmio_write(ecam(slot, reg), &data);
                }
                GuestWrite::Bar { offset, data } => {
                    // Aimed at where BAR 0 of device 1 was placed, which it may have moved.
                    bus.mmio_write(bar1 + offset, &data);
                }
                GuestWrite::Port { port, data } => {
                    if port == 0 && data.len() == 4 {
                        // Keep the address register on slot 1.
                        let reg = u32::from(data[0]) & 0xfc;
                        let _ = ports.write(0, &(0x8000_0800 | reg).to_le_bytes());
                    } else if port >= 4 {
                        let _ = ports.write(port, &data);
                    }
                    let mut out = vec![0; data.len()];
                    ports.read(port, &mut out);
                }
            }
            let mut scratch = [0u8; 8];
            bus.mmio_read(bar1, &mut scratch);
        }
        prop_assert_eq!(snapshot(&bus, 2, &second), before);
    }
}

/// Records what the bus asks of the doorbell wiring.
#[derive(Default)]
struct Wiring {
    calls: Mutex<Vec<(&'static str, u8, u32, u64)>>,
}

impl devices::pci::DoorbellWiring for Wiring {
    fn attach(&self, slot: u8, id: u32, address: u64) {
        self.calls
            .lock()
            .unwrap()
            .push(("attach", slot, id, address));
    }
    fn detach(&self, slot: u8, id: u32, address: u64) {
        self.calls
            .lock()
            .unwrap()
            .push(("detach", slot, id, address));
    }
}

#[test]
fn doorbells_are_wired_exactly_while_and_where_their_bar_decodes() {
    let recorder = Arc::new(Recorder::default());
    let wiring = Arc::new(Wiring::default());
    let mut bus = PciBus::new(ECAM);
    bus.set_doorbell_wiring(wiring.clone());
    let device = Arc::new(IrqTestDevice::new(2, recorder.clone(), recorder));
    device.place_bar0(0xc000_0000);
    assert_eq!(bus.free_slot(), Some(1));
    bus.add(device).unwrap();
    let take = || std::mem::take(&mut *wiring.calls.lock().unwrap());
    assert_eq!(take(), [], "nothing decodes before memory space is enabled");

    let stride = irq_test::DOORBELL_STRIDE;
    write32(&bus, ecam(1, 4), 0x2);
    assert_eq!(
        take(),
        [
            ("attach", 1, 0, 0xc000_0000),
            ("attach", 1, 1, 0xc000_0000 + stride)
        ]
    );
    write32(&bus, ecam(1, 4), 0x2); // the same state again: nothing to do
    assert_eq!(take(), []);
    write32(&bus, ecam(1, 0x10), 0xc010_0000); // moved while decoding
    assert_eq!(
        take(),
        [
            ("detach", 1, 0, 0xc000_0000),
            ("detach", 1, 1, 0xc000_0000 + stride),
            ("attach", 1, 0, 0xc010_0000),
            ("attach", 1, 1, 0xc010_0000 + stride)
        ]
    );
    write32(&bus, ecam(1, 4), 0);
    assert_eq!(
        take(),
        [
            ("detach", 1, 0, 0xc010_0000),
            ("detach", 1, 1, 0xc010_0000 + stride)
        ]
    );
}

impl devices::pci::WindowWiring for Wiring {
    fn attach(&self, slot: u8, id: u32, address: u64) {
        devices::pci::DoorbellWiring::attach(self, slot, id, address);
    }
    fn detach(&self, slot: u8, id: u32, address: u64) {
        devices::pci::DoorbellWiring::detach(self, slot, id, address);
    }
}

/// A function with one 64 KiB memory BAR and two direct windows in it, one of them
/// reaching past the BAR's end (which must never be mapped).
struct Windowed(Mutex<devices::pci::ConfigSpace>);

impl PciDevice for Windowed {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        self.0.lock().unwrap().read(offset, data);
    }
    fn config_write(&self, offset: usize, data: &[u8]) {
        self.0.lock().unwrap().write(offset, data);
    }
    fn memory_regions(&self) -> Vec<devices::pci::BarRegion> {
        self.0.lock().unwrap().memory_regions().collect()
    }
    fn bar_read(&self, _bar: u8, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn bar_write(&self, _bar: u8, _offset: u64, _data: &[u8]) {}
    fn direct_windows(&self) -> Vec<devices::pci::DirectWindow> {
        let window = |id, offset, size| devices::pci::DirectWindow {
            bar: 0,
            offset,
            size,
            id,
        };
        vec![window(0, 0x1000, 0x4000), window(1, 0xf000, 0x2000)]
    }
}

#[test]
fn direct_windows_are_mapped_exactly_while_and_where_their_bar_decodes() {
    let wiring = Arc::new(Wiring::default());
    let mut bus = PciBus::new(ECAM);
    bus.set_window_wiring(wiring.clone());
    let mut config = devices::pci::ConfigSpace::new(0x1af4, 0x1000, 0x020000, 0);
    let bar = devices::pci::Bar {
        kind: devices::pci::BarKind::Memory32,
        size: 0x10000,
    };
    config.add_bar(0, bar).unwrap();
    config.set_bar_address(0, 0xc000_0000);
    bus.add(Arc::new(Windowed(Mutex::new(config)))).unwrap();
    let take = || std::mem::take(&mut *wiring.calls.lock().unwrap());
    assert_eq!(take(), [], "nothing decodes before memory space is enabled");
    write32(&bus, ecam(1, 4), 0x2);
    assert_eq!(take(), [("attach", 1, 0, 0xc000_1000)]);
    write32(&bus, ecam(1, 0x10), 0xc010_0000); // moved while decoding
    assert_eq!(
        take(),
        [("detach", 1, 0, 0xc000_1000), ("attach", 1, 0, 0xc010_1000)]
    );
    write32(&bus, ecam(1, 4), 0);
    assert_eq!(take(), [("detach", 1, 0, 0xc010_1000)]);
}
