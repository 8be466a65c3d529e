//! PCI configuration space and MSI-X (devices/src/pci/): a guest's accesses to bus 0
//! through ECAM and the 0xCF8/0xCFC ports (BAR sizing and moves, command register,
//! capabilities) and to the devices' BARs (the virtio transport's registers, the MSI-X
//! table and PBA), with a virtio-net and a virtio-blk function on the bus. A driver
//! that brings a device up gets its queues served from the guest memory the input
//! fills.
#![no_main]

use devices::PioDevice;
use devices::pci::ConfigPorts;
use devices::virtio::transport::{BAR_SIZE, MSIX_TABLE_OFFSET};
use hv::layout::PCI_ECAM_BASE;
use kumo_fuzz::{Input, Machine, NET_BAR, guest_memory};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    // Each access: a kind byte, a value (u64), a place (u16).
    let ops_len = usize::from(input.u8()) * 11;
    let mut ops = Input::new(input.bytes(ops_len));
    let mem = guest_memory(input.rest());
    let Machine {
        bus,
        net,
        blk,
        net_fn,
        blk_fn,
        net_slot,
        blk_slot,
        ..
    } = Machine::new(mem);
    let ports = ConfigPorts::new(bus.clone());

    while !ops.is_empty() {
        let op = ops.u8();
        let width = [1usize, 2, 4, 8][usize::from(op >> 6)];
        let value = ops.u64().to_le_bytes();
        let where_ = ops.u16();
        let slot = if op & 0x20 == 0 { net_slot } else { blk_slot };
        let function = if slot == net_slot { &net_fn } else { &blk_fn };
        let bar = function.bar_address().unwrap_or(NET_BAR);
        let mut out = [0u8; 8];
        match op & 0x7 {
            0 => {
                // ECAM: this slot's function 0, or anywhere on bus 0..=1.
                let at = PCI_ECAM_BASE + (u64::from(slot) << 15) + u64::from(where_ & 0xfff);
                assert!(bus.mmio_write(at, &value[..width]));
            }
            1 => {
                let at = PCI_ECAM_BASE + (u64::from(where_) << 4);
                assert!(bus.mmio_read(at, &mut out[..width]));
            }
            2 => {
                let at = bar + u64::from(where_) % BAR_SIZE;
                let _ = bus.mmio_write(at, &value[..width]);
            }
            3 => {
                let at = bar + u64::from(where_) % BAR_SIZE;
                let _ = bus.mmio_read(at, &mut out[..width]);
            }
            4 => {
                // The MSI-X table and PBA (two 4-KiB blocks).
                let at = bar + MSIX_TABLE_OFFSET + u64::from(where_ & 0x1fff);
                let _ = bus.mmio_write(at, &value[..width.min(4)]);
            }
            5 => {
                // 0xCF8 address (enable bit, this slot, a register), then 0xCFC data.
                let address = 0x8000_0000 | (u32::from(slot) << 11) | u32::from(where_ & 0xfc);
                let _ = ports.write(0, &address.to_le_bytes());
                let _ = ports.write(4 + (where_ >> 8) % 4, &value[..width.min(4)]);
            }
            6 => {
                let _ = ports.write(0, &(value[0..4]));
                ports.read(4 + where_ % 4, &mut out[..width.min(4)]);
            }
            _ => {
                // The backend's turn: serve whatever the driver queued.
                let _ = net.transmit(where_ % 2, |_| true);
                let _ = net.receive(&value);
                let _ = net.process_ctrl();
                let _ = blk.process();
            }
        }
    }
});
