//! A type-0 PCI configuration space: 256 bytes of registers with per-byte write masks.
//!
//! Every guest write goes through the masks, so read-only bits (IDs, class, header type,
//! capability pointers, a BAR's type and size bits) stay read-only whatever the guest
//! writes, and the BAR sizing protocol falls out of the masks: writing all ones to a BAR
//! leaves exactly the address bits its size allows, which read back as the size mask.
//! Accesses may have any offset and length; each byte is handled on its own, bytes
//! past the header read as zero (an empty extended-capability list for ECAM readers)
//! and ignore writes.

/// Bytes of the header and capability area.
pub const CONFIG_SIZE: usize = 256;
/// Configuration space per function as ECAM exposes it (the extended part reads zero).
pub const ECAM_FUNCTION_SIZE: usize = 4096;

pub const VENDOR_ID: usize = 0x00;
pub const DEVICE_ID: usize = 0x02;
pub const COMMAND: usize = 0x04;
pub const STATUS: usize = 0x06;
pub const REVISION: usize = 0x08;
pub const CLASS_CODE: usize = 0x09;
pub const HEADER_TYPE: usize = 0x0e;
pub const BAR0: usize = 0x10;
pub const CAPABILITIES_POINTER: usize = 0x34;
pub const INTERRUPT_LINE: usize = 0x3c;

/// Command register bits a guest may set: I/O space, memory space, bus master,
/// INTx disable.
pub const COMMAND_IO: u16 = 1 << 0;
pub const COMMAND_MEMORY: u16 = 1 << 1;
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status: a capability list is present.
pub const STATUS_CAPABILITIES: u16 = 1 << 4;
/// Status error bits, cleared by writing one.
const STATUS_W1C: u16 = 0xf900;
/// Where capabilities start (after the standard header).
const FIRST_CAPABILITY: usize = 0x40;

pub use crate::state::ConfigSpaceState;
use crate::state::DeviceStateError;

/// What a BAR decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    Memory32,
    /// Takes two BAR slots (this one and the next, which holds the high half).
    Memory64,
    Io,
}

/// A BAR as the VMM declared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    pub kind: BarKind,
    pub size: u64,
}

/// A memory BAR that currently decodes: where it is and how big.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarRegion {
    pub index: u8,
    pub address: u64,
    pub size: u64,
}

/// Errors declaring a device's layout (VMM bugs, reported, never guest-caused).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "BAR {index}: size {size:#x} is not a power of two of at least 16 (memory) or 4 (I/O) bytes"
    )]
    BarSize { index: usize, size: u64 },
    #[error("BAR {index} does not exist or overlaps another BAR")]
    BarSlot { index: usize },
    #[error("no room left in configuration space for a {len}-byte capability")]
    CapabilityFull { len: usize },
}

/// The registers of one PCI function.
#[derive(Clone)]
pub struct ConfigSpace {
    bytes: [u8; CONFIG_SIZE],
    /// Bits the guest may change.
    writable: [u8; CONFIG_SIZE],
    /// Bits the guest clears by writing one.
    clear_on_write: [u8; CONFIG_SIZE],
    bars: [Option<Bar>; 6],
    /// Offset of the last capability (to chain the next one) and the next free byte.
    last_capability: Option<usize>,
    next_free: usize,
}

impl ConfigSpace {
    /// A type-0 header with these identities; `class` is the 24-bit class code
    /// (base class, subclass, programming interface).
    pub fn new(vendor: u16, device: u16, class: u32, revision: u8) -> ConfigSpace {
        let mut space = ConfigSpace {
            bytes: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            clear_on_write: [0; CONFIG_SIZE],
            bars: [None; 6],
            last_capability: None,
            next_free: FIRST_CAPABILITY,
        };
        space.put(VENDOR_ID, &vendor.to_le_bytes());
        space.put(DEVICE_ID, &device.to_le_bytes());
        space.put(REVISION, &[revision]);
        space.put(CLASS_CODE, &class.to_le_bytes()[..3]);
        let command = COMMAND_IO | COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE;
        space.writable[COMMAND..COMMAND + 2].copy_from_slice(&command.to_le_bytes());
        space.clear_on_write[STATUS..STATUS + 2].copy_from_slice(&STATUS_W1C.to_le_bytes());
        space.writable[INTERRUPT_LINE] = 0xff;
        space
    }

