//! EP, the "embarrassingly parallel" kernel: Gaussian pairs by the Marsaglia polar
//! method, counted in square annuli, summed.
//!
//! Structured for fork-join: [`run_batches`] is one thread's share (a range of
//! batches), [`combine`] folds the partial results in thread order (deterministic for
//! a given thread count), [`verify`] checks against the official sums.

use core::ops::Range;

use crate::random::{self, A};
use crate::team::{Arena, Plain, Team};
use crate::{Class, Outcome, Values};

/// log2 of the pairs per batch (`MK` in the reference).
pub const MK: u32 = 16;
/// Pairs per batch.
pub const PAIRS_PER_BATCH: usize = 1 << MK;
/// Random numbers consumed per batch (two per pair).
pub const NUMBERS_PER_BATCH: usize = 2 * PAIRS_PER_BATCH;
/// Number of annuli counted.
pub const NQ: usize = 10;
/// EP's seed.
pub const SEED: u64 = 271_828_183;
/// Relative error allowed against the official sums.
pub const EPSILON: f64 = 1.0e-8;

/// `M`: the class generates `2^(M+1)` random numbers.
pub fn m(class: Class) -> u32 {
    match class {
        Class::S => 24,
        Class::W => 25,
        Class::A => 28,
        Class::B => 30,
        Class::C => 32,
    }
}

/// The official `(sx, sy)` of a class.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference_sums(class: Class) -> (f64, f64) {
    match class {
        Class::S => (-3.247_834_652_034_740e3, -6.958_407_078_382_297e3),
        Class::W => (-2.863_319_731_645_753e3, -6.320_053_679_109_499e3),
        Class::A => (-4.295_875_165_629_892e3, -1.580_732_573_678_431e4),
        Class::B => (4.033_815_542_441_498e4, -2.660_669_192_809_235e4),
        Class::C => (4.764_367_927_995_374e4, -8.084_072_988_043_731e4),
    }
}

/// Batches of a problem of size `m` (`NN` in the reference); `m >= MK`.
pub fn batches(m: u32) -> u64 {
    1 << (m - MK)
}

/// The batches thread `thread` of `threads` computes: contiguous, balanced ranges.
pub fn batch_range(total: u64, thread: u32, threads: u32) -> Range<u64> {
    let (t, n) = (u64::from(thread), u64::from(threads.max(1)));
    (total * t / n)..(total * (t + 1) / n)
}

/// Scratch each thread needs (`x` in the reference), in `f64`s.
pub const SCRATCH_LEN: usize = NUMBERS_PER_BATCH;

/// One thread's (or the whole run's) sums and annulus counts.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Partial {
    pub sx: f64,
    pub sy: f64,
    pub q: [u64; NQ],
}

impl Partial {
    pub const ZERO: Partial = Partial {
        sx: 0.0,
        sy: 0.0,
        q: [0; NQ],
    };

    /// Gaussian pairs counted (`gc` in the reference).
    pub fn pairs(&self) -> u64 {
        self.q.iter().sum()
    }
}

/// Computes batches `range` (0-based batch numbers) with `scratch` of at least
/// [`SCRATCH_LEN`] values.
pub fn run_batches(range: Range<u64>, scratch: &mut [f64]) -> Partial {
    let x = &mut scratch[..NUMBERS_PER_BATCH];
    // Each batch consumes 2^(MK+1) numbers, so batch k starts at SEED * an^k.
    let an = random::pow_mod(A, NUMBERS_PER_BATCH as u64);
    let mut out = Partial::ZERO;
    for k in range {
        let mut state = random::mul_mod(SEED, random::pow_mod(an, k));
        random::vranlc(x, &mut state, A);
        for pair in x.chunks_exact(2) {
            let x1 = 2.0 * pair[0] - 1.0;
            let x2 = 2.0 * pair[1] - 1.0;
            let t1 = x1 * x1 + x2 * x2;
            if t1 <= 1.0 {
                let t2 = libm::sqrt(-2.0 * libm::log(t1) / t1);
                let t3 = x1 * t2;
                let t4 = x2 * t2;
                // Truncation toward zero, as the reference's int(); never >= NQ in
                // practice (it would need t1 < e^-50), clamped so it cannot panic.
                let l = (libm::fabs(t3).max(libm::fabs(t4)) as usize).min(NQ - 1);
                out.q[l] += 1;
                out.sx += t3;
                out.sy += t4;
            }
        }
    }
    out
}

// SAFETY: repr(C) floats and integers, no padding; every bit pattern is a value.
unsafe impl Plain for Partial {}

/// One thread's part of a team run: its share of the batches, then (on the master)
/// the rank-ordered combine, timed from the first barrier to the last as NPB times EP.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let scratch = arena.alloc::<f64>(SCRATCH_LEN * team.size());
    let parts = arena.alloc::<Partial>(team.size());
    let rank = team.rank();
    team.barrier();
    let start = team.seconds();
    // SAFETY: each thread owns its scratch block and its own result slot until the
    // barrier; the master reads every slot only after it.
    let scratch = unsafe { scratch.slice_mut(rank * SCRATCH_LEN..(rank + 1) * SCRATCH_LEN) };
    let range = batch_range(batches(m(class)), rank as u32, team.size() as u32);
    let part = run_batches(range, scratch);
    // SAFETY: slot `rank` is this thread's alone (see above).
    unsafe { parts.set(rank, part) };
    team.barrier();
    let seconds = team.seconds() - start;
    // SAFETY: no thread writes `parts` after the barrier.
    let total = combine(unsafe { parts.all() });
    let mut values = Values::new();
    values.push("sx", total.sx);
    values.push("sy", total.sy);
    values.push("pairs", total.pairs() as f64);
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: verify(class, &total),
        values,
    }
}

