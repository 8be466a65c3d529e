//! Tests of virtio-blk as a driver sees it: requests built in guest memory on a ring,
//! served against a real image file; through the PCI transport; and a proptest over
//! arbitrary rings and requests.

use std::fs::File;
use std::io::Write;
use std::sync::Arc;

use proptest::prelude::*;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::block::{
    BlockConfig, BlockStats, HEADER_LEN, ID_LEN, MAX_DATA, VirtioBlock, default_id, feature,
    request, status,
};
use super::tests::{
    Mem, NEXT, P_BUFFERS, P_MEM, QSIZE, Recorder, Ring, WRITE, memory, p_queue, writable_bytes,
};
use super::transport::{DEVICE_CONFIG_OFFSET, VirtioPciDevice};
use super::{Activation, InterruptCause, VirtioDevice, features};

const SECTORS: u64 = 64;

/// An image of `SECTORS` sectors, byte `i` = `i * 7 + i / 512` (so each sector
/// differs), in a file of its own.
fn image(name: &str) -> (std::path::PathBuf, Vec<u8>) {
    sized_image(name, SECTORS)
}

fn sized_image(name: &str, sectors: u64) -> (std::path::PathBuf, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("kumo-blk-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..sectors as usize * 512)
        .map(|i| (i * 7 + i / 512) as u8)
        .collect();
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    (path, bytes)
}

fn open(path: &std::path::Path, readonly: bool) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(!readonly)
        .open(path)
        .unwrap()
}

fn disk(path: &std::path::Path, readonly: bool, mem: &Mem) -> Arc<VirtioBlock<Mem>> {
    Arc::new(
        VirtioBlock::new(
            BlockConfig {
                readonly,
                id: default_id(3),
                queue_size: QSIZE,
            },
            open(path, readonly),
            mem.clone(),
        )
        .unwrap(),
    )
}

/// A disk activated directly on a ring at 0x10000.
fn active(
    path: &std::path::Path,
    readonly: bool,
) -> (Arc<VirtioBlock<Mem>>, Ring, Arc<Recorder>, Mem) {
    let mem = memory();
    let blk = disk(path, readonly, &mem);
    let ring = Ring::at(0x10000, QSIZE);
    let rec = Arc::new(Recorder::default());
    blk.activate(Activation {
        features: features::VERSION_1,
        queues: vec![ring.queue(false)],
        interrupt: rec.clone(),
    })
    .unwrap();
    (blk, ring, rec, mem)
}

const HEADER_AT: u64 = 0x20000;
const DATA_AT: u64 = 0x21000;
const STATUS_AT: u64 = 0x30000;

/// Queues one request: header (`kind`, `sector`), `data` bytes of data (the device
/// reads them for OUT, writes them otherwise), a status byte. Descriptors from `first`.
fn submit(mem: &Mem, ring: &mut Ring, first: u16, kind: u32, sector: u64, data: usize, out: &[u8]) {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&kind.to_le_bytes());
    header[8..].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&header, GuestAddress(HEADER_AT)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(STATUS_AT)).unwrap();
    let mut next = first;
    ring.desc(mem, next, HEADER_AT, HEADER_LEN as u32, NEXT, next + 1);
    next += 1;
    if data > 0 {
        let flags = if kind == request::OUT {
            NEXT
        } else {
            NEXT | WRITE
        };
        mem.write_slice(out, GuestAddress(DATA_AT)).unwrap();
        ring.desc(mem, next, DATA_AT, data as u32, flags, next + 1);
        next += 1;
    }
    ring.desc(mem, next, STATUS_AT, 1, WRITE, 0);
    ring.offer(mem, first);
}

fn status_byte(mem: &Mem) -> u8 {
    mem.read_obj(GuestAddress(STATUS_AT)).unwrap()
}

fn data(mem: &Mem, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    mem.read_slice(&mut out, GuestAddress(DATA_AT)).unwrap();
    out
}

