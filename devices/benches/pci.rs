//! What kumo's user-space PCI costs per guest access (on top of the exit itself,
//! ~10 µs MMIO on PVM hosts): routing an MMIO access to a device's BAR, a configuration
//! read through ECAM, an MSI-X table write that re-routes a vector, and the device
//! deciding to send a vector (`fire`).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use devices::interrupt::{InterruptSourceGroup, MsiMessage};
use devices::irq_test::{self, Doorbell, IrqTestDevice};
use devices::pci::PciBus;

const ECAM: u64 = 0xe000_0000;
const BAR: u64 = 0xc000_0000;

struct Null;

impl InterruptSourceGroup for Null {
    fn trigger(&self, vector: u16) {
        black_box(vector);
    }
    fn update(&self, _vector: u16, route: Option<MsiMessage>) {
        black_box(route);
    }
}

impl Doorbell for Null {
    fn ring(&self, vector: u16) {
        black_box(vector);
    }
}

/// A bus with three test devices (the last one is benchmarked: routing scans the
/// others first), memory decoding and MSI-X on, vector 0 unmasked.
fn bus() -> (PciBus, Arc<IrqTestDevice>) {
    let mut bus = PciBus::new(ECAM);
    let mut last = None;
    for slot in 0..3u64 {
        let device = Arc::new(IrqTestDevice::new(8, Arc::new(Null), Arc::new(Null)));
        device.place_bar0(BAR + slot * irq_test::BAR0_SIZE);
        bus.add(device.clone()).expect("free slot");
        last = Some(device);
    }
    let device = last.expect("three devices");
    let cfg = |reg: u64| ECAM + (3 << 15) + reg;
    bus.mmio_write(cfg(4), &6u32.to_le_bytes());
    // MSI-X capability: the first one, at 0x40; enable in its message control.
    bus.mmio_write(cfg(0x40), &(0x8000_0000u32 | 0x11).to_le_bytes());
    let table = BAR + 2 * irq_test::BAR0_SIZE + irq_test::MSIX_TABLE;
    bus.mmio_write(table, &0xfee0_0000u32.to_le_bytes());
    bus.mmio_write(table + 8, &0x30u32.to_le_bytes());
    bus.mmio_write(table + 12, &0u32.to_le_bytes());
    (bus, device)
}

fn pci(c: &mut Criterion) {
    let (bus, device) = bus();
    let bar = BAR + 2 * irq_test::BAR0_SIZE;
    let mut group = c.benchmark_group("pci");
    group.bench_function("bar_doorbell_write_routed", |b| {
        b.iter(|| bus.mmio_write(black_box(bar + 8), &1u32.to_le_bytes()))
    });
    group.bench_function("ecam_config_read", |b| {
        let mut data = [0u8; 4];
        b.iter(|| bus.mmio_read(black_box(ECAM + (3 << 15)), &mut data))
    });
    group.bench_function("msix_entry_retarget", |b| {
        let mut apic = 0u32;
        b.iter(|| {
            apic ^= 1;
            bus.mmio_write(
                bar + irq_test::MSIX_TABLE,
                &(0xfee0_0000 | (apic << 12)).to_le_bytes(),
            )
        })
    });
    group.bench_function("fire_vector", |b| b.iter(|| device.fire(black_box(0))));
    group.finish();
}

criterion_group!(benches, pci);
criterion_main!(benches);
