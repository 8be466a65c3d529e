//! kumo's guest runtime, ring 3: every CPU enters here (the supervisor's `iretq`); CPU 0
//! is the master that reads the command line, forks each benchmark over all CPUs,
//! combines the results in thread order and prints them; the others are workers.
//!
//! Runs natively (ring 3 is not emulated on PVM hosts) with hardware floating point.
#![no_std]
#![no_main]

mod aps;
mod blk;
mod comm;
mod highmem;
mod irq;
mod mem;
mod mpi;
mod net;
mod network;
mod pci;
mod probe;
mod sched;
mod schedprobe;
mod stats;
mod sync;
mod sys;
mod virtio;

use core::arch::global_asm;
use core::cell::UnsafeCell;
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use kumo_abi::{BootInfo, USER_MAGIC, fault};
use npb::green::{Balloon, Carrier};
use npb::team::{Arena, Runtime, Team};
use npb::{Kernel, Spec};
use sync::Barrier;

// The image header (read by the supervisor) and the entry point: rdi = &BootInfo,
// rsi = CPU index, rsp = this CPU's stack top.
global_asm!(
    ".section .kumo_header, \"a\"",
    ".quad {magic}",
    ".quad _start",
    ".quad user_image_end",
    ".text",
    ".globl _start",
    "_start:",
    "and rsp, -16",
    "call {main}",
    "ud2",
    magic = const USER_MAGIC,
    main = sym user_main,
);

/// Exit statuses (guest-abi.md).
const STATUS_VERIFIED: u32 = 0;
const STATUS_UNVERIFIED: u32 = 1;
const STATUS_BAD_COMMAND_LINE: u32 = 2;
const STATUS_FAULT: u32 = 3;

/// Spin this long before sleeping in the supervisor, unless `spin_us=` says otherwise:
/// short, because vCPUs may share host CPUs (a long spin steals from the very thread
/// being waited for). With dedicated CPUs the VMM passes a longer spin: waking a
/// halted vCPU costs tens of microseconds to milliseconds on nested hosts.
const DEFAULT_SPIN_MICROSECONDS: u64 = 50;
/// Most benchmark items on one command line.
const MAX_ITEMS: usize = 64;
/// The PVH ABI's command-line limit.
const CMDLINE_MAX: usize = 4095;

/// State the master writes before a barrier and the workers read after it (or the
/// reverse); the barriers order every access.
struct Shared<T>(UnsafeCell<T>);
// SAFETY: accesses are separated by `Barrier::wait`, which orders them (see above).
unsafe impl<T> Sync for Shared<T> {}

/// The benchmark of the current fork.
static JOB: Shared<Option<Job>> = Shared(UnsafeCell::new(None));

/// What every CPU does between FORK and JOIN.
#[derive(Clone, Copy)]
enum Job {
    Benchmark(Spec),
    /// A benchmark whose ranks are green threads of [`BALLOON`] (`balloon=1`).
    Green,
    /// `probe=switch:MS`.
    SwitchProbe(u64),
    /// `probe=busy:MS`.
    Busy(u64),
    /// `mpi=`: CPUs below `net.local` each run one rank.
    Mpi(MpiJob),
}

/// This VM's ranks' work: the plan, the spin before a rank sleeps, the NPB-MPI kernels.
#[derive(Clone, Copy)]
struct MpiJob {
    net: network::Plan,
    spin_us: u64,
    specs: [Spec; MAX_ITEMS],
    count: usize,
}

impl MpiJob {
    /// Runs CPU `cpu`'s ranks, if it has any (true if it has none): one, or with a
    /// scheduler (`ranks_per_vcpu=`, `guest_hz=`) each as a task of its own.
    fn run(&self, info: &'static BootInfo, cpu: u32) -> bool {
        let net = &self.net;
        let first = cpu as usize * net.per_cpu;
        if first >= net.local {
            return true;
        }
        let specs = &self.specs[..self.count];
        let Some(hz) = net.tick_hz() else {
            return network::run_rank(info, net, self.spin_us, specs, first, cpu, false);
        };
        let count = net.per_cpu.min(net.local - first);
        let ranks = CpuRanks {
            job: self,
            info,
            cpu,
            first,
            verdicts: [const { AtomicBool::new(false) }; sched::MAX_TASKS],
        };
        let tasks = sched::Tasks {
            count,
            hz,
            slice: net.slice,
            memory: net.layout(info).tasks + cpu as u64 * sched::Tasks::bytes(net.per_cpu),
        };
        let started = sys::rdtsc();
        if let Err(e) = sched::run(cpu, tasks, &raw const ranks as u64, run_cpu_rank) {
            let mut line = Line::new();
            let _ = write!(line, "@kumo error what=sched item={} cpu={cpu}", e.name());
            line.emit();
            return false;
        }
        let (ticks, switches, halts) = sched::counters(cpu);
        let mut line = Line::new();
        let _ = write!(
            line,
            "@kumo sched cpu={cpu} tasks={count} hz={hz} slice={} ticks={ticks} \
             switches={switches} halts={halts} wait={} run_ms={:.1}",
            net.slice,
            net.wait.name(),
            (sys::rdtsc() - started) as f64 / info.tsc_khz as f64,
        );
        line.emit();
        ranks.verdicts[..count]
            .iter()
            .all(|v| v.load(Ordering::Relaxed))
    }
}

