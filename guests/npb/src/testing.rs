//! Test support shared by the kernels' unit tests: run a closure on a team of host
//! threads over one arena, as the runtimes do, and deterministic test data.

extern crate std;
use std::sync::Barrier;
use std::time::Instant;
use std::vec;
use std::vec::Vec;

use crate::team::{Arena, Runtime, Team};
use crate::{Outcome, Spec};

/// A plain barrier runtime, so a kernel's phases can be run on a team directly.
struct TestRuntime {
    barrier: Barrier,
    origin: Instant,
}

impl Runtime for TestRuntime {
    fn barrier(&self) {
        self.barrier.wait();
    }
    fn seconds(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
}

/// Runs `body` on `threads` threads sharing a zeroed arena of `bytes`; rank 0's result.
pub fn on_team<R: Send>(
    threads: usize,
    bytes: usize,
    body: impl Fn(&Team, &mut Arena) -> R + Sync,
) -> R {
    let mut memory = vec![0u64; bytes / 8 + 16];
    let base = memory.as_mut_ptr() as usize;
    let len = memory.len() * 8;
    let runtime = TestRuntime {
        barrier: Barrier::new(threads),
        origin: Instant::now(),
    };
    let mut results: Vec<R> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|rank| {
                let (runtime, body) = (&runtime, &body);
                scope.spawn(move || {
                    let team = Team::new(rank, threads, runtime);
                    // SAFETY: `memory` outlives the scope; every thread carves it the
                    // same way.
                    let mut arena = unsafe { Arena::new(base as *mut u8, len) };
                    body(&team, &mut arena)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(memory);
    results.swap_remove(0)
}

/// Deterministic pseudo-random test data in [-1, 1) (not the NPB stream).
pub fn noise(len: usize, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// The result value `name` of `outcome` (which must have it).
pub fn value(outcome: &Outcome, name: &str) -> f64 {
    outcome.values.iter().find(|(k, _)| *k == name).unwrap().1
}

/// Runs the MPI form of `spec` on `ranks` host threads, each rank within its
/// `mpi::heap_bytes`; every rank's outcome.
pub fn on_mpi_ranks(spec: Spec, ranks: usize) -> Vec<Outcome> {
    let bytes = crate::mpi::heap_bytes(spec, ranks);
    crate::mpi::host::run_ranks(ranks, bytes, |comm, arena| {
        let outcome = crate::mpi::run(spec, comm, arena).unwrap();
        assert!(arena.used() <= bytes, "{spec}: {} of {bytes}", arena.used());
        outcome
    })
}
