//! PVH ELF inspection (pure, bounds-checked, never panics) and loading, for ELF64 and
//! ELF32 kernels alike: both carry the same Xen note naming a 32-bit entry point, and
//! the headers differ only in field widths and offsets (see [`Format`]).

use vm_memory::GuestMemoryMmap;

use crate::Error;
use crate::layout::{BOOT_DATA, MIB};
use crate::memory_map::LOW_RAM_MAX;

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
/// `XEN_ELFNOTE_PHYS32_ENTRY`.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// Enough of `e_ident` to name the class and byte order.
const IDENT_SIZE: usize = 6;

/// Where the fields kumo reads sit in one ELF class's headers.
struct Format {
    name: &'static str,
    /// `e_machine` values accepted for this class.
    machines: &'static [u16],
    ehdr_size: usize,
    phdr_size: usize,
    /// Width of an address or offset field: 4 or 8 bytes.
    word: usize,
    e_phoff: usize,
    e_phentsize: usize,
    e_phnum: usize,
    p_offset: usize,
    p_paddr: usize,
    p_filesz: usize,
    p_memsz: usize,
}

const ELF64: Format = Format {
    name: "ELF64",
    machines: &[EM_X86_64],
    ehdr_size: 64,
    phdr_size: 56,
    word: 8,
    e_phoff: 32,
    e_phentsize: 54,
    e_phnum: 56,
    p_offset: 8,
    p_paddr: 24,
    p_filesz: 32,
    p_memsz: 40,
};

/// 32-bit PVH kernels are `EM_386` (Linux's and Xen's i386 builds); an ELF32 of x86-64
/// code (`objcopy -O elf32-x86-64`) enters the same 32-bit way.
const ELF32: Format = Format {
    name: "ELF32",
    machines: &[EM_386, EM_X86_64],
    ehdr_size: 52,
    phdr_size: 32,
    word: 4,
    e_phoff: 28,
    e_phentsize: 42,
    e_phnum: 44,
    p_offset: 4,
    p_paddr: 12,
    p_filesz: 16,
    p_memsz: 20,
};

impl Format {
    /// The address-sized field at `off` (the caller checked the bounds).
    fn word_at(&self, b: &[u8], off: usize) -> u64 {
        if self.word == 8 {
            u64_at(b, off)
        } else {
            u64::from(u32_at(b, off))
        }
    }
}

/// A loadable segment: `[paddr, paddr + memsz)` in guest-physical memory, its first
/// `filesz` bytes from the file at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub paddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub memsz: u64,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.paddr + self.memsz // checked in `inspect`
    }
}

/// What kumo needs to know about a PVH kernel before loading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// The 32-bit PVH entry point from the Xen note.
    pub entry: u32,
    pub segments: Vec<Segment>,
    /// One past the highest byte of the image (`max(paddr + memsz)`).
    pub end: u64,
    /// True for an ELF32 image.
    pub elf32: bool,
}