/// The ranks of one CPU's scheduler (`MpiJob::run`), on its stack until they are done.
struct CpuRanks<'a> {
    job: &'a MpiJob,
    info: &'static BootInfo,
    cpu: u32,
    first: usize,
    verdicts: [AtomicBool; sched::MAX_TASKS],
}

/// A task of `MpiJob::run`'s scheduler: runs rank `first + task` of the CPU.
extern "C" fn run_cpu_rank(arg: u64, task: u64) {
    // SAFETY: `MpiJob::run` passes its `CpuRanks`, which outlives every task's rank.
    let ranks = unsafe { &*(arg as *const CpuRanks) };
    let job = ranks.job;
    let ok = network::run_rank(
        ranks.info,
        &job.net,
        job.spin_us,
        &job.specs[..job.count],
        ranks.first + task as usize,
        ranks.cpu,
        true,
    );
    ranks.verdicts[task as usize].store(ok, Ordering::Relaxed);
}

/// Each CPU's verdict on its part of the last fork (workers write theirs before JOIN).
static VERDICTS: [AtomicBool; kumo_abi::MAX_CPUS] = [const { AtomicBool::new(true) }; kumo_abi::MAX_CPUS];

/// `probe=...`.
#[derive(Clone, Copy)]
enum Probe {
    Switch { millis: u64 },
    Wake { millis: u64, period_us: u64 },
    Busy { millis: u64 },
    Gap { millis: u64 },
    /// `probe=sched:MS`: the guest scheduler's costs (`schedprobe`).
    Sched { millis: u64 },
}

fn parse_probe(text: &str) -> Option<Probe> {
    let mut parts = text.split(':');
    let kind = parts.next()?;
    let mut number = || -> Option<u64> { parts.next()?.parse().ok() };
    let millis = number().filter(|&ms| ms > 0 && ms <= 600_000)?;
    let probe = match kind {
        "switch" => Probe::Switch { millis },
        "busy" => Probe::Busy { millis },
        "gap" => Probe::Gap { millis },
        "sched" => Probe::Sched { millis },
        "wake" => Probe::Wake {
            millis,
            period_us: number().filter(|&us| (10..=1_000_000).contains(&us))?,
        },
        _ => return None,
    };
    parts.next().is_none().then_some(probe)
}
static FORK: Barrier = Barrier::new();
static JOIN: Barrier = Barrier::new();
/// The barrier kernels use between their phases.
static TEAM: Barrier = Barrier::new();

extern "C" fn user_main(info: &'static BootInfo, cpu: u32) -> ! {
    if cpu == 0 {
        master(info)
    }
    loop {
        FORK.wait(info.cpus);
        // SAFETY: written by the master before FORK, not written again before JOIN.
        match unsafe { *JOB.0.get() } {
            Some(Job::Benchmark(spec)) => {
                let _ = run_share_ticking(info, spec, cpu);
            }
            Some(Job::Green) => BALLOON.carry(cpu as usize),
            Some(Job::SwitchProbe(millis)) => probe::run_share(info, cpu, millis),
            Some(Job::Busy(millis)) => probe::busy(info, millis),
            Some(Job::Mpi(job)) => {
                VERDICTS[cpu as usize].store(job.run(info, cpu), Ordering::Relaxed);
            }
            None => {}
        }
        JOIN.wait(info.cpus);
    }
}

