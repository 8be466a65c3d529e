//! The virtio 1.x PCI transport (virtio 1.2 section 4.1): a modern-only PCI function
//! (vendor 0x1af4, device 0x1040 + type) that any [`VirtioDevice`] sits behind.
//!
//! One 32 KiB memory BAR (BAR 0) holds every register block, each in its own page:
//!
//! | offset   | block                                                        |
//! |----------|--------------------------------------------------------------|
//! | `0x0000` | common configuration (features, status, queue setup)        |
//! | `0x1000` | ISR status (read clears)                                     |
//! | `0x2000` | device-specific configuration (the [`VirtioDevice`]'s)       |
//! | `0x3000` | queue notify doorbells, queue `q` at `0x3000 + 4 * q`        |
//! | `0x4000` | MSI-X table (one vector per queue plus one for config)       |
//! | `0x5000` | MSI-X PBA                                                    |
//!
//! Vendor capabilities point the driver at the blocks (plus the `PCI_CFG` access window
//! the specification requires, which reaches the BAR through configuration space).
//!
//! The transport never calls into the VMM to make something happen. Its write path
//! returns a [`TransportAction`] (a queue was notified, the driver set DRIVER_OK and
//! the device is live, the driver reset the device); where the [`PciDevice`] trait
//! cannot return one, the action goes to the [`ActionSink`] the VMM gave at
//! construction. Doorbells are meant to be served by ioeventfds at the addresses
//! [`VirtioPciDevice::notify_doorbells`] lists; a notify write that reaches
//! [`PciDevice::bar_write`] anyway becomes [`TransportAction::QueueNotify`].
//!
//! Interrupts: the device raises them through the [`VirtioInterrupt`] handle it gets
//! at activation; the transport maps the cause to the vector the driver chose for it
//! and fires it through [`Msix`] (held in the PBA while masked) into the VMM's
//! [`InterruptSourceGroup`]. INTx is not modelled: with MSI-X disabled only the ISR bits are set.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use super::{Activation, InterruptCause, LiveState, VirtioDevice, VirtioInterrupt, features};
use super::{VIRTIO_DEVICE_ID_BASE, VIRTIO_VENDOR_ID, status};
use crate::interrupt::InterruptSourceGroup;
use crate::pci::PciDevice;
use crate::pci::config::{self, Bar, BarKind, BarRegion, ConfigError, ConfigSpace};
use crate::pci::msix::{self, Msix, Update};
use crate::state::{DeviceStateError, PciDeviceState};
pub use crate::state::{QueueState, VirtioState};

/// Size of BAR 0.
pub const BAR_SIZE: u64 = 0x8000;
pub const COMMON_OFFSET: u64 = 0x0000;
pub const ISR_OFFSET: u64 = 0x1000;
pub const DEVICE_CONFIG_OFFSET: u64 = 0x2000;
pub const NOTIFY_OFFSET: u64 = 0x3000;
pub const MSIX_TABLE_OFFSET: u64 = 0x4000;
pub const MSIX_PBA_OFFSET: u64 = 0x5000;
/// Bytes between two queues' doorbells.
pub const NOTIFY_OFF_MULTIPLIER: u32 = 4;
/// Each block's window in the BAR.
const BLOCK: u64 = 0x1000;
/// Queues the layout has room for: one MSI-X vector each plus the config vector
/// must fit the 4 KiB table page.
pub const MAX_QUEUES: usize = (BLOCK / msix::ENTRY_SIZE) as usize - 1;
/// "No vector" for config_msix_vector / queue_msix_vector.
pub const NO_VECTOR: u16 = 0xffff;

/// Vendor capability types (`cfg_type`).
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
const CAP_PCI_CFG: u8 = 5;
const CAP_VENDOR_ID: u8 = 0x09;

/// ISR bits.
const ISR_QUEUE: u8 = 1;
const ISR_CONFIG: u8 = 2;

