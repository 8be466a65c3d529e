//! Waiting without burning host CPU: spin briefly (the common, short case), then sleep
//! until woken: in the supervisor until a wake-up IPI, or, where kumo offers its
//! paravirtual wait page (`pvwait=1`), blocked in the VMM on the word itself with no
//! ring-0 code and no interrupt at all. vCPUs may outnumber host cores, so long spins
//! would steal time from the very thread being waited for.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::sys;

/// CPUs that are (about to be) asleep in `sys::wait` (`hlt`) and blocked in the VMM
/// (`sys::pv_wait`); wakers skip each kind of wake-up when its count is 0. Two counts,
/// because CPUs may sleep the `hlt` way before the master has read `pvwait=1`.
static HALTED: AtomicU32 = AtomicU32::new(0);
static BLOCKED: AtomicU32 = AtomicU32::new(0);
/// TSC ticks to spin before sleeping (set once at start from the TSC frequency).
static SPIN_TICKS: AtomicU64 = AtomicU64::new(100_000);

/// Whether to sleep through kumo's paravirtual wait page instead of `hlt` and IPIs.
static PV_WAIT: AtomicBool = AtomicBool::new(false);

pub fn set_spin_ticks(ticks: u64) {
    SPIN_TICKS.store(ticks, Ordering::Relaxed);
}

pub fn use_pv_wait(on: bool) {
    PV_WAIT.store(on, Ordering::Relaxed);
}

/// Where the waits' time went, summed over every CPU since the last [`take_stats`]
/// (TSC ticks): what `@kumo barrierstats` reports after each benchmark.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    /// Barriers completed.
    pub barriers: u64,
    /// Waits that went to sleep, and wake-up requests (IPI broadcasts or VMM wakes).
    pub sleeps: u64,
    pub wakes: u64,
    /// Time waiters spun, and time they slept (from the sleep call to its return).
    pub spin_ticks: u64,
    pub sleep_ticks: u64,
    /// Per barrier, first arrival to last arrival: how late the last thread came.
    pub spread_ticks: u64,
    /// Per waiter, the last arrival to this waiter running again: the release's cost.
    pub resume_ticks: u64,
    pub resumes: u64,
}

struct Counters {
    barriers: AtomicU64,
    sleeps: AtomicU64,
    wakes: AtomicU64,
    spin_ticks: AtomicU64,
    sleep_ticks: AtomicU64,
    spread_ticks: AtomicU64,
    resume_ticks: AtomicU64,
    resumes: AtomicU64,
}

static STATS: Counters = Counters {
    barriers: AtomicU64::new(0),
    sleeps: AtomicU64::new(0),
    wakes: AtomicU64::new(0),
    spin_ticks: AtomicU64::new(0),
    sleep_ticks: AtomicU64::new(0),
    spread_ticks: AtomicU64::new(0),
    resume_ticks: AtomicU64::new(0),
    resumes: AtomicU64::new(0),
};

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The counters since the last call, which restarts them.
pub fn take_stats() -> Stats {
    let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
    Stats {
        barriers: take(&STATS.barriers),
        sleeps: take(&STATS.sleeps),
        wakes: take(&STATS.wakes),
        spin_ticks: take(&STATS.spin_ticks),
        sleep_ticks: take(&STATS.sleep_ticks),
        spread_ticks: take(&STATS.spread_ticks),
        resume_ticks: take(&STATS.resume_ticks),
        resumes: take(&STATS.resumes),
    }
}

/// One barrier passed (the green-thread balloon keeps its own barrier of vCPUs).
pub fn count_barrier() {
    add(&STATS.barriers, 1);
}

/// Returns once `word != value`.
pub fn wait_while_eq(word: &AtomicU32, value: u32) {
    let _ = wait_while_eq_spinning(word, value, SPIN_TICKS.load(Ordering::Relaxed));
}

/// As [`wait_while_eq`], spinning `spin_ticks` before sleeping; true if it slept.
pub fn wait_while_eq_spinning(word: &AtomicU32, value: u32, spin_ticks: u64) -> bool {
    wait_loop(word, value, spin_ticks, false)
}

