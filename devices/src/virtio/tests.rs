//! Tests of the transport and virtio-net as a guest driver sees them: rings built in a
//! `GuestMemoryMmap`, registers reached through BAR and configuration accesses.

use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::net::{HEADER_LEN, NetConfig, NetStats, RxOutcome, VirtioNet, feature};
use super::transport::*;
use super::{
    Activation, InterruptCause, VirtioDevice, VirtioInterrupt, VirtioPciDevice, features, status,
};
use crate::interrupt::{InterruptSourceGroup, MsiMessage, RouteTable};
use crate::net::switch::{Sources, Switch, SwitchConfig};
use crate::pci::config;
use crate::pci::msix;

pub(super) type Mem = GuestMemoryMmap<()>;

pub(super) const MEM_SIZE: usize = 0x40000;
pub(super) const NEXT: u16 = 1;
pub(super) const WRITE: u16 = 2;
pub(super) const INDIRECT: u16 = 4;
pub(super) const QSIZE: u16 = 16;

pub(super) fn memory() -> Mem {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
}

#[derive(Default)]
pub(super) struct Recorder {
    pub(super) sent: Mutex<Vec<(u16, MsiMessage)>>,
    routes: Mutex<Vec<(u16, Option<MsiMessage>)>>,
    table: RouteTable,
    actions: Mutex<Vec<TransportAction>>,
    pub(super) causes: Mutex<Vec<InterruptCause>>,
}

impl InterruptSourceGroup for Recorder {
    fn trigger(&self, vector: u16) {
        let message = self.table.get(vector).expect("a routed vector");
        self.sent.lock().unwrap().push((vector, message));
    }
    fn update(&self, vector: u16, route: Option<MsiMessage>) {
        self.table.set(vector, route);
        self.routes.lock().unwrap().push((vector, route));
    }
}

impl ActionSink for Recorder {
    fn act(&self, action: TransportAction) {
        self.actions.lock().unwrap().push(action);
    }
}

impl VirtioInterrupt for Recorder {
    fn trigger(&self, cause: InterruptCause) {
        self.causes.lock().unwrap().push(cause);
    }
}

/// A split virtqueue the test writes as a driver would.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ring {
    desc: u64,
    avail: u64,
    used: u64,
    size: u16,
    next_avail: u16,
}

impl Ring {
    /// Rings for up to 64 entries at `base` (desc, avail and used 1 KiB apart).
    pub(super) fn at(base: u64, size: u16) -> Ring {
        Ring {
            desc: base,
            avail: base + 0x400,
            used: base + 0x800,
            size,
            next_avail: 0,
        }
    }

    pub(super) fn desc(&self, mem: &Mem, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        write_desc(
            mem,
            self.desc + 16 * u64::from(index),
            addr,
            len,
            flags,
            next,
        );
    }

    pub(super) fn offer(&mut self, mem: &Mem, head: u16) {
        let slot = self.avail + 4 + 2 * u64::from(self.next_avail % self.size);
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.next_avail = self.next_avail.wrapping_add(1);
        mem.write_obj(self.next_avail, GuestAddress(self.avail + 2))
            .unwrap();
    }

    pub(super) fn used_idx(&self, mem: &Mem) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2)).unwrap()
    }

    /// (descriptor id, length) of used entry `i`.
    pub(super) fn used(&self, mem: &Mem, i: u16) -> (u32, u32) {
        let at = self.used + 4 + 8 * u64::from(i % self.size);
        (
            mem.read_obj(GuestAddress(at)).unwrap(),
            mem.read_obj(GuestAddress(at + 4)).unwrap(),
        )
    }

    /// The `virtio_queue::Queue` a transport would build for this ring.
    pub(super) fn queue(&self, event_idx: bool) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        q.try_set_desc_table_address(GuestAddress(self.desc))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(self.avail))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(self.used))
            .unwrap();
        q.set_event_idx(event_idx);
        q.set_ready(true);
        q
    }
}

impl TransportAction {
    /// Asserts that an access needed nothing from the VMM.
    fn none(self) {
        assert_eq!(self, TransportAction::None);
    }
}

pub(super) fn write_desc(mem: &Mem, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&flags.to_le_bytes());
    raw[14..].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&raw, GuestAddress(at)).unwrap();
}

fn mac(last: u8) -> [u8; 6] {
    [0x52, 0x54, 0, 0x12, 0x34, last]
}

/// An Ethernet frame from `src` to `dst` with `len` bytes of patterned payload.
fn frame(dst: [u8; 6], src: [u8; 6], len: usize, seed: u8) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.extend((0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)));
    f
}

fn net(pairs: u16, mem: &Mem) -> Arc<VirtioNet<Mem>> {
    Arc::new(
        VirtioNet::new(
            NetConfig {
                mac: mac(1),
                queue_pairs: pairs,
                queue_size: QSIZE,
            },
            mem.clone(),
        )
        .unwrap(),
    )
}

/// A NIC activated directly (no transport) on rings at 0x10000 (RX), 0x11000 (TX),
/// and for more pairs 0x12000.. (ctrl last).
fn active_net(pairs: u16, mem: &Mem) -> (Arc<VirtioNet<Mem>>, Vec<Ring>, Arc<Recorder>) {
    let n = net(pairs, mem);
    let count = n.queue_max_sizes().len();
    let rings: Vec<Ring> = (0..count)
        .map(|q| Ring::at(0x10000 + 0x1000 * q as u64, QSIZE))
        .collect();
    let rec = Arc::new(Recorder::default());
    let mut negotiated = n.features();
    negotiated &= !features::RING_EVENT_IDX;
    n.activate(Activation {
        features: negotiated,
        queues: rings.iter().map(|r| r.queue(false)).collect(),
        interrupt: rec.clone(),
    })
    .unwrap();
    (n, rings, rec)
}

// ---------------------------------------------------------------- the transport

struct Driver {
    dev: VirtioPciDevice,
    net: Arc<VirtioNet<Mem>>,
    rec: Arc<Recorder>,
    mem: Mem,
}

impl Driver {
    fn new(pairs: u16) -> Driver {
        let mem = memory();
        let net = net(pairs, &mem);
        let rec = Arc::new(Recorder::default());
        let dev = VirtioPciDevice::new(net.clone(), rec.clone(), rec.clone()).unwrap();
        dev.place_bar(0xc000_0000);
        Driver { dev, net, rec, mem }
    }

    fn write(&self, offset: usize, value: u64, width: usize) -> TransportAction {
        self.dev.write_bar(
            0,
            COMMON_OFFSET + offset as u64,
            &value.to_le_bytes()[..width],
        )
    }

    fn read(&self, offset: usize, width: usize) -> u64 {
        let mut data = [0u8; 8];
        self.dev
            .read_bar(0, COMMON_OFFSET + offset as u64, &mut data[..width]);
        u64::from_le_bytes(data)
    }

    fn cfg32(&self, at: usize) -> u32 {
        let mut data = [0; 4];
        self.dev.read_config(at, &mut data);
        u32::from_le_bytes(data)
    }

    /// (cap offset, cfg_type) of every vendor capability, and the MSI-X cap offset.
    fn capabilities(&self) -> (Vec<(usize, u8)>, Option<usize>) {
        let mut vendor = Vec::new();
        let mut msix_at = None;
        let mut at = (self.cfg32(config::CAPABILITIES_POINTER) & 0xff) as usize;
        while at != 0 {
            let head = self.cfg32(at);
            match head as u8 {
                0x09 => vendor.push((at, (head >> 24) as u8)),
                msix::CAPABILITY_ID => msix_at = Some(at),
                _ => {}
            }
            at = ((head >> 8) & 0xff) as usize;
        }
        (vendor, msix_at)
    }

    fn device_features(&self) -> u64 {
        let _ = self.write(0x00, 0, 4);
        let low = self.read(0x04, 4);
        let _ = self.write(0x00, 1, 4);
        low | (self.read(0x04, 4) << 32)
    }

    fn set_driver_features(&self, value: u64) {
        let _ = self.write(0x08, 0, 4);
        let _ = self.write(0x0c, value & 0xffff_ffff, 4);
        let _ = self.write(0x08, 1, 4);
        let _ = self.write(0x0c, value >> 32, 4);
    }

    fn status(&self) -> u8 {
        self.read(0x14, 1) as u8
    }

    fn set_status(&self, value: u8) -> TransportAction {
        self.write(0x14, u64::from(value), 1)
    }

    /// Enables MSI-X and programs vector `v` to APIC 0, IDT vector 0x40 + v.
    fn enable_msix(&self) {
        let (_, msix_at) = self.capabilities();
        let at = msix_at.unwrap();
        self.dev
            .write_config(config::COMMAND, &6u16.to_le_bytes())
            .none();
        self.dev
            .write_config(at + 2, &msix::CONTROL_ENABLE.to_le_bytes())
            .none();
        for v in 0..u64::from(self.net.queue_max_sizes().len() as u16 + 1) {
            let e = MSIX_TABLE_OFFSET + 16 * v;
            self.dev
                .write_bar(0, e, &0xfee0_0000u32.to_le_bytes())
                .none();
            self.dev.write_bar(0, e + 4, &0u32.to_le_bytes()).none();
            self.dev
                .write_bar(0, e + 8, &(0x40 + v as u32).to_le_bytes())
                .none();
            self.dev.write_bar(0, e + 12, &0u32.to_le_bytes()).none();
        }
    }

