//! Probes of how the host schedules this VM's vCPUs.
//!
//! `probe=switch:MS`: how long a host CPU takes to switch from one vCPU to another.
//!
//! Every CPU spins in ring 3 for MS milliseconds reading the TSC and logs each gap
//! longer than [`GAP_NS`] (a time it was not running) as `(last seen, first seen
//! again)`; the two CPUs' logs are matched into switches as
//! `kumo_abi::switch_probe::switch_costs` says (kumo's native twin does the same on
//! host threads).

use core::fmt::Write;

use kumo_abi::BootInfo;
use kumo_abi::switch_probe::{GAP_NS, switch_costs};

use crate::{Line, sys};

/// One CPU's log region in the heap: `[count, (start, end)...]`.
fn region(info: &BootInfo, cpu: u32) -> (*mut u64, usize) {
    let bytes = (info.heap_end - info.heap_start) / u64::from(info.cpus);
    let words = (bytes / 8) as usize;
    let base = (info.heap_start + u64::from(cpu) * (words as u64 * 8)) as *mut u64;
    (base, (words - 1) / 2)
}

/// This CPU's part: spin and log gaps.
pub fn run_share(info: &BootInfo, cpu: u32, millis: u64) {
    let (base, capacity) = region(info, cpu);
    let threshold = GAP_NS * info.tsc_khz / 1_000_000;
    let mut count = 0usize;
    let mut last = sys::rdtsc();
    let end = last + millis * info.tsc_khz;
    while last < end {
        let now = sys::rdtsc();
        if now - last > threshold && count < capacity {
            // SAFETY: inside this CPU's own region of the heap (see `region`).
            unsafe {
                base.add(1 + 2 * count).write(last);
                base.add(2 + 2 * count).write(now);
            }
            count += 1;
        }
        last = now;
    }
    // SAFETY: as above; read by the master after the join.
    unsafe { base.write(count as u64) };
}

fn gaps(info: &BootInfo, cpu: u32) -> &'static [[u64; 2]] {
    let (base, _) = region(info, cpu);
    // SAFETY: written by `run_share` on that CPU before the join barrier.
    unsafe {
        let count = base.read() as usize;
        core::slice::from_raw_parts(base.add(1).cast::<[u64; 2]>(), count)
    }
}

/// The master, after the join: matches CPU 0's and CPU 1's gaps and prints the
/// distribution of switch costs. Uses the heap after both logs as scratch.
pub fn report(info: &BootInfo, millis: u64) -> bool {
    if info.cpus < 2 {
        let mut line = Line::new();
        let _ = write!(line, "@kumo error what=probe item=needs-two-cpus");
        line.emit();
        return false;
    }
    let (a, b) = (gaps(info, 0), gaps(info, 1));
    // Scratch for the costs: the third region, or CPU 0's unused tail.
    let (scratch, room) = {
        let (base, capacity) = region(info, 0);
        // SAFETY: past CPU 0's `a.len()` logged pairs (a count word, then pairs),
        // inside its region of `1 + 2 * capacity` words.
        (
            unsafe { base.add(1 + 2 * a.len()) },
            2 * (capacity - a.len()),
        )
    };
    let mut n = 0usize;
    switch_costs(a, b, |cost| {
        if n < room {
            // SAFETY: n < room, inside the scratch area.
            unsafe { scratch.add(n).write(cost) };
            n += 1;
        }
    });
    // SAFETY: the n values written above.
    let costs = unsafe { core::slice::from_raw_parts_mut(scratch, n) };
    let at = crate::stats::quantiles(costs, info.tsc_khz);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo switchprobe millis={millis} gaps0={} gaps1={} switches={n} median_us={:.2} \
         p90_us={:.2} p99_us={:.2} max_us={:.2}",
        a.len(),
        b.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
    );
    line.emit();
    n > 0
}

/// `probe=wake:MS:PERIOD_US`: CPU 0 sleeps on its TSC-deadline timer every PERIOD_US
/// for MS milliseconds and measures how late it runs again (deadline -> first ring-3
/// instruction): the wake-up latency a scheduler gives a halted vCPU whose interrupt
/// arrives. Uses the heap for the samples.
pub fn wake(info: &BootInfo, millis: u64, period_us: u64) -> bool {
    let period = (period_us * info.tsc_khz / 1000).max(1);
    let capacity = ((info.heap_end - info.heap_start) / 8) as usize;
    let samples = info.heap_start as *mut u64;
    let end = sys::rdtsc() + millis * info.tsc_khz;
    let mut n = 0usize;
    while n < capacity {
        let deadline = sys::rdtsc() + period;
        if deadline > end {
            break;
        }
        if !sys::sleep_until(deadline) {
            let mut line = Line::new();
            let _ = write!(line, "@kumo error what=probe item=no-tsc-deadline-timer");
            line.emit();
            return false;
        }
        let late = sys::rdtsc().saturating_sub(deadline);
        // SAFETY: n < capacity: inside the heap, which is ours.
        unsafe { samples.add(n).write(late) };
        n += 1;
    }
    // SAFETY: the n samples written above.
    let lates = unsafe { core::slice::from_raw_parts_mut(samples, n) };
    let at = crate::stats::quantiles(lates, info.tsc_khz);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo wakeprobe millis={millis} period_us={period_us} wakes={n} median_us={:.2} \
         p90_us={:.2} p99_us={:.2} max_us={:.2}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
    );
    line.emit();
    n > 0
}

/// `probe=busy:MS`: every CPU spins for MS milliseconds (a CPU hog beside others).
pub fn busy(info: &BootInfo, millis: u64) {
    let end = sys::rdtsc() + millis * info.tsc_khz;
    while sys::rdtsc() < end {
        core::hint::spin_loop();
    }
}

/// `probe=gap:MS`: CPU 0 spins MS milliseconds in ring 3 reading the TSC and reports
/// the longest time it saw pass between two reads, and how many such gaps exceeded
/// 1 ms: the downtime of a migration or snapshot as the guest feels it (KVM keeps the
/// TSC running with wall time across a restore), beside ordinary descheduling.
/// The longest gaps the gap probe reports individually.
const LONG_GAPS: usize = 8;

pub fn gap(info: &BootInfo, millis: u64) -> bool {
    let ms = info.tsc_khz.max(1);
    let mut last = sys::rdtsc();
    let end = last + millis * info.tsc_khz;
    let (mut longest, mut over_ms) = (0u64, 0u64);
    // The longest gaps as [start TSC, length], longest first: the host finds the
    // one its pause falls in (the longest may be host noise elsewhere).
    let mut top = [[0u64; 2]; LONG_GAPS];
    while last < end {
        let now = sys::rdtsc();
        let gap = now.saturating_sub(last);
        if gap > ms {
            over_ms += 1;
        }
        if gap > top[LONG_GAPS - 1][1]
            && let Some(at) = top.iter().position(|g| gap > g[1])
        {
            top.copy_within(at..LONG_GAPS - 1, at + 1);
            top[at] = [last, gap];
        }
        longest = longest.max(gap);
        last = now;
    }
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo gapprobe millis={millis} max_gap_us={:.1} gaps_over_1ms={over_ms} long_gaps=",
        longest as f64 * 1000.0 / ms as f64,
    );
    for (i, [start, len]) in top.iter().filter(|g| g[1] > 0).enumerate() {
        let _ = write!(line, "{}{start}:{len}", if i == 0 { "" } else { "," });
    }
    line.emit();
    true
}
