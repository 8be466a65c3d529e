//! vCPU ballooning, the guest's half: a team's ranks run as green threads on fewer
//! carriers (vCPUs) than ranks, as many as the host says it has CPUs for.
//!
//! A kernel's `run` is SPMD with barriers inside, so a rank can only pause at a barrier
//! if it has a stack of its own: each rank gets one, and [`Team::barrier`] becomes a
//! switch back to the carrier that resumed it (a few dozen instructions in ring 3).
//! A carrier runs each of its ranks up to the next barrier, then meets the other
//! carriers at a barrier of carriers; only there does anyone wait, spin or sleep. With
//! `T` ranks on `A` carriers a barrier costs `A` waits instead of `T`, and carriers
//! beyond `A` stay parked (one sleep each, not one per barrier).
//!
//! Ranks, their partitioning and their reduction order are those of a team of `T`
//! threads, so results are bit for bit the same as without the balloon. Rank `r` runs
//! on carrier `r mod A`. `A` is taken from [`Carrier::target`] at every barrier (by the
//! carrier that releases it) and travels with the release, packed into the barrier's
//! word, so every carrier agrees on which ranks are whose in the next phase; parked
//! carriers sleep on a separate word that moves only when `A` changes.
//!
//! This is the technique the literature calls vCPU ballooning (VCPU-Bal: give a VM as
//! many vCPUs as it has physical CPUs), done inside the guest's runtime rather than by
//! hot-unplugging vCPUs: the team keeps its size.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use crate::team::Runtime;

/// Most ranks (and carriers) a team may have: the guest's CPU limit.
pub const MAX_RANKS: usize = 64;
/// Bits of the barrier word that hold the carrier count (the rest count generations).
const PLAN_BITS: u32 = 8;
const PLAN_MASK: u32 = (1 << PLAN_BITS) - 1;
const _: () = assert!(MAX_RANKS as u32 <= PLAN_MASK);

/// What the balloon needs from the platform underneath: waiting on a word, waking its
/// waiters, the host's CPU count and a clock.
pub trait Carrier: Sync {
    /// Returns once `word != value`, at a barrier of carriers (spinning as long as
    /// the platform finds worth it: the carriers have host CPUs, but maybe shared).
    fn wait_at_barrier(&self, word: &AtomicU32, value: u32);
    /// Returns once `word != value`, parked: it may be long, so sleep at once.
    fn wait_parked(&self, word: &AtomicU32, value: u32);
    /// Stores `value` into `word` and wakes those waiting on it.
    fn store_and_wake(&self, word: &AtomicU32, value: u32);
    /// How many carriers the team should run on now; clamped to `1..=ranks`.
    fn target(&self) -> u32;
    /// Seconds since a fixed origin common to all carriers.
    fn seconds(&self) -> f64;
    /// Called once per barrier of carriers, by the one releasing it (for statistics).
    fn released(&self) {}
}

/// The body every rank runs: its rank and the runtime to build its `Team` over.
pub type Body<'a> = dyn Fn(usize, &dyn Runtime) + Sync + 'a;

/// One rank's green thread.
struct Rank {
    /// Saved stack pointer while it is not running.
    rsp: UnsafeCell<usize>,
    /// The carrier running it (where its barrier switches back to).
    carrier: UnsafeCell<usize>,
    done: AtomicBool,
}

