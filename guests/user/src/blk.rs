//! A virtio-blk driver in ring 3 (virtio 1.x, modern PCI: vendor 0x1AF4, device
//! 0x1042): one request queue, polled (no interrupts), one request in flight. Each
//! request is three descriptors: the 16-byte header (device reads), the data (device
//! reads for a write, writes for a read or GET_ID) and the status byte.
//!
//! `blk=check` on the command line runs [`check`]: the disk's size, serial and first
//! sector, a write of sector 1 read back (or the refusal a read-only disk answers),
//! a flush, and the time of 4 KiB reads; one `@kumo blk` line says what it saw.
//!
//! Two hostile probes check that a guest cannot make kumo's disk work without end or
//! flood its log: `blk=loop` ([`self_perpetuating`]) and `blk=badring` ([`bad_ring`]).

use core::fmt::Write;

use kumo_abi::BootInfo;

use crate::pci::read32;
use crate::virtio::{self, Bump, F_VERSION_1, OpenError, Queue};
use crate::{Line, sys};

pub const DEVICE_ID: u16 = 0x1042;
const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;
const SECTOR: u64 = 512;
/// virtio's "no MSI-X vector": this driver polls.
const NO_VECTOR: u16 = 0xFFFF;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
pub const S_OK: u8 = 0;

/// Data buffer: the largest request this driver makes.
const DATA_LEN: u64 = 64 * 1024;
/// Polls of the used ring before a request counts as lost.
const POLL_LIMIT: u64 = 1 << 32;

pub struct Disk {
    queue: Queue,
    /// Header (16 bytes), then the status byte at +16, then the data buffer at +4096.
    scratch: u64,
    pub sectors: u64,
    pub readonly: bool,
    pub flush: bool,
}

/// A request the device did not complete, or completed with a status other than OK.
#[derive(Clone, Copy, Debug)]
pub enum IoError {
    /// The status byte the device wrote.
    Status(u8),
    /// No used entry came back.
    Lost,
}

impl Disk {
    /// Finds the first virtio-blk device on bus 0 and brings it up, its ring and
    /// buffers from `memory`.
    pub fn open(info: &BootInfo, memory: &mut Bump) -> Result<Disk, OpenError> {
        let device = virtio::open_first(info, DEVICE_ID, "no-virtio-blk")?;
        let features = device.negotiate(F_VERSION_1, F_RO | F_FLUSH)?;
        device.set_config_vector(NO_VECTOR)?;
        let mut queue = device.queue(0, 4, NO_VECTOR, false, memory)?;
        queue.set_interrupts(false);
        let scratch = memory.alloc(4096 + DATA_LEN, 4096)?;
        // capacity: le64 at the start of the device configuration.
        let sectors =
            u64::from(read32(device.device_cfg)) | (u64::from(read32(device.device_cfg + 4)) << 32);
        device.start();
        Ok(Disk {
            queue,
            scratch,
            sectors,
            readonly: features & F_RO != 0,
            flush: features & F_FLUSH != 0,
        })
    }

    /// The data buffer requests read from and write into.
    pub fn data(&mut self) -> &mut [u8] {
        // SAFETY: scratch + 4096 starts DATA_LEN bytes this driver allocated; the
        // device touches them only during `request`, which takes `&mut self`.
        unsafe {
            core::slice::from_raw_parts_mut((self.scratch + 4096) as *mut u8, DATA_LEN as usize)
        }
    }

    /// One request of `len` data bytes (at most the data buffer) at `sector`; waits for
    /// it. Returns the used length (data written by the device plus the status byte).
    fn request(
        &mut self,
        kind: u32,
        sector: u64,
        len: u32,
        device_writes: bool,
    ) -> Result<u32, IoError> {
        let header = self.scratch;
        let status = self.scratch + 16;
        let data = self.scratch + 4096;
        // SAFETY: the header and status bytes of this driver's scratch page.
        unsafe {
            core::ptr::write_volatile(header as *mut u32, kind);
            core::ptr::write_volatile((header + 4) as *mut u32, 0);
            core::ptr::write_volatile((header + 8) as *mut u64, sector);
            core::ptr::write_volatile(status as *mut u8, 0xFF);
        }
        self.queue.set_desc(0, header, 16, false);
        self.queue.chain(0, 1);
        let mut last = 1;
        if len > 0 {
            self.queue.set_desc(1, data, len, device_writes);
            self.queue.chain(1, 2);
            last = 2;
        }
        self.queue.set_desc(last, status, 1, true);
        self.queue.push(0);
        self.queue.publish();
        let mut polls = 0u64;
        let used = loop {
            if let Some((_, used)) = self.queue.pop_used() {
                break used;
            }
            polls += 1;
            if polls > POLL_LIMIT {
                return Err(IoError::Lost);
            }
            core::hint::spin_loop();
        };
        // SAFETY: the status byte, written by the device before the used entry.
        match unsafe { core::ptr::read_volatile(status as *const u8) } {
            S_OK => Ok(used),
            other => Err(IoError::Status(other)),
        }
    }

