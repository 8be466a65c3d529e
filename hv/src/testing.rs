//! Tiny PVH guests for tests and benchmarks: wraps raw 32-bit machine code in a minimal
//! ELF64 or ELF32 (header, one PT_LOAD, one PT_NOTE with the Xen PHYS32 entry note), with
//! knobs to produce malformed variants.
//!
//! ```
//! // `out 0xf4, al` with al = 0x2a, as a bootable PVH kernel loaded at 1 MiB.
//! let elf = hv::testing::PvhImage::new(&[0xb0, 0x2a, 0xe6, 0xf4]).build();
//! assert_eq!(&elf[..4], b"\x7fELF");
//! ```

/// Where the code is loaded (and entered) unless told otherwise.
pub const LOAD_ADDRESS: u64 = 0x10_0000;
/// File offset of the code.
const CODE_OFFSET: u64 = 0x200;

/// Builder of a PVH ELF64 (or ELF32) around raw 32-bit code.
#[derive(Debug, Clone)]
pub struct PvhImage {
    code: Vec<u8>,
    load_address: u64,
    entry: Option<u32>,
    bss: u64,
    pvh_note: bool,
    note_desc_size: u32,
    bad_magic: bool,
    elf32: bool,
    phoff: Option<u64>,
    segment_file_size: Option<u64>,
    truncate: Option<usize>,
    overlapping_load: Option<u64>,
}

impl PvhImage {
    /// `code` runs at [`LOAD_ADDRESS`] in 32-bit flat protected mode (PVH entry state).
    pub fn new(code: &[u8]) -> Self {
        Self {
            code: code.to_vec(),
            load_address: LOAD_ADDRESS,
            entry: None,
            bss: 0,
            pvh_note: true,
            note_desc_size: 4,
            bad_magic: false,
            elf32: false,
            phoff: None,
            segment_file_size: None,
            truncate: None,
            overlapping_load: None,
        }
    }

    /// Loads (and, unless [`entry`](Self::entry) says otherwise, enters) the code at `addr`.
    pub fn load_address(mut self, addr: u64) -> Self {
        self.load_address = addr;
        self
    }

    /// The PVH entry point written in the note (default: the load address).
    pub fn entry(mut self, entry: u32) -> Self {
        self.entry = Some(entry);
        self
    }

    /// Zero-initialised bytes after the code (memsz > filesz).
    pub fn bss(mut self, bytes: u64) -> Self {
        self.bss = bytes;
        self
    }

    /// Leaves out the Xen note: a valid ELF that is not a PVH kernel.
    pub fn without_pvh_note(mut self) -> Self {
        self.pvh_note = false;
        self
    }

    /// Declares the note's descriptor this many bytes long (4 is right).
    pub fn note_desc_size(mut self, size: u32) -> Self {
        self.note_desc_size = size;
        self
    }

    /// Corrupts the ELF magic.
    pub fn bad_magic(mut self) -> Self {
        self.bad_magic = true;
        self
    }

    /// Builds an ELF32 (`EM_386`) image instead of an ELF64 one; every other knob
    /// applies to it alike.
    pub fn elf32(mut self) -> Self {
        self.elf32 = true;
        self
    }

    /// Points `e_phoff` somewhere else.
    pub fn phoff(mut self, offset: u64) -> Self {
        self.phoff = Some(offset);
        self
    }

    /// Declares the PT_LOAD segment's file size (and memory size) as `size`.
    pub fn segment_file_size(mut self, size: u64) -> Self {
        self.segment_file_size = Some(size);
        self
    }

    /// Adds a second PT_LOAD of the same bytes, loaded `offset` bytes above the first
    /// (an overlap when `offset` is below the code's size).
    pub fn overlapping_load(mut self, offset: u64) -> Self {
        self.overlapping_load = Some(offset);
        self
    }

    /// Cuts the file after `len` bytes.
    pub fn truncate(mut self, len: usize) -> Self {
        self.truncate = Some(len);
        self
    }