#[test]
fn reads_return_the_image_and_writes_reach_the_file() {
    let (path, bytes) = image("rw.img");
    let (blk, mut ring, rec, mem) = active(&path, false);
    assert_eq!(blk.sectors(), SECTORS);

    submit(&mem, &mut ring, 0, request::IN, 3, 1024, &[]);
    assert_eq!(blk.process().chains, 1);
    assert_eq!(status_byte(&mem), status::OK);
    assert_eq!(data(&mem, 1024), bytes[3 * 512..5 * 512]);
    assert_eq!(ring.used(&mem, 0).1, 1025, "data and status written");
    assert_eq!(*rec.causes.lock().unwrap(), vec![InterruptCause::Queue(0)]);

    let pattern = vec![0x5a; 512];
    submit(&mem, &mut ring, 3, request::OUT, SECTORS - 1, 512, &pattern);
    assert_eq!(blk.process().chains, 1);
    assert_eq!(status_byte(&mem), status::OK);
    assert_eq!(ring.used(&mem, 1).1, 1, "only the status byte");
    submit(&mem, &mut ring, 6, request::FLUSH, 0, 0, &[]);
    blk.process();
    assert_eq!(status_byte(&mem), status::OK);
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len(), bytes.len(), "the image never grows");
    assert_eq!(file[(SECTORS as usize - 1) * 512..], pattern[..]);
    assert_eq!(
        file[..(SECTORS as usize - 1) * 512],
        bytes[..(SECTORS as usize - 1) * 512]
    );
    assert_eq!(
        blk.stats(),
        BlockStats {
            reads: 1,
            writes: 1,
            flushes: 1,
            bytes_read: 1024,
            bytes_written: 512,
            ..BlockStats::default()
        }
    );
}

#[test]
fn a_read_only_disk_refuses_writes_and_says_so() {
    let (path, bytes) = image("ro.img");
    let (blk, mut ring, _, mem) = active(&path, true);
    assert_ne!(VirtioDevice::features(&*blk) & feature::RO, 0);
    submit(&mem, &mut ring, 0, request::OUT, 0, 512, &[0xee; 512]);
    blk.process();
    assert_eq!(status_byte(&mem), status::IOERR);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    submit(&mem, &mut ring, 3, request::IN, 0, 512, &[]);
    blk.process();
    assert_eq!(status_byte(&mem), status::OK);
    assert_eq!(data(&mem, 512), bytes[..512]);
    assert_eq!(blk.stats().errors, 1);
}