    /// Sets queue `q` up on `ring` with MSI-X vector `q + 1`, 64-bit addresses
    /// written as 32-bit halves as Linux does.
    fn setup_queue(&self, q: u16, ring: &Ring) {
        let _ = self.write(0x16, u64::from(q), 2);
        let _ = self.write(0x18, u64::from(ring.size), 2);
        let _ = self.write(0x1a, u64::from(q) + 1, 2);
        for (at, addr) in [(0x20, ring.desc), (0x28, ring.avail), (0x30, ring.used)] {
            let _ = self.write(at, addr & 0xffff_ffff, 4);
            let _ = self.write(at + 4, addr >> 32, 4);
        }
        let _ = self.write(0x1c, 1, 2);
    }

    /// The whole initialisation: returns the action DRIVER_OK produced.
    fn bring_up(&self, wanted: u64) -> (TransportAction, Vec<Ring>) {
        self.enable_msix();
        let _ = self.set_status(status::ACKNOWLEDGE | status::DRIVER);
        self.set_driver_features(wanted);
        let _ = self.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        assert_ne!(self.status() & status::FEATURES_OK, 0, "features refused");
        let _ = self.write(0x10, 0, 2);
        let queues = self.read(0x12, 2) as u16;
        let rings: Vec<Ring> = (0..queues)
            .map(|q| Ring::at(0x10000 + 0x1000 * u64::from(q), QSIZE))
            .collect();
        for (q, ring) in rings.iter().enumerate() {
            self.setup_queue(q as u16, ring);
        }
        let action = self.set_status(
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        );
        (action, rings)
    }
}

#[test]
fn the_function_identifies_as_modern_virtio_net_with_its_capabilities() {
    let d = Driver::new(1);
    assert_eq!(d.cfg32(0), 0x1041_1af4);
    assert_eq!(d.cfg32(0x08) >> 8, 0x02_00_00, "network controller");
    assert_eq!(d.cfg32(0x08) & 0xff, 1, "revision 1: non-transitional");
    assert_eq!(d.cfg32(0x2c) >> 16, 0x40);
    assert_eq!(d.cfg32(BAR0_REGISTER), 0xc000_0000);
    let (vendor, msix_at) = d.capabilities();
    let types: Vec<u8> = vendor.iter().map(|&(_, t)| t).collect();
    assert_eq!(types, [1, 2, 3, 4, 5]);
    for &(at, cfg_type) in &vendor {
        let (bar, offset, length) = (d.cfg32(at + 4) & 0xff, d.cfg32(at + 8), d.cfg32(at + 12));
        match cfg_type {
            1 => assert_eq!((bar, offset, length), (0, 0, 0x38)),
            2 => {
                assert_eq!((bar, offset, length), (0, 0x3000, 8));
                assert_eq!(d.cfg32(at + 16), NOTIFY_OFF_MULTIPLIER);
            }
            3 => assert_eq!((bar, offset, length), (0, 0x1000, 1)),
            4 => assert_eq!((bar, offset, length), (0, 0x2000, 10)),
            _ => {}
        }
    }
    let msix_at = msix_at.unwrap();
    assert_eq!(
        (d.cfg32(msix_at) >> 16) & 0x7ff,
        2,
        "3 vectors: 2 queues + config"
    );
    // The MAC in the device configuration.
    let mut m = [0u8; 6];
    d.dev.read_bar(0, DEVICE_CONFIG_OFFSET, &mut m);
    assert_eq!(m, mac(1));
    assert_eq!(d.read(0x12, 2), 2, "num_queues");
}

#[test]
fn features_ok_is_refused_for_unknown_features_and_without_version_1() {
    let d = Driver::new(1);
    let offered = d.device_features();
    assert_ne!(offered & features::VERSION_1, 0);
    assert_ne!(offered & feature::MAC, 0);
    assert_eq!(offered & feature::MQ, 0, "one pair: no MQ");
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::DEVICE_NEEDS_RESET);
    assert_eq!(
        d.status(),
        status::ACKNOWLEDGE | status::DRIVER,
        "NEEDS_RESET is the device's"
    );
    // An unknown feature (bit 41) is refused.
    d.set_driver_features(features::VERSION_1 | (1 << 41));
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_eq!(d.status() & status::FEATURES_OK, 0);
    // So is a driver that does not speak VERSION_1.
    d.set_driver_features(feature::MAC);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_eq!(d.status() & status::FEATURES_OK, 0);
    // DRIVER_OK without FEATURES_OK does nothing.
    let action = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::DRIVER_OK);
    assert_eq!(action, TransportAction::None);
    assert_eq!(d.status() & status::DRIVER_OK, 0);
    assert!(!d.net.is_active());
    // A subset with VERSION_1 is accepted, and then locked.
    d.set_driver_features(features::VERSION_1 | feature::MAC);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_ne!(d.status() & status::FEATURES_OK, 0);
    d.set_driver_features(features::VERSION_1);
    assert_eq!(d.dev.driver_features(), features::VERSION_1 | feature::MAC);
}

#[test]
fn mq_without_the_control_queue_is_refused() {
    let d = Driver::new(2);
    let offered = d.device_features();
    assert_ne!(offered & feature::MQ, 0);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER);
    d.set_driver_features(features::VERSION_1 | feature::MQ);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_eq!(d.status() & status::FEATURES_OK, 0);
}

#[test]
fn queues_are_set_up_through_the_common_configuration() {
    let d = Driver::new(1);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER);
    d.set_driver_features(features::VERSION_1);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    let _ = d.write(0x16, 1, 2);
    assert_eq!(d.read(0x18, 2), u64::from(QSIZE), "max size offered");
    assert_eq!(d.read(0x1e, 2), 1, "queue_notify_off");
    // Not a power of two: keeps the old size. Vector beyond the table: NO_VECTOR.
    let _ = d.write(0x18, 12, 2);
    assert_eq!(d.read(0x18, 2), u64::from(QSIZE));
    let _ = d.write(0x18, 8, 2);
    assert_eq!(d.read(0x18, 2), 8);
    let _ = d.write(0x1a, 9, 2);
    assert_eq!(d.read(0x1a, 2), u64::from(NO_VECTOR));
    let _ = d.write(0x1a, 2, 2);
    assert_eq!(d.read(0x1a, 2), 2);
    // A 64-bit write and two halves both land.
    let _ = d.write(0x20, 0x1_2345_6000, 8);
    let _ = d.write(0x28, 0x7000, 4);
    let _ = d.write(0x2c, 0x1, 4);
    assert_eq!(d.read(0x20, 8), 0x1_2345_6000);
    assert_eq!(d.read(0x28, 8), 0x1_0000_7000);
    let _ = d.write(0x1c, 1, 2);
    assert_eq!(d.read(0x1c, 2), 1);
    // Enabled: its registers are frozen.
    let _ = d.write(0x18, 4, 2);
    let _ = d.write(0x20, 0x9000, 8);
    assert_eq!((d.read(0x18, 2), d.read(0x20, 8)), (8, 0x1_2345_6000));
    // A queue that does not exist reads as size 0 and ignores writes.
    let _ = d.write(0x16, 7, 2);
    assert_eq!(d.read(0x18, 2), 0);
    let _ = d.write(0x1c, 1, 2);
    assert_eq!(d.read(0x1c, 2), 0);
}

#[test]
fn driver_ok_activates_and_status_zero_resets() {
    let d = Driver::new(1);
    let (action, _) = d.bring_up(features::VERSION_1 | feature::MAC);
    assert_eq!(action, TransportAction::Activated);
    assert!(d.net.is_active());
    assert_eq!(
        d.net.negotiated_features(),
        features::VERSION_1 | feature::MAC
    );
    // Doorbells for the VMM, and the BAR-write fallback.
    let doorbells = d.dev.notify_doorbells();
    assert_eq!(
        doorbells,
        [
            NotifyDoorbell {
                bar: 0,
                offset: NOTIFY_OFFSET,
                queue: 0
            },
            NotifyDoorbell {
                bar: 0,
                offset: NOTIFY_OFFSET + 4,
                queue: 1
            }
        ]
    );
    assert_eq!(
        d.dev.write_bar(0, NOTIFY_OFFSET + 4, &1u16.to_le_bytes()),
        TransportAction::QueueNotify(1)
    );
    assert_eq!(
        d.dev.write_bar(0, NOTIFY_OFFSET + 8, &1u16.to_le_bytes()),
        TransportAction::None,
        "no queue 2"
    );
    // Through the PciDevice trait the action reaches the VMM's sink.
    // The bus serves the same doorbells (ids are queue indices).
    let served: Vec<(u8, u64, u32)> = crate::pci::PciDevice::doorbells(&d.dev)
        .iter()
        .map(|b| (b.bar, b.offset, b.id))
        .collect();
    assert_eq!(served, [(0, NOTIFY_OFFSET, 0), (0, NOTIFY_OFFSET + 4, 1)]);
    crate::pci::PciDevice::bar_write(&d.dev, 0, NOTIFY_OFFSET, &0u16.to_le_bytes());
    assert_eq!(
        d.rec.actions.lock().unwrap().last(),
        Some(&TransportAction::QueueNotify(0))
    );
    // Reset.
    assert_eq!(d.set_status(0), TransportAction::Reset);
    assert!(!d.net.is_active());
    assert_eq!(d.status(), 0);
    assert_eq!(d.dev.driver_features(), 0);
    let _ = d.write(0x16, 1, 2);
    assert_eq!(d.read(0x18, 2), u64::from(QSIZE));
    assert_eq!((d.read(0x1c, 2), d.read(0x20, 8)), (0, 0));
    assert_eq!(d.read(0x1a, 2), u64::from(NO_VECTOR));
    assert_eq!(
        d.dev.write_bar(0, NOTIFY_OFFSET, &0u16.to_le_bytes()),
        TransportAction::None,
        "notifications are ignored while reset"
    );
    // It comes back up.
    let (action, _) = d.bring_up(features::VERSION_1);
    assert_eq!(action, TransportAction::Activated);
}