fn master(info: &'static BootInfo) -> ! {
    let user_tsc = sys::rdtsc();
    highmem::map(info);
    if !aps::wait(info) {
        error("boot", "ap-start-timeout");
        end(3);
    }
    let aps_in_tsc = sys::rdtsc();
    sys::mark_start();
    let start_tsc = sys::rdtsc();
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo boot cpus={} tsc_khz={}",
        info.cpus, info.tsc_khz
    );
    // Where the guest's boot went: ring 0 (emulated on PVM hosts) to long mode, its
    // set-up, starting the APs (until the last checked in), and the BSP's ring 3 to
    // the workload's start (which overlaps the APs' start).
    let us = |from: u64, to: u64| (to.saturating_sub(from) * 1000).checked_div(info.tsc_khz);
    if let Some(micros) = us(info.entry_tsc, start_tsc) {
        let _ = write!(line, " entry_to_start_us={micros}");
    }
    if info.main_tsc != 0 {
        for (key, from, to) in [
            ("long_mode_us", info.entry_tsc, info.main_tsc),
            ("setup_us", info.main_tsc, info.aps_tsc),
            ("aps_us", info.aps_tsc, aps_in_tsc),
            ("ring3_us", user_tsc, start_tsc),
        ] {
            if let Some(micros) = us(from, to) {
                let _ = write!(line, " {key}={micros}");
            }
        }
    }
    line.emit();

    let plan = match parse_command_line(command_line(info)) {
        Ok(plan) => plan,
        Err(()) => end(STATUS_BAD_COMMAND_LINE),
    };
    sync::set_spin_ticks(info.tsc_khz * plan.spin_us / 1000);
    if !plan.mpi {
        // `guest_hz=` without MPI ranks: the benchmarks run under the tick alone.
        TICK_HZ.store(plan.net.hz.unwrap_or(0), Ordering::Relaxed);
    }
    sync::use_pv_wait(plan.pv_wait);
    if plan.balloon.is_some() {
        sys::pv_host_cpus(HOST_CPUS.as_ptr());
    }
    if let Some(kind) = plan.fault {
        sys::fault(kind);
    }
    let mut all_verified = true;
    // With `mpi=`, `npb=` names NPB-MPI kernels (one rank per CPU up to `mpi=`'s LOCAL),
    // run with the network items.
    let mpi_specs: &[Spec] = if plan.mpi {
        &plan.specs[..plan.count]
    } else {
        for &spec in &plan.specs[..plan.count] {
            all_verified &= run_benchmark(info, spec, plan.balloon);
        }
        &[]
    };
    if let Some(millis) = plan.idle {
        idle(info, millis);
    }
    match plan.probe {
        Some(Probe::Switch { millis }) => {
            // SAFETY: the workers read JOB only after FORK.
            unsafe { *JOB.0.get() = Some(Job::SwitchProbe(millis)) };
            FORK.wait(info.cpus);
            probe::run_share(info, 0, millis);
            JOIN.wait(info.cpus);
            all_verified &= probe::report(info, millis);
        }
        Some(Probe::Busy { millis }) => {
            // SAFETY: the workers read JOB only after FORK.
            unsafe { *JOB.0.get() = Some(Job::Busy(millis)) };
            FORK.wait(info.cpus);
            probe::busy(info, millis);
            JOIN.wait(info.cpus);
        }
        Some(Probe::Wake { millis, period_us }) => {
            all_verified &= probe::wake(info, millis, period_us);
        }
        Some(Probe::Gap { millis }) => {
            all_verified &= probe::gap(info, millis);
        }
        Some(Probe::Sched { millis }) => {
            all_verified &= schedprobe::run(info, millis, plan.net.hz);
        }
        None => {}
    }
    if let Some(mode) = plan.irq {
        // An empty fork: every CPU has recorded its APIC ID once it returns.
        // SAFETY: the workers read JOB only after FORK.
        unsafe { *JOB.0.get() = None };
        FORK.wait(info.cpus);
        JOIN.wait(info.cpus);
        all_verified &= match mode {
            IrqMode::Check => irq::check(info),
            IrqMode::Bench { rounds, target } => irq::bench(info, rounds, target),
        };
    }
    match plan.blk {
        Some(BlkMode::Check) => all_verified &= blk::check(info),
        Some(BlkMode::Loop) => blk::self_perpetuating(info),
        Some(BlkMode::BadRing) => blk::bad_ring(info),
        None => {}
    }
    if plan.net.any() || !mpi_specs.is_empty() {
        all_verified &= run_mpi(info, &plan);
    }
    end(if all_verified {
        STATUS_VERIFIED
    } else {
        STATUS_UNVERIFIED
    })
}

/// `idle=MS`: every CPU halted for MS milliseconds (the workers already are, in the
/// fork barrier); a domain that is there but asks for no CPU.
fn idle(info: &BootInfo, millis: u64) {
    let until = sys::rdtsc() + millis * info.tsc_khz;
    while sys::rdtsc() < until {
        if !sys::sleep_until(until) {
            // No TSC-deadline timer: nothing can wake us on time, so spin.
            core::hint::spin_loop();
        }
    }
}

