//! virtio-net (virtio 1.2 section 5.1): the NIC every kumo guest sees, behind the PCI
//! transport. Its backend is whoever calls [`VirtioNet::transmit`] (or
//! [`VirtioNet::transmit_frames`], which leaves a frame in guest memory so it can be
//! copied straight into another NIC with [`RxBatch::push_frame`]) and
//! [`VirtioNet::receive_batch`]: in kumo, domain 0's switch threads.
//!
//! Features offered: `VERSION_1`, `MAC`, `STATUS` (link always up),
//! `RING_INDIRECT_DESC`, `RING_EVENT_IDX`, and with more than one queue pair
//! `CTRL_VQ` + `MQ` (one pair per vCPU; the control queue takes only
//! `VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET`). No checksum or segmentation offloads and no
//! `MRG_RXBUF`, so every frame is a whole Ethernet frame in one chain.
//!
//! Header layout: with `VERSION_1` every buffer starts with the 12-byte
//! `virtio_net_hdr_v1` (`flags`, `gso_type`, `hdr_len`, `gso_size`, `csum_start`,
//! `csum_offset`, `num_buffers`), whether or not `MRG_RXBUF` is negotiated. TX
//! strips it (its fields must be zero without offloads and are ignored); RX writes
//! it zeroed with `num_buffers = 1`.
//!
//! Limits: a TX chain holds at most [`HEADER_LEN`] + [`MAX_FRAME_LEN`] = 65562 bytes.
//! An RX frame goes into one chain that must hold header and frame; a frame larger
//! than the buffer at the head of the ring is dropped and counted (as a NIC counts a
//! length error), the buffer stays for the next frame.
//!
//! Queues: RX of pair `p` is queue `2p`, TX is `2p + 1`, the control queue (with MQ)
//! is `2 * pairs`. Receive steering (virtio's "automatic receive steering"): a frame
//! goes to the pair that last transmitted from its destination MAC, else pair 0, so a
//! guest that gives each vCPU's rank its own MAC gets each rank's traffic on its own
//! pair.
//!
//! Threads: each queue has its own lock, so one backend thread per queue pair can
//! run TX and RX in parallel. Lock order: a TX queue, then (direct path) another NIC's
//! RX queues, then the switch; as in `transmit(p, |f| switch.lock().ingress(..))`,
//! `transmit_frames(p, |f| other.receive_batch(|rx| rx.push_frame(f)))` and
//! `receive_batch(|rx| switch.lock().egress(port, |f| rx.push(f).consumed()))`. Never
//! take a NIC's queue while holding the switch except through these closures, and
//! never transmit from inside `receive_batch`. A driver reset quiesces the data path
//! before the transport reports it.
//!
//! Malformed chains (broken, looping, wrong direction, outside guest memory, too
//! long) are returned to the guest as used with length 0 and counted; nothing a guest
//! writes into its rings can make this code panic or write outside the buffers the
//! chain offered (and the used ring).

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemory;

use super::chain::{self, ChainError, Direction, Segment};
use super::{
    ActivateError, Activation, InterruptCause, TYPE_NET, VirtioDevice, VirtioInterrupt, WriteLog,
    features, pop_chain, read_config_window, serve_chains, wants_interrupt,
};
use crate::guest_errors::GuestErrorLog;

/// Bytes of `virtio_net_hdr_v1`.
pub const HEADER_LEN: usize = 12;
/// Bytes of an Ethernet header (destination, source, EtherType).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// The `virtio_net_hdr_v1` every received frame gets: no offloads, one buffer.
const RX_HEADER: [u8; HEADER_LEN] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];
/// Largest Ethernet frame the device carries (see [`crate::net::MAX_FRAME_LEN`]).
pub use crate::net::MAX_FRAME_LEN;
// With its header a frame fills Firecracker's 65562-byte buffers exactly.
const _: () = assert!(HEADER_LEN + MAX_FRAME_LEN == 65562);
/// Default queue size.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Most queue pairs (the transport's 255 queues, less the control queue).
pub const MAX_QUEUE_PAIRS: u16 = 127;

