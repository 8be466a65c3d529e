//! Waiting without burning host CPU: spin briefly (the common, short case), then sleep
//! in the supervisor until a wake-up IPI. vCPUs may outnumber host cores, so long spins
//! would steal time from the very thread being waited for.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sys;

/// CPUs that are (about to be) asleep in `sys::wait`; wakers skip the IPI when 0.
static SLEEPERS: AtomicU32 = AtomicU32::new(0);
/// TSC ticks to spin before sleeping (set once at start from the TSC frequency).
static SPIN_TICKS: AtomicU64 = AtomicU64::new(100_000);

pub fn set_spin_ticks(ticks: u64) {
    SPIN_TICKS.store(ticks, Ordering::Relaxed);
}

/// Returns once `word != value`.
pub fn wait_while_eq(word: &AtomicU32, value: u32) {
    let spin_ticks = SPIN_TICKS.load(Ordering::Relaxed);
    let start = sys::rdtsc();
    while word.load(Ordering::Acquire) == value {
        if sys::rdtsc() - start < spin_ticks {
            core::hint::spin_loop();
            continue;
        }
        // Announce the sleep before the final check: a waker that stores after our
        // check sees SLEEPERS != 0 and sends the IPI (both sides SeqCst).
        SLEEPERS.fetch_add(1, Ordering::SeqCst);
        if word.load(Ordering::SeqCst) == value {
            sys::wait(word.as_ptr(), value);
        }
        SLEEPERS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Stores `value` into `word` and wakes the sleepers.
pub fn store_and_wake(word: &AtomicU32, value: u32) {
    word.store(value, Ordering::SeqCst);
    if SLEEPERS.load(Ordering::SeqCst) != 0 {
        sys::wake();
    }
}

/// A reusable barrier for a fixed number of threads, in shared memory.
pub struct Barrier {
    arrived: AtomicU32,
    generation: AtomicU32,
}

impl Barrier {
    pub const fn new() -> Barrier {
        Barrier {
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
        }
    }

    /// Returns when all `threads` have called `wait` for this generation. Everything a
    /// thread wrote before `wait` is visible to all threads after it.
    pub fn wait(&self, threads: u32) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == threads {
            // Last to arrive: nobody can arrive again before the generation moves on.
            self.arrived.store(0, Ordering::Relaxed);
            store_and_wake(&self.generation, generation.wrapping_add(1));
        } else {
            wait_while_eq(&self.generation, generation);
        }
    }
}
