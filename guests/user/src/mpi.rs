//! A small MPI over raw Ethernet frames (EtherType [`ETHERTYPE`]), one rank per NIC
//! (a VM runs one per vCPU), on the ring-3 virtio-net driver. Meant to carry NPB-MPI kernels: point-to-point
//! send/recv of any size, nonblocking isend/irecv with waitall, barrier, bcast,
//! allreduce (sum/max/min over f64 and i64), alltoall and alltoallv.
//!
//! Wire format (docs/guest-abi.md has the full table): every frame is an Ethernet
//! header, a 32-byte kumo header (kind, flags, source and destination rank, payload
//! length, `seq`, `ack`, `aux`) and up to [`PAYLOAD`] bytes. Between every ordered pair
//! of ranks there is one byte stream; messages are written into it back to back, each
//! a 16-byte message header (magic, tag, length) and its bytes, so large messages are
//! cut into frames simply by cutting the stream, and small ones share nothing but
//! their frame. `seq` is the stream offset of a data frame's first byte: the receiver
//! accepts exactly the next offset, so delivery is in order and a loss or duplicate is
//! seen (and counted) at once.
//!
//! Flow control is by credit: each receiver owns a ring of `window` bytes per sender
//! and copies every accepted frame into it at once, so the device's receive ring never
//! backs up; a sender may run at most `window` bytes ahead of what the receiver has
//! consumed (`ack`, carried by every frame to that peer and by ACK frames). A rank
//! that finds nothing to do tells every peer what it has consumed, so two ranks can never
//! both wait for credit the other holds. A message larger than the window streams
//! through it as the receiver consumes it: sizes are limited only by memory.
//!
//! Startup: ranks learn each other's MAC from HELLO frames (broadcast every 20 ms,
//! answered directly) until every rank has heard every other and knows it was heard;
//! frames lost before a wire is connected only delay that.
//!
//! Loss (QEMU's dgram wire can drop): go-back-N. A sender keeps a copy of what it
//! has sent and the receiver has not yet received (at most a window: credit bounds
//! it) in a send ring per peer; every frame to a peer also carries the receiver's
//! in-order received offset (`aux` of DATA, `seq` of ACK). A receiver that sees a gap
//! answers at once with an ACK flagged GAP, and the sender resends from that offset; a
//! duplicate is answered at once too, unflagged. A sender whose data stays
//! unacknowledged sends one probe frame after 10 ms (doubling up to 200 ms), which the
//! receiver answers with GAP only if the probe filled a hole: a probe it already had
//! means the timeout was spurious (the frames were delayed, not lost). A congestion
//! window (halved per loss) keeps bursts within what such a wire takes.

/// What the MPI needs of a NIC (kumo's guest: the virtio-net driver) and a clock.
/// Host tests implement it with in-memory wires.
pub trait Link {
    /// This NIC's MAC address.
    fn mac(&self) -> [u8; 6];
    /// Queues one frame: `build` writes it (at most [`MAX_FRAME`] bytes) and returns
    /// its length. False if the transmit ring is full.
    fn send(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> bool;
    /// Hands queued frames to the wire.
    fn flush(&mut self);
    /// Calls `handle` on up to `limit` received frames; returns how many.
    fn poll(&mut self, limit: usize, handle: impl FnMut(&[u8])) -> usize;
    /// Sleeps until a frame arrives or sent frames complete, or until `until`
    /// (clock ticks); false if it cannot sleep (the caller polls).
    fn wait(&mut self, until: u64) -> bool;
    /// Waits (at most until `until`) until every queued frame is on the wire.
    fn drain(&mut self, until: u64) -> bool;
    /// The clock, in ticks ([`Config::tsc_khz`] per millisecond).
    fn now(&self) -> u64;
    /// As [`Link::wait`], but also ends (or does not start) when the u32 `bell`
    /// differs from `seen` (a shared-memory peer rang it: [`Shared`]).
    fn wait_bell(&mut self, bell: &AtomicU32, seen: u32, until: u64) -> bool {
        if bell.load(Ordering::SeqCst) != seen {
            return true;
        }
        self.wait(until)
    }
    /// `Wait::Yield`: hands the CPU to another rank that shares it (`sched_yield`).
    fn yield_now(&mut self) {
        core::hint::spin_loop();
    }
    /// A shared-memory peer on another CPU sleeps with its bell rung: wake it.
    fn kick(&mut self) {}
}

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Ranks of one machine that share its memory (MPICH's shared-memory channel): messages
/// among them go through a ring per ordered pair in that memory instead of the NIC.
/// Layout at `base` ([`Shared::bytes`]): one 64-byte [`Bell`] per rank, then, page
/// aligned, a channel per ordered pair `(i, j)` of the group: a page of counters
/// (bytes written at 0, bytes read at 64) and a ring of `window` bytes. A writer rings
/// its reader's bell after writing, a reader its writer's after reading (room).
#[derive(Clone, Copy, Debug)]
pub struct Shared {
    /// The group's first rank and its size: ranks `first..first + count`.
    pub first: usize,
    pub count: usize,
    /// The zeroed memory every rank of the group is given ([`Shared::bytes`] of it).
    pub base: u64,
    /// This rank's CPU (a peer asleep on another CPU is kicked: [`Link::kick`]).
    pub cpu: u32,
}

/// A rank's doorbell: `seq` moves whenever a peer wrote to it or read from it;
/// `sleeping` is 1 while it may be asleep, on CPU `cpu`.
#[repr(C)]
pub struct Bell {
    pub seq: AtomicU32,
    pub sleeping: AtomicU32,
    pub cpu: AtomicU32,
}

/// A channel's counters, each on its own cache line.
#[repr(C)]
struct Channel {
    written: AtomicU64,
    _pad: [u64; 7],
    read: AtomicU64,
}

const PAGE: u64 = 4096;

impl Shared {
    /// Bytes of memory a group of `count` ranks needs with rings of `window` bytes.
    pub const fn bytes(count: usize, window: u64) -> u64 {
        Shared::channels_at(count) + (count * count) as u64 * (PAGE + window)
    }

    const fn channels_at(count: usize) -> u64 {
        (count as u64 * 64).div_ceil(PAGE) * PAGE
    }

    pub fn contains(&self, rank: usize) -> bool {
        (self.first..self.first + self.count).contains(&rank)
    }

    fn bell(&self, rank: usize) -> u64 {
        self.base + 64 * (rank - self.first) as u64
    }

    /// The counters of the channel from `from` to `to` (its ring follows them).
    fn channel(&self, from: usize, to: usize, window: u64) -> u64 {
        let pair = ((from - self.first) * self.count + (to - self.first)) as u64;
        self.base + Shared::channels_at(self.count) + pair * (PAGE + window)
    }
}

fn bell_at(address: u64) -> &'static Bell {
    // SAFETY: an address inside the group's shared memory (`Shared::bell`), aligned,
    // valid for the job's life; every access is atomic.
    unsafe { &*(address as *const Bell) }
}

fn channel_at(address: u64) -> &'static Channel {
    // SAFETY: as `bell_at` (`Shared::channel`).
    unsafe { &*(address as *const Channel) }
}