/// virtio-net feature bits.
pub mod feature {
    pub const MAC: u64 = 1 << 5;
    pub const STATUS: u64 = 1 << 16;
    pub const CTRL_VQ: u64 = 1 << 17;
    pub const MQ: u64 = 1 << 22;
}

/// Control queue classes, commands and acks.
const CTRL_MQ: u8 = 4;
const CTRL_MQ_VQ_PAIRS_SET: u8 = 0;
const CTRL_OK: u8 = 0;
const CTRL_ERR: u8 = 1;
/// Status field: link up.
const LINK_UP: u16 = 1;
/// Bytes of the device configuration: mac, status, max_virtqueue_pairs.
const CONFIG_LEN: u64 = 10;
/// Source MACs remembered for receive steering.
const STEERING_ENTRIES: usize = 64;

/// How the VMM builds a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    pub mac: [u8; 6],
    /// Queue pairs (one per vCPU is the intent), 1..=[`MAX_QUEUE_PAIRS`].
    pub queue_pairs: u16,
    /// Maximum size of every queue (a power of two, at most 32768).
    pub queue_size: u16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetError {
    #[error("queue pairs must be 1..={MAX_QUEUE_PAIRS}, not {0}")]
    QueuePairs(u16),
    #[error("queue size must be a power of two of at most 32768, not {0}")]
    QueueSize(u16),
}

/// What a queue index is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRole {
    Rx(u16),
    Tx(u16),
    Ctrl,
}

/// Counters (monotonic).
#[derive(Debug, Default)]
struct Counters {
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
    tx_malformed: AtomicU64,
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    rx_malformed: AtomicU64,
    rx_too_big: AtomicU64,
    rx_no_buffer: AtomicU64,
    rx_inactive: AtomicU64,
    ctrl_commands: AtomicU64,
    ctrl_malformed: AtomicU64,
}

/// A snapshot of the device's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// TX chains refused (returned to the guest unsent).
    pub tx_malformed: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// RX chains refused (returned to the guest unused).
    pub rx_malformed: u64,
    /// Frames dropped: larger than the guest's buffer or than [`MAX_FRAME_LEN`].
    pub rx_too_big: u64,
    /// Times a frame found no RX buffer and was left with the caller.
    pub rx_no_buffer: u64,
    /// Frames dropped because the driver had not activated the device.
    pub rx_inactive: u64,
    pub ctrl_commands: u64,
    pub ctrl_malformed: u64,
}

/// The outcome of one TX pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxReport {
    /// Frames handed to the caller.
    pub frames: usize,
    /// Chains refused.
    pub malformed: usize,
    /// The caller refused a frame (back-pressure): call again when it can take more.
    pub stopped: bool,
    /// The pass used up its budget ([`VirtioNet::transmit_bounded`]) with more
    /// possibly queued: call again after serving the other queues (no notification
    /// will come for them).
    pub more: bool,
}

/// What became of a frame offered for reception.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written into a guest buffer.
    Delivered,
    /// No RX buffer: nothing was written; the caller keeps the frame and offers it
    /// again after the guest notifies the RX queue.
    NoBuffer,
    /// Dropped and counted: larger than the guest's buffer or [`MAX_FRAME_LEN`].
    TooBig,
    /// Dropped and counted: the driver has not activated the device (or its queue).
    Inactive,
}

impl RxOutcome {
    /// Whether the frame is gone from the caller's point of view (delivered or
    /// dropped and counted), as opposed to held.
    pub fn consumed(self) -> bool {
        self != RxOutcome::NoBuffer
    }
}

struct Active {
    features: u64,
    queues: Vec<Mutex<Queue>>,
    interrupt: Arc<dyn VirtioInterrupt>,
    pairs_in_use: AtomicU16,
    /// Set by reset: the queues belong to a driver instance that is gone.
    dead: AtomicBool,
    /// (source MAC, pair) of recent transmissions, newest last.
    steering: Mutex<Vec<([u8; 6], u16)>>,
}

