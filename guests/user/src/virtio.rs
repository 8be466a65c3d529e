//! virtio 1.x over PCI ("modern" transport) from ring 3: the vendor capabilities
//! (common, notify, device configuration), feature negotiation, and split virtqueues in
//! guest memory. The guest is identity-mapped, so a buffer's address is also the
//! physical address the device is given.
//!
//! Only what a polled or interrupt-driven driver of kumo's guest needs: no indirect
//! descriptors; notifications and interrupts are suppressed with the event index when
//! the device offers it, else with the ring flags.

use core::sync::atomic::{Ordering, fence};

use kumo_abi::BootInfo;

use crate::pci::{
    CAP_VENDOR, Function, Msix, read8, read16, read32, write8, write16, write32, write64,
};

pub const VENDOR_ID: u16 = 0x1AF4;

/// Feature bits of the device-independent part.
pub const F_VERSION_1: u64 = 1 << 32;
/// `used_event` / `avail_event` suppress interrupts and notifications (taken when
/// offered: a device without it that ignores `VIRTQ_AVAIL_F_NO_INTERRUPT`, as the
/// rust-vmm virtio-queue crate does, would otherwise interrupt on every batch).
pub const F_EVENT_IDX: u64 = 1 << 29;

/// Device status bits.
const ACKNOWLEDGE: u8 = 1;
const DRIVER: u8 = 2;
const DRIVER_OK: u8 = 4;
const FEATURES_OK: u8 = 8;
const FAILED: u8 = 0x80;

/// Common configuration registers (virtio 1.x, 4.1.4.3).
mod common {
    pub const DEVICE_FEATURE_SELECT: u64 = 0x00;
    pub const DEVICE_FEATURE: u64 = 0x04;
    pub const DRIVER_FEATURE_SELECT: u64 = 0x08;
    pub const DRIVER_FEATURE: u64 = 0x0C;
    pub const MSIX_CONFIG: u64 = 0x10;
    pub const NUM_QUEUES: u64 = 0x12;
    pub const DEVICE_STATUS: u64 = 0x14;
    pub const QUEUE_SELECT: u64 = 0x16;
    pub const QUEUE_SIZE: u64 = 0x18;
    pub const QUEUE_MSIX_VECTOR: u64 = 0x1A;
    pub const QUEUE_ENABLE: u64 = 0x1C;
    pub const QUEUE_NOTIFY_OFF: u64 = 0x1E;
    pub const QUEUE_DESC: u64 = 0x20;
    pub const QUEUE_DRIVER: u64 = 0x28;
    pub const QUEUE_DEVICE: u64 = 0x30;
}

/// Why a device could not be brought up.
#[derive(Clone, Copy, Debug)]
pub enum Error {
    NoCapabilities,
    NoMsix,
    ResetTimeout,
    FeaturesRejected,
    MissingFeature,
    BadQueue,
    VectorRejected,
    OutOfMemory,
}

impl Error {
    pub fn name(self) -> &'static str {
        match self {
            Error::NoCapabilities => "no-virtio-capabilities",
            Error::NoMsix => "no-msix",
            Error::ResetTimeout => "reset-timeout",
            Error::FeaturesRejected => "features-rejected",
            Error::MissingFeature => "missing-feature",
            Error::BadQueue => "bad-queue",
            Error::VectorRejected => "msix-vector-rejected",
            Error::OutOfMemory => "out-of-memory",
        }
    }
}

/// Where drivers place BARs that firmware left unassigned (qboot does not assign
/// them): kumo's BAR window, free on QEMU's q35 too (its ECAM is at 0xB0000000).
const BAR_WINDOW_START: u64 = 0xC000_0000;
const BAR_WINDOW_END: u64 = 0xE000_0000;