/// A team of green threads and the carriers that run them. One per runtime, reused by
/// every run ([`Balloon::prepare`] resets it).
pub struct Balloon {
    ranks: [Rank; MAX_RANKS],
    /// Each carrier's saved stack pointer while one of its ranks runs.
    carriers: [UnsafeCell<usize>; MAX_RANKS],
    size: AtomicUsize,
    /// Most carriers that may run ranks: those that exist, at most one per rank.
    most: AtomicUsize,
    /// The barrier of carriers: generation << PLAN_BITS | carriers in the next phase.
    word: AtomicU32,
    arrived: AtomicU32,
    /// Moves whenever the carrier count changes or the team ends: parked carriers
    /// sleep on it.
    seq: AtomicU32,
    finished: AtomicU32,
    ended: AtomicBool,
    /// The run's platform and body, lifetimes erased (see `prepare`'s contract).
    job: UnsafeCell<Option<(*const dyn Carrier, *const Body<'static>)>>,
}

// SAFETY: the cells are written by `prepare` before any carrier runs (the caller's
// contract), and each rank's cells only by the one carrier running it, handed over at
// barriers whose atomics order the accesses; carriers' slots only by their own carrier.
unsafe impl Sync for Balloon {}

impl Default for Balloon {
    fn default() -> Self {
        Self::new()
    }
}

impl Balloon {
    pub const fn new() -> Balloon {
        Balloon {
            ranks: [const {
                Rank {
                    rsp: UnsafeCell::new(0),
                    carrier: UnsafeCell::new(0),
                    done: AtomicBool::new(true),
                }
            }; MAX_RANKS],
            carriers: [const { UnsafeCell::new(0) }; MAX_RANKS],
            size: AtomicUsize::new(0),
            most: AtomicUsize::new(1),
            word: AtomicU32::new(0),
            arrived: AtomicU32::new(0),
            seq: AtomicU32::new(0),
            finished: AtomicU32::new(0),
            ended: AtomicBool::new(true),
            job: UnsafeCell::new(None),
        }
    }

    /// Sets up `ranks` green threads that will each run `body(rank, runtime)` on its
    /// own `stack_bytes` of `stacks`, carried by up to `carriers` carriers (each of
    /// `0..carriers` must call [`Balloon::carry`]).
    ///
    /// # Safety
    /// No carrier may be in [`Balloon::carry`] while this runs, and every call to it
    /// that follows must happen after this one (a barrier between). `stacks` must be
    /// valid for writes of `ranks * stack_bytes` bytes and used by nothing else, and
    /// `stacks`, `carrier` and `body` must outlive every `carry` of this run.
    pub unsafe fn prepare(
        &self,
        ranks: usize,
        carriers: usize,
        stacks: *mut u8,
        stack_bytes: usize,
        carrier: &dyn Carrier,
        body: &Body<'_>,
    ) {
        assert!(
            (1..=MAX_RANKS).contains(&ranks),
            "a balloon holds 1 to {MAX_RANKS} ranks, not {ranks}"
        );
        assert!(stack_bytes >= 4096, "green stacks of {stack_bytes} bytes");
        // SAFETY: the caller promises both outlive the run; the erased lifetimes are
        // only used while it lasts.
        let job = unsafe {
            (
                core::mem::transmute::<*const dyn Carrier, *const dyn Carrier>(carrier),
                core::mem::transmute::<*const Body<'_>, *const Body<'static>>(body),
            )
        };
        // SAFETY: no carrier runs (the caller's contract), so nothing reads the cell.
        unsafe { *self.job.get() = Some(job) };
        for rank in 0..ranks {
            let base = stacks as usize + rank * stack_bytes;
            let top = (base + stack_bytes) & !15;
            // SAFETY: the frame lies inside this rank's stack, ours alone.
            unsafe { *self.ranks[rank].rsp.get() = initial_frame(top, self, rank) };
            self.ranks[rank].done.store(false, Ordering::Relaxed);
        }
        self.size.store(ranks, Ordering::Relaxed);
        self.most.store(carriers.clamp(1, ranks), Ordering::Relaxed);
        self.arrived.store(0, Ordering::Relaxed);
        self.finished.store(0, Ordering::Relaxed);
        self.ended.store(false, Ordering::Relaxed);
        let generation = self.word.load(Ordering::Relaxed) >> PLAN_BITS;
        let plan = self.clamp_plan(carrier.target());
        self.word
            .store(pack(generation.wrapping_add(1), plan), Ordering::SeqCst);
    }

    /// Carrier `me`'s part of the run: returns once the ranks it was last given are
    /// done (or, parked, once the whole team is).
    pub fn carry(&self, me: usize) {
        loop {
            let Some(word) = self.park_until_needed(me) else {
                return;
            };
            let plan = (word & PLAN_MASK) as usize;
            let mut at_barrier = false;
            for rank in ranks_of(me, plan, self.size.load(Ordering::Relaxed)) {
                if !self.ranks[rank].done.load(Ordering::Acquire) {
                    self.resume(me, rank);
                    at_barrier |= !self.ranks[rank].done.load(Ordering::Acquire);
                }
            }
            if !at_barrier {
                return;
            }
            self.barrier(word);
        }
    }