#[test]
fn activation_with_rings_outside_memory_sets_needs_reset() {
    let d = Driver::new(1);
    d.enable_msix();
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER);
    d.set_driver_features(features::VERSION_1);
    let _ = d.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    let _ = d.write(0x10, 0, 2);
    d.setup_queue(0, &Ring::at(0x10000, QSIZE));
    d.setup_queue(1, &Ring::at(MEM_SIZE as u64 - 0x400, QSIZE));
    let action = d.set_status(0x0f);
    assert_eq!(action, TransportAction::None);
    assert_ne!(d.status() & status::DEVICE_NEEDS_RESET, 0);
    assert!(!d.net.is_active());
    // The driver hears of it through the config vector (0).
    assert_eq!(d.rec.sent.lock().unwrap().last().map(|s| s.0), Some(0));
}

#[test]
fn queue_interrupts_follow_msix_vectors_and_masking() {
    let d = Driver::new(1);
    let (_, mut rings) = d.bring_up(features::VERSION_1);
    // One TX frame: the TX queue's vector (2) fires.
    let f = frame(mac(2), mac(1), 50, 0);
    d.mem
        .write_slice(&[0; HEADER_LEN], GuestAddress(0x20000))
        .unwrap();
    d.mem.write_slice(&f, GuestAddress(0x2000c)).unwrap();
    rings[1].desc(&d.mem, 0, 0x20000, (HEADER_LEN + f.len()) as u32, 0, 0);
    rings[1].offer(&d.mem, 0);
    let mut got = Vec::new();
    let report = d.net.transmit(0, |frame| {
        got.push(frame.to_vec());
        true
    });
    assert_eq!((report.frames, got), (1, vec![f.clone()]));
    let message = |v: u32| MsiMessage {
        address: 0xfee0_0000,
        data: 0x40 + v,
    };
    assert_eq!(d.rec.sent.lock().unwrap().last(), Some(&(2, message(2))));
    // Mask vector 2: the next interrupt is held in the PBA, sent on unmask.
    let sent = d.rec.sent.lock().unwrap().len();
    d.dev
        .write_bar(0, MSIX_TABLE_OFFSET + 2 * 16 + 12, &1u32.to_le_bytes())
        .none();
    rings[1].offer(&d.mem, 0);
    assert_eq!(d.net.transmit(0, |_| true).frames, 1);
    assert_eq!(d.rec.sent.lock().unwrap().len(), sent);
    let mut pba = [0u8; 8];
    d.dev.read_bar(0, MSIX_PBA_OFFSET, &mut pba);
    assert_eq!(u64::from_le_bytes(pba), 1 << 2);
    d.dev
        .write_bar(0, MSIX_TABLE_OFFSET + 2 * 16 + 12, &0u32.to_le_bytes())
        .none();
    assert_eq!(d.rec.sent.lock().unwrap().len(), sent + 1);
    assert_eq!(d.rec.sent.lock().unwrap().last(), Some(&(2, message(2))));
    // With MSI-X disabled, only the ISR records it; reading clears it.
    let (_, msix_at) = d.capabilities();
    d.dev
        .write_config(msix_at.unwrap() + 2, &0u16.to_le_bytes())
        .none();
    rings[1].offer(&d.mem, 0);
    assert_eq!(d.net.transmit(0, |_| true).frames, 1);
    assert_eq!(d.rec.sent.lock().unwrap().len(), sent + 1);
    let mut isr = [0u8];
    d.dev.read_bar(0, ISR_OFFSET, &mut isr);
    assert_eq!(isr, [1]);
    d.dev.read_bar(0, ISR_OFFSET, &mut isr);
    assert_eq!(isr, [0]);
}

#[test]
fn the_pci_cfg_window_reaches_the_bar() {
    let d = Driver::new(1);
    let (vendor, _) = d.capabilities();
    let at = vendor.iter().find(|&&(_, t)| t == 5).unwrap().0;
    // Read num_queues (common config 0x12, 2 bytes) through the window.
    d.dev.write_config(at + 4, &[0]).none();
    d.dev.write_config(at + 8, &0x12u32.to_le_bytes()).none();
    d.dev.write_config(at + 12, &2u32.to_le_bytes()).none();
    assert_eq!(d.cfg32(at + 16) & 0xffff, 2);
    // Write device_status through it.
    d.dev.write_config(at + 8, &0x14u32.to_le_bytes()).none();
    d.dev.write_config(at + 12, &1u32.to_le_bytes()).none();
    let action = d.dev.write_config(at + 16, &[status::ACKNOWLEDGE, 0, 0, 0]);
    assert_eq!(action, TransportAction::None);
    assert_eq!(d.status(), status::ACKNOWLEDGE);
}

// ---------------------------------------------------------------- virtio-net data path

#[test]
fn tx_gathers_chained_and_indirect_descriptors_and_strips_the_header() {
    let mem = memory();
    let (n, mut rings, rec) = active_net(1, &mem);
    let tx = &mut rings[1];
    let f = frame(mac(9), mac(1), 300, 3);
    // Chain: header alone, then the frame split 100 / rest.
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x20000))
        .unwrap();
    mem.write_slice(&f[..100], GuestAddress(0x21000)).unwrap();
    mem.write_slice(&f[100..], GuestAddress(0x22000)).unwrap();
    tx.desc(&mem, 0, 0x20000, HEADER_LEN as u32, NEXT, 5);
    tx.desc(&mem, 5, 0x21000, 100, NEXT, 2);
    tx.desc(&mem, 2, 0x22000, (f.len() - 100) as u32, 0, 0);
    tx.offer(&mem, 0);
    // Indirect: a 3-entry table at 0x23000, header and frame split unevenly.
    let g = frame(mac(9), mac(1), 40, 5);
    let mut bytes = vec![0u8; HEADER_LEN];
    bytes.extend_from_slice(&g);
    mem.write_slice(&bytes[..7], GuestAddress(0x24000)).unwrap();
    mem.write_slice(&bytes[7..20], GuestAddress(0x24100))
        .unwrap();
    mem.write_slice(&bytes[20..], GuestAddress(0x24200))
        .unwrap();
    write_desc(&mem, 0x23000, 0x24000, 7, NEXT, 1);
    write_desc(&mem, 0x23010, 0x24100, 13, NEXT, 2);
    write_desc(&mem, 0x23020, 0x24200, (bytes.len() - 20) as u32, 0, 0);
    tx.desc(&mem, 7, 0x23000, 48, INDIRECT, 0);
    tx.offer(&mem, 7);
    let mut got = Vec::new();
    let report = n.transmit(0, |frame| {
        got.push(frame.to_vec());
        true
    });
    assert_eq!(report.frames, 2);
    assert_eq!(got, [f, g]);
    assert_eq!(tx.used_idx(&mem), 2);
    assert_eq!((tx.used(&mem, 0).0, tx.used(&mem, 1).0), (0, 7));
    assert_eq!(*rec.causes.lock().unwrap(), [InterruptCause::Queue(1)]);
    assert_eq!(n.stats().tx_frames, 2);
}

#[test]
fn tx_back_pressure_leaves_the_chain_in_the_ring() {
    let mem = memory();
    let (n, mut rings, _) = active_net(1, &mem);
    let tx = &mut rings[1];
    for i in 0..3u16 {
        let f = frame(mac(9), mac(1), 20, i as u8);
        let at = 0x20000 + 0x1000 * u64::from(i);
        mem.write_slice(&[0; HEADER_LEN], GuestAddress(at)).unwrap();
        mem.write_slice(&f, GuestAddress(at + HEADER_LEN as u64))
            .unwrap();
        tx.desc(&mem, i, at, (HEADER_LEN + f.len()) as u32, 0, 0);
        tx.offer(&mem, i);
    }
    let mut taken = Vec::new();
    let report = n.transmit(0, |f| {
        if taken.len() == 1 {
            return false;
        }
        taken.push(f[14]);
        true
    });
    assert!(report.stopped);
    assert_eq!((report.frames, tx.used_idx(&mem)), (1, 1));
    let report = n.transmit(0, |f| {
        taken.push(f[14]);
        true
    });
    assert!(!report.stopped);
    assert_eq!(taken, [0, 1, 2], "nothing lost or reordered");
    assert_eq!(tx.used_idx(&mem), 3);
}