/// Why a virtio device is not there.
#[derive(Clone, Copy, Debug)]
pub enum OpenError {
    NoPci,
    /// No device of the kind; the name to report (`no-virtio-net`, ...).
    NoDevice(&'static str),
    NoCpu,
    NoBarSpace,
    Virtio(Error),
}

impl OpenError {
    pub fn name(self) -> &'static str {
        match self {
            OpenError::NoPci => "no-pci",
            OpenError::NoDevice(name) => name,
            OpenError::NoCpu => "no-apic-id",
            OpenError::NoBarSpace => "no-bar-space",
            OpenError::Virtio(e) => e.name(),
        }
    }
}

impl From<Error> for OpenError {
    fn from(e: Error) -> OpenError {
        OpenError::Virtio(e)
    }
}

/// Places the BARs firmware left unassigned of every virtio device on bus 0, one after
/// another in kumo's BAR window (BARs already assigned stay). Writes configuration
/// space: call it on one CPU, before devices are opened on others.
pub fn place_bars(info: &BootInfo) -> Result<(), OpenError> {
    if info.pci_ecam == 0 {
        return Err(OpenError::NoPci);
    }
    let mut next = BAR_WINDOW_START;
    for function in Function::find_vendor(info.pci_ecam, VENDOR_ID) {
        if !function.assign_bars(&mut next, BAR_WINDOW_END) {
            return Err(OpenError::NoBarSpace);
        }
    }
    Ok(())
}

/// Places BARs ([`place_bars`]) and opens the first virtio device `device_id` on bus 0;
/// `missing` names its absence.
pub fn open_first(
    info: &BootInfo,
    device_id: u16,
    missing: &'static str,
) -> Result<Device, OpenError> {
    place_bars(info)?;
    open_nth(info, device_id, 0, missing)
}

/// Opens the `index`-th virtio device `device_id` on bus 0 (in slot order), whose BARs
/// [`place_bars`] placed; `missing` names its absence. Only reads and writes that
/// device's own registers, so CPUs may open different devices at once.
pub fn open_nth(
    info: &BootInfo,
    device_id: u16,
    index: usize,
    missing: &'static str,
) -> Result<Device, OpenError> {
    if info.pci_ecam == 0 {
        return Err(OpenError::NoPci);
    }
    let function = Function::find_all(info.pci_ecam, VENDOR_ID, device_id)
        .nth(index)
        .ok_or(OpenError::NoDevice(missing))?;
    Ok(Device::open(&function)?)
}

/// Memory for rings and buffers, carved from the heap in order (never freed: a device
/// keeps its rings for the life of the VM).
pub struct Bump {
    next: u64,
    end: u64,
}

impl Bump {
    pub fn new(start: u64, end: u64) -> Bump {
        Bump { next: start, end }
    }

    /// `size` zeroed bytes aligned to `align` (a power of two).
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, Error> {
        let at = (self.next + align - 1) & !(align - 1);
        if at + size > self.end {
            return Err(Error::OutOfMemory);
        }
        // SAFETY: [at, at + size) is heap memory handed to this allocator alone.
        unsafe { core::ptr::write_bytes(at as *mut u8, 0, size as usize) };
        self.next = at + size;
        Ok(at)
    }
}

/// A virtio PCI device, found and reset, its features not yet negotiated.
pub struct Device {
    common: u64,
    notify_base: u64,
    notify_multiplier: u32,
    /// The device-specific configuration (virtio-net: MAC, status, ...).
    pub device_cfg: u64,
    pub msix: Msix,
}

