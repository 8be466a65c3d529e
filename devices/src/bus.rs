//! The port-I/O bus: a small table of port ranges sorted by base, searched on every
//! access. Unclaimed ports read as all ones and ignore writes.

use std::sync::Arc;

use crate::{IoAction, PioDevice};

/// A range of ports `[base, base + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PioRange {
    pub base: u16,
    pub len: u16,
}

impl PioRange {
    pub fn new(base: u16, len: u16) -> Self {
        Self { base, len }
    }

    fn end(&self) -> u32 {
        u32::from(self.base) + u32::from(self.len)
    }

    fn contains(&self, port: u16) -> bool {
        port >= self.base && u32::from(port) < self.end()
    }

    fn overlaps(&self, other: &PioRange) -> bool {
        u32::from(self.base) < other.end() && u32::from(other.base) < self.end()
    }
}

/// Errors registering a device.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("port range {base:#x}+{len} is empty or overlaps a registered device")]
    Overlap { base: u16, len: u16 },
}

/// The port-I/O bus. Built once before the vCPUs run, then only read (shared by all
/// vCPU threads without a lock; the devices lock what they need).
#[derive(Default, Clone)]
pub struct PioBus {
    // Sorted by base; a handful of entries, so a linear scan beats anything cleverer.
    entries: Vec<(PioRange, Arc<dyn PioDevice>)>,
}

impl PioBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `device` for `range`; ranges may not overlap or be empty.
    pub fn insert(&mut self, range: PioRange, device: Arc<dyn PioDevice>) -> Result<(), BusError> {
        if range.len == 0
            || range.end() > 0x1_0000
            || self.entries.iter().any(|(r, _)| r.overlaps(&range))
        {
            return Err(BusError::Overlap {
                base: range.base,
                len: range.len,
            });
        }
        let at = self.entries.partition_point(|(r, _)| r.base < range.base);
        self.entries.insert(at, (range, device));
        Ok(())
    }

    #[inline]
    fn find(&self, port: u16) -> Option<(u16, &dyn PioDevice)> {
        self.entries
            .iter()
            .find(|(r, _)| r.contains(port))
            .map(|(r, d)| (port - r.base, d.as_ref()))
    }

    /// A guest `in` from `port`: `data` is filled (all ones where nothing answers).
    #[inline]
    pub fn read(&self, port: u16, data: &mut [u8]) {
        match self.find(port) {
            Some((offset, device)) => device.read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// A guest `out` to `port`; unclaimed ports ignore the write.
    #[inline]
    pub fn write(&self, port: u16, data: &[u8]) -> IoAction {
        match self.find(port) {
            Some((offset, device)) => device.write(offset, data),
            None => IoAction::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Mutex<Vec<(u16, Vec<u8>)>>,
    }

    impl PioDevice for Recorder {
        fn read(&self, offset: u16, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&self, offset: u16, data: &[u8]) -> IoAction {
            self.writes.lock().unwrap().push((offset, data.to_vec()));
            IoAction::Continue
        }
    }

    #[test]
    fn routes_by_range_with_offsets() {
        let mut bus = PioBus::new();
        let a = Arc::new(Recorder::default());
        let b = Arc::new(Recorder::default());
        bus.insert(PioRange::new(0x3f8, 8), a.clone()).unwrap();
        bus.insert(PioRange::new(0x80, 1), b.clone()).unwrap();
        assert_eq!(bus.write(0x3fd, &[7]), IoAction::Continue);
        assert_eq!(bus.write(0x80, &[1, 2]), IoAction::Continue);
        assert_eq!(*a.writes.lock().unwrap(), vec![(5, vec![7])]);
        assert_eq!(*b.writes.lock().unwrap(), vec![(0, vec![1, 2])]);
        let mut data = [0u8; 1];
        bus.read(0x3ff, &mut data);
        assert_eq!(data, [7]);
    }

    #[test]
    fn unclaimed_ports_read_all_ones_and_ignore_writes() {
        let mut bus = PioBus::new();
        let a = Arc::new(Recorder::default());
        bus.insert(PioRange::new(0x3f8, 8), a.clone()).unwrap();
        for port in [0x0, 0x3f7, 0x400, 0xffff] {
            let mut data = [0u8; 4];
            bus.read(port, &mut data);
            assert_eq!(data, [0xff; 4], "port {port:#x}");
            assert_eq!(bus.write(port, &[1, 2, 3, 4]), IoAction::Continue);
        }
        assert!(a.writes.lock().unwrap().is_empty());
    }

    #[test]
    fn rejects_overlapping_and_empty_ranges() {
        let mut bus = PioBus::new();
        bus.insert(PioRange::new(0x3f8, 8), Arc::new(Recorder::default()))
            .unwrap();
        for (base, len) in [(0x3f8, 1), (0x3f0, 9), (0x3ff, 4), (0x100, 0), (0xffff, 2)] {
            assert_eq!(
                bus.insert(PioRange::new(base, len), Arc::new(Recorder::default())),
                Err(BusError::Overlap { base, len }),
                "{base:#x}+{len}"
            );
        }
        bus.insert(PioRange::new(0x3f0, 8), Arc::new(Recorder::default()))
            .unwrap();
        bus.insert(PioRange::new(0xffff, 1), Arc::new(Recorder::default()))
            .unwrap();
    }
}
