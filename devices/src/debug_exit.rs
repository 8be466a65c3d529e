//! Debug-exit: QEMU `isa-debug-exit` compatible. Any write ends the VM with the value
//! written (kumo's exit status is `v & 0xFF`; QEMU's is `(v << 1) | 1`).

use crate::{IoAction, PioDevice, le_value};

/// The conventional port (4 bytes wide).
pub const DEBUG_EXIT_PORT: u16 = 0xf4;
pub const DEBUG_EXIT_LEN: u16 = 4;

#[derive(Debug, Default)]
pub struct DebugExit;

impl PioDevice for DebugExit {
    fn read(&self, _offset: u16, data: &mut [u8]) {
        // isa-debug-exit has no read side; QEMU returns zero.
        data.fill(0);
    }

    fn write(&self, _offset: u16, data: &[u8]) -> IoAction {
        IoAction::Exit(le_value(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_write_exits_with_the_value_written() {
        let d = DebugExit;
        assert_eq!(d.write(0, &[0x2a]), IoAction::Exit(0x2a));
        assert_eq!(d.write(0, &[0x34, 0x12]), IoAction::Exit(0x1234));
        assert_eq!(
            d.write(0, &[0x78, 0x56, 0x34, 0x12]),
            IoAction::Exit(0x1234_5678)
        );
        assert_eq!(
            d.write(0, &[0xff, 0xff, 0xff, 0xff]),
            IoAction::Exit(u32::MAX)
        );
        let mut data = [0xaa; 4];
        d.read(0, &mut data);
        assert_eq!(data, [0; 4]);
    }
}