    /// Reads `count` sectors at `sector` into the data buffer.
    pub fn read(&mut self, sector: u64, count: u32) -> Result<(), IoError> {
        self.request(T_IN, sector, count * SECTOR as u32, true)
            .map(|_| ())
    }

    /// Writes `count` sectors at `sector` from the data buffer.
    pub fn write(&mut self, sector: u64, count: u32) -> Result<(), IoError> {
        self.request(T_OUT, sector, count * SECTOR as u32, false)
            .map(|_| ())
    }

    pub fn flush(&mut self) -> Result<(), IoError> {
        self.request(T_FLUSH, 0, 0, false).map(|_| ())
    }

    /// The serial, in the first 20 bytes of the data buffer; returns its length.
    pub fn get_id(&mut self) -> Result<usize, IoError> {
        self.data()[..20].fill(0);
        self.request(T_GET_ID, 0, 20, true)?;
        Ok(self.data()[..20].iter().position(|&b| b == 0).unwrap_or(20))
    }
}

fn hex(line: &mut Line, bytes: &[u8]) {
    for b in bytes {
        let _ = write!(line, "{b:02x}");
    }
}

fn io_result(line: &mut Line, key: &str, result: Result<(), IoError>) -> bool {
    let _ = match result {
        Ok(()) => write!(line, " {key}=ok"),
        Err(IoError::Status(s)) => write!(line, " {key}=status{s}"),
        Err(IoError::Lost) => write!(line, " {key}=lost"),
    };
    result.is_ok()
}

/// What written sector 1 holds: a pattern a test can recognise in the image file.
const PATTERN: &[u8] = b"written by kumo's guest through virtio-blk\n";

/// `blk=check`: see the module documentation. True if every step did what the disk's
/// kind (read-only or not) says it must.
pub fn check(info: &BootInfo) -> bool {
    let mut memory = Bump::new(info.heap_start, info.heap_end);
    let mut line = Line::new();
    let _ = write!(line, "@kumo blk");
    let mut disk = match Disk::open(info, &mut memory) {
        Ok(disk) => disk,
        Err(e) => {
            let _ = write!(line, " error={}", e.name());
            line.emit();
            return false;
        }
    };
    let _ = write!(
        line,
        " sectors={} readonly={} flush={}",
        disk.sectors,
        u8::from(disk.readonly),
        u8::from(disk.flush)
    );
    let mut ok = true;
    match disk.get_id() {
        Ok(n) => {
            let _ = write!(line, " id=");
            let id = &disk.data()[..n];
            let text = core::str::from_utf8(id).unwrap_or("?");
            let _ = write!(line, "{text}");
        }
        Err(_) => {
            let _ = write!(line, " id=error");
            ok = false;
        }
    }
    ok &= io_result(&mut line, "read0", disk.read(0, 1));
    let _ = write!(line, " sector0=");
    let head: [u8; 16] = disk.data()[..16].try_into().unwrap_or([0; 16]);
    hex(&mut line, &head);

    // Write sector 1 (the whole sector: the pattern, then zeros), flush, read back.
    let data = disk.data();
    data[..SECTOR as usize].fill(0);
    data[..PATTERN.len()].copy_from_slice(PATTERN);
    let wrote = io_result(&mut line, "write1", disk.write(1, 1));
    ok &= wrote != disk.readonly;
    ok &= io_result(&mut line, "flush", disk.flush());
    disk.data()[..SECTOR as usize].fill(0xAA);
    ok &= io_result(&mut line, "read1", disk.read(1, 1));
    let back = &disk.data()[..PATTERN.len()];
    let matches = back == PATTERN;
    let _ = write!(
        line,
        " readback={}",
        if matches { "pattern" } else { "other" }
    );
    ok &= matches != disk.readonly;

    // Out of range: must be refused.
    let beyond = disk.read(disk.sectors, 1);
    let _ = write!(
        line,
        " beyond={}",
        if beyond.is_err() { "refused" } else { "served" }
    );
    ok &= beyond.is_err();

    // Latency of 4 KiB reads (8 sectors), cycling over the first 64 KiB of the disk.
    let rounds = 200u64;
    if disk.sectors >= 128 {
        let start = sys::rdtsc();
        for i in 0..rounds {
            ok &= disk.read((i * 8) % 128, 8).is_ok();
        }
        let ticks = sys::rdtsc() - start;
        if let Some(ns) = (ticks * 1_000_000).checked_div(info.tsc_khz * rounds) {
            let _ = write!(line, " read4k_ns={ns}");
        }
    }
    let _ = write!(line, " kicks={} ok={}", disk.queue.kicks, u8::from(ok));
    line.emit();
    ok
}