/// Largest Ethernet frame (no FCS): 14-byte header and a 9000-byte ("jumbo") payload.
/// Six times fewer frames, doorbells and switch passes per byte than 1500 bytes: IS.A
/// and FT.A on 2 VMs ran 30-35 % faster (`kumo mpi --npb`, interleaved pairs). QEMU's
/// virtio-net and its stream and dgram wires carry such frames as well.
pub const MAX_FRAME: usize = 9014;

pub const ETHERTYPE: u16 = 0x88B5;
const ETH_HEADER: usize = 14;
const HEADER: usize = 32;
/// Payload bytes per frame (what a 9000-byte Ethernet payload leaves after our header).
pub const PAYLOAD: usize = MAX_FRAME - ETH_HEADER - HEADER;
/// Ethernet's minimum frame (without FCS): shorter ones are padded.
const MIN_FRAME: usize = 60;
pub const MAX_RANKS: usize = 64;

const KIND_HELLO: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_ACK: u8 = 3;
/// ACK flag: a frame arrived out of order, or a probe: resend from `seq`.
const FLAG_GAP: u8 = 1;
/// DATA flag: a timeout's probe; answer at once (GAP: what is not there is lost).
const FLAG_PROBE: u8 = 2;
/// DATA flag: the sender is held by its congestion window: acknowledge soon. ACK
/// flag: a window probe (the sender is out of credit): acknowledge.
const FLAG_ACK_REQUEST: u8 = 4;
/// The congestion window never shrinks below this many frames.
const MIN_CWND_FRAMES: u64 = 8;
const BROADCAST_RANK: u16 = 0xFFFF;
const BROADCAST_MAC: [u8; 6] = [0xFF; 6];

/// Message header in a stream: magic, tag, length.
const MESSAGE_HEADER: usize = 16;
const MESSAGE_MAGIC: u32 = u32::from_le_bytes(*b"KMSG");
// User tags must stay below 0x8000_0000: collectives use the tags above.
const TAG_BARRIER: u32 = 0x8000_0001;
const TAG_BCAST: u32 = 0x8000_0002;
const TAG_REDUCE: u32 = 0x8000_0003;
const TAG_ALLTOALL: u32 = 0x8000_0004;

const HELLO_PERIOD_MS: u64 = 20;
/// A blocked wait wakes this often even without an interrupt (a safety net only), or
/// after the retransmission timeout when data is unacknowledged.
const BLOCK_SLICE_MS: u64 = 100;
/// Retransmission timeout: first and largest.
const RTO_MIN_MS: u64 = 10;
const RTO_MAX_MS: u64 = 200;
/// How long the end of a job waits for its last frames to be acknowledged.
const LINGER_MS: u64 = 2000;
/// Scratch for reductions; larger reductions go in chunks of this.
const SCRATCH_BYTES: u64 = 256 << 10;

/// How a rank waits for the network.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Busy-poll the rings (as MPI libraries do); a guest tick preempts.
    Spin,
    /// Poll briefly, then sleep in the supervisor until the NIC's interrupt.
    Block,
    /// Poll briefly, then hand the CPU to another rank sharing it, again after every
    /// idle poll (MPICH with `sched_yield`).
    Yield,
}

impl Wait {
    pub fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Block => "block",
            Wait::Yield => "yield",
        }
    }
}

#[derive(Clone, Copy)]
pub struct Config {
    pub rank: usize,
    pub size: usize,
    pub wait: Wait,
    pub tsc_khz: u64,
    /// With `Wait::Block`: poll this long before sleeping.
    pub spin_ticks: u64,
    /// A wait with no network activity for this long fails.
    pub timeout_ms: u64,
    /// Testing: drop every Nth data frame received (0: none), as a lossy wire would.
    pub drop_every: u64,
    /// Receive window per sender, bytes (a power of two).
    pub window: u64,
}

#[derive(Clone, Copy, Debug)]
pub enum Error {
    BadRank,
    OutOfMemory,
    HandshakeTimeout,
    Timeout,
    /// The next message from that source had another tag.
    TagMismatch {
        expected: u32,
        got: u32,
    },
    /// The next message from that source is longer than the buffer.
    Truncated {
        len: u64,
        room: usize,
    },
    /// The stream does not start a message where one should start.
    Corrupt,
    /// alltoallv blocks that overlap or lie outside their buffers.
    BadLayout,
}

impl Error {
    pub fn name(self) -> &'static str {
        match self {
            Error::BadRank => "bad-rank",
            Error::OutOfMemory => "out-of-memory",
            Error::HandshakeTimeout => "handshake-timeout",
            Error::Timeout => "timeout",
            Error::TagMismatch { .. } => "tag-mismatch",
            Error::Truncated { .. } => "truncated",
            Error::Corrupt => "corrupt-stream",
            Error::BadLayout => "bad-layout",
        }
    }
}

/// Reduction operators.
#[derive(Clone, Copy)]
pub enum Op {
    Sum,
    Max,
    Min,
}

#[derive(Clone, Copy)]
struct Peer {
    mac: [u8; 6],
    /// We have a HELLO from it (its MAC is known).
    heard: bool,
    /// It has heard us (its HELLO says so, or it sent data).
    confirmed: bool,
    /// It lacks something only a HELLO from us can give.
    hello_due: bool,
    /// Our stream to it: bytes sent, and bytes it has consumed (our credit).
    sent: u64,
    peer_consumed: u64,
    /// Bytes of our stream it has received in order; our copy of `[peer_received,
    /// sent)` is in `send_ring`; `resend` is where go-back-N resends from (== `sent`
    /// when nothing is being resent).
    peer_received: u64,
    send_ring: u64,
    resend: u64,
    /// When `peer_received` last moved (or unacknowledged data was first sent), the
    /// current timeout, and the offset of the last GAP-triggered rewind.
    progress_tsc: u64,
    rto: u64,
    rewound_to: u64,
    rewound_tsc: u64,
    /// Congestion window: bytes in flight not yet received (halved on each loss,
    /// grown by a frame per window's worth acknowledged; the receive window on a
    /// wire that never drops).
    cwnd: u64,
    /// Its stream to us: our ring, bytes received into it, consumed from it, and the
    /// consumed count we last told it.
    ring: u64,
    received: u64,
    consumed: u64,
    acked: u64,
    /// The received count we last told it; whether a gap (GAP flag) or a duplicate
    /// (plain ACK: a probe wants to know) asks for telling now.
    acked_received: u64,
    gap_due: bool,
    dup_due: bool,
    /// When we last told it anything (every frame to it does).
    acked_tsc: u64,
    /// Operations are served in the order they were started, per peer and direction.
    sends_started: u64,
    sends_done: u64,
    recvs_started: u64,
    recvs_done: u64,
    /// A peer in shared memory ([`Shared`]): our channel to it and its to us (their
    /// counters' addresses), and its bell; 0 for a peer across the network.
    chan_out: u64,
    chan_in: u64,
    bell: u64,
}

