//! kumo's interrupt test device (PCI vendor 0x4B55 "KU", device 0x0001; layout in
//! `kumo_abi::irq_device` and `docs/guest-abi.md`): one 8 KiB memory BAR holding a
//! doorbell per vector, the MSI-X table and the PBA.
//!
//! The model is KVM-free. The VMM supplies where interrupts go ([`InterruptSourceGroup`]) and what
//! a doorbell write that reached this model does ([`Doorbell`]; normally doorbells
//! are ioeventfds that never reach it, and the VMM's responder thread calls
//! [`IrqTestDevice::fire`] after its delay).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::interrupt::{InterruptSourceGroup, MsiMessage};
use crate::pci::PciDevice;
use crate::pci::config::{self, Bar, BarKind, BarRegion, ConfigSpace};
use crate::pci::msix::{self, Msix, Update};
use crate::state::{DeviceStateError, PciDeviceState};

const KIND: &str = "irq-test";

pub use kumo_abi::irq_device::{
    BAR0_SIZE, DEVICE_ID, DOORBELL_STRIDE, MSIX_PBA, MSIX_TABLE, VENDOR_ID,
};

/// Class "other system peripheral".
const CLASS: u32 = 0x08_80_00;
/// Vectors (and doorbells) the device has: the table fits its 2 KiB.
pub const MAX_VECTORS: u16 = 128;

/// A doorbell write that reached the model (the VMM's ioeventfd did not take it,
/// e.g. because the guest moved the BAR).
pub trait Doorbell: Send + Sync {
    fn ring(&self, vector: u16);
}

struct State {
    config: ConfigSpace,
    msix: Msix,
    /// Offset of the MSI-X capability in configuration space.
    msix_cap: usize,
}

/// The device. Shared by vCPU threads (register accesses) and the responder (fire).
pub struct IrqTestDevice {
    state: Mutex<State>,
    sink: Arc<dyn InterruptSourceGroup>,
    doorbell: Arc<dyn Doorbell>,
}

