//! Turns the ring-3 runtime's ELF into a flat image for `.incbin`, and writes its sizes
//! into a linker-script fragment, so the supervisor's ELF carries the runtime at its
//! link address (the PVH loader loads it in place; ring 0 never copies or parses it).
//!
//! The runtime ELF comes from `KUMO_USER_ELF` (set by the root build script), else from
//! this workspace's default release output.

use std::env;
use std::fs;
use std::path::PathBuf;

const USER_IMAGE_BASE: u64 = 0x100_0000;
const PT_LOAD: u32 = 1;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=KUMO_USER_ELF");
    println!("cargo:rerun-if-changed=kernel.ld");
    println!("cargo:rerun-if-changed=src/boot.S");
    let user_elf = env::var_os("KUMO_USER_ELF")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/x86_64-unknown-linux-gnu/release/kumo-user"));
    println!("cargo:rerun-if-changed={}", user_elf.display());
    let elf = fs::read(&user_elf).unwrap_or_else(|e| {
        panic!(
            "cannot read the ring-3 runtime {} ({e}); build kumo-user first \
             (cargo build --release -p kumo-user --target x86_64-unknown-linux-gnu)",
            user_elf.display()
        )
    });
    let (flat, mem_size) = flatten(&elf).unwrap_or_else(|e| panic!("{}: {e}", user_elf.display()));
    fs::write(out.join("user.bin"), &flat).unwrap();
    fs::write(
        out.join("user.ld"),
        format!(
            "USER_IMAGE_BASE = {USER_IMAGE_BASE:#x};\nUSER_IMAGE_FILE_SIZE = {:#x};\n\
             USER_IMAGE_MEM_SIZE = {mem_size:#x};\n",
            flat.len()
        ),
    )
    .unwrap();
    println!("cargo:rustc-link-arg-bins=-L{}", out.display());
    println!(
        "cargo:rustc-link-arg-bins=-T{}",
        manifest.join("kernel.ld").display()
    );
    println!("cargo:rustc-link-arg-bins=--no-pie");
    println!("cargo:rustc-link-arg-bins=--build-id=none");
    println!(
        "cargo:rustc-env=KUMO_USER_BIN={}",
        out.join("user.bin").display()
    );
}

fn u16_at(b: &[u8], o: usize) -> u64 {
    u64::from(u16::from_le_bytes(b[o..o + 2].try_into().unwrap()))
}
fn u32_at(b: &[u8], o: usize) -> u64 {
    u64::from(u32::from_le_bytes(b[o..o + 4].try_into().unwrap()))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// The PT_LOAD segments laid out from `USER_IMAGE_BASE`: (file bytes, memory size).
fn flatten(elf: &[u8]) -> Result<(Vec<u8>, u64), String> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err("not a little-endian ELF64 file".into());
    }
    let (phoff, phentsize, phnum) = (u64_at(elf, 32), u16_at(elf, 54), u16_at(elf, 56));
    let mut flat = Vec::new();
    let mut mem_end = USER_IMAGE_BASE;
    for i in 0..phnum {
        let ph = (phoff + i * phentsize) as usize;
        if u32_at(elf, ph) as u32 != PT_LOAD || u64_at(elf, ph + 40) == 0 {
            continue;
        }
        let (offset, vaddr, filesz, memsz) = (
            u64_at(elf, ph + 8),
            u64_at(elf, ph + 16),
            u64_at(elf, ph + 32),
            u64_at(elf, ph + 40),
        );
        if vaddr < USER_IMAGE_BASE || vaddr + memsz > USER_IMAGE_BASE + (256 << 20) {
            return Err(format!("segment at {vaddr:#x} outside the runtime's area"));
        }
        let start = (vaddr - USER_IMAGE_BASE) as usize;
        let end = start + filesz as usize;
        if flat.len() < end {
            flat.resize(end, 0);
        }
        flat[start..end].copy_from_slice(&elf[offset as usize..(offset + filesz) as usize]);
        mem_end = mem_end.max(vaddr + memsz);
    }
    if flat.len() < 24 || u64_at(&flat, 0) != u64::from_le_bytes(*b"KUMOUSR1") {
        return Err("no runtime header at the image base".into());
    }
    Ok((flat, mem_end - USER_IMAGE_BASE))
}
