//! MSI-X: a device's vector table and pending-bit array (both in a memory BAR), and
//! the capability that enables and masks them.
//!
//! The table is the guest's: each 16-byte entry holds the message (address naming the
//! destination APIC, data naming the vector) and a mask bit. The device asks
//! [`Msix::fire`] whether a vector may be sent now; a masked one is held in the PBA
//! and sent when it is unmasked. Every change the guest makes that moves or (un)masks
//! a vector is reported as an [`Update`], so a VMM that routes vectors in the kernel
//! (irqfd) can re-route them.

/// MSI-X capability ID.
pub const CAPABILITY_ID: u8 = 0x11;
/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
/// Most vectors a function may have.
pub const MAX_VECTORS: u16 = 2048;
/// Message control: MSI-X enable.
pub const CONTROL_ENABLE: u16 = 1 << 15;
/// Message control: every vector masked.
pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector control: this vector masked.
const ENTRY_MASKED: u32 = 1;

use crate::interrupt::{InterruptSourceGroup, MsiMessage};
use crate::state::DeviceStateError;
pub use crate::state::MsixState;

/// What changed for the VMM after a guest write.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Update {
    /// Vectors whose route changed: the message they now deliver, or `None` when they
    /// may not be delivered (masked, function masked, MSI-X disabled).
    pub rerouted: Vec<(u16, Option<MsiMessage>)>,
    /// Pending vectors the change released: send these now.
    pub deliver: Vec<(u16, MsiMessage)>,
}

impl Update {
    pub fn is_empty(&self) -> bool {
        self.rerouted.is_empty() && self.deliver.is_empty()
    }

