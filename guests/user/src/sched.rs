//! Several MPI ranks per CPU (`ranks_per_vcpu=R`): the ring-3 half of the supervisor's
//! preemptive scheduler (`kumo_abi::sched`, `boot.S`). Ring 3 builds each CPU's run
//! queue and its tasks (stacks, a first frame, an FXSAVE image, all at native speed);
//! ring 0 only switches: at the end of a slice of the periodic tick (`guest_hz=`), in
//! `SWITCH` (a yield, or a block until a word moves), and when a device interrupt
//! arrives while tasks wait (a wake-up).
//!
//! On CPU `c` the caller is task 0 and runs one rank; tasks `1..R` are new contexts
//! that each run one rank on a stack of their own and then wait forever. Task 0 waits
//! (blocked, not spinning) until they are all done, then stops the scheduler.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

use kumo_abi::MAX_CPUS;
pub use kumo_abi::sched::MAX_TASKS;
use kumo_abi::sched::{FRAME_QWORDS, RunQueue, TASK};

use crate::sys;

/// Each extra task's ring-3 stack (as the supervisor gives each CPU), its kernel stack
/// (traps and interrupts taken while it runs, and its saved frame) and its FXSAVE area.
const USER_STACK_BYTES: u64 = 256 << 10;
const KERNEL_STACK_BYTES: u64 = 16 << 10;
const FX_BYTES: u64 = 4096;
/// Memory one task takes from [`Tasks::bytes`]'s area.
pub const TASK_BYTES: u64 = USER_STACK_BYTES + KERNEL_STACK_BYTES + FX_BYTES;
/// GDT selectors of ring 3 (boot.S).
const SEL_USER_CODE: u64 = 0x2B;
const SEL_USER_DATA: u64 = 0x23;

/// A CPU's run queue: written by that CPU's tasks (and by ring 0 on it) only.
struct Queue(UnsafeCell<RunQueue>);
// SAFETY: each queue is used by one CPU only (its tasks run one at a time, and ring 0
// runs on that CPU with interrupts off), see `queue`.
unsafe impl Sync for Queue {}

static QUEUES: [Queue; MAX_CPUS] = [const { Queue(UnsafeCell::new(RunQueue::new())) }; MAX_CPUS];
/// Per CPU: extra tasks that have finished their rank.
static DONE: [AtomicU32; MAX_CPUS] = [const { AtomicU32::new(0) }; MAX_CPUS];
/// A word that never changes: a finished task waits on it forever.
static NEVER: AtomicU32 = AtomicU32::new(0);

fn queue(cpu: u32) -> *mut RunQueue {
    QUEUES[cpu as usize].0.get()
}

/// What a CPU's tasks need: `count` tasks, ticking at `hz` with `slice` ticks per
/// slice, each extra task's memory from `memory` ([`TASK_BYTES`] each, page-aligned).
#[derive(Clone, Copy)]
pub struct Tasks {
    pub count: usize,
    pub hz: u64,
    pub slice: u64,
    pub memory: u64,
}

impl Tasks {
    /// Memory for the tasks of one CPU.
    pub const fn bytes(count: usize) -> u64 {
        count as u64 * TASK_BYTES
    }
}

/// Why the scheduler could not start.
#[derive(Clone, Copy, Debug)]
pub enum Error {
    TooManyTasks,
    /// The supervisor refused (no x2APIC, or no LAPIC timer rate).
    NoTick,
}

impl Error {
    pub fn name(self) -> &'static str {
        match self {
            Error::TooManyTasks => "too-many-tasks",
            Error::NoTick => "no-tick",
        }
    }
}

