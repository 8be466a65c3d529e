//! The VM stream: one format for snapshot files and migration connections.
//!
//! ```text
//! header   "KUMOVM\r\n" (8 bytes), version: u32 LE, reserved: u32 LE (0)
//! section  tag: 4 bytes, length: u32 LE, crc32 of the payload: u32 LE, payload
//! ```
//!
//! Sections, in order: `META` (JSON [`Meta`]: vCPUs, RAM size, CPUID, the program's
//! own description), any number of `RAM ` (page records), then `VCPU` (JSON, every
//! vCPU's state), `VMST` (JSON, irqchip and clock), `DEVS` (JSON, device state) and
//! `END\0` (empty); an `APPS` section (JSON string) may come after `VCPU` and
//! replaces META's `app`. A page record is `gpa: u64 LE`, `kind: u8` (0: the page is all
//! zeros, 1: 4096 bytes follow). A migration sends `RAM ` sections once per round;
//! a later record for a page replaces the earlier one. It ends each round with a
//! `SYNC` section (the round's number, u32 LE, counting from 0); snapshot files have
//! none.
//!
//! The destination of a migration answers on the same connection with replies framed
//! like sections: `ACK ` (a round's number, u32 LE) once it has applied every page up
//! to that round's `SYNC`, and `RUN ` (empty) once the VM runs there. The source
//! pauses the VM only after the last round was acknowledged, so the destination is
//! not still applying earlier rounds while the VM is down.
//!
//! Everything read is checked before use: an unknown tag, a section over
//! [`MAX_SECTION`], a checksum that does not match, a record outside RAM or a
//! malformed JSON body is an error. The reader never panics on any input.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use super::state::{DeviceStates, VcpuState, VmState};

pub const MAGIC: [u8; 8] = *b"KUMOVM\r\n";
/// Bumped on any incompatible change of the sections or their JSON.
/// 2: `SYNC` sections and the destination's `ACK `/`RUN ` replies.
pub const VERSION: u32 = 2;
/// Largest section accepted (a RAM section holds at most [`PAGES_PER_SECTION`] pages).
pub const MAX_SECTION: u32 = 8 << 20;
pub const PAGE_SIZE: usize = 4096;
/// Pages per RAM section when writing.
pub const PAGES_PER_SECTION: usize = 1024;

pub const TAG_META: [u8; 4] = *b"META";
pub const TAG_RAM: [u8; 4] = *b"RAM ";
pub const TAG_VCPU: [u8; 4] = *b"VCPU";
pub const TAG_VM: [u8; 4] = *b"VMST";
pub const TAG_DEVICES: [u8; 4] = *b"DEVS";
pub const TAG_END: [u8; 4] = *b"END\0";
/// The program's description again, as it is once the VM stopped (a migration
/// sends META before the copy rounds, while the guest still runs).
pub const TAG_APP: [u8; 4] = *b"APPS";
/// The end of a copy round (its number): the destination acknowledges it.
pub const TAG_SYNC: [u8; 4] = *b"SYNC";
/// The sections a stream may hold.
const STREAM_TAGS: [[u8; 4]; 8] = [
    TAG_META,
    TAG_RAM,
    TAG_VCPU,
    TAG_VM,
    TAG_DEVICES,
    TAG_APP,
    TAG_SYNC,
    TAG_END,
];

/// Replies (destination to source): a round applied, the VM runs.
pub const TAG_ACK: [u8; 4] = *b"ACK ";
pub const TAG_RUNNING: [u8; 4] = *b"RUN ";
const REPLY_TAGS: [[u8; 4]; 2] = [TAG_ACK, TAG_RUNNING];

