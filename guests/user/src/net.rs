//! A virtio-net driver in ring 3 (virtio 1.x, modern PCI: vendor 0x1AF4, device
//! 0x1041): one receive and one transmit queue, VERSION_1 + MAC, 12-byte
//! `virtio_net_hdr` before every frame, no offloads. Frames are Ethernet frames of at
//! most [`MAX_FRAME`] bytes (jumbo: 9014 without the FCS), each in one 9 KiB buffer
//! (no MRG_RXBUF needed). RING_EVENT_IDX is taken when offered.
//!
//! Receive is polled ([`Nic::poll`]) or interrupt-driven ([`Nic::wait`]): MSI-X entry 0
//! is the configuration vector, entries 1 and 2 the receive and transmit queues'. All
//! three deliver the same supervisor interrupt record, the NIC's own ([`record`]), so a
//! single trap call (`WAIT_UNTIL` on that record's count) sleeps until either queue has
//! work, with no window for a lost wake-up. A VM with several NICs runs one MPI rank
//! per NIC, each on its own CPU, waiting on its own record.

use kumo_abi::{BootInfo, IrqRecord};

use crate::pci::{self, read8};
pub use crate::virtio::OpenError;
use crate::virtio::{self, Bump, Error, F_EVENT_IDX, F_VERSION_1, Queue};

pub const DEVICE_ID: u16 = 0x1041;
pub const F_MAC: u64 = 1 << 5;
/// `virtio_net_hdr` with VERSION_1 (num_buffers included).
const NET_HDR: u64 = 12;
pub use crate::mpi::MAX_FRAME;
/// Each descriptor's buffer: header and frame, rounded up.
const BUFFER: u64 = 9216;
/// Ring size we ask for (the device's if smaller).
const QUEUE_SIZE: u16 = 256;
/// The supervisor interrupt record (device vector index) of the `index`-th NIC: the
/// first 16 are the interrupt test devices'.
pub const fn record(index: usize) -> usize {
    16 + index
}
/// Most NICs a VM's ranks can use, one record each.
pub const MAX_NICS: usize = kumo_abi::DEVICE_VECTORS - record(0);

/// A transmit ring full for this long gets an extra notification.
const TX_REMIND_US: u64 = 500;

const CONFIG_ENTRY: u16 = 0;
const RX_ENTRY: u16 = 1;
const TX_ENTRY: u16 = 2;

/// Counters, for the `@kumo mpistats` line.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub tx_frames: u64,
    pub rx_frames: u64,
    /// Frames shorter than the virtio header or longer than a buffer.
    pub rx_bad: u64,
    /// Times [`Nic::wait`] slept in the supervisor.
    pub sleeps: u64,
    /// Notifications sent because the transmit ring stayed full.
    pub reminders: u64,
}

pub struct Nic {
    rx: Queue,
    tx: Queue,
    rx_buffers: u64,
    tx_buffers: u64,
    /// Free transmit descriptors (a stack).
    tx_free: [u16; QUEUE_SIZE as usize],
    tx_free_len: usize,
    /// Frames pushed on the transmit queue but not yet published.
    tx_unpublished: usize,
    pub mac: [u8; 6],
    record: &'static IrqRecord,
    /// When the transmit ring was first seen full (0: not full), and how long it may
    /// stay so before the device is notified again.
    tx_stuck_since: u64,
    tx_remind_ticks: u64,
    /// The CPU whose scheduler runs this NIC's rank among others (`crate::sched`):
    /// waits then block the rank, not the CPU.
    pub scheduled: Option<u32>,
    pub stats: Stats,
}

