//! The migration stream and snapshot reader (hv/src/migration/stream.rs): the header,
//! sections (tags, lengths, checksums), META's limits, RAM page records, round
//! markers and the JSON of vCPU, VM and device state; then, as a restore does
//! (hv/src/device_manager.rs), the device state goes into a fresh bus of a NIC and a
//! disk, COM1 and the boot timer. Also the destination's replies a source reads.
//!
//! The first byte picks the form: raw bytes as they come off a socket or a file, or
//! sections framed with correct checksums by the target (so the fuzzer reaches the
//! parsing behind them).
#![no_main]

use devices::{BootTimer, Com1};
use hv::migration::stream::{self, MAGIC, VERSION};
use kumo_fuzz::{Input, Machine, guest_memory};
use libfuzzer_sys::fuzz_target;

/// The tags a framed section may get (the stream's and a few others).
const TAGS: [&[u8; 4]; 10] = [
    b"META", b"RAM ", b"VCPU", b"VMST", b"DEVS", b"APPS", b"SYNC", b"END\0", b"ACK ", b"XXXX",
];

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let bytes = if input.u8() & 1 == 0 {
        input.rest().to_vec()
    } else {
        framed(&mut input)
    };
    let _ = stream::read_reply(&mut &bytes[16.min(bytes.len())..]);
    let Ok(parsed) = stream::parse(&mut bytes.as_slice()) else {
        return;
    };
    for (gpa, page) in &parsed.pages {
        assert!(*gpa < parsed.meta.memory_bytes.max(1 << 32) + parsed.meta.memory_bytes);
        assert!(page.as_ref().is_none_or(|p| p.len() == stream::PAGE_SIZE));
    }
    let machine = Machine::new(guest_memory(&[]));
    if machine.bus.restore_state(&parsed.devices.pci).is_ok() {
        let ports = devices::pci::ConfigPorts::new(machine.bus.clone());
        ports.set_address(parsed.devices.pci_address);
        // The restored functions serve their queues from where they stood.
        let _ = machine.net.transmit(0, |_| true);
        let _ = machine.net.receive(&[0u8; 60]);
        let _ = machine.blk.process();
        let mut out = [0u8; 4];
        let _ = machine.bus.mmio_read(kumo_fuzz::NET_BAR, &mut out);
    }
    let _ = Com1::from_state(Box::new(std::io::sink()), &parsed.devices.com1);
    let _ = BootTimer::from_state(&parsed.devices.boot_timer);
});

/// A stream whose header is right and whose sections the input describes: a tag
/// index, a length, then that many payload bytes, each framed with its checksum.
fn framed(input: &mut Input<'_>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    while !input.is_empty() {
        let tag = TAGS[usize::from(input.u8()) % TAGS.len()];
        let len = usize::from(input.u16());
        let payload = input.bytes(len);
        out.extend_from_slice(tag);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32(payload).to_le_bytes());
        out.extend_from_slice(payload);
    }
    out
}

/// CRC-32 (IEEE), as the stream's sections carry it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}