fn malformed(what: impl Into<String>) -> Error {
    Error::MalformedElf(what.into())
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Parses and checks the ELF headers of a PVH kernel (ELF64 or ELF32). Every offset is
/// checked against the file before it is read, so malformed input yields a typed error,
/// never a panic.
pub fn inspect(image: &[u8]) -> Result<KernelInfo, Error> {
    if image.len() < 4 || &image[..4] != b"\x7fELF" {
        return Err(Error::NotElf);
    }
    let truncated = |needed: usize| {
        malformed(format!(
            "truncated: {} bytes, shorter than an ELF header ({needed} bytes)",
            image.len()
        ))
    };
    if image.len() < IDENT_SIZE {
        return Err(truncated(IDENT_SIZE));
    }
    let f = match image[4] {
        2 => &ELF64,
        1 => &ELF32,
        c => return Err(malformed(format!("unknown ELF class {c}"))),
    };
    if image.len() < f.ehdr_size {
        return Err(truncated(f.ehdr_size));
    }
    if image[5] != 1 {
        return Err(malformed("not little-endian (EI_DATA != ELFDATA2LSB)"));
    }
    let machine = u16_at(image, 18);
    if !f.machines.contains(&machine) {
        return Err(malformed(format!(
            "e_machine is {machine}, not x86 ({} accepts {:?})",
            f.name, f.machines
        )));
    }
    let phoff = f.word_at(image, f.e_phoff);
    let phentsize = u16_at(image, f.e_phentsize);
    let phnum = u16_at(image, f.e_phnum);
    if usize::from(phentsize) != f.phdr_size {
        return Err(malformed(format!(
            "program header entry size is {phentsize}, expected {} for {}",
            f.phdr_size, f.name
        )));
    }
    if phnum == 0 {
        return Err(malformed("no program headers"));
    }
    let ph_end = (phnum as u64)
        .checked_mul(f.phdr_size as u64)
        .and_then(|n| n.checked_add(phoff))
        .filter(|&end| end <= image.len() as u64);
    if ph_end.is_none() || phoff < f.ehdr_size as u64 {
        return Err(malformed(format!(
            "{phnum} program headers at offset {phoff:#x} do not fit in the file ({} bytes)",
            image.len()
        )));
    }

    let mut segments = Vec::new();
    let mut entry = None;
    for i in 0..usize::from(phnum) {
        let ph = &image[phoff as usize + i * f.phdr_size..][..f.phdr_size];
        let p_type = u32_at(ph, 0);
        let offset = f.word_at(ph, f.p_offset);
        let paddr = f.word_at(ph, f.p_paddr);
        let filesz = f.word_at(ph, f.p_filesz);
        let memsz = f.word_at(ph, f.p_memsz);
        let file_end = offset
            .checked_add(filesz)
            .filter(|&e| e <= image.len() as u64);
        match p_type {
            PT_LOAD => {
                if file_end.is_none() {
                    return Err(malformed(format!(
                        "segment {i}: file bytes [{offset:#x}, +{filesz:#x}) run past the end of the file ({} bytes)",
                        image.len()
                    )));
                }
                if filesz > memsz {
                    return Err(malformed(format!(
                        "segment {i}: file size {filesz:#x} exceeds memory size {memsz:#x}"
                    )));
                }
                if paddr.checked_add(memsz).is_none() {
                    return Err(malformed(format!(
                        "segment {i}: address {paddr:#x} + size {memsz:#x} overflows"
                    )));
                }
                if memsz > 0 {
                    segments.push(Segment {
                        paddr,
                        offset,
                        filesz,
                        memsz,
                    });
                }
            }
            PT_NOTE if entry.is_none() => {
                let Some(end) = file_end else {
                    return Err(malformed(format!(
                        "note segment {i}: [{offset:#x}, +{filesz:#x}) runs past the end of the file"
                    )));
                };
                entry = find_pvh_note(&image[offset as usize..end as usize])?;
            }
            _ => {}
        }
    }
    if segments.is_empty() {
        return Err(malformed("no loadable (PT_LOAD) segment"));
    }
    check_disjoint(&segments)?;
    let entry = entry.ok_or(Error::NoPvhNote)?;
    let end = segments.iter().map(Segment::end).max().unwrap_or(0);
    Ok(KernelInfo {
        entry,
        segments,
        end,
        elf32: std::ptr::eq(f, &ELF32),
    })
}

/// Refuses segments that share guest memory: which one "wins" would depend on the
/// loader's order, so the image means nothing definite.
fn check_disjoint(segments: &[Segment]) -> Result<(), Error> {
    let mut sorted: Vec<&Segment> = segments.iter().collect();
    sorted.sort_by_key(|s| s.paddr);
    for pair in sorted.windows(2) {
        if pair[1].paddr < pair[0].end() {
            return Err(malformed(format!(
                "loadable segments [{:#x}, {:#x}) and [{:#x}, {:#x}) overlap",
                pair[0].paddr,
                pair[0].end(),
                pair[1].paddr,
                pair[1].end()
            )));
        }
    }
    Ok(())
}

/// Scans the notes of one PT_NOTE segment for the Xen PHYS32 entry.
fn find_pvh_note(notes: &[u8]) -> Result<Option<u32>, Error> {
    let mut at = 0usize;
    while notes.len() - at >= 12 {
        let namesz = u32_at(notes, at) as usize;
        let descsz = u32_at(notes, at + 4) as usize;
        let n_type = u32_at(notes, at + 8);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(namesz.next_multiple_of(4));
        let next = desc_at.and_then(|d| d.checked_add(descsz.next_multiple_of(4)));
        let (Some(desc_at), Some(next)) = (desc_at, next) else {
            return Err(malformed("note sizes overflow"));
        };
        if desc_at.saturating_add(descsz) > notes.len() {
            return Err(malformed(format!(
                "a note (type {n_type}) runs past the end of its segment"
            )));
        }
        if n_type == XEN_ELFNOTE_PHYS32_ENTRY && notes[name_at..name_at + namesz] == *b"Xen\0" {
            if descsz < 4 {
                return Err(malformed(format!(
                    "the XEN_ELFNOTE_PHYS32_ENTRY note holds {descsz} bytes, not a 32-bit address"
                )));
            }
            return Ok(Some(u32_at(notes, desc_at)));
        }
        at = next.min(notes.len());
    }
    Ok(None)
}

/// Checks the image against `low_ram` bytes of guest RAM below the 32-bit hole (where
/// a kernel must lie) and kumo's boot data.
pub fn check_layout(info: &KernelInfo, low_ram: u64) -> Result<(), Error> {
    let max = LOW_RAM_MAX;
    for s in &info.segments {
        if s.end() > max {
            return Err(Error::KernelLayout(format!(
                "segment [{:#x}, {:#x}) lies above the guest RAM below the 32-bit hole ({} MiB)",
                s.paddr,
                s.end(),
                max / MIB
            )));
        }
        if let Some((lo, hi, what)) = BOOT_DATA
            .iter()
            .find(|(lo, hi, _)| s.paddr < *hi && *lo < s.end())
        {
            return Err(Error::KernelLayout(format!(
                "segment [{:#x}, {:#x}) overlaps {what} at [{lo:#x}, {hi:#x})",
                s.paddr,
                s.end()
            )));
        }
    }
    let entry = u64::from(info.entry);
    if !info
        .segments
        .iter()
        .any(|s| entry >= s.paddr && entry < s.end())
    {
        return Err(Error::KernelLayout(format!(
            "the PVH entry point {entry:#x} is not inside any loadable segment"
        )));
    }
    if info.end > low_ram {
        return Err(Error::MemoryTooSmall {
            memory_mib: low_ram / MIB,
            needed_mib: info.end.div_ceil(MIB),
        });
    }
    Ok(())
}

/// Loads the (already inspected and checked) image into guest memory and returns the
/// PVH entry point. Each segment's file bytes are copied to its physical address; the
/// rest of its memory size (bss) is left as it is, zero, because guest RAM is a fresh
/// memfd when a kernel is loaded (zeroing it again would only fault its pages in).
pub fn load(mem: &GuestMemoryMmap, image: &[u8], info: &KernelInfo) -> Result<u32, Error> {
    for s in &info.segments {
        // `inspect` checked that the file range lies inside `image`.
        let bytes = &image[s.offset as usize..(s.offset + s.filesz) as usize];
        crate::machine::write(mem, s.paddr, bytes)
            .map_err(|e| Error::GuestMemory(format!("loading the kernel: {e}")))?;
    }
    Ok(info.entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{LOAD_ADDRESS, PvhImage};
    use proptest::prelude::*;

    const CODE: &[u8] = &[0xf4];

    /// The same builder in both classes: every test below holds for ELF64 and ELF32.
    fn both(code: &[u8]) -> [PvhImage; 2] {
        [PvhImage::new(code), PvhImage::new(code).elf32()]
    }

    #[test]
    fn a_valid_image_yields_its_entry_and_segment() {
        for (image, elf32) in both(CODE).into_iter().zip([false, true]) {
            let info = inspect(&image.build()).unwrap();
            assert_eq!(info.entry, LOAD_ADDRESS as u32);
            assert_eq!(info.elf32, elf32);
            assert_eq!(
                info.segments,
                vec![Segment {
                    paddr: LOAD_ADDRESS,
                    offset: 0x200,
                    filesz: 1,
                    memsz: 1
                }]
            );
            assert_eq!(info.end, LOAD_ADDRESS + 1);
            let info = inspect(&image.bss(0x5000).build()).unwrap();
            assert_eq!(info.end, LOAD_ADDRESS + 0x5001);
        }
    }

    #[test]
    fn the_two_classes_differ_only_in_their_headers() {
        let [e64, e32] = both(&[0x90; 8]).map(|i| i.build());
        assert_ne!(e64, e32);
        assert_eq!(e64[4], 2);
        assert_eq!(e32[4], 1);
        let (a, b) = (inspect(&e64).unwrap(), inspect(&e32).unwrap());
        assert_eq!((a.entry, a.segments, a.end), (b.entry, b.segments, b.end));
    }

    #[test]
    fn not_an_elf() {
        assert!(matches!(inspect(b""), Err(Error::NotElf)));
        assert!(matches!(inspect(b"#!/bin/sh\n"), Err(Error::NotElf)));
        for image in both(CODE) {
            assert!(matches!(
                inspect(&image.bad_magic().build()),
                Err(Error::NotElf)
            ));
        }
    }

    #[test]
    fn no_note_is_not_pvh() {
        for image in both(CODE) {
            let e = inspect(&image.without_pvh_note().build()).unwrap_err();
            assert!(matches!(e, Error::NoPvhNote), "{e}");
            assert!(
                e.to_string()
                    .contains("no XEN_ELFNOTE_PHYS32_ENTRY note: not a PVH kernel")
            );
        }
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        for image in both(&[0x90; 64]) {
            let full = image.build();
            for len in 0..full.len() {
                match inspect(&full[..len]) {
                    Err(Error::NotElf) => assert!(len < 4),
                    Err(Error::MalformedElf(_)) => {}
                    other => panic!("truncated to {len}: {other:?}"),
                }
            }
            assert!(inspect(&full).is_ok());
        }
    }

    #[test]
    fn corrupting_any_header_byte_never_panics() {
        for image in both(&[0x90; 16]) {
            let full = image.build();
            for i in 0..0x120.min(full.len()) {
                for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                    let mut bad = full.clone();
                    bad[i] = v;
                    let _ = inspect(&bad);
                }
            }
        }
    }

    #[test]
    fn unknown_class_and_wrong_machine_are_named() {
        let mut bad = PvhImage::new(CODE).build();
        bad[4] = 3;
        let e = inspect(&bad).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("unknown ELF class 3")),
            "{e}"
        );
        for image in both(CODE) {
            let mut bad = image.build();
            bad[18] = 40; // EM_ARM
            let e = inspect(&bad).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("e_machine is 40")),
                "{e}"
            );
        }
        // An ELF32 header read as ELF64 (or the reverse) has the wrong entry size.
        let mut e32 = PvhImage::new(CODE).elf32().build();
        e32[4] = 2;
        let e = inspect(&e32).unwrap_err();
        assert!(matches!(e, Error::MalformedElf(_)), "{e}");
    }

    #[test]
    fn malformed_variants_say_what() {
        for image in both(CODE) {
            let e = inspect(&image.clone().phoff(0xffff_ffff).build()).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("program headers")),
                "{e}"
            );
            let e = inspect(&image.clone().note_desc_size(2).build()).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("PHYS32")),
                "{e}"
            );
            let e = inspect(&image.clone().segment_file_size(0xffff_0000).build()).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("past the end")),
                "{e}"
            );
            let e = inspect(&image.phoff(8).build()).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("program headers")),
                "{e}"
            );
        }
    }

    #[test]
    fn overlapping_segments_are_refused_and_adjacent_ones_accepted() {
        for image in both(&[0x90; 64]) {
            let e = inspect(&image.clone().overlapping_load(32).build()).unwrap_err();
            assert!(
                matches!(e, Error::MalformedElf(ref m) if m.contains("overlap")),
                "{e}"
            );
            let info = inspect(&image.overlapping_load(64).build()).unwrap();
            assert_eq!(info.segments.len(), 2);
            assert_eq!(info.end, LOAD_ADDRESS + 128);
        }
    }

    #[test]
    fn layout_checks_memory_boot_data_and_entry() {
        let mem = 16 * MIB;
        for image in both(CODE) {
            let ok = inspect(&image.build()).unwrap();
            check_layout(&ok, mem).unwrap();

            let high = inspect(&image.clone().load_address(0x200_0000).build()).unwrap();
            match check_layout(&high, mem) {
                Err(Error::MemoryTooSmall {
                    memory_mib: 16,
                    needed_mib: 33,
                }) => {}
                other => panic!("{other:?}"),
            }

            let low = inspect(&image.clone().load_address(0x20100).build()).unwrap();
            let e = check_layout(&low, mem).unwrap_err();
            assert!(e.to_string().contains("command line"), "{e}");

            let off = inspect(&image.entry(0x300000).build()).unwrap();
            let e = check_layout(&off, mem).unwrap_err();
            assert!(e.to_string().contains("entry point 0x300000"), "{e}");
        }
        // Only ELF64 addresses reach above 4 GiB.
        let beyond = inspect(&PvhImage::new(CODE).load_address(0x1_0000_0000).build()).unwrap();
        assert!(matches!(
            check_layout(&beyond, mem),
            Err(Error::KernelLayout(_))
        ));
    }

    proptest! {
        /// Any header field of either class set to any value: a typed answer, never a
        /// panic, and whatever is accepted describes segments inside the file.
        #[test]
        fn arbitrary_header_words_never_panic(
            elf32 in any::<bool>(),
            at in 0usize..0x200,
            value in any::<u32>(),
            wide in any::<bool>(),
        ) {
            let image = if elf32 { PvhImage::new(&[0x90; 32]).elf32() } else { PvhImage::new(&[0x90; 32]) };
            let mut bad = image.build();
            let bytes = if wide { 4 } else { 1 };
            let end = (at + bytes).min(bad.len());
            bad[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
            match inspect(&bad) {
                Ok(info) => {
                    for s in &info.segments {
                        prop_assert!(s.offset + s.filesz <= bad.len() as u64);
                        prop_assert!(s.filesz <= s.memsz);
                    }
                }
                Err(Error::NotElf | Error::NoPvhNote | Error::MalformedElf(_)) => {}
                Err(other) => prop_assert!(false, "unexpected error {other}"),
            }
        }

        /// Arbitrary bytes behind a valid ident of either class.
        #[test]
        fn arbitrary_bodies_never_panic(
            class in 1u8..=2,
            body in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let mut image = b"\x7fELF".to_vec();
            image.extend_from_slice(&[class, 1, 1]);
            image.extend_from_slice(&body);
            let _ = inspect(&image);
        }
    }
}