/// Where the self-perpetuating request keeps its header: in the avail ring's page, 16
/// bytes before the end of the 512-byte read that overwrites the ring.
const LOOP_HEADER_AT: u64 = SECTOR - 16;
/// Its status byte: past that read.
const LOOP_STATUS_AT: u64 = 1024;
/// Status of a hostile probe that got its request back (kumo went on).
pub const STATUS_PROBE_DONE: u32 = 7;

/// `blk=loop`: one read request whose data buffer is the avail ring's page, so the
/// sector it reads rewrites `avail.idx` (one more available) and the request's own
/// header (the next sector). Given an image whose sector `j` holds avail.idx `j + 2`,
/// ring entries 0 and a header for sector `j + 1` (mod 2^16), a device that serves a
/// queue until it is empty never stops. The guest rings once, waits for the first used
/// entry, and exits with [`STATUS_PROBE_DONE`]: kumo must end with it.
pub fn self_perpetuating(info: &BootInfo) -> ! {
    let mut memory = Bump::new(info.heap_start, info.heap_end);
    let Ok(mut disk) = Disk::open(info, &mut memory) else {
        let mut line = Line::new();
        let _ = write!(line, "@kumo blk error=open");
        line.emit();
        sys::exit(1);
    };
    let ring = disk.queue.avail_addr();
    let header = ring + LOOP_HEADER_AT;
    let status = ring + LOOP_STATUS_AT;
    // SAFETY: the avail ring's page belongs to this queue; the ring itself ends long
    // before these bytes.
    unsafe {
        core::ptr::write_volatile(header as *mut u32, T_IN);
        core::ptr::write_volatile((header + 4) as *mut u32, 0);
        core::ptr::write_volatile((header + 8) as *mut u64, 0);
    }
    disk.queue.set_desc(0, header, 16, false);
    disk.queue.chain(0, 1);
    disk.queue.set_desc(1, ring, SECTOR as u32, true);
    disk.queue.chain(1, 2);
    disk.queue.set_desc(2, status, 1, true);
    disk.queue.push(0);
    disk.queue.publish();
    let mut polls = 0u64;
    while !disk.queue.has_used() && polls < POLL_LIMIT {
        polls += 1;
        core::hint::spin_loop();
    }
    sys::exit(STATUS_PROBE_DONE)
}

/// Doorbells [`bad_ring`] rings.
const BAD_RING_KICKS: u32 = 2000;

/// `blk=badring`: sets `avail.idx` further ahead than the queue has entries (a ring
/// the device must refuse) and rings the doorbell [`BAD_RING_KICKS`] times, then exits
/// with [`STATUS_PROBE_DONE`]. kumo must say so in a few lines, not one per doorbell.
pub fn bad_ring(info: &BootInfo) -> ! {
    let mut memory = Bump::new(info.heap_start, info.heap_end);
    let Ok(mut disk) = Disk::open(info, &mut memory) else {
        let mut line = Line::new();
        let _ = write!(line, "@kumo blk error=open");
        line.emit();
        sys::exit(1);
    };
    let beyond = disk.queue.size.wrapping_mul(2).wrapping_add(1);
    disk.queue.set_avail_idx(beyond);
    for _ in 0..BAD_RING_KICKS {
        disk.queue.kick();
    }
    sys::exit(STATUS_PROBE_DONE)
}