#[test]
fn bad_requests_get_ioerr_or_unsupp() {
    let (path, bytes) = image("bad.img");
    let (blk, mut ring, _, mem) = active(&path, false);
    let cases: [(u32, u64, usize, u8); 7] = [
        (request::IN, SECTORS, 512, status::IOERR), // past the end
        (request::IN, SECTORS - 1, 1024, status::IOERR), // runs past the end
        (request::IN, u64::MAX, 512, status::IOERR), // sector overflow
        (request::IN, 0, 100, status::IOERR),       // not whole sectors
        (request::OUT, SECTORS, 512, status::IOERR),
        (request::OUT, 1, 3, status::IOERR),
        (99, 0, 0, status::UNSUPP),
    ];
    for (kind, sector, len, expected) in cases {
        // Served at once, so the descriptors can be reused.
        submit(&mem, &mut ring, 0, kind, sector, len, &vec![0x11; len]);
        assert_eq!(blk.process().chains, 1);
        assert_eq!(status_byte(&mem), expected, "{kind} {sector} {len}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(blk.stats().errors, cases.len() as u64);
}

#[test]
fn get_id_returns_the_serial() {
    let (path, _) = image("id.img");
    let (blk, mut ring, _, mem) = active(&path, false);
    submit(&mem, &mut ring, 0, request::GET_ID, 0, ID_LEN, &[0; ID_LEN]);
    blk.process();
    assert_eq!(status_byte(&mem), status::OK);
    assert_eq!(&data(&mem, ID_LEN)[..11], b"kumo-disk-3");
    assert_eq!(ring.used(&mem, 0).1, ID_LEN as u32 + 1);
}

#[test]
fn chains_without_a_status_byte_are_returned_unused() {
    let (path, _) = image("nostatus.img");
    let (blk, mut ring, _, mem) = active(&path, false);
    // Header only, device-readable, no writable byte at all.
    ring.desc(&mem, 0, HEADER_AT, HEADER_LEN as u32, 0, 0);
    ring.offer(&mem, 0);
    // A readable buffer after a writable one.
    ring.desc(&mem, 1, STATUS_AT, 1, WRITE | NEXT, 2);
    ring.desc(&mem, 2, HEADER_AT, HEADER_LEN as u32, 0, 0);
    ring.offer(&mem, 1);
    assert_eq!(blk.process().chains, 2);
    assert_eq!(ring.used(&mem, 0).1, 0);
    assert_eq!(ring.used(&mem, 1).1, 0);
    assert_eq!(blk.stats().malformed, 2);
}

#[test]
fn the_transport_shows_capacity_and_a_reset_stops_service() {
    let (path, _) = image("pci.img");
    let mem = memory();
    let blk = disk(&path, false, &mem);
    let rec = Arc::new(Recorder::default());
    let dev = VirtioPciDevice::new(blk.clone(), rec.clone(), rec.clone()).unwrap();
    let mut config = [0u8; 24];
    dev.read_bar(0, DEVICE_CONFIG_OFFSET, &mut config);
    assert_eq!(u64::from_le_bytes(config[..8].try_into().unwrap()), SECTORS);
    assert_eq!(u32::from_le_bytes(config[20..24].try_into().unwrap()), 512);
    assert_eq!(
        u32::from_le_bytes(config[12..16].try_into().unwrap()),
        u32::from(QSIZE - 2)
    );
    let mut ring = Ring::at(0x10000, QSIZE);
    blk.activate(Activation {
        features: features::VERSION_1,
        queues: vec![ring.queue(false)],
        interrupt: rec.clone(),
    })
    .unwrap();
    blk.reset();
    submit(&mem, &mut ring, 0, request::IN, 0, 512, &[]);
    assert_eq!(blk.process().chains, 0, "a reset device serves nothing");
    assert!(!blk.is_active());
}

#[test]
fn a_file_with_a_partial_last_sector_exposes_whole_sectors_only() {
    let (path, _) = image("partial.img");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[1; 100])
        .unwrap();
    let mem = memory();
    assert_eq!(disk(&path, true, &mem).sectors(), SECTORS);
}

const P_IMAGE_SECTORS: u64 = 16;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary rings whose buffers hold plausible request headers: the device never
    /// panics, never writes guest memory outside the buffers the descriptors offer
    /// (and the used ring), never grows the image, and a read-only image never changes.
    #[test]
    fn arbitrary_requests_never_panic_or_write_outside_the_chain(
        queue in p_queue(0, 0x6000),
        headers in proptest::collection::vec(
            (prop_oneof![4 => 0u32..2, 1 => Just(4u32), 1 => Just(8u32), 1 => any::<u32>()],
             prop_oneof![4 => 0u64..P_IMAGE_SECTORS + 2, 1 => any::<u64>()]),
            1..32),
        readonly in any::<bool>(),
        event_idx in any::<bool>(),
    ) {
        let mem: Mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), P_MEM)]).unwrap();
        // The buffer area: header records, repeated (descriptors land at any offset).
        let mut record = Vec::new();
        for (kind, sector) in &headers {
            record.extend_from_slice(&kind.to_le_bytes());
            record.extend_from_slice(&[0; 4]);
            record.extend_from_slice(&sector.to_le_bytes());
        }
        for at in (P_BUFFERS..P_MEM as u64).step_by(record.len()) {
            let n = record.len().min((P_MEM as u64 - at) as usize);
            mem.write_slice(&record[..n], GuestAddress(at)).unwrap();
        }
        queue.install(&mem);
        let allowed = writable_bytes(&[(queue.used, queue.size)], queue.installed().iter());
        let mut before = vec![0u8; P_MEM];
        mem.read_slice(&mut before, GuestAddress(0)).unwrap();

        let (path, bytes) = sized_image(&format!("prop-{readonly}.img"), P_IMAGE_SECTORS);
        let file = open(&path, readonly);
        let blk = VirtioBlock::new(
            BlockConfig { readonly, id: default_id(0), queue_size: queue.size },
            file,
            mem.clone(),
        ).unwrap();
        let rec = Arc::new(Recorder::default());
        let offered = VirtioDevice::features(&blk);
        let negotiated = if event_idx { offered } else { offered & !features::RING_EVENT_IDX };
        let mut q = queue.queue();
        q.set_event_idx(negotiated & features::RING_EVENT_IDX != 0);
        if blk.activate(Activation { features: negotiated, queues: vec![q], interrupt: rec }).is_ok() {
            blk.process();
            blk.process();
        }

        let mut after = vec![0u8; P_MEM];
        mem.read_slice(&mut after, GuestAddress(0)).unwrap();
        for (at, (b, a)) in before.iter().zip(&after).enumerate() {
            prop_assert!(b == a || allowed[at], "byte {:#x} changed ({} -> {}) outside offered buffers", at, b, a);
        }
        let file = std::fs::read(&path).unwrap();
        prop_assert_eq!(file.len() as u64, P_IMAGE_SECTORS * 512, "the image never grows");
        if readonly {
            prop_assert!(file == bytes, "a read-only image never changes");
        }
        let stats = blk.stats();
        prop_assert!(stats.bytes_read <= (MAX_DATA as u64) * 2 * u64::from(queue.size));
    }
}

