//! Device-interrupt workloads (`irq=check`, `irq=bench:ROUNDS:CPU`): find kumo's
//! interrupt test device on PCI, program its MSI-X table, ring its doorbells, and
//! check or time the interrupts the supervisor records (`kumo_abi::IrqRecord`).
//!
//! Everything here is ring 3: configuration space through ECAM and the device's BAR
//! are plain memory accesses (each one an exit to the VMM, which is fine at setup; the
//! doorbell is an ioeventfd, handled inside KVM).

use core::fmt::Write;
use core::ptr::read_volatile;

use kumo_abi::BootInfo;
use kumo_abi::irq_device::{DEVICE_ID, DOORBELL_STRIDE, VENDOR_ID};

use crate::pci::{Function, Msix, apic_id, count, records, write32};
use crate::{Line, sys};

/// How long to wait for an interrupt (or a pending bit) before calling it lost.
const TIMEOUT_MS: u64 = 2000;
/// Records 0-15 are the test devices' (the NICs' start at 16): the noise device's
/// interrupts use the last of them, the checked device's the ones below it.
const TEST_RECORDS: usize = 16;
const NOISE_VECTOR_INDEX: usize = TEST_RECORDS - 1;

/// One test device, programmed by us.
struct Device {
    bar0: u64,
    msix: Msix,
}

impl Device {
    fn ring(&self, entry: usize) {
        write32(self.bar0 + DOORBELL_STRIDE * entry as u64, 1);
    }
}

/// Finds up to two test devices on bus 0 (the second one, if any, is the noise
/// source), enables memory decode, bus mastering and MSI-X on each.
fn find_devices(ecam: u64) -> [Option<Device>; 2] {
    let mut found = [None, None];
    let devices = Function::find_all(ecam, VENDOR_ID, DEVICE_ID).filter_map(|function| {
        function.enable();
        let bar0 = function.bar(0)?;
        let msix = function.msix()?;
        Some(Device { bar0, msix })
    });
    for (slot, device) in found.iter_mut().zip(devices) {
        *slot = Some(device);
    }
    found
}

/// Spins until `done()` or the timeout; true if `done()`.
fn spin_until(tsc_khz: u64, mut done: impl FnMut() -> bool) -> bool {
    let start = sys::rdtsc();
    while !done() {
        if sys::rdtsc().saturating_sub(start) > TIMEOUT_MS * tsc_khz {
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
    let vectors = device.msix.vectors.min(TEST_RECORDS - 1);
    let (mut delivered, mut misrouted, mut lost) = (0u32, 0u32, 0u32);
    for (entry, record) in log.iter().enumerate().take(vectors) {
        for cpu in 0..info.cpus {
            let Some(apic_id) = apic_id(info, cpu) else {
                lost += 1;
                continue;
            };
            device.msix.program(entry, apic_id, entry, false);
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
        device.msix.mask(entry, true);
        let before = count(record);
        device.ring(entry);
        // The device raises after its delay; masked, that sets the pending bit.
        let pended = spin_until(info.tsc_khz, || device.msix.pending(entry));
        if pended && count(record) == before {
            held += 1;
        }
        device.msix.mask(entry, false);
        if spin_until(info.tsc_khz, || count(record) != before) && !device.msix.pending(entry) {
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
    device.msix.program(0, target_apic, 0, false);
    // The noise is other devices' interrupts, which the OS aims elsewhere: at the
    // next CPU (the same one only on a 1-CPU guest). What it contends for is then the
    // delivery path, as in S4, not the measured CPU's time.
    if let Some(noise) = &noise {
        let other = (target + 1) % info.cpus;
        let Some(noise_apic) = apic_id(info, other) else {
            bad_request("no-noise-cpu");
            return false;
        };
        noise.msix.program(0, noise_apic, NOISE_VECTOR_INDEX, false);
    }
    // SAFETY: the heap is ours (nothing else runs during this workload) and holds
    // `rounds` u64s: checked against `heap_bytes` above.
    let samples = unsafe { core::slice::from_raw_parts_mut(info.heap_start as *mut u64, rounds) };
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
        *sample = sys::guest_clock(unsafe { read_volatile(&log[0].tsc) }).saturating_sub(start);
    }
    let noise_taken = count(&log[NOISE_VECTOR_INDEX]);
    if let Some(noise) = &noise {
        noise.msix.mask(0, true);
    }
    device.msix.mask(0, true);
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
    let [first, second] = find_devices(info.pci_ecam);
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