impl Active {
    /// Queue `index`, locked; `None` once the device was reset (so a backend thread
    /// that still holds this `Active` stops touching the old driver's rings).
    fn queue(&self, index: u16) -> Option<MutexGuard<'_, Queue>> {
        let queue = self.queues.get(usize::from(index))?;
        let guard = queue.lock().unwrap_or_else(|e| e.into_inner());
        (!self.dead.load(Ordering::SeqCst)).then_some(guard)
    }

    fn learn(&self, frame: &[u8], pair: u16) {
        let Some(source) = frame.get(6..12) else {
            return;
        };
        let mut source_mac = [0u8; 6];
        source_mac.copy_from_slice(source);
        let mut table = self.steering.lock().unwrap_or_else(|e| e.into_inner());
        if table
            .last()
            .is_some_and(|&(mac, p)| mac == source_mac && p == pair)
        {
            return;
        }
        table.retain(|&(mac, _)| mac != source_mac);
        if table.len() == STEERING_ENTRIES {
            table.remove(0);
        }
        table.push((source_mac, pair));
    }

    fn steer(&self, frame: &[u8]) -> u16 {
        let in_use = self.pairs_in_use.load(Ordering::Relaxed);
        let Some(destination) = frame.get(..6) else {
            return 0;
        };
        let table = self.steering.lock().unwrap_or_else(|e| e.into_inner());
        table
            .iter()
            .rev()
            .find(|(mac, _)| mac[..] == destination[..])
            .map_or(0, |&(_, pair)| pair)
            .min(in_use.saturating_sub(1))
    }
}

/// The virtio-net device model, generic over guest memory.
pub struct VirtioNet<M> {
    config: NetConfig,
    mem: M,
    active: RwLock<Option<Arc<Active>>>,
    counters: Counters,
    writes: WriteLog,
    /// Broken rings, logged a few times, then counted.
    guest_errors: GuestErrorLog,
}