#[test]
fn rx_writes_header_and_frame_into_chained_and_indirect_buffers() {
    let mem = memory();
    let (n, mut rings, rec) = active_net(1, &mem);
    let rx = &mut rings[0];
    // Chained: 10 + 2000 bytes.
    rx.desc(&mem, 0, 0x20000, 10, WRITE | NEXT, 1);
    rx.desc(&mem, 1, 0x21000, 2000, WRITE, 0);
    rx.offer(&mem, 0);
    // Indirect: two 1024-byte buffers.
    write_desc(&mem, 0x23000, 0x24000, 1024, WRITE | NEXT, 1);
    write_desc(&mem, 0x23010, 0x25000, 1024, WRITE, 0);
    rx.desc(&mem, 3, 0x23000, 32, INDIRECT, 0);
    rx.offer(&mem, 3);
    let f = frame(mac(1), mac(2), 1000, 1);
    let g = frame(mac(1), mac(2), 1500, 2);
    assert_eq!(n.receive(&f), RxOutcome::Delivered);
    assert_eq!(n.receive(&g), RxOutcome::Delivered);
    assert_eq!(rx.used_idx(&mem), 2);
    assert_eq!(rx.used(&mem, 0), (0, (HEADER_LEN + f.len()) as u32));
    assert_eq!(rx.used(&mem, 1), (3, (HEADER_LEN + g.len()) as u32));
    let mut first = vec![0u8; 10];
    mem.read_slice(&mut first, GuestAddress(0x20000)).unwrap();
    assert_eq!(first, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut rest = vec![0u8; f.len() + 2];
    mem.read_slice(&mut rest, GuestAddress(0x21000)).unwrap();
    assert_eq!(rest[..2], [1, 0], "num_buffers = 1");
    assert_eq!(rest[2..], f[..]);
    let mut second = vec![0u8; 1024];
    mem.read_slice(&mut second, GuestAddress(0x24000)).unwrap();
    assert_eq!(second[..HEADER_LEN], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(second[HEADER_LEN..], g[..1024 - HEADER_LEN]);
    let mut tail = vec![0u8; g.len() - (1024 - HEADER_LEN)];
    mem.read_slice(&mut tail, GuestAddress(0x25000)).unwrap();
    assert_eq!(tail, g[1024 - HEADER_LEN..]);
    assert_eq!(rec.causes.lock().unwrap().len(), 2);
    assert_eq!(n.stats().rx_frames, 2);
}

#[test]
fn rx_without_buffers_holds_and_a_too_small_buffer_stays() {
    let mem = memory();
    let (n, mut rings, _) = active_net(1, &mem);
    let f = frame(mac(1), mac(2), 600, 1);
    assert_eq!(n.receive(&f), RxOutcome::NoBuffer);
    let rx = &mut rings[0];
    rx.desc(&mem, 0, 0x20000, 100, WRITE, 0);
    rx.offer(&mem, 0);
    assert_eq!(n.receive(&f), RxOutcome::TooBig);
    assert_eq!(rx.used_idx(&mem), 0, "the small buffer stays");
    let small = frame(mac(1), mac(2), 10, 1);
    assert_eq!(n.receive(&small), RxOutcome::Delivered);
    assert_eq!(rx.used(&mem, 0), (0, (HEADER_LEN + small.len()) as u32));
    let stats = n.stats();
    assert_eq!((stats.rx_no_buffer, stats.rx_too_big), (1, 1));
}

#[test]
fn malformed_chains_are_counted_returned_and_skipped() {
    let mem = memory();
    let (n, rings, _) = active_net(1, &mem);
    let (rx, tx) = (rings[0], rings[1]);
    let mut rx = rx;
    let mut tx = tx;
    // TX: a device-writable buffer; a loop; outside memory; then a good one.
    tx.desc(&mem, 0, 0x20000, 64, WRITE, 0);
    tx.desc(&mem, 1, 0x20000, 64, NEXT, 2);
    tx.desc(&mem, 2, 0x20000, 64, NEXT, 1);
    tx.desc(&mem, 3, MEM_SIZE as u64 - 8, 64, 0, 0);
    let f = frame(mac(9), mac(1), 20, 0);
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x21000))
        .unwrap();
    mem.write_slice(&f, GuestAddress(0x2100c)).unwrap();
    tx.desc(&mem, 4, 0x21000, (HEADER_LEN + f.len()) as u32, 0, 0);
    for head in [0, 1, 3, 4] {
        tx.offer(&mem, head);
    }
    let mut got = Vec::new();
    let report = n.transmit(0, |frame| {
        got.push(frame.to_vec());
        true
    });
    assert_eq!((report.frames, report.malformed), (1, 3));
    assert_eq!(got, [f]);
    assert_eq!(tx.used_idx(&mem), 4);
    assert!((0..4).all(|i| tx.used(&mem, i).1 == 0));
    // RX: a device-readable buffer, then a good one.
    rx.desc(&mem, 0, 0x22000, 2000, 0, 0);
    rx.desc(&mem, 1, 0x23000, 2000, WRITE, 0);
    rx.offer(&mem, 0);
    rx.offer(&mem, 1);
    let mut before = vec![0u8; 2000];
    mem.read_slice(&mut before, GuestAddress(0x22000)).unwrap();
    assert_eq!(
        n.receive(&frame(mac(1), mac(2), 30, 0)),
        RxOutcome::Delivered
    );
    let mut after = vec![0u8; 2000];
    mem.read_slice(&mut after, GuestAddress(0x22000)).unwrap();
    assert_eq!(before, after, "a read-only buffer is not written");
    assert_eq!(rx.used(&mem, 0), (0, 0));
    assert_eq!(rx.used(&mem, 1).0, 1);
    let stats = n.stats();
    assert_eq!((stats.tx_malformed, stats.rx_malformed), (3, 1));
}

#[test]
fn multiqueue_pairs_are_set_through_the_control_queue_and_steer_receive() {
    let mem = memory();
    let (n, mut rings, _) = active_net(2, &mem);
    assert_eq!(n.queue_pairs_in_use(), 1);
    let ctrl = &mut rings[4];
    // VQ_PAIRS_SET 2: class 4, command 0, le16 2; then a 1-byte ack.
    mem.write_slice(&[4, 0, 2, 0], GuestAddress(0x30000))
        .unwrap();
    mem.write_slice(&[0xee], GuestAddress(0x30100)).unwrap();
    ctrl.desc(&mem, 0, 0x30000, 2, NEXT, 1);
    ctrl.desc(&mem, 1, 0x30002, 2, NEXT, 2);
    ctrl.desc(&mem, 2, 0x30100, 1, WRITE, 0);
    ctrl.offer(&mem, 0);
    // VQ_PAIRS_SET 3 (more than the device has): refused.
    mem.write_slice(&[4, 0, 3, 0], GuestAddress(0x30200))
        .unwrap();
    ctrl.desc(&mem, 3, 0x30200, 4, NEXT, 4);
    ctrl.desc(&mem, 4, 0x30300, 1, WRITE, 0);
    ctrl.offer(&mem, 3);
    assert_eq!(n.process_ctrl(), 2);
    let ack = |at: u64| mem.read_obj::<u8>(GuestAddress(at)).unwrap();
    assert_eq!((ack(0x30100), ack(0x30300)), (0, 1));
    assert_eq!(n.queue_pairs_in_use(), 2);
    // Pair 1 transmits from MAC 0x21: frames for that MAC go to pair 1's RX (queue 2).
    let rank1 = mac(0x21);
    let f = frame(mac(9), rank1, 20, 0);
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x31000))
        .unwrap();
    mem.write_slice(&f, GuestAddress(0x3100c)).unwrap();
    rings[3].desc(&mem, 0, 0x31000, (HEADER_LEN + f.len()) as u32, 0, 0);
    rings[3].offer(&mem, 0);
    assert_eq!(n.transmit(1, |_| true).frames, 1);
    for (q, at) in [(0usize, 0x32000u64), (2, 0x33000)] {
        rings[q].desc(&mem, 0, at, 2048, WRITE, 0);
        rings[q].offer(&mem, 0);
    }
    assert_eq!(
        n.receive(&frame(rank1, mac(9), 20, 0)),
        RxOutcome::Delivered
    );
    assert_eq!((rings[0].used_idx(&mem), rings[2].used_idx(&mem)), (0, 1));
    assert_eq!(
        n.receive(&frame(mac(1), mac(9), 20, 0)),
        RxOutcome::Delivered
    );
    assert_eq!(rings[0].used_idx(&mem), 1, "unknown destinations: pair 0");
}

