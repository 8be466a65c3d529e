//! Trap calls into the supervisor (`int3`; see `kumo_abi::call`) and native ring-3
//! instructions.

use core::arch::asm;

use kumo_abi::call;

/// # Safety
/// The arguments must be valid for the call (pointers to memory this program owns).
unsafe fn trap(number: u64, a: u64, b: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { trap3(number, a, b, 0) }
}

/// # Safety
/// As [`trap`], with a third argument.
unsafe fn trap3(number: u64, a: u64, b: u64, c: u64) -> u64 {
    let result;
    // SAFETY: the supervisor's int3 gate implements the call; it may clobber every
    // caller-saved register, which clobber_abi declares.
    unsafe {
        asm!(
            "int3",
            in("rdi") number,
            in("rsi") a,
            in("rdx") b,
            in("rcx") c,
            lateout("rax") result,
            clobber_abi("C"),
        )
    };
    result
}

pub fn write(bytes: &[u8]) {
    // SAFETY: the supervisor only reads the buffer.
    unsafe { trap(call::WRITE, bytes.as_ptr() as u64, bytes.len() as u64) };
}

pub fn exit(status: u32) -> ! {
    // SAFETY: no pointers involved.
    unsafe { trap(call::EXIT, u64::from(status), 0) };
    // The supervisor never returns from EXIT.
    loop {
        core::hint::spin_loop();
    }
}

/// Sleeps until an interrupt if `*word == expected` (may return spuriously).
pub fn wait(word: *const u32, expected: u32) {
    // SAFETY: `word` points to one of our own u32s; the supervisor only reads it.
    unsafe { trap(call::WAIT, word as u64, u64::from(expected)) };
}

/// Sleeps until an interrupt or `until_tsc` if `*word == expected` (may return
/// spuriously); false, without sleeping, if the machine has no TSC-deadline timer.
pub fn wait_until(word: *const u32, expected: u32, until_tsc: u64) -> bool {
    // SAFETY: `word` points to a u32 that stays valid (ours or the supervisor's
    // interrupt log); the supervisor only reads it.
    unsafe {
        trap3(
            call::WAIT_UNTIL,
            word as u64,
            u64::from(expected),
            until_tsc.wrapping_add(clock_offset()),
        ) == 0
    }
}

/// Interrupts every other CPU, ending their `wait`.
pub fn wake() {
    // SAFETY: no pointers involved.
    unsafe { trap(call::WAKE, 0, 0) };
}

/// kumo's paravirtual wait page (`docs/guest-abi.md`): identity-mapped for ring 3
/// like all of the low 4 GiB; each write exits to the VMM.
const PV_WAIT_PAGE: u64 = 0xe010_0000;

/// Blocks this vCPU in the VMM while `*word == expected` (may return spuriously).
pub fn pv_wait(word: *const u32, expected: u32) {
    let request = (u64::from(expected) << 32) | word as u64;
    // SAFETY: an MMIO register of kumo's wait page (an exit, no memory behind it);
    // `word` is one of our own u32s below 4 GiB, which the VMM only reads.
    unsafe { core::ptr::write_volatile(PV_WAIT_PAGE as *mut u64, request) };
}

/// As [`pv_wait`] for a vCPU parked until `word` changes: kumo blocks it up to a
/// second at a time instead of 10 ms.
pub fn pv_park(word: *const u32, expected: u32) {
    let request = (u64::from(expected) << 32) | word as u64;
    // SAFETY: as in `pv_wait` (the page's PARK register).
    unsafe { core::ptr::write_volatile((PV_WAIT_PAGE + 0x18) as *mut u64, request) };
}

/// Wakes every vCPU blocked in [`pv_wait`] or [`pv_park`] on `word`.
pub fn pv_wake(word: *const u32) {
    // SAFETY: as in `pv_wait`; the VMM uses the address only as a key.
    unsafe { core::ptr::write_volatile((PV_WAIT_PAGE + 8) as *mut u64, word as u64) };
}

/// Asks kumo to keep the number of host CPUs this VM may use in `word` (now and
/// whenever it changes: `kumo ctl vcpu-balloon`).
pub fn pv_host_cpus(word: *const u32) {
    // SAFETY: as in `pv_wait`; the VMM writes only that aligned u32 of ours.
    unsafe { core::ptr::write_volatile((PV_WAIT_PAGE + 0x10) as *mut u64, word as u64) };
}

/// Sends the APs' start-up IPI again.
pub fn start_aps() {
    // SAFETY: no pointers involved.
    unsafe { trap(call::START_APS, 0, 0) };
}

pub fn mark_start() {
    // SAFETY: no pointers involved.
    unsafe { trap(call::MARK_START, 0, 0) };
}

pub fn fault(kind: u64) {
    // SAFETY: no pointers involved; the supervisor faults (and ends the VM).
    unsafe { trap(call::FAULT, kind, 0) };
}

/// Halts until the TSC reaches `until` (or an interrupt); false if the machine has no
/// TSC-deadline timer.
pub fn sleep_until(until: u64) -> bool {
    // SAFETY: no pointers involved.
    unsafe { trap(call::SLEEP, until.wrapping_add(clock_offset()), 0) == 0 }
}

/// The guest's clock in TSC ticks: the TSC less the time the VM spent saved
/// (`kumo_abi::CLOCK_OFFSET`), so a benchmark timed across a snapshot and a restore
/// does not count the time the snapshot waited on disk.
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC is allowed in ring 3 (CR4.TSD clear) and has no side effects.
    guest_clock(unsafe { core::arch::x86_64::_rdtsc() })
}

/// A raw TSC value (one the supervisor recorded, such as an interrupt's arrival) on
/// the guest's clock, comparable with [`rdtsc`].
pub fn guest_clock(tsc: u64) -> u64 {
    tsc.wrapping_sub(clock_offset())
}

/// What to take off the TSC for the guest's clock (written by kumo at a restore).
fn clock_offset() -> u64 {
    // SAFETY: an aligned u64 in guest RAM (identity-mapped, readable from ring 3)
    // that only the hypervisor writes, while the VM does not run.
    unsafe { core::ptr::read_volatile(kumo_abi::CLOCK_OFFSET as *const u64) }
}

/// This CPU multiplexes the tasks of `queue` (the caller is its current task), ticking
/// at `hz` (0: no tick); false if the machine cannot (no x2APIC or timer rate).
pub fn sched_start(queue: *mut kumo_abi::sched::RunQueue, hz: u64) -> bool {
    // SAFETY: the run queue is ours and stays valid (a static) until `sched_stop`;
    // the supervisor reads and writes it only while it is installed.
    unsafe { trap(call::SCHED_START, queue as u64, hz) == 0 }
}

/// This CPU's scheduler off (only from the task that started it).
pub fn sched_stop() {
    // SAFETY: no pointers involved.
    unsafe { trap(call::SCHED_STOP, 0, 0) };
}

/// Hands the CPU to the next runnable task of this CPU's run queue (see
/// `kumo_abi::call::SWITCH`); returns when this task runs again.
pub fn switch() {
    // SAFETY: no pointers involved; the supervisor saves and restores every register
    // of this task (vector registers too) around the switch.
    unsafe { trap(call::SWITCH, 0, 0) };
}