    /// The ELF file.
    pub fn build(&self) -> Vec<u8> {
        // Field widths and places of the two classes (see hv::elf's `Format`).
        let (ehdr, phdr, word) = if self.elf32 { (52, 32, 4) } else { (64, 56, 8) };
        let put_word = |f: &mut [u8], at: usize, v: u64| {
            if word == 8 {
                put64(f, at, v)
            } else {
                put32(f, at, v as u32)
            }
        };
        // Program header field offsets: p_offset, p_vaddr, p_paddr, p_filesz, p_memsz,
        // p_align; p_flags sits at 4 in ELF64 and at 24 in ELF32.
        let (p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align) = if self.elf32 {
            (4, 8, 12, 16, 20, 24, 28)
        } else {
            (8, 16, 24, 32, 40, 4, 48)
        };
        // After room for three program headers.
        let note_offset = ehdr + 3 * phdr;

        let mut f = vec![0u8; CODE_OFFSET as usize];
        // ELF header
        f[..4].copy_from_slice(if self.bad_magic {
            b"\x7fELV"
        } else {
            b"\x7fELF"
        });
        f[4] = if self.elf32 { 1 } else { 2 }; // EI_CLASS
        f[5] = 1; // little-endian
        f[6] = 1; // EV_CURRENT
        put16(&mut f, 16, 2); // ET_EXEC
        put16(&mut f, 18, if self.elf32 { 3 } else { 62 }); // EM_386 / EM_X86_64
        put32(&mut f, 20, 1);
        put_word(&mut f, 24, self.load_address); // e_entry
        let (e_phoff, e_ehsize) = if self.elf32 { (28, 40) } else { (32, 52) };
        put_word(&mut f, e_phoff, self.phoff.unwrap_or(ehdr as u64));
        put16(&mut f, e_ehsize, ehdr as u16);
        put16(&mut f, e_ehsize + 2, phdr as u16); // e_phentsize
        put16(
            &mut f,
            e_ehsize + 4,
            if self.overlapping_load.is_some() {
                3
            } else {
                2
            },
        ); // e_phnum

        let filesz = self.segment_file_size.unwrap_or(self.code.len() as u64);
        let memsz = self
            .segment_file_size
            .unwrap_or(self.code.len() as u64 + self.bss);
        // PT_LOAD
        let ph = ehdr;
        put32(&mut f, ph, 1);
        put32(&mut f, ph + p_flags, 5); // R X
        put_word(&mut f, ph + p_offset, CODE_OFFSET);
        put_word(&mut f, ph + p_vaddr, self.load_address);
        put_word(&mut f, ph + p_paddr, self.load_address);
        put_word(&mut f, ph + p_filesz, filesz);
        put_word(&mut f, ph + p_memsz, memsz);
        put_word(&mut f, ph + p_align, 16);

        if let Some(offset) = self.overlapping_load {
            let (first, second) = (ehdr, ehdr + 2 * phdr);
            f.copy_within(first..first + phdr, second);
            put_word(&mut f, second + p_vaddr, self.load_address + offset);
            put_word(&mut f, second + p_paddr, self.load_address + offset);
        }

        // PT_NOTE with one note: either Xen's PHYS32 entry or an unrelated one.
        let desc_len = (self.note_desc_size as usize).next_multiple_of(4).max(4);
        let note_len = 12 + 4 + desc_len;
        let ph = ehdr + phdr;
        put32(&mut f, ph, 4);
        put32(&mut f, ph + p_flags, 4);
        put_word(&mut f, ph + p_offset, note_offset as u64);
        put_word(&mut f, ph + p_filesz, note_len as u64);
        put_word(&mut f, ph + p_memsz, note_len as u64);
        put_word(&mut f, ph + p_align, 4);
        let n = note_offset;
        put32(&mut f, n, 4);
        put32(&mut f, n + 4, self.note_desc_size);
        if self.pvh_note {
            put32(&mut f, n + 8, 18);
            f[n + 12..n + 16].copy_from_slice(b"Xen\0");
        } else {
            put32(&mut f, n + 8, 1); // NT_GNU_ABI_TAG-like, harmless
            f[n + 12..n + 16].copy_from_slice(b"GNU\0");
        }
        let entry = self.entry.unwrap_or(self.load_address as u32);
        put32(&mut f, n + 16, entry);
        debug_assert!(n + note_len <= CODE_OFFSET as usize);

        f.extend_from_slice(&self.code);
        if let Some(len) = self.truncate {
            f.truncate(len);
        }
        f
    }
}