/// Common configuration registers (offset, width).
mod common {
    pub const DEVICE_FEATURE_SELECT: usize = 0x00;
    pub const DEVICE_FEATURE: usize = 0x04;
    pub const DRIVER_FEATURE_SELECT: usize = 0x08;
    pub const DRIVER_FEATURE: usize = 0x0c;
    pub const CONFIG_MSIX_VECTOR: usize = 0x10;
    pub const NUM_QUEUES: usize = 0x12;
    pub const DEVICE_STATUS: usize = 0x14;
    pub const CONFIG_GENERATION: usize = 0x15;
    pub const QUEUE_SELECT: usize = 0x16;
    pub const QUEUE_SIZE: usize = 0x18;
    pub const QUEUE_MSIX_VECTOR: usize = 0x1a;
    pub const QUEUE_ENABLE: usize = 0x1c;
    pub const QUEUE_NOTIFY_OFF: usize = 0x1e;
    pub const QUEUE_DESC: usize = 0x20;
    pub const QUEUE_DRIVER: usize = 0x28;
    pub const QUEUE_DEVICE: usize = 0x30;
    pub const LEN: usize = 0x38;
    /// Every register, in offset order, with its width.
    pub const FIELDS: [(usize, usize); 16] = [
        (DEVICE_FEATURE_SELECT, 4),
        (DEVICE_FEATURE, 4),
        (DRIVER_FEATURE_SELECT, 4),
        (DRIVER_FEATURE, 4),
        (CONFIG_MSIX_VECTOR, 2),
        (NUM_QUEUES, 2),
        (DEVICE_STATUS, 1),
        (CONFIG_GENERATION, 1),
        (QUEUE_SELECT, 2),
        (QUEUE_SIZE, 2),
        (QUEUE_MSIX_VECTOR, 2),
        (QUEUE_ENABLE, 2),
        (QUEUE_NOTIFY_OFF, 2),
        (QUEUE_DESC, 8),
        (QUEUE_DRIVER, 8),
        (QUEUE_DEVICE, 8),
    ];
}

/// What the VMM must do after a guest access the transport handled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum TransportAction {
    /// Nothing.
    None,
    /// The driver notified queue `.0` through the BAR (the doorbell's ioeventfd did not
    /// take the write): wake that queue's backend as the ioeventfd would have.
    QueueNotify(u16),
    /// The driver set DRIVER_OK and the device accepted its queues: serve the
    /// doorbells ([`VirtioPciDevice::notify_doorbells`]) and start the backend.
    Activated,
    /// The driver reset the device (status 0): stop the backend, drop the doorbells'
    /// ioeventfds; the device has already dropped its queues.
    Reset,
}

/// Receives the actions of accesses that arrive through [`PciDevice`] (whose methods
/// return nothing). Implemented by the VMM.
pub trait ActionSink: Send + Sync {
    fn act(&self, action: TransportAction);
}

/// Where queue `queue` is notified: BAR `bar`, at `offset` from the BAR's start
/// (4 bytes wide; any value written is a notification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyDoorbell {
    pub bar: u8,
    pub offset: u64,
    pub queue: u16,
}

/// The driver's view of one queue before activation.
#[derive(Debug, Clone, Copy)]
struct QueueConfig {
    max_size: u16,
    size: u16,
    enabled: bool,
    desc: u64,
    driver: u64,
    device: u64,
}

impl QueueConfig {
    fn new(max_size: u16) -> QueueConfig {
        QueueConfig {
            max_size,
            size: max_size,
            enabled: false,
            desc: 0,
            driver: 0,
            device: 0,
        }
    }

    /// A `virtio_queue::Queue` for the device; not ready if the driver did not enable
    /// it or gave a size or an alignment the ring format forbids.
    fn build(&self, event_idx: bool) -> Queue {
        let mut queue = Queue::new(self.max_size).unwrap_or_default();
        let valid = self.enabled
            && queue.try_set_size(self.size).is_ok()
            && queue
                .try_set_desc_table_address(GuestAddress(self.desc))
                .is_ok()
            && queue
                .try_set_avail_ring_address(GuestAddress(self.driver))
                .is_ok()
            && queue
                .try_set_used_ring_address(GuestAddress(self.device))
                .is_ok();
        queue.set_event_idx(event_idx);
        queue.set_ready(valid);
        queue
    }
}

/// Interrupt state shared with the device's [`VirtioInterrupt`] handle.
struct IrqState {
    msix: Msix,
    isr: u8,
    config_vector: u16,
    queue_vectors: Vec<u16>,
}

struct Irq {
    state: Mutex<IrqState>,
    sink: Arc<dyn InterruptSourceGroup>,
}

impl Irq {
    fn lock(&self) -> MutexGuard<'_, IrqState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the sink about route changes, with the state locked so a concurrent
    /// trigger sees the new route.
    fn apply(&self, update: Update) {
        update.apply_to(&*self.sink);
    }
}

impl VirtioInterrupt for Irq {
    fn trigger(&self, cause: InterruptCause) {
        let mut state = self.lock();
        let (vector, bit) = match cause {
            InterruptCause::Queue(q) => (
                state
                    .queue_vectors
                    .get(usize::from(q))
                    .copied()
                    .unwrap_or(NO_VECTOR),
                ISR_QUEUE,
            ),
            InterruptCause::Config => (state.config_vector, ISR_CONFIG),
        };
        if !state.msix.enabled() {
            state.isr |= bit;
            return;
        }
        if vector != NO_VECTOR && state.msix.fire(vector).is_some() {
            self.sink.trigger(vector);
        }
    }
}

