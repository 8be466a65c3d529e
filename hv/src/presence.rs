//! What a thread says about its own sleeps, for the scheduler that senses it.
//!
//! Whether a thread is runnable, `/proc/<tid>/stat` says exactly for ~5 µs a read; the
//! credit driver asks at every run for each vCPU and domain-0 thread. A thread that
//! marks its waits in user space ([`asleep`]) answers for itself with one atomic
//! load. The mark clears only once the thread runs again, so it is exact only for a
//! thread that runs as soon as it wakes (see `placement::VcpuControl::runnable`).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a thread says about its own sleeps in user space ([`asleep`]).
#[derive(Default)]
pub(crate) struct Presence {
    /// It has said so at least once: from then on its word is trusted.
    pub(crate) reports: AtomicBool,
    asleep: AtomicBool,
}

impl Presence {
    /// Whether it reported a sleep and is in it (or woke and has not run since).
    pub(crate) fn reported_asleep(&self) -> bool {
        self.asleep.load(Ordering::Acquire)
    }

    /// Whether it reports, and is awake by its own word.
    pub(crate) fn reported_awake(&self) -> bool {
        self.reports.load(Ordering::Acquire) && !self.asleep.load(Ordering::Acquire)
    }
}

thread_local! {
    /// The calling thread's presence, if a scheduler senses it (a vCPU thread, or a
    /// member of a `placement::ThreadGroup`).
    static PRESENCE: RefCell<Option<Arc<Presence>>> = const { RefCell::new(None) };
}

/// Runs `wait`, a blocking call, with the calling thread marked asleep for the
/// scheduler that senses it (if any): one atomic store before and after. A thread
/// that uses this once is trusted from then on, so it must use it around every wait
/// that can last (see the module's note).
pub fn asleep<T>(wait: impl FnOnce() -> T) -> T {
    set_asleep(true);
    let result = wait();
    set_asleep(false);
    result
}

/// [`asleep`] for callers that get a hook on each side of the wait (tokio's
/// `on_thread_park` and `on_thread_unpark`).
pub fn set_asleep(asleep: bool) {
    PRESENCE.with_borrow(|presence| {
        if let Some(p) = presence {
            p.reports.store(true, Ordering::Release);
            p.asleep.store(asleep, Ordering::Release);
        }
    });
}

/// Makes `presence` the calling thread's (`None`: it is sensed no more).
pub(crate) fn sense_current_thread(presence: Option<Arc<Presence>>) {
    PRESENCE.set(presence);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outside a group or a vCPU thread, `asleep` only runs the wait.
    #[test]
    fn asleep_outside_a_sensed_thread_just_waits() {
        assert_eq!(asleep(|| 7), 7);
        PRESENCE.with_borrow(|p| assert!(p.is_none()));
    }
}