/// Forks this VM's MPI ranks over its CPUs (CPU 0 runs the first) and joins them; true
/// if every rank verified.
fn run_mpi(info: &'static BootInfo, plan: &Plan) -> bool {
    if !network::prepare(info, &plan.net) {
        return false;
    }
    let job = MpiJob {
        net: plan.net,
        spin_us: plan.spin_us,
        specs: plan.specs,
        count: if plan.mpi { plan.count } else { 0 },
    };
    // SAFETY: the workers read JOB only after FORK.
    unsafe { *JOB.0.get() = Some(Job::Mpi(job)) };
    FORK.wait(info.cpus);
    let mut verified = job.run(info, 0);
    JOIN.wait(info.cpus);
    for verdict in &VERDICTS[1..info.cpus as usize] {
        verified &= verdict.swap(true, Ordering::Relaxed);
    }
    verified
}

fn end(status: u32) -> ! {
    let mut line = Line::new();
    let _ = write!(line, "@kumo end status={status}");
    line.emit();
    sys::exit(status)
}

/// Forks `spec` over every CPU (as green threads of [`BALLOON`] with `balloon`, whose
/// carriers spin that long at their barriers), joins, and prints the master's result
/// line.
fn run_benchmark(info: &'static BootInfo, spec: Spec, balloon: Option<u64>) -> bool {
    let threads = info.cpus;
    let green = balloon.is_some();
    let stacks = if green { green_stacks(info) } else { 0 };
    let Some((arena_start, arena_end)) = arena_range(info, spec, stacks) else {
        let mut line = Line::new();
        let _ = write!(line, "@kumo error what=out-of-memory item={spec}");
        line.emit();
        return false;
    };
    sync::take_stats();
    let outcome = if let Some(spin_us) = balloon {
        run_green(info, spec, (arena_start, arena_end), spin_us)
    } else {
        // SAFETY: the workers read JOB only after FORK.
        unsafe { *JOB.0.get() = Some(Job::Benchmark(spec)) };
        FORK.wait(threads);
        let outcome = run_share_ticking(info, spec, 0);
        JOIN.wait(threads);
        outcome
    };
    let waits = sync::take_stats();
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo result benchmark={} class={} threads={threads} time_s={:.6} mops={:.2} \
         verified={}",
        spec.kernel.name(),
        spec.class.letter(),
        outcome.seconds,
        outcome.mops,
        outcome.verified,
    );
    for (key, value) in outcome.values.iter() {
        let _ = write!(line, " {key}={value}");
    }
    let _ = write!(
        line,
        " arena_start={arena_start:#x} arena_end={arena_end:#x}"
    );
    if green {
        let _ = write!(line, " balloon_host_cpus={}", HOST_CPUS.load(Ordering::Relaxed));
    }
    line.emit();
    print_barrier_stats(info, spec, &waits);
    outcome.verified
}

/// `@kumo barrierstats`: where the benchmark's waits went (set-up included), summed
/// over all CPUs; times in microseconds.
fn print_barrier_stats(info: &BootInfo, spec: Spec, stats: &sync::Stats) {
    let micros = |ticks: u64| (ticks * 1000).checked_div(info.tsc_khz).unwrap_or(0);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo barrierstats benchmark={} class={} threads={} barriers={} sleeps={} wakes={} \
         spin_us={} sleep_us={} spread_us={} resume_us={} resumes={}",
        spec.kernel.name(),
        spec.class.letter(),
        info.cpus,
        stats.barriers,
        stats.sleeps,
        stats.wakes,
        micros(stats.spin_ticks),
        micros(stats.sleep_ticks),
        micros(stats.spread_ticks),
        micros(stats.resume_ticks),
        stats.resumes,
    );
    line.emit();
}

/// `guest_hz=` of a run without MPI: every CPU takes the scheduler's tick (one task:
/// nothing to switch) while it runs its share; 0: no tick.
static TICK_HZ: AtomicU64 = AtomicU64::new(0);

