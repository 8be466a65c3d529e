//! Virtio 1.x devices for kumo's guests.
//!
//! Split as Firecracker and Cloud Hypervisor split it, so a second device (virtio-blk)
//! reuses everything but its own file:
//! - [`transport`]: the PCI function a guest driver sees (vendor capabilities for the
//!   common, notify, ISR and device-specific configuration, MSI-X, feature negotiation,
//!   queue setup, status and reset). It knows no device type; it drives a
//!   [`VirtioDevice`] and tells the VMM what to do through returned actions.
//! - [`chain`]: validated walks of descriptor chains (through the rust-vmm
//!   `virtio-queue` crate), so every device refuses malformed chains the same way.
//! - [`net`]: virtio-net on top.
//!
//! KVM-free: guest memory is any `vm_memory::GuestMemory`, interrupts leave through
//! [`crate::interrupt::InterruptSourceGroup`], queue notifications arrive as calls from the VMM (which
//! normally serves the notify doorbells with ioeventfds).
//!
//! # Wiring a NIC (what the VMM does)
//!
//! 1. `let nic = Arc::new(VirtioNet::new(NetConfig { mac, queue_pairs, queue_size },
//!    guest_memory.clone())?)`, then `VirtioPciDevice::new(nic.clone(), sink, actions)?`
//!    where `sink` is the VMM's [`crate::interrupt::InterruptSourceGroup`] for the domain's `irq_path`
//!    (the same types that serve the interrupt test device) and `actions` its
//!    [`transport::ActionSink`]. `place_bar(addr)` (32 KiB, from the `BarAllocator`),
//!    then `PciBus::add`.
//! 2. Actions arrive on the vCPU thread that made the access, with no transport lock
//!    held (the sink may call back into the transport):
//!    - `Activated`: for each [`NotifyDoorbell`] register an ioeventfd at the BAR's
//!      address + `offset` (4 bytes, no datamatch) and start the backend; tell the
//!      switch the port is up.
//!    - `QueueNotify(q)`: the fallback when a doorbell write reached the model; do what
//!      the ioeventfd of queue `q` would have done.
//!    - `Reset`: the device has already stopped touching the rings; unregister the
//!      ioeventfds, stop the backend, take the switch port down (its queued frames are
//!      discarded and counted).
//! 3. The backend (domain 0) maps a woken queue with `nic.queue_role(q)`:
//!    - `Tx(p)`: `nic.transmit(p, |frame| switch.ingress(port, frame).taken())`, or
//!      with the direct path `nic.transmit_frames(p, |f| ..)`: on
//!      `switch.route(port, f.header(), f.len())` = `Direct(dst)`,
//!      `nics[dst].receive_batch(|rx| rx.push_frame(f))` and, if delivered,
//!      `switch.delivered_direct(len)`, else `switch.ingress(port, f.bytes())` (release
//!      the switch's lock between the calls). If the report says `stopped`, wait until
//!      an egress names `port` in `unblocked`. (`transmit_bounded` caps a pass; if
//!      its report says `more`, call again after serving the other queues.)
//!    - `Rx(_)` (the guest posted buffers) and whenever the switch has frames for the
//!      port: `nic.receive_batch(|rx| switch.egress(port, |f| rx.push(f).consumed()))`,
//!      then resume the TX of every source in the result's `unblocked`.
//!    - `Ctrl`: `nic.process_ctrl()`.
//!
//!    Interrupts are raised inside these calls, through the transport, at most once
//!    per queue per call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::GuestMemory;

use crate::guest_errors::GuestErrorLog;

pub mod block;
pub mod chain;
pub mod net;
pub mod transport;

#[cfg(test)]
mod block_tests;
#[cfg(test)]
mod tests;

pub use transport::{NotifyDoorbell, TransportAction, VirtioPciDevice};

/// PCI vendor ID of every virtio device.
pub const VIRTIO_VENDOR_ID: u16 = 0x1af4;
/// Modern (1.x, non-transitional) devices are 0x1040 + device type.
pub const VIRTIO_DEVICE_ID_BASE: u16 = 0x1040;

/// Device types (virtio 1.2 section 5).
pub const TYPE_NET: u16 = 1;
pub const TYPE_BLOCK: u16 = 2;

/// Device status bits (virtio 1.2 section 2.1).
pub mod status {
    pub const ACKNOWLEDGE: u8 = 1;
    pub const DRIVER: u8 = 2;
    pub const DRIVER_OK: u8 = 4;
    pub const FEATURES_OK: u8 = 8;
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    pub const FAILED: u8 = 0x80;
}

