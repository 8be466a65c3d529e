//! COM1: a 16550A (vm-superio) whose output goes to a `Write`. Output only; LSR always
//! reports the transmitter empty. Shared by all vCPUs, hence the mutex.

use std::io::Write;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::{Serial, Trigger};

use crate::state::DeviceStateError;

use crate::{IoAction, PioDevice};

pub const COM1_PORT: u16 = 0x3f8;
pub const COM1_LEN: u16 = 8;

/// No interrupt line is wired to COM1 yet: the guest polls LSR.
#[derive(Debug, Default)]
pub struct NoIrq;

impl Trigger for NoIrq {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        Ok(())
    }
}

type Out = Box<dyn Write + Send>;

pub struct Com1 {
    serial: Mutex<Serial<NoIrq, vm_superio::serial::NoEvents, Out>>,
}

/// COM1's registers and receive FIFO (vm-superio's `SerialState`, made serde).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Com1State {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl Com1 {
    pub fn new(out: Out) -> Self {
        Self {
            serial: Mutex::new(Serial::new(NoIrq, out)),
        }
    }

    /// The registers now.
    pub fn state(&self) -> Com1State {
        let s = self
            .serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .state();
        Com1State {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// A COM1 with saved registers whose output goes to `out`. A receive FIFO longer
    /// than the 16550A's is refused.
    pub fn from_state(out: Out, state: &Com1State) -> Result<Self, DeviceStateError> {
        let s = SerialState {
            baud_divisor_low: state.baud_divisor_low,
            baud_divisor_high: state.baud_divisor_high,
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let serial = Serial::from_state(&s, NoIrq, vm_superio::serial::NoEvents, out)
            .map_err(|e| DeviceStateError::mismatch("COM1", format!("{e:?}")))?;
        Ok(Self {
            serial: Mutex::new(serial),
        })
    }

    /// Flushes the output (the device already flushes after each byte; this is for the
    /// end of the VM).
    pub fn flush(&self) {
        let mut serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = serial.writer_mut().flush() {
            tracing::debug!("COM1: flushing the console failed: {e}");
        }
    }

    /// Takes the output writer back (e.g. to drop it when the VM ends), leaving a sink.
    pub fn take_writer(&self) -> Out {
        let mut serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(serial.writer_mut(), Box::new(std::io::sink()))
    }
}

impl PioDevice for Com1 {
    fn read(&self, offset: u16, data: &mut [u8]) {
        let mut serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        // Registers are bytes; a wider access reads consecutive registers (like QEMU).
        for (i, b) in data.iter_mut().enumerate() {
            let reg = offset as usize + i;
            *b = if reg < COM1_LEN as usize {
                serial.read(reg as u8)
            } else {
                0xff
            };
        }
    }

    fn write(&self, offset: u16, data: &[u8]) -> IoAction {
        let mut serial = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        for (i, b) in data.iter().enumerate() {
            let reg = offset as usize + i;
            if reg >= COM1_LEN as usize {
                break;
            }
            if let Err(e) = serial.write(reg as u8, *b) {
                // A console that went away must not stop the guest.
                tracing::debug!("COM1: output lost: {e}");
            }
        }
        IoAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
    }

    const LSR: u16 = 5;
    const LSR_THR_EMPTY: u8 = 0x20;

    #[test]
    fn data_register_writes_reach_the_output() {
        let out = Shared::default();
        let com1 = Com1::new(Box::new(out.clone()));
        for b in b"hi\n" {
            assert_eq!(com1.write(0, &[*b]), IoAction::Continue);
        }
        assert_eq!(&*out.0.lock().unwrap(), b"hi\n");
    }

    #[test]
    fn lsr_reports_the_transmitter_empty_even_after_output() {
        let com1 = Com1::new(Box::new(std::io::sink()));
        let mut lsr = [0u8];
        com1.read(LSR, &mut lsr);
        assert_ne!(lsr[0] & LSR_THR_EMPTY, 0);
        let _ = com1.write(0, b"x");
        com1.read(LSR, &mut lsr);
        assert_ne!(lsr[0] & LSR_THR_EMPTY, 0);
    }

    #[test]
    fn registers_other_than_data_do_not_print() {
        let out = Shared::default();
        let com1 = Com1::new(Box::new(out.clone()));
        let _ = com1.write(3, &[0x80]); // LCR: DLAB on
        let _ = com1.write(0, &[0x01]); // divisor low, not data
        let _ = com1.write(3, &[0x03]); // 8N1, DLAB off
        let _ = com1.write(7, &[0x55]); // scratch
        let mut scr = [0u8];
        com1.read(7, &mut scr);
        assert_eq!(scr, [0x55]);
        assert!(out.0.lock().unwrap().is_empty());
    }

    #[test]
    fn state_round_trips_and_an_oversized_fifo_is_refused() {
        let com1 = Com1::new(Box::new(std::io::sink()));
        let _ = com1.write(3, &[0x80]); // DLAB on
        let _ = com1.write(0, &[0x0c]); // divisor low
        let _ = com1.write(3, &[0x03]);
        let _ = com1.write(7, &[0x5a]);
        let state = com1.state();
        assert_eq!((state.baud_divisor_low, state.scratch), (0x0c, 0x5a));
        let out = Shared::default();
        let restored = Com1::from_state(Box::new(out.clone()), &state).unwrap();
        assert_eq!(restored.state(), state);
        let mut scr = [0u8];
        restored.read(7, &mut scr);
        assert_eq!(scr, [0x5a]);
        let _ = restored.write(0, b"z");
        assert_eq!(&*out.0.lock().unwrap(), b"z");
        let mut big = state.clone();
        big.in_buffer = vec![0; 4096];
        assert!(Com1::from_state(Box::new(std::io::sink()), &big).is_err());
    }

    #[test]
    fn a_broken_console_does_not_stop_the_guest() {
        let com1 = Com1::new(Box::new(Broken));
        assert_eq!(com1.write(0, b"x"), IoAction::Continue);
        com1.flush();
    }
}