impl Nic {
    /// Brings up the `index`-th virtio-net device on bus 0 (its BARs placed by
    /// [`virtio::place_bars`]) with its rings and buffers in `memory`; its interrupts go
    /// to CPU `cpu`.
    pub fn open(
        info: &BootInfo,
        memory: &mut Bump,
        index: usize,
        cpu: u32,
    ) -> Result<Nic, OpenError> {
        let apic_id = pci::apic_id(info, cpu).ok_or(OpenError::NoCpu)?;
        if index >= MAX_NICS {
            return Err(OpenError::NoDevice("too-many-nics"));
        }
        let interrupts = record(index);
        let device = virtio::open_nth(info, DEVICE_ID, index, "no-virtio-net")?;
        let features = device.negotiate(F_VERSION_1 | F_MAC, F_EVENT_IDX)?;
        let event_idx = features & F_EVENT_IDX != 0;
        if device.msix.vectors <= usize::from(TX_ENTRY) {
            return Err(OpenError::Virtio(Error::NoMsix));
        }
        device
            .msix
            .program(usize::from(CONFIG_ENTRY), apic_id, interrupts, false);
        device
            .msix
            .program(usize::from(RX_ENTRY), apic_id, interrupts, false);
        device
            .msix
            .program(usize::from(TX_ENTRY), apic_id, interrupts, false);
        device.set_config_vector(CONFIG_ENTRY)?;
        if device.num_queues() < 2 {
            return Err(OpenError::Virtio(Error::BadQueue));
        }
        let mut rx = device.queue(0, QUEUE_SIZE, RX_ENTRY, event_idx, memory)?;
        let mut tx = device.queue(1, QUEUE_SIZE, TX_ENTRY, event_idx, memory)?;
        let rx_buffers = memory.alloc(u64::from(rx.size) * BUFFER, 4096)?;
        let tx_buffers = memory.alloc(u64::from(tx.size) * BUFFER, 4096)?;
        let mut mac = [0u8; 6];
        for (i, byte) in mac.iter_mut().enumerate() {
            *byte = read8(device.device_cfg + i as u64);
        }
        for id in 0..rx.size {
            rx.set_desc(id, rx_buffers + u64::from(id) * BUFFER, BUFFER as u32, true);
            rx.push(id);
        }
        rx.set_interrupts(false);
        tx.set_interrupts(false);
        let mut tx_free = [0u16; QUEUE_SIZE as usize];
        for (id, slot) in tx_free.iter_mut().enumerate().take(usize::from(tx.size)) {
            *slot = id as u16;
        }
        device.start();
        rx.publish();
        Ok(Nic {
            tx_free_len: usize::from(tx.size),
            rx,
            tx,
            rx_buffers,
            tx_buffers,
            tx_free,
            tx_unpublished: 0,
            mac,
            record: &pci::records(info)[interrupts],
            tx_stuck_since: 0,
            tx_remind_ticks: info.tsc_khz * TX_REMIND_US / 1000,
            scheduled: None,
            stats: Stats::default(),
        })
    }

    /// Takes back transmit descriptors the device is done with.
    fn reclaim(&mut self) {
        while let Some((id, _)) = self.tx.pop_used() {
            if id < self.tx.size && self.tx_free_len < self.tx_free.len() {
                self.tx_free[self.tx_free_len] = id;
                self.tx_free_len += 1;
            }
        }
    }

    /// Whether a transmit descriptor is free (after taking back finished ones).
    pub fn can_send(&mut self) -> bool {
        if self.tx_free_len == 0 {
            self.reclaim();
            // Full and nothing came back for a while: remind the device (a device
            // that paused the queue for back-pressure may wait for a notification
            // its event index does not ask for).
            let now = crate::sys::rdtsc();
            if self.tx_free_len == 0 && now > self.tx_stuck_since + self.tx_remind_ticks {
                if self.tx_stuck_since != 0 {
                    self.tx.kick();
                    self.stats.reminders += 1;
                }
                self.tx_stuck_since = now;
            }
        }
        if self.tx_free_len > 0 {
            self.tx_stuck_since = 0;
        }
        self.tx_free_len > 0
    }

    /// Queues one frame: `build` writes it into the buffer it is given (at most
    /// [`MAX_FRAME`] bytes) and returns its length. False if the ring is full. The
    /// device sees it at the next [`Nic::flush`].
    pub fn send(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        if !self.can_send() {
            return false;
        }
        self.tx_free_len -= 1;
        let id = self.tx_free[self.tx_free_len];
        let buffer = self.tx_buffers + u64::from(id) * BUFFER;
        // SAFETY: descriptor `id`'s buffer, which the device has given back (it was on
        // the free stack): ours until we push it again.
        let (header, frame) = unsafe {
            (
                core::slice::from_raw_parts_mut(buffer as *mut u8, NET_HDR as usize),
                core::slice::from_raw_parts_mut((buffer + NET_HDR) as *mut u8, MAX_FRAME),
            )
        };
        header.fill(0);
        let len = build(frame).min(MAX_FRAME);
        self.tx
            .set_desc(id, buffer, (NET_HDR as usize + len) as u32, false);
        self.tx.push(id);
        self.tx_unpublished += 1;
        self.stats.tx_frames += 1;
        true
    }

    /// Hands queued frames to the device (one notification, if it wants one).
    pub fn flush(&mut self) {
        if self.tx_unpublished > 0 {
            self.tx.publish();
            self.tx_unpublished = 0;
        }
    }