/// Transport-level feature bits (virtio 1.2 section 6).
pub mod features {
    /// Descriptors with `VIRTQ_DESC_F_INDIRECT`.
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    /// `used_event` / `avail_event` interrupt suppression.
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// A virtio 1.x device (kumo's devices are modern only and require it).
    pub const VERSION_1: u64 = 1 << 32;
}

/// Why an interrupt is raised (the transport maps it to an MSI-X vector).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptCause {
    /// The device put buffers in queue `.0`'s used ring.
    Queue(u16),
    /// The device-specific configuration changed.
    Config,
}

/// How a device raises interrupts: given to it at activation by the transport, which
/// maps the cause to the vector the driver chose and honours MSI-X masking (held in
/// the PBA, sent on unmask).
pub trait VirtioInterrupt: Send + Sync {
    fn trigger(&self, cause: InterruptCause);
}

/// What a device gets when the driver sets DRIVER_OK.
pub struct Activation {
    /// The features both sides agreed on.
    pub features: u64,
    /// One per queue the device declared, in order; a queue the driver did not enable
    /// is present but not ready (`QueueT::ready` is false).
    pub queues: Vec<Queue>,
    pub interrupt: Arc<dyn VirtioInterrupt>,
}

/// Why a device refused to activate (the transport then sets DEVICE_NEEDS_RESET).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ActivateError {
    #[error("queue {0} is required but was not enabled or does not fit guest memory")]
    QueueInvalid(u16),
    #[error("expected {expected} queues, got {got}")]
    QueueCount { expected: usize, got: usize },
}

/// A virtio device behind a transport: what makes a NIC a NIC (features, its
/// configuration space, its queues' meaning). Called by the transport with its own
/// lock held, so implementations must not call back into the transport.
pub trait VirtioDevice: Send + Sync {
    /// Virtio device type ([`TYPE_NET`], ...).
    fn device_type(&self) -> u16;
    /// Maximum size of each queue (a power of two); the count is the number of queues.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Features the device offers (including [`features::VERSION_1`]).
    fn features(&self) -> u64;
    /// Whether the device can work with `features` (already a subset of
    /// [`VirtioDevice::features`] with VERSION_1); e.g. a feature that requires another.
    fn accepts_features(&self, _features: u64) -> bool {
        true
    }
    /// Bytes of the device-specific configuration structure.
    fn config_len(&self) -> u64;
    /// Reads the device-specific configuration at `offset` (bytes past the end read 0).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration (read-only fields ignore writes).
    fn write_config(&self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: start using these queues.
    fn activate(&self, activation: Activation) -> Result<(), ActivateError>;
    /// The driver reset the device: drop the queues and anything in flight that
    /// belongs to the old driver instance.
    fn reset(&self);
    /// For a snapshot of a live device (its backend quiesced): its place in each
    /// queue and its own state words. `None`: this device cannot be saved live.
    fn live_state(&self) -> Option<LiveState> {
        None
    }
    /// After an activation from a snapshot (whose queues already stand at the saved
    /// places): the device's own words back. An error is a state that does not fit.
    fn restore_live_state(&self, _words: &[u64]) -> Result<(), String> {
        Err("this device cannot be restored live".into())
    }
}

/// A live device's place in its queues and its own state (see
/// [`VirtioDevice::live_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveState {
    /// (next_avail, next_used) of each queue, in order.
    pub positions: Vec<(u16, u16)>,
    /// The device's own words (virtio-net: the queue pairs in use).
    pub words: Vec<u64>,
}

/// The guest pages a device wrote (buffers, used rings) while a migration tracks
/// them: KVM's dirty log sees only vCPU writes, not a backend thread's. Off, a
/// record costs one atomic load.
#[derive(Debug, Default)]
pub struct WriteLog {
    on: AtomicBool,
    pages: Mutex<Vec<u64>>,
}

impl WriteLog {
    /// Start or stop recording (stopping forgets what was not taken).
    pub fn track(&self, on: bool) {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        self.on.store(on, Ordering::SeqCst);
        if !on {
            pages.clear();
        }
    }

    /// `len` bytes were written at guest address `addr`.
    pub fn record(&self, addr: u64, len: u64) {
        if len == 0 || !self.on.load(Ordering::Acquire) {
            return;
        }
        const PAGE: u64 = 4096;
        let first = addr / PAGE;
        let last = addr.saturating_add(len - 1) / PAGE;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages.extend((first..=last).map(|p| p * PAGE));
    }