/// One request as a plausible (sometimes broken) driver would queue it.
#[derive(Debug, Clone)]
struct PRequest {
    kind: u32,
    sector: u64,
    /// Data buffers: (length, device-writable).
    data: Vec<(u32, bool)>,
    /// Status buffer length (1 is right; 0 leaves it out).
    status_len: u32,
    /// Header length (16 is right).
    header_len: u32,
    /// Put the last data buffer outside guest memory.
    outside: bool,
}

fn p_request() -> impl Strategy<Value = PRequest> {
    let kind = prop_oneof![4 => Just(request::IN), 4 => Just(request::OUT),
        1 => Just(request::FLUSH), 1 => Just(request::GET_ID), 1 => any::<u32>()];
    let sector = prop_oneof![8 => 0u64..P_IMAGE_SECTORS + 2, 1 => any::<u64>()];
    let len = prop_oneof![4 => Just(512u32), 2 => Just(1024), 1 => Just(20), 1 => 0u32..1500];
    let data = proptest::collection::vec(
        (
            len,
            prop_oneof![8 => Just(None), 1 => any::<bool>().prop_map(Some)],
        ),
        0..3,
    );
    (
        kind,
        sector,
        data,
        prop_oneof![8 => Just(1u32), 1 => 0u32..3],
        prop_oneof![8 => Just(16u32), 1 => 0u32..24],
        prop_oneof![15 => Just(false), 1 => Just(true)],
    )
        .prop_map(
            |(kind, sector, data, status_len, header_len, outside)| PRequest {
                kind,
                sector,
                // Data direction as the request type wants, unless overridden.
                data: data
                    .into_iter()
                    .map(|(len, flip)| (len, flip.unwrap_or(kind != request::OUT)))
                    .collect(),
                status_len,
                header_len,
                outside,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Plausible request chains with every kind of mistake mixed in: the device never
    /// panics, writes guest memory only inside the chains' device-writable buffers and
    /// the used ring, changes the image only by whole in-range sectors of OUT requests
    /// on a writable disk, and answers every well-formed request.
    #[test]
    fn plausible_requests_are_served_and_bounded(
        requests in proptest::collection::vec(p_request(), 1..5),
        readonly in any::<bool>(),
        fill in any::<u8>(),
    ) {
        let mem: Mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), P_MEM)]).unwrap();
        let mut ring = Ring::at(0x1000, QSIZE);
        // Buffers from P_BUFFERS on, each request's in a fresh place.
        let mut next_buffer = P_BUFFERS;
        let mut next_desc = 0u16;
        let mut allowed_ranges = Vec::new();
        for r in &requests {
            let head = next_desc;
            let mut descs: Vec<(u64, u32, bool)> = Vec::new();
            let mut header = [0u8; HEADER_LEN];
            header[..4].copy_from_slice(&r.kind.to_le_bytes());
            header[8..].copy_from_slice(&r.sector.to_le_bytes());
            mem.write_slice(&header, GuestAddress(next_buffer)).unwrap();
            descs.push((next_buffer, r.header_len, false));
            next_buffer += 32;
            for (i, &(len, writable)) in r.data.iter().enumerate() {
                let at = if r.outside && i + 1 == r.data.len() { P_MEM as u64 - 8 } else { next_buffer };
                mem.write_slice(&vec![fill; (len as usize).min(P_MEM - at as usize)], GuestAddress(at)).unwrap();
                descs.push((at, len, writable));
                next_buffer += u64::from(len).next_multiple_of(16);
            }
            if r.status_len > 0 {
                descs.push((next_buffer, r.status_len, true));
                next_buffer += 16;
            }
            for (i, &(addr, len, writable)) in descs.iter().enumerate() {
                let last = i + 1 == descs.len();
                let flags = if writable { WRITE } else { 0 } | if last { 0 } else { NEXT };
                ring.desc(&mem, next_desc, addr, len, flags, next_desc + 1);
                if writable {
                    allowed_ranges.push((addr, u64::from(len)));
                }
                next_desc += 1;
            }
            ring.offer(&mem, head);
        }
        prop_assume!(next_buffer < P_MEM as u64 && next_desc <= QSIZE);
        let mut before = vec![0u8; P_MEM];
        mem.read_slice(&mut before, GuestAddress(0)).unwrap();

        let (path, bytes) = sized_image(&format!("plausible-{readonly}.img"), P_IMAGE_SECTORS);
        let blk = VirtioBlock::new(
            BlockConfig { readonly, id: default_id(0), queue_size: QSIZE },
            open(&path, readonly),
            mem.clone(),
        ).unwrap();
        let rec = Arc::new(Recorder::default());
        blk.activate(Activation { features: features::VERSION_1, queues: vec![ring.queue(false)], interrupt: rec }).unwrap();
        prop_assert_eq!(blk.process().chains, requests.len(), "every chain is returned");

        let mut after = vec![0u8; P_MEM];
        mem.read_slice(&mut after, GuestAddress(0)).unwrap();
        let used_ring = 0x1800..0x1800 + 6 + 8 * u64::from(QSIZE);
        for (at, (b, a)) in before.iter().zip(&after).enumerate() {
            let at = at as u64;
            let inside = used_ring.contains(&at)
                || allowed_ranges.iter().any(|&(s, l)| (s..s + l).contains(&at));
            prop_assert!(b == a || inside, "byte {:#x} changed outside the chains' writable buffers", at);
        }
        let file = std::fs::read(&path).unwrap();
        prop_assert_eq!(file.len(), bytes.len(), "the image never grows");
        for (sector, (old, new)) in bytes.chunks(512).zip(file.chunks(512)).enumerate() {
            if old != new {
                prop_assert!(!readonly, "a read-only image changed");
                prop_assert!(new.iter().all(|&b| b == fill), "sector {} holds bytes no request wrote", sector);
            }
        }
        let stats = blk.stats();
        let answered = stats.reads + stats.writes + stats.flushes + stats.errors + stats.malformed;
        // GET_ID and read-only flushes are answered OK without a counter of their own.
        prop_assert!(answered <= requests.len() as u64);
    }
}