/// [`run_share`] with this CPU's tick on, if `guest_hz=` asks for one.
fn run_share_ticking(info: &'static BootInfo, spec: Spec, cpu: u32) -> npb::Outcome {
    let hz = TICK_HZ.load(Ordering::Relaxed);
    if hz == 0 {
        return run_share(info, spec, cpu);
    }
    struct Share {
        info: &'static BootInfo,
        spec: Spec,
        cpu: u32,
        outcome: UnsafeCell<Option<npb::Outcome>>,
    }
    extern "C" fn body(arg: u64, _task: u64) {
        // SAFETY: `run_share_ticking` passes its `Share`, alive until `sched::run`
        // returns; only this (single) task writes the outcome.
        let share = unsafe { &*(arg as *const Share) };
        let outcome = run_share(share.info, share.spec, share.cpu);
        // SAFETY: as above.
        unsafe { *share.outcome.get() = Some(outcome) };
    }
    let share = Share {
        info,
        spec,
        cpu,
        outcome: UnsafeCell::new(None),
    };
    let tasks = sched::Tasks {
        count: 1,
        hz,
        slice: 1,
        memory: 0,
    };
    let started = sys::rdtsc();
    if let Err(e) = sched::run(cpu, tasks, &raw const share as u64, body) {
        let mut line = Line::new();
        let _ = write!(line, "@kumo error what=sched item={} cpu={cpu}", e.name());
        line.emit();
        return run_share(info, spec, cpu);
    }
    let (ticks, _, _) = sched::counters(cpu);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo sched cpu={cpu} tasks=1 hz={hz} slice=1 ticks={ticks} switches=0 halts=0 \
         wait=none run_ms={:.1}",
        (sys::rdtsc() - started) as f64 / info.tsc_khz as f64,
    );
    line.emit();
    share.outcome.into_inner().unwrap_or(npb::Outcome {
        seconds: 0.0,
        mops: 0.0,
        verified: false,
        values: npb::Values::new(),
    })
}

/// This CPU's part of `spec`: every CPU carves the same heap the same way.
fn run_share(info: &BootInfo, spec: Spec, cpu: u32) -> npb::Outcome {
    let runtime = GuestRuntime {
        cpus: info.cpus,
        tsc_khz: info.tsc_khz,
    };
    let team = Team::new(cpu as usize, info.cpus as usize, &runtime);
    // The master checked before FORK that there is one.
    let range = arena_range(info, spec, 0).unwrap_or((info.heap_start, info.heap_start));
    run_rank(spec, &team, range)
}

/// One rank of `spec` over the arena `[start, end)`.
fn run_rank(spec: Spec, team: &Team, (start, end): (u64, u64)) -> npb::Outcome {
    // SAFETY: the range is identity-mapped free RAM, ours alone, large enough, and
    // every rank builds its arena over it in the same way.
    let mut arena = unsafe { Arena::new(start as *mut u8, (end - start) as usize) };
    npb::run(spec, team, &mut arena)
}

/// Where `spec` runs: RAM above 4 GiB if it fits there, else the heap below the 32-bit
/// hole (which the network and device drivers use too) past its first `reserved` bytes;
/// `None` if neither holds it.
fn arena_range(info: &BootInfo, spec: Spec, reserved: u64) -> Option<(u64, u64)> {
    let need = npb::workload_heap_bytes(spec, info.cpus);
    let low = info.heap_start.checked_add(reserved)?;
    (info.heap_end >= low).then_some(())?;
    highmem::room(info, need)
        .or(Some((low, info.heap_end)))
        .filter(|&(start, end)| start < end && end - start >= need)
}

// ---------------------------------------------------------------------------------------
// vCPU ballooning (`balloon=1`): the team's ranks as green threads on as many vCPUs as
// the host has CPUs for; the other vCPUs park in kumo (npb::green).

/// The green threads of the current benchmark.
static BALLOON: Balloon = Balloon::new();
/// Host CPUs this VM may use, kept up to date by kumo (`sys::pv_host_cpus`).
static HOST_CPUS: AtomicU32 = AtomicU32::new(0);
/// Each green thread's stack, as the supervisor gives each CPU.
const GREEN_STACK_BYTES: u64 = 256 << 10;
/// Rank 0's outcome of the current green run.
static GREEN_OUTCOME: Shared<Option<npb::Outcome>> = Shared(UnsafeCell::new(None));

/// Bytes of green stacks at the start of the heap.
fn green_stacks(info: &BootInfo) -> u64 {
    u64::from(info.cpus) * GREEN_STACK_BYTES
}

/// The balloon's view of this guest: its barrier waits, kumo's CPU count, the TSC.
struct GuestCarrier {
    cpus: u32,
    tsc_khz: u64,
    /// Longest spin at a barrier of carriers (`balloon_spin_us=`), and the spin now
    /// (adaptive, `npb::green::next_spin`), in TSC ticks.
    max_spin_ticks: u64,
    spin_ticks: AtomicU64,
}

