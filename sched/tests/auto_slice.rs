//! `tslice = "auto"` (`sched::auto_slice`) on synthetic pools: it takes the short slice
//! where spinning vCPUs queue behind each other while messages move, and keeps the
//! long one for compute-only and uncontended pools.

use sched::auto_slice::{EPOCH_NS, Setting};
use sched::drive::{Sim, Workload};
use sched::*;

/// Domain 0: wakes every `period_ns` for 20 us of work (a batch of frames).
fn dom0(period_ns: u64) -> Workload {
    Workload::Periodic {
        run_ns: 20 * NS_PER_US,
        sleep_ns: period_ns,
    }
}

/// A pool of 2 pCPUs under auto (from Xen's 30 ms defaults) with `spinners` domains
/// of one always-runnable vCPU, and domain 0 if `messages`; run for `secs` seconds.
fn pool(spinners: usize, messages: bool, secs: u64) -> Sim {
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    s.set_auto(0, true);
    let mut sim = Sim::new(s, 0);
    if messages {
        let d = sim.scheduler_mut().add_domain(256, 0).unwrap();
        sim.add_vcpu(d, dom0(NS_PER_MS));
    }
    for _ in 0..spinners {
        let d = sim.scheduler_mut().add_domain(256, 0).unwrap();
        sim.add_vcpu(d, Workload::Busy);
    }
    sim.run_until(secs * 1_000_000_000, |_| {});
    sim
}

fn auto(sim: &Sim) -> &auto_slice::AutoSlice {
    sim.scheduler().auto().expect("auto is on")
}

#[test]
fn oversubscribed_spinners_with_messages_get_the_short_slice_and_keep_it() {
    // S1's oversubscribed case: four spinning vCPUs on two pCPUs, domain 0 waking
    // a thousand times a second.
    let sim = pool(4, true, 2);
    let a = auto(&sim);
    assert_eq!(a.setting(), Setting::Short, "{:?}", a.changes());
    assert_eq!(sim.scheduler().params().tslice_ns, NS_PER_MS);
    assert_eq!(sim.scheduler().params().tick_ns, NS_PER_MS);
    // One change, after the hold: no flapping once there.
    assert_eq!(a.changes().len(), 1, "{:?}", a.changes());
    assert!(a.changes()[0].at_ns <= 5 * EPOCH_NS, "{:?}", a.changes());
    let (epochs, short) = a.epochs();
    assert!(short >= epochs - 5, "{epochs} epochs, {short} short");
}

#[test]
fn compute_only_and_uncontended_pools_keep_the_long_slice() {
    // Four spinners and no messages: EP on an oversubscribed host.
    let sim = pool(4, false, 2);
    assert_eq!(auto(&sim).setting(), Setting::Long);
    assert!(auto(&sim).changes().is_empty());
    assert_eq!(sim.scheduler().params(), Params::default());
    // A spinner a pCPU with domain 0 messaging: S1's node as kumo runs it. Domain 0's
    // wake-ups are BOOSTed and preempt; no slice ends with a vCPU queued behind it.
    let sim = pool(2, true, 2);
    assert_eq!(
        auto(&sim).setting(),
        Setting::Long,
        "{:?}",
        auto(&sim).changes()
    );
    assert!(auto(&sim).changes().is_empty());
}

#[test]
fn fixed_parameters_turn_auto_off_and_turning_it_off_restores_the_long_setting() {
    let mut sim = pool(4, true, 1);
    assert_eq!(auto(&sim).setting(), Setting::Short);
    let now = sim.now();
    sim.scheduler_mut().set_auto(now, false);
    assert!(sim.scheduler().auto().is_none());
    assert_eq!(sim.scheduler().params(), Params::default());

    let mut sim = pool(4, true, 1);
    let now = sim.now();
    let fixed = Params::with_tslice(10 * NS_PER_MS);
    sim.scheduler_mut().set_params(now, fixed).unwrap();
    assert!(sim.scheduler().auto().is_none());
    assert_eq!(sim.scheduler().params(), fixed);
    // Turning it on twice keeps the first state.
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    s.set_auto(0, true);
    s.set_auto(5, true);
    assert_eq!(s.auto().unwrap().long(), Params::default());
}