/// Folds partial results in slice (thread) order.
pub fn combine(parts: &[Partial]) -> Partial {
    let mut total = Partial::ZERO;
    for part in parts {
        total.sx += part.sx;
        total.sy += part.sy;
        for (sum, count) in total.q.iter_mut().zip(part.q) {
            *sum += count;
        }
    }
    total
}

/// Whether `result` matches the class's official sums within [`EPSILON`].
pub fn verify(class: Class, result: &Partial) -> bool {
    let (sx, sy) = reference_sums(class);
    let sx_err = libm::fabs((result.sx - sx) / sx);
    let sy_err = libm::fabs((result.sy - sy) / sy);
    // Written so that NaN fails.
    sx_err <= EPSILON && sy_err <= EPSILON
}

/// Mop/s as the reference reports it: `2^(M+1) / t / 1e6`.
pub fn mops(class: Class, seconds: f64) -> f64 {
    (1u64 << (m(class) + 1)) as f64 / seconds / 1.0e6
}

/// Arena bytes [`run`] needs with `threads` threads (one scratch array and one result
/// slot each, and alignment).
pub fn heap_bytes(threads: usize) -> usize {
    threads * (SCRATCH_LEN * core::mem::size_of::<f64>() + core::mem::size_of::<Partial>()) + 128
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;

    /// A straightforward serial EP written from the specification, sharing nothing with
    /// the code under test but `libm`: one stream stepped number by number with u128
    /// arithmetic, no jump-ahead, no batches.
    fn serial_ep(m: u32) -> Partial {
        let modulus: u128 = 1 << 46;
        let mut x: u128 = 271_828_183;
        let mut next = || {
            x = x * 1_220_703_125 % modulus;
            x as f64 / modulus as f64
        };
        let mut out = Partial::ZERO;
        for _ in 0..(1u64 << m) {
            let x1 = 2.0 * next() - 1.0;
            let x2 = 2.0 * next() - 1.0;
            let t1 = x1 * x1 + x2 * x2;
            if t1 <= 1.0 {
                let t2 = libm::sqrt(-2.0 * libm::log(t1) / t1);
                let (t3, t4) = (x1 * t2, x2 * t2);
                let l = if t3.abs() > t4.abs() {
                    t3.abs()
                } else {
                    t4.abs()
                };
                out.q[l as usize] += 1;
                out.sx += t3;
                out.sy += t4;
            }
        }
        out
    }

    fn run_threads(m: u32, threads: u32) -> Partial {
        let mut scratch = vec![0.0; SCRATCH_LEN];
        let total = batches(m);
        let parts: Vec<Partial> = (0..threads)
            .map(|t| run_batches(batch_range(total, t, threads), &mut scratch))
            .collect();
        combine(&parts)
    }

    #[test]
    fn small_problem_matches_serial_reimplementation() {
        // M = 18: four batches, not an official size.
        let expected = serial_ep(18);
        let got = run_threads(18, 1);
        // One thread sums in the same order as the serial version: bit-identical.
        assert_eq!(got, expected);
        assert!(got.pairs() > 0);
        let split = run_threads(18, 3);
        assert_eq!(split.q, expected.q);
        assert!(((split.sx - expected.sx) / expected.sx).abs() < 1e-12);
        assert!(((split.sy - expected.sy) / expected.sy).abs() < 1e-12);
    }

    #[test]
    fn class_s_verifies() {
        let result = run_threads(m(Class::S), 1);
        assert!(verify(Class::S, &result), "{result:?}");
        // The reference's own class S count of Gaussian pairs.
        assert_eq!(result.pairs(), 13_176_389);
    }

    #[test]
    fn class_s_parallel_split_verifies_for_1_to_4_threads() {
        let one = run_threads(m(Class::S), 1);
        for threads in 2..=4 {
            let result = run_threads(m(Class::S), threads);
            assert!(verify(Class::S, &result), "{threads} threads: {result:?}");
            assert_eq!(result.q, one.q, "{threads} threads");
        }
    }

    #[test]
    fn verify_rejects_wrong_sums() {
        let (sx, sy) = reference_sums(Class::S);
        let good = Partial { sx, sy, q: [0; NQ] };
        assert!(verify(Class::S, &good));
        assert!(!verify(Class::W, &good));
        assert!(!verify(
            Class::S,
            &Partial {
                sx: sx * (1.0 + 1e-7),
                ..good
            }
        ));
        assert!(!verify(
            Class::S,
            &Partial {
                sy: f64::NAN,
                ..good
            }
        ));
    }

    #[test]
    fn batch_ranges_cover_every_batch_once() {
        for total in [1u64, 4, 7, 512] {
            for threads in 1..=5 {
                let mut next = 0;
                for t in 0..threads {
                    let r = batch_range(total, t, threads);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn mops_formula() {
        // Class S: 2^25 numbers in 1 s = 33.554432 Mop/s.
        assert!((mops(Class::S, 1.0) - 33.554_432).abs() < 1e-9);
        assert!((mops(Class::W, 2.0) - 33.554_432).abs() < 1e-9);
    }
}