impl Device {
    /// Parses the vendor capabilities of `function`, enables it and MSI-X, resets the
    /// device and says ACKNOWLEDGE | DRIVER.
    pub fn open(function: &Function) -> Result<Device, Error> {
        function.enable();
        let (mut common, mut notify, mut device_cfg) = (None, None, None);
        for cap in function.capabilities(CAP_VENDOR) {
            let header = read32(cap);
            let kind = (header >> 24) as u8;
            let bar = (read32(cap + 4) & 0xFF) as u8;
            let offset = u64::from(read32(cap + 8));
            let Some(base) = function.bar(bar) else {
                continue;
            };
            match kind {
                1 if common.is_none() => common = Some(base + offset),
                2 if notify.is_none() => notify = Some((base + offset, read32(cap + 16))),
                4 if device_cfg.is_none() => device_cfg = Some(base + offset),
                _ => {}
            }
        }
        let (Some(common), Some((notify_base, notify_multiplier)), Some(device_cfg)) =
            (common, notify, device_cfg)
        else {
            return Err(Error::NoCapabilities);
        };
        let msix = function.msix().ok_or(Error::NoMsix)?;
        let device = Device {
            common,
            notify_base,
            notify_multiplier,
            device_cfg,
            msix,
        };
        write8(common + common::DEVICE_STATUS, 0);
        // Reset completes when the status reads 0 again (bounded).
        let mut polls = 0;
        while read8(common + common::DEVICE_STATUS) != 0 {
            polls += 1;
            if polls > 1_000_000 {
                return Err(Error::ResetTimeout);
            }
            core::hint::spin_loop();
        }
        device.set_status(ACKNOWLEDGE);
        device.set_status(ACKNOWLEDGE | DRIVER);
        Ok(device)
    }

    fn set_status(&self, status: u8) {
        write8(self.common + common::DEVICE_STATUS, status);
    }

    fn status(&self) -> u8 {
        read8(self.common + common::DEVICE_STATUS)
    }

    pub fn device_features(&self) -> u64 {
        let mut features = 0;
        for half in 0..2u32 {
            write32(self.common + common::DEVICE_FEATURE_SELECT, half);
            features |= u64::from(read32(self.common + common::DEVICE_FEATURE)) << (32 * half);
        }
        features
    }

    /// Accepts `required | (optional & offered)`; fails (status FAILED) if a required
    /// feature is not offered or the device refuses the set. Returns the accepted set.
    pub fn negotiate(&self, required: u64, optional: u64) -> Result<u64, Error> {
        let offered = self.device_features();
        if offered & required != required {
            self.set_status(FAILED);
            return Err(Error::MissingFeature);
        }
        let accepted = required | (optional & offered);
        for half in 0..2u32 {
            write32(self.common + common::DRIVER_FEATURE_SELECT, half);
            write32(
                self.common + common::DRIVER_FEATURE,
                (accepted >> (32 * half)) as u32,
            );
        }
        self.set_status(ACKNOWLEDGE | DRIVER | FEATURES_OK);
        if self.status() & FEATURES_OK == 0 {
            self.set_status(FAILED);
            return Err(Error::FeaturesRejected);
        }
        Ok(accepted)
    }

    pub fn num_queues(&self) -> u16 {
        read16(self.common + common::NUM_QUEUES)
    }

    /// The configuration-change interrupt's MSI-X entry (or [`NO_VECTOR`]).
    pub fn set_config_vector(&self, entry: u16) -> Result<(), Error> {
        write16(self.common + common::MSIX_CONFIG, entry);
        if read16(self.common + common::MSIX_CONFIG) != entry {
            return Err(Error::VectorRejected);
        }
        Ok(())
    }

