//! The BSP's wait for the APs: the supervisor sends their start-up IPIs and goes on to
//! ring 3, so the BSP sets itself up while they start and waits here, before the
//! workload starts, until every AP has checked in (`kumo_abi::ApStart`).

use core::sync::atomic::Ordering;

use kumo_abi::{ApStart, BootInfo};

use crate::sys;

/// Spinning is native here; after this long the BSP sleeps (the APs may share host
/// CPUs with it) and each AP's check-in wakes it.
const SPIN_MS: u64 = 2;
/// The start-up IPI is sent again this often while an AP is missing.
const RESEND_MS: u64 = 10;
/// The boot fails after this much of the BSP's own waiting.
const TIMEOUT_MS: u64 = 1000;

/// Waits until all `info.cpus - 1` APs are in; false after the timeout. The timeout
/// counts at most two resend periods per step, so a VM paused meanwhile (a snapshot of
/// a booting VM) or a CPU taken away by the host does not fail the boot.
pub fn wait(info: &BootInfo) -> bool {
    if info.cpus <= 1 || info.ap_start == 0 {
        return true;
    }
    // SAFETY: the supervisor's `ApStart`, identity-mapped and readable from ring 3;
    // only atomics are used on it.
    let start = unsafe { &*(info.ap_start as *const ApStart) };
    let aps = info.cpus - 1;
    let ms = info.tsc_khz.max(1);
    let mut last = sys::rdtsc();
    let spin_until = last + SPIN_MS * ms;
    let mut resend_at = last + RESEND_MS * ms;
    let mut waited = 0;
    loop {
        let ready = start.ready.load(Ordering::SeqCst);
        if ready >= aps {
            return true;
        }
        let now = sys::rdtsc();
        waited += now.saturating_sub(last).min(2 * RESEND_MS * ms);
        last = now;
        if waited > TIMEOUT_MS * ms {
            return false;
        }
        if now > resend_at {
            sys::start_aps();
            resend_at = now + RESEND_MS * ms;
        }
        if now < spin_until {
            core::hint::spin_loop();
            continue;
        }
        start.bsp_waiting.store(1, Ordering::SeqCst);
        if start.ready.load(Ordering::SeqCst) != ready {
            continue;
        }
        if !sys::wait_until(start.ready.as_ptr(), ready, resend_at) {
            core::hint::spin_loop(); // no TSC-deadline timer: keep polling
        }
    }
}