const PEER: Peer = Peer {
    mac: [0; 6],
    heard: false,
    confirmed: false,
    hello_due: false,
    sent: 0,
    peer_consumed: 0,
    peer_received: 0,
    send_ring: 0,
    resend: 0,
    progress_tsc: 0,
    rto: 0,
    rewound_to: 0,
    rewound_tsc: 0,
    cwnd: 0,
    ring: 0,
    received: 0,
    consumed: 0,
    acked: 0,
    acked_received: 0,
    gap_due: false,
    dup_due: false,
    acked_tsc: 0,
    sends_started: 0,
    sends_done: 0,
    recvs_started: 0,
    recvs_done: 0,
    chan_out: 0,
    chan_in: 0,
    bell: 0,
};

/// Protocol counters, for the `@kumo mpistats` line.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub hellos_sent: u64,
    pub acks_sent: u64,
    /// Data frames past the next stream offset (a frame before them was lost), or
    /// beyond the window; and frames already received (resent needlessly).
    pub out_of_order: u64,
    pub duplicates: u64,
    /// Frames resent, and timeouts that sent a probe.
    pub resent: u64,
    pub timeouts: u64,
    /// Data frames seen, and dropped on purpose (`drop_every`).
    data_seen: u64,
    pub dropped: u64,
    /// Frames of other protocols, or for other ranks.
    pub foreign: u64,
    /// TSC ticks spent inside blocking MPI calls waiting for them to complete (spinning
    /// or asleep, and descheduled: the guest cannot tell): S1's MPI_Wait time.
    pub wait_ticks: u64,
}

/// A send in progress: the message header and the data, as one stream of bytes.
pub struct SendOp<'a> {
    dst: usize,
    ticket: u64,
    header: [u8; MESSAGE_HEADER],
    data: &'a [u8],
    offset: usize,
}

impl SendOp<'_> {
    fn total(&self) -> usize {
        MESSAGE_HEADER + self.data.len()
    }

    /// Copies stream bytes `[offset, offset + out.len())` of this message into `out`.
    fn gather(&self, offset: usize, out: &mut [u8]) {
        let mut at = 0;
        if offset < MESSAGE_HEADER {
            let n = (MESSAGE_HEADER - offset).min(out.len());
            out[..n].copy_from_slice(&self.header[offset..offset + n]);
            at = n;
            if at == out.len() {
                // A piece within the header (little credit left): no data bytes, and
                // `offset + at` may still be short of the header's end.
                return;
            }
        }
        let from = offset + at - MESSAGE_HEADER;
        let rest = out.len() - at;
        out[at..].copy_from_slice(&self.data[from..from + rest]);
    }
}

/// A receive in progress.
pub struct RecvOp<'a> {
    src: usize,
    ticket: u64,
    tag: u32,
    buf: &'a mut [u8],
    len: Option<usize>,
    offset: usize,
}