    /// Declares BAR `index` (a 64-bit BAR also takes `index + 1`). The address starts
    /// at zero; the VMM places it with [`ConfigSpace::set_bar_address`].
    pub fn add_bar(&mut self, index: usize, bar: Bar) -> Result<(), ConfigError> {
        let slots = if bar.kind == BarKind::Memory64 { 2 } else { 1 };
        if index + slots > 6 || (index..index + slots).any(|i| self.slot_taken(i)) {
            return Err(ConfigError::BarSlot { index });
        }
        let min = if bar.kind == BarKind::Io { 4 } else { 16 };
        let max = match bar.kind {
            BarKind::Memory64 => 1 << 63,
            _ => 1 << 31,
        };
        if !bar.size.is_power_of_two() || bar.size < min || bar.size > max {
            return Err(ConfigError::BarSize {
                index,
                size: bar.size,
            });
        }
        let flags: u32 = match bar.kind {
            BarKind::Memory32 => 0,
            BarKind::Memory64 => 0b100,
            BarKind::Io => 0b1,
        };
        let mask = !(bar.size - 1);
        let low_mask = (mask as u32) & if bar.kind == BarKind::Io { !0x3 } else { !0xf };
        let at = BAR0 + 4 * index;
        self.put(at, &flags.to_le_bytes());
        self.writable[at..at + 4].copy_from_slice(&low_mask.to_le_bytes());
        if bar.kind == BarKind::Memory64 {
            let high_mask = (mask >> 32) as u32;
            self.writable[at + 4..at + 8].copy_from_slice(&high_mask.to_le_bytes());
        }
        self.bars[index] = Some(bar);
        Ok(())
    }

    fn slot_taken(&self, index: usize) -> bool {
        self.bars[index].is_some()
            || (index > 0 && self.bars[index - 1].is_some_and(|b| b.kind == BarKind::Memory64))
    }

    /// Places BAR `index` at `address` (as firmware does; the guest may move it).
    /// Bits the BAR's size does not allow are dropped.
    pub fn set_bar_address(&mut self, index: usize, address: u64) {
        let Some(bar) = self.bars.get(index).copied().flatten() else {
            return;
        };
        let at = BAR0 + 4 * index;
        let low = (address as u32) & self.mask32(at);
        let flags = self.dword(at) & !self.mask32(at);
        self.put(at, &(low | flags).to_le_bytes());
        if bar.kind == BarKind::Memory64 {
            let high = ((address >> 32) as u32) & self.mask32(at + 4);
            self.put(at + 4, &high.to_le_bytes());
        }
    }

    /// The size BAR `index` was declared with, if it exists.
    pub fn bar_size(&self, index: usize) -> Option<u64> {
        Some(self.bars.get(index).copied().flatten()?.size)
    }

