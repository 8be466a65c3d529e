//! PVH ELF inspection (pure, bounds-checked, never panics) and loading through
//! linux-loader.

use std::io::Cursor;

use linux_loader::loader::KernelLoader;
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use vm_memory::GuestMemoryMmap;

use crate::Error;
use crate::layout::{BOOT_DATA, MAX_MEMORY_MIB, MIB};

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const EM_X86_64: u16 = 62;
/// `XEN_ELFNOTE_PHYS32_ENTRY`.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// A loadable segment: `[paddr, paddr + memsz)` in guest-physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub paddr: u64,
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

/// Parses and checks the ELF headers of a PVH kernel. Every offset is checked against
/// the file before it is read, so malformed input yields a typed error, never a panic.
pub fn inspect(image: &[u8]) -> Result<KernelInfo, Error> {
    if image.len() < 4 || &image[..4] != b"\x7fELF" {
        return Err(Error::NotElf);
    }
    if image.len() < EHDR_SIZE {
        return Err(malformed(format!(
            "truncated: {} bytes, shorter than an ELF header ({EHDR_SIZE} bytes)",
            image.len()
        )));
    }
    match image[4] {
        2 => {}
        1 => {
            return Err(malformed(
                "32-bit ELF (ELFCLASS32); kumo loads ELF64 PVH kernels",
            ));
        }
        c => return Err(malformed(format!("unknown ELF class {c}"))),
    }
    if image[5] != 1 {
        return Err(malformed("not little-endian (EI_DATA != ELFDATA2LSB)"));
    }
    let machine = u16_at(image, 18);
    if machine != EM_X86_64 {
        return Err(malformed(format!(
            "e_machine is {machine}, not x86-64 ({EM_X86_64})"
        )));
    }
    let phoff = u64_at(image, 32);
    let phentsize = u16_at(image, 54);
    let phnum = u16_at(image, 56);
    if usize::from(phentsize) != PHDR_SIZE {
        return Err(malformed(format!(
            "program header entry size is {phentsize}, expected {PHDR_SIZE}"
        )));
    }
    if phnum == 0 {
        return Err(malformed("no program headers"));
    }
    let ph_end = (phnum as u64)
        .checked_mul(PHDR_SIZE as u64)
        .and_then(|n| n.checked_add(phoff))
        .filter(|&end| end <= image.len() as u64);
    if ph_end.is_none() || phoff < EHDR_SIZE as u64 {
        return Err(malformed(format!(
            "{phnum} program headers at offset {phoff:#x} do not fit in the file ({} bytes)",
            image.len()
        )));
    }

    let mut segments = Vec::new();
    let mut entry = None;
    for i in 0..usize::from(phnum) {
        let ph = &image[phoff as usize + i * PHDR_SIZE..][..PHDR_SIZE];
        let p_type = u32_at(ph, 0);
        let offset = u64_at(ph, 8);
        let paddr = u64_at(ph, 24);
        let filesz = u64_at(ph, 32);
        let memsz = u64_at(ph, 40);
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

/// Checks the image against guest memory of `mem_size` bytes and kumo's boot data.
pub fn check_layout(info: &KernelInfo, mem_size: u64) -> Result<(), Error> {
    let max = MAX_MEMORY_MIB * MIB;
    for s in &info.segments {
        if s.end() > max {
            return Err(Error::KernelLayout(format!(
                "segment [{:#x}, {:#x}) lies above the highest guest RAM kumo supports ({MAX_MEMORY_MIB} MiB)",
                s.paddr,
                s.end()
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
    if info.end > mem_size {
        return Err(Error::MemoryTooSmall {
            memory_mib: mem_size / MIB,
            needed_mib: info.end.div_ceil(MIB),
        });
    }
    Ok(())
}

/// Loads the (already inspected and checked) image into guest memory with linux-loader
/// and returns the PVH entry point.
pub fn load(mem: &GuestMemoryMmap, image: &[u8], info: &KernelInfo) -> Result<u32, Error> {
    let result = Elf::load(mem, None, &mut Cursor::new(image), None)
        .map_err(|e| malformed(format!("{e}")))?;
    match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) if addr.0 == u64::from(info.entry) => {}
        other => {
            // linux-loader keeps only the last PT_NOTE's verdict; ours scans all of them.
            tracing::debug!(
                "linux-loader reports {other}; using the note found at {:#x}",
                info.entry
            );
        }
    }
    Ok(info.entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{LOAD_ADDRESS, PvhImage};

    const CODE: &[u8] = &[0xf4];

    #[test]
    fn a_valid_image_yields_its_entry_and_segment() {
        let info = inspect(&PvhImage::new(CODE).build()).unwrap();
        assert_eq!(info.entry, LOAD_ADDRESS as u32);
        assert_eq!(
            info.segments,
            vec![Segment {
                paddr: LOAD_ADDRESS,
                filesz: 1,
                memsz: 1
            }]
        );
        assert_eq!(info.end, LOAD_ADDRESS + 1);
        let info = inspect(&PvhImage::new(CODE).bss(0x5000).build()).unwrap();
        assert_eq!(info.end, LOAD_ADDRESS + 0x5001);
    }

    #[test]
    fn not_an_elf() {
        assert!(matches!(inspect(b""), Err(Error::NotElf)));
        assert!(matches!(inspect(b"#!/bin/sh\n"), Err(Error::NotElf)));
        assert!(matches!(
            inspect(&PvhImage::new(CODE).bad_magic().build()),
            Err(Error::NotElf)
        ));
    }

    #[test]
    fn no_note_is_not_pvh() {
        let e = inspect(&PvhImage::new(CODE).without_pvh_note().build()).unwrap_err();
        assert!(matches!(e, Error::NoPvhNote), "{e}");
        assert!(
            e.to_string()
                .contains("no XEN_ELFNOTE_PHYS32_ENTRY note: not a PVH kernel")
        );
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let full = PvhImage::new(&[0x90; 64]).build();
        for len in 0..full.len() {
            match inspect(&full[..len]) {
                Err(Error::NotElf) => assert!(len < 4),
                Err(Error::MalformedElf(_)) => {}
                other => panic!("truncated to {len}: {other:?}"),
            }
        }
        assert!(inspect(&full).is_ok());
    }

    #[test]
    fn corrupting_any_header_byte_never_panics() {
        let full = PvhImage::new(&[0x90; 16]).build();
        for i in 0..0x120.min(full.len()) {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut bad = full.clone();
                bad[i] = v;
                let _ = inspect(&bad);
            }
        }
    }

    #[test]
    fn malformed_variants_say_what() {
        let e = inspect(&PvhImage::new(CODE).phoff(0xffff_ffff).build()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("program headers")),
            "{e}"
        );
        let e = inspect(&PvhImage::new(CODE).elf32().build()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("ELFCLASS32")),
            "{e}"
        );
        let e = inspect(&PvhImage::new(CODE).note_desc_size(2).build()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("PHYS32")),
            "{e}"
        );
        let e = inspect(&PvhImage::new(CODE).segment_file_size(1 << 40).build()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("past the end")),
            "{e}"
        );
    }

    #[test]
    fn overlapping_segments_are_refused_and_adjacent_ones_accepted() {
        let code = [0x90u8; 64];
        let e = inspect(&PvhImage::new(&code).overlapping_load(32).build()).unwrap_err();
        assert!(
            matches!(e, Error::MalformedElf(ref m) if m.contains("overlap")),
            "{e}"
        );
        let info = inspect(&PvhImage::new(&code).overlapping_load(64).build()).unwrap();
        assert_eq!(info.segments.len(), 2);
        assert_eq!(info.end, LOAD_ADDRESS + 128);
    }

    #[test]
    fn layout_checks_memory_boot_data_and_entry() {
        let mem = 16 * MIB;
        let ok = inspect(&PvhImage::new(CODE).build()).unwrap();
        check_layout(&ok, mem).unwrap();

        let high = inspect(&PvhImage::new(CODE).load_address(0x200_0000).build()).unwrap();
        match check_layout(&high, mem) {
            Err(Error::MemoryTooSmall {
                memory_mib: 16,
                needed_mib: 33,
            }) => {}
            other => panic!("{other:?}"),
        }
        let beyond = inspect(&PvhImage::new(CODE).load_address(0x1_0000_0000).build()).unwrap();
        assert!(matches!(
            check_layout(&beyond, mem),
            Err(Error::KernelLayout(_))
        ));

        let low = inspect(&PvhImage::new(CODE).load_address(0x20100).build()).unwrap();
        let e = check_layout(&low, mem).unwrap_err();
        assert!(e.to_string().contains("command line"), "{e}");

        let off = inspect(&PvhImage::new(CODE).entry(0x300000).build()).unwrap();
        let e = check_layout(&off, mem).unwrap_err();
        assert!(e.to_string().contains("entry point 0x300000"), "{e}");
    }
}