impl Carrier for GuestCarrier {
    fn wait_at_barrier(&self, word: &AtomicU32, value: u32) {
        let spin = self.spin_ticks.load(Ordering::Relaxed);
        let slept = sync::wait_while_eq_spinning(word, value, spin);
        let next = npb::green::next_spin(spin, slept, self.max_spin_ticks);
        self.spin_ticks.store(next, Ordering::Relaxed);
    }
    fn wait_parked(&self, word: &AtomicU32, value: u32) {
        sync::wait_parked(word, value);
    }
    fn store_and_wake(&self, word: &AtomicU32, value: u32) {
        sync::store_and_wake(word, value);
    }
    /// Before kumo has written it (an older kumo): every vCPU.
    fn target(&self) -> u32 {
        match HOST_CPUS.load(Ordering::Relaxed) {
            0 => self.cpus,
            cpus => cpus,
        }
    }
    fn seconds(&self) -> f64 {
        sys::rdtsc() as f64 / (self.tsc_khz as f64 * 1000.0)
    }
    fn released(&self) {
        sync::count_barrier();
    }
}

/// Runs `spec`'s ranks as green threads over every CPU (the master carries too) and
/// returns rank 0's outcome.
fn run_green(info: &BootInfo, spec: Spec, arena: (u64, u64), spin_us: u64) -> npb::Outcome {
    let carrier = GuestCarrier {
        cpus: info.cpus,
        tsc_khz: info.tsc_khz,
        max_spin_ticks: info.tsc_khz * spin_us / 1000,
        spin_ticks: AtomicU64::new(info.tsc_khz * spin_us / 1000),
    };
    let ranks = info.cpus as usize;
    let body = move |rank: usize, runtime: &dyn Runtime| {
        let team = Team::new(rank, ranks, runtime);
        let outcome = run_rank(spec, &team, arena);
        if rank == 0 {
            // SAFETY: only rank 0 writes it, and the master reads it after JOIN.
            unsafe { *GREEN_OUTCOME.0.get() = Some(outcome) };
        }
    };
    // SAFETY: the workers are in FORK, not carrying; the stacks are the heap's first
    // `green_stacks` bytes, which the arena leaves out, and they, the carrier and the
    // body (on this frame) outlive JOIN, after which no CPU carries.
    unsafe {
        BALLOON.prepare(
            ranks,
            ranks,
            info.heap_start as *mut u8,
            GREEN_STACK_BYTES as usize,
            &carrier,
            &body,
        );
        *JOB.0.get() = Some(Job::Green);
    }
    FORK.wait(info.cpus);
    BALLOON.carry(0);
    JOIN.wait(info.cpus);
    // SAFETY: rank 0 wrote it before JOIN.
    unsafe { (*GREEN_OUTCOME.0.get()).take() }.unwrap_or(npb::Outcome {
        seconds: 0.0,
        mops: 0.0,
        verified: false,
        values: npb::Values::new(),
    })
}

/// The team barrier and clock of the guest: shared-memory barrier, TSC time.
struct GuestRuntime {
    cpus: u32,
    tsc_khz: u64,
}

impl Runtime for GuestRuntime {
    fn barrier(&self) {
        TEAM.wait(self.cpus);
    }

    fn seconds(&self) -> f64 {
        sys::rdtsc() as f64 / (self.tsc_khz as f64 * 1000.0)
    }
}

// ---------------------------------------------------------------------------------------
// Command line.

struct Plan {
    specs: [Spec; MAX_ITEMS],
    count: usize,
    fault: Option<u64>,
    irq: Option<IrqMode>,
    probe: Option<Probe>,
    idle: Option<u64>,
    spin_us: u64,
    /// `pvwait=1`: kumo's paravirtual wait page exists.
    pv_wait: bool,
    /// `balloon=1`: run teams as green threads on as many vCPUs as kumo says the
    /// host has CPUs for (`Some(spin)`: the spin of a barrier of those vCPUs,
    /// `balloon_spin_us=`, by default `spin_us=`'s).
    balloon: Option<u64>,
    /// `mpi=` was given: `npb=` items are NPB-MPI kernels.
    mpi: bool,
    /// `mpi=`, `wait=`, `net=`, `net_rounds=`, `net_seed=`, `net_drop=`.
    net: network::Plan,
    /// `blk=check`: the virtio-blk driver's check of the first disk; `blk=loop`,
    /// `blk=badring`: the hostile disk probes (see `blk.rs`).
    blk: Option<BlkMode>,
}

#[derive(Clone, Copy)]
enum BlkMode {
    Check,
    Loop,
    BadRing,
}

/// `irq=check` or `irq=bench:ROUNDS:CPU`.
#[derive(Clone, Copy)]
enum IrqMode {
    Check,
    Bench { rounds: usize, target: u32 },
}

fn parse_irq(text: &str) -> Option<IrqMode> {
    if text == "check" {
        return Some(IrqMode::Check);
    }
    let mut parts = text.strip_prefix("bench:")?.split(':');
    let rounds = parts.next()?.parse().ok()?;
    let target = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(IrqMode::Bench { rounds, target })
}