struct State {
    config: ConfigSpace,
    msix_cap: usize,
    /// Offset of the `PCI_CFG` capability in configuration space.
    pci_cfg_cap: usize,
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    status: u8,
    config_generation: u8,
    queue_select: u16,
    queues: Vec<QueueConfig>,
}

/// A virtio device on kumo's PCI bus. Shared by vCPU threads (register accesses) and
/// the device's backend (interrupts, through the handle it got at activation).
pub struct VirtioPciDevice {
    device: Arc<dyn VirtioDevice>,
    state: Mutex<State>,
    irq: Arc<Irq>,
    actions: Arc<dyn ActionSink>,
}

/// Errors building the transport (VMM mistakes, never guest-caused).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    #[error("a virtio device needs 1..={MAX_QUEUES} queues, this one declares {0}")]
    QueueCount(usize),
    #[error("queue {queue}: maximum size {size} is not a power of two of at most 32768")]
    QueueSize { queue: usize, size: u16 },
    #[error("configuration space: {0}")]
    Config(#[from] ConfigError),
}

/// A vendor capability's body (after ID and next pointer).
fn vendor_cap(cfg_type: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let cap_len = (16 + extra.len()) as u8;
    let mut body = vec![cap_len, cfg_type, 0, 0, 0, 0];
    body.extend_from_slice(&(offset as u32).to_le_bytes());
    body.extend_from_slice(&(length as u32).to_le_bytes());
    body.extend_from_slice(extra);
    body
}

