//! virtio-blk (virtio 1.2 section 5.2): a disk backed by a raw image file, behind the
//! same PCI transport, chain walker and queue service as virtio-net.
//!
//! Requests: `IN` (read), `OUT` (write), `FLUSH` (fdatasync of the image) and
//! `GET_ID` (the 20-byte serial). Anything else is answered `UNSUPP`. A read-only disk
//! offers `VIRTIO_BLK_F_RO` and answers every write `IOERR`, leaving the file as it
//! was.
//!
//! Features offered: `VERSION_1`, `RING_EVENT_IDX`, `RING_INDIRECT_DESC`, `FLUSH`,
//! `SEG_MAX` (queue size - 2 data buffers), `BLK_SIZE` (512) and, read-only, `RO`.
//! Capacity is the image's size in 512-byte sectors, rounded down (a partial last
//! sector is not exposed).
//!
//! Every request chain is checked before a byte moves: the chain walk ([`chain`]:
//! loops, bad links, buffers outside guest memory), a 16-byte device-readable header,
//! data whose direction matches the request, a device-writable status byte last, a
//! whole number of sectors, at most [`MAX_DATA`] bytes, and sectors inside the image.
//! A chain the walk refuses is returned used with length 0 and counted as malformed;
//! a well-formed chain with a bad request gets status `IOERR`. Nothing a guest writes
//! can make this code panic, read or write the image outside its size, or write guest
//! memory outside the chain's device-writable buffers and the used ring.
//!
//! Threads: one queue under one lock, so requests are served in order by whoever
//! calls [`VirtioBlock::process`]: the vCPU thread whose doorbell write exited (I/O
//! on the vCPU) or a backend thread woken by the doorbell's ioeventfd. A driver reset
//! takes the same lock, so it waits for the request in progress.
//!
//! Bounded work: one call serves at most a queue's worth of requests (the most a
//! driver can have outstanding), then returns and says whether more are waiting. A
//! read whose data rewrites the ring (a guest making each request make another) thus
//! cannot keep the serving thread away from its stop and pause checks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use super::chain::{self, Segment};
use super::{
    ActivateError, Activation, InterruptCause, Served, TYPE_BLOCK, VirtioDevice, VirtioInterrupt,
    features, read_config_window, serve_chains, wants_interrupt,
};
use crate::guest_errors::GuestErrorLog;

pub const SECTOR_SIZE: u64 = 512;
/// Most data bytes one request may carry (larger ones get `IOERR`).
pub const MAX_DATA: usize = 4 << 20;

thread_local! {
    /// Each serving thread's bounce buffer, grown to the largest request it served
    /// and kept until the thread (the VM's disk or vCPU thread) ends: a fresh buffer
    /// per request of 128 KiB or more would be a new mapping, faulted in page by page
    /// (kumo keeps glibc's mmap threshold fixed: `kumo::heap`).
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
/// Bytes of `virtio_blk_outhdr` (type, reserved, sector).
pub const HEADER_LEN: usize = 16;
/// Bytes of the serial `GET_ID` returns.
pub const ID_LEN: usize = 20;
/// Default queue size.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Bytes of the device configuration kumo fills: capacity, size_max, seg_max,
/// geometry, blk_size.
const CONFIG_LEN: u64 = 24;

/// virtio-blk feature bits.
pub mod feature {
    pub const SEG_MAX: u64 = 1 << 2;
    pub const RO: u64 = 1 << 5;
    pub const BLK_SIZE: u64 = 1 << 6;
    pub const FLUSH: u64 = 1 << 9;
}

/// Request types.
pub mod request {
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
}

/// Status byte values.
pub mod status {
    pub const OK: u8 = 0;
    pub const IOERR: u8 = 1;
    pub const UNSUPP: u8 = 2;
}

/// How the VMM builds a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockConfig {
    pub readonly: bool,
    /// The serial `GET_ID` answers (NUL-padded).
    pub id: [u8; ID_LEN],
    /// Maximum queue size (a power of two, at most 32768).
    pub queue_size: u16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockError {
    #[error("queue size must be a power of two of at most 32768, not {0}")]
    QueueSize(u16),
    #[error("the disk image cannot be sized: {0}")]
    Image(String),
}

/// A snapshot of the device's counters (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests answered `IOERR` or `UNSUPP` (refused writes to a read-only disk,
    /// out-of-range sectors, bad lengths, host I/O errors, unknown types).
    pub errors: u64,
    /// Chains returned unused (the walk refused them, or no status byte).
    pub malformed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    malformed: AtomicU64,
}

