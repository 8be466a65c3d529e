//! The guest's MPI on host threads: an in-memory wire (one receive queue per rank,
//! optional loss and delay, a nanosecond clock) in place of virtio-net and the switch. The
//! protocol tests run on it (`tests/mpi_protocol.rs`, `tests/npb_mpi_protocol.rs`), and
//! `kumo experiment s2` takes it as bare metal: the same MPI, no NIC, no VM.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::guest_mpi::{Config, Link, MAX_FRAME, Mpi, Wait};

/// Frames on their way to one rank, in order (as on a switch), each with when it
/// arrives ([`Wire::arrival`]).
type InFlight = Mutex<VecDeque<(u64, Vec<u8>)>>;

pub struct Wire {
    queues: Vec<InFlight>,
    /// Drop a sent frame with probability `1 / drop_one_in` (0: never).
    drop_one_in: u64,
    /// How long a frame takes to arrive (a busy domain 0's queue, in effect).
    delay_ns: u64,
    epoch: Instant,
}

impl Wire {
    /// A wire for `ranks` ranks that drops one frame in `drop_one_in` (0: none).
    pub fn new(ranks: usize, drop_one_in: u64) -> Wire {
        Wire {
            queues: (0..ranks).map(|_| Mutex::new(VecDeque::new())).collect(),
            drop_one_in,
            delay_ns: 0,
            epoch: Instant::now(),
        }
    }

    /// The same wire, on which every frame takes `delay` to arrive.
    pub fn delayed(self, delay: Duration) -> Wire {
        Wire {
            delay_ns: delay.as_nanos() as u64,
            ..self
        }
    }

    /// When a frame sent now arrives, in ns since `epoch`; 0 (at once) with no delay,
    /// so an undelayed wire (`kumo experiment s2`'s bare metal) reads no clock.
    fn arrival(&self) -> u64 {
        if self.delay_ns == 0 {
            return 0;
        }
        self.epoch.elapsed().as_nanos() as u64 + self.delay_ns
    }

    /// Whether a frame arriving at `at` (from [`Wire::arrival`]) is there now.
    fn arrived(&self, at: u64) -> bool {
        at == 0 || at <= self.epoch.elapsed().as_nanos() as u64
    }
}

pub struct MemoryLink<'w> {
    rank: usize,
    wire: &'w Wire,
    queued: Vec<Vec<u8>>,
    /// Where frames are built (a frame's buffer is then only as long as the frame).
    scratch: Box<[u8; MAX_FRAME]>,
    start: Instant,
    random: u64,
    pub dropped: u64,
}

impl<'w> MemoryLink<'w> {
    pub fn new(rank: usize, wire: &'w Wire) -> MemoryLink<'w> {
        MemoryLink {
            rank,
            wire,
            queued: Vec::new(),
            scratch: Box::new([0; MAX_FRAME]),
            start: Instant::now(),
            random: 0x1234_5678 ^ rank as u64,
            dropped: 0,
        }
    }

    fn lose(&mut self) -> bool {
        if self.wire.drop_one_in == 0 {
            return false;
        }
        self.random = self
            .random
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.random >> 33).is_multiple_of(self.wire.drop_one_in)
    }
}

impl Link for MemoryLink<'_> {
    fn mac(&self) -> [u8; 6] {
        [2, 0, 0, 0, 0, self.rank as u8]
    }

    fn send(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if self.queued.len() >= 256 {
            return false; // a full transmit ring
        }
        let len = build(&mut self.scratch[..]).min(MAX_FRAME);
        debug_assert!(len >= 60, "frame of {len} bytes");
        self.queued.push(self.scratch[..len].to_vec());
        true
    }

    fn flush(&mut self) {
        let arrives = self.wire.arrival();
        for frame in std::mem::take(&mut self.queued) {
            if self.lose() {
                self.dropped += 1;
                continue;
            }
            let ranks = self.wire.queues.len();
            if frame[0..6] == [0xFF; 6] {
                for (rank, queue) in self.wire.queues.iter().enumerate() {
                    if rank != self.rank {
                        queue.lock().unwrap().push_back((arrives, frame.clone()));
                    }
                }
            } else if usize::from(frame[5]) < ranks {
                self.wire.queues[usize::from(frame[5])]
                    .lock()
                    .unwrap()
                    .push_back((arrives, frame));
            }
        }
    }

    fn poll(&mut self, limit: usize, mut handle: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < limit {
            let mut queue = self.wire.queues[self.rank].lock().unwrap();
            if queue.front().is_none_or(|(at, _)| !self.wire.arrived(*at)) {
                break;
            }
            let Some((_, frame)) = queue.pop_front() else {
                break;
            };
            drop(queue);
            handle(&frame);
            n += 1;
        }
        n
    }

    fn wait(&mut self, _until: u64) -> bool {
        std::thread::yield_now();
        true
    }

    fn drain(&mut self, _until: u64) -> bool {
        self.flush();
        true
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

/// Runs `job(rank, mpi)` on `ranks` threads, each an `Mpi` over one wire that drops one
/// frame in `drop_one_in` (0: none), with a credit `window` of bytes; finishes every
/// rank's MPI and returns each rank's result and the frames its link dropped. Ranks
/// wait as `Wait::Block` ranks do (here: yielding the CPU).
pub fn run_ranks<T: Send>(
    ranks: usize,
    drop_one_in: u64,
    window: u64,
    job: impl Fn(usize, &mut Mpi<MemoryLink>) -> T + Sync,
) -> Vec<(T, u64)> {
    run_ranks_with(Wire::new(ranks, drop_one_in), window, Wait::Block, job)
}

/// As [`run_ranks`], on `wire` (one rank per queue), the ranks waiting as `wait` says.
pub fn run_ranks_with<T: Send>(
    wire: Wire,
    window: u64,
    wait: Wait,
    job: impl Fn(usize, &mut Mpi<MemoryLink>) -> T + Sync,
) -> Vec<(T, u64)> {
    let ranks = wire.queues.len();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (wire, job) = (&wire, &job);
                scope.spawn(move || {
                    let mut memory: Vec<Vec<u8>> = Vec::new();
                    let cfg = Config {
                        rank,
                        size: ranks,
                        wait,
                        tsc_khz: 1_000_000, // the clock counts nanoseconds
                        spin_ticks: 20_000,
                        timeout_ms: 20_000,
                        window,
                        drop_every: 0,
                    };
                    let mut mpi = Mpi::init(MemoryLink::new(rank, wire), cfg, |bytes| {
                        let mut block = vec![0u8; bytes as usize];
                        let at = block.as_mut_ptr() as u64;
                        memory.push(block); // its heap buffer never moves
                        Some(at)
                    })
                    .unwrap_or_else(|e| panic!("rank {rank}: init: {e:?}"));
                    let result = job(rank, &mut mpi);
                    mpi.finish()
                        .unwrap_or_else(|e| panic!("rank {rank}: finish: {e:?}"));
                    let dropped = mpi.link().dropped;
                    drop(mpi);
                    drop(memory);
                    (result, dropped)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