impl VirtioPciDevice {
    /// The transport for `device`; interrupts go to `sink`, actions of accesses that
    /// come through [`PciDevice`] to `actions`.
    pub fn new(
        device: Arc<dyn VirtioDevice>,
        sink: Arc<dyn InterruptSourceGroup>,
        actions: Arc<dyn ActionSink>,
    ) -> Result<VirtioPciDevice, TransportError> {
        let sizes = device.queue_max_sizes();
        if sizes.is_empty() || sizes.len() > MAX_QUEUES {
            return Err(TransportError::QueueCount(sizes.len()));
        }
        if let Some((queue, &size)) = sizes
            .iter()
            .enumerate()
            .find(|(_, s)| Queue::new(**s).is_err())
        {
            return Err(TransportError::QueueSize { queue, size });
        }
        let device_id = VIRTIO_DEVICE_ID_BASE + device.device_type();
        let class = match device.device_type() {
            super::TYPE_NET => 0x02_00_00,
            super::TYPE_BLOCK => 0x01_80_00,
            _ => 0xff_00_00,
        };
        // Non-transitional: revision 1, subsystem ID 0x40 or higher (virtio 4.1.2.1).
        let mut config = ConfigSpace::new(VIRTIO_VENDOR_ID, device_id, class, 1);
        config.put(0x2c, &VIRTIO_VENDOR_ID.to_le_bytes());
        config.put(0x2e, &0x0040u16.to_le_bytes());
        config.add_bar(
            0,
            Bar {
                kind: BarKind::Memory32,
                size: BAR_SIZE,
            },
        )?;
        let msix = Msix::new(sizes.len() as u16 + 1);
        let (body, writable) =
            msix.capability(0, MSIX_TABLE_OFFSET as u32, 0, MSIX_PBA_OFFSET as u32);
        let msix_cap = config.add_capability(msix::CAPABILITY_ID, &body, &writable)?;
        let blocks = [
            (CAP_COMMON, COMMON_OFFSET, common::LEN as u64, Vec::new()),
            (
                CAP_NOTIFY,
                NOTIFY_OFFSET,
                u64::from(NOTIFY_OFF_MULTIPLIER) * sizes.len() as u64,
                NOTIFY_OFF_MULTIPLIER.to_le_bytes().to_vec(),
            ),
            (CAP_ISR, ISR_OFFSET, 1, Vec::new()),
            (
                CAP_DEVICE,
                DEVICE_CONFIG_OFFSET,
                device.config_len(),
                Vec::new(),
            ),
        ];
        for (cfg_type, offset, length, extra) in blocks {
            config.add_capability(
                CAP_VENDOR_ID,
                &vendor_cap(cfg_type, offset, length, &extra),
                &[],
            )?;
        }
        // The PCI_CFG window: bar, offset and length are the driver's; then 4 data bytes.
        let mut writable = [0u8; 18];
        writable[2] = 0xff; // bar
        writable[6..18].fill(0xff); // offset, length, data
        let pci_cfg_cap = config.add_capability(
            CAP_VENDOR_ID,
            &vendor_cap(CAP_PCI_CFG, 0, 0, &[0; 4]),
            &writable,
        )?;
        let queues = sizes.iter().map(|&s| QueueConfig::new(s)).collect();
        Ok(VirtioPciDevice {
            irq: Arc::new(Irq {
                state: Mutex::new(IrqState {
                    msix,
                    isr: 0,
                    config_vector: NO_VECTOR,
                    queue_vectors: vec![NO_VECTOR; sizes.len()],
                }),
                sink,
            }),
            device,
            state: Mutex::new(State {
                config,
                msix_cap,
                pci_cfg_cap,
                device_feature_select: 0,
                driver_feature_select: 0,
                driver_features: 0,
                status: 0,
                config_generation: 0,
                queue_select: 0,
                queues,
            }),
            actions,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device kind in a snapshot: the transport and the virtio device type.
    fn kind(&self) -> String {
        format!("virtio-pci:{}", self.device.device_type())
    }

    /// Places BAR 0 before the guest runs, as firmware does.
    pub fn place_bar(&self, address: u64) {
        self.state().config.set_bar_address(0, address);
    }

    /// Where BAR 0 is now.
    pub fn bar_address(&self) -> Option<u64> {
        self.state().config.bar_address(0)
    }

    /// Every queue's doorbell, for the VMM to serve with ioeventfds (at the BAR's
    /// current address plus `offset`; re-register when the guest moves the BAR).
    pub fn notify_doorbells(&self) -> Vec<NotifyDoorbell> {
        (0..self.state().queues.len())
            .map(|q| NotifyDoorbell {
                bar: 0,
                offset: NOTIFY_OFFSET + u64::from(NOTIFY_OFF_MULTIPLIER) * q as u64,
                queue: q as u16,
            })
            .collect()
    }

    /// The device status register (as the driver last left it).
    pub fn status(&self) -> u8 {
        self.state().status
    }

    /// The features the driver wrote (meaningful once FEATURES_OK is set).
    pub fn driver_features(&self) -> u64 {
        self.state().driver_features
    }

    /// The device's configuration changed: bump the generation, raise the config
    /// interrupt.
    pub fn config_changed(&self) {
        {
            let mut state = self.state();
            state.config_generation = state.config_generation.wrapping_add(1);
        }
        self.irq.trigger(InterruptCause::Config);
    }

    /// The interrupt handle the device gets at activation (also usable by the VMM,
    /// e.g. to re-raise after restore).
    pub fn interrupt(&self) -> Arc<dyn VirtioInterrupt> {
        self.irq.clone()
    }

    /// A guest write to BAR `bar`, returning what the VMM must do.
    pub fn write_bar(&self, bar: u8, offset: u64, data: &[u8]) -> TransportAction {
        if bar != 0 {
            return TransportAction::None;
        }
        let mut state = self.state();
        self.bar_write_locked(&mut state, offset, data)
    }

    fn bar_write_locked(&self, state: &mut State, offset: u64, data: &[u8]) -> TransportAction {
        match offset {
            COMMON_OFFSET..ISR_OFFSET => self.common_write(state, offset as usize, data),
            DEVICE_CONFIG_OFFSET..NOTIFY_OFFSET => {
                self.device
                    .write_config(offset - DEVICE_CONFIG_OFFSET, data);
                TransportAction::None
            }
            NOTIFY_OFFSET..MSIX_TABLE_OFFSET => {
                let relative = offset - NOTIFY_OFFSET;
                let queue = relative / u64::from(NOTIFY_OFF_MULTIPLIER);
                let live = state.status & status::DRIVER_OK != 0;
                if live
                    && relative.is_multiple_of(u64::from(NOTIFY_OFF_MULTIPLIER))
                    && (queue as usize) < state.queues.len()
                {
                    TransportAction::QueueNotify(queue as u16)
                } else {
                    TransportAction::None
                }
            }
            MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET => {
                let mut irq = self.irq.lock();
                let update = irq.msix.table_write(offset - MSIX_TABLE_OFFSET, data);
                self.irq.apply(update);
                TransportAction::None
            }
            // ISR and PBA are read-only; the rest of the BAR ignores writes.
            _ => TransportAction::None,
        }
    }

    /// A guest read of BAR `bar` (reading the ISR clears it).
    pub fn read_bar(&self, bar: u8, offset: u64, data: &mut [u8]) {
        if bar != 0 {
            data.fill(0xff);
            return;
        }
        let state = self.state();
        self.bar_read_locked(&state, offset, data);
    }

    fn bar_read_locked(&self, state: &State, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match offset {
            COMMON_OFFSET..ISR_OFFSET => {
                let image = self.common_image(state);
                for (i, byte) in data.iter_mut().enumerate() {
                    *byte = image.get(offset as usize + i).copied().unwrap_or(0);
                }
            }
            ISR_OFFSET..DEVICE_CONFIG_OFFSET => {
                if offset == ISR_OFFSET
                    && let Some(first) = data.first_mut()
                {
                    let mut irq = self.irq.lock();
                    *first = irq.isr;
                    irq.isr = 0;
                }
            }
            DEVICE_CONFIG_OFFSET..NOTIFY_OFFSET => {
                self.device.read_config(offset - DEVICE_CONFIG_OFFSET, data)
            }
            MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET => self
                .irq
                .lock()
                .msix
                .table_read(offset - MSIX_TABLE_OFFSET, data),
            MSIX_PBA_OFFSET..BAR_SIZE => self
                .irq
                .lock()
                .msix
                .pba_read(offset - MSIX_PBA_OFFSET, data),
            // Doorbells are write-only.
            _ => {}
        }
    }

    /// The common configuration block as the driver would read it now.
    fn common_image(&self, state: &State) -> [u8; common::LEN] {
        use common::*;
        let mut image = [0u8; LEN];
        let mut put = |at: usize, bytes: &[u8]| image[at..at + bytes.len()].copy_from_slice(bytes);
        let offered = self.device.features();
        let window = |features: u64, select: u32| match select {
            0 => features as u32,
            1 => (features >> 32) as u32,
            _ => 0,
        };
        put(
            DEVICE_FEATURE_SELECT,
            &state.device_feature_select.to_le_bytes(),
        );
        put(
            DEVICE_FEATURE,
            &window(offered, state.device_feature_select).to_le_bytes(),
        );
        put(
            DRIVER_FEATURE_SELECT,
            &state.driver_feature_select.to_le_bytes(),
        );
        put(
            DRIVER_FEATURE,
            &window(state.driver_features, state.driver_feature_select).to_le_bytes(),
        );
        let irq = self.irq.lock();
        put(CONFIG_MSIX_VECTOR, &irq.config_vector.to_le_bytes());
        put(NUM_QUEUES, &(state.queues.len() as u16).to_le_bytes());
        put(DEVICE_STATUS, &[state.status]);
        put(CONFIG_GENERATION, &[state.config_generation]);
        put(QUEUE_SELECT, &state.queue_select.to_le_bytes());
        let q = usize::from(state.queue_select);
        if let Some(queue) = state.queues.get(q) {
            put(QUEUE_SIZE, &queue.size.to_le_bytes());
            put(QUEUE_MSIX_VECTOR, &irq.queue_vectors[q].to_le_bytes());
            put(QUEUE_ENABLE, &u16::from(queue.enabled).to_le_bytes());
            put(QUEUE_NOTIFY_OFF, &(q as u16).to_le_bytes());
            put(QUEUE_DESC, &queue.desc.to_le_bytes());
            put(QUEUE_DRIVER, &queue.driver.to_le_bytes());
            put(QUEUE_DEVICE, &queue.device.to_le_bytes());
        }
        image
    }

    /// A write to the common block: the bytes land on the current image, then every
    /// register they touched takes its new value (so any width and any split of a
    /// 64-bit register into halves works).
    fn common_write(&self, state: &mut State, offset: usize, data: &[u8]) -> TransportAction {
        let mut image = self.common_image(state);
        let end = offset.saturating_add(data.len()).min(common::LEN);
        if offset >= end {
            return TransportAction::None;
        }
        image[offset..end].copy_from_slice(&data[..end - offset]);
        let mut action = TransportAction::None;
        for (at, width) in common::FIELDS {
            if at < end && offset < at + width {
                let mut value = [0u8; 8];
                value[..width].copy_from_slice(&image[at..at + width]);
                let value = u64::from_le_bytes(value);
                let result = self.set_register(state, at, value);
                if result != TransportAction::None {
                    action = result;
                }
            }
        }
        action
    }

    fn set_register(&self, state: &mut State, at: usize, value: u64) -> TransportAction {
        use common::*;
        let features_locked = state.status & status::FEATURES_OK != 0;
        let q = usize::from(state.queue_select);
        // Queue registers change only before the queue is enabled and the device live.
        let queue_writable = state.status & status::DRIVER_OK == 0
            && state.queues.get(q).is_some_and(|queue| !queue.enabled);
        match at {
            DEVICE_FEATURE_SELECT => state.device_feature_select = value as u32,
            DRIVER_FEATURE_SELECT => state.driver_feature_select = value as u32,
            DRIVER_FEATURE if !features_locked => {
                let shift = match state.driver_feature_select {
                    0 => 0,
                    1 => 32,
                    _ => return TransportAction::None,
                };
                state.driver_features =
                    (state.driver_features & !(0xffff_ffffu64 << shift)) | (value << shift);
            }
            CONFIG_MSIX_VECTOR => {
                let mut irq = self.irq.lock();
                irq.config_vector = valid_vector(&irq.msix, value as u16);
            }
            DEVICE_STATUS => return self.set_status(state, value as u8),
            QUEUE_SELECT => state.queue_select = value as u16,
            QUEUE_MSIX_VECTOR if q < state.queues.len() => {
                let mut irq = self.irq.lock();
                irq.queue_vectors[q] = valid_vector(&irq.msix, value as u16);
            }
            QUEUE_SIZE if queue_writable => {
                let queue = &mut state.queues[q];
                // Anything but a power of two up to the maximum keeps the old size.
                let size = value as u16;
                if size.is_power_of_two() && size <= queue.max_size {
                    queue.size = size;
                }
            }
            QUEUE_ENABLE if queue_writable && value == 1 => state.queues[q].enabled = true,
            QUEUE_DESC if queue_writable => state.queues[q].desc = value,
            QUEUE_DRIVER if queue_writable => state.queues[q].driver = value,
            QUEUE_DEVICE if queue_writable => state.queues[q].device = value,
            // Read-only registers, and writes the state does not allow.
            _ => {}
        }
        TransportAction::None
    }

    fn set_status(&self, state: &mut State, value: u8) -> TransportAction {
        if value == 0 {
            self.reset(state);
            return TransportAction::Reset;
        }
        let old = state.status;
        // The driver cannot clear bits (only a reset does), nor set the device's own.
        let mut new = old | (value & !status::DEVICE_NEEDS_RESET);
        if new & status::FEATURES_OK != 0 && old & status::FEATURES_OK == 0 {
            let wanted = state.driver_features;
            let acceptable = wanted & !self.device.features() == 0
                && wanted & features::VERSION_1 != 0
                && self.device.accepts_features(wanted);
            if !acceptable {
                tracing::debug!(wanted, "virtio: features refused");
                new &= !status::FEATURES_OK;
            }
        }
        let mut action = TransportAction::None;
        if new & status::DRIVER_OK != 0 && old & status::DRIVER_OK == 0 {
            if new & status::FEATURES_OK == 0 {
                new &= !status::DRIVER_OK;
            } else {
                let event_idx = state.driver_features & features::RING_EVENT_IDX != 0;
                let activation = Activation {
                    features: state.driver_features,
                    queues: state.queues.iter().map(|q| q.build(event_idx)).collect(),
                    interrupt: self.irq.clone(),
                };
                match self.device.activate(activation) {
                    Ok(()) => action = TransportAction::Activated,
                    Err(error) => {
                        tracing::warn!(%error, "virtio: activation refused");
                        new |= status::DEVICE_NEEDS_RESET;
                    }
                }
            }
        }
        state.status = new;
        if new & status::DEVICE_NEEDS_RESET != 0 && old & status::DEVICE_NEEDS_RESET == 0 {
            state.config_generation = state.config_generation.wrapping_add(1);
            self.irq.trigger(InterruptCause::Config);
        }
        action
    }

    /// Device reset (status 0): queues, features and vectors back to their initial
    /// values; the MSI-X table belongs to PCI and stays.
    fn reset(&self, state: &mut State) {
        self.device.reset();
        state.device_feature_select = 0;
        state.driver_feature_select = 0;
        state.driver_features = 0;
        state.status = 0;
        state.queue_select = 0;
        for queue in &mut state.queues {
            *queue = QueueConfig::new(queue.max_size);
        }
        let mut irq = self.irq.lock();
        irq.isr = 0;
        irq.config_vector = NO_VECTOR;
        irq.queue_vectors.fill(NO_VECTOR);
    }

    /// The `PCI_CFG` window's (bar, offset, length), if it names a valid access.
    fn pci_cfg_target(state: &State) -> Option<(u8, u64, usize)> {
        let at = state.pci_cfg_cap;
        let bar = state.config.byte(at + 4);
        let offset = u64::from(state.config.dword(at + 8));
        let length = state.config.dword(at + 12) as usize;
        matches!(length, 1 | 2 | 4).then_some((bar, offset, length))
    }

    fn pci_cfg_data_range(state: &State) -> std::ops::Range<usize> {
        state.pci_cfg_cap + 16..state.pci_cfg_cap + 20
    }

    /// A configuration write that may go through the `PCI_CFG` window to the BAR.
    pub fn write_config(&self, offset: usize, data: &[u8]) -> TransportAction {
        let mut state = self.state();
        let control_at = state.msix_cap + 2;
        state.config.write(offset, data);
        let end = offset.saturating_add(data.len());
        if offset < control_at + 2 && control_at < end {
            let control = state.config.word(control_at);
            let mut irq = self.irq.lock();
            let update = irq.msix.set_control(control);
            self.irq.apply(update);
        }
        let window = Self::pci_cfg_data_range(&state);
        if offset < window.end
            && window.start < end
            && let Some((0, bar_offset, length)) = Self::pci_cfg_target(&state)
        {
            let mut bytes = [0u8; 4];
            state.config.read(window.start, &mut bytes);
            return self.bar_write_locked(&mut state, bar_offset, &bytes[..length]);
        }
        TransportAction::None
    }

    /// A configuration read; reading the `PCI_CFG` data reads the BAR behind it.
    pub fn read_config(&self, offset: usize, data: &mut [u8]) {
        let mut state = self.state();
        let window = Self::pci_cfg_data_range(&state);
        let end = offset.saturating_add(data.len());
        if offset < window.end && window.start < end {
            let mut bytes = [0u8; 4];
            if let Some((0, bar_offset, length)) = Self::pci_cfg_target(&state) {
                self.bar_read_locked(&state, bar_offset, &mut bytes[..length]);
            }
            state.config.put(window.start, &bytes);
        }
        state.config.read(offset, data);
    }
}

/// The device runs: the driver set DRIVER_OK and the activation took.
fn is_live(status: u8) -> bool {
    status & status::DRIVER_OK != 0 && status & status::DEVICE_NEEDS_RESET == 0
}

/// `vector` if the function has it, else [`NO_VECTOR`] (what the driver reads back
/// to learn the mapping failed).
fn valid_vector(msix: &Msix, vector: u16) -> u16 {
    if vector < msix.vectors() {
        vector
    } else {
        NO_VECTOR
    }
}

impl PciDevice for VirtioPciDevice {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        self.read_config(offset, data);
    }

    fn config_write(&self, offset: usize, data: &[u8]) {
        let action = self.write_config(offset, data);
        if action != TransportAction::None {
            self.actions.act(action);
        }
    }

    fn memory_regions(&self) -> Vec<BarRegion> {
        self.state().config.memory_regions().collect()
    }

    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]) {
        self.read_bar(bar, offset, data);
    }

    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]) {
        let action = self.write_bar(bar, offset, data);
        if action != TransportAction::None {
            self.actions.act(action);
        }
    }

    /// The registers, and with DRIVER_OK the device's place in its queues (call with
    /// its backend quiesced: nothing may move the rings meanwhile).
    fn save_state(&self) -> Result<PciDeviceState, DeviceStateError> {
        let state = self.state();
        let irq = self.irq.lock();
        let count = state.queues.len();
        let live = if is_live(state.status) {
            let live = self
                .device
                .live_state()
                .ok_or(DeviceStateError::Unsupported {
                    device: "this virtio device (while the driver uses it)",
                })?;
            if live.positions.len() != count {
                return Err(DeviceStateError::mismatch(
                    "virtio device",
                    format!("{} queue places for {count} queues", live.positions.len()),
                ));
            }
            live
        } else {
            LiveState {
                positions: vec![(0, 0); count],
                words: Vec::new(),
            }
        };
        let queues = state
            .queues
            .iter()
            .zip(&live.positions)
            .map(|(q, &(next_avail, next_used))| QueueState {
                size: q.size,
                enabled: q.enabled,
                desc: q.desc,
                driver: q.driver,
                device: q.device,
                next_avail,
                next_used,
            })
            .collect();
        Ok(PciDeviceState {
            kind: self.kind(),
            config: state.config.state(),
            msix: Some(irq.msix.state()),
            virtio: Some(VirtioState {
                device_feature_select: state.device_feature_select,
                driver_feature_select: state.driver_feature_select,
                driver_features: state.driver_features,
                status: state.status,
                config_generation: state.config_generation,
                queue_select: state.queue_select,
                queues,
                isr: irq.isr,
                config_vector: irq.config_vector,
                queue_vectors: irq.queue_vectors.clone(),
                device: live.words,
            }),
        })
    }

    /// Into a device the driver has not touched: registers, MSI-X (every vector
    /// re-routed), and with DRIVER_OK the device activated on the saved rings at the
    /// saved places. Everything is checked first; a state that does not fit changes
    /// nothing.
    fn restore_state(&self, saved: &PciDeviceState) -> Result<(), DeviceStateError> {
        let bad = |why: String| DeviceStateError::mismatch("virtio device", why);
        let (Some(msix_state), Some(v)) = (&saved.msix, &saved.virtio) else {
            return Err(bad(format!("the state is a '{}'s", saved.kind)));
        };
        if saved.kind != self.kind() {
            return Err(bad(format!(
                "the state is a '{}'s, this is a '{}'",
                saved.kind,
                self.kind()
            )));
        }
        let mut state = self.state();
        if state.status != 0 {
            return Err(bad("the driver already uses this device".into()));
        }
        let mut config = state.config.clone();
        config.restore_state(&saved.config)?;
        let mut irq = self.irq.lock();
        let mut msix = irq.msix.clone();
        msix.restore_state(msix_state)?;
        let count = state.queues.len();
        if v.queues.len() != count || v.queue_vectors.len() != count {
            return Err(bad(format!(
                "{} queues and {} queue vectors saved, the device has {count}",
                v.queues.len(),
                v.queue_vectors.len()
            )));
        }
        let vector_ok = |vector: u16| vector == NO_VECTOR || vector < msix.vectors();
        if !vector_ok(v.config_vector) || !v.queue_vectors.iter().all(|&q| vector_ok(q)) {
            return Err(bad("a vector the function does not have".into()));
        }
        if v.driver_features & !self.device.features() != 0 {
            return Err(bad(format!(
                "driver features {:#x} beyond the offered {:#x}",
                v.driver_features,
                self.device.features()
            )));
        }
        let mut queues = Vec::with_capacity(count);
        for (i, (now, q)) in state.queues.iter().zip(&v.queues).enumerate() {
            if !q.size.is_power_of_two() || q.size > now.max_size {
                return Err(bad(format!("queue {i}: size {}", q.size)));
            }
            queues.push(QueueConfig {
                max_size: now.max_size,
                size: q.size,
                enabled: q.enabled,
                desc: q.desc,
                driver: q.driver,
                device: q.device,
            });
        }
        if is_live(v.status) {
            let event_idx = v.driver_features & features::RING_EVENT_IDX != 0;
            let built = queues
                .iter()
                .zip(&v.queues)
                .map(|(config, q)| {
                    let mut queue = config.build(event_idx);
                    queue.set_next_avail(q.next_avail);
                    queue.set_next_used(q.next_used);
                    queue
                })
                .collect();
            self.device
                .activate(Activation {
                    features: v.driver_features,
                    queues: built,
                    interrupt: self.irq.clone(),
                })
                .map_err(|e| bad(format!("activating on the saved rings: {e}")))?;
            if let Err(why) = self.device.restore_live_state(&v.device) {
                self.device.reset();
                return Err(bad(why));
            }
        }
        state.config = config;
        state.device_feature_select = v.device_feature_select;
        state.driver_feature_select = v.driver_feature_select;
        state.driver_features = v.driver_features;
        state.status = v.status;
        state.config_generation = v.config_generation;
        state.queue_select = v.queue_select;
        state.queues = queues;
        irq.msix = msix;
        irq.isr = v.isr;
        irq.config_vector = v.config_vector;
        irq.queue_vectors.clone_from(&v.queue_vectors);
        for vector in 0..irq.msix.vectors() {
            self.irq.sink.update(vector, irq.msix.route(vector));
        }
        drop(irq);
        drop(state);
        // The VMM starts serving a restored live device as one the driver activated.
        if is_live(v.status) {
            self.actions.act(TransportAction::Activated);
        }
        Ok(())
    }

    /// The queues' notify doorbells (doorbell id = queue index), served by the VMM
    /// wherever BAR 0 decodes.
    fn doorbells(&self) -> Vec<crate::pci::Doorbell> {
        self.notify_doorbells()
            .into_iter()
            .map(|d| crate::pci::Doorbell {
                bar: d.bar,
                offset: d.offset,
                id: u32::from(d.queue),
            })
            .collect()
    }
}

/// Configuration-space offset of BAR 0 (for VMM code that reads it raw).
pub const BAR0_REGISTER: usize = config::BAR0;
