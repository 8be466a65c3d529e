//! `probe=sched:MS` (with `guest_hz=H` for the tick parts): what the guest's scheduler
//! costs, measured on CPU 0 with the TSC, MS milliseconds per part:
//! - `yield`: two tasks hand the CPU to each other in a loop (`SWITCH`, no tick):
//!   time per switch (the trap, ring 0's pick and FXSAVE/FXRSTOR, the return);
//! - `null`: one task calls `SWITCH` with no one to switch to: the trap and pick alone;
//! - `spin` and `tick` (with `guest_hz=`), alternating five times each: one task
//!   spins without and with the tick: the time it does not run, per tick (the timer
//!   interrupt's emulated ring-0 work; a non-switching tick), and its lost fraction
//!   beside that without the tick (the slowdown of a compute-bound run);
//! - `preempt` (with `guest_hz=`): two tasks spin under the tick and are switched at
//!   every tick: the time neither runs, per switch.
//!
//! A spinning task counts as its own every TSC step shorter than `GAP_NS`; what it
//! loses (to the supervisor, or the host) is the rest. It also records where each of
//! its runs starts and ends: the gap from one run's end to the next run's start (the
//! same task's after a tick, the other's after a switch) is one event's cost, and
//! their median ignores the host's rarer, longer preemptions of the vCPU (these hosts
//! are shared). Prints one `@kumo sched probe=PART ...` line per part.

use core::cell::UnsafeCell;
use core::fmt::Write;
use core::sync::atomic::{AtomicU64, Ordering};

use kumo_abi::BootInfo;

use crate::{Line, sched, sys};

/// A TSC step longer than this is time the task did not run.
const GAP_NS: u64 = 10_000;

/// Per task: TSC ticks it saw itself run, and the end of the part.
static RUN: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];
static END: AtomicU64 = AtomicU64::new(0);
static GAP_TICKS: AtomicU64 = AtomicU64::new(0);
static YIELDS: AtomicU64 = AtomicU64::new(0);

/// Runs recorded per task: (start, end) TSC pairs.
const MAX_RUNS: usize = 8192;
struct Runs(UnsafeCell<[[(u64, u64); MAX_RUNS]; 2]>);
// SAFETY: task k writes only row k while the part runs; the CPU's first task reads
// both after `sched::run` returned (every task done).
unsafe impl Sync for Runs {}
static RUNS: Runs = Runs(UnsafeCell::new([[(0, 0); MAX_RUNS]; 2]));
static RUN_COUNT: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];
/// Event gaps of a part, sorted for their median (CPU 0 only, after the part).
static GAPS: Runs = Runs(UnsafeCell::new([[(0, 0); MAX_RUNS]; 2]));

extern "C" fn spin(_arg: u64, task: u64) {
    let (end, gap) = (
        END.load(Ordering::Relaxed),
        GAP_TICKS.load(Ordering::Relaxed),
    );
    // SAFETY: this task's own row (see `Runs`).
    let runs = unsafe { &mut (*RUNS.0.get())[task as usize] };
    let mut n = 0;
    let mut last = sys::rdtsc();
    let mut started = last;
    let mut run = 0;
    while last < end {
        let now = sys::rdtsc();
        if now - last < gap {
            run += now - last;
        } else {
            if n < MAX_RUNS {
                runs[n] = (started, last);
                n += 1;
            }
            started = now;
        }
        last = now;
    }
    if n < MAX_RUNS {
        runs[n] = (started, last);
        n += 1;
    }
    RUN[task as usize].store(run, Ordering::Relaxed);
    RUN_COUNT[task as usize].store(n as u64, Ordering::Relaxed);
}

extern "C" fn yielder(_arg: u64, _task: u64) {
    let end = END.load(Ordering::Relaxed);
    let mut n = 0;
    while sys::rdtsc() < end {
        sys::switch();
        n += 1;
    }
    YIELDS.fetch_add(n, Ordering::Relaxed);
}

