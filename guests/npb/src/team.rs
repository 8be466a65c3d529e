//! What a kernel sees of the threads it runs on: its rank in a fork-join [`Team`], a
//! barrier, a clock, and an [`Arena`] of memory shared by the whole team.
//!
//! Every thread of a run calls the kernel's `run` with its own `Team` (same size,
//! different rank) and its own `Arena` over the *same* memory. Threads carve the arena
//! in the same order, so the same allocation has the same address on every thread:
//! that is how a kernel shares arrays without an allocator. Between two barriers a
//! thread writes only what it owns (its share of an array, its reduction slot) and
//! reads only what nobody writes; barriers order everything else.

use core::marker::PhantomData;
use core::ops::Range;

/// The runtime underneath a team: the guest's ring-3 runtime or host threads.
pub trait Runtime: Sync {
    /// Returns once every thread of the team has called it. Everything a thread wrote
    /// before the call is visible to every thread after it.
    fn barrier(&self);
    /// Seconds since a fixed origin common to all threads.
    fn seconds(&self) -> f64;
}

/// One thread's view of a fork-join run.
#[derive(Clone, Copy)]
pub struct Team<'a> {
    rank: usize,
    size: usize,
    runtime: &'a dyn Runtime,
}

impl<'a> Team<'a> {
    /// Thread `rank` of `size` (`rank < size`).
    pub fn new(rank: usize, size: usize, runtime: &'a dyn Runtime) -> Team<'a> {
        assert!(rank < size, "rank {rank} outside a team of {size}");
        Team {
            rank,
            size,
            runtime,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank 0 prints and times; its [`crate::Outcome`] is the run's.
    pub fn is_master(&self) -> bool {
        self.rank == 0
    }

    pub fn barrier(&self) {
        self.runtime.barrier();
    }

    pub fn seconds(&self) -> f64 {
        self.runtime.seconds()
    }

    /// This thread's contiguous block of `0..n` (blocks differ in size by at most one;
    /// a team larger than `n` leaves some threads an empty block).
    pub fn share(&self, n: usize) -> Range<usize> {
        block(n, self.rank, self.size)
    }
}

/// Block `part` of `parts` of `0..n`: balanced, contiguous, in order.
pub fn block(n: usize, part: usize, parts: usize) -> Range<usize> {
    let parts = parts.max(1);
    // u128: n * part cannot overflow.
    let at = |k: usize| ((n as u128 * k as u128) / parts as u128) as usize;
    at(part)..at(part + 1)
}

/// Types for which every bit pattern is a valid value, so arena memory (which holds
/// whatever the previous benchmark left there) can be viewed as them.
///
/// # Safety
/// Implement only for types with no invalid bit patterns and no padding-sensitive
/// invariants: integers, floats, and `repr(C)` aggregates of them.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}

// SAFETY: integers and floats accept every bit pattern.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for i64 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}
// SAFETY: as above.
unsafe impl Plain for usize {}
// SAFETY: as above.
unsafe impl Plain for f64 {}

/// Memory shared by a team, handed out front to back.
pub struct Arena {
    base: *mut u8,
    len: usize,
    used: usize,
}

/// Every allocation starts on its own cache line, so one thread's writes to the end of
/// an array never share a line with another array.
const ALIGN: usize = 64;

impl Arena {
    /// # Safety
    /// `base..base + len` must be valid for reads and writes for as long as any
    /// [`Shared`] carved from it is used, used by nothing but the team, and every
    /// thread of the team must carve its own `Arena` over the same memory in the same
    /// order.
    pub unsafe fn new(base: *mut u8, len: usize) -> Arena {
        Arena { base, len, used: 0 }
    }

    /// Bytes carved so far (alignment included).
    pub fn used(&self) -> usize {
        self.used
    }

    /// The next `len` values of `T`. Contents are whatever the memory held: kernels
    /// initialise what they read.
    ///
    /// # Panics
    /// If the arena is too small. The runtimes size it with
    /// [`crate::workload_heap_bytes`] and check that before forking, and each kernel's
    /// tests run it in an arena of exactly that size, so this is a kernel bug.
    pub fn alloc<T: Plain>(&mut self, len: usize) -> Shared<T> {
        let align = ALIGN.max(core::mem::align_of::<T>());
        let start = (self.base as usize + self.used).next_multiple_of(align) - self.base as usize;
        let bytes = len
            .checked_mul(core::mem::size_of::<T>())
            .expect("arena request overflows");
        let end = start.checked_add(bytes).expect("arena request overflows");
        assert!(
            end <= self.len,
            "arena of {} bytes exhausted: needs {end}",
            self.len
        );
        self.used = end;
        Shared {
            // SAFETY: start <= len, inside the region the caller vouched for.
            ptr: unsafe { self.base.add(start) }.cast(),
            len,
            _marker: PhantomData,
        }
    }
}

/// An array in the arena, visible to the whole team. Copy it freely; access is
/// `unsafe` because the phase discipline (module docs) is what makes it race-free.
pub struct Shared<T> {
    ptr: *mut T,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Shared<T> {}

// SAFETY: a view of memory shared on purpose; the accessors' contracts prevent races.
unsafe impl<T: Plain> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Plain> Sync for Shared<T> {}

impl<T: Plain> Shared<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads element `i`.
    ///
    /// # Safety
    /// No thread writes element `i` concurrently.
    pub unsafe fn get(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in bounds (checked); no concurrent write (the caller's contract).
        unsafe { self.ptr.add(i).read() }
    }

    /// Writes element `i`.
    ///
    /// # Safety
    /// No other thread reads or writes element `i` concurrently.
    pub unsafe fn set(&self, i: usize, value: T) {
        assert!(i < self.len);
        // SAFETY: in bounds (checked); exclusive (the caller's contract).
        unsafe { self.ptr.add(i).write(value) }
    }

    /// Reads `range`.
    ///
    /// # Safety
    /// No thread writes any element of `range` while the returned slice is alive.
    pub unsafe fn slice(&self, range: Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds (checked); the caller excludes concurrent writes; T: Plain
        // makes any contents a valid T.
        unsafe { core::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }

    /// Writes `range`.
    ///
    /// # Safety
    /// No other thread reads or writes any element of `range` while the returned slice
    /// is alive, and this thread holds no other slice overlapping it.
    #[allow(clippy::mut_from_ref)] // the caller's contract makes it exclusive
    pub unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }

    /// The whole array for reading.
    ///
    /// # Safety
    /// As [`Shared::slice`], for every element.
    pub unsafe fn all(&self) -> &[T] {
        // SAFETY: forwarded contract.
        unsafe { self.slice(0..self.len) }
    }

    /// The whole array for writing.
    ///
    /// # Safety
    /// As [`Shared::slice_mut`], for every element.
    #[allow(clippy::mut_from_ref)] // the caller's contract makes it exclusive
    pub unsafe fn all_mut(&self) -> &mut [T] {
        // SAFETY: forwarded contract.
        unsafe { self.slice_mut(0..self.len) }
    }
}

/// Sums one value per thread, in rank order, so the result is the same bits on every
/// thread and does not depend on which thread finished first.
#[derive(Clone, Copy)]
pub struct Reduction {
    slots: Shared<f64>,
}

/// Reduction slots are this many `f64`s apart: one cache line each.
const SLOT_STRIDE: usize = ALIGN / core::mem::size_of::<f64>();

impl Reduction {
    /// Carves the slots for a team of `threads`.
    pub fn new(arena: &mut Arena, threads: usize) -> Reduction {
        Reduction {
            slots: arena.alloc(threads * SLOT_STRIDE * 2),
        }
    }

    /// Arena bytes [`Reduction::new`] takes for `threads` (alignment included).
    pub const fn bytes(threads: usize) -> usize {
        threads * SLOT_STRIDE * 2 * core::mem::size_of::<f64>() + ALIGN
    }

    /// Every thread passes its value; every thread gets the rank-ordered sum.
    /// Contains two barriers, so it also orders memory like [`Team::barrier`].
    pub fn sum(&self, team: &Team, value: f64) -> f64 {
        self.sum2(team, value, 0.0).0
    }

    /// Two sums for the price of one: `(Σ a, Σ b)`.
    pub fn sum2(&self, team: &Team, a: f64, b: f64) -> (f64, f64) {
        let [a, b] = self.sums(team, [a, b]);
        (a, b)
    }

    /// Up to 16 sums at once, element by element, each in rank order.
    pub fn sums<const N: usize>(&self, team: &Team, values: [f64; N]) -> [f64; N] {
        const { assert!(N <= SLOT_STRIDE * 2, "a thread has 16 reduction slots") };
        let slot = team.rank() * SLOT_STRIDE * 2;
        // SAFETY: slots `slot..slot+N` belong to this thread until the barrier.
        unsafe { self.slots.slice_mut(slot..slot + N) }.copy_from_slice(&values);
        team.barrier();
        let mut total = [0.0; N];
        for rank in 0..team.size() {
            let at = rank * SLOT_STRIDE * 2;
            // SAFETY: every thread wrote its slots before the barrier above and nobody
            // writes any until the barrier below, so reading another's is race-free.
            let part = unsafe { self.slots.slice(at..at + N) };
            for (t, p) in total.iter_mut().zip(part) {
                *t += p;
            }
        }
        // Nobody may overwrite a slot for the next reduction before all have read.
        team.barrier();
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_range_in_order() {
        for n in [0usize, 1, 7, 64, 1000] {
            for parts in 1..=9 {
                let mut next = 0;
                for part in 0..parts {
                    let b = block(n, part, parts);
                    assert_eq!(b.start, next);
                    assert!(b.len() <= n.div_ceil(parts));
                    next = b.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn arena_aligns_and_counts() {
        let mut memory = [0u64; 64];
        // SAFETY: a local buffer used only here.
        let mut arena = unsafe { Arena::new(memory.as_mut_ptr().cast(), 512) };
        let a: Shared<u8> = arena.alloc(3);
        let b: Shared<f64> = arena.alloc(4);
        assert_eq!(b.ptr as usize % 64, 0);
        assert!(b.ptr as usize >= a.ptr as usize + 3);
        assert!(arena.used() <= 512);
    }

    #[test]
    #[should_panic(expected = "exhausted")]
    fn arena_refuses_to_overflow() {
        let mut memory = [0u64; 8];
        // SAFETY: a local buffer used only here.
        let mut arena = unsafe { Arena::new(memory.as_mut_ptr().cast(), 64) };
        let _: Shared<f64> = arena.alloc(9);
    }
}