fn count(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

struct Active {
    queue: Queue,
    interrupt: Arc<dyn VirtioInterrupt>,
}

/// The virtio-blk device model, generic over guest memory.
pub struct VirtioBlock<M> {
    config: BlockConfig,
    image: File,
    sectors: u64,
    mem: M,
    active: Mutex<Option<Active>>,
    counters: Counters,
    /// Broken rings, logged a few times, then counted.
    guest_errors: GuestErrorLog,
}

/// What one request came to: its status and the data bytes written into the chain.
struct Done {
    status: u8,
    written: usize,
}

impl Done {
    fn ok(written: usize) -> Done {
        Done {
            status: status::OK,
            written,
        }
    }

    fn err() -> Done {
        Done {
            status: status::IOERR,
            written: 0,
        }
    }
}

impl<M: GuestMemory + Send + Sync> VirtioBlock<M> {
    /// A disk on `image` (opened read-write unless `config.readonly`) in guest memory
    /// `mem`.
    pub fn new(config: BlockConfig, image: File, mem: M) -> Result<VirtioBlock<M>, BlockError> {
        if Queue::new(config.queue_size).is_err() {
            return Err(BlockError::QueueSize(config.queue_size));
        }
        let len = image
            .metadata()
            .map_err(|e| BlockError::Image(e.to_string()))?
            .len();
        Ok(VirtioBlock {
            image,
            sectors: len / SECTOR_SIZE,
            mem,
            guest_errors: GuestErrorLog::new(format!(
                "virtio-blk {}",
                String::from_utf8_lossy(&config.id).trim_end_matches('\0')
            )),
            active: Mutex::new(None),
            counters: Counters::default(),
            config,
        })
    }

    /// Capacity in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    pub fn readonly(&self) -> bool {
        self.config.readonly
    }

    pub fn is_active(&self) -> bool {
        self.lock().is_some()
    }

    pub fn stats(&self) -> BlockStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BlockStats {
            reads: get(&c.reads),
            writes: get(&c.writes),
            flushes: get(&c.flushes),
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
            errors: get(&c.errors),
            malformed: get(&c.malformed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Active>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves the requests the driver queued (on a doorbell, from whichever thread
    /// serves it), at most a queue's worth, and raises the queue's interrupt if the
    /// driver wants one. If the result says `more`, call again once the caller has
    /// looked at whether it must stop.
    pub fn process(&self) -> Served {
        let mut active = self.lock();
        let Some(Active { queue, interrupt }) = active.as_mut() else {
            return Served::default();
        };
        if !queue.ready() {
            return Served::default();
        }
        let mem = &self.mem;
        let budget = usize::from(queue.size());
        let served = serve_chains(queue, mem, budget, &self.guest_errors, |chain| {
            self.request(chain) as u32
        });
        if served.chains > 0 && wants_interrupt(queue, mem) {
            let interrupt = interrupt.clone();
            drop(active);
            interrupt.trigger(InterruptCause::Queue(0));
        }
        served
    }

    /// One request chain: its used length (data written plus the status byte), 0 if
    /// the chain is refused.
    fn request(&self, chain: virtio_queue::DescriptorChain<&M>) -> usize {
        // Header, data and status: MAX_DATA plus room for both.
        let walked = chain::walk_split(chain, MAX_DATA + HEADER_LEN + 1);
        let Some((readable, data_out, status_at)) = walked.ok().and_then(|(readable, writable)| {
            let (data_out, status_at) = split_status(&writable)?;
            Some((readable, data_out, status_at))
        }) else {
            count(&self.counters.malformed, 1);
            return 0;
        };
        let done = self.execute(&readable, &data_out);
        if done.status != status::OK {
            count(&self.counters.errors, 1);
        }
        if self.mem.write_obj(done.status, status_at).is_err() {
            count(&self.counters.malformed, 1);
            return 0;
        }
        done.written + 1
    }

    /// Carries out a well-formed chain's request: `readable` holds the header (and a
    /// write's data), `data_out` the device-writable buffers before the status byte.
    fn execute(&self, readable: &[Segment], data_out: &[Segment]) -> Done {
        let mut header = [0u8; HEADER_LEN];
        if chain::read_at(&self.mem, readable, 0, &mut header).is_err() {
            return Done::err();
        }
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let data_in = chain::capacity(readable) - HEADER_LEN;
        match kind {
            request::IN if data_in == 0 => self.read(sector, data_out),
            request::OUT if data_out.is_empty() => self.write(sector, readable, data_in),
            request::FLUSH if data_in == 0 => self.flush(),
            request::GET_ID if data_in == 0 => self.get_id(data_out),
            request::IN | request::OUT | request::FLUSH | request::GET_ID => Done::err(),
            _ => Done {
                status: status::UNSUPP,
                written: 0,
            },
        }
    }

    /// The image offset of `len` bytes at `sector`, if they are whole sectors inside
    /// the image and at most [`MAX_DATA`].
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        if len > MAX_DATA || !(len as u64).is_multiple_of(SECTOR_SIZE) {
            return None;
        }
        let end = sector.checked_add(len as u64 / SECTOR_SIZE)?;
        (end <= self.sectors).then(|| sector * SECTOR_SIZE)
    }

    fn read(&self, sector: u64, data_out: &[Segment]) -> Done {
        let len = chain::capacity(data_out);
        let Some(offset) = self.range(sector, len) else {
            return Done::err();
        };
        let copied = BOUNCE.with_borrow_mut(|bytes| {
            bytes.clear();
            bytes.resize(len, 0);
            if let Err(e) = self.image.read_exact_at(bytes, offset) {
                tracing::debug!("virtio-blk: reading {len} bytes at {offset:#x}: {e}");
                return false;
            }
            chain::scatter(&self.mem, data_out, &[bytes]).is_ok()
        });
        if !copied {
            return Done::err();
        }
        count(&self.counters.reads, 1);
        count(&self.counters.bytes_read, len as u64);
        Done::ok(len)
    }

    fn write(&self, sector: u64, readable: &[Segment], len: usize) -> Done {
        if self.config.readonly {
            return Done::err();
        }
        let Some(offset) = self.range(sector, len) else {
            return Done::err();
        };
        let written = BOUNCE.with_borrow_mut(|bytes| {
            bytes.clear();
            if chain::gather(&self.mem, readable, HEADER_LEN, bytes).is_err() {
                return false;
            }
            if let Err(e) = self.image.write_all_at(bytes, offset) {
                tracing::debug!("virtio-blk: writing {len} bytes at {offset:#x}: {e}");
                return false;
            }
            true
        });
        if !written {
            return Done::err();
        }
        count(&self.counters.writes, 1);
        count(&self.counters.bytes_written, len as u64);
        Done::ok(0)
    }

    fn flush(&self) -> Done {
        if self.config.readonly {
            return Done::ok(0);
        }
        if let Err(e) = self.image.sync_data() {
            tracing::debug!("virtio-blk: flush: {e}");
            return Done::err();
        }
        count(&self.counters.flushes, 1);
        Done::ok(0)
    }

    /// The serial, as much of it as the driver's buffer holds (virtio: no NUL when it
    /// is 20 bytes long).
    fn get_id(&self, data_out: &[Segment]) -> Done {
        let n = chain::capacity(data_out).min(ID_LEN);
        match chain::scatter(&self.mem, data_out, &[&self.config.id[..n]]) {
            Ok(written) => Done::ok(written),
            Err(_) => Done::err(),
        }
    }
}

/// Splits a request's device-writable buffers into the data buffers and the status
/// byte (the last byte of the last buffer).
fn split_status(writable: &[Segment]) -> Option<(Vec<Segment>, GuestAddress)> {
    let (last, rest) = writable.split_last()?;
    // `walk` skips empty buffers, so `last.len >= 1`; the address is in guest memory.
    let status_at = last.addr.checked_add(last.len as u64 - 1)?;
    let mut data = rest.to_vec();
    if last.len > 1 {
        data.push(Segment {
            addr: last.addr,
            len: last.len - 1,
        });
    }
    Some((data, status_at))
}

/// A serial for disk `index`: `kumo-disk-<index>`, NUL-padded.
pub fn default_id(index: usize) -> [u8; ID_LEN] {
    let mut id = [0u8; ID_LEN];
    let text = format!("kumo-disk-{index}");
    let n = text.len().min(ID_LEN);
    id[..n].copy_from_slice(&text.as_bytes()[..n]);
    id
}

impl<M: GuestMemory + Send + Sync> VirtioDevice for VirtioBlock<M> {
    fn device_type(&self) -> u16 {
        TYPE_BLOCK
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![self.config.queue_size]
    }

    fn features(&self) -> u64 {
        let mut offered = features::VERSION_1
            | features::RING_EVENT_IDX
            | features::RING_INDIRECT_DESC
            | feature::SEG_MAX
            | feature::BLK_SIZE
            | feature::FLUSH;
        if self.config.readonly {
            offered |= feature::RO;
        }
        offered
    }

    fn config_len(&self) -> u64 {
        CONFIG_LEN
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut image = [0u8; CONFIG_LEN as usize];
        image[0..8].copy_from_slice(&self.sectors.to_le_bytes());
        // size_max stays 0 (not offered); seg_max: the ring less header and status.
        let seg_max = u32::from(self.config.queue_size.saturating_sub(2).max(1));
        image[12..16].copy_from_slice(&seg_max.to_le_bytes());
        image[20..24].copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        read_config_window(&image, offset, data);
    }

    /// Every field kumo fills is read-only.
    fn write_config(&self, _offset: u64, _data: &[u8]) {}

    fn activate(&self, activation: Activation) -> Result<(), ActivateError> {
        let Activation {
            mut queues,
            interrupt,
            ..
        } = activation;
        if queues.len() != 1 {
            return Err(ActivateError::QueueCount {
                expected: 1,
                got: queues.len(),
            });
        }
        let queue = queues.remove(0);
        if !queue.ready() || !queue.is_valid(&self.mem) {
            return Err(ActivateError::QueueInvalid(0));
        }
        *self.lock() = Some(Active { queue, interrupt });
        Ok(())
    }

    fn reset(&self) {
        self.lock().take();
    }
}