#[test]
fn held_frames_on_a_full_rx_ring_are_released_when_buffers_appear() {
    // Two NICs on one switch: A sends 5 frames to B, whose RX ring has 2 buffers.
    let (mem_a, mem_b) = (memory(), memory());
    let (a, mut rings_a, _) = active_net(1, &mem_a);
    let (b, mut rings_b, _) = active_net(1, &mem_b);
    let mut switch = Switch::new(SwitchConfig {
        queue_frames: 2,
        ..SwitchConfig::default()
    });
    let (pa, pb) = (
        switch.add_port(Sources::Foreign),
        switch.add_port(Sources::Foreign),
    );
    let b_mac = mac(0xb);
    // B announces itself so the switch learns its MAC.
    let hello = frame([0xff; 6], b_mac, 10, 0);
    mem_b
        .write_slice(&[0; HEADER_LEN], GuestAddress(0x20000))
        .unwrap();
    mem_b.write_slice(&hello, GuestAddress(0x2000c)).unwrap();
    rings_b[1].desc(&mem_b, 0, 0x20000, (HEADER_LEN + hello.len()) as u32, 0, 0);
    rings_b[1].offer(&mem_b, 0);
    b.transmit(0, |f| switch.ingress(pb, f).taken());
    assert_eq!(switch.egress(pa, |_| true).delivered, 1);
    for i in 0..5u16 {
        let f = frame(b_mac, mac(0xa), 100, i as u8);
        let at = 0x20000 + 0x1000 * u64::from(i);
        mem_a
            .write_slice(&[0; HEADER_LEN], GuestAddress(at))
            .unwrap();
        mem_a.write_slice(&f, GuestAddress(at + 12)).unwrap();
        rings_a[1].desc(&mem_a, i, at, (HEADER_LEN + f.len()) as u32, 0, 0);
        rings_a[1].offer(&mem_a, i);
    }
    for i in 0..2u16 {
        rings_b[0].desc(&mem_b, i, 0x30000 + 0x1000 * u64::from(i), 2048, WRITE, 0);
        rings_b[0].offer(&mem_b, i);
    }
    let mut received: Vec<u8> = Vec::new();
    let drain = |switch: &mut Switch, received: &mut Vec<u8>| {
        b.receive_batch(|rx| {
            switch.egress(pb, |f| {
                let outcome = rx.push(f);
                if outcome == RxOutcome::Delivered {
                    received.push(f[14]);
                }
                outcome.consumed()
            })
        })
    };
    // A's TX: two frames queued, the third held, A blocked; its 4th and 5th stay
    // in A's ring.
    let report = a.transmit(0, |f| switch.ingress(pa, f).taken());
    assert!(report.stopped);
    assert_eq!(report.frames, 3);
    assert!(switch.is_blocked(pa));
    assert_eq!(rings_a[1].used_idx(&mem_a), 3);
    // B has 2 buffers: 2 delivered, which releases A's held frame.
    let egress = drain(&mut switch, &mut received);
    assert_eq!((egress.delivered, egress.unblocked.clone()), (2, vec![pa]));
    assert_eq!(switch.pending(pb), 1);
    // A resumes: 2 more queued, then it blocks again (queue bound 2... one is there).
    let report = a.transmit(0, |f| switch.ingress(pa, f).taken());
    assert_eq!(report.frames, 2);
    // B's ring is empty: nothing moves, nothing is lost.
    assert_eq!(drain(&mut switch, &mut received).delivered, 0);
    // B posts buffers (it would notify its RX queue): everything arrives, in order.
    for i in 2..QSIZE {
        rings_b[0].desc(&mem_b, i, 0x30000 + 0x1000 * u64::from(i), 2048, WRITE, 0);
        rings_b[0].offer(&mem_b, i);
    }
    while switch.pending(pb) > 0 {
        let egress = drain(&mut switch, &mut received);
        assert!(egress.delivered > 0);
    }
    assert!(!switch.is_blocked(pa));
    assert_eq!(received, [0, 1, 2, 3, 4]);
    assert_eq!(rings_a[1].used_idx(&mem_a), 5);
    let lost = switch.stats();
    assert_eq!((lost.runts, lost.giants, lost.discarded), (0, 0, 0));
    assert_eq!(b.stats().rx_frames, 5);
}

// ---------------------------------------------------------------- property test

/// Guest memory for the property test. Below 0x8000: descriptor tables at 0x1000
/// (TX) and 0x1800 (RX), avail rings at 0x3000 / 0x3800, indirect tables at 0x4000 and
/// 0x4800, used rings at 0x6000 (TX) and 0x7000 (RX). From 0x8000: buffers.
///
/// The generator keeps the oracle exact: every descriptor-shaped record the device
/// can parse is either one the test wrote (writable ones point into the buffer area
/// or outside memory), or lies in the buffer area, whose bytes (and every frame and
/// header the device writes) are 0 or 1, so they never read as writable or indirect.
/// Indirect tables may point at the descriptor tables, at zeros, at the indirect
/// tables, into the buffers at any alignment, or outside memory; not at the rings,
/// which change as the device runs.
pub(super) const P_MEM: usize = 0x10000;
pub(super) const P_BUFFERS: u64 = 0x8000;

#[derive(Debug, Clone)]
pub(super) struct PDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

#[derive(Debug, Clone)]
pub(super) struct PQueue {
    pub(super) size: u16,
    desc: u64,
    avail: u64,
    pub(super) used: u64,
    table: Vec<PDesc>,
    avail_idx: u16,
    heads: Vec<u16>,
}

fn p_desc(size: u16) -> impl Strategy<Value = PDesc> {
    // Weighted so most chains are plausible (and get processed) while every kind of
    // mistake still turns up.
    let buffer_addr = prop_oneof![
        12 => P_BUFFERS..P_MEM as u64 - 0x800,
        1 => P_BUFFERS..P_MEM as u64,
        1 => Just(P_MEM as u64 - 4),
        1 => Just(P_MEM as u64),
        1 => Just(u64::MAX - 8),
        1 => any::<u64>().prop_map(|a| a | P_BUFFERS),
    ];
    let indirect_addr = prop_oneof![
        1 => Just(0x1000u64),
        1 => Just(0x1800u64),
        1 => Just(0x2000u64),
        4 => Just(0x4000u64),
        4 => Just(0x4800u64),
        1 => P_BUFFERS..P_MEM as u64,
        1 => Just(P_MEM as u64 - 16),
        1 => Just(u64::MAX - 16),
    ];
    let len = prop_oneof![
        12 => 0u32..0x800,
        1 => Just(0x2000u32),
        1 => Just(u32::MAX),
        1 => 0u32..80,
    ];
    let flags = prop_oneof![
        4 => Just(0u16),
        4 => Just(NEXT),
        4 => Just(WRITE),
        4 => Just(WRITE | NEXT),
        2 => Just(INDIRECT),
        1 => 0u16..8,
    ];
    let next = prop_oneof![8 => 0..size, 1 => 0..size + 4, 1 => any::<u16>()];
    (buffer_addr, indirect_addr, len, flags, next, 0u32..9).prop_map(
        |(b, i, len, flags, next, entries)| PDesc {
            addr: if flags & INDIRECT != 0 { i } else { b },
            // Indirect tables: usually a whole number of descriptors.
            len: if flags & INDIRECT != 0 && len % 5 != 0 {
                entries * 16
            } else {
                len
            },
            flags,
            next,
        },
    )
}

pub(super) fn p_queue(shift: u64, used: u64) -> impl Strategy<Value = PQueue> {
    prop_oneof![Just(1u16), Just(2), Just(4), Just(8), Just(16)].prop_flat_map(move |size| {
        let desc = prop_oneof![
            16 => Just(0x1000 + shift),
            1 => Just(P_MEM as u64 - 8),
            1 => Just(P_MEM as u64 + 0x1000),
        ];
        let avail = prop_oneof![
            16 => Just(0x3000 + shift),
            1 => Just(0x3001 + shift),
            1 => Just(P_MEM as u64 + 0x100),
        ];
        let used = prop_oneof![
            16 => Just(used),
            1 => Just(used + 2),
            1 => Just(P_MEM as u64 - 4),
        ];
        (
            Just(size),
            desc,
            avail,
            used,
            proptest::collection::vec(p_desc(size), usize::from(size)),
            prop_oneof![8 => 0..=size, 1 => any::<u16>()],
            proptest::collection::vec(
                prop_oneof![8 => 0..size, 1 => any::<u16>()],
                usize::from(size),
            ),
        )
            .prop_map(
                |(size, desc, avail, used, table, avail_idx, heads)| PQueue {
                    size,
                    desc,
                    avail,
                    used,
                    table,
                    avail_idx,
                    heads,
                },
            )
    })
}

impl PQueue {
    /// Writes the driver's side into memory (tables that fit).
    pub(super) fn install(&self, mem: &Mem) {
        if self.desc < P_BUFFERS {
            for (i, d) in self.table.iter().enumerate() {
                write_desc(
                    mem,
                    self.desc + 16 * i as u64,
                    d.addr,
                    d.len,
                    d.flags,
                    d.next,
                );
            }
        }
        if self.avail < P_BUFFERS {
            mem.write_obj(self.avail_idx, GuestAddress(self.avail + 2))
                .unwrap();
            for (i, h) in self.heads.iter().enumerate() {
                mem.write_obj(*h, GuestAddress(self.avail + 4 + 2 * i as u64))
                    .unwrap();
            }
        }
    }

    /// The queue as a transport would build it (not ready if misaligned).
    pub(super) fn queue(&self) -> Queue {
        let mut q = Queue::new(self.size).unwrap();
        let ok = q
            .try_set_desc_table_address(GuestAddress(self.desc))
            .is_ok()
            && q.try_set_avail_ring_address(GuestAddress(self.avail))
                .is_ok()
            && q.try_set_used_ring_address(GuestAddress(self.used)).is_ok();
        q.set_ready(ok);
        q
    }

    /// Descriptors of this queue that are in memory.
    pub(super) fn installed(&self) -> &[PDesc] {
        if self.desc < P_BUFFERS {
            &self.table
        } else {
            &[]
        }
    }
}