/// What a stream's reader or writer found wrong.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("not a kumo VM stream (bad magic)")]
    BadMagic,
    #[error("stream version {found}; this kumo reads version {VERSION}")]
    Version { found: u32 },
    #[error("header flags {0:#x}: none are defined (corrupted, or from a newer kumo)")]
    Flags(u32),
    #[error("the stream ended early (truncated)")]
    Truncated,
    #[error("unknown section {0:?}")]
    UnknownSection(String),
    #[error("section {tag} is {len} bytes, above the {MAX_SECTION}-byte limit")]
    TooLong { tag: String, len: u32 },
    #[error("section {tag}: checksum mismatch (corrupted)")]
    Checksum { tag: String },
    #[error("section {tag}: {why}")]
    Malformed { tag: String, why: String },
    #[error("section {0} out of order")]
    Order(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

pub fn tag_name(tag: &[u8; 4]) -> String {
    tag.iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// The VM's shape and the program's description of it, sent first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub vcpus: u32,
    pub memory_bytes: u64,
    /// Each vCPU's CPUID as KVM_GET_CPUID2 returned it (set on the new vCPUs).
    pub cpuid: Vec<Vec<kvm_bindings::kvm_cpuid_entry2>>,
    /// What the program runs in the VM (kumo: the guest and its workload), opaque here.
    pub app: String,
    /// Guest RAM is on 2 MiB huge pages; the new VM takes them too (absent in streams
    /// from before it existed: 4 KiB pages).
    #[serde(default)]
    pub huge_pages: bool,
}

pub fn write_header(w: &mut impl Write) -> Result<(), StreamError> {
    w.write_all(&MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&0u32.to_le_bytes())?;
    Ok(())
}

fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), StreamError> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            StreamError::Truncated
        } else {
            StreamError::Io(e)
        }
    })
}

pub fn read_header(r: &mut impl Read) -> Result<(), StreamError> {
    let mut header = [0u8; 16];
    read_exact(r, &mut header)?;
    if header[..8] != MAGIC {
        return Err(StreamError::BadMagic);
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version != VERSION {
        return Err(StreamError::Version { found: version });
    }
    // The header has no checksum: every byte of it is checked instead.
    let flags = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
    if flags != 0 {
        return Err(StreamError::Flags(flags));
    }
    Ok(())
}

pub fn write_section(w: &mut impl Write, tag: [u8; 4], payload: &[u8]) -> Result<(), StreamError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_SECTION)
        .ok_or_else(|| StreamError::TooLong {
            tag: tag_name(&tag),
            len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        })?;
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&tag);
    head[4..8].copy_from_slice(&len.to_le_bytes());
    head[8..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    Ok(())
}

pub fn write_json<T: Serialize>(
    w: &mut impl Write,
    tag: [u8; 4],
    value: &T,
) -> Result<(), StreamError> {
    let payload = serde_json::to_vec(value).map_err(|e| StreamError::Malformed {
        tag: tag_name(&tag),
        why: e.to_string(),
    })?;
    write_section(w, tag, &payload)
}

/// One checked section.
#[derive(Debug, Default)]
pub struct Section {
    pub tag: [u8; 4],
    pub payload: Vec<u8>,
}

impl Section {
    /// The round number a `SYNC` section or an `ACK ` reply carries.
    pub fn round(&self) -> Result<u32, StreamError> {
        let bytes: [u8; 4] =
            self.payload
                .as_slice()
                .try_into()
                .map_err(|_| StreamError::Malformed {
                    tag: tag_name(&self.tag),
                    why: format!(
                        "{} bytes where a round number (4) belongs",
                        self.payload.len()
                    ),
                })?;
        Ok(u32::from_le_bytes(bytes))
    }

    pub fn json<T: for<'de> Deserialize<'de>>(&self) -> Result<T, StreamError> {
        serde_json::from_slice(&self.payload).map_err(|e| StreamError::Malformed {
            tag: tag_name(&self.tag),
            why: e.to_string(),
        })
    }

    /// The page records of a `RAM ` section, each checked against a RAM of
    /// `memory_bytes`.
    pub fn pages(&self, memory_bytes: u64) -> PageRecords<'_> {
        PageRecords {
            rest: &self.payload,
            regions: crate::memory_map::ram_regions(memory_bytes),
        }
    }
}

/// Reads the next section (tag, length, checksum verified).
pub fn read_section(r: &mut impl Read) -> Result<Section, StreamError> {
    let mut section = Section::default();
    read_section_into(r, &mut section)?;
    Ok(section)
}

/// Reads the next section into `section`, reusing its payload's buffer: a receiver
/// takes RAM in sections of up to 4 MiB, and a fresh buffer for each would be a new
/// mapping, faulted in page by page (kumo keeps glibc's mmap threshold fixed:
/// `kumo::heap`); a [`PooledSection`] also keeps it for the next migration.
pub fn read_section_into(r: &mut impl Read, section: &mut Section) -> Result<(), StreamError> {
    read_framed_into(r, &STREAM_TAGS, MAX_SECTION, section)
}

/// Reads one frame whose tag must be one of `tags` and whose payload is at most
/// `max` bytes, checking its checksum.
fn read_framed(r: &mut impl Read, tags: &[[u8; 4]], max: u32) -> Result<Section, StreamError> {
    let mut section = Section::default();
    read_framed_into(r, tags, max, &mut section)?;
    Ok(section)
}

