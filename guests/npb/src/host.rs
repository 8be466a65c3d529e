//! Running a kernel on host threads: the native twin's engine and the kernels' unit
//! tests. Same kernel code as the guest; a barrier built the same way (spin briefly,
//! then sleep), so guest/native ratios compare the machine, not the barrier.

extern crate std;

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::team::{Arena, Runtime, Team};
use crate::{Outcome, Spec, workload_heap_bytes};

/// The arena's alignment: 2 MiB, as the guest's heap (lets THP back it where enabled).
const ARENA_ALIGN: usize = 2 << 20;

/// The guest runtime's default barrier spin (when kumo does not pass `spin_us=`).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// Runs `spec` on `threads` host threads with the default barrier spin.
pub fn run(spec: Spec, threads: usize) -> Outcome {
    run_with_spin(spec, threads, DEFAULT_SPIN)
}

/// Runs `spec` on `threads` host threads and returns the master's outcome. A thread
/// waiting at a barrier spins for `spin` before sleeping (give it the guest's value).
pub fn run_with_spin(spec: Spec, threads: usize, spin: Duration) -> Outcome {
    let threads = threads.max(1);
    let bytes = workload_heap_bytes(spec, threads as u32) as usize;
    let memory = ArenaMemory::new(bytes);
    run_in(spec, threads, spin, &memory.view)
}

/// As [`run_with_spin`], with the team's arena in `memory`, which must be zeroed and
/// at least [`workload_heap_bytes`] long: the caller chooses its pages (huge pages, say).
pub fn run_with_spin_in(spec: Spec, threads: usize, spin: Duration, memory: &mut [u8]) -> Outcome {
    let threads = threads.max(1);
    let bytes = workload_heap_bytes(spec, threads as u32) as usize;
    assert!(
        memory.len() >= bytes,
        "{spec} needs an arena of {bytes} bytes"
    );
    let view = ArenaView {
        ptr: memory.as_mut_ptr(),
        len: memory.len(),
    };
    run_in(spec, threads, spin, &view)
}

fn run_in(spec: Spec, threads: usize, spin: Duration, memory: &ArenaView) -> Outcome {
    let runtime = HostRuntime::new(threads, spin);
    std::thread::scope(|scope| {
        let workers: std::vec::Vec<_> = (1..threads)
            .map(|rank| {
                let runtime = &runtime;
                scope.spawn(move || run_rank(spec, rank, threads, runtime, memory))
            })
            .collect();
        let outcome = run_rank(spec, 0, threads, &runtime, memory);
        for worker in workers {
            worker.join().expect("an NPB worker thread panicked");
        }
        outcome
    })
}

fn run_rank(
    spec: Spec,
    rank: usize,
    threads: usize,
    runtime: &HostRuntime,
    memory: &ArenaView,
) -> Outcome {
    let team = Team::new(rank, threads, runtime);
    // SAFETY: `memory` outlives the scope; every thread carves it the same way.
    let mut arena = unsafe { Arena::new(memory.ptr, memory.len) };
    crate::run(spec, &team, &mut arena)
}

/// The memory a team's arena lives in, wherever it came from.
struct ArenaView {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a pointer and a length naming plain memory, which the team shares under
// the Arena contract (each thread writes only what it owns between barriers).
unsafe impl Sync for ArenaView {}

/// Zeroed, aligned memory for a team's arena.
struct ArenaMemory {
    view: ArenaView,
    layout: Layout,
}

impl ArenaMemory {
    fn new(len: usize) -> ArenaMemory {
        let layout = Layout::from_size_align(len.max(1), ARENA_ALIGN).expect("arena layout");
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        ArenaMemory {
            view: ArenaView { ptr, len },
            layout,
        }
    }
}

impl Drop for ArenaMemory {
    fn drop(&mut self) {
        // SAFETY: `view.ptr` was allocated in `new` with this layout, and no team runs
        // on it any more (`run_in` returned before the drop).
        unsafe { dealloc(self.view.ptr, self.layout) };
    }
}

/// Barrier and clock for host threads.
struct HostRuntime {
    threads: u32,
    spin: Duration,
    arrived: AtomicU32,
    generation: AtomicU32,
    sleep: Mutex<()>,
    wake: Condvar,
    origin: Instant,
}

impl HostRuntime {
    fn new(threads: usize, spin: Duration) -> HostRuntime {
        HostRuntime {
            threads: threads as u32,
            spin,
            arrived: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            origin: Instant::now(),
        }
    }
}

impl Runtime for HostRuntime {
    fn barrier(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            // Under the lock, so a sleeper between its check and its wait cannot miss it.
            let _guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.generation
                .store(generation.wrapping_add(1), Ordering::Release);
            self.wake.notify_all();
            return;
        }
        let start = Instant::now();
        while self.generation.load(Ordering::Acquire) == generation {
            if start.elapsed() < self.spin {
                core::hint::spin_loop();
                continue;
            }
            let guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
            let _guard = self
                .wake
                .wait_while(guard, |_| {
                    self.generation.load(Ordering::Acquire) == generation
                })
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn seconds(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Class, Kernel};

    #[test]
    fn ep_s_verifies_on_one_to_three_threads() {
        for threads in 1..=3 {
            let spec = Spec {
                kernel: Kernel::Ep,
                class: Class::S,
            };
            let outcome = run(spec, threads);
            assert!(outcome.verified, "{threads} threads: {outcome:?}");
            assert!(outcome.seconds > 0.0 && outcome.mops > 0.0);
        }
    }

    #[test]
    fn barrier_orders_writes_across_many_generations() {
        let runtime = HostRuntime::new(3, DEFAULT_SPIN);
        let counter = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    for round in 0..2000u32 {
                        counter.fetch_add(1, Ordering::Relaxed);
                        runtime.barrier();
                        // Everyone added for this round before anyone passed.
                        assert!(counter.load(Ordering::Relaxed) >= 3 * (round + 1));
                        runtime.barrier();
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::Relaxed), 6000);
    }
}
