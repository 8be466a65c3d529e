//! kumo's guest as a Linux boot protocol image (a "bzImage"), for loaders that start
//! kernels that way: rust-hypervisor-firmware from a disk, Cloud Hypervisor- or
//! Firecracker-style direct boot. The guest ELF is the same one kumo and QEMU boot
//! through PVH; this only wraps its two loadable segments behind a setup header.
//!
//! Layout (Documentation/arch/x86/boot.rst, protocol 2.12):
//! - the real-mode part: `SETUP_SECTS + 1` sectors holding the boot sector's signature
//!   and the setup header (no real-mode code runs: a 16-bit entry only halts);
//! - the protected-mode part, which a loader copies to some address L and enters at
//!   L + 0x200 in 64-bit mode: a `HEAD_SIZE` head with the guest's Linux entry
//!   (`.linux_entry`, guests/kernel/src/boot.S) at 0x200, then the supervisor
//!   segment's file bytes, then the runtime segment's. That entry moves them to their
//!   link addresses itself, so any L it accepts works (it halts on those it does not).

use anyhow::{Context, Result, bail, ensure};

/// Setup sectors after the boot sector: room for the whole setup header.
const SETUP_SECTS: u8 = 1;
const SECTOR: usize = 512;
/// The protected-mode part starts with this head (boot.S: `LINUX_HEAD_SIZE`).
const HEAD_SIZE: usize = 0x1000;
/// Where a 64-bit loader enters the protected-mode part (`startup_64`'s offset).
const ENTRY64_OFFSET: usize = 0x200;
/// Where the supervisor segment is linked, and its Linux entry (guests/kernel/kernel.ld).
const KERNEL_BASE: u64 = 0x10_0000;
const LINUX_ENTRY: u64 = 0x10_0800;
/// The Linux entry's code may fill the rest of its page.
const LINUX_ENTRY_MAX: usize = 0x1000 - 0x800;
/// The entry begins `jmp 1f; "KUMOLNX1"; u32 supervisor file size; u32 runtime file size`.
const ENTRY_MAGIC: &[u8; 8] = b"KUMOLNX1";

/// Setup header fields: offsets in the real-mode part.
mod hdr {
    pub const SETUP_SECTS: usize = 0x1f1;
    pub const SYSSIZE: usize = 0x1f4;
    pub const VID_MODE: usize = 0x1fa;
    pub const BOOT_FLAG: usize = 0x1fe;
    pub const JUMP: usize = 0x200;
    pub const HEADER: usize = 0x202;
    pub const VERSION: usize = 0x206;
    pub const KERNEL_VERSION: usize = 0x20e;
    pub const LOADFLAGS: usize = 0x211;
    pub const CODE32_START: usize = 0x214;
    pub const INITRD_ADDR_MAX: usize = 0x22c;
    pub const KERNEL_ALIGNMENT: usize = 0x230;
    pub const RELOCATABLE_KERNEL: usize = 0x234;
    pub const MIN_ALIGNMENT: usize = 0x235;
    pub const XLOADFLAGS: usize = 0x236;
    pub const CMDLINE_SIZE: usize = 0x238;
    pub const PREF_ADDRESS: usize = 0x258;
    pub const INIT_SIZE: usize = 0x260;
    /// Past the last field of protocol 2.12 (`handover_offset`).
    pub const END: usize = 0x268;
}
const PROTOCOL_VERSION: u16 = 0x020c;
const LOADED_HIGH: u8 = 1;
const XLF_KERNEL_64: u16 = 1;
/// The guest reads at most this much command line (guests/user `CMDLINE_MAX`).
const CMDLINE_SIZE: u32 = 4095;
/// The entry copies the supervisor to 1 MiB, so it must run from above it: loaders that
/// honour `pref_address` (and rust-hypervisor-firmware, which loads at 2 MiB) do.
const PREF_ADDRESS: u64 = 0x20_0000;
/// Real-mode code at this offset: `cli; hlt`, and back to the `hlt` (the 16-bit entry
/// is not supported).
const REAL_MODE_HALT: usize = 0x280;
const VERSION_STRING_AT: usize = 0x2a0;
const VERSION_STRING: &[u8] = b"kumo NPB guest (PVH and Linux boot protocol)\0";