fn command_line(info: &BootInfo) -> &'static str {
    if info.cmdline == 0 {
        return "";
    }
    let base = info.cmdline as *const u8;
    let mut len = 0;
    // SAFETY: the supervisor hands over the loader's NUL-terminated command line
    // (at most CMDLINE_MAX bytes), identity-mapped and never written.
    let bytes = unsafe {
        while len < CMDLINE_MAX && base.add(len).read() != 0 {
            len += 1;
        }
        core::slice::from_raw_parts(base, len)
    };
    // Not UTF-8: keep the valid prefix (the rest cannot name a benchmark anyway).
    match core::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => core::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or(""),
    }
}

/// `npb=` (absent: every kernel, class S, unless `irq=` or `probe=` is given; empty:
/// nothing), `fault=`, `irq=` and `probe=`; other keys belong to someone else and are ignored. Problems
/// are printed as `@kumo error` lines.
fn parse_command_line(cmdline: &str) -> Result<Plan, ()> {
    let mut plan = Plan {
        specs: [Spec {
            kernel: Kernel::Ep,
            class: npb::Class::S,
        }; MAX_ITEMS],
        count: 0,
        fault: None,
        irq: None,
        probe: None,
        idle: None,
        spin_us: DEFAULT_SPIN_MICROSECONDS,
        pv_wait: false,
        balloon: None,
        mpi: false,
        net: network::Plan::new(),
        blk: None,
    };
    let mut mpi_given = false;
    let mut npb_items = None;
    let (mut balloon, mut balloon_spin_us) = (false, None);
    let mut ok = true;
    for word in cmdline.split_ascii_whitespace() {
        if let Some(items) = word.strip_prefix("npb=") {
            npb_items = Some(items);
        } else if let Some(micros) = word.strip_prefix("spin_us=") {
            match micros.parse().ok().filter(|&us: &u64| us <= 1_000_000) {
                Some(us) => plan.spin_us = us,
                None => {
                    error("bad-spin", micros);
                    ok = false;
                }
            }
        } else if let Some(flag) = word.strip_prefix("pvwait=") {
            match flag {
                "0" | "1" => plan.pv_wait = flag == "1",
                _ => {
                    error("bad-pvwait", flag);
                    ok = false;
                }
            }
        } else if let Some(flag) = word.strip_prefix("balloon=") {
            match flag {
                "0" => balloon = false,
                "1" => balloon = true,
                _ => {
                    error("bad-balloon", flag);
                    ok = false;
                }
            }
        } else if let Some(micros) = word.strip_prefix("balloon_spin_us=") {
            match micros.parse().ok().filter(|&us: &u64| us <= 1_000_000) {
                Some(us) => balloon_spin_us = Some(us),
                None => {
                    error("bad-balloon-spin", micros);
                    ok = false;
                }
            }
        } else if let Some(millis) = word.strip_prefix("idle=") {
            plan.idle = millis.parse().ok().filter(|&ms| ms <= 3_600_000);
            if plan.idle.is_none() {
                error("bad-idle", millis);
                ok = false;
            }
        } else if let Some(probe) = word.strip_prefix("probe=") {
            plan.probe = parse_probe(probe);
            if plan.probe.is_none() {
                error("bad-probe", probe);
                ok = false;
            }
        } else if let Some(mode) = word.strip_prefix("irq=") {
            plan.irq = parse_irq(mode);
            if plan.irq.is_none() {
                error("bad-irq-mode", mode);
                ok = false;
            }
        } else if let Some(job) = word.strip_prefix("mpi=") {
            mpi_given = true;
            if !plan.net.parse_mpi(job) {
                error("bad-mpi", job);
                ok = false;
            }
        } else if let Some(count) = word.strip_prefix("ranks_per_vcpu=") {
            match count
                .parse()
                .ok()
                .filter(|r| (1..=network::MAX_PER_CPU).contains(r))
            {
                Some(r) => plan.net.per_cpu = r,
                None => {
                    error("bad-ranks-per-vcpu", count);
                    ok = false;
                }
            }
        } else if let Some(hz) = word.strip_prefix("guest_hz=") {
            match hz
                .parse()
                .ok()
                .filter(|h| (1..=network::MAX_HZ).contains(h))
            {
                Some(h) => plan.net.hz = Some(h),
                None => {
                    error("bad-guest-hz", hz);
                    ok = false;
                }
            }
        } else if let Some(ticks) = word.strip_prefix("guest_slice=") {
            match ticks.parse().ok().filter(|t| (1..=1000).contains(t)) {
                Some(t) => plan.net.slice = t,
                None => {
                    error("bad-guest-slice", ticks);
                    ok = false;
                }
            }
        } else if let Some(flag) = word.strip_prefix("shm=") {
            match flag {
                "0" | "1" => plan.net.shm = Some(flag == "1"),
                _ => {
                    error("bad-shm", flag);
                    ok = false;
                }
            }
        } else if let Some(mode) = word.strip_prefix("wait=") {
            if !plan.net.parse_wait(mode) {
                error("bad-wait", mode);
                ok = false;
            }
        } else if let Some(items) = word.strip_prefix("net=") {
            if !plan.net.parse_net(items) {
                error("bad-net", items);
                ok = false;
            }
        } else if let Some(rounds) = word.strip_prefix("net_rounds=") {
            plan.net.rounds = rounds.parse().ok().filter(|&r| r > 0);
            if plan.net.rounds.is_none() {
                error("bad-net-rounds", rounds);
                ok = false;
            }
        } else if let Some(every) = word.strip_prefix("net_drop=") {
            match every.parse() {
                Ok(every) => plan.net.drop_every = every,
                Err(_) => {
                    error("bad-net-drop", every);
                    ok = false;
                }
            }
        } else if let Some(seed) = word.strip_prefix("net_seed=") {
            match seed.parse() {
                Ok(seed) => plan.net.seed = seed,
                Err(_) => {
                    error("bad-net-seed", seed);
                    ok = false;
                }
            }
        } else if let Some(mode) = word.strip_prefix("blk=") {
            plan.blk = match mode {
                "check" => Some(BlkMode::Check),
                "loop" => Some(BlkMode::Loop),
                "badring" => Some(BlkMode::BadRing),
                _ => None,
            };
            if plan.blk.is_none() {
                error("bad-blk", mode);
                ok = false;
            }
        } else if let Some(kind) = word.strip_prefix("fault=") {
            plan.fault = match kind {
                "triple" => Some(fault::TRIPLE),
                "ud" => Some(fault::UD),
                "pagefault" => Some(fault::PAGEFAULT),
                _ => {
                    error("unknown-fault", kind);
                    ok = false;
                    None
                }
            };
        }
    }
    if plan.net.any() && !mpi_given {
        error("net-needs-mpi", "net");
        ok = false;
    }
    match npb_items {
        None if plan.irq.is_some()
            || plan.probe.is_some()
            || plan.idle.is_some()
            || plan.net.any()
            || plan.blk.is_some()
            || mpi_given => {}
        None => {
            for spec in Spec::defaults() {
                plan.specs[plan.count] = spec;
                plan.count += 1;
            }
        }
        Some("") => {}
        Some(items) => {
            for item in items.split(',') {
                match item.parse::<Spec>() {
                    Ok(_) if plan.count == MAX_ITEMS => {
                        error("too-many-benchmarks", item);
                        ok = false;
                        break;
                    }
                    Ok(spec) => {
                        plan.specs[plan.count] = spec;
                        plan.count += 1;
                    }
                    Err(e) => {
                        error(e.kind(), e.item());
                        ok = false;
                    }
                }
            }
        }
    }
    plan.mpi = mpi_given;
    plan.balloon = balloon.then_some(balloon_spin_us.unwrap_or(plan.spin_us));
    if ok { Ok(plan) } else { Err(()) }
}