#[test]
fn the_plausible_request_strategy_reaches_real_reads_and_writes() {
    // Guards the proptest above against generating only refusals: a plain read and
    // write through the same path succeed.
    let (path, bytes) = sized_image("guard.img", P_IMAGE_SECTORS);
    let (blk, mut ring, _, mem) = active(&path, false);
    submit(
        &mem,
        &mut ring,
        0,
        request::IN,
        P_IMAGE_SECTORS - 1,
        512,
        &[],
    );
    blk.process();
    assert_eq!(status_byte(&mem), status::OK);
    assert_eq!(data(&mem, 512), bytes[bytes.len() - 512..]);
}

/// A read whose data buffer is the avail ring and the request's own header: each one
/// makes one more request available, for the next sector. The device must stop after
/// a queue's worth and say more is waiting, not serve the chain reaction forever.
#[test]
fn a_request_that_makes_requests_is_served_a_queue_s_worth_at_a_time() {
    const AVAIL: u64 = 0x10400; // Ring::at(0x10000, ..)'s avail ring
    const HEADER: u64 = AVAIL + 512 - HEADER_LEN as u64;
    let dir = std::env::temp_dir().join(format!("kumo-blk-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("loop.img");
    let mut bytes = vec![0u8; SECTORS as usize * 512];
    for (j, sector) in bytes.chunks_mut(512).enumerate() {
        sector[2..4].copy_from_slice(&((j + 2) as u16).to_le_bytes());
        sector[504..512].copy_from_slice(&(j as u64 + 1).to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    let (blk, mut ring, _rec, mem) = active(&path, false);
    let header = [0u8; HEADER_LEN]; // read, sector 0
    mem.write_slice(&header, GuestAddress(HEADER)).unwrap();
    ring.desc(&mem, 0, HEADER, HEADER_LEN as u32, NEXT, 1);
    ring.desc(&mem, 1, AVAIL, 512, NEXT | WRITE, 2);
    ring.desc(&mem, 2, STATUS_AT, 1, WRITE, 0);
    ring.offer(&mem, 0);
    let first = blk.process();
    assert_eq!(first.chains, usize::from(QSIZE), "one queue's worth");
    assert!(first.more, "and the rest is said to wait");
    let second = blk.process();
    assert_eq!(second.chains, usize::from(QSIZE), "the next call goes on");
    assert_eq!(blk.stats().reads, 2 * u64::from(QSIZE));
}