    /// Where BAR `index` points now (whether or not decoding is enabled).
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let bar = self.bars.get(index).copied().flatten()?;
        let at = BAR0 + 4 * index;
        let low = u64::from(self.dword(at) & self.mask32(at));
        Some(match bar.kind {
            BarKind::Memory64 => low | (u64::from(self.dword(at + 4)) << 32),
            _ => low,
        })
    }

    /// The memory BARs that decode now: memory space enabled and the BAR placed.
    pub fn memory_regions(&self) -> impl Iterator<Item = BarRegion> + '_ {
        let enabled = self.command() & COMMAND_MEMORY != 0;
        self.bars
            .iter()
            .enumerate()
            .filter(move |_| enabled)
            .filter_map(|(index, bar)| {
                let bar = (*bar)?;
                if bar.kind == BarKind::Io {
                    return None;
                }
                let address = self.bar_address(index)?;
                // An address of zero is "not placed" (or mid-sizing): it decodes nothing.
                (address != 0).then_some(BarRegion {
                    index: index as u8,
                    address,
                    size: bar.size,
                })
            })
    }

    pub fn command(&self) -> u16 {
        u16::from_le_bytes([self.bytes[COMMAND], self.bytes[COMMAND + 1]])
    }

    /// Adds a capability with `id` and `body` (the bytes after its ID and next
    /// pointer); `body_writable` gives the guest-writable bits of the body (shorter
    /// means the rest is read-only). Returns the capability's offset.
    pub fn add_capability(
        &mut self,
        id: u8,
        body: &[u8],
        body_writable: &[u8],
    ) -> Result<usize, ConfigError> {
        let len = 2 + body.len();
        let at = self.next_free;
        if at + len > CONFIG_SIZE {
            return Err(ConfigError::CapabilityFull { len });
        }
        self.put(at, &[id, 0]);
        self.put(at + 2, body);
        for (i, &mask) in body_writable.iter().take(body.len()).enumerate() {
            self.writable[at + 2 + i] = mask;
        }
        match self.last_capability {
            Some(last) => self.bytes[last + 1] = at as u8,
            None => {
                self.bytes[CAPABILITIES_POINTER] = at as u8;
                let status = self.word(STATUS) | STATUS_CAPABILITIES;
                self.put(STATUS, &status.to_le_bytes());
            }
        }
        self.last_capability = Some(at);
        self.next_free = (at + len).next_multiple_of(4);
        Ok(at)
    }

    /// The registers now.
    pub fn state(&self) -> ConfigSpaceState {
        ConfigSpaceState {
            bytes: self.bytes.to_vec(),
        }
    }

    /// Puts saved registers back. The state must be of the same layout: same size,
    /// and every bit the guest cannot change (identity, BAR types, capabilities) equal
    /// to this space's, so a state is never restored into another kind of device.
    pub fn restore_state(&mut self, state: &ConfigSpaceState) -> Result<(), DeviceStateError> {
        let bytes: &[u8; CONFIG_SIZE] = state.bytes.as_slice().try_into().map_err(|_| {
            DeviceStateError::mismatch(
                "PCI configuration space",
                format!("{} bytes, not {CONFIG_SIZE}", state.bytes.len()),
            )
        })?;
        for (at, (&saved, &now)) in bytes.iter().zip(&self.bytes).enumerate() {
            let fixed = !(self.writable[at] | self.clear_on_write[at]);
            // BAR address bits are placed by the VMM (device side), not masked as
            // writable until the BAR exists: they are compared through the masks too.
            if (saved ^ now) & fixed != 0 {
                return Err(DeviceStateError::mismatch(
                    "PCI configuration space",
                    format!(
                        "read-only byte {at:#x} differs (saved {saved:#04x}, device {now:#04x})"
                    ),
                ));
            }
        }
        self.bytes = *bytes;
        Ok(())
    }

    /// A guest read of `data.len()` bytes at `offset` (any alignment).
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i)
                .and_then(|at| self.bytes.get(at))
                .copied()
                .unwrap_or(0);
        }
    }

    /// A guest write: each byte through its masks.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &value) in data.iter().enumerate() {
            let Some(at) = offset.checked_add(i).filter(|&at| at < CONFIG_SIZE) else {
                break;
            };
            let keep = self.bytes[at] & !self.writable[at];
            let set = value & self.writable[at];
            self.bytes[at] = (keep | set) & !(value & self.clear_on_write[at]);
        }
    }

    /// The byte at `offset`, as the device itself sees it.
    pub fn byte(&self, offset: usize) -> u8 {
        self.bytes.get(offset).copied().unwrap_or(0)
    }

    pub fn word(&self, offset: usize) -> u16 {
        u16::from_le_bytes([self.byte(offset), self.byte(offset + 1)])
    }

    pub fn dword(&self, offset: usize) -> u32 {
        u32::from_le_bytes([
            self.byte(offset),
            self.byte(offset + 1),
            self.byte(offset + 2),
            self.byte(offset + 3),
        ])
    }

    fn mask32(&self, offset: usize) -> u32 {
        u32::from_le_bytes(
            self.writable[offset..offset + 4]
                .try_into()
                .unwrap_or([0; 4]),
        )
    }

    /// Device-side store: ignores the masks.
    pub fn put(&mut self, offset: usize, bytes: &[u8]) {
        let end = (offset + bytes.len()).min(CONFIG_SIZE);
        if offset < end {
            self.bytes[offset..end].copy_from_slice(&bytes[..end - offset]);
        }
    }
}

