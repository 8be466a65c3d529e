//! The bzImage wrapper (src/bzimage.rs): it parses a guest ELF (its segments, the
//! Linux entry's magic and the segment sizes it was linked with) before wrapping it.
//! Any ELF must give a typed error or an image whose header says what it holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(image) = kumo::bzimage::from_guest_elf(data) else {
        return;
    };
    // What a loader checks: the boot flag, "HdrS", and syssize covering the rest.
    assert_eq!(&image[0x1fe..0x200], &[0x55, 0xaa]);
    assert_eq!(&image[0x202..0x206], b"HdrS");
    let setup = (usize::from(image[0x1f1]) + 1) * 512;
    let syssize = u32::from_le_bytes(image[0x1f4..0x1f8].try_into().unwrap()) as usize;
    assert_eq!(syssize, (image.len() - setup).div_ceil(16));
});