/// Runs `tasks.count` tasks on CPU `cpu` (the caller's): task `k` runs `body(arg, k)`;
/// task 0 is the caller itself. Returns once every task has returned from `body`,
/// with the scheduler stopped. `arg` must stay valid until then.
pub fn run(cpu: u32, tasks: Tasks, arg: u64, body: extern "C" fn(u64, u64)) -> Result<(), Error> {
    if tasks.count == 0 || tasks.count > MAX_TASKS || tasks.count > 255 {
        return Err(Error::TooManyTasks);
    }
    let rq = queue(cpu);
    DONE[cpu as usize].store(0, Ordering::SeqCst);
    // SAFETY: this CPU's queue, not installed in ring 0 yet (no other user); every
    // task's memory is its own (`TASK_BYTES` apart from `tasks.memory`), identity-mapped.
    unsafe {
        *rq = RunQueue::new();
        (*rq).count = tasks.count as u64;
        (*rq).slice = tasks.slice.max(1);
        for k in 0..tasks.count {
            let mut task = TASK;
            if tasks.count > 1 {
                // Task 0's area is written at its first switch; a lone task never
                // switches (a tick only) and needs no memory at all.
                let base = tasks.memory + k as u64 * TASK_BYTES;
                task.fx = base + USER_STACK_BYTES + KERNEL_STACK_BYTES;
            }
            if k > 0 {
                let base = tasks.memory + k as u64 * TASK_BYTES;
                // This task's SSE/x87 state starts as ours (MXCSR, control words).
                core::arch::asm!("fxsave64 [{}]", in(reg) task.fx, options(nostack));
                let stack_top = base + USER_STACK_BYTES;
                let kernel_top = stack_top + KERNEL_STACK_BYTES;
                // The run queue in the kernel stack's top qword (boot.S reads it at
                // RSP0 + 8), RSP0 16 bytes below the top, the first frame below RSP0.
                ((kernel_top - 8) as *mut u64).write(rq as u64);
                task.kstack_top = kernel_top - 16;
                task.ksp = task.kstack_top - 8 * FRAME_QWORDS as u64;
                let frame = task.ksp as *mut u64;
                for i in 0..FRAME_QWORDS {
                    frame.add(i).write(0);
                }
                // r15 ... rax (PUSH_ORDER reversed), then the interrupt frame: the
                // task starts in `task_start(arg, who, body)` as if called.
                frame.add(9).write(arg); // rdi
                frame.add(10).write(k as u64 | (u64::from(cpu) << 8)); // rsi
                frame.add(12).write(body as *const () as u64); // rdx
                frame.add(15).write(task_start as *const () as u64); // rip
                frame.add(16).write(SEL_USER_CODE);
                frame.add(17).write(0x202); // rflags: IF
                frame.add(18).write(stack_top - 8); // rsp: a return address's room
                frame.add(19).write(SEL_USER_DATA);
            }
            (*rq).tasks[k] = task;
        }
    }
    if !sys::sched_start(rq, tasks.hz) {
        return Err(Error::NoTick);
    }
    body(arg, 0);
    let others = tasks.count as u32 - 1;
    loop {
        let done = DONE[cpu as usize].load(Ordering::SeqCst);
        if done >= others {
            break;
        }
        let word = DONE[cpu as usize].as_ptr().cast_const();
        block(cpu, word, done, word, done, u64::MAX);
    }
    sys::sched_stop();
    Ok(())
}

/// Where every extra task starts (its first frame): `arg`, CPU << 8 | task, the body.
extern "C" fn task_start(arg: u64, who: u64, body: u64) -> ! {
    let cpu = (who >> 8) as u32;
    // SAFETY: `run` stored a valid `extern "C" fn(u64, u64)` there.
    let body: extern "C" fn(u64, u64) = unsafe { core::mem::transmute(body as usize) };
    body(arg, who & 0xFF);
    DONE[cpu as usize].fetch_add(1, Ordering::SeqCst);
    let never = NEVER.as_ptr().cast_const();
    loop {
        block(cpu, never, 0, never, 0, u64::MAX);
    }
}

/// The current task of CPU `cpu` waits until the u32 at `word` differs from `value` or
/// the one at `word2` from `value2`, or the TSC reaches `until`: the CPU runs its other
/// tasks meanwhile, or halts if none can run.
pub fn block(cpu: u32, word: *const u32, value: u32, word2: *const u32, value2: u32, until: u64) {
    let rq = queue(cpu);
    // SAFETY: this CPU's queue, installed: ring 0 reads these fields only at a switch
    // on this CPU, and the current task is ours for as long as we run. `wait_word` is
    // written last and cleared after: a tick in between sees a complete condition.
    unsafe {
        let current = core::ptr::read_volatile(&raw const (*rq).current) as usize;
        let task = &raw mut (*rq).tasks[current];
        core::ptr::write_volatile(&raw mut (*task).wait_value, u64::from(value));
        core::ptr::write_volatile(&raw mut (*task).wait_word2, word2 as u64);
        core::ptr::write_volatile(&raw mut (*task).wait_value2, u64::from(value2));
        core::ptr::write_volatile(&raw mut (*task).wait_until, until);
        core::ptr::write_volatile(&raw mut (*task).wait_word, word as u64);
        sys::switch();
        core::ptr::write_volatile(&raw mut (*task).wait_word, 0);
    }
}

/// `sched_yield`: the CPU to the next runnable task of CPU `cpu`, if any.
pub fn yield_now(_cpu: u32) {
    sys::switch();
}

/// CPU `cpu`'s scheduler counters: (ticks, switches, halts).
pub fn counters(cpu: u32) -> (u64, u64, u64) {
    let rq = queue(cpu);
    // SAFETY: plain reads of this CPU's own queue.
    unsafe {
        (
            core::ptr::read_volatile(&raw const (*rq).ticks),
            core::ptr::read_volatile(&raw const (*rq).switches),
            core::ptr::read_volatile(&raw const (*rq).halts),
        )
    }
}
