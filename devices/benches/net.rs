//! What domain 0 spends per frame between two guests, without the exits and the
//! interrupt injection, with used-ring updates on both sides:
//! - `a_to_b`: guest A's TX chain gathered by virtio-net, switched (learning table,
//!   per-source FIFO, one copy into a shared buffer), scattered into guest B's RX chain;
//! - `a_to_b_direct`: the switch routes by the header and the frame is copied straight
//!   from A's TX buffers into B's RX buffers;
//! - `switch_copy`: the switched path's intermediate copy alone (allocate and copy).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use devices::net::switch::{Route, Sources, Switch, SwitchConfig};
use devices::virtio::net::{HEADER_LEN, NetConfig, RxOutcome, VirtioNet};
use devices::virtio::{Activation, InterruptCause, VirtioDevice, VirtioInterrupt, features};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

type Mem = GuestMemoryMmap<()>;

const QSIZE: u16 = 256;
const WRITE: u16 = 2;
const BUFFER: u64 = 0x100000;

struct Null;

impl VirtioInterrupt for Null {
    fn trigger(&self, cause: InterruptCause) {
        black_box(cause);
    }
}

/// Rings of queue `q` at 0x10000 + 0x4000 q: descriptors, avail (+0x1000), used (+0x2000).
fn ring(q: u64) -> (u64, u64, u64) {
    let base = 0x10000 + 0x4000 * q;
    (base, base + 0x1000, base + 0x2000)
}

fn write_desc(mem: &Mem, q: u64, index: u64, addr: u64, len: u32, flags: u16) {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&flags.to_le_bytes());
    mem.write_slice(&raw, GuestAddress(ring(q).0 + 16 * index))
        .unwrap();
}

/// Offers descriptor 0 once more on queue `q` (avail slot `n`).
fn offer(mem: &Mem, q: u64, n: u16) {
    let avail = ring(q).1;
    mem.write_obj(0u16, GuestAddress(avail + 4 + 2 * u64::from(n % QSIZE)))
        .unwrap();
    mem.write_obj(n.wrapping_add(1), GuestAddress(avail + 2))
        .unwrap();
}

fn nic(mem: &Mem, mac: u8) -> VirtioNet<Mem> {
    let net = VirtioNet::new(
        NetConfig {
            mac: [0x52, 0x54, 0, 0, 0, mac],
            queue_pairs: 1,
            queue_size: QSIZE,
        },
        mem.clone(),
    )
    .unwrap();
    let queues = (0..2)
        .map(|q| {
            let (desc, avail, used) = ring(q);
            let mut queue = Queue::new(QSIZE).unwrap();
            queue
                .try_set_desc_table_address(GuestAddress(desc))
                .unwrap();
            queue
                .try_set_avail_ring_address(GuestAddress(avail))
                .unwrap();
            queue.try_set_used_ring_address(GuestAddress(used)).unwrap();
            queue.set_ready(true);
            queue
        })
        .collect();
    net.activate(Activation {
        features: features::VERSION_1,
        queues,
        interrupt: Arc::new(Null),
    })
    .unwrap();
    net
}

fn forward(c: &mut Criterion) {
    let mut group = c.benchmark_group("net");
    for size in [64usize, 1514, 65535] {
        let (mem_a, mem_b): (Mem, Mem) = (
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200000)]).unwrap(),
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x200000)]).unwrap(),
        );
        let (a, b) = (nic(&mem_a, 1), nic(&mem_b, 2));
        let mut switch = Switch::new(SwitchConfig::default());
        let (pa, pb) = (
            switch.add_port(Sources::Foreign),
            switch.add_port(Sources::Foreign),
        );
        let mut frame = vec![0u8; HEADER_LEN + size];
        frame[HEADER_LEN..HEADER_LEN + 6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
        frame[HEADER_LEN + 6..HEADER_LEN + 12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        mem_a.write_slice(&frame, GuestAddress(BUFFER)).unwrap();
        write_desc(&mem_a, 1, 0, BUFFER, frame.len() as u32, 0);
        write_desc(&mem_b, 0, 0, BUFFER, 0x10000 + HEADER_LEN as u32, WRITE);
        // B announces itself so the frames are unicast.
        let mut hello = vec![0xffu8; HEADER_LEN + 60];
        hello[HEADER_LEN + 6..HEADER_LEN + 12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
        mem_b
            .write_slice(&hello, GuestAddress(BUFFER + 0x20000))
            .unwrap();
        write_desc(&mem_b, 1, 0, BUFFER + 0x20000, hello.len() as u32, 0);
        offer(&mem_b, 1, 0);
        b.transmit(0, |f| switch.ingress(pb, f).taken());
        switch.egress(pa, |_| true);
        let mut n = 0u16;
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("a_to_b", size), &size, |bench, _| {
            bench.iter(|| {
                offer(&mem_a, 1, n);
                offer(&mem_b, 0, n);
                n = n.wrapping_add(1);
                let sent = a.transmit(0, |f| switch.ingress(pa, f).taken()).frames;
                let got = b.receive_batch(|rx| switch.egress(pb, |f| rx.push(f).consumed()));
                assert_eq!((sent, got.delivered), (1, 1));
            })
        });
        group.bench_with_input(
            BenchmarkId::new("a_to_b_direct", size),
            &size,
            |bench, _| {
                bench.iter(|| {
                    offer(&mem_a, 1, n);
                    offer(&mem_b, 0, n);
                    n = n.wrapping_add(1);
                    let sent = a
                        .transmit_frames(0, |f| match switch.route(pa, f.header(), f.len()) {
                            Route::Direct(port) => {
                                assert_eq!(port, pb);
                                let delivered = b.receive_batch(|rx| rx.push_frame(f));
                                assert_eq!(delivered, RxOutcome::Delivered);
                                switch.delivered_direct(f.len());
                                true
                            }
                            Route::Switched => switch.ingress(pa, f.bytes()).taken(),
                        })
                        .frames;
                    assert_eq!(sent, 1);
                })
            },
        );
        let payload = vec![7u8; size];
        group.bench_with_input(BenchmarkId::new("switch_copy", size), &size, |bench, _| {
            bench.iter(|| black_box(Arc::<[u8]>::from(black_box(&payload[..]))))
        });
    }
    group.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