impl IrqTestDevice {
    /// A device with `vectors` vectors (1..=[`MAX_VECTORS`], clamped).
    pub fn new(
        vectors: u16,
        sink: Arc<dyn InterruptSourceGroup>,
        doorbell: Arc<dyn Doorbell>,
    ) -> Self {
        let vectors = vectors.clamp(1, MAX_VECTORS);
        let mut config = ConfigSpace::new(VENDOR_ID, DEVICE_ID, CLASS, 1);
        let msix = Msix::new(vectors);
        config
            .add_bar(
                0,
                Bar {
                    kind: BarKind::Memory32,
                    size: BAR0_SIZE,
                },
            )
            .expect("BAR 0 of a fresh header is free and sized correctly");
        let (body, writable) = msix.capability(0, MSIX_TABLE as u32, 0, MSIX_PBA as u32);
        let msix_cap = config
            .add_capability(msix::CAPABILITY_ID, &body, &writable)
            .expect("a fresh header has room for one capability");
        IrqTestDevice {
            state: Mutex::new(State {
                config,
                msix,
                msix_cap,
            }),
            sink,
            doorbell,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn vectors(&self) -> u16 {
        self.state().msix.vectors()
    }

    /// Places BAR 0 before the guest runs, as firmware does.
    pub fn place_bar0(&self, address: u64) {
        self.state().config.set_bar_address(0, address);
    }

    /// Where BAR 0 is now.
    pub fn bar0(&self) -> Option<u64> {
        self.state().config.bar_address(0)
    }

    /// The device raises `vector`: sent now through the sink, or held pending if masked.
    pub fn fire(&self, vector: u16) {
        let mut state = self.state();
        if state.msix.fire(vector).is_some() {
            self.sink.trigger(vector);
        }
    }

    /// Whether `vector` is pending in the PBA.
    pub fn is_pending(&self, vector: u16) -> bool {
        self.state().msix.is_pending(vector)
    }

    /// The route of `vector` now.
    pub fn route(&self, vector: u16) -> Option<MsiMessage> {
        self.state().msix.route(vector)
    }

    /// Tells the sink about changes, with the device locked so a concurrent `fire`
    /// sees the new route.
    fn apply(&self, update: Update) {
        update.apply_to(&*self.sink);
    }
}

impl PciDevice for IrqTestDevice {
    fn save_state(&self) -> Result<PciDeviceState, DeviceStateError> {
        let state = self.state();
        Ok(PciDeviceState {
            kind: KIND.into(),
            config: state.config.state(),
            msix: Some(state.msix.state()),
            virtio: None,
        })
    }

    /// Registers, table and PBA back; then every vector's route is told to the sink
    /// (a restored VM's irqfd routes are rebuilt from the table, not saved).
    fn restore_state(&self, saved: &PciDeviceState) -> Result<(), DeviceStateError> {
        let Some(msix_state) = saved
            .msix
            .as_ref()
            .filter(|_| saved.kind == KIND && saved.virtio.is_none())
        else {
            return Err(DeviceStateError::mismatch(
                "interrupt test device",
                format!("the state is a '{}'s", saved.kind),
            ));
        };
        let mut state = self.state();
        let mut config = state.config.clone();
        config.restore_state(&saved.config)?;
        let mut msix = state.msix.clone();
        msix.restore_state(msix_state)?;
        state.config = config;
        state.msix = msix;
        for vector in 0..state.msix.vectors() {
            self.sink.update(vector, state.msix.route(vector));
        }
        Ok(())
    }

    fn config_read(&self, offset: usize, data: &mut [u8]) {
        self.state().config.read(offset, data);
    }

    fn config_write(&self, offset: usize, data: &[u8]) {
        let mut state = self.state();
        let control_at = state.msix_cap + 2;
        state.config.write(offset, data);
        let touched = offset < control_at + 2 && control_at < offset.saturating_add(data.len());
        if touched {
            let control = state.config.word(control_at);
            let update = state.msix.set_control(control);
            self.apply(update);
        }
    }

    fn memory_regions(&self) -> Vec<BarRegion> {
        self.state().config.memory_regions().collect()
    }

    /// One per vector at BAR 0 + stride x vector; doorbell id = vector.
    fn doorbells(&self) -> Vec<crate::pci::Doorbell> {
        (0..self.vectors())
            .map(|vector| crate::pci::Doorbell {
                bar: 0,
                offset: DOORBELL_STRIDE * u64::from(vector),
                id: u32::from(vector),
            })
            .collect()
    }

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        let state = self.state();
        match (bar, offset) {
            (0, MSIX_TABLE..MSIX_PBA) => state.msix.table_read(offset - MSIX_TABLE, data),
            (0, MSIX_PBA..BAR0_SIZE) => state.msix.pba_read(offset - MSIX_PBA, data),
            // Doorbells are write-only; reads return zero.
            (0, _) => data.fill(0),
            _ => data.fill(0xff),
        }
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        match (bar, offset) {
            (0, MSIX_TABLE..MSIX_PBA) => {
                let mut state = self.state();
                let update = state.msix.table_write(offset - MSIX_TABLE, data);
                self.apply(update);
            }
            (0, 0..MSIX_TABLE) if offset.is_multiple_of(DOORBELL_STRIDE) => {
                let vector = (offset / DOORBELL_STRIDE) as u16;
                if vector < self.vectors() {
                    self.doorbell.ring(vector);
                }
            }
            // The PBA is read-only; the rest of the BAR ignores writes.
            _ => {}
        }
    }
}

/// Configuration-space offset of BAR 0 (for VMM code that reads it raw).
pub const BAR0_REGISTER: usize = config::BAR0;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        sent: Mutex<Vec<(u16, MsiMessage)>>,
        routes: Mutex<Vec<(u16, Option<MsiMessage>)>>,
        table: crate::interrupt::RouteTable,
        rung: Mutex<Vec<u16>>,
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

    impl Doorbell for Recorder {
        fn ring(&self, vector: u16) {
            self.rung.lock().unwrap().push(vector);
        }
    }

    fn device(vectors: u16) -> (IrqTestDevice, Arc<Recorder>) {
        let recorder = Arc::new(Recorder::default());
        let device = IrqTestDevice::new(vectors, recorder.clone(), recorder.clone());
        device.place_bar0(0xc000_0000);
        (device, recorder)
    }

    fn cfg32(d: &IrqTestDevice, at: usize) -> u32 {
        let mut data = [0; 4];
        d.config_read(at, &mut data);
        u32::from_le_bytes(data)
    }

    /// The guest driver's steps (guests/user/src/irq.rs): enable memory and MSI-X.
    fn enable(d: &IrqTestDevice) -> usize {
        d.config_write(config::COMMAND, &6u16.to_le_bytes());
        let cap = (cfg32(d, config::CAPABILITIES_POINTER) & 0xfc) as usize;
        let word = cfg32(d, cap);
        d.config_write(cap, &((word & 0xffff) | (0x8000 << 16)).to_le_bytes());
        cap
    }

    fn program(d: &IrqTestDevice, v: u64, apic: u32, vector: u32, masked: bool) {
        let at = MSIX_TABLE + 16 * v;
        d.bar_write(0, at + 12, &1u32.to_le_bytes());
        d.bar_write(0, at, &(0xfee0_0000 | (apic << 12)).to_le_bytes());
        d.bar_write(0, at + 4, &0u32.to_le_bytes());
        d.bar_write(0, at + 8, &vector.to_le_bytes());
        d.bar_write(0, at + 12, &u32::from(masked).to_le_bytes());
    }