    /// The barrier word once this carrier has ranks under it; `None` once the team
    /// has ended.
    fn park_until_needed(&self, me: usize) -> Option<u32> {
        loop {
            // Read before the checks: a change after them moves it, ending the wait.
            let seq = self.seq.load(Ordering::SeqCst);
            if self.ended.load(Ordering::SeqCst) {
                return None;
            }
            let word = self.word.load(Ordering::SeqCst);
            // A carrier counted in the word's plan is needed for the next barrier,
            // which therefore cannot pass before it arrives: the word is current.
            if me < (word & PLAN_MASK) as usize {
                return Some(word);
            }
            self.platform().wait_parked(&self.seq, seq);
        }
    }

    /// The barrier of the carriers running `word`'s phase. The last to arrive reads the
    /// carrier count for the next phase and releases with it.
    fn barrier(&self, word: u32) {
        let plan = word & PLAN_MASK;
        let platform = self.platform();
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == plan {
            // Last: nobody arrives again before the word moves on.
            self.arrived.store(0, Ordering::Relaxed);
            let next = self.clamp_plan(platform.target());
            platform.released();
            platform.store_and_wake(&self.word, pack((word >> PLAN_BITS).wrapping_add(1), next));
            if next != plan {
                self.bump_seq();
            }
        } else {
            platform.wait_at_barrier(&self.word, word);
        }
    }

    /// The host's target as a carrier count: at least one, at most one per rank and
    /// no more than there are carriers.
    fn clamp_plan(&self, target: u32) -> u32 {
        target.clamp(1, self.most.load(Ordering::Relaxed) as u32)
    }

    fn bump_seq(&self) {
        let next = self.seq.load(Ordering::SeqCst).wrapping_add(1);
        self.platform().store_and_wake(&self.seq, next);
    }

    fn platform(&self) -> &dyn Carrier {
        self.job().0
    }

    /// The run's platform and body.
    fn job(&self) -> (&dyn Carrier, &Body<'_>) {
        // SAFETY: written by `prepare` before any carrier or rank runs and not again
        // during the run; both pointees outlive the run (its contract).
        unsafe {
            let (carrier, body) = (*self.job.get()).expect("a balloon used before prepare");
            (&*carrier, &*body)
        }
    }

    /// Runs `rank` on carrier `me` until its next barrier or its end.
    fn resume(&self, me: usize, rank: usize) {
        let slot = &self.ranks[rank];
        // SAFETY: the rank is suspended (at a barrier every carrier has passed, or not
        // started) and assigned to `me` alone for this phase; its saved frame is on its
        // own stack. The switch saves this carrier's frame in its own slot.
        unsafe {
            *slot.carrier.get() = me;
            green_switch(self.carriers[me].get(), *slot.rsp.get());
        }
    }

    /// Called on `rank`'s own stack: back to its carrier until resumed.
    fn suspend(&self, rank: usize) {
        let slot = &self.ranks[rank];
        // SAFETY: `rank` is running on the carrier recorded in its slot, whose frame
        // that carrier saved when it resumed the rank.
        unsafe {
            let carrier = *slot.carrier.get();
            green_switch(slot.rsp.get(), *self.carriers[carrier].get());
        }
    }

