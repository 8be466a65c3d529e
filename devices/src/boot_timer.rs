//! Boot-timer on the POST port 0x80: the first write of 0x01 marks "workload started";
//! the caller reads the time of that mark with [`BootTimer::first_mark`].

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::{IoAction, PioDevice};

pub const BOOT_TIMER_PORT: u16 = 0x80;
/// The value that marks "workload started".
pub const WORKLOAD_STARTED: u8 = 0x01;

#[derive(Debug, Default)]
pub struct BootTimer {
    first: OnceLock<Instant>,
    /// Restored from a VM that had already marked: later writes mark nothing.
    marked_before: AtomicBool,
}

/// What survives a snapshot: whether the mark happened (its instant belongs to the
/// process that saw it, so it is not carried).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootTimerState {
    pub marked: bool,
}

impl BootTimer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn state(&self) -> BootTimerState {
        BootTimerState {
            marked: self.first.get().is_some() || self.marked_before.load(Ordering::Acquire),
        }
    }

    /// A timer that remembers an earlier mark: [`BootTimer::first_mark`] stays `None`
    /// (the mark was not seen here) and later writes do not mark.
    pub fn from_state(state: &BootTimerState) -> Self {
        BootTimer {
            first: OnceLock::new(),
            marked_before: AtomicBool::new(state.marked),
        }
    }

    /// When the guest first wrote 0x01, if it did.
    pub fn first_mark(&self) -> Option<Instant> {
        self.first.get().copied()
    }
}

impl PioDevice for BootTimer {
    fn read(&self, _offset: u16, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&self, _offset: u16, data: &[u8]) -> IoAction {
        // POST codes are bytes; a wider `out` still carries the code in its low byte.
        if data.first() == Some(&WORKLOAD_STARTED)
            && self.first.get().is_none()
            && !self.marked_before.load(Ordering::Acquire)
        {
            let now = Instant::now();
            if self.first.set(now).is_ok() {
                tracing::debug!("boot-timer: workload started");
            }
        }
        IoAction::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_the_first_write_of_one() {
        let t = BootTimer::new();
        assert_eq!(t.first_mark(), None);
        assert_eq!(t.write(0, &[0x02]), IoAction::Continue);
        assert_eq!(t.first_mark(), None, "other POST codes are ignored");
        let before = Instant::now();
        assert_eq!(t.write(0, &[0x01]), IoAction::Continue);
        let first = t.first_mark().expect("marked");
        assert!(first >= before);
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(t.write(0, &[0x01]), IoAction::Continue);
        assert_eq!(t.first_mark(), Some(first), "later marks do not move it");
    }

    #[test]
    fn a_restored_mark_is_not_made_again() {
        let t = BootTimer::new();
        assert_eq!(t.state(), BootTimerState { marked: false });
        let _ = t.write(0, &[0x01]);
        let state = t.state();
        assert!(state.marked);
        let r = BootTimer::from_state(&state);
        assert_eq!(r.write(0, &[0x01]), IoAction::Continue);
        assert_eq!(r.first_mark(), None);
        assert_eq!(r.state(), state);
        let fresh = BootTimer::from_state(&BootTimerState { marked: false });
        let _ = fresh.write(0, &[0x01]);
        assert!(fresh.first_mark().is_some());
    }
}