    #[test]
    fn a_guest_finds_it_through_its_header_and_capability() {
        let (d, _) = device(16);
        assert_eq!(cfg32(&d, 0), 0x0001_4b55);
        assert_eq!(cfg32(&d, BAR0_REGISTER), 0xc000_0000);
        let cap = enable(&d);
        assert_eq!(cfg32(&d, cap) & 0xff, u32::from(msix::CAPABILITY_ID));
        assert_eq!((cfg32(&d, cap) >> 16) & 0x7ff, 15, "table size - 1");
        assert_eq!(cfg32(&d, cap + 4), MSIX_TABLE as u32);
        assert_eq!(cfg32(&d, cap + 8), MSIX_PBA as u32);
        assert_eq!(
            d.memory_regions(),
            [BarRegion {
                index: 0,
                address: 0xc000_0000,
                size: BAR0_SIZE
            }]
        );
    }

    #[test]
    fn fired_vectors_follow_the_table_and_masking() {
        let (d, rec) = device(4);
        enable(&d);
        program(&d, 1, 2, 0x31, false);
        let expected = MsiMessage {
            address: 0xfee0_2000,
            data: 0x31,
        };
        assert_eq!(
            rec.routes.lock().unwrap().last(),
            Some(&(1, Some(expected)))
        );
        d.fire(1);
        assert_eq!(*rec.sent.lock().unwrap(), [(1, expected)]);
        // Masked: held in the PBA (visible through the BAR), sent on unmask.
        d.bar_write(0, MSIX_TABLE + 16 + 12, &1u32.to_le_bytes());
        d.fire(1);
        assert_eq!(rec.sent.lock().unwrap().len(), 1);
        let mut pba = [0; 4];
        d.bar_read(0, MSIX_PBA, &mut pba);
        assert_eq!(u32::from_le_bytes(pba), 1 << 1);
        d.bar_write(0, MSIX_TABLE + 16 + 12, &0u32.to_le_bytes());
        assert_eq!(rec.sent.lock().unwrap().len(), 2);
        assert!(!d.is_pending(1));
        // Function mask through the capability: everything re-routed to None.
        let cap = (cfg32(&d, config::CAPABILITIES_POINTER) & 0xfc) as usize;
        d.config_write(cap + 2, &0xc000u16.to_le_bytes());
        assert_eq!(rec.routes.lock().unwrap().last(), Some(&(1, None)));
        assert_eq!(d.route(1), None);
    }

    #[test]
    fn saved_state_restores_routes_pending_bits_and_registers() {
        let (d, _) = device(8);
        enable(&d);
        program(&d, 3, 1, 0x40, false);
        program(&d, 5, 0, 0x41, true);
        d.fire(5); // masked: pending
        let saved = d.save_state().unwrap();

        let (fresh, rec) = device(8);
        fresh.place_bar0(0xd000_0000); // the saved placement must win
        fresh.restore_state(&saved).unwrap();
        assert_eq!(fresh.save_state().unwrap(), saved);
        assert_eq!(cfg32(&fresh, BAR0_REGISTER), 0xc000_0000);
        assert!(fresh.is_pending(5));
        let route3 = Some(MsiMessage {
            address: 0xfee0_1000,
            data: 0x40,
        });
        assert_eq!(fresh.route(3), route3);
        let routes = rec.routes.lock().unwrap();
        assert_eq!(routes.len(), 8, "every vector re-routed once");
        assert!(routes.contains(&(3, route3)) && routes.contains(&(5, None)));
        assert!(
            rec.sent.lock().unwrap().is_empty(),
            "restoring delivers nothing"
        );

        // Another vector count, another device kind: refused, device unchanged.
        let (other, _) = device(16);
        assert!(other.restore_state(&saved).is_err());
        let bridge = crate::pci::HostBridge::new().save_state().unwrap();
        assert!(fresh.restore_state(&bridge).is_err());
        assert!(crate::pci::HostBridge::new().restore_state(&saved).is_err());
        assert_eq!(fresh.save_state().unwrap(), saved);
    }

    #[test]
    fn doorbell_writes_that_reach_the_model_ring() {
        let (d, rec) = device(4);
        d.bar_write(0, 3 * DOORBELL_STRIDE, &1u32.to_le_bytes());
        d.bar_write(0, 9 * DOORBELL_STRIDE, &1u32.to_le_bytes());
        d.bar_write(0, 3 * DOORBELL_STRIDE + 4, &1u32.to_le_bytes());
        assert_eq!(*rec.rung.lock().unwrap(), [3]);
    }
}