fn read_framed_into(
    r: &mut impl Read,
    tags: &[[u8; 4]],
    max: u32,
    section: &mut Section,
) -> Result<(), StreamError> {
    let mut head = [0u8; 12];
    read_exact(r, &mut head)?;
    let tag: [u8; 4] = [head[0], head[1], head[2], head[3]];
    if !tags.contains(&tag) {
        return Err(StreamError::UnknownSection(tag_name(&tag)));
    }
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let crc = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if len > max {
        return Err(StreamError::TooLong {
            tag: tag_name(&tag),
            len,
        });
    }
    section.tag = tag;
    section.payload.clear();
    section.payload.resize(len as usize, 0);
    read_exact(r, &mut section.payload)?;
    if crc32fast::hash(&section.payload) != crc {
        return Err(StreamError::Checksum {
            tag: tag_name(&tag),
        });
    }
    Ok(())
}

/// Ends copy round `round` (see the module comment).
pub fn write_sync(w: &mut impl Write, round: u32) -> Result<(), StreamError> {
    write_section(w, TAG_SYNC, &round.to_le_bytes())
}

/// What a migration's destination tells its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Every page up to this round's `SYNC` is in the destination's RAM.
    Applied(u32),
    /// The VM's vCPU threads run at the destination.
    Running,
}

pub fn write_reply(w: &mut impl Write, reply: Reply) -> Result<(), StreamError> {
    match reply {
        Reply::Applied(round) => write_section(w, TAG_ACK, &round.to_le_bytes()),
        Reply::Running => write_section(w, TAG_RUNNING, &[]),
    }
}

/// Reads one reply, checked like a section (tag, length, checksum).
pub fn read_reply(r: &mut impl Read) -> Result<Reply, StreamError> {
    let reply = read_framed(r, &REPLY_TAGS, 4)?;
    match reply.tag {
        TAG_ACK => reply.round().map(Reply::Applied),
        _ if reply.payload.is_empty() => Ok(Reply::Running),
        _ => Err(StreamError::Malformed {
            tag: tag_name(&reply.tag),
            why: "a RUN reply carries nothing".into(),
        }),
    }
}

/// Checks that a stream's `SYNC` sections count 0, 1, 2, ... (`last`: the previous one).
pub fn next_sync(section: &Section, last: Option<u32>) -> Result<u32, StreamError> {
    let round = section.round()?;
    let expected = last.map_or(0, |l| l.wrapping_add(1));
    if round != expected {
        return Err(StreamError::Malformed {
            tag: "SYNC".into(),
            why: format!("round {round} where round {expected} belongs"),
        });
    }
    Ok(round)
}

/// A page of a RAM section: its guest-physical address and its bytes (`None`: zeros).
pub type Page<'a> = (u64, Option<&'a [u8]>);

/// Iterates a RAM section's records; a bad record ends it with an error.
pub struct PageRecords<'a> {
    rest: &'a [u8],
    regions: Vec<crate::memory_map::RamRegion>,
}

impl<'a> Iterator for PageRecords<'a> {
    type Item = Result<Page<'a>, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let bad = |why: String| {
            Some(Err(StreamError::Malformed {
                tag: "RAM".into(),
                why,
            }))
        };
        let Some((head, rest)) = self.rest.split_first_chunk::<9>() else {
            self.rest = &[];
            return bad("a page record is cut short".into());
        };
        let gpa = u64::from_le_bytes([
            head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7],
        ]);
        if !crate::memory_map::is_ram_page(&self.regions, gpa) {
            self.rest = &[];
            return bad(format!("page {gpa:#x} is not a page of the VM's RAM"));
        }
        match head[8] {
            0 => {
                self.rest = rest;
                Some(Ok((gpa, None)))
            }
            1 if rest.len() >= PAGE_SIZE => {
                let (page, rest) = rest.split_at(PAGE_SIZE);
                self.rest = rest;
                Some(Ok((gpa, Some(page))))
            }
            1 => {
                self.rest = &[];
                bad(format!("page {gpa:#x} is cut short"))
            }
            kind => {
                self.rest = &[];
                bad(format!("page {gpa:#x} has unknown kind {kind}"))
            }
        }
    }
}