/// A nonblocking operation; complete it with [`Mpi::waitall`]. Every request must be
/// waited for: later operations with the same peer are served after it.
pub enum Request<'a> {
    Send(SendOp<'a>),
    Recv(RecvOp<'a>),
    /// Finished; a receive's length.
    Done(usize),
}

pub struct Mpi<L: Link> {
    nic: L,
    cfg: Config,
    peers: [Peer; MAX_RANKS],
    scratch: u64,
    /// Our bell, if some peers share our memory (0: none).
    bell: u64,
    shared_cpu: u32,
    pub stats: Stats,
}

impl<L: Link> Mpi<L> {
    /// Sets up the streams (a window-sized ring per rank, from `alloc(bytes)`, which
    /// returns the address of memory that stays this MPI's) and finds every other
    /// rank on the wire. (The guest calls [`Mpi::init_shared`]; the host's loopback
    /// and tests call this.)
    #[allow(dead_code)]
    pub fn init(
        nic: L,
        cfg: Config,
        alloc: impl FnMut(u64) -> Option<u64>,
    ) -> Result<Mpi<L>, Error> {
        Mpi::init_shared(nic, cfg, None, alloc)
    }

    /// As [`Mpi::init`]; the ranks of `shared` (which must include ours) are reached
    /// through the shared memory it describes (rings of `cfg.window` bytes), the
    /// others over the link.
    pub fn init_shared(
        nic: L,
        cfg: Config,
        shared: Option<Shared>,
        mut alloc: impl FnMut(u64) -> Option<u64>,
    ) -> Result<Mpi<L>, Error> {
        if cfg.size == 0 || cfg.size > MAX_RANKS || cfg.rank >= cfg.size {
            return Err(Error::BadRank);
        }
        let shared = shared.filter(|s| s.count > 1);
        if shared.is_some_and(|s| !s.contains(cfg.rank) || s.first + s.count > cfg.size) {
            return Err(Error::BadRank);
        }
        let mut mpi = Mpi {
            nic,
            cfg,
            peers: [PEER; MAX_RANKS],
            scratch: alloc(SCRATCH_BYTES).ok_or(Error::OutOfMemory)?,
            bell: 0,
            shared_cpu: 0,
            stats: Stats::default(),
        };
        let rto = cfg.tsc_khz * RTO_MIN_MS;
        for (p, peer) in mpi.peers[..cfg.size].iter_mut().enumerate() {
            peer.rto = rto;
            peer.cwnd = cfg.window;
            if let Some(group) = shared.filter(|g| g.contains(p) && p != cfg.rank) {
                peer.chan_out = group.channel(cfg.rank, p, cfg.window);
                peer.chan_in = group.channel(p, cfg.rank, cfg.window);
                peer.ring = peer.chan_in + PAGE;
                peer.bell = group.bell(p);
                peer.heard = true;
                peer.confirmed = true;
                continue;
            }
            peer.ring = alloc(cfg.window).ok_or(Error::OutOfMemory)?;
            if p != cfg.rank {
                peer.send_ring = alloc(cfg.window).ok_or(Error::OutOfMemory)?;
            }
        }
        if let Some(group) = shared {
            mpi.bell = group.bell(cfg.rank);
            mpi.shared_cpu = group.cpu;
            bell_at(mpi.bell).cpu.store(group.cpu, Ordering::SeqCst);
        }
        let me = &mut mpi.peers[cfg.rank];
        me.heard = true;
        me.confirmed = true;
        me.mac = mpi.nic.mac();
        mpi.handshake()?;
        Ok(mpi)
    }

    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    pub fn size(&self) -> usize {
        self.cfg.size
    }

    pub fn mac(&self) -> [u8; 6] {
        self.nic.mac()
    }

    fn ms(&self, millis: u64) -> u64 {
        millis * self.cfg.tsc_khz
    }

    /// Microseconds spent waiting in blocking calls so far (see [`Stats::wait_ticks`]).
    pub fn wait_us(&self) -> u64 {
        let us = u128::from(self.stats.wait_ticks) * 1000 / u128::from(self.cfg.tsc_khz.max(1));
        u64::try_from(us).unwrap_or(u64::MAX)
    }

    fn handshake(&mut self) -> Result<(), Error> {
        let start = self.nic.now();
        let mut next_hello = start;
        let size = self.cfg.size;
        while !self.peers[..size].iter().all(|p| p.heard && p.confirmed) {
            let now = self.nic.now();
            if now >= next_hello {
                self.send_hello(None);
                next_hello = now + self.ms(HELLO_PERIOD_MS);
            }
            self.progress();
            if now - start > self.ms(self.cfg.timeout_ms) {
                return Err(Error::HandshakeTimeout);
            }
            core::hint::spin_loop();
        }
        Ok(())
    }

    fn masks(&self) -> (u64, u64) {
        let (mut heard, mut confirmed) = (0u64, 0u64);
        for (i, peer) in self.peers[..self.cfg.size].iter().enumerate() {
            heard |= u64::from(peer.heard) << i;
            confirmed |= u64::from(peer.confirmed) << i;
        }
        (heard, confirmed)
    }

    /// A HELLO to `to`, or broadcast: `seq` = heard mask, `ack` = confirmed mask,
    /// `aux` = job size.
    fn send_hello(&mut self, to: Option<usize>) -> bool {
        let (heard, confirmed) = self.masks();
        let (dst_mac, dst) = match to {
            Some(p) => (self.peers[p].mac, p as u16),
            None => (BROADCAST_MAC, BROADCAST_RANK),
        };
        let (mac, rank, size) = (self.nic.mac(), self.cfg.rank as u16, self.cfg.size as u64);
        let sent = self.nic.send(|frame| {
            write_header(frame, dst_mac, mac, KIND_HELLO, rank, dst, 0);
            put64(frame, 22, heard);
            put64(frame, 30, confirmed);
            put64(frame, 38, size);
            MIN_FRAME
        });
        self.stats.hellos_sent += u64::from(sent);
        sent
    }

    /// Tells `p` how much of its stream we have received in order and consumed
    /// (flagged GAP if something arrived out of order since the last ACK), and with
    /// `request`, asks for an ACK back (a window probe).
    fn send_ack(&mut self, p: usize, request: bool) -> bool {
        let peer = self.peers[p];
        let (mac, rank) = (self.nic.mac(), self.cfg.rank as u16);
        let sent = self.nic.send(|frame| {
            write_header(frame, peer.mac, mac, KIND_ACK, rank, p as u16, 0);
            frame[15] = if peer.gap_due { FLAG_GAP } else { 0 }
                | if request { FLAG_ACK_REQUEST } else { 0 };
            put64(frame, 22, peer.received);
            put64(frame, 30, peer.consumed);
            put64(frame, 38, 0);
            MIN_FRAME
        });
        if sent {
            let peer = &mut self.peers[p];
            peer.acked = peer.consumed;
            peer.acked_received = peer.received;
            peer.acked_tsc = self.nic.now();
            peer.gap_due = false;
            peer.dup_due = false;
            self.stats.acks_sent += 1;
        }
        sent
    }

    /// Resends `p`'s stream from `resend` (go-back-N) as far as the transmit ring
    /// allows, or, when `probe`, the first unacknowledged frame only.
    fn resend(&mut self, p: usize, probe: bool) {
        let window = self.cfg.window;
        let (mac, rank) = (self.nic.mac(), self.cfg.rank as u16);
        loop {
            let peer = self.peers[p];
            let from = if probe {
                peer.peer_received
            } else {
                peer.resend
            };
            // Within the congestion window (a probe always goes).
            let limit = peer.sent.min(peer.peer_received + peer.cwnd);
            if from >= peer.sent || (!probe && from >= limit) {
                return;
            }
            let n = PAYLOAD.min((peer.sent - from) as usize);
            let sent = self.nic.send(|frame| {
                write_header(frame, peer.mac, mac, KIND_DATA, rank, p as u16, n as u16);
                frame[15] = if probe {
                    FLAG_PROBE
                } else {
                    ack_request(&peer, window, from, n)
                };
                put64(frame, 22, from);
                put64(frame, 30, peer.consumed);
                put64(frame, 38, peer.received);
                let at = ETH_HEADER + HEADER;
                ring_read(peer.send_ring, window, from, &mut frame[at..at + n]);
                (at + n).max(MIN_FRAME)
            });
            if !sent {
                return;
            }
            self.stats.resent += 1;
            let now = self.nic.now();
            let peer = &mut self.peers[p];
            peer.acked = peer.consumed;
            peer.acked_received = peer.received;
            peer.acked_tsc = now;
            if probe {
                return;
            }
            peer.resend = from + n as u64;
        }
    }

    /// Receives what has arrived, answers HELLOs, returns credit that is due.
    /// Returns whether any frame arrived.
    fn progress(&mut self) -> bool {
        let Mpi {
            nic,
            cfg,
            peers,
            stats,
            ..
        } = self;
        let mac = nic.mac();
        let now = nic.now();
        let arrived = nic.poll(64, |frame| handle_frame(cfg, peers, stats, mac, now, frame));
        let quarter = self.cfg.window / 4;
        for p in 0..self.cfg.size {
            if p == self.cfg.rank {
                continue;
            }
            if self.peers[p].chan_in != 0 {
                // In shared memory: what it has written so far is ours to read.
                self.peers[p].received = channel_at(self.peers[p].chan_in)
                    .written
                    .load(Ordering::Acquire);
                continue;
            }
            let peer = self.peers[p];
            if peer.hello_due && peer.heard && self.send_hello(Some(p)) {
                self.peers[p].hello_due = false;
            }
            // Received data is acknowledged within half a retransmission timeout,
            // so a busy receiver causes no needless probes.
            let stale = peer.received != peer.acked_received
                && now - peer.acked_tsc > self.cfg.tsc_khz * RTO_MIN_MS / 2;
            if peer.gap_due
                || peer.dup_due
                || stale
                || peer.consumed - peer.acked >= quarter
                || peer.received - peer.acked_received >= quarter
            {
                self.send_ack(p, false);
            }
            if peer.resend < peer.sent {
                self.resend(p, false);
            }
            if peer.peer_received < peer.sent && now - peer.progress_tsc > peer.rto {
                // Nothing heard for a while: probe with the first unacknowledged frame
                // (its answer says where to resend from), and back off.
                // The window shrinks only if the answer shows a loss (a GAP short of
                // what was sent): on a loaded host a timeout is mostly a descheduled
                // receiver, and halving on it would starve a lossless wire.
                self.stats.timeouts += 1;
                self.resend(p, true);
                let peer = &mut self.peers[p];
                peer.progress_tsc = now;
                peer.rto = (peer.rto * 2).min(self.cfg.tsc_khz * RTO_MAX_MS);
            } else if peer.sent >= peer.peer_consumed + self.cfg.window
                && now - peer.progress_tsc > peer.rto
            {
                // Out of credit with everything received: the ACK that returns it
                // may have been lost. Ask for another (a window probe), and back off.
                self.stats.timeouts += 1;
                self.send_ack(p, true);
                let peer = &mut self.peers[p];
                peer.progress_tsc = now;
                peer.rto = (peer.rto * 2).min(self.cfg.tsc_khz * RTO_MAX_MS);
            }
        }
        self.nic.flush();
        arrived > 0
    }

    /// Before waiting: every peer learns all we have consumed, so no two ranks can
    /// wait for credit the other holds.
    fn flush_acks(&mut self) {
        for p in 0..self.cfg.size {
            let peer = self.peers[p];
            if p != self.cfg.rank
                && peer.chan_in == 0
                && (peer.consumed != peer.acked || peer.received != peer.acked_received)
            {
                self.send_ack(p, false);
            }
        }
        self.nic.flush();
    }

    /// Runs `step` (which moves operations along) until it says done, receiving in
    /// between; spins or sleeps as configured. Fails after `timeout_ms` without any
    /// stream moving.
    fn wait_for(
        &mut self,
        mut step: impl FnMut(&mut Mpi<L>) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        // Progress: stream bytes sent (new), received in order, consumed, and known
        // received by peers (resent frames are not progress).
        let activity = |m: &Mpi<L>| {
            m.peers[..m.cfg.size]
                .iter()
                .map(|p| p.sent + p.received + p.consumed + p.peer_received)
                .sum::<u64>()
        };
        let mut last = activity(self);
        let entered = self.nic.now();
        let mut last_at = entered;
        loop {
            // Read before looking: a peer in shared memory that writes after the look
            // has moved it, and a wait on it does not start.
            let bell_seen = self.bell_seq();
            let done = step(self)?;
            self.nic.flush();
            if done {
                self.stats.wait_ticks += self.nic.now().saturating_sub(entered);
                return Ok(());
            }
            self.progress();
            let now = self.nic.now();
            if activity(self) != last {
                last = activity(self);
                last_at = now;
                continue;
            }
            let idle = now - last_at;
            if idle > self.ms(self.cfg.timeout_ms) {
                return Err(Error::Timeout);
            }
            // Nothing moved: before waiting on, every peer learns what we have
            // consumed (sends only what changed, so at most once per idle spell).
            self.flush_acks();
            if self.cfg.wait == Wait::Yield && idle > self.cfg.spin_ticks {
                self.nic.yield_now();
                continue;
            }
            if self.cfg.wait == Wait::Block && idle > self.cfg.spin_ticks {
                let unacked = self.peers[..self.cfg.size]
                    .iter()
                    .any(|p| p.peer_received < p.sent);
                let slice = if unacked { RTO_MIN_MS } else { BLOCK_SLICE_MS };
                let until = now + self.ms(slice);
                let slept = if self.bell != 0 {
                    let bell = bell_at(self.bell);
                    bell.sleeping.store(1, Ordering::SeqCst);
                    let slept = self.nic.wait_bell(&bell.seq, bell_seen, until);
                    bell.sleeping.store(0, Ordering::SeqCst);
                    slept
                } else {
                    self.nic.wait(until)
                };
                if slept {
                    continue;
                }
            }
            core::hint::spin_loop();
        }
    }

    /// Our bell's count (0 without shared-memory peers).
    fn bell_seq(&self) -> u32 {
        if self.bell == 0 {
            0
        } else {
            bell_at(self.bell).seq.load(Ordering::SeqCst)
        }
    }

    /// Tells peer `p` (in shared memory) that its channel moved; wakes it if it may be
    /// asleep on another CPU.
    fn ring(&mut self, p: usize) {
        let bell = bell_at(self.peers[p].bell);
        bell.seq.fetch_add(1, Ordering::SeqCst);
        if bell.sleeping.load(Ordering::SeqCst) != 0
            && bell.cpu.load(Ordering::Relaxed) != self.shared_cpu
        {
            self.nic.kick();
        }
    }

    /// Writes as much of `op` as fits into our channel to its (shared-memory) peer;
    /// true when all of it is written.
    fn pump_shared_send(&mut self, op: &mut SendOp) -> bool {
        let window = self.cfg.window;
        let total = op.total();
        let peer = self.peers[op.dst];
        let channel = channel_at(peer.chan_out);
        let read = channel.read.load(Ordering::Acquire);
        let room = (read + window - peer.sent) as usize;
        let n = room.min(total - op.offset);
        let ring = peer.chan_out + PAGE;
        let mut at = 0;
        while at < n {
            let pos = (peer.sent + at as u64) % window;
            let piece = (n - at).min((window - pos) as usize);
            // SAFETY: [pos, pos + piece) lies inside the channel's ring (window bytes),
            // which only we write, and only where its reader has finished reading.
            let out = unsafe { core::slice::from_raw_parts_mut((ring + pos) as *mut u8, piece) };
            op.gather(op.offset + at, out);
            at += piece;
        }
        op.offset += n;
        if n > 0 {
            let sent = peer.sent + n as u64;
            channel.written.store(sent, Ordering::Release);
            let peer = &mut self.peers[op.dst];
            peer.sent = sent;
            peer.peer_received = sent;
            peer.peer_consumed = read;
            self.ring(op.dst);
        }
        if op.offset == total {
            self.peers[op.dst].sends_done += 1;
            return true;
        }
        false
    }

    // ----- point to point -----

    fn check_peer(&self, rank: usize) -> Result<(), Error> {
        if rank < self.cfg.size {
            Ok(())
        } else {
            Err(Error::BadRank)
        }
    }

    /// Starts sending `data` to `dst` with `tag`; complete it with [`Mpi::waitall`].
    pub fn isend<'a>(
        &mut self,
        dst: usize,
        tag: u32,
        data: &'a [u8],
    ) -> Result<Request<'a>, Error> {
        self.check_peer(dst)?;
        let mut op = self.start_send(dst, tag, data);
        if self.pump_send(&mut op) {
            self.nic.flush();
            return Ok(Request::Done(data.len()));
        }
        self.nic.flush();
        Ok(Request::Send(op))
    }

    /// Starts receiving the next message from `src` (it must carry `tag` and fit).
    pub fn irecv<'a>(
        &mut self,
        src: usize,
        tag: u32,
        buf: &'a mut [u8],
    ) -> Result<Request<'a>, Error> {
        self.check_peer(src)?;
        let peer = &mut self.peers[src];
        let ticket = peer.recvs_started;
        peer.recvs_started += 1;
        Ok(Request::Recv(RecvOp {
            src,
            ticket,
            tag,
            buf,
            len: None,
            offset: 0,
        }))
    }

    /// Completes every request (in any order); each becomes `Request::Done`.
    pub fn waitall(&mut self, requests: &mut [Request]) -> Result<(), Error> {
        self.wait_for(|m| {
            let mut all = true;
            for request in requests.iter_mut() {
                all &= m.pump(request)?;
            }
            Ok(all)
        })
    }

    pub fn send(&mut self, dst: usize, tag: u32, data: &[u8]) -> Result<(), Error> {
        let mut request = [self.isend(dst, tag, data)?];
        self.waitall(&mut request)
    }

    /// Receives the next message from `src`; returns its length.
    pub fn recv(&mut self, src: usize, tag: u32, buf: &mut [u8]) -> Result<usize, Error> {
        let mut request = [self.irecv(src, tag, buf)?];
        self.waitall(&mut request)?;
        match request[0] {
            Request::Done(len) => Ok(len),
            _ => Err(Error::Corrupt),
        }
    }

    /// Sends to `dst` and receives from `src` at the same time (no deadlock when two
    /// ranks exchange messages larger than the window).
    pub fn sendrecv(
        &mut self,
        dst: usize,
        send_tag: u32,
        data: &[u8],
        src: usize,
        recv_tag: u32,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        let mut requests = [
            self.irecv(src, recv_tag, buf)?,
            self.isend(dst, send_tag, data)?,
        ];
        self.waitall(&mut requests)?;
        match requests[0] {
            Request::Done(len) => Ok(len),
            _ => Err(Error::Corrupt),
        }
    }

    fn start_send<'a>(&mut self, dst: usize, tag: u32, data: &'a [u8]) -> SendOp<'a> {
        let peer = &mut self.peers[dst];
        let ticket = peer.sends_started;
        peer.sends_started += 1;
        let mut header = [0u8; MESSAGE_HEADER];
        header[0..4].copy_from_slice(&MESSAGE_MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&tag.to_le_bytes());
        header[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        SendOp {
            dst,
            ticket,
            header,
            data,
            offset: 0,
        }
    }

    fn pump(&mut self, request: &mut Request) -> Result<bool, Error> {
        let finished = match request {
            Request::Done(_) => return Ok(true),
            Request::Send(op) => self.pump_send(op).then_some(op.data.len()),
            Request::Recv(op) => self.pump_recv(op)?.then(|| op.len.unwrap_or(0)),
        };
        match finished {
            Some(len) => {
                *request = Request::Done(len);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Sends as much of `op` as credit and the transmit ring allow; true when all of
    /// it is sent.
    fn pump_send(&mut self, op: &mut SendOp) -> bool {
        let total = op.total();
        let window = self.cfg.window;
        if self.peers[op.dst].sends_done != op.ticket {
            return false;
        }
        if self.peers[op.dst].chan_out != 0 {
            return self.pump_shared_send(op);
        }
        if op.dst == self.cfg.rank {
            // To ourselves: straight into our own ring.
            let peer = self.peers[op.dst];
            let room = (peer.consumed + window - peer.received) as usize;
            let n = room.min(total - op.offset);
            let mut at = 0;
            while at < n {
                let pos = (peer.received + at as u64) % window;
                let piece = (n - at).min((window - pos) as usize);
                // SAFETY: [pos, pos + piece) lies inside our own ring (window bytes).
                let out =
                    unsafe { core::slice::from_raw_parts_mut((peer.ring + pos) as *mut u8, piece) };
                op.gather(op.offset + at, out);
                at += piece;
            }
            self.peers[op.dst].received += n as u64;
            op.offset += n;
            if op.offset == total {
                self.peers[op.dst].sends_done += 1;
                return true;
            }
            return false;
        }
        while op.offset < total {
            let peer = self.peers[op.dst];
            if peer.resend < peer.sent {
                break; // resending first: the stream stays in order
            }
            let limit = (peer.peer_consumed + window).min(peer.peer_received + peer.cwnd);
            let credit = limit.saturating_sub(peer.sent) as usize;
            let n = PAYLOAD.min(total - op.offset).min(credit);
            if n == 0 {
                break;
            }
            let (mac, rank) = (self.nic.mac(), self.cfg.rank as u16);
            let sent = self.nic.send(|frame| {
                write_header(
                    frame,
                    peer.mac,
                    mac,
                    KIND_DATA,
                    rank,
                    op.dst as u16,
                    n as u16,
                );
                frame[15] = ack_request(&peer, window, peer.sent, n);
                put64(frame, 22, peer.sent);
                put64(frame, 30, peer.consumed);
                put64(frame, 38, peer.received);
                let at = ETH_HEADER + HEADER;
                op.gather(op.offset, &mut frame[at..at + n]);
                // Kept until the peer has received it.
                ring_write(peer.send_ring, window, peer.sent, &frame[at..at + n]);
                (at + n).max(MIN_FRAME)
            });
            if !sent {
                break;
            }
            let now = self.nic.now();
            let peer = &mut self.peers[op.dst];
            if peer.peer_received == peer.sent {
                peer.progress_tsc = now;
            }
            peer.sent += n as u64;
            peer.resend = peer.sent;
            peer.acked = peer.consumed;
            peer.acked_received = peer.received;
            peer.acked_tsc = now;
            op.offset += n;
        }
        if op.offset == total {
            self.peers[op.dst].sends_done += 1;
            return true;
        }
        false
    }

    /// Copies what has arrived of `op`'s message; true when all of it has.
    fn pump_recv(&mut self, op: &mut RecvOp) -> Result<bool, Error> {
        let chan_in = self.peers[op.src].chan_in;
        if chan_in == 0 {
            return self.pump_recv_ring(op);
        }
        // In shared memory: take what its writer has written, give back what we read.
        let peer = &mut self.peers[op.src];
        peer.received = channel_at(chan_in).written.load(Ordering::Acquire);
        let before = peer.consumed;
        let result = self.pump_recv_ring(op);
        let peer = self.peers[op.src];
        if peer.consumed != before {
            channel_at(chan_in)
                .read
                .store(peer.consumed, Ordering::Release);
            self.ring(op.src);
        }
        result
    }

    /// [`Mpi::pump_recv`] from the peer's ring, as far as `received` says.
    fn pump_recv_ring(&mut self, op: &mut RecvOp) -> Result<bool, Error> {
        let window = self.cfg.window;
        let peer = &mut self.peers[op.src];
        if peer.recvs_done != op.ticket {
            return Ok(false);
        }
        if op.len.is_none() {
            if peer.received - peer.consumed < MESSAGE_HEADER as u64 {
                return Ok(false);
            }
            let mut header = [0u8; MESSAGE_HEADER];
            ring_read(peer.ring, window, peer.consumed, &mut header);
            let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            let tag = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let len = get64(&header, 8);
            if magic != MESSAGE_MAGIC {
                return Err(Error::Corrupt);
            }
            // A receive that does not match ends here (with its error); the message
            // stays for the next receive from that source.
            if tag != op.tag {
                peer.recvs_done += 1;
                return Err(Error::TagMismatch {
                    expected: op.tag,
                    got: tag,
                });
            }
            if len > op.buf.len() as u64 {
                peer.recvs_done += 1;
                return Err(Error::Truncated {
                    len,
                    room: op.buf.len(),
                });
            }
            peer.consumed += MESSAGE_HEADER as u64;
            op.len = Some(len as usize);
        }
        let len = op.len.unwrap_or(0);
        let n = ((peer.received - peer.consumed) as usize).min(len - op.offset);
        ring_read(
            peer.ring,
            window,
            peer.consumed,
            &mut op.buf[op.offset..op.offset + n],
        );
        peer.consumed += n as u64;
        op.offset += n;
        if op.offset == len {
            peer.recvs_done += 1;
            return Ok(true);
        }
        Ok(false)
    }

    // ----- collectives (binomial trees rooted at rank 0 or the given root) -----

    /// Every rank has entered the barrier when any rank leaves it.
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.reduce_to_zero(TAG_BARRIER, &mut [], |_, _| {})?;
        self.bcast_tag(0, TAG_BARRIER, &mut [])
    }

    /// `buf` of `root` to every rank.
    pub fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.check_peer(root)?;
        self.bcast_tag(root, TAG_BCAST, buf)
    }

    fn bcast_tag(&mut self, root: usize, tag: u32, buf: &mut [u8]) -> Result<(), Error> {
        let size = self.cfg.size;
        let me = (self.cfg.rank + size - root) % size;
        let mut mask = 1;
        while mask < size {
            if me & mask != 0 {
                let parent = (me - mask + root) % size;
                self.recv(parent, tag, buf)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if me + mask < size {
                self.send((me + mask + root) % size, tag, buf)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// Combines every rank's `buf` into rank 0's with `combine(acc, other)`.
    fn reduce_to_zero(
        &mut self,
        tag: u32,
        buf: &mut [u8],
        combine: impl Fn(&mut [u8], &[u8]),
    ) -> Result<(), Error> {
        let (rank, size) = (self.cfg.rank, self.cfg.size);
        // SAFETY: the scratch area is ours alone (SCRATCH_BYTES); callers pass at most
        // that much.
        let scratch =
            unsafe { core::slice::from_raw_parts_mut(self.scratch as *mut u8, buf.len()) };
        let mut mask = 1;
        while mask < size {
            if rank & mask != 0 {
                return self.send(rank - mask, tag, buf);
            }
            if rank + mask < size {
                self.recv(rank + mask, tag, scratch)?;
                combine(buf, scratch);
            }
            mask <<= 1;
        }
        Ok(())
    }

    fn allreduce_bytes(
        &mut self,
        buf: &mut [u8],
        combine: impl Fn(&mut [u8], &[u8]) + Copy,
    ) -> Result<(), Error> {
        for chunk in buf.chunks_mut(SCRATCH_BYTES as usize) {
            self.reduce_to_zero(TAG_REDUCE, chunk, combine)?;
            self.bcast_tag(0, TAG_REDUCE, chunk)?;
        }
        if buf.is_empty() {
            self.barrier()?;
        }
        Ok(())
    }

    /// Element-wise reduction over every rank; every rank gets the same result
    /// (computed on rank 0 in a fixed order).
    pub fn allreduce_f64(&mut self, values: &mut [f64], op: Op) -> Result<(), Error> {
        let combine = move |acc: &mut [u8], other: &[u8]| {
            for (a, b) in acc.chunks_exact_mut(8).zip(other.chunks_exact(8)) {
                let x = f64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
                let y = f64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                let r = match op {
                    Op::Sum => x + y,
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                };
                a.copy_from_slice(&r.to_le_bytes());
            }
        };
        self.allreduce_bytes(as_bytes_mut(values), combine)
    }

    pub fn allreduce_i64(&mut self, values: &mut [i64], op: Op) -> Result<(), Error> {
        let combine = move |acc: &mut [u8], other: &[u8]| {
            for (a, b) in acc.chunks_exact_mut(8).zip(other.chunks_exact(8)) {
                let x = i64::from_le_bytes(a.try_into().unwrap_or([0; 8]));
                let y = i64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                let r = match op {
                    Op::Sum => x.wrapping_add(y),
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                };
                a.copy_from_slice(&r.to_le_bytes());
            }
        };
        self.allreduce_bytes(as_bytes_mut(values), combine)
    }

    /// Every rank sends block `j` of `send` to rank `j` and receives rank `j`'s block
    /// into block `j` of `recv`; blocks are `send.len() / size` bytes.
    pub fn alltoall(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        let size = self.cfg.size;
        let block = send.len() / size;
        if recv.len() < block * size {
            return Err(Error::Truncated {
                len: (block * size) as u64,
                room: recv.len(),
            });
        }
        let mut counts = [0usize; MAX_RANKS];
        let mut displs = [0usize; MAX_RANKS];
        for j in 0..size {
            counts[j] = block;
            displs[j] = j * block;
        }
        let layout = &(counts, displs);
        self.alltoallv(send, layout, recv, layout)
    }

    /// As [`Mpi::alltoall`] with per-rank byte counts and offsets: `(counts, displs)`
    /// for what goes to each rank from `send`, and for what comes from each rank into
    /// `recv` (each rank's receive counts must match what the others send it).
    pub fn alltoallv(
        &mut self,
        send: &[u8],
        send_layout: &([usize; MAX_RANKS], [usize; MAX_RANKS]),
        recv: &mut [u8],
        recv_layout: &([usize; MAX_RANKS], [usize; MAX_RANKS]),
    ) -> Result<(), Error> {
        let (rank, size) = (self.cfg.rank, self.cfg.size);
        let (send_counts, send_displs) = send_layout;
        let (recv_counts, recv_displs) = recv_layout;
        for j in 0..size {
            if send_displs[j] + send_counts[j] > send.len()
                || recv_displs[j] + recv_counts[j] > recv.len()
            {
                return Err(Error::BadLayout);
            }
        }
        // Our own block: a copy.
        let own = &send[send_displs[rank]..send_displs[rank] + send_counts[rank]];
        if own.len() != recv_counts[rank] {
            return Err(Error::Truncated {
                len: own.len() as u64,
                room: recv_counts[rank],
            });
        }
        recv[recv_displs[rank]..recv_displs[rank] + own.len()].copy_from_slice(own);
        // The others' blocks: disjoint pieces of `recv`, cut in rank order.
        let mut order = [0usize; MAX_RANKS];
        for (i, slot) in order.iter_mut().enumerate().take(size) {
            *slot = i;
        }
        order[..size].sort_unstable_by_key(|&j| recv_displs[j]);
        let mut requests: [Request; 2 * MAX_RANKS] = [const { Request::Done(0) }; 2 * MAX_RANKS];
        let mut rest: &mut [u8] = recv;
        let mut at = 0;
        let mut n = 0;
        for &j in &order[..size] {
            if recv_displs[j] < at {
                return Err(Error::BadLayout); // overlapping receive blocks
            }
            let (_, tail) = rest.split_at_mut(recv_displs[j] - at);
            let (piece, tail) = tail.split_at_mut(recv_counts[j]);
            rest = tail;
            at = recv_displs[j] + recv_counts[j];
            if j != rank {
                requests[n] = self.irecv(j, TAG_ALLTOALL, piece)?;
                n += 1;
            }
        }
        // Sends in a staggered order (rank + 1, rank + 2, ...) so no rank is everyone's
        // first target.
        for step in 1..size {
            let j = (rank + step) % size;
            let data = &send[send_displs[j]..send_displs[j] + send_counts[j]];
            requests[n] = self.isend(j, TAG_ALLTOALL, data)?;
            n += 1;
        }
        self.waitall(&mut requests[..n])
    }

    /// The end of a job: a barrier, then every frame handed to the wire (so the last
    /// ones are not lost when the VM exits).
    pub fn finish(&mut self) -> Result<(), Error> {
        self.barrier()?;
        // Until every peer has received all we sent (bounded: its last ACK may be
        // lost after it has left).
        let linger = self.nic.now() + self.ms(LINGER_MS);
        self.flush_acks();
        while self.peers[..self.cfg.size]
            .iter()
            .any(|p| p.peer_received < p.sent)
            && self.nic.now() < linger
        {
            self.progress();
            core::hint::spin_loop();
        }
        let until = self.nic.now() + self.ms(self.cfg.timeout_ms);
        if self.nic.drain(until) {
            Ok(())
        } else {
            Err(Error::Timeout)
        }
    }

    /// The link, for its own counters.
    pub fn link(&self) -> &L {
        &self.nic
    }
}

/// Any slice of plain 8-byte numbers as bytes.
fn as_bytes_mut<T: Plain>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: `Plain` types have no padding and every bit pattern is a valid value, so
    // the same memory may be read and written as bytes.
    unsafe {
        core::slice::from_raw_parts_mut(
            values.as_mut_ptr().cast::<u8>(),
            core::mem::size_of_val(values),
        )
    }
}

/// Numbers without padding for which every bit pattern is valid.
trait Plain: Copy {}
impl Plain for f64 {}
impl Plain for i64 {}

fn handle_frame(
    cfg: &Config,
    peers: &mut [Peer],
    stats: &mut Stats,
    mac: [u8; 6],
    now: u64,
    frame: &[u8],
) {
    if frame.len() < ETH_HEADER + HEADER
        || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE
        || (frame[0..6] != mac && frame[0..6] != BROADCAST_MAC)
    {
        stats.foreign += 1;
        return;
    }
    let (kind, flags) = (frame[14], frame[15]);
    let src = usize::from(u16::from_le_bytes([frame[16], frame[17]]));
    let dst = u16::from_le_bytes([frame[18], frame[19]]);
    let len = usize::from(u16::from_le_bytes([frame[20], frame[21]]));
    let (seq, ack, aux) = (get64(frame, 22), get64(frame, 30), get64(frame, 38));
    let for_us = dst == cfg.rank as u16 || (kind == KIND_HELLO && dst == BROADCAST_RANK);
    if src >= cfg.size || src == cfg.rank || !for_us {
        stats.foreign += 1;
        return;
    }
    let me = 1u64 << cfg.rank;
    let window = cfg.window;
    let peer = &mut peers[src];
    // A rank is the MAC that first said HELLO as it: another one claiming the same
    // rank (a second job, a misconfigured VM) is not listened to.
    if peer.heard && frame[6..12] != peer.mac {
        stats.foreign += 1;
        return;
    }
    match kind {
        KIND_HELLO if aux == cfg.size as u64 => {
            peer.mac.copy_from_slice(&frame[6..12]);
            peer.heard = true;
            if seq & me != 0 {
                peer.confirmed = true;
            }
            // It has not heard us, or does not know we heard it: answer.
            if seq & me == 0 || ack & me == 0 {
                peer.hello_due = true;
            }
        }
        KIND_DATA | KIND_ACK => {
            if kind == KIND_DATA && cfg.drop_every != 0 {
                stats.data_seen += 1;
                if stats.data_seen.is_multiple_of(cfg.drop_every) {
                    stats.dropped += 1;
                    return;
                }
            }
            peer.confirmed = true;
            peer.peer_consumed = peer.peer_consumed.max(ack);
            // How much of our stream it has received in order.
            let their_received = if kind == KIND_ACK { seq } else { aux };
            if their_received > peer.peer_received && their_received <= peer.sent {
                let grown = (their_received - peer.peer_received) * PAYLOAD as u64 / peer.cwnd;
                peer.cwnd = (peer.cwnd + grown.max(1)).min(window);
                peer.peer_received = their_received;
                peer.progress_tsc = now;
                peer.rto = cfg.tsc_khz * RTO_MIN_MS;
            }
            if peer.resend < peer.peer_received {
                peer.resend = peer.peer_received;
            }
            if kind == KIND_ACK {
                if flags & FLAG_ACK_REQUEST != 0 {
                    peer.dup_due = true; // a window probe: answer with our credit
                }
                // A gap at its end: go back to what it has. The frames that were in
                // flight behind the lost one raise more GAPs for the same offset:
                // those are ignored for a timeout's length.
                let fresh =
                    seq != peer.rewound_to || now - peer.rewound_tsc > cfg.tsc_khz * RTO_MIN_MS;
                if flags & FLAG_GAP != 0 && seq < peer.sent && fresh {
                    peer.resend = seq.max(peer.peer_received);
                    peer.rewound_to = seq;
                    peer.rewound_tsc = now;
                    peer.cwnd = (peer.cwnd / 2).max(MIN_CWND_FRAMES * PAYLOAD as u64);
                }
                return;
            }
            let end = seq + len as u64;
            if ETH_HEADER + HEADER + len > frame.len() {
                stats.out_of_order += 1;
                return;
            }
            // A probe is answered at once, and only one that fills a hole answers GAP:
            // the frames sent before it did not arrive (a wire keeps order), so the
            // ones after it were lost too. A probe we already have is a duplicate,
            // answered unflagged below: its sender timed out while the frames were on
            // their way (queued behind a busy domain 0), and going back would send
            // them all twice. (Linux's F-RTO spots the same spurious timeouts.)
            if flags & FLAG_PROBE != 0 && seq == peer.received {
                peer.gap_due = true;
            }
            if flags & FLAG_ACK_REQUEST != 0 {
                peer.dup_due = true;
            }
            if seq != peer.received || end > peer.consumed + window {
                if seq < peer.received {
                    stats.duplicates += 1;
                    peer.dup_due = true;
                } else {
                    stats.out_of_order += 1;
                    peer.gap_due = true;
                }
                return;
            }
            ring_write(
                peer.ring,
                window,
                seq,
                &frame[ETH_HEADER + HEADER..ETH_HEADER + HEADER + len],
            );
            peer.received = end;
        }
        _ => stats.foreign += 1,
    }
}

/// While the congestion window holds a sender back, every fourth frame and the one
/// that fills the window ask for an ACK (a receiver otherwise acknowledges only every
/// quarter of its receive window).
fn ack_request(peer: &Peer, window: u64, seq: u64, len: usize) -> u8 {
    let end = seq + len as u64;
    let frame_index = seq / PAYLOAD as u64;
    if peer.cwnd < window && (frame_index % 4 == 3 || end >= peer.peer_received + peer.cwnd) {
        FLAG_ACK_REQUEST
    } else {
        0
    }
}

fn write_header(
    frame: &mut [u8],
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    kind: u8,
    src: u16,
    dst: u16,
    len: u16,
) {
    frame[0..6].copy_from_slice(&dst_mac);
    frame[6..12].copy_from_slice(&src_mac);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    frame[14] = kind;
    frame[15] = 0;
    frame[16..18].copy_from_slice(&src.to_le_bytes());
    frame[18..20].copy_from_slice(&dst.to_le_bytes());
    frame[20..22].copy_from_slice(&len.to_le_bytes());
    // Zero the padding of short frames (no stale bytes on the wire).
    frame[ETH_HEADER + HEADER..MIN_FRAME].fill(0);
}

fn put64(frame: &mut [u8], at: usize, value: u64) {
    frame[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Copies `data` into a ring of `window` bytes at stream offset `pos`.
fn ring_write(ring: u64, window: u64, pos: u64, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        let at = (pos + done as u64) % window;
        let n = (data.len() - done).min((window - at) as usize);
        // SAFETY: [at, at + n) is inside the ring, which only this module touches.
        unsafe { core::ptr::copy_nonoverlapping(data[done..].as_ptr(), (ring + at) as *mut u8, n) };
        done += n;
    }
}

/// Copies ring bytes at stream offset `pos` into `out`.
fn ring_read(ring: u64, window: u64, pos: u64, out: &mut [u8]) {
    let mut done = 0;
    while done < out.len() {
        let at = (pos + done as u64) % window;
        let n = (out.len() - done).min((window - at) as usize);
        // SAFETY: as in `ring_write`.
        unsafe {
            core::ptr::copy_nonoverlapping((ring + at) as *const u8, out[done..].as_mut_ptr(), n)
        };
        done += n;
    }
}