    /// Sets up queue `index` with at most `max_size` entries (the device's size if
    /// smaller), interrupts through MSI-X entry `entry`, rings from `memory`;
    /// `event_idx` if F_EVENT_IDX was negotiated.
    pub fn queue(
        &self,
        index: u16,
        max_size: u16,
        entry: u16,
        event_idx: bool,
        memory: &mut Bump,
    ) -> Result<Queue, Error> {
        write16(self.common + common::QUEUE_SELECT, index);
        let device_size = read16(self.common + common::QUEUE_SIZE);
        if device_size == 0 {
            return Err(Error::BadQueue);
        }
        // Split rings: a power of two, which the driver may lower.
        let mut size = device_size.min(max_size);
        while !size.is_power_of_two() {
            size &= size - 1;
        }
        if size != device_size {
            write16(self.common + common::QUEUE_SIZE, size);
        }
        let n = u64::from(size);
        let desc = memory.alloc(16 * n, 4096)?;
        let avail = memory.alloc(6 + 2 * n, 4096)?;
        let used = memory.alloc(6 + 8 * n, 4096)?;
        write16(self.common + common::QUEUE_MSIX_VECTOR, entry);
        if read16(self.common + common::QUEUE_MSIX_VECTOR) != entry {
            return Err(Error::VectorRejected);
        }
        write64(self.common + common::QUEUE_DESC, desc);
        write64(self.common + common::QUEUE_DRIVER, avail);
        write64(self.common + common::QUEUE_DEVICE, used);
        let notify_off = u64::from(read16(self.common + common::QUEUE_NOTIFY_OFF));
        write16(self.common + common::QUEUE_ENABLE, 1);
        Ok(Queue {
            index,
            size,
            desc,
            avail,
            used,
            notify: self.notify_base + notify_off * u64::from(self.notify_multiplier),
            next_avail: 0,
            published: 0,
            last_used: 0,
            event_idx,
            kicks: 0,
        })
    }

    /// DRIVER_OK: the device may use the queues from now on.
    pub fn start(&self) {
        self.set_status(ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
    }
}

/// Descriptor flags.
pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
/// `avail.flags`: the driver does not want interrupts.
const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// `used.flags`: the device does not want notifications.
const USED_F_NO_NOTIFY: u16 = 1;

/// One split virtqueue. Every ring access is volatile (the device reads and writes
/// them concurrently) and ordered with fences.
pub struct Queue {
    index: u16,
    pub size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    notify: u64,
    /// Our copy of `avail.idx`, and its value at the last `publish`.
    next_avail: u16,
    published: u16,
    /// Used entries consumed so far.
    last_used: u16,
    /// F_EVENT_IDX: `used_event` follows the avail ring, `avail_event` the used ring.
    event_idx: bool,
    /// Notifications sent (each one an exit).
    pub kicks: u64,
}

impl Queue {
    /// Writes descriptor `id`: one buffer, device-writable or not.
    pub fn set_desc(&mut self, id: u16, addr: u64, len: u32, device_writes: bool) {
        let at = self.desc + 16 * u64::from(id);
        let flags = if device_writes { DESC_F_WRITE } else { 0 };
        // SAFETY: `id < size`, inside the descriptor table this queue owns.
        unsafe {
            core::ptr::write_volatile(at as *mut u64, addr);
            core::ptr::write_volatile((at + 8) as *mut u32, len);
            core::ptr::write_volatile((at + 12) as *mut u16, flags);
            core::ptr::write_volatile((at + 14) as *mut u16, 0);
        }
    }

    /// Links descriptor `id` (already written with `set_desc`) to descriptor `next`.
    pub fn chain(&mut self, id: u16, next: u16) {
        let at = self.desc + 16 * u64::from(id);
        // SAFETY: `id < size`, inside the descriptor table this queue owns.
        unsafe {
            let flags = core::ptr::read_volatile((at + 12) as *const u16);
            core::ptr::write_volatile((at + 12) as *mut u16, flags | DESC_F_NEXT);
            core::ptr::write_volatile((at + 14) as *mut u16, next);
        }
    }

