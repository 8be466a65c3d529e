//! How a device's interrupts leave it: one MSI message type ([`MsiMessage`]) and one
//! trait for a device's group of vectors ([`InterruptSourceGroup`], the shape of Cloud
//! Hypervisor's `vm-device` trait of that name).
//!
//! Both live here, in the KVM-free device crate, because both sides use them: device
//! models (MSI-X tables, the virtio transport, the passthrough device) decide which
//! vector fires and where it is routed; the VMM (`hv`) implements the group on its two
//! interrupt paths (generic event loop, fast irqfd) and turns messages into KVM routes.
//! `hv` depends on this crate, never the other way, so this is the one place both see.

use std::sync::Mutex;

use vmm_sys_util::eventfd::EventFd;

/// A message-signalled interrupt as a device (or its MSI-X table) writes it: the
/// address names the destination APIC, the data the vector and delivery mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

impl MsiMessage {
    /// A fixed, edge-triggered interrupt of `vector` to the CPU with `apic_id`
    /// (physical destination; IDs above 255 in the extended destination bits 11:5, as
    /// KVM's `KVM_X2APIC_API` and Linux's "ext_dest_id" use them).
    pub fn fixed(apic_id: u32, vector: u8) -> MsiMessage {
        let low = u64::from(apic_id & 0xff) << 12;
        let high = u64::from((apic_id >> 8) & 0x7f) << 5;
        MsiMessage {
            address: 0xfee0_0000 | low | high,
            data: u32::from(vector),
        }
    }

    /// The destination APIC ID: address bits 19:12, and bits 11:5 above them (the
    /// extended destination ID that KVM's x2APIC API and Linux use beyond 255 CPUs).
    pub fn destination(&self) -> u32 {
        let low = (self.address >> 12) & 0xff;
        let high = (self.address >> 5) & 0x7f;
        (low | (high << 8)) as u32
    }

    /// The IDT vector.
    pub fn vector(&self) -> u8 {
        self.data as u8
    }

    /// Delivery mode (0 fixed, 1 lowest priority, 2 SMI, 4 NMI, 5 INIT, 7 ExtINT).
    pub fn delivery_mode(&self) -> u8 {
        ((self.data >> 8) & 0x7) as u8
    }

    /// Logical (rather than physical) destination mode.
    pub fn logical_destination(&self) -> bool {
        self.address & (1 << 2) != 0
    }

    /// Level-triggered (rather than edge).
    pub fn level_triggered(&self) -> bool {
        self.data & (1 << 15) != 0
    }
}

/// A device's interrupt vectors, on whichever path the VMM chose for it. The device
/// model calls [`update`](Self::update) whenever a vector's route changes (the guest
/// rewrote or (un)masked its MSI-X entry, or a restore re-derived it) and
/// [`trigger`](Self::trigger) when a vector may be sent now; it never sends to a
/// vector whose route is masked (its MSI-X table holds it pending instead).
pub trait InterruptSourceGroup: Send + Sync {
    /// Raises vector `index` at the route the last [`update`](Self::update) gave it.
    fn trigger(&self, index: u16);

    /// Vector `index` now delivers `route`, or may not be delivered (`None`: masked,
    /// function masked or MSI-X disabled). Cloud Hypervisor passes the message and a
    /// masked flag apart; one `Option` says both, which is what `Msix` reports.
    fn update(&self, index: u16, route: Option<MsiMessage>);

    /// An eventfd whose write raises vector `index` with no VMM thread in between (a
    /// duplicate the caller owns), if this group has one: the fast path's irqfd, which
    /// a backend thread or another process (a passthrough device's server) writes
    /// directly. The generic path has none: its interrupts go through the device's
    /// MSI-X state and the event loop.
    fn notifier(&self, _index: u16) -> Option<EventFd> {
        None
    }
}

/// The route of each vector as a group was told it: what a group that sends messages
/// itself (the generic path, test recorders) looks up on [`InterruptSourceGroup::trigger`].
#[derive(Debug, Default)]
pub struct RouteTable(Mutex<Vec<Option<MsiMessage>>>);

impl RouteTable {
    /// `vectors` vectors, each masked.
    pub fn new(vectors: u16) -> RouteTable {
        RouteTable(Mutex::new(vec![None; usize::from(vectors)]))
    }

    /// Vector `index` now routes to `route` (grows the table if `index` is beyond it).
    pub fn set(&self, index: u16, route: Option<MsiMessage>) {
        let mut routes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let i = usize::from(index);
        if i >= routes.len() {
            routes.resize(i + 1, None);
        }
        routes[i] = route;
    }

    /// Where vector `index` routes now (`None`: masked or unknown).
    pub fn get(&self, index: u16) -> Option<MsiMessage> {
        let routes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        routes.get(usize::from(index)).copied().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_messages_encode_destination_and_vector() {
        assert_eq!(
            MsiMessage::fixed(0, 0x41),
            MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            }
        );
        assert_eq!(MsiMessage::fixed(3, 0x50).address, 0xfee0_3000);
        // APIC ID 0x1_23: low byte in 19:12, the rest in the extended bits 11:5.
        let m = MsiMessage::fixed(0x123, 0x30);
        assert_eq!(m.address, 0xfee2_3000 | (1 << 5));
        assert_eq!((m.destination(), m.vector()), (0x123, 0x30));
    }

    #[test]
    fn messages_decode_destination_vector_and_mode() {
        let m = MsiMessage::fixed(3, 0x41);
        assert_eq!(
            (m.destination(), m.vector(), m.delivery_mode()),
            (3, 0x41, 0)
        );
        let nmi = MsiMessage {
            address: 0xfee0_0004,
            data: 0x8400,
        };
        assert_eq!(nmi.delivery_mode(), 4);
        assert!(nmi.logical_destination() && nmi.level_triggered());
    }

    #[test]
    fn a_route_table_keeps_the_last_route_of_each_vector() {
        let table = RouteTable::new(2);
        assert_eq!(table.get(0), None, "masked after reset");
        table.set(1, Some(MsiMessage::fixed(1, 0x40)));
        table.set(3, Some(MsiMessage::fixed(0, 0x41)));
        assert_eq!(table.get(1), Some(MsiMessage::fixed(1, 0x40)));
        assert_eq!(table.get(3), Some(MsiMessage::fixed(0, 0x41)));
        table.set(1, None);
        assert_eq!(table.get(1), None);
        assert_eq!(table.get(9), None, "no such vector");
    }
}
