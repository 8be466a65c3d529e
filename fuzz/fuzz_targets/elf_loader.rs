//! The PVH/ELF loader (hv/src/elf.rs) and the boot data built around it
//! (hv/src/boot.rs): any file given as `--kernel` is inspected, checked against guest
//! RAM and, if it passes, loaded; then the modules are placed after it and the boot
//! blobs (start info, module list, memory map, command line) are built.
#![no_main]

use hv::boot;
use hv::elf;
use libfuzzer_sys::fuzz_target;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Guest RAM below the 32-bit hole the loader checks kernels against.
const LOW_RAM: u64 = 8 << 20;

fuzz_target!(|data: &[u8]| {
    // The first bytes are the command line and module sizes; the rest is the image.
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(0);
    let (head, image) = (&data[..split], &data[(split + 1).min(data.len())..]);
    let Ok(info) = elf::inspect(image) else {
        return;
    };
    for s in &info.segments {
        assert!(
            s.offset
                .checked_add(s.filesz)
                .is_some_and(|end| end <= image.len() as u64)
        );
    }
    if elf::check_layout(&info, LOW_RAM).is_err() {
        return;
    }
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), LOW_RAM as usize)])
        .expect("an anonymous mapping");
    let entry = elf::load(&mem, image, &info).expect("a checked image loads");
    assert_eq!(entry, info.entry);
    let sizes: Vec<u64> = head
        .chunks(4)
        .take(4)
        .map(|c| c.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)) << 8)
        .collect();
    let cmdline = String::from_utf8_lossy(head);
    if let Some((modules, _end)) = boot::place_modules(info.end, &sizes) {
        let _ = boot::boot_blobs(LOW_RAM, &cmdline, &modules);
    }
});