    /// Tells `group` the new routes, then triggers the released vectors. Call it with
    /// the device's MSI-X state locked, so a concurrent fire sees the new routes.
    pub fn apply_to(self, group: &dyn InterruptSourceGroup) {
        for (vector, route) in self.rerouted {
            group.update(vector, route);
        }
        for (vector, _message) in self.deliver {
            group.trigger(vector);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    address_low: u32,
    address_high: u32,
    data: u32,
    control: u32,
}

impl Entry {
    fn word(&self, index: usize) -> u32 {
        [self.address_low, self.address_high, self.data, self.control][index]
    }

    fn set_word(&mut self, index: usize, value: u32) {
        match index {
            0 => self.address_low = value,
            1 => self.address_high = value,
            2 => self.data = value,
            // Only the mask bit of vector control is defined; the rest reads zero.
            _ => self.control = value & ENTRY_MASKED,
        }
    }

    fn message(&self) -> MsiMessage {
        MsiMessage {
            address: u64::from(self.address_low) | (u64::from(self.address_high) << 32),
            data: self.data,
        }
    }
}

/// A function's MSI-X state.
#[derive(Debug, Clone)]
pub struct Msix {
    entries: Vec<Entry>,
    pending: Vec<u64>,
    enabled: bool,
    function_masked: bool,
}

impl Msix {
    /// `vectors` entries (1..=2048; clamped), each masked, as after reset.
    pub fn new(vectors: u16) -> Msix {
        let vectors = usize::from(vectors.clamp(1, MAX_VECTORS));
        Msix {
            entries: vec![
                Entry {
                    address_low: 0,
                    address_high: 0,
                    data: 0,
                    control: ENTRY_MASKED,
                };
                vectors
            ],
            pending: vec![0; vectors.div_ceil(64)],
            enabled: false,
            function_masked: false,
        }
    }

    pub fn vectors(&self) -> u16 {
        self.entries.len() as u16
    }

    /// Table, PBA and control now.
    pub fn state(&self) -> MsixState {
        MsixState {
            entries: self
                .entries
                .iter()
                .map(|e| [e.address_low, e.address_high, e.data, e.control])
                .collect(),
            pending: self.pending.clone(),
            enabled: self.enabled,
            function_masked: self.function_masked,
        }
    }

    /// Puts a saved table back; the vector count must be this function's. The caller
    /// re-routes every vector afterwards ([`Msix::route`]): nothing is delivered here.
    pub fn restore_state(&mut self, state: &MsixState) -> Result<(), DeviceStateError> {
        if state.entries.len() != self.entries.len() || state.pending.len() != self.pending.len() {
            return Err(DeviceStateError::mismatch(
                "MSI-X",
                format!(
                    "{} vectors and {} PBA words saved, the function has {} and {}",
                    state.entries.len(),
                    state.pending.len(),
                    self.entries.len(),
                    self.pending.len()
                ),
            ));
        }
        let unused_pending = self.entries.len() % 64;
        if unused_pending != 0
            && state
                .pending
                .last()
                .is_some_and(|w| w >> unused_pending != 0)
        {
            return Err(DeviceStateError::mismatch(
                "MSI-X",
                "pending bits set for vectors the function does not have",
            ));
        }
        for (entry, words) in self.entries.iter_mut().zip(&state.entries) {
            for (i, w) in words.iter().enumerate() {
                entry.set_word(i, *w);
            }
        }
        self.pending.clone_from(&state.pending);
        self.enabled = state.enabled;
        self.function_masked = state.function_masked;
        Ok(())
    }

    /// Table bytes (what the BAR must hold at the table offset).
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_SIZE
    }

    /// PBA bytes (whole quadwords).
    pub fn pba_size(&self) -> u64 {
        self.pending.len() as u64 * 8
    }

    /// The capability's body (after ID and next pointer) and its writable bits, for
    /// [`super::ConfigSpace::add_capability`]: table and PBA in BARs `table_bar` /
    /// `pba_bar` at 8-byte aligned offsets.
    pub fn capability(
        &self,
        table_bar: u8,
        table_offset: u32,
        pba_bar: u8,
        pba_offset: u32,
    ) -> ([u8; 10], [u8; 2]) {
        let control = (self.entries.len() - 1) as u16;
        let table = (table_offset & !7) | u32::from(table_bar & 7);
        let pba = (pba_offset & !7) | u32::from(pba_bar & 7);
        let mut body = [0; 10];
        body[..2].copy_from_slice(&control.to_le_bytes());
        body[2..6].copy_from_slice(&table.to_le_bytes());
        body[6..].copy_from_slice(&pba.to_le_bytes());
        // Enable and function mask are the only writable bits.
        (body, [0, 0xc0])
    }

    /// The route of `vector` now: its message if it may be delivered.
    pub fn route(&self, vector: u16) -> Option<MsiMessage> {
        let entry = self.entries.get(usize::from(vector))?;
        (self.enabled && !self.function_masked && entry.control & ENTRY_MASKED == 0)
            .then(|| entry.message())
    }

    pub fn is_pending(&self, vector: u16) -> bool {
        let v = usize::from(vector);
        self.pending
            .get(v / 64)
            .is_some_and(|w| w & (1 << (v % 64)) != 0)
    }

    fn set_pending(&mut self, vector: u16, on: bool) {
        let v = usize::from(vector);
        if let Some(word) = self.pending.get_mut(v / 64) {
            if on {
                *word |= 1 << (v % 64);
            } else {
                *word &= !(1 << (v % 64));
            }
        }
    }

    /// The device wants to send `vector`: the message to send now, or `None` (held
    /// pending while masked; dropped while MSI-X is disabled or for a vector the
    /// function does not have).
    pub fn fire(&mut self, vector: u16) -> Option<MsiMessage> {
        if usize::from(vector) >= self.entries.len() || !self.enabled {
            return None;
        }
        let route = self.route(vector);
        if route.is_none() {
            self.set_pending(vector, true);
        }
        route
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn function_masked(&self) -> bool {
        self.function_masked
    }

    /// The guest wrote the capability's message control word.
    pub fn set_control(&mut self, control: u16) -> Update {
        let enabled = control & CONTROL_ENABLE != 0;
        let masked = control & CONTROL_FUNCTION_MASK != 0;
        if (enabled, masked) == (self.enabled, self.function_masked) {
            return Update::default();
        }
        let before: Vec<_> = (0..self.vectors()).map(|v| self.route(v)).collect();
        self.enabled = enabled;
        self.function_masked = masked;
        let mut update = Update::default();
        for (v, old) in before.into_iter().enumerate() {
            self.after_change(v as u16, old, &mut update);
        }
        update
    }

    /// Reports `vector`'s new route if it changed, and releases it if pending.
    fn after_change(&mut self, vector: u16, old: Option<MsiMessage>, update: &mut Update) {
        let new = self.route(vector);
        if new != old {
            update.rerouted.push((vector, new));
        }
        if let Some(message) = new
            && self.is_pending(vector)
        {
            self.set_pending(vector, false);
            update.deliver.push((vector, message));
        }
    }

    /// A guest read of the table at `offset` (from the table's start). Only aligned
    /// 4- and 8-byte accesses are defined; others read all ones.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        let Some((entry, word)) = self.locate(offset, data.len()) else {
            return;
        };
        let entry = &self.entries[entry];
        let low = entry.word(word).to_le_bytes();
        data[..4].copy_from_slice(&low);
        if data.len() == 8 {
            data[4..].copy_from_slice(&entry.word(word + 1).to_le_bytes());
        }
    }