/// As [`wait_while_eq`] for a vCPU with nothing to do until `word` changes (a
/// ballooned team's parked vCPU): no spin, and with kumo's wait page it blocks up to
/// a second at a time instead of 10 ms (`sys::pv_park`).
pub fn wait_parked(word: &AtomicU32, value: u32) {
    let _ = wait_loop(word, value, 0, true);
}

fn wait_loop(word: &AtomicU32, value: u32, spin_ticks: u64, parked: bool) -> bool {
    let start = sys::rdtsc();
    let mut slept = 0;
    while word.load(Ordering::Acquire) == value {
        if sys::rdtsc() - start < spin_ticks {
            core::hint::spin_loop();
            continue;
        }
        let asleep = sys::rdtsc();
        sleep(word, value, parked);
        slept += sys::rdtsc() - asleep;
    }
    add(&STATS.spin_ticks, (sys::rdtsc() - start).saturating_sub(slept));
    add(&STATS.sleep_ticks, slept);
    slept > 0
}

/// Sleeps until `word` may have changed from `value` (may return spuriously). The
/// sleep is announced before the final check: a waker that stores after that check
/// sees the count and wakes us (both sides SeqCst).
fn sleep(word: &AtomicU32, value: u32, parked: bool) {
    let pv = PV_WAIT.load(Ordering::Relaxed);
    let count = if pv { &BLOCKED } else { &HALTED };
    count.fetch_add(1, Ordering::SeqCst);
    if word.load(Ordering::SeqCst) == value {
        add(&STATS.sleeps, 1);
        if pv && parked {
            sys::pv_park(word.as_ptr(), value);
        } else if pv {
            sys::pv_wait(word.as_ptr(), value);
        } else {
            sys::wait(word.as_ptr(), value);
        }
    }
    count.fetch_sub(1, Ordering::SeqCst);
}

/// Stores `value` into `word` and wakes its sleepers, of either kind.
pub fn store_and_wake(word: &AtomicU32, value: u32) {
    word.store(value, Ordering::SeqCst);
    if HALTED.load(Ordering::SeqCst) != 0 {
        add(&STATS.wakes, 1);
        sys::wake();
    }
    if BLOCKED.load(Ordering::SeqCst) != 0 {
        add(&STATS.wakes, 1);
        sys::pv_wake(word.as_ptr());
    }
}

/// A reusable barrier for a fixed number of threads, in shared memory.
pub struct Barrier {
    arrived: AtomicU32,
    generation: AtomicU32,
    /// TSC of this generation's first arrival, and of its release (for [`Stats`]).
    first_tsc: AtomicU64,
    release_tsc: AtomicU64,
}

impl Barrier {
    pub const fn new() -> Barrier {
        Barrier {
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            first_tsc: AtomicU64::new(0),
            release_tsc: AtomicU64::new(0),
        }
    }

    /// Returns when all `threads` have called `wait` for this generation. Everything a
    /// thread wrote before `wait` is visible to all threads after it.
    pub fn wait(&self, threads: u32) {
        let generation = self.generation.load(Ordering::Acquire);
        let now = sys::rdtsc();
        let before = self.arrived.fetch_add(1, Ordering::AcqRel);
        if before == 0 && threads > 1 {
            self.first_tsc.store(now, Ordering::Relaxed);
        }
        if before + 1 == threads {
            // Last to arrive: nobody can arrive again before the generation moves on.
            self.arrived.store(0, Ordering::Relaxed);
            if threads > 1 {
                add(
                    &STATS.spread_ticks,
                    now.saturating_sub(self.first_tsc.load(Ordering::Relaxed)),
                );
            }
            add(&STATS.barriers, 1);
            self.release_tsc.store(sys::rdtsc(), Ordering::Relaxed);
            store_and_wake(&self.generation, generation.wrapping_add(1));
        } else {
            wait_while_eq(&self.generation, generation);
            // The release's store happened before the generation moved (SeqCst store,
            // Acquire load in the wait).
            let released = self.release_tsc.load(Ordering::Relaxed);
            add(&STATS.resume_ticks, sys::rdtsc().saturating_sub(released));
            add(&STATS.resumes, 1);
        }
    }
}
