//! Device-interrupt workloads (`irq=check`, `irq=bench:ROUNDS:CPU`): find kumo's
//! interrupt test device on PCI, program its MSI-X table, ring its doorbells, and
//! check or time the interrupts the supervisor records (`kumo_abi::IrqRecord`).
//!
//! Everything here is ring 3: configuration space through ECAM and the device's BAR
//! are plain memory accesses (each one an exit to the VMM, which is fine at setup; the
//! doorbell is an ioeventfd, handled inside KVM).

use core::fmt::Write;
use core::ptr::{read_volatile, write_volatile};

use kumo_abi::irq_device::{DEVICE_ID, DOORBELL_STRIDE, MSIX_PBA, MSIX_TABLE, VENDOR_ID};
use kumo_abi::{BootInfo, DEVICE_VECTOR_BASE, DEVICE_VECTORS, IrqRecord};

use crate::{Line, sys};

/// How long to wait for an interrupt (or a pending bit) before calling it lost.
const TIMEOUT_MS: u64 = 2000;
/// The noise device's interrupts use this vector (index into the records).
const NOISE_VECTOR_INDEX: usize = DEVICE_VECTORS - 1;
const PCI_CAP_MSIX: u32 = 0x11;

/// The APIC ID of CPU `cpu`, from the supervisor's APIC ID -> CPU table (not CPUID:
/// in ring 3 it may run natively and report the host's APIC ID).
fn apic_id(info: &BootInfo, cpu: u32) -> Option<u32> {
    // SAFETY: the supervisor's 256-byte table, identity-mapped and read-only to us,
    // written before ring 3 started.
    let table = unsafe { core::slice::from_raw_parts(info.apic_to_cpu as *const u8, 256) };
    table
        .iter()
        .position(|&c| u32::from(c) == cpu)
        .map(|id| id as u32)
}

fn read32(addr: u64) -> u32 {
    // SAFETY: addresses come from the ECAM base and BARs the machine describes; the
    // identity map covers them (below 4 GiB) for ring 3.
    unsafe { read_volatile(addr as *const u32) }
}

fn write32(addr: u64, value: u32) {
    // SAFETY: as in `read32`.
    unsafe { write_volatile(addr as *mut u32, value) }
}

/// One test device, programmed by us.
struct Device {
    bar0: u64,
    vectors: usize,
}

impl Device {
    /// Points MSI-X entry `entry` at `apic_id` with IDT vector `DEVICE_VECTOR_BASE +
    /// record`, masked or not.
    fn program(&self, entry: usize, apic_id: u32, record: usize, masked: bool) {
        let at = self.bar0 + MSIX_TABLE + 16 * entry as u64;
        write32(at + 12, 1); // mask while rewriting
        write32(at, 0xFEE0_0000 | ((apic_id & 0xFF) << 12) | (((apic_id >> 8) & 0x7F) << 5));
        write32(at + 4, 0);
        write32(at + 8, DEVICE_VECTOR_BASE + record as u32);
        write32(at + 12, u32::from(masked));
    }

    fn mask(&self, entry: usize, masked: bool) {
        write32(self.bar0 + MSIX_TABLE + 16 * entry as u64 + 12, u32::from(masked));
    }

    fn pending(&self, entry: usize) -> bool {
        let word = read32(self.bar0 + MSIX_PBA + 4 * (entry as u64 / 32));
        word & (1 << (entry % 32)) != 0
    }

    fn ring(&self, entry: usize) {
        write32(self.bar0 + DOORBELL_STRIDE * entry as u64, 1);
    }
}