    /// A guest write to the table; undefined sizes and alignments are ignored.
    pub fn table_write(&mut self, offset: u64, data: &[u8]) -> Update {
        let mut update = Update::default();
        let Some((index, word)) = self.locate(offset, data.len()) else {
            return update;
        };
        let old = self.route(index as u16);
        let value =
            |at: usize| u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
        self.entries[index].set_word(word, value(0));
        if data.len() == 8 {
            self.entries[index].set_word(word + 1, value(4));
        }
        self.after_change(index as u16, old, &mut update);
        update
    }

    /// (entry, dword within it) of a defined table access.
    fn locate(&self, offset: u64, len: usize) -> Option<(usize, usize)> {
        let aligned = match len {
            4 => offset.is_multiple_of(4),
            8 => offset.is_multiple_of(8),
            _ => false,
        };
        let entry = usize::try_from(offset / ENTRY_SIZE).ok()?;
        (aligned && entry < self.entries.len())
            .then_some((entry, (offset % ENTRY_SIZE / 4) as usize))
    }

    /// A guest read of the PBA at `offset` (read-only; writes are ignored). Any
    /// size; bytes beyond the array read zero.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let at = offset.saturating_add(i as u64);
            *byte = usize::try_from(at / 8)
                .ok()
                .and_then(|word| self.pending.get(word))
                .map_or(0, |w| (w >> (8 * (at % 8))) as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(apic: u32, vector: u8) -> MsiMessage {
        MsiMessage {
            address: 0xfee0_0000 | (u64::from(apic & 0xff) << 12) | (u64::from(apic >> 8) << 5),
            data: u32::from(vector),
        }
    }

    /// Writes entry `v` as a guest driver does: address, data, then unmask.
    fn program(msix: &mut Msix, v: u16, m: MsiMessage, masked: bool) -> Update {
        let at = u64::from(v) * ENTRY_SIZE;
        let _ = msix.table_write(at + 12, &1u32.to_le_bytes());
        let _ = msix.table_write(at, &m.address.to_le_bytes());
        let _ = msix.table_write(at + 8, &m.data.to_le_bytes());
        msix.table_write(at + 12, &u32::from(masked).to_le_bytes())
    }

    fn enabled(vectors: u16) -> Msix {
        let mut msix = Msix::new(vectors);
        assert!(
            msix.set_control(CONTROL_ENABLE).is_empty(),
            "all entries start masked"
        );
        msix
    }

    #[test]
    fn table_reads_back_what_was_written() {
        let mut msix = enabled(4);
        let _ = program(&mut msix, 2, message(1, 0x50), false);
        let mut data = [0; 8];
        msix.table_read(2 * ENTRY_SIZE, &mut data);
        assert_eq!(u64::from_le_bytes(data), message(1, 0x50).address);
        let mut word = [0; 4];
        msix.table_read(2 * ENTRY_SIZE + 8, &mut word);
        assert_eq!(u32::from_le_bytes(word), 0x50);
        msix.table_read(2 * ENTRY_SIZE + 12, &mut word);
        assert_eq!(u32::from_le_bytes(word), 0, "unmasked");
        msix.table_read(12, &mut word);
        assert_eq!(u32::from_le_bytes(word), 1, "reset state: masked");
        // Undefined accesses: all ones, and writes ignored.
        let mut odd = [0; 2];
        msix.table_read(8, &mut odd);
        assert_eq!(odd, [0xff; 2]);
        msix.table_read(4 * ENTRY_SIZE, &mut word);
        assert_eq!(word, [0xff; 4], "beyond the table");
        assert!(msix.table_write(2 * ENTRY_SIZE + 2, &[0; 4]).is_empty());
        assert_eq!(msix.route(2), Some(message(1, 0x50)));
    }

    #[test]
    fn programming_and_retargeting_report_routes() {
        let mut msix = enabled(4);
        let update = program(&mut msix, 1, message(0, 0x40), false);
        assert_eq!(update.rerouted, [(1, Some(message(0, 0x40)))]);
        assert!(update.deliver.is_empty());
        // Rewriting the address while unmasked re-routes at once.
        let update = msix.table_write(ENTRY_SIZE, &message(2, 0x40).address.to_le_bytes());
        assert_eq!(update.rerouted, [(1, Some(message(2, 0x40)))]);
        assert_eq!(msix.fire(1), Some(message(2, 0x40)));
    }

    #[test]
    fn a_masked_vector_is_held_in_the_pba_and_sent_on_unmask() {
        let mut msix = enabled(70);
        let _ = program(&mut msix, 65, message(1, 0x45), true);
        assert_eq!(msix.fire(65), None);
        assert!(msix.is_pending(65));
        let mut pba = [0; 8];
        msix.pba_read(8, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 1 << 1);
        let update = msix.table_write(65 * ENTRY_SIZE + 12, &0u32.to_le_bytes());
        assert_eq!(update.rerouted, [(65, Some(message(1, 0x45)))]);
        assert_eq!(update.deliver, [(65, message(1, 0x45))]);
        assert!(!msix.is_pending(65));
        msix.pba_read(8, &mut pba);
        assert_eq!(pba, [0; 8]);
    }

    #[test]
    fn the_function_mask_holds_every_vector_and_releases_them_together() {
        let mut msix = enabled(3);
        for v in 0..3 {
            let _ = program(&mut msix, v, message(0, 0x40 + v as u8), false);
        }
        let update = msix.set_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        assert_eq!(update.rerouted.len(), 3);
        assert!(update.rerouted.iter().all(|(_, route)| route.is_none()));
        assert_eq!(msix.fire(0), None);
        assert_eq!(msix.fire(2), None);
        let update = msix.set_control(CONTROL_ENABLE);
        assert_eq!(
            update.deliver,
            [(0, message(0, 0x40)), (2, message(0, 0x42))]
        );
        assert!(!msix.is_pending(0) && !msix.is_pending(2));
    }

    #[test]
    fn disabled_msix_sends_nothing_and_holds_nothing() {
        let mut msix = Msix::new(2);
        let _ = program(&mut msix, 0, message(0, 0x40), false);
        assert_eq!(msix.fire(0), None);
        assert!(!msix.is_pending(0));
        let update = msix.set_control(CONTROL_ENABLE);
        assert_eq!(update.rerouted, [(0, Some(message(0, 0x40)))]);
        assert!(update.deliver.is_empty());
        assert_eq!(msix.fire(5), None, "no such vector");
    }

    #[test]
    fn the_capability_describes_table_and_pba() {
        let msix = Msix::new(16);
        let (body, writable) = msix.capability(0, 0x1000, 0, 0x1800);
        assert_eq!(u16::from_le_bytes([body[0], body[1]]), 15);
        assert_eq!(u32::from_le_bytes(body[2..6].try_into().unwrap()), 0x1000);
        assert_eq!(u32::from_le_bytes(body[6..10].try_into().unwrap()), 0x1800);
        assert_eq!(writable, [0, 0xc0]);
        assert_eq!((msix.table_size(), msix.pba_size()), (256, 8));
    }
}