/// Builds RAM sections: pages are added one at a time and a section is written
/// whenever [`PAGES_PER_SECTION`] are buffered.
pub struct RamWriter {
    buf: Vec<u8>,
    pages: usize,
    /// Pages and bytes written so far.
    pub total_pages: u64,
    pub total_bytes: u64,
}

impl Default for RamWriter {
    fn default() -> Self {
        Self::new()
    }
}

/// A RAM section's largest size: a buffer this big is mapped on its own by glibc
/// (kumo keeps its mmap threshold fixed: `kumo::heap`).
const SECTION_BUFFER_BYTES: usize = PAGES_PER_SECTION * (PAGE_SIZE + 9);

/// Section buffers kept for the next migration in this process (at most
/// [`SPARE_BUFFERS`]: a sender's and a receiver's): a fresh 4 MiB mapping is faulted
/// in page by page, ~1 ms a migration on this host for the two buffers.
static SPARE: Spares = Spares::new(SPARE_BUFFERS);
const SPARE_BUFFERS: usize = 2;

struct Spares {
    buffers: std::sync::Mutex<Vec<Vec<u8>>>,
    most: usize,
}

impl Spares {
    const fn new(most: usize) -> Self {
        Spares {
            buffers: std::sync::Mutex::new(Vec::new()),
            most,
        }
    }

    /// An empty buffer with room for a RAM section, kept from earlier if any.
    fn take(&self) -> Vec<u8> {
        let spare = self.buffers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut buf = spare.unwrap_or_default();
        buf.clear();
        buf.reserve(SECTION_BUFFER_BYTES);
        buf
    }

    /// Keeps `buf` for a later [`Spares::take`] if it is section-sized and fewer
    /// than `most` are kept (their memory is then held, bounded, for the process's
    /// life).
    fn keep(&self, buf: Vec<u8>) {
        if buf.capacity() < SECTION_BUFFER_BYTES || buf.capacity() > 2 * SECTION_BUFFER_BYTES {
            return;
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        if buffers.len() < self.most {
            buffers.push(buf);
        }
    }
}

/// A [`Section`] whose payload buffer comes from, and goes back to, the spares: for
/// a receiver that reads section after section ([`read_section_into`]).
#[derive(Debug)]
pub struct PooledSection(Section);

impl PooledSection {
    pub fn new() -> Self {
        PooledSection(Section {
            tag: [0; 4],
            payload: SPARE.take(),
        })
    }
}

impl Default for PooledSection {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for PooledSection {
    type Target = Section;
    fn deref(&self) -> &Section {
        &self.0
    }
}

impl std::ops::DerefMut for PooledSection {
    fn deref_mut(&mut self) -> &mut Section {
        &mut self.0
    }
}

impl Drop for PooledSection {
    fn drop(&mut self) {
        SPARE.keep(std::mem::take(&mut self.0.payload));
    }
}

impl Drop for RamWriter {
    fn drop(&mut self) {
        SPARE.keep(std::mem::take(&mut self.buf));
    }
}

impl RamWriter {
    pub fn new() -> Self {
        RamWriter {
            buf: SPARE.take(),
            pages: 0,
            total_pages: 0,
            total_bytes: 0,
        }
    }

    pub fn page(&mut self, w: &mut impl Write, gpa: u64, bytes: &[u8]) -> Result<(), StreamError> {
        self.buf.extend_from_slice(&gpa.to_le_bytes());
        if bytes.iter().all(|&b| b == 0) {
            self.buf.push(0);
        } else {
            self.buf.push(1);
            self.buf.extend_from_slice(bytes);
        }
        self.pages += 1;
        if self.pages == PAGES_PER_SECTION {
            self.flush(w)?;
        }
        Ok(())
    }