impl<M: GuestMemory + Send + Sync> VirtioNet<M> {
    /// A NIC on guest memory `mem` (the VMM's `GuestMemoryMmap`, cheap to clone).
    pub fn new(config: NetConfig, mem: M) -> Result<VirtioNet<M>, NetError> {
        if config.queue_pairs == 0 || config.queue_pairs > MAX_QUEUE_PAIRS {
            return Err(NetError::QueuePairs(config.queue_pairs));
        }
        if Queue::new(config.queue_size).is_err() {
            return Err(NetError::QueueSize(config.queue_size));
        }
        let m = config.mac;
        Ok(VirtioNet {
            guest_errors: GuestErrorLog::new(format!(
                "virtio-net {:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            )),
            config,
            mem,
            active: RwLock::new(None),
            counters: Counters::default(),
            writes: WriteLog::default(),
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        self.config.mac
    }

    /// Start or stop recording the guest pages this NIC writes (for a migration:
    /// see [`WriteLog`]).
    pub fn track_writes(&self, on: bool) {
        self.writes.track(on);
    }

    /// The guest pages this NIC wrote since the last call, while tracking.
    pub fn take_written(&self) -> Vec<u64> {
        self.writes.take()
    }

    /// Queue pairs the device has.
    pub fn queue_pairs(&self) -> u16 {
        self.config.queue_pairs
    }

    /// Queue pairs the driver uses now (1 until it sets more through MQ).
    pub fn queue_pairs_in_use(&self) -> u16 {
        self.active()
            .map_or(0, |a| a.pairs_in_use.load(Ordering::Relaxed))
    }

    fn has_ctrl(&self) -> bool {
        self.config.queue_pairs > 1
    }

    /// What queue `index` is for (to route a doorbell to the right work).
    pub fn queue_role(&self, index: u16) -> Option<QueueRole> {
        let pairs = self.config.queue_pairs;
        if index < 2 * pairs {
            Some(if index.is_multiple_of(2) {
                QueueRole::Rx(index / 2)
            } else {
                QueueRole::Tx(index / 2)
            })
        } else if index == 2 * pairs && self.has_ctrl() {
            Some(QueueRole::Ctrl)
        } else {
            None
        }
    }

    pub fn is_active(&self) -> bool {
        self.active().is_some()
    }

    /// The features the driver and the device agreed on (0 before activation).
    pub fn negotiated_features(&self) -> u64 {
        self.active().map_or(0, |a| a.features)
    }

    pub fn stats(&self) -> NetStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NetStats {
            tx_frames: get(&c.tx_frames),
            tx_bytes: get(&c.tx_bytes),
            tx_malformed: get(&c.tx_malformed),
            rx_frames: get(&c.rx_frames),
            rx_bytes: get(&c.rx_bytes),
            rx_malformed: get(&c.rx_malformed),
            rx_too_big: get(&c.rx_too_big),
            rx_no_buffer: get(&c.rx_no_buffer),
            rx_inactive: get(&c.rx_inactive),
            ctrl_commands: get(&c.ctrl_commands),
            ctrl_malformed: get(&c.ctrl_malformed),
        }
    }

    fn active(&self) -> Option<Arc<Active>> {
        self.active
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes every frame the guest queued on TX queue pair `pair` and hands each to
    /// `send`, which returns false to refuse it (back-pressure: the frame stays in the
    /// guest's ring, unconsumed, and this pass stops; call again when the destination
    /// can take more). Raises the TX interrupt if the guest wants one.
    pub fn transmit(&self, pair: u16, mut send: impl FnMut(&[u8]) -> bool) -> TxReport {
        self.transmit_frames(pair, |frame| send(frame.bytes()))
    }

    /// [`VirtioNet::transmit`], handing out each frame where it lies in guest memory:
    /// the caller reads its header, then copies it straight into another NIC
    /// ([`RxBatch::push_frame`]) or takes its bytes ([`TxFrame::bytes`]).
    pub fn transmit_frames(
        &self,
        pair: u16,
        send: impl FnMut(&mut TxFrame<'_, M>) -> bool,
    ) -> TxReport {
        self.transmit_bounded(pair, usize::MAX, send)
    }

    /// [`VirtioNet::transmit_frames`] taking at most `budget` chains, so a guest that
    /// keeps queueing cannot hold a backend thread (and the other ports it serves)
    /// forever. When the budget runs out the report says [`TxReport::more`]: call
    /// again after serving the others (no notification will come for those chains).
    pub fn transmit_bounded(
        &self,
        pair: u16,
        budget: usize,
        mut send: impl FnMut(&mut TxFrame<'_, M>) -> bool,
    ) -> TxReport {
        let mut report = TxReport::default();
        let Some(active) = self.active() else {
            return report;
        };
        if pair >= self.config.queue_pairs {
            return report;
        }
        let index = 2 * pair + 1;
        let Some(mut queue) = active.queue(index) else {
            return report;
        };
        if !queue.ready() {
            return report;
        }
        let mem = &self.mem;
        let mut bytes = Vec::new();
        let mut used = 0usize;
        let mut taken = 0usize;
        'drain: loop {
            let mut popped = 0usize;
            loop {
                if taken == budget {
                    report.more = true;
                    break 'drain;
                }
                let Some(chain) = pop_chain(&mut queue, mem, &self.guest_errors) else {
                    break;
                };
                popped += 1;
                taken += 1;
                let head = chain.head_index();
                let frame = chain::walk(chain, Direction::DeviceReads, HEADER_LEN + MAX_FRAME_LEN)
                    .and_then(|segments| TxFrame::new(mem, segments, &mut bytes));
                match frame {
                    Ok(mut frame) => {
                        if !send(&mut frame) {
                            // Leave the chain in the ring for the next pass.
                            queue.go_to_previous_position();
                            report.stopped = true;
                            break 'drain;
                        }
                        report.frames += 1;
                        self.counters.tx_frames.fetch_add(1, Ordering::Relaxed);
                        self.counters
                            .tx_bytes
                            .fetch_add(frame.len as u64, Ordering::Relaxed);
                        active.learn(&frame.header, pair);
                    }
                    Err(_) => {
                        report.malformed += 1;
                        self.counters.tx_malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if queue.add_used(mem, head, 0).is_ok() {
                    used += 1;
                }
            }
            // Re-arm notifications; if the guest queued more meanwhile, go again. A
            // ring whose index the guest corrupted yields nothing: stop rather than spin.
            match queue.enable_notification(mem) {
                Ok(true) if popped > 0 => continue,
                _ => break,
            }
        }
        self.writes.record_used_ring(&queue);
        if used > 0 && wants_interrupt(&mut queue, mem) {
            drop(queue);
            active.interrupt.trigger(InterruptCause::Queue(index));
        }
        report
    }

    /// Offers frames to the guest: `fill` gets an [`RxBatch`] and pushes frames into
    /// it (each steered to its queue pair); interrupts are raised once at the end,
    /// for each RX queue that got buffers back.
    pub fn receive_batch<R>(&self, fill: impl FnOnce(&mut RxBatch<'_, M>) -> R) -> R {
        let active = self.active();
        let queues = active.as_ref().map_or(0, |a| a.queues.len());
        let mut batch = RxBatch {
            net: self,
            active: active.as_deref(),
            guards: (0..queues).map(|_| None).collect(),
            used: vec![false; queues],
        };
        let result = fill(&mut batch);
        batch.finish();
        result
    }

    /// Offers one frame (see [`VirtioNet::receive_batch`]).
    pub fn receive(&self, frame: &[u8]) -> RxOutcome {
        self.receive_batch(|batch| batch.push(frame))
    }

    /// Handles the control queue's requests (MQ pair count). Returns how many.
    pub fn process_ctrl(&self) -> usize {
        let Some(active) = self.active() else {
            return 0;
        };
        if !self.has_ctrl() || active.features & feature::CTRL_VQ == 0 {
            return 0;
        }
        let index = 2 * self.config.queue_pairs;
        let Some(mut queue) = active.queue(index) else {
            return 0;
        };
        if !queue.ready() {
            return 0;
        }
        let mem = &self.mem;
        let mut handled = 0;
        // A queue's worth a doorbell; the rest waits for the next.
        let budget = usize::from(queue.size());
        let served = serve_chains(&mut queue, mem, budget, &self.guest_errors, |chain| {
            let written = match chain::walk_split(chain, 4096) {
                Ok((readable, writable)) => {
                    let ack = self.ctrl_command(&active, &readable);
                    for segment in &writable {
                        self.writes.record(segment.addr.0, segment.len as u64);
                    }
                    chain::scatter(mem, &writable, &[&[ack]]).unwrap_or(0)
                }
                Err(_) => 0,
            };
            if written == 0 {
                self.counters.ctrl_malformed.fetch_add(1, Ordering::Relaxed);
            } else {
                handled += 1;
                self.counters.ctrl_commands.fetch_add(1, Ordering::Relaxed);
            }
            written as u32
        });
        self.writes.record_used_ring(&queue);
        if served.chains > 0 && wants_interrupt(&mut queue, mem) {
            drop(queue);
            active.interrupt.trigger(InterruptCause::Queue(index));
        }
        handled
    }

    /// One control command: the ack to write.
    fn ctrl_command(&self, active: &Active, readable: &[Segment]) -> u8 {
        let mut request = Vec::new();
        if chain::gather(&self.mem, readable, 0, &mut request).is_err() {
            return CTRL_ERR;
        }
        match request[..] {
            [CTRL_MQ, CTRL_MQ_VQ_PAIRS_SET, low, high, ..]
                if active.features & feature::MQ != 0 =>
            {
                let pairs = u16::from_le_bytes([low, high]);
                // Range first: the control queue (locked by our caller) follows the
                // last pair, so it must not be looked at as a pair's queue.
                let in_range = pairs >= 1 && pairs <= self.config.queue_pairs;
                let ready = in_range
                    && (0..pairs).all(|p| {
                        (2 * p..2 * p + 2)
                            .all(|q| active.queue(q).is_some_and(|queue| queue.ready()))
                    });
                if ready {
                    active.pairs_in_use.store(pairs, Ordering::Relaxed);
                    CTRL_OK
                } else {
                    CTRL_ERR
                }
            }
            _ => CTRL_ERR,
        }
    }
}

/// A frame in a guest's TX buffers, validated (see [`chain::walk`]), its virtio
/// header not yet stripped.
pub struct TxFrame<'a, M> {
    mem: &'a M,
    segments: Vec<Segment>,
    /// Bytes of the Ethernet frame (without the virtio header).
    len: usize,
    /// Its first bytes (up to an Ethernet header's), for forwarding decisions.
    header: [u8; ETHERNET_HEADER_LEN],
    bytes: &'a mut Vec<u8>,
    gathered: bool,
}

impl<'a, M: GuestMemory> TxFrame<'a, M> {
    fn new(
        mem: &'a M,
        segments: Vec<Segment>,
        bytes: &'a mut Vec<u8>,
    ) -> Result<TxFrame<'a, M>, ChainError> {
        let total = chain::capacity(&segments);
        if total < HEADER_LEN {
            return Err(ChainError::Empty);
        }
        let len = total - HEADER_LEN;
        let mut header = [0u8; ETHERNET_HEADER_LEN];
        let head_len = len.min(ETHERNET_HEADER_LEN);
        chain::read_at(mem, &segments, HEADER_LEN, &mut header[..head_len])?;
        Ok(TxFrame {
            mem,
            segments,
            len,
            header,
            bytes,
            gathered: false,
        })
    }

    /// Bytes of the Ethernet frame.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame's first bytes: its Ethernet header, or all of a shorter frame.
    pub fn header(&self) -> &[u8] {
        &self.header[..self.len.min(ETHERNET_HEADER_LEN)]
    }

    /// The whole frame, copied out of guest memory on first use. (Empty if guest
    /// memory could not be read, which `walk`'s checks rule out for plain RAM: a
    /// switch then counts it as a runt.)
    pub fn bytes(&mut self) -> &[u8] {
        if !self.gathered {
            self.bytes.clear();
            if chain::gather(self.mem, &self.segments, HEADER_LEN, self.bytes).is_err() {
                self.bytes.clear();
            }
            self.gathered = true;
        }
        self.bytes
    }
}

/// Writes a frame (virtio header included) into an RX buffer's segments; returns
/// the bytes written.
type FillBuffer<'a, M> = dyn FnMut(&M, &[Segment]) -> Result<usize, ChainError> + 'a;

/// Frames on their way into the guest, under the RX queues' locks.
pub struct RxBatch<'a, M> {
    net: &'a VirtioNet<M>,
    active: Option<&'a Active>,
    guards: Vec<Option<MutexGuard<'a, Queue>>>,
    used: Vec<bool>,
}

impl<M: GuestMemory + Send + Sync> RxBatch<'_, M> {
    /// Writes `frame` (an Ethernet frame, no virtio header) into the next RX buffer
    /// of the queue pair steering picks.
    pub fn push(&mut self, frame: &[u8]) -> RxOutcome {
        self.push_with(frame, frame.len(), &mut |mem, segments| {
            chain::scatter(mem, segments, &[&RX_HEADER, frame])
        })
    }

    /// Copies another NIC's TX frame straight from its TX buffers into the next RX
    /// buffer (no intermediate copy). Same outcomes as [`RxBatch::push`].
    pub fn push_frame<S: GuestMemory>(&mut self, frame: &mut TxFrame<'_, S>) -> RxOutcome {
        let (source, source_segments) = (frame.mem, &frame.segments[..]);
        let header = frame.header;
        self.push_with(&header, frame.len, &mut |mem, segments| {
            chain::scatter(mem, segments, &[&RX_HEADER])?;
            let copied = chain::copy_between(
                source,
                source_segments,
                HEADER_LEN,
                mem,
                segments,
                HEADER_LEN,
            )?;
            Ok(HEADER_LEN + copied)
        })
    }

    /// Finds a buffer for a frame of `len` bytes starting with `header` (at least its
    /// destination MAC, for steering) and lets `write` fill it (virtio header
    /// included); returns the outcome.
    fn push_with(&mut self, header: &[u8], len: usize, write: &mut FillBuffer<'_, M>) -> RxOutcome {
        let counters = &self.net.counters;
        let Some(active) = self.active else {
            counters.rx_inactive.fetch_add(1, Ordering::Relaxed);
            return RxOutcome::Inactive;
        };
        if len > MAX_FRAME_LEN {
            counters.rx_too_big.fetch_add(1, Ordering::Relaxed);
            return RxOutcome::TooBig;
        }
        let index = usize::from(2 * active.steer(header));
        let guard = &mut self.guards[index];
        if guard.is_none() {
            *guard = active.queue(index as u16);
        }
        let Some(queue) = guard.as_mut() else {
            counters.rx_inactive.fetch_add(1, Ordering::Relaxed);
            return RxOutcome::Inactive;
        };
        if !queue.ready() {
            counters.rx_inactive.fetch_add(1, Ordering::Relaxed);
            return RxOutcome::Inactive;
        }
        let mem = &self.net.mem;
        let mut empty_rounds = 0;
        loop {
            let Some(chain) = pop_chain(queue, mem, &self.net.guest_errors) else {
                // Ask for a notification when buffers come; if some came meanwhile,
                // look again (once: a corrupt ring index must not make us spin).
                match queue.enable_notification(mem) {
                    Ok(true) if empty_rounds == 0 => {
                        empty_rounds += 1;
                        continue;
                    }
                    _ => {
                        counters.rx_no_buffer.fetch_add(1, Ordering::Relaxed);
                        return RxOutcome::NoBuffer;
                    }
                }
            };
            let head = chain.head_index();
            let segments = match chain::walk(chain, Direction::DeviceWrites, u32::MAX as usize) {
                Ok(segments) => segments,
                Err(_) => {
                    counters.rx_malformed.fetch_add(1, Ordering::Relaxed);
                    if queue.add_used(mem, head, 0).is_ok() {
                        self.used[index] = true;
                    }
                    continue;
                }
            };
            if chain::capacity(&segments) < HEADER_LEN + len {
                // The buffer stays for a frame that fits.
                queue.go_to_previous_position();
                counters.rx_too_big.fetch_add(1, Ordering::Relaxed);
                return RxOutcome::TooBig;
            }
            for segment in &segments {
                self.net.writes.record(segment.addr.0, segment.len as u64);
            }
            let written = match write(mem, &segments) {
                Ok(n) => n,
                Err(_) => {
                    counters.rx_malformed.fetch_add(1, Ordering::Relaxed);
                    if queue.add_used(mem, head, 0).is_ok() {
                        self.used[index] = true;
                    }
                    continue;
                }
            };
            if queue.add_used(mem, head, written as u32).is_ok() {
                self.used[index] = true;
            }
            counters.rx_frames.fetch_add(1, Ordering::Relaxed);
            counters.rx_bytes.fetch_add(len as u64, Ordering::Relaxed);
            return RxOutcome::Delivered;
        }
    }

    fn finish(self) {
        let Some(active) = self.active else {
            return;
        };
        let mem = &self.net.mem;
        let mut notify = Vec::new();
        for (index, guard) in self.guards.into_iter().enumerate() {
            if let Some(queue) = &guard {
                self.net.writes.record_used_ring(queue);
            }
            if let Some(mut queue) = guard
                && self.used[index]
                && wants_interrupt(&mut queue, mem)
            {
                notify.push(index as u16);
            }
        }
        for index in notify {
            active.interrupt.trigger(InterruptCause::Queue(index));
        }
    }
}

impl<M: GuestMemory + Send + Sync> VirtioDevice for VirtioNet<M> {
    fn device_type(&self) -> u16 {
        TYPE_NET
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        let queues = 2 * usize::from(self.config.queue_pairs) + usize::from(self.has_ctrl());
        vec![self.config.queue_size; queues]
    }

    fn features(&self) -> u64 {
        let mut offered = features::VERSION_1
            | features::RING_INDIRECT_DESC
            | features::RING_EVENT_IDX
            | feature::MAC
            | feature::STATUS;
        if self.has_ctrl() {
            offered |= feature::CTRL_VQ | feature::MQ;
        }
        offered
    }

    fn accepts_features(&self, features: u64) -> bool {
        // MQ needs the control queue to set the pair count.
        features & feature::MQ == 0 || features & feature::CTRL_VQ != 0
    }

    fn config_len(&self) -> u64 {
        CONFIG_LEN
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; CONFIG_LEN as usize];
        config[..6].copy_from_slice(&self.config.mac);
        config[6..8].copy_from_slice(&LINK_UP.to_le_bytes());
        config[8..10].copy_from_slice(&self.config.queue_pairs.to_le_bytes());
        read_config_window(&config, offset, data);
    }

    /// Every field is read-only without `CTRL_MAC_ADDR` (legacy MAC writes are not
    /// supported).
    fn write_config(&self, _offset: u64, _data: &[u8]) {}

    fn activate(&self, activation: Activation) -> Result<(), ActivateError> {
        let Activation {
            features: negotiated,
            mut queues,
            interrupt,
        } = activation;
        let expected = self.queue_max_sizes().len();
        if queues.len() != expected {
            return Err(ActivateError::QueueCount {
                expected,
                got: queues.len(),
            });
        }
        // A queue whose rings do not fit guest memory is as good as not enabled.
        for queue in &mut queues {
            if queue.ready() && !queue.is_valid(&self.mem) {
                queue.set_ready(false);
            }
        }
        for required in [0u16, 1] {
            if !queues[usize::from(required)].ready() {
                return Err(ActivateError::QueueInvalid(required));
            }
        }
        let ctrl = 2 * self.config.queue_pairs;
        if negotiated & feature::CTRL_VQ != 0 && !queues[usize::from(ctrl)].ready() {
            return Err(ActivateError::QueueInvalid(ctrl));
        }
        let active = Active {
            features: negotiated,
            queues: queues.into_iter().map(Mutex::new).collect(),
            interrupt,
            pairs_in_use: AtomicU16::new(1),
            dead: AtomicBool::new(false),
            steering: Mutex::new(Vec::new()),
        };
        *self.active.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(active));
        Ok(())
    }

    /// Each queue's place and the pairs in use; the steering table is not kept (it
    /// is learnt again from the next transmissions; until then frames go to pair 0).
    fn live_state(&self) -> Option<super::LiveState> {
        let active = self.active()?;
        let positions = active
            .queues
            .iter()
            .map(|q| {
                let q = q.lock().unwrap_or_else(|e| e.into_inner());
                (q.next_avail(), q.next_used())
            })
            .collect();
        Some(super::LiveState {
            positions,
            words: vec![u64::from(active.pairs_in_use.load(Ordering::SeqCst))],
        })
    }

    fn restore_live_state(&self, words: &[u64]) -> Result<(), String> {
        let active = self.active().ok_or("the NIC is not active")?;
        match words {
            &[pairs] if (1..=u64::from(self.config.queue_pairs)).contains(&pairs) => {
                active.pairs_in_use.store(pairs as u16, Ordering::SeqCst);
                Ok(())
            }
            _ => Err(format!(
                "{words:?} where the pairs in use (1..={}) belong",
                self.config.queue_pairs
            )),
        }
    }

    /// Quiesces: once this returns, no backend thread touches the old rings (one in
    /// the middle of a pass finishes it first; any later one finds the queues dead).
    fn reset(&self) {
        let old = self
            .active
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(active) = old {
            active.dead.store(true, Ordering::SeqCst);
            for queue in &active.queues {
                drop(queue.lock().unwrap_or_else(|e| e.into_inner()));
            }
        }
    }
}
