//! virtio-blk's request parsing (devices/src/virtio/block.rs): request headers, data
//! buffers and status bytes on rings a guest wrote, served against a real image file
//! (a memfd) that may be read-only.
#![no_main]

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;

use devices::virtio::block::{BlockConfig, VirtioBlock, default_id};
use kumo_fuzz::{Input, activate, guest_memory};
use libfuzzer_sys::fuzz_target;

/// The image: 16 sectors, each byte its offset's low bits.
const IMAGE_SECTORS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let readonly = input.u8() & 1 == 1;
    let mut setup = Input::new(input.bytes(16));
    let passes = 1 + input.u8() % 4;
    let mem = guest_memory(input.rest());
    let Ok(blk) = VirtioBlock::new(
        BlockConfig {
            readonly,
            id: default_id(0),
            queue_size: 256,
        },
        image(),
        mem,
    ) else {
        return;
    };
    if !activate(&blk, &mut setup) {
        return;
    }
    for _ in 0..passes {
        let _ = blk.process();
    }
});

fn image() -> File {
    // SAFETY: a NUL-terminated name and no flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"kumo-fuzz-blk".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create failed");
    // SAFETY: a fresh descriptor this function owns and hands to the File.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let bytes: Vec<u8> = (0..IMAGE_SECTORS * 512).map(|i| i as u8).collect();
    file.write_all(&bytes).expect("memfd write");
    file
}