fn error(what: &str, item: &str) {
    let mut line = Line::new();
    let _ = write!(line, "@kumo error what={what} item={item}");
    line.emit();
}

// ---------------------------------------------------------------------------------------
// Output.

/// One output line, sent with a single trap call.
pub(crate) struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    pub(crate) fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    /// Writes the line whole: CPUs running MPI ranks print at once, and the supervisor
    /// writes a buffer 16 bytes at a time, so lines take turns.
    pub(crate) fn emit(mut self) {
        static WRITING: AtomicBool = AtomicBool::new(false);
        if self.len == self.buf.len() {
            self.len -= 1;
        }
        self.buf[self.len] = b'\n';
        while WRITING
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        sys::write(&self.buf[..=self.len]);
        WRITING.store(false, Ordering::Release);
    }
}

impl fmt::Write for Line {
    /// Cuts what does not fit (the newline always does).
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let mut line = Line::new();
    let _ = write!(line, "@kumo error what=panic item=");
    if let Some(location) = info.location() {
        let _ = write!(line, "{}:{}", location.file(), location.line());
    }
    line.emit();
    end(STATUS_FAULT)
}

/// The prebuilt `core` for this target is compiled for unwinding and refers to the
/// personality routine; with `panic = "abort"` nothing ever unwinds, so it is never called.
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}
