//! A device's doorbells decode where its BAR decodes, and nowhere else: a guest that
//! clears Memory Space Enable, or moves BAR 0, then rings the old doorbell addresses
//! reaches nothing, while the doorbells at the new address answer (the ioeventfds move
//! with the BAR).

use std::time::{Duration, Instant};

use hv::GuestExit;
use hv::irq::IrqPath;
use hv::irq_device::{self, IrqDeviceSetup};
use hv::testing::{asm, code_vm, kvm_available};

/// The test device is the first device kumo plugs in: slot 1 (the host bridge is 0),
/// its BAR 0 the first address of the PCI window.
const CONFIG: u32 = 0xe000_0000 + (1 << 15);
const COMMAND: u32 = CONFIG + 0x04;
const BAR0: u32 = CONFIG + 0x10;
const OLD: u32 = 0xc000_0000;
const NEW: u32 = 0xc010_0000;
const STRIDE: u32 = irq_device_stride();

const fn irq_device_stride() -> u32 {
    devices::irq_test::DOORBELL_STRIDE as u32
}

/// Rings doorbell `vector` at BAR 0 = `base`.
fn ring(base: u32, vector: u32) -> Vec<u8> {
    asm::store32(base + vector * STRIDE, 1)
}

#[test]
fn doorbells_follow_memory_enable_and_bar_moves() {
    if !kvm_available() {
        return;
    }
    let code = [
        asm::store32(COMMAND, 0x2), // memory space on
        ring(OLD, 0),               // heard
        asm::store32(COMMAND, 0),   // memory space off
        ring(OLD, 2),               // nothing decodes
        asm::store32(BAR0, NEW),    // BAR 0 moved while off
        ring(OLD, 3),
        ring(NEW, 4),
        asm::store32(COMMAND, 0x2), // memory space on again, at the new address
        ring(OLD, 5),               // nothing is there any more
        ring(NEW, 1),               // heard
        asm::debug_exit(0),
    ]
    .concat();
    let mut vm = hv::builder::build_for_boot(code_vm(1, 64, &code)).expect("VM");
    let setup = IrqDeviceSetup {
        path: IrqPath::Generic,
        delay: Duration::ZERO,
        noise_hz: None,
    };
    let devices = irq_device::attach(&mut vm, &setup, None).expect("test device");
    assert_eq!(devices.device().bar0(), Some(u64::from(OLD)));
    let outcome = vm
        .run(Box::new(std::io::sink()), Instant::now())
        .expect("run");
    assert_eq!(outcome.exit, GuestExit::DebugExit(0));
    assert_eq!(devices.device().bar0(), Some(u64::from(NEW)));

    // The responder logs asynchronously: wait for the last heard doorbell, then give
    // any stray one written before it the same time again to show up.
    let start = Instant::now();
    while !devices.host_rounds().iter().any(|r| r.vector == 1) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "doorbell 1 never heard"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(start.elapsed() + Duration::from_millis(50));
    let mut heard: Vec<u16> = devices.host_rounds().iter().map(|r| r.vector).collect();
    heard.sort_unstable();
    assert_eq!(heard, [0, 1], "doorbells heard where nothing decodes");
}