    /// `rank`'s body returned: mark it and leave its stack for good.
    fn finish(&self, rank: usize) -> ! {
        self.ranks[rank].done.store(true, Ordering::Release);
        let size = self.size.load(Ordering::Relaxed) as u32;
        if self.finished.fetch_add(1, Ordering::AcqRel) + 1 == size {
            self.ended.store(true, Ordering::SeqCst);
            self.bump_seq();
        }
        self.suspend(rank);
        unreachable!("a finished green thread was resumed");
    }
}

/// The ranks carrier `me` runs when `plan` carriers share `size` ranks: `me`,
/// `me + plan`, ... (none if `me` is parked).
pub fn ranks_of(me: usize, plan: usize, size: usize) -> impl Iterator<Item = usize> {
    let start = if me < plan { me } else { size };
    (start..size).step_by(plan.max(1))
}

/// The next spin of an adaptive barrier wait (as adaptive mutexes do): the carriers
/// have host CPUs of their own unless something else on the host takes them, and a
/// spin pays only in the first case. After a wait that ended while spinning, double
/// the spin (up to `max`); after one that had to sleep, halve it, down to `max / 64`
/// (so that it can grow again when the CPUs are back).
pub fn next_spin(spin: u64, slept: bool, max: u64) -> u64 {
    let next = if slept {
        spin / 2
    } else {
        spin.saturating_mul(2)
    };
    next.clamp(max / 64, max)
}

fn pack(generation: u32, plan: u32) -> u32 {
    (generation << PLAN_BITS) | plan
}

/// The `Runtime` each rank's `Team` sees: barriers are switches to its carrier.
struct RankRuntime<'a> {
    balloon: &'a Balloon,
    rank: usize,
}

impl Runtime for RankRuntime<'_> {
    fn barrier(&self) {
        self.balloon.suspend(self.rank);
    }

    fn seconds(&self) -> f64 {
        self.balloon.platform().seconds()
    }
}

/// Where every green thread starts (from `green_start`): runs its body, then ends.
extern "C" fn rank_main(balloon: *const Balloon, rank: usize) -> ! {
    // SAFETY: `prepare` put a live balloon's address in the frame; it outlives the run.
    let balloon = unsafe { &*balloon };
    let body = balloon.job().1;
    body(rank, &RankRuntime { balloon, rank });
    balloon.finish(rank)
}

/// Default MXCSR (all exceptions masked, round to nearest) and x87 control word, as a
/// thread starts with them.
const MXCSR_DEFAULT: u32 = 0x1f80;
const FCW_DEFAULT: u16 = 0x037f;

/// Writes the frame `green_switch` pops for a thread that has not run yet, below
/// `top` (16-aligned), and returns its stack pointer.
///
/// # Safety
/// `top - 64 .. top` must be writable memory of the rank's own stack.
unsafe fn initial_frame(top: usize, balloon: &Balloon, rank: usize) -> usize {
    let frame = (top - 64) as *mut u64;
    let words: [u64; 8] = [
        u64::from(MXCSR_DEFAULT) | (u64::from(FCW_DEFAULT) << 32),
        0,                                // r15
        0,                                // r14
        rank as u64,                      // r13: green_start's second argument
        balloon as *const Balloon as u64, // r12: its first
        0,                                // rbx
        0,                                // rbp
        green_start as *const () as u64,  // return address: where `ret` lands
    ];
    for (i, word) in words.iter().enumerate() {
        // SAFETY: inside the rank's stack (the caller's contract), 8-aligned.
        unsafe { frame.add(i).write(*word) };
    }
    frame as usize
}

unsafe extern "C" {
    #[link_name = "npb_green_switch"]
    /// Saves the callee-saved registers, MXCSR and the x87 control word on the current
    /// stack, stores the stack pointer at `save`, then loads `next` and restores the
    /// same from there.
    fn green_switch(save: *mut usize, next: usize);
    /// First instructions of a green thread: `rank_main(r12, r13)`, stack aligned.
    #[link_name = "npb_green_start"]
    fn green_start();
}