    /// The device may have written `queue`'s used ring (entries, index, and its
    /// flags or event field).
    pub fn record_used_ring(&self, queue: &Queue) {
        self.record(queue.used_ring(), 6 + 8 * u64::from(queue.size()) + 2);
    }

    /// The pages written since the last call, in order, each once.
    pub fn take(&self) -> Vec<u64> {
        let mut pages = std::mem::take(&mut *self.pages.lock().unwrap_or_else(|e| e.into_inner()));
        pages.sort_unstable();
        pages.dedup();
        pages
    }
}

/// Whether the driver wants an interrupt for what was just added to `queue`'s used
/// ring. With the event index, `virtio-queue` decides; without it, the driver's
/// `VIRTQ_AVAIL_F_NO_INTERRUPT` flag does (virtio 1.2 section 2.7.7.2), which
/// `virtio-queue` ignores: a polling driver would otherwise take an interrupt for every
/// batch. An unreadable flag errs on the side of the interrupt.
pub(crate) fn wants_interrupt<M: GuestMemory>(queue: &mut Queue, mem: &M) -> bool {
    const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
    if queue.event_idx_enabled() {
        return queue.needs_notification(mem).unwrap_or(true);
    }
    // Our used-ring index write before the flag read (the driver does the mirror
    // image: flag write, then used-index read).
    std::sync::atomic::fence(Ordering::SeqCst);
    let flags = vm_memory::Bytes::read_obj::<u16>(mem, vm_memory::GuestAddress(queue.avail_ring()));
    flags.map_or(true, |f| u16::from_le(f) & VIRTQ_AVAIL_F_NO_INTERRUPT == 0)
}

/// The next chain the driver made available on `queue`, if any. A ring the guest broke
/// (an index further ahead than the queue has entries, a ring outside its memory) is
/// the guest's error: told to `errors`, which keeps a flood of them to a few lines,
/// and answered with nothing.
pub(crate) fn pop_chain<'m, M: GuestMemory>(
    queue: &mut Queue,
    mem: &'m M,
    errors: &GuestErrorLog,
) -> Option<DescriptorChain<&'m M>> {
    match queue.iter(mem) {
        Ok(mut available) => available.next(),
        Err(e) => {
            errors.report(format_args!("bad ring: {e}"));
            None
        }
    }
}

/// What one pass of [`serve_chains`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Chains answered.
    pub chains: usize,
    /// The budget ran out with chains still available: call again (after looking at
    /// whether the device must stop or pause).
    pub more: bool,
}

/// Serves the request chains the driver queued on `queue`, at most `budget` of them:
/// `handle` gets each chain and returns how many bytes it wrote into it (the used
/// length). Re-arms notifications and serves what came meanwhile, within the budget.
/// The caller then raises the queue's interrupt if [`wants_interrupt`] says so.
///
/// The budget bounds a device's work per doorbell, as Firecracker and Cloud
/// Hypervisor bound theirs: a guest whose requests make more requests (a read that
/// rewrites `avail.idx`) would otherwise keep the serving thread forever, deaf to the
/// VM's stop. A ring whose index the guest corrupted yields nothing.
pub(crate) fn serve_chains<'m, M: GuestMemory>(
    queue: &mut Queue,
    mem: &'m M,
    budget: usize,
    errors: &GuestErrorLog,
    mut handle: impl FnMut(DescriptorChain<&'m M>) -> u32,
) -> Served {
    let mut served = Served::default();
    let mut popped = 0usize;
    loop {
        let mut this_round = 0usize;
        while popped < budget {
            let Some(chain) = pop_chain(queue, mem, errors) else {
                break;
            };
            popped += 1;
            this_round += 1;
            let head = chain.head_index();
            let written = handle(chain);
            if queue.add_used(mem, head, written).is_ok() {
                served.chains += 1;
            }
        }
        let again = matches!(queue.enable_notification(mem), Ok(true));
        if popped >= budget {
            served.more = again;
            break;
        }
        if !(again && this_round > 0) {
            break;
        }
    }
    served
}

/// Reads `data.len()` bytes at `offset` of a device's configuration `image` (bytes past
/// its end read 0): what [`VirtioDevice::read_config`] does for a fixed layout.
pub(crate) fn read_config_window(image: &[u8], offset: u64, data: &mut [u8]) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|at| image.get(at))
            .copied()
            .unwrap_or(0);
    }
}