/// Bytes a correct device may write: the used rings (with avail_event), and every
/// buffer a descriptor in the tables marks device-writable.
pub(super) fn writable_bytes<'a>(
    used: &[(u64, u16)],
    descs: impl Iterator<Item = &'a PDesc>,
) -> Vec<bool> {
    let mut allowed = vec![false; P_MEM];
    let mut mark = |start: u64, len: u64| {
        let end = start.saturating_add(len).min(P_MEM as u64);
        for b in start.min(P_MEM as u64)..end {
            allowed[b as usize] = true;
        }
    };
    for &(at, size) in used {
        mark(at, 6 + 8 * u64::from(size));
    }
    for d in descs {
        if d.flags & WRITE != 0 && d.flags & INDIRECT == 0 {
            mark(d.addr, u64::from(d.len));
        }
    }
    allowed
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_rings_never_panic_or_write_outside_offered_buffers(
        tx in p_queue(0, 0x6000),
        rx in p_queue(0x800, 0x7000),
        indirect in proptest::collection::vec(p_desc(8), 16),
        buffer_bits in proptest::collection::vec(0u8..2, 0x100),
        frames in proptest::collection::vec((prop_oneof![4 => 0usize..200, 1 => 0usize..1600], 0u8..2), 1..8),
        event_idx in any::<bool>(),
        stop_after in 0usize..4,
    ) {
        let mem: Mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), P_MEM)]).unwrap();
        for at in (P_BUFFERS..P_MEM as u64).step_by(buffer_bits.len()) {
            mem.write_slice(&buffer_bits, GuestAddress(at)).unwrap();
        }
        for (i, d) in indirect.iter().enumerate() {
            let at = 0x4000 + 0x800 * (i as u64 / 8) + 16 * (i as u64 % 8);
            write_desc(&mem, at, d.addr, d.len, d.flags, d.next);
        }
        tx.install(&mem);
        rx.install(&mem);
        let allowed = writable_bytes(
            &[(tx.used, tx.size), (rx.used, rx.size)],
            tx.installed().iter().chain(rx.installed()).chain(&indirect),
        );
        let mut before = vec![0u8; P_MEM];
        mem.read_slice(&mut before, GuestAddress(0)).unwrap();

        let n = net(1, &mem);
        let rec = Arc::new(Recorder::default());
        let offered = VirtioDevice::features(&*n);
        let negotiated = if event_idx { offered } else { offered & !features::RING_EVENT_IDX };
        let activated = n.activate(Activation {
            features: negotiated,
            queues: vec![rx.queue(), tx.queue()],
            interrupt: rec.clone(),
        });
        // A second guest with 16 good 2 KiB RX buffers takes the first frames
        // straight from these TX buffers.
        let mem_b: Mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), P_MEM)]).unwrap();
        let b = net(1, &mem_b);
        let mut rx_b = Ring {
            desc: 0x1000,
            avail: 0x3000,
            used: 0x6000,
            size: QSIZE,
            next_avail: 0,
        };
        for i in 0..QSIZE {
            rx_b.desc(&mem_b, i, P_BUFFERS + 0x800 * u64::from(i), 0x800, WRITE, 0);
            rx_b.offer(&mem_b, i);
        }
        let tx_b = Ring::at(0x2000, QSIZE);
        b.activate(Activation {
            features: features::VERSION_1,
            queues: vec![rx_b.queue(false), tx_b.queue(false)],
            interrupt: rec.clone(),
        })
        .unwrap();
        let mut before_b = vec![0u8; P_MEM];
        mem_b.read_slice(&mut before_b, GuestAddress(0)).unwrap();
        let mut direct = 0;
        let _ = n.transmit_frames(0, |f| {
            direct += 1;
            direct <= stop_after && b.receive_batch(|rx| rx.push_frame(f)).consumed()
        });
        let mut after_b = vec![0u8; P_MEM];
        mem_b.read_slice(&mut after_b, GuestAddress(0)).unwrap();
        for (at, (x, y)) in before_b.iter().zip(&after_b).enumerate() {
            let ok = at as u64 >= P_BUFFERS || (0x6000..0x6000 + 6 + 8 * u64::from(QSIZE)).contains(&(at as u64));
            prop_assert!(x == y || ok, "guest B's byte {:#x} changed outside its RX buffers", at);
        }
        let delivered = rx_b.used_idx(&mem_b);
        prop_assert_eq!(u64::from(delivered), b.stats().rx_frames + b.stats().rx_malformed);
        for i in 0..delivered {
            prop_assert!(rx_b.used(&mem_b, i).1 <= 0x800);
        }

        let mut sent = 0;
        let mut oversize = false;
        let _ = n.transmit(0, |f| {
            oversize |= f.len() > super::net::MAX_FRAME_LEN;
            sent += 1;
            sent <= stop_after
        });
        let _ = n.transmit(0, |_| true);
        for (len, bit) in &frames {
            let _ = n.receive(&vec![*bit; *len]);
        }
        prop_assert!(!oversize);
        let mut after = vec![0u8; P_MEM];
        mem.read_slice(&mut after, GuestAddress(0)).unwrap();
        for (at, (b, a)) in before.iter().zip(&after).enumerate() {
            prop_assert!(b == a || allowed[at], "byte {:#x} changed ({} -> {}) outside offered buffers", at, b, a);
        }
        if activated.is_err() {
            prop_assert!(before == after, "an inactive device writes nothing");
        }
        let stats: NetStats = n.stats();
        prop_assert!(stats.rx_frames as usize <= frames.len());
    }
}

#[test]
fn interrupt_causes_map_to_the_chosen_vectors() {
    // The handle a device gets maps a cause to the vector the driver chose.
    let d = Driver::new(1);
    let _ = d.bring_up(features::VERSION_1);
    let irq = d.dev.interrupt();
    irq.trigger(InterruptCause::Queue(0));
    irq.trigger(InterruptCause::Config);
    let sent: Vec<u16> = d.rec.sent.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(sent, [1, 0]);
    // A queue left at NO_VECTOR raises nothing.
    let _ = d.set_status(0);
    let _ = d.write(0x16, 1, 2);
    let _ = d.write(0x1a, u64::from(NO_VECTOR), 2);
    irq.trigger(InterruptCause::Queue(1));
    assert_eq!(d.rec.sent.lock().unwrap().len(), 2);
}

#[test]
fn after_reset_the_old_rings_are_left_alone() {
    let mem = memory();
    let (n, mut rings, _) = active_net(1, &mem);
    rings[0].desc(&mem, 0, 0x20000, 2048, WRITE, 0);
    rings[0].offer(&mem, 0);
    let f = frame(mac(9), mac(1), 20, 0);
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x21000))
        .unwrap();
    mem.write_slice(&f, GuestAddress(0x2100c)).unwrap();
    rings[1].desc(&mem, 0, 0x21000, (HEADER_LEN + f.len()) as u32, 0, 0);
    rings[1].offer(&mem, 0);
    n.reset();
    assert!(!n.is_active());
    assert_eq!(n.receive(&f), RxOutcome::Inactive);
    assert_eq!(n.transmit(0, |_| true).frames, 0);
    assert_eq!((rings[0].used_idx(&mem), rings[1].used_idx(&mem)), (0, 0));
    assert_eq!(n.stats().rx_inactive, 1);
}

/// One guest access to the transport.
#[derive(Debug, Clone)]
enum Access {
    Bar(u64, Vec<u8>),
    BarRead(u64, usize),
    Config(usize, Vec<u8>),
    ConfigRead(usize, usize),
    /// A plausible register write (so sequences get past negotiation).
    Common(usize, u64, usize),
    /// A doorbell write for queue `.0` (which may not exist).
    Notify(u64),
}