    pub fn flush(&mut self, w: &mut impl Write) -> Result<(), StreamError> {
        if self.pages > 0 {
            write_section(w, TAG_RAM, &self.buf)?;
            self.total_pages += self.pages as u64;
            self.total_bytes += self.buf.len() as u64 + 12;
            self.buf.clear();
            self.pages = 0;
        }
        Ok(())
    }
}

/// A whole stream held in memory, checked (for tests and for the fuzz-style
/// property below; restores read section by section instead).
#[derive(Debug)]
pub struct Parsed {
    pub meta: Meta,
    pub pages: Vec<(u64, Option<Vec<u8>>)>,
    pub vcpus: Vec<VcpuState>,
    pub vm: VmState,
    pub devices: DeviceStates,
    /// The copy rounds the stream marked (`SYNC`), in order.
    pub syncs: Vec<u32>,
}

/// Reads a whole stream from `r`, checking order and contents.
pub fn parse(r: &mut impl Read) -> Result<Parsed, StreamError> {
    read_header(r)?;
    let first = read_section(r)?;
    if first.tag != TAG_META {
        return Err(StreamError::Order(tag_name(&first.tag)));
    }
    let mut meta: Meta = first.json()?;
    check_meta(&meta)?;
    let mut pages = Vec::new();
    let (mut vcpus, mut vm, mut devices) = (None, None, None);
    let mut app = None;
    let mut syncs = Vec::new();
    let mut section = PooledSection::new();
    loop {
        read_section_into(r, &mut section)?;
        match section.tag {
            TAG_RAM if vcpus.is_none() => {
                for page in section.pages(meta.memory_bytes) {
                    let (gpa, bytes) = page?;
                    pages.push((gpa, bytes.map(<[u8]>::to_vec)));
                }
            }
            TAG_SYNC if vcpus.is_none() => syncs.push(next_sync(&section, syncs.last().copied())?),
            TAG_VCPU if vcpus.is_none() => {
                let v: Vec<VcpuState> = section.json()?;
                if v.len() != meta.vcpus as usize {
                    return Err(StreamError::Malformed {
                        tag: "VCPU".into(),
                        why: format!("{} vCPU states for {} vCPUs", v.len(), meta.vcpus),
                    });
                }
                vcpus = Some(v);
            }
            TAG_VM if vm.is_none() && vcpus.is_some() => vm = Some(section.json()?),
            TAG_DEVICES if devices.is_none() && vcpus.is_some() => devices = Some(section.json()?),
            TAG_APP if app.is_none() && vcpus.is_some() => app = Some(section.json()?),
            TAG_END => {
                if let Some(app) = app {
                    meta.app = app;
                }
                return match (vcpus, vm, devices) {
                    (Some(vcpus), Some(vm), Some(devices)) => Ok(Parsed {
                        meta,
                        pages,
                        vcpus,
                        vm,
                        devices,
                        syncs,
                    }),
                    _ => Err(StreamError::Order("END".into())),
                };
            }
            tag => return Err(StreamError::Order(tag_name(&tag))),
        }
    }
}

/// Limits on what a META section may ask a restore to build.
pub fn check_meta(meta: &Meta) -> Result<(), StreamError> {
    let bad = |why: String| StreamError::Malformed {
        tag: "META".into(),
        why,
    };
    if meta.vcpus == 0 || meta.vcpus > 1024 {
        return Err(bad(format!("{} vCPUs", meta.vcpus)));
    }
    if meta.memory_bytes == 0
        || !meta.memory_bytes.is_multiple_of(PAGE_SIZE as u64)
        || meta.memory_bytes > crate::memory_map::MAX_MEMORY_MIB * crate::layout::MIB
    {
        return Err(bad(format!("RAM of {} bytes", meta.memory_bytes)));
    }
    if meta.cpuid.len() != meta.vcpus as usize {
        return Err(bad(format!(
            "{} CPUID tables for {} vCPUs",
            meta.cpuid.len(),
            meta.vcpus
        )));
    }
    if meta
        .cpuid
        .iter()
        .any(|c| c.len() > kvm_bindings::KVM_MAX_CPUID_ENTRIES)
    {
        return Err(bad("a CPUID table is too long".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_buffers_are_kept_for_reuse_up_to_a_bound() {
        let spares = Spares::new(2);
        let (a, b, c) = (spares.take(), spares.take(), spares.take());
        assert!(a.capacity() >= SECTION_BUFFER_BYTES && a.is_empty());
        let a_at = a.as_ptr();
        spares.keep(a);
        let again = spares.take();
        assert_eq!(again.as_ptr(), a_at, "the kept buffer is handed out again");
        spares.keep(again);
        spares.keep(b);
        spares.keep(c);
        spares.keep(vec![0; SECTION_BUFFER_BYTES]);
        assert_eq!(
            spares.buffers.lock().unwrap().len(),
            2,
            "never more than the bound"
        );
        spares.keep(Vec::with_capacity(4096));
        assert_eq!(spares.buffers.lock().unwrap().len(), 2);
        let small = Spares::new(2);
        small.keep(Vec::with_capacity(4096));
        assert!(
            small.buffers.lock().unwrap().is_empty(),
            "small buffers are not kept"
        );
    }
}