// After `ret` into green_start the stack pointer is `top` (16-aligned), as a call
// instruction expects before it pushes its return address.
core::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl npb_green_switch",
    "npb_green_switch:",
    "push rbp",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "sub rsp, 8",
    "stmxcsr [rsp]",
    "fnstcw [rsp + 4]",
    "mov [rdi], rsp",
    "mov rsp, rsi",
    "ldmxcsr [rsp]",
    "fldcw [rsp + 4]",
    "add rsp, 8",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl npb_green_start",
    "npb_green_start:",
    "mov rdi, r12",
    "mov rsi, r13",
    "call {main}",
    "ud2",
    main = sym rank_main,
);

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::team::{Arena, Team};
    use crate::{Class, Kernel, Spec};
    use std::sync::Mutex;
    use std::time::Instant;
    use std::vec;
    use std::vec::Vec;

    /// Host threads as carriers: spin-yield waits, and a target that follows a
    /// schedule (one entry per barrier, the last repeated) to move ranks around.
    struct HostCarrier {
        schedule: Vec<u32>,
        calls: AtomicUsize,
        origin: Instant,
        releases: AtomicUsize,
    }

    impl HostCarrier {
        fn new(schedule: &[u32]) -> HostCarrier {
            HostCarrier {
                schedule: schedule.to_vec(),
                calls: AtomicUsize::new(0),
                origin: Instant::now(),
                releases: AtomicUsize::new(0),
            }
        }
    }

    impl Carrier for HostCarrier {
        fn wait_at_barrier(&self, word: &AtomicU32, value: u32) {
            while word.load(Ordering::SeqCst) == value {
                std::thread::yield_now();
            }
        }
        fn wait_parked(&self, word: &AtomicU32, value: u32) {
            self.wait_at_barrier(word, value);
        }
        fn store_and_wake(&self, word: &AtomicU32, value: u32) {
            word.store(value, Ordering::SeqCst);
        }
        fn target(&self) -> u32 {
            let call = self.calls.fetch_add(1, Ordering::Relaxed);
            self.schedule[call.min(self.schedule.len() - 1)]
        }
        fn seconds(&self) -> f64 {
            self.origin.elapsed().as_secs_f64()
        }
        fn released(&self) {
            self.releases.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Host debug builds use far more stack than the guest's release build.
    const STACK: usize = 2 << 20;

    /// Runs `body` as `ranks` green threads on `carriers` host threads.
    fn run(ranks: usize, carriers: usize, platform: &HostCarrier, body: &Body<'_>) {
        let balloon = std::boxed::Box::new(Balloon::new());
        let mut stacks = vec![0u8; ranks * STACK];
        // SAFETY: no carrier runs yet; the stacks, platform and body outlive the scope
        // in which the carriers run.
        unsafe { balloon.prepare(ranks, carriers, stacks.as_mut_ptr(), STACK, platform, body) };
        std::thread::scope(|scope| {
            for me in 0..carriers {
                let balloon = &balloon;
                scope.spawn(move || balloon.carry(me));
            }
        });
        assert!(balloon.ended.load(Ordering::SeqCst));
    }

    #[test]
    fn the_spin_halves_after_sleeps_and_doubles_back_within_its_bounds() {
        let max = 6400;
        let mut spin = max;
        for _ in 0..20 {
            spin = next_spin(spin, true, max);
        }
        assert_eq!(spin, 100, "floor is max / 64");
        spin = next_spin(spin, false, max);
        assert_eq!(spin, 200);
        for _ in 0..20 {
            spin = next_spin(spin, false, max);
        }
        assert_eq!(spin, max);
        assert_eq!(next_spin(0, false, 0), 0, "no spin stays none");
        assert_eq!(next_spin(u64::MAX, false, u64::MAX), u64::MAX);
    }

    #[test]
    fn every_rank_belongs_to_exactly_one_active_carrier() {
        for size in 1..=12 {
            for plan in 1..=size {
                let mut owner = vec![None; size];
                for me in 0..size + 2 {
                    for rank in ranks_of(me, plan, size) {
                        assert!(me < plan, "parked carrier {me} got rank {rank}");
                        assert_eq!(owner[rank], None, "rank {rank} twice");
                        owner[rank] = Some(me);
                    }
                }
                assert!(owner.iter().all(Option::is_some), "{size} ranks on {plan}");
            }
        }
    }

    /// Which carrier ran each rank in each phase, and a check that a barrier orders
    /// every rank's writes, whatever the carrier count does meanwhile.
    fn barriers_hold(ranks: usize, carriers: usize, schedule: &[u32]) -> Vec<Vec<usize>> {
        const PHASES: usize = 60;
        let counter = AtomicUsize::new(0);
        let seen = Mutex::new(vec![vec![usize::MAX; ranks]; PHASES]);
        let carrier_of = |team_rank: usize| {
            // The current thread's carrier: its name was set by `run`'s spawn order.
            let _ = team_rank;
            std::thread::current().id()
        };
        let ids = Mutex::new(Vec::new());
        let platform = HostCarrier::new(schedule);
        let body = |rank: usize, runtime: &dyn Runtime| {
            let team = Team::new(rank, ranks, runtime);
            for phase in 0..PHASES {
                counter.fetch_add(1, Ordering::Relaxed);
                let id = carrier_of(rank);
                let mut ids = ids.lock().unwrap();
                let index = match ids.iter().position(|&i| i == id) {
                    Some(i) => i,
                    None => {
                        ids.push(id);
                        ids.len() - 1
                    }
                };
                drop(ids);
                seen.lock().unwrap()[phase][rank] = index;
                team.barrier();
                // Every rank added for this phase before anyone passed.
                assert!(counter.load(Ordering::Relaxed) >= ranks * (phase + 1));
                team.barrier();
            }
        };
        run(ranks, carriers, &platform, &body);
        assert_eq!(counter.load(Ordering::Relaxed), ranks * PHASES);
        assert_eq!(platform.releases.load(Ordering::Relaxed), 2 * PHASES);
        seen.into_inner().unwrap()
    }

    #[test]
    fn twelve_ranks_share_two_carriers_at_every_barrier() {
        let seen = barriers_hold(12, 2, &[2]);
        for phase in &seen {
            let used: std::collections::BTreeSet<_> = phase.iter().collect();
            assert!(used.len() <= 2, "{phase:?}");
            // Ranks of one parity always share a carrier.
            assert!((0..12).all(|r| phase[r] == phase[r % 2]), "{phase:?}");
        }
    }

    #[test]
    fn carriers_beyond_the_target_stay_parked() {
        let seen = barriers_hold(6, 5, &[1]);
        assert!(seen.iter().flatten().all(|&c| c == seen[0][0]), "{seen:?}");
    }

    #[test]
    fn the_carrier_count_may_change_at_any_barrier() {
        // Up, down to one, up past the ranks (clamped), down again.
        let schedule = [2, 2, 4, 4, 1, 1, 3, 9, 9, 2, 5, 1, 4];
        let seen = barriers_hold(7, 6, &schedule);
        let counts: Vec<usize> = seen
            .iter()
            .map(|p| p.iter().collect::<std::collections::BTreeSet<_>>().len())
            .collect();
        assert!(
            counts.contains(&1) && counts.iter().any(|&c| c >= 4),
            "{counts:?}"
        );
        assert!(counts.iter().all(|&c| c <= 6), "{counts:?}");
    }

    fn outcome_on(spec: Spec, ranks: usize, carriers: usize, schedule: &[u32]) -> crate::Outcome {
        let bytes = crate::workload_heap_bytes(spec, ranks as u32) as usize;
        let mut memory = vec![0u64; bytes / 8 + 16];
        let base = (memory.as_mut_ptr() as usize).next_multiple_of(64);
        let result = Mutex::new(None);
        let platform = HostCarrier::new(schedule);
        let body = |rank: usize, runtime: &dyn Runtime| {
            let team = Team::new(rank, ranks, runtime);
            // SAFETY: `memory` outlives the run; every rank carves it the same way.
            let mut arena = unsafe { Arena::new(base as *mut u8, bytes) };
            let outcome = crate::run(spec, &team, &mut arena);
            if rank == 0 {
                *result.lock().unwrap() = Some(outcome);
            }
        };
        run(ranks, carriers, &platform, &body);
        drop(memory);
        result.into_inner().unwrap().expect("rank 0 reported")
    }

    #[test]
    fn kernels_give_the_same_bits_as_a_team_of_threads() {
        for kernel in [Kernel::Cg, Kernel::Mg, Kernel::Is, Kernel::Ep] {
            let spec = Spec {
                kernel,
                class: Class::S,
            };
            let threads = crate::host::run(spec, 12);
            for (carriers, schedule) in [(2, &[2][..]), (4, &[2, 4, 1, 3, 4, 2][..])] {
                let green = outcome_on(spec, 12, carriers, schedule);
                assert!(green.verified, "{spec} on {carriers}: {green:?}");
                assert_eq!(green.values, threads.values, "{spec} on {carriers}");
            }
        }
    }
}