fn p_access() -> impl Strategy<Value = Access> {
    let data = proptest::collection::vec(any::<u8>(), 1..9);
    let common_field = proptest::sample::select(vec![
        (0x00usize, 4usize),
        (0x08, 4),
        (0x0c, 4),
        (0x10, 2),
        (0x14, 1),
        (0x16, 2),
        (0x18, 2),
        (0x1a, 2),
        (0x1c, 2),
        (0x20, 8),
        (0x28, 8),
        (0x30, 8),
    ]);
    let value = prop_oneof![
        Just(0u64),
        Just(1),
        Just(0x0b),
        Just(0x0f),
        Just(features::VERSION_1 >> 32),
        Just(0x10000),
        Just(0x10400),
        Just(0x10800),
        any::<u64>(),
    ];
    prop_oneof![
        1 => (0..BAR_SIZE + 16, data.clone()).prop_map(|(o, d)| Access::Bar(o, d)),
        1 => (0..BAR_SIZE + 16, 1usize..9).prop_map(|(o, l)| Access::BarRead(o, l)),
        1 => (0usize..0x110, data).prop_map(|(o, d)| Access::Config(o, d)),
        1 => (0usize..0x110, 1usize..9).prop_map(|(o, l)| Access::ConfigRead(o, l)),
        4 => (common_field, value).prop_map(|((o, w), v)| Access::Common(o, v, w)),
        2 => (0u64..8).prop_map(Access::Notify),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the guest does to the registers, the transport neither panics nor
    /// reports an action it should not: Activated only with DRIVER_OK newly set and
    /// the device live, QueueNotify only for a queue that exists while live.
    #[test]
    fn arbitrary_register_accesses_never_panic(
        accesses in proptest::collection::vec(p_access(), 1..64),
        live_first in any::<bool>(),
    ) {
        let d = Driver::new(2);
        if live_first {
            let (action, _) = d.bring_up(features::VERSION_1 | feature::CTRL_VQ | feature::MQ);
            prop_assert_eq!(action, TransportAction::Activated);
        }
        for access in accesses {
            let was_live = d.status() & status::DRIVER_OK != 0;
            let action = match access {
                Access::Bar(o, data) => d.dev.write_bar(0, o, &data),
                Access::BarRead(o, len) => {
                    let mut data = vec![0; len];
                    d.dev.read_bar(0, o, &mut data);
                    TransportAction::None
                }
                Access::Config(o, data) => d.dev.write_config(o, &data),
                Access::ConfigRead(o, len) => {
                    let mut data = vec![0; len];
                    d.dev.read_config(o, &mut data);
                    TransportAction::None
                }
                Access::Common(o, v, w) => d.write(o, v, w),
                Access::Notify(q) => d.dev.write_bar(0, NOTIFY_OFFSET + 4 * q, &[0, 0]),
            };
            match action {
                TransportAction::Activated => {
                    prop_assert!(!was_live && d.net.is_active());
                }
                TransportAction::QueueNotify(q) => {
                    prop_assert!(was_live && q < 5);
                }
                TransportAction::Reset => prop_assert!(!d.net.is_active()),
                TransportAction::None => {}
            }
            if d.net.is_active() {
                let _ = d.net.transmit(0, |_| true);
                let _ = d.net.receive(&frame(mac(1), mac(2), 10, 0));
                let _ = d.net.process_ctrl();
            }
        }
    }
}

#[test]
fn a_multiqueue_driver_comes_up_through_the_transport() {
    // What the VMM does with each action, as a Linux-like driver brings up 2 pairs.
    let d = Driver::new(2);
    let (action, mut rings) = d.bring_up(features::VERSION_1 | feature::CTRL_VQ | feature::MQ);
    assert_eq!(action, TransportAction::Activated);
    assert_eq!(rings.len(), 5);
    assert_eq!(d.dev.notify_doorbells().len(), 5);
    let mut cfg = [0u8; 2];
    d.dev.read_bar(0, DEVICE_CONFIG_OFFSET + 8, &mut cfg);
    assert_eq!(u16::from_le_bytes(cfg), 2, "max_virtqueue_pairs");
    // VQ_PAIRS_SET 2 on the control queue, then its doorbell.
    let mem = &d.mem;
    mem.write_slice(&[4, 0, 2, 0], GuestAddress(0x30000))
        .unwrap();
    rings[4].desc(mem, 0, 0x30000, 4, NEXT, 1);
    rings[4].desc(mem, 1, 0x30100, 1, WRITE, 0);
    rings[4].offer(mem, 0);
    let action = d
        .dev
        .write_bar(0, NOTIFY_OFFSET + 4 * 4, &4u16.to_le_bytes());
    let TransportAction::QueueNotify(q) = action else {
        panic!("expected a notification, got {action:?}");
    };
    assert_eq!(d.net.queue_role(q), Some(super::net::QueueRole::Ctrl));
    assert_eq!(d.net.process_ctrl(), 1);
    assert_eq!(d.net.queue_pairs_in_use(), 2);
    // The control queue's used buffer raised its vector (queue 4 -> vector 5).
    assert_eq!(d.rec.sent.lock().unwrap().last().map(|s| s.0), Some(5));
    assert_eq!(
        [0, 1, 2, 3].map(|q| d.net.queue_role(q)),
        [
            Some(super::net::QueueRole::Rx(0)),
            Some(super::net::QueueRole::Tx(0)),
            Some(super::net::QueueRole::Rx(1)),
            Some(super::net::QueueRole::Tx(1)),
        ]
    );
}

#[test]
fn a_bounded_pass_stops_a_guest_that_keeps_queueing() {
    let mem = memory();
    let (n, mut rings, _) = active_net(1, &mem);
    let f = frame(mac(9), mac(1), 20, 0);
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x21000))
        .unwrap();
    mem.write_slice(&f, GuestAddress(0x2100c)).unwrap();
    rings[1].desc(&mem, 0, 0x21000, (HEADER_LEN + f.len()) as u32, 0, 0);
    rings[1].offer(&mem, 0);
    // The "guest" re-queues the chain every time the device takes it.
    let mut tx = rings[1];
    let report = n.transmit_bounded(0, usize::from(QSIZE), |_| {
        tx.offer(&mem, 0);
        true
    });
    assert_eq!(report.frames, usize::from(QSIZE));
    assert!(report.more && !report.stopped);
    assert_eq!(tx.used_idx(&mem), QSIZE);
    let report = n.transmit(0, |_| true);
    assert_eq!((report.frames, report.more), (1, false));
}