    /// Calls `handle` on each received frame (Ethernet header first), at most `limit`
    /// of them, and gives their buffers back to the device. Returns how many.
    pub fn poll(&mut self, limit: usize, mut handle: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < limit {
            let Some((id, len)) = self.rx.pop_used() else {
                break;
            };
            if id >= self.rx.size {
                self.stats.rx_bad += 1;
                continue;
            }
            let len = u64::from(len);
            if (NET_HDR..=BUFFER).contains(&len) {
                let at = self.rx_buffers + u64::from(id) * BUFFER + NET_HDR;
                // SAFETY: the device wrote `len` bytes into descriptor `id`'s buffer and
                // gave it back; it is ours until pushed again below.
                handle(unsafe {
                    core::slice::from_raw_parts(at as *const u8, (len - NET_HDR) as usize)
                });
                self.stats.rx_frames += 1;
            } else {
                self.stats.rx_bad += 1;
            }
            self.rx.push(id);
            n += 1;
        }
        if n > 0 {
            self.rx.publish();
        }
        n
    }

    /// Sleeps until a frame arrives, a sent frame completes (if any are in flight), or
    /// the TSC reaches `until_tsc`. False if the machine cannot sleep with a deadline
    /// (no TSC-deadline timer): the caller must keep polling.
    pub fn wait(&mut self, until_tsc: u64) -> bool {
        self.wait_or(until_tsc, None)
    }

    /// As [`Nic::wait`]; with `bell`, also ends (or does not start) once that word
    /// differs from the value given.
    pub fn wait_or(
        &mut self,
        until_tsc: u64,
        bell: Option<(&core::sync::atomic::AtomicU32, u32)>,
    ) -> bool {
        let seen = pci::count(self.record);
        // Take back what the device finished sending: a used transmit entry left in
        // the ring reads as work below, and the rank would never sleep.
        self.reclaim();
        let in_flight = self.tx_free_len < usize::from(self.tx.size);
        self.rx.set_interrupts(true);
        if in_flight {
            self.tx.set_interrupts(true);
        }
        let mut slept = true;
        // Interrupts are asked for: anything that arrives from now on raises one. What
        // arrived before is in the rings: look there first.
        let work = self.rx.has_used() || (in_flight && self.tx.has_used());
        if !work {
            let count = (&raw const self.record.count).cast::<u32>();
            slept = match (self.scheduled, bell) {
                (Some(cpu), bell) => {
                    let (word, value) =
                        bell.map_or((count, seen as u32), |(b, v)| (b.as_ptr().cast_const(), v));
                    crate::sched::block(cpu, count, seen as u32, word, value, until_tsc);
                    true
                }
                // Not scheduled: a bell rung from another CPU comes with a wake-up IPI.
                (None, Some((b, v))) if b.load(core::sync::atomic::Ordering::SeqCst) != v => true,
                (None, _) => pci::wait_for_interrupt(self.record, seen, until_tsc),
            };
            self.stats.sleeps += u64::from(slept);
        }
        self.rx.set_interrupts(false);
        self.tx.set_interrupts(false);
        slept
    }

    /// Waits until the device has taken every queued frame (so they are on the wire
    /// before the VM ends), at most until `until_tsc`. False on timeout.
    pub fn drain(&mut self, until_tsc: u64) -> bool {
        self.flush();
        loop {
            self.reclaim();
            if self.tx_free_len == usize::from(self.tx.size) {
                return true;
            }
            if crate::sys::rdtsc() > until_tsc {
                return false;
            }
            core::hint::spin_loop();
        }
    }

    /// Notifications sent to the device (each one an exit): (receive, transmit).
    pub fn kicks(&self) -> (u64, u64) {
        (self.rx.kicks, self.tx.kicks)
    }

    /// Interrupts taken on the queues' vector so far.
    pub fn interrupts(&self) -> u64 {
        pci::count(self.record)
    }
}

impl crate::mpi::Link for Nic {
    fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn send(&mut self, build: impl FnOnce(&mut [u8]) -> usize) -> bool {
        Nic::send(self, build)
    }

    fn flush(&mut self) {
        Nic::flush(self)
    }

    fn poll(&mut self, limit: usize, handle: impl FnMut(&[u8])) -> usize {
        Nic::poll(self, limit, handle)
    }

    fn wait(&mut self, until: u64) -> bool {
        Nic::wait(self, until)
    }

    fn wait_bell(&mut self, bell: &core::sync::atomic::AtomicU32, seen: u32, until: u64) -> bool {
        Nic::wait_or(self, until, Some((bell, seen)))
    }

    fn yield_now(&mut self) {
        match self.scheduled {
            Some(cpu) => crate::sched::yield_now(cpu),
            None => core::hint::spin_loop(),
        }
    }

    fn kick(&mut self) {
        crate::sys::wake();
    }

    fn drain(&mut self, until: u64) -> bool {
        Nic::drain(self, until)
    }

    fn now(&self) -> u64 {
        crate::sys::rdtsc()
    }
}