    /// Offers descriptor `id` to the device (visible once `publish` runs).
    pub fn push(&mut self, id: u16) {
        let slot = u64::from(self.next_avail % self.size);
        // SAFETY: inside the avail ring this queue owns.
        unsafe { core::ptr::write_volatile((self.avail + 4 + 2 * slot) as *mut u16, id) };
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Makes pushed descriptors visible (avail.idx) and notifies the device unless it
    /// said it does not need it. Returns whether it notified.
    pub fn publish(&mut self) -> bool {
        // Descriptors and ring entries before the index (x86 keeps stores in order;
        // the fence keeps the compiler from reordering).
        fence(Ordering::Release);
        // SAFETY: avail.idx of this queue's ring.
        unsafe { core::ptr::write_volatile((self.avail + 2) as *mut u16, self.next_avail) };
        // The index store before the flags / event load (store-load: a full fence).
        fence(Ordering::SeqCst);
        let (old, new) = (self.published, self.next_avail);
        self.published = new;
        let wanted = if self.event_idx {
            // SAFETY: avail_event, right after the used ring's entries.
            let event = unsafe {
                core::ptr::read_volatile((self.used + 4 + 8 * u64::from(self.size)) as *const u16)
            };
            need_event(event, new, old)
        } else {
            // SAFETY: used.flags of this queue's ring.
            let flags = unsafe { core::ptr::read_volatile(self.used as *const u16) };
            flags & USED_F_NO_NOTIFY == 0
        };
        if !wanted {
            return false;
        }
        write16(self.notify, self.index);
        self.kicks += 1;
        true
    }

    /// The guest address of the avail ring (its page is this queue's alone): for the
    /// hostile disk probes, which point a request's buffers at it.
    pub fn avail_addr(&self) -> u64 {
        self.avail
    }

    /// Writes `avail.idx` as given, whatever was pushed: for the hostile disk probes.
    pub fn set_avail_idx(&mut self, idx: u16) {
        fence(Ordering::Release);
        // SAFETY: avail.idx of this queue's ring.
        unsafe { core::ptr::write_volatile((self.avail + 2) as *mut u16, idx) };
    }

    /// Notifies the device whatever it asked for (extra notifications are allowed):
    /// for a ring that has stopped moving.
    pub fn kick(&mut self) {
        write16(self.notify, self.index);
        self.kicks += 1;
    }

    /// The next used entry `(descriptor id, bytes written)`, if any.
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        // SAFETY: used.idx of this queue's ring.
        let idx = unsafe { core::ptr::read_volatile((self.used + 2) as *const u16) };
        if idx == self.last_used {
            return None;
        }
        // The entry after the index that announced it.
        fence(Ordering::Acquire);
        let slot = u64::from(self.last_used % self.size);
        let at = self.used + 4 + 8 * slot;
        // SAFETY: inside the used ring this queue owns.
        let (id, len) = unsafe {
            (
                core::ptr::read_volatile(at as *const u32),
                core::ptr::read_volatile((at + 4) as *const u32),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        Some((id as u16, len))
    }

    /// Whether the device has used entries we have not popped.
    pub fn has_used(&self) -> bool {
        // SAFETY: used.idx of this queue's ring.
        unsafe { core::ptr::read_volatile((self.used + 2) as *const u16) != self.last_used }
    }

    /// Asks for interrupts (or not) on used entries. On: at the next entry after the
    /// ones consumed (entries already there raise nothing: look before sleeping).
    pub fn set_interrupts(&mut self, on: bool) {
        let flags = if on { 0 } else { AVAIL_F_NO_INTERRUPT };
        // SAFETY: avail.flags of this queue's ring.
        unsafe { core::ptr::write_volatile(self.avail as *mut u16, flags) };
        if self.event_idx {
            // Off: an event index just behind what the device has used is not passed
            // again for 2^16 entries.
            let event = if on {
                self.last_used
            } else {
                self.last_used.wrapping_sub(1)
            };
            // SAFETY: used_event, right after the avail ring's entries.
            unsafe {
                core::ptr::write_volatile(
                    (self.avail + 4 + 2 * u64::from(self.size)) as *mut u16,
                    event,
                )
            };
        }
        // The flag before any later check of the used ring.
        fence(Ordering::SeqCst);
    }
}

/// Whether moving an index from `old` to `new` passed `event` (virtio's
/// `vring_need_event`: `event` in `[old, new)`, modulo 2^16).
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}