/// Finds up to two test devices on bus 0 (the second one, if any, is the noise
/// source), enables memory decode, bus mastering and MSI-X on each.
fn find_devices(ecam: u64) -> ([Option<Device>; 2], usize) {
    let mut found = [None, None];
    let mut count = 0;
    for slot in 0..32u64 {
        let cfg = ecam + (slot << 15);
        let id = read32(cfg);
        if id != u32::from(VENDOR_ID) | (u32::from(DEVICE_ID) << 16) || count == 2 {
            continue;
        }
        // Command: memory space + bus master (status half written 0: RW1C, no effect).
        write32(cfg + 4, (read32(cfg + 4) & 0xFFFF) | 0x6);
        let low = read32(cfg + 0x10);
        let mut bar0 = u64::from(low & !0xF);
        if low & 0x6 == 0x4 {
            bar0 |= u64::from(read32(cfg + 0x14)) << 32;
        }
        let Some(msix) = find_capability(cfg, PCI_CAP_MSIX) else {
            continue;
        };
        let control = read32(msix) >> 16;
        let vectors = (control as usize & 0x7FF) + 1;
        // Enable MSI-X, function unmasked (entries stay masked until programmed).
        write32(msix, (read32(msix) & 0xFFFF) | (0x8000 << 16));
        found[count] = Some(Device { bar0, vectors });
        count += 1;
    }
    (found, count)
}

fn find_capability(cfg: u64, id: u32) -> Option<u64> {
    if read32(cfg + 4) & (1 << 20) == 0 {
        return None;
    }
    let mut at = read32(cfg + 0x34) & 0xFC;
    // Bounded: a broken chain must not hang us.
    for _ in 0..48 {
        if at < 0x40 {
            return None;
        }
        let header = read32(cfg + u64::from(at));
        if header & 0xFF == id {
            return Some(cfg + u64::from(at));
        }
        at = (header >> 8) & 0xFC;
    }
    None
}

fn records(info: &BootInfo) -> &'static [IrqRecord] {
    // SAFETY: the supervisor's log, DEVICE_VECTORS records, identity-mapped; ring 0
    // writes it from interrupt handlers, so fields are only read with volatile loads.
    unsafe { core::slice::from_raw_parts(info.irq_log as *const IrqRecord, DEVICE_VECTORS) }
}

fn count(record: &IrqRecord) -> u64 {
    // SAFETY: a field of a live record; volatile because ring 0 updates it.
    unsafe { read_volatile(&record.count) }
}