impl std::fmt::Debug for ConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigSpace")
            .field("vendor", &format_args!("{:#06x}", self.word(VENDOR_ID)))
            .field("device", &format_args!("{:#06x}", self.word(DEVICE_ID)))
            .field("command", &format_args!("{:#06x}", self.command()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(kind: BarKind, size: u64) -> Bar {
        Bar { kind, size }
    }

    fn space() -> ConfigSpace {
        ConfigSpace::new(0x1234, 0x5678, 0x02_00_00, 3)
    }

    fn read32(space: &ConfigSpace, at: usize) -> u32 {
        let mut data = [0; 4];
        space.read(at, &mut data);
        u32::from_le_bytes(data)
    }

    fn write32(space: &mut ConfigSpace, at: usize, value: u32) {
        space.write(at, &value.to_le_bytes());
    }

    #[test]
    fn identity_registers_are_read_only() {
        let mut s = space();
        assert_eq!(read32(&s, 0), 0x5678_1234);
        assert_eq!(read32(&s, 8), 0x0200_0003);
        for at in [0, 8, 0x0c, 0x2c, 0x34] {
            write32(&mut s, at, 0xffff_ffff);
        }
        assert_eq!(read32(&s, 0), 0x5678_1234);
        assert_eq!(read32(&s, 8), 0x0200_0003);
        assert_eq!(s.byte(HEADER_TYPE), 0);
        assert_eq!(s.byte(CAPABILITIES_POINTER), 0);
    }

    #[test]
    fn command_takes_only_its_defined_bits_and_status_errors_clear_on_write() {
        let mut s = space();
        write32(&mut s, COMMAND, 0xffff_ffff);
        assert_eq!(s.command(), 0x0407);
        let mut status = s.word(STATUS);
        assert_eq!(status, 0);
        // The device sets an error bit; the guest clears it by writing one.
        s.put(STATUS, &(1u16 << 13).to_le_bytes());
        status = s.word(STATUS);
        assert_eq!(status, 1 << 13);
        s.write(STATUS, &(1u16 << 13).to_le_bytes());
        assert_eq!(s.word(STATUS), 0);
        write32(&mut s, COMMAND, 0);
        assert_eq!(s.command(), 0);
    }

    #[test]
    fn bar_sizing_protocol_for_32_bit_64_bit_and_io_bars() {
        let mut s = space();
        s.add_bar(0, bar(BarKind::Memory32, 0x2000)).unwrap();
        s.add_bar(2, bar(BarKind::Memory64, 1 << 32)).unwrap();
        s.add_bar(4, bar(BarKind::Io, 0x20)).unwrap();
        for at in (BAR0..BAR0 + 24).step_by(4) {
            write32(&mut s, at, 0xffff_ffff);
        }
        assert_eq!(read32(&s, BAR0), 0xffff_e000);
        assert_eq!(read32(&s, BAR0 + 4), 0, "BAR 1 is unimplemented");
        assert_eq!(
            read32(&s, BAR0 + 8),
            0x0000_0004,
            "64-bit: low bits all fixed"
        );
        assert_eq!(
            read32(&s, BAR0 + 12),
            0xffff_ffff,
            "64-bit high half: size 4 GiB"
        );
        assert_eq!(read32(&s, BAR0 + 16), 0xffff_ffe1);
        // Programming an address keeps only the aligned bits and the type bits.
        write32(&mut s, BAR0, 0xc000_1234);
        assert_eq!(read32(&s, BAR0), 0xc000_0000);
        assert_eq!(s.bar_address(0), Some(0xc000_0000));
        write32(&mut s, BAR0 + 8, 0);
        write32(&mut s, BAR0 + 12, 0x12);
        assert_eq!(s.bar_address(2), Some(0x12_0000_0000));
        assert_eq!(s.bar_address(1), None);
    }

    #[test]
    fn bar_declarations_are_checked() {
        let mut s = space();
        assert_eq!(
            s.add_bar(0, bar(BarKind::Memory32, 0x1800)),
            Err(ConfigError::BarSize {
                index: 0,
                size: 0x1800
            })
        );
        assert_eq!(
            s.add_bar(5, bar(BarKind::Memory64, 0x1000)),
            Err(ConfigError::BarSlot { index: 5 })
        );
        s.add_bar(0, bar(BarKind::Memory64, 0x1000)).unwrap();
        assert_eq!(
            s.add_bar(1, bar(BarKind::Memory32, 0x1000)),
            Err(ConfigError::BarSlot { index: 1 })
        );
        assert_eq!(
            s.add_bar(6, bar(BarKind::Memory32, 0x1000)),
            Err(ConfigError::BarSlot { index: 6 })
        );
    }

    #[test]
    fn memory_regions_follow_the_memory_enable_bit_and_moves() {
        let mut s = space();
        s.add_bar(0, bar(BarKind::Memory32, 0x2000)).unwrap();
        s.set_bar_address(0, 0xc000_0000);
        assert_eq!(s.memory_regions().count(), 0, "memory decoding is off");
        write32(&mut s, COMMAND, u32::from(COMMAND_MEMORY));
        let regions: Vec<_> = s.memory_regions().collect();
        assert_eq!(
            regions,
            [BarRegion {
                index: 0,
                address: 0xc000_0000,
                size: 0x2000
            }]
        );
        write32(&mut s, BAR0, 0xd000_0000);
        assert_eq!(s.memory_regions().next().unwrap().address, 0xd000_0000);
    }

    #[test]
    fn capabilities_chain_from_the_pointer() {
        let mut s = space();
        let first = s
            .add_capability(0x05, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], &[])
            .unwrap();
        let second = s.add_capability(0x11, &[0xaa; 10], &[0, 0xc0]).unwrap();
        assert_eq!(s.word(STATUS) & STATUS_CAPABILITIES, STATUS_CAPABILITIES);
        let mut at = s.byte(CAPABILITIES_POINTER) as usize;
        let mut seen = Vec::new();
        while at != 0 {
            seen.push((at, s.byte(at)));
            at = s.byte(at + 1) as usize;
        }
        assert_eq!(seen, [(first, 0x05), (second, 0x11)]);
        assert_eq!(first % 4, 0);
        assert_eq!(second % 4, 0);
        // Only the declared writable bits of a body change.
        s.write(second + 2, &[0xff, 0xff, 0xff]);
        assert_eq!(
            [s.byte(second + 2), s.byte(second + 3), s.byte(second + 4)],
            [0xaa, 0xea, 0xaa]
        );
        // Next pointers are read-only.
        s.write(first + 1, &[0]);
        assert_eq!(s.byte(first + 1) as usize, second);
    }

    #[test]
    fn unaligned_and_out_of_range_accesses_are_bytewise() {
        let mut s = space();
        let mut data = [0u8; 4];
        s.read(0x01, &mut data);
        assert_eq!(data, [0x12, 0x78, 0x56, 0x00]);
        s.read(0xfe, &mut data);
        assert_eq!(data, [0, 0, 0, 0]);
        s.read(usize::MAX - 1, &mut data);
        assert_eq!(data, [0; 4]);
        s.write(0xff, &[0xff; 8]);
        s.write(usize::MAX, &[0xff; 2]);
        write32(&mut s, INTERRUPT_LINE - 1, 0xffff_ffff);
        assert_eq!(s.byte(INTERRUPT_LINE), 0xff);
        assert_eq!(s.byte(INTERRUPT_LINE + 1), 0, "interrupt pin is read-only");
    }
}