#[test]
fn unicast_frames_go_straight_from_tx_buffers_into_rx_buffers_in_order() {
    use crate::net::switch::Route;
    let (mem_a, mem_b) = (memory(), memory());
    let (a, mut rings_a, _) = active_net(1, &mem_a);
    let (b, mut rings_b, _) = active_net(1, &mem_b);
    let mut switch = Switch::new(SwitchConfig::default());
    let (pa, pb) = (
        switch.add_port(Sources::Foreign),
        switch.add_port(Sources::Foreign),
    );
    let b_mac = mac(0xb);
    let hello = frame([0xff; 6], b_mac, 10, 0);
    mem_b
        .write_slice(&[0; HEADER_LEN], GuestAddress(0x20000))
        .unwrap();
    mem_b.write_slice(&hello, GuestAddress(0x2000c)).unwrap();
    rings_b[1].desc(&mem_b, 0, 0x20000, (HEADER_LEN + hello.len()) as u32, 0, 0);
    rings_b[1].offer(&mem_b, 0);
    b.transmit(0, |f| switch.ingress(pb, f).taken());
    let _ = switch.egress(pa, |_| true);
    // A queues 4 frames, each split over 3 descriptors; B has 1 RX buffer (2 pieces).
    let frames: Vec<Vec<u8>> = (0..4).map(|i| frame(b_mac, mac(0xa), 700, i)).collect();
    for (i, f) in frames.iter().enumerate() {
        let at = 0x20000 + 0x1000 * i as u64;
        let mut bytes = vec![0u8; HEADER_LEN];
        bytes.extend_from_slice(f);
        mem_a.write_slice(&bytes, GuestAddress(at)).unwrap();
        let d = 3 * i as u16;
        rings_a[1].desc(&mem_a, d, at, 5, NEXT, d + 1);
        rings_a[1].desc(&mem_a, d + 1, at + 5, 300, NEXT, d + 2);
        rings_a[1].desc(&mem_a, d + 2, at + 305, (bytes.len() - 305) as u32, 0, 0);
        rings_a[1].offer(&mem_a, d);
    }
    rings_b[0].desc(&mem_b, 0, 0x30000, 100, WRITE | NEXT, 1);
    rings_b[0].desc(&mem_b, 1, 0x31000, 2000, WRITE, 0);
    rings_b[0].offer(&mem_b, 0);
    // The VMM's TX closure: route by header; direct if possible, else the switch.
    let report = a.transmit_frames(0, |f| match switch.route(pa, f.header(), f.len()) {
        Route::Direct(port) => {
            assert_eq!(port, pb);
            match b.receive_batch(|rx| rx.push_frame(f)) {
                RxOutcome::Delivered => {
                    switch.delivered_direct(f.len());
                    true
                }
                _ => switch.ingress(pa, f.bytes()).taken(),
            }
        }
        Route::Switched => switch.ingress(pa, f.bytes()).taken(),
    });
    assert_eq!(report.frames, 4);
    // The first went straight across, byte for byte, into B's two pieces.
    assert_eq!(switch.stats().direct, 1);
    assert_eq!(rings_b[0].used(&mem_b, 0), (0, (HEADER_LEN + 714) as u32));
    let mut got = vec![0u8; 100];
    mem_b.read_slice(&mut got, GuestAddress(0x30000)).unwrap();
    let mut rest = vec![0u8; HEADER_LEN + 714 - 100];
    mem_b.read_slice(&mut rest, GuestAddress(0x31000)).unwrap();
    got.extend_from_slice(&rest);
    assert_eq!(got[..HEADER_LEN], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(got[HEADER_LEN..], frames[0][..]);
    // The second found no buffer and queued; the others queued behind it (order).
    assert_eq!(switch.pending(pb), 3);
    assert_eq!(
        switch.route(pa, &frames[1][..14], frames[1].len()),
        Route::Switched
    );
    for i in 1..4u16 {
        rings_b[0].desc(
            &mem_b,
            i + 1,
            0x40000 - 0x1000 * u64::from(i),
            2048,
            WRITE,
            0,
        );
        rings_b[0].offer(&mem_b, i + 1);
    }
    let mut tags = Vec::new();
    let _ = b.receive_batch(|rx| {
        switch.egress(pb, |f| {
            tags.push(f[14]);
            rx.push(f).consumed()
        })
    });
    assert_eq!(tags, [frames[1][14], frames[2][14], frames[3][14]]);
    // Drained: the next frame may go direct again.
    assert_eq!(
        switch.route(pa, &frames[1][..14], frames[1].len()),
        Route::Direct(pb)
    );
    assert_eq!(b.stats().rx_frames, 4);
}

#[test]
fn event_idx_suppresses_interrupts_and_asks_for_kicks() {
    let mem = memory();
    let n = net(1, &mem);
    let rings: Vec<Ring> = (0..2)
        .map(|q| Ring::at(0x10000 + 0x1000 * q, QSIZE))
        .collect();
    let rec = Arc::new(Recorder::default());
    n.activate(Activation {
        features: n.features(),
        queues: rings.iter().map(|r| r.queue(true)).collect(),
        interrupt: rec.clone(),
    })
    .unwrap();
    let (mut rx, mut tx) = (rings[0], rings[1]);
    let used_event = |r: &Ring| GuestAddress(r.avail + 4 + 2 * u64::from(r.size));
    let avail_event = |r: &Ring| GuestAddress(r.used + 4 + 8 * u64::from(r.size));
    // The driver wants a TX interrupt only after the 3rd used buffer (used_event 2).
    mem.write_obj(2u16, used_event(&tx)).unwrap();
    let f = frame(mac(9), mac(1), 20, 0);
    mem.write_slice(&[0; HEADER_LEN], GuestAddress(0x21000))
        .unwrap();
    mem.write_slice(&f, GuestAddress(0x2100c)).unwrap();
    tx.desc(&mem, 0, 0x21000, (HEADER_LEN + f.len()) as u32, 0, 0);
    for round in 1..=3u16 {
        tx.offer(&mem, 0);
        assert_eq!(n.transmit(0, |_| true).frames, 1);
        let raised = rec.causes.lock().unwrap().len();
        assert_eq!(raised, usize::from(round == 3), "round {round}");
        // The device asks to be kicked for the next chain.
        assert_eq!(mem.read_obj::<u16>(avail_event(&tx)).unwrap(), round);
    }
    // RX with no buffers: held, and the device asks for a kick at the next buffer.
    assert_eq!(n.receive(&f), RxOutcome::NoBuffer);
    assert_eq!(mem.read_obj::<u16>(avail_event(&rx)).unwrap(), 0);
    rx.desc(&mem, 0, 0x30000, 2048, WRITE, 0);
    rx.offer(&mem, 0);
    mem.write_obj(0u16, used_event(&rx)).unwrap();
    assert_eq!(n.receive(&f), RxOutcome::Delivered);
    assert_eq!(
        rec.causes.lock().unwrap().last(),
        Some(&InterruptCause::Queue(0))
    );
}

#[test]
fn without_the_event_index_the_no_interrupt_flag_is_honoured() {
    let mem = memory();
    let (n, mut rings, rec) = active_net(1, &mem);
    let tx = &mut rings[1];
    let f = frame(mac(9), mac(1), 60, 1);
    let mut bytes = vec![0u8; HEADER_LEN];
    bytes.extend_from_slice(&f);
    mem.write_slice(&bytes, GuestAddress(0x20000)).unwrap();
    // A polling driver: VIRTQ_AVAIL_F_NO_INTERRUPT set.
    mem.write_obj(1u16, GuestAddress(tx.avail)).unwrap();
    tx.desc(&mem, 0, 0x20000, bytes.len() as u32, 0, 0);
    tx.offer(&mem, 0);
    assert_eq!(n.transmit(0, |_| true).frames, 1);
    assert_eq!(
        *rec.causes.lock().unwrap(),
        [],
        "interrupted a polling driver"
    );
    // The driver clears the flag to wait: the next frame interrupts it.
    mem.write_obj(0u16, GuestAddress(tx.avail)).unwrap();
    tx.desc(&mem, 1, 0x20000, bytes.len() as u32, 0, 0);
    tx.offer(&mem, 1);
    assert_eq!(n.transmit(0, |_| true).frames, 1);
    assert_eq!(*rec.causes.lock().unwrap(), [InterruptCause::Queue(1)]);
}

// ---------------------------------------------------------------- snapshots

/// Posts `f` (with its virtio header) on TX `ring` as a one-descriptor chain `head`
/// at guest address `at`.
fn post_tx(mem: &Mem, ring: &mut Ring, head: u16, at: u64, f: &[u8]) {
    let mut bytes = vec![0u8; HEADER_LEN];
    bytes.extend_from_slice(f);
    mem.write_slice(&bytes, GuestAddress(at)).unwrap();
    ring.desc(mem, head, at, bytes.len() as u32, 0, 0);
    ring.offer(mem, head);
}

fn sent_by(n: &VirtioNet<Mem>) -> Vec<Vec<u8>> {
    let mut sent = Vec::new();
    n.transmit(0, |f| {
        sent.push(f.to_vec());
        true
    });
    sent
}

/// A fresh NIC and transport on `mem`, as a destination builds them.
fn fresh(mem: &Mem) -> (VirtioPciDevice, Arc<VirtioNet<Mem>>, Arc<Recorder>) {
    let n = net(1, mem);
    let rec = Arc::new(Recorder::default());
    let dev = VirtioPciDevice::new(n.clone(), rec.clone(), rec.clone()).unwrap();
    dev.place_bar(0xc000_0000);
    (dev, n, rec)
}

#[test]
fn a_live_nic_restored_into_a_fresh_transport_goes_on_where_it_stopped() {
    use crate::pci::PciDevice;
    let d = Driver::new(1);
    let (_, mut rings) = d.bring_up(features::VERSION_1 | feature::MAC);
    let f = frame(mac(9), mac(1), 100, 1);
    post_tx(&d.mem, &mut rings[1], 0, 0x20000, &f);
    assert_eq!(sent_by(&d.net), [f]);
    let saved = d.dev.save_state().unwrap();
    let v = saved.virtio.as_ref().unwrap();
    assert_eq!((v.queues[1].next_avail, v.queues[1].next_used), (1, 1));
    assert_eq!(v.device, [1], "one pair in use");

    // The same RAM (a migration carries it), a new NIC and transport.
    let (dev, n, rec) = fresh(&d.mem);
    dev.restore_state(&saved).unwrap();
    assert!(n.is_active());
    assert_eq!(n.negotiated_features(), features::VERSION_1 | feature::MAC);
    assert_eq!(*rec.actions.lock().unwrap(), [TransportAction::Activated]);
    assert_eq!(dev.save_state().unwrap(), saved, "nothing lost on the way");
    let routes = rec.routes.lock().unwrap().clone();
    assert_eq!(routes.len(), 3, "every vector re-routed: {routes:?}");
    assert!(routes.iter().all(|(_, r)| r.is_some()), "{routes:?}");

    // The next frame the driver posts is the only one sent: the first is not again.
    let g = frame(mac(9), mac(1), 60, 2);
    post_tx(&d.mem, &mut rings[1], 1, 0x21000, &g);
    assert_eq!(sent_by(&n), [g]);
    assert_eq!(rings[1].used_idx(&d.mem), 2);
    // Its TX interrupt goes out on the vector the driver chose (queue 1: vector 2).
    assert_eq!(rec.sent.lock().unwrap().last().map(|s| s.0), Some(2));
}

#[test]
fn a_state_that_does_not_fit_is_refused_and_changes_nothing() {
    use crate::pci::PciDevice;
    let d = Driver::new(1);
    let _ = d.bring_up(features::VERSION_1);
    let saved = d.dev.save_state().unwrap();
    let refused = |state: &crate::state::PciDeviceState, want: &str| {
        let (dev, n, rec) = fresh(&d.mem);
        let err = dev.restore_state(state).unwrap_err().to_string();
        assert!(err.contains(want), "{err} (wanted {want})");
        assert!(!n.is_active());
        assert_eq!(dev.status(), 0);
        assert!(rec.actions.lock().unwrap().is_empty());
    };
    let mut bad = saved.clone();
    bad.virtio.as_mut().unwrap().queues[0].size = 3;
    refused(&bad, "queue 0: size 3");
    let mut bad = saved.clone();
    bad.virtio.as_mut().unwrap().queue_vectors[1] = 7;
    refused(&bad, "a vector the function does not have");
    let mut bad = saved.clone();
    bad.virtio.as_mut().unwrap().driver_features |= 1 << 40;
    refused(&bad, "beyond the offered");
    let mut bad = saved.clone();
    bad.virtio.as_mut().unwrap().device = vec![5];
    refused(&bad, "pairs in use");
    let mut bad = saved.clone();
    bad.virtio.as_mut().unwrap().queues[1].desc = MEM_SIZE as u64;
    refused(&bad, "activating on the saved rings");
    let mut bad = saved.clone();
    bad.virtio = None;
    refused(&bad, "the state is a");
    // A NIC with more queues (another MSI-X table size) is another device.
    let mut bad = Driver::new(2).dev.save_state().unwrap();
    bad.kind = saved.kind.clone();
    refused(&bad, "does not fit");
    // And a device the driver already uses takes no state.
    let err = d.dev.restore_state(&saved).unwrap_err().to_string();
    assert!(err.contains("already uses"), "{err}");
}

#[test]
fn while_tracking_the_nic_records_the_pages_it_writes() {
    let mem = memory();
    let (n, mut rings, _) = active_net(1, &mem);
    // The second RX buffer crosses a page boundary: both pages count.
    rings[0].desc(&mem, 0, 0x30000, 2048, WRITE, 0);
    rings[0].offer(&mem, 0);
    rings[0].desc(&mem, 1, 0x20f00, 2048, WRITE, 0);
    rings[0].offer(&mem, 1);
    assert_eq!(
        n.receive(&frame(mac(1), mac(9), 100, 1)),
        RxOutcome::Delivered
    );
    assert!(
        n.take_written().is_empty(),
        "nothing recorded before tracking"
    );

    n.track_writes(true);
    assert_eq!(
        n.receive(&frame(mac(1), mac(9), 100, 2)),
        RxOutcome::Delivered
    );
    // The RX used ring's page (0x10800, in page 0x10000) and the buffer's two.
    assert_eq!(n.take_written(), [0x10000, 0x20000, 0x21000]);
    assert!(n.take_written().is_empty(), "taken");
    // TX writes only its used ring (0x11800).
    post_tx(
        &mem,
        &mut rings[1],
        0,
        0x22000,
        &frame(mac(9), mac(1), 60, 3),
    );
    assert_eq!(sent_by(&n).len(), 1);
    assert_eq!(n.take_written(), [0x11000]);

    n.track_writes(false);
    rings[0].desc(&mem, 2, 0x32000, 2048, WRITE, 0);
    rings[0].offer(&mem, 2);
    assert_eq!(
        n.receive(&frame(mac(1), mac(9), 100, 4)),
        RxOutcome::Delivered
    );
    assert!(
        n.take_written().is_empty(),
        "nothing recorded after tracking"
    );
}