/// Wraps kumo's guest ELF (the PVH image `guests/` builds) as a bzImage.
pub fn from_guest_elf(elf: &[u8]) -> Result<Vec<u8>> {
    let info = hv::elf::inspect(elf).context("the guest ELF")?;
    let [kernel, user] = info.segments[..] else {
        bail!(
            "the guest ELF has {} loadable segments, not 2 (supervisor, runtime)",
            info.segments.len()
        );
    };
    ensure!(
        kernel.paddr == KERNEL_BASE && user.paddr == kumo_abi::USER_IMAGE_BASE,
        "the guest's segments are at {:#x} and {:#x}, not {KERNEL_BASE:#x} and {:#x}",
        kernel.paddr,
        user.paddr,
        kumo_abi::USER_IMAGE_BASE
    );
    let bytes = |s: hv::elf::Segment| &elf[s.offset as usize..(s.offset + s.filesz) as usize];
    let (kernel_bytes, user_bytes) = (bytes(kernel), bytes(user));
    let entry_at = (LINUX_ENTRY - KERNEL_BASE) as usize;
    let entry = kernel_bytes
        .get(entry_at..entry_at + LINUX_ENTRY_MAX)
        .context("the guest's supervisor segment ends before its Linux entry")?;
    ensure!(
        entry[2..10] == ENTRY_MAGIC[..],
        "no Linux entry at {LINUX_ENTRY:#x} in the guest (magic {:?} missing)",
        std::str::from_utf8(ENTRY_MAGIC).unwrap_or_default()
    );
    let linked = |at: usize| u64::from(u32::from_le_bytes(entry[at..at + 4].try_into().unwrap()));
    ensure!(
        linked(10) == kernel.filesz && linked(14) == user.filesz,
        "the Linux entry was linked for segments of {:#x} and {:#x} bytes, the ELF has {:#x} and {:#x}",
        linked(10),
        linked(14),
        kernel.filesz,
        user.filesz
    );

    let mut protected = vec![0u8; HEAD_SIZE];
    protected[0] = 0xf4; // the 32-bit entry (unsupported): hlt, and back to it
    protected[1..3].copy_from_slice(&[0xeb, 0xfd]);
    protected[ENTRY64_OFFSET..ENTRY64_OFFSET + LINUX_ENTRY_MAX].copy_from_slice(entry);
    protected.extend_from_slice(kernel_bytes);
    protected.extend_from_slice(user_bytes);

    let setup_len = (usize::from(SETUP_SECTS) + 1) * SECTOR;
    let mut image = vec![0u8; setup_len];
    let put16 = |b: &mut [u8], at: usize, v: u16| b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 = |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 = |b: &mut [u8], at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let protected_len = u32::try_from(protected.len()).context("the guest is over 4 GiB")?;
    image[hdr::SETUP_SECTS] = SETUP_SECTS;
    put32(&mut image, hdr::SYSSIZE, protected_len.div_ceil(16));
    put16(&mut image, hdr::VID_MODE, 0xffff); // "normal"
    put16(&mut image, hdr::BOOT_FLAG, 0xaa55);
    // A short jump over the header to the halt.
    image[hdr::JUMP] = 0xeb;
    image[hdr::JUMP + 1] = (REAL_MODE_HALT - (hdr::JUMP + 2)) as u8;
    image[hdr::HEADER..hdr::HEADER + 4].copy_from_slice(b"HdrS");
    put16(&mut image, hdr::VERSION, PROTOCOL_VERSION);
    put16(
        &mut image,
        hdr::KERNEL_VERSION,
        (VERSION_STRING_AT - 0x200) as u16,
    );
    image[hdr::LOADFLAGS] = LOADED_HIGH;
    put32(&mut image, hdr::CODE32_START, KERNEL_BASE as u32);
    put32(&mut image, hdr::INITRD_ADDR_MAX, 0x7fff_ffff);
    put32(&mut image, hdr::KERNEL_ALIGNMENT, PREF_ADDRESS as u32);
    image[hdr::RELOCATABLE_KERNEL] = 1;
    image[hdr::MIN_ALIGNMENT] = 12; // 4 KiB
    put16(&mut image, hdr::XLOADFLAGS, XLF_KERNEL_64);
    put32(&mut image, hdr::CMDLINE_SIZE, CMDLINE_SIZE);
    put64(&mut image, hdr::PREF_ADDRESS, PREF_ADDRESS);
    put32(&mut image, hdr::INIT_SIZE, protected_len);
    image[REAL_MODE_HALT..REAL_MODE_HALT + 4].copy_from_slice(&[0xfa, 0xf4, 0xeb, 0xfd]);
    image[VERSION_STRING_AT..VERSION_STRING_AT + VERSION_STRING.len()]
        .copy_from_slice(VERSION_STRING);
    const { assert!(hdr::END <= REAL_MODE_HALT) };
    image.extend_from_slice(&protected);
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_vmm::guest::EMBEDDED_GUEST;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn the_guest_wraps_with_the_header_rust_hypervisor_firmware_checks() {
        let image = from_guest_elf(EMBEDDED_GUEST).unwrap();
        // What the firmware's bzimage.rs checks before loading.
        assert_eq!(&image[0x1fe..0x200], &[0x55, 0xaa]);
        assert_eq!(&image[0x202..0x206], b"HdrS");
        assert!(u16::from_le_bytes([image[0x206], image[0x207]]) >= 0x205);
        assert_eq!(image[0x234], 1, "relocatable");
        assert_eq!(u32_at(&image, 0x238), 4095, "cmdline_size");
        // It loads everything after (setup_sects + 1) sectors and enters at +0x200.
        let setup = (usize::from(image[0x1f1]) + 1) * 512;
        let protected = &image[setup..];
        assert_eq!(u32_at(&image, 0x1f4) as usize, protected.len().div_ceil(16));
        assert_eq!(&protected[0x202..0x20a], b"KUMOLNX1");
    }

    #[test]
    fn the_segments_follow_the_head_as_the_entry_expects() {
        let image = from_guest_elf(EMBEDDED_GUEST).unwrap();
        let info = hv::elf::inspect(EMBEDDED_GUEST).unwrap();
        let protected = &image[1024..];
        let seg = |i: usize| {
            let s = info.segments[i];
            &EMBEDDED_GUEST[s.offset as usize..(s.offset + s.filesz) as usize]
        };
        let (kernel, user) = (seg(0), seg(1));
        assert_eq!(&protected[HEAD_SIZE..HEAD_SIZE + kernel.len()], kernel);
        assert_eq!(&protected[HEAD_SIZE + kernel.len()..], user);
        // The sizes the entry was linked with are the segments' sizes.
        let entry = &protected[ENTRY64_OFFSET..];
        assert_eq!(u32_at(entry, 10) as usize, kernel.len());
        assert_eq!(u32_at(entry, 14) as usize, user.len());
    }

    #[test]
    fn other_elfs_are_refused() {
        let tiny = hv::testing::PvhImage::new(&[0xf4]).build();
        let err = from_guest_elf(&tiny).unwrap_err().to_string();
        assert!(
            err.contains("loadable segments") || err.contains("not"),
            "{err}"
        );
        assert!(from_guest_elf(b"not an elf").is_err());
        // The guest with its entry's magic broken.
        let mut broken = EMBEDDED_GUEST.to_vec();
        let info = hv::elf::inspect(EMBEDDED_GUEST).unwrap();
        let at = info.segments[0].offset as usize + (LINUX_ENTRY - KERNEL_BASE) as usize + 2;
        broken[at] ^= 0xff;
        let err = from_guest_elf(&broken).unwrap_err().to_string();
        assert!(err.contains("no Linux entry"), "{err}");
    }
}