/// Spins until `done()` or the timeout; true if `done()`.
fn spin_until(tsc_khz: u64, mut done: impl FnMut() -> bool) -> bool {
    let start = sys::rdtsc();
    while !done() {
        if sys::rdtsc() - start > TIMEOUT_MS * tsc_khz {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

/// `irq=check`: every vector to every CPU in turn (so each vector is re-targeted
/// while live), then masking: a masked vector is held pending and delivered on unmask.
pub fn check(info: &BootInfo) -> bool {
    let Some((device, _)) = setup(info) else {
        return false;
    };
    let log = records(info);
    let vectors = device.vectors.min(DEVICE_VECTORS - 1);
    let (mut delivered, mut misrouted, mut lost) = (0u32, 0u32, 0u32);
    for (entry, record) in log.iter().enumerate().take(vectors) {
        for cpu in 0..info.cpus {
            let Some(apic_id) = apic_id(info, cpu) else {
                lost += 1;
                continue;
            };
            device.program(entry, apic_id, entry, false);
            let before = count(record);
            device.ring(entry);
            if !spin_until(info.tsc_khz, || count(record) != before) {
                lost += 1;
                continue;
            }
            delivered += 1;
            // SAFETY: written by ring 0 before it incremented `count`.
            if unsafe { read_volatile(&record.apic_id) } != u64::from(apic_id) {
                misrouted += 1;
            }
        }
    }
    let (mut held, mut released) = (0u32, 0u32);
    for (entry, record) in log.iter().enumerate().take(vectors) {
        device.mask(entry, true);
        let before = count(record);
        device.ring(entry);
        // The device raises after its delay; masked, that sets the pending bit.
        let pended = spin_until(info.tsc_khz, || device.pending(entry));
        if pended && count(record) == before {
            held += 1;
        }
        device.mask(entry, false);
        if spin_until(info.tsc_khz, || count(record) != before) && !device.pending(entry) {
            released += 1;
        }
    }
    let expected = (vectors * info.cpus as usize) as u32;
    let verified = vectors > 0
        && delivered == expected
        && misrouted == 0
        && lost == 0
        && held == vectors as u32
        && released == vectors as u32;
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo irqcheck vectors={vectors} cpus={} delivered={delivered} misrouted={misrouted} \
         lost={lost} masked_held={held} unmask_delivered={released} verified={verified}",
        info.cpus
    );
    line.emit();
    verified
}

/// `irq=bench:ROUNDS:CPU`: ring doorbell 0 ROUNDS times with vector 0 aimed at CPU,
/// one interrupt outstanding at a time, and time doorbell -> handler entry with the
/// TSC. A second device, if present, is the noise source: its vector 0 is aimed at the
/// next CPU (record NOISE_VECTOR_INDEX) and it raises on its own.
pub fn bench(info: &BootInfo, rounds: usize, target: u32) -> bool {
    let Some((device, noise)) = setup(info) else {
        return false;
    };
    if target >= info.cpus {
        bad_request("target-cpu-out-of-range");
        return false;
    }
    let heap_bytes = (info.heap_end - info.heap_start) as usize;
    if rounds == 0 || rounds > heap_bytes / 8 {
        bad_request("rounds-out-of-range");
        return false;
    }
    let log = records(info);
    let Some(target_apic) = apic_id(info, target) else {
        bad_request("target-cpu-out-of-range");
        return false;
    };
    device.program(0, target_apic, 0, false);
    // The noise is other devices' interrupts, which the OS aims elsewhere: at the
    // next CPU (the same one only on a 1-CPU guest). What it contends for is then the
    // delivery path, as in S4, not the measured CPU's time.
    if let Some(noise) = &noise {
        let other = (target + 1) % info.cpus;
        let Some(noise_apic) = apic_id(info, other) else {
            bad_request("no-noise-cpu");
            return false;
        };
        noise.program(0, noise_apic, NOISE_VECTOR_INDEX, false);
    }
    // SAFETY: the heap is ours; nothing else runs during this workload.
    let samples =
        unsafe { core::slice::from_raw_parts_mut(info.heap_start as *mut u64, rounds) };
    let mut lost = 0u32;
    for sample in samples.iter_mut() {
        let before = count(&log[0]);
        let start = sys::rdtsc();
        device.ring(0);
        if !spin_until(info.tsc_khz, || count(&log[0]) != before) {
            lost += 1;
            *sample = u64::MAX;
            continue;
        }
        // SAFETY: written by ring 0 before it incremented `count`.
        *sample = unsafe { read_volatile(&log[0].tsc) }.saturating_sub(start);
    }
    let noise_taken = count(&log[NOISE_VECTOR_INDEX]);
    if let Some(noise) = &noise {
        noise.mask(0, true);
    }
    device.mask(0, true);
    // Lost rounds hold u64::MAX: sorted last, left out.
    samples.sort_unstable();
    let at = crate::stats::quantiles(&mut samples[..rounds - lost as usize], info.tsc_khz);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo irqbench rounds={rounds} target={target} lost={lost} noise_irqs={noise_taken} \
         median_us={:.2} p90_us={:.2} p99_us={:.2} max_us={:.2} min_us={:.2}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        at(0.0),
    );
    line.emit();
    lost == 0
}

fn setup(info: &BootInfo) -> Option<(Device, Option<Device>)> {
    if info.pci_ecam == 0 {
        bad_request("no-pci");
        return None;
    }
    let ([first, second], _) = find_devices(info.pci_ecam);
    match first {
        Some(device) => Some((device, second)),
        None => {
            bad_request("no-irq-test-device");
            None
        }
    }
}

fn bad_request(what: &str) {
    let mut line = Line::new();
    let _ = write!(line, "@kumo error what=irq item={what}");
    line.emit();
}