fn put16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(f: &mut [u8], at: usize, v: u32) {
    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(f: &mut [u8], at: usize, v: u64) {
    f[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Snippets of 32-bit machine code for tiny guests.
pub mod asm {
    /// `mov al, v; out port, al` (port < 0x100).
    pub fn out8_imm(port: u8, v: u8) -> Vec<u8> {
        vec![0xb0, v, 0xe6, port]
    }

    /// Writes `text` to COM1 (`mov dx, 0x3f8; mov al, b; out dx, al` ...).
    pub fn com1_print(text: &[u8]) -> Vec<u8> {
        let mut c = vec![0x66, 0xba, 0xf8, 0x03];
        for &b in text {
            c.extend_from_slice(&[0xb0, b, 0xee]);
        }
        c
    }

    /// `mov eax, v; out 0xf4, eax`: debug-exit with a 32-bit value.
    pub fn debug_exit(v: u32) -> Vec<u8> {
        let mut c = vec![0xb8];
        c.extend_from_slice(&v.to_le_bytes());
        c.extend_from_slice(&[0xe7, 0xf4]);
        c
    }

    /// `cli; hlt; jmp back to hlt`: halts forever with interrupts disabled (kumo ends
    /// such a VM as stopped for good once every vCPU is there).
    pub fn halt_forever() -> Vec<u8> {
        vec![0xfa, 0xf4, 0xeb, 0xfd]
    }

    /// `sti; hlt; jmp back to hlt`: waits for interrupts forever (none come unless a
    /// device raises one).
    pub fn wait_forever() -> Vec<u8> {
        vec![0xfb, 0xf4, 0xeb, 0xfd]
    }

    /// `jmp $`: spins forever.
    pub fn spin_forever() -> Vec<u8> {
        vec![0xeb, 0xfe]
    }

    /// `mov dword [addr], v` (absolute address).
    pub fn store32(addr: u32, v: u32) -> Vec<u8> {
        let mut c = vec![0xc7, 0x05];
        c.extend_from_slice(&addr.to_le_bytes());
        c.extend_from_slice(&v.to_le_bytes());
        c
    }

    /// `mov ecx, n; loop: <body>; dec ecx; jnz loop` (body must not touch ecx and be
    /// shorter than ~120 bytes).
    pub fn repeat(n: u32, body: &[u8]) -> Vec<u8> {
        let mut c = vec![0xb9];
        c.extend_from_slice(&n.to_le_bytes());
        c.extend_from_slice(body);
        c.push(0x49); // dec ecx
        let back = -((body.len() + 1 + 2) as i32);
        assert!(back >= -128, "loop body too long");
        c.extend_from_slice(&[0x75, back as i8 as u8]); // jnz loop
        c
    }
}

/// A VM of `vcpus` vCPUs and `memory_mib` of RAM that runs `code` (a [`PvhImage`]).
pub fn code_vm(vcpus: u32, memory_mib: u64, code: &[u8]) -> crate::VmConfig {
    crate::VmConfig {
        vcpus,
        memory_mib,
        kernel: PvhImage::new(code).build().into(),
        cmdline: "test".into(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    }
}

/// True if tests that need KVM can run. Without /dev/kvm they are skipped loudly, except
/// in CI (`CI=true`), where a missing KVM must fail the run instead of passing it
/// vacuously.
pub fn kvm_available() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("/dev/kvm is missing but CI=true: the KVM tests must run in CI");
    }
    eprintln!("SKIPPED: /dev/kvm is missing on this host");
    false
}