/// The gaps between consecutive runs of the part's `tasks` tasks (in TSC order):
/// their count, median, 10th and 90th percentiles (TSC ticks).
fn event_gaps(tasks: usize) -> (usize, u64, u64, u64) {
    // SAFETY: every task is done (see `Runs`); GAPS is CPU 0's alone.
    let (runs, gaps) = unsafe { (&*RUNS.0.get(), &mut (*GAPS.0.get())[0]) };
    let counts = [0, 1].map(|k| RUN_COUNT[k].load(Ordering::Relaxed) as usize);
    // Merge the tasks' runs by start (each row is in order already).
    let (mut i, mut j, mut n) = (0, 0, 0);
    let mut previous_end = None;
    loop {
        let next = match (i < counts[0], tasks > 1 && j < counts[1]) {
            (true, true) if runs[0][i].0 <= runs[1][j].0 => {
                i += 1;
                runs[0][i - 1]
            }
            (_, true) => {
                j += 1;
                runs[1][j - 1]
            }
            (true, false) => {
                i += 1;
                runs[0][i - 1]
            }
            (false, false) => break,
        };
        if let Some(end) = previous_end
            && n < MAX_RUNS
            && next.0 > end
        {
            gaps[n] = (next.0 - end, 0);
            n += 1;
        }
        previous_end = Some(next.1);
    }
    let gaps = &mut gaps[..n];
    gaps.sort_unstable();
    let at = |q: f64| gaps.get(((n as f64 - 1.0) * q) as usize).map_or(0, |g| g.0);
    (n, at(0.5), at(0.1), at(0.9))
}

/// Runs every part on CPU 0 (the others are idle in the fork barrier); true if each
/// part could run.
pub fn run(info: &BootInfo, millis: u64, hz: Option<u64>) -> bool {
    let memory = (info.heap_start + 4095) & !4095;
    if info.heap_end < memory + sched::Tasks::bytes(2) {
        return false;
    }
    GAP_TICKS.store(info.tsc_khz * GAP_NS / 1_000_000, Ordering::Relaxed);
    let mut ok = true;
    let hz = hz.unwrap_or(0);
    // The tick's cost is a compute-bound task's slowdown beside the same task without
    // it: `spin` and `tick` alternate (the host's speed drifts), five times each.
    let alternating = [("spin", 1, 0), ("tick", 1, hz)];
    let parts = [("yield", 2, 0), ("null", 1, 0)]
        .into_iter()
        .chain(alternating.into_iter().cycle().take(10))
        .chain([("preempt", 2, hz)]);
    for (name, count, part_hz) in parts {
        let spinning = name != "yield" && name != "null";
        if spinning && name != "spin" && part_hz == 0 {
            continue;
        }
        RUN[0].store(0, Ordering::Relaxed);
        RUN[1].store(0, Ordering::Relaxed);
        YIELDS.store(0, Ordering::Relaxed);
        let tasks = sched::Tasks {
            count,
            hz: part_hz,
            slice: 1,
            memory,
        };
        let body: extern "C" fn(u64, u64) = if spinning { spin } else { yielder };
        let start = sys::rdtsc();
        END.store(start + millis * info.tsc_khz, Ordering::Relaxed);
        if sched::run(0, tasks, 0, body).is_err() {
            ok = false;
            continue;
        }
        let elapsed = sys::rdtsc() - start;
        let (ticks, switches, _) = sched::counters(0);
        let ns = |t: u64| t as f64 * 1e6 / info.tsc_khz as f64;
        let mut line = Line::new();
        let _ = write!(
            line,
            "@kumo sched probe={name} tasks={count} hz={part_hz} millis={millis} ticks={ticks} \
             switches={switches}"
        );
        if spinning {
            let run = RUN[0].load(Ordering::Relaxed) + RUN[1].load(Ordering::Relaxed);
            let lost = elapsed.saturating_sub(run);
            let events = if name == "tick" { ticks } else { switches };
            let (gaps, median, p10, p90) = event_gaps(count);
            let _ = write!(
                line,
                " lost_ns={:.0} lost_ns_per_event={:.0} lost_fraction={:.5} gaps={gaps} \
                 gap_median_ns={:.0} gap_p10_ns={:.0} gap_p90_ns={:.0}",
                ns(lost),
                ns(lost) / events.max(1) as f64,
                lost as f64 / elapsed as f64,
                ns(median),
                ns(p10),
                ns(p90),
            );
        } else {
            let calls = YIELDS.load(Ordering::Relaxed);
            let _ = write!(
                line,
                " calls={calls} ns_per_call={:.0}",
                ns(elapsed) / calls.max(1) as f64
            );
        }
        line.emit();
    }
    ok
}
