//! Unit tests pinning Xen credit1's arithmetic and mechanisms.

use sched::drive::{Sim, Workload};
use sched::*;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

fn sim(params: Params, pcpus: u32, doms: &[(u16, u32)]) -> (Sim, Vec<DomainId>) {
    let mut s = Scheduler::new(params, pcpus, 0).unwrap();
    let d = doms
        .iter()
        .map(|(w, c)| s.add_domain(*w, *c).unwrap())
        .collect();
    (Sim::new(s, 0), d)
}

fn st(sim: &Sim, v: VcpuId) -> VcpuStats {
    sim.scheduler().vcpu_stats(v)
}

/// Calls `schedule` on every tickled pCPU until none is left.
fn settle(s: &mut Scheduler, now: u64, mut t: Tickles) {
    while let Some(p) = t.pop_first() {
        t.extend(s.schedule(now, p).tickles);
    }
}

#[test]
fn credits_per_slice_scale_with_the_slice() {
    assert_eq!(Params::default().credits_per_tslice(), 300);
    assert_eq!(Params::with_tslice(MS).credits_per_tslice(), 10);
    assert_eq!(Params::with_tslice(100 * US).credits_per_tslice(), 1);
    assert_eq!(Params::with_tslice(100 * US).mcredits_per_tslice(), 1_000);
    assert_eq!(Params::with_tslice(1_000 * MS).credits_per_tslice(), 10_000);
}

#[test]
fn default_tick_follows_xen() {
    let p = Params::default();
    assert_eq!(
        (p.tslice_ns, p.tick_ns, p.ratelimit_ns),
        (30 * MS, 10 * MS, MS)
    );
    assert_eq!(Params::default_tick(10 * MS), 3_333 * US);
    assert_eq!(Params::default_tick(3 * MS), MS);
    assert_eq!(Params::default_tick(2 * MS), 2 * MS);
    // Ratelimit must stay below the slice: off for slices of 1 ms or less.
    assert_eq!(Params::with_tslice(MS).ratelimit_ns, 0);
    for t in [100 * US, MS, 2 * MS, 30 * MS, 1_000 * MS] {
        assert_eq!(Params::with_tslice(t).validate(), Ok(()));
    }
}

#[test]
fn burn_is_ten_credits_per_ms_with_residual() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    sim.run_until(10 * MS, |_| {});
    assert_eq!(st(&sim, a).credit, -100);
    assert_eq!(st(&sim, a).credit_milli, -100_000);
    // A 150 us run burns 1.5 credits; the 50 us left over is carried.
    let mut s = Scheduler::new(Params::default(), 1, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let v = s.add_vcpu(0, dom).unwrap();
    let t = s.wake(0, v);
    settle(&mut s, 0, t);
    let t = s.block(150 * US, v);
    settle(&mut s, 150 * US, t);
    assert_eq!(s.vcpu_stats(v).credit_milli, -1_500);
    assert_eq!(s.vcpu_stats(v).run_ns, 150 * US);
    let t = s.wake(200 * US, v);
    settle(&mut s, 200 * US, t);
    let t = s.block(200 * US + 50, v);
    settle(&mut s, 200 * US + 50, t);
    assert_eq!(s.vcpu_stats(v).credit_milli, -1_500);
    let t = s.wake(300 * US, v);
    settle(&mut s, 300 * US, t);
    let t = s.block(300 * US + 50, v);
    settle(&mut s, 300 * US + 50, t);
    assert_eq!(s.vcpu_stats(v).credit_milli, -1_501);
}

#[test]
fn accounting_shares_by_weight_then_clamps_and_halves() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0), (256, 0)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    let b = sim.add_vcpu(d[1], Workload::Busy);
    // Both wake BOOSTed; a runs first; b has never been seen by a tick.
    sim.run_until(0, |_| {});
    assert_eq!(st(&sim, a).state, VcpuState::Running);
    assert_eq!(st(&sim, b).priority, Priority::Boost);
    // The first tick activates a and removes its BOOST.
    sim.run_until(10 * MS, |_| {});
    assert_eq!(
        (st(&sim, a).priority, st(&sim, a).active, st(&sim, a).credit),
        (Priority::Under, true, -100)
    );
    // First accounting: a alone is active and gets the whole 300.
    sim.run_until(30 * MS, |_| {});
    assert_eq!(st(&sim, a).credit, 0);
    assert_eq!(st(&sim, b).state, VcpuState::Running);
    // Second: 300 shared 150/150; b ran the slice and is OVER.
    sim.run_until(60 * MS, |_| {});
    assert_eq!(
        (st(&sim, a).credit, st(&sim, a).priority),
        (150, Priority::Under)
    );
    assert_eq!(
        (st(&sim, b).credit, st(&sim, b).priority),
        (-150, Priority::Over)
    );
    // Shrink the slice to 5 ms (50 credits): at the next accounting a holds
    // 100 + 25 > 50, so it stops earning and is halved; b's -150 + 25 is
    // clamped to -50.
    let p = Params {
        tslice_ns: 5 * MS,
        tick_ns: MS,
        ratelimit_ns: MS,
        ..Params::default()
    };
    sim.scheduler_mut().set_params(60 * MS, p).unwrap();
    sim.run_until(65 * MS, |_| {});
    let (sa, sb) = (st(&sim, a), st(&sim, b));
    assert_eq!((sa.credit_milli, sa.active), (62_500, false));
    assert_eq!((sb.credit_milli, sb.priority), (-50_000, Priority::Over));
    assert_eq!(sim.scheduler().domain_stats(d[0]).active_vcpus, 0);
}

#[test]
fn unequal_weights_get_proportional_credit() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0), (768, 0)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    let b = sim.add_vcpu(d[1], Workload::Busy);
    sim.run_until(3_000 * MS, |_| {});
    let (ra, rb) = (sim.run_ns(a), sim.run_ns(b));
    assert_eq!(ra + rb, 3_000 * MS);
    // 1:3 within one slice.
    assert!(
        (ra as i64 - 750 * MS as i64).abs() <= 30 * MS as i64,
        "{ra} {rb}"
    );
}

#[test]
fn cap_parks_and_unparks_without_boost() {
    // cap 10 % of one pCPU = 30 credits per slice.
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 10)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    sim.run_until(30 * MS, |_| {});
    // -300 + min(fair, cap 30) = -270 < -30: parked and descheduled.
    let s = st(&sim, a);
    assert_eq!(
        (s.credit, s.parked, s.state),
        (-270, true, VcpuState::Parked)
    );
    assert_eq!(sim.running(PcpuId(0)), None);
    // 30 credits per slice: still parked after 8 more accountings...
    sim.run_until(270 * MS, |_| {});
    assert_eq!((st(&sim, a).credit, st(&sim, a).parked), (-30, true));
    // ... and unparked at the 9th when credit reaches 0, UNDER not BOOST.
    sim.run_until(300 * MS, |_| {});
    let s = st(&sim, a);
    assert_eq!(
        (s.credit, s.parked, s.state, s.priority),
        (0, false, VcpuState::Running, Priority::Under)
    );
    // Long-run share equals the cap (10 %) within one slice.
    sim.run_until(6_000 * MS, |_| {});
    let r = sim.run_ns(a) as i64;
    assert!((r - 600 * MS as i64).abs() <= 30 * MS as i64, "{r}");
}

#[test]
fn removing_the_cap_unparks() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 10)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    sim.run_until(31 * MS, |_| {});
    assert!(st(&sim, a).parked);
    let t = sim.scheduler_mut().set_domain(d[0], 256, 0).unwrap();
    sim.reschedule(t);
    sim.run_until(31 * MS, |_| {});
    assert_eq!(st(&sim, a).state, VcpuState::Running);
}

#[test]
fn wake_boosts_and_preempts_after_ratelimit() {
    let mut s = Scheduler::new(Params::default(), 1, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let a = s.add_vcpu(0, dom).unwrap();
    let b = s.add_vcpu(0, dom).unwrap();
    let t = s.wake(0, a);
    assert!(t.contains(PcpuId(0)));
    assert_eq!(s.vcpu_stats(a).priority, Priority::Boost);
    let d = s.schedule(0, PcpuId(0));
    assert_eq!(d.run, Some(a));
    assert_eq!(d.until_ns, 10 * MS);
    // The tick removes a's BOOST.
    assert!(s.tick(10 * MS, PcpuId(0)).is_empty());
    assert_eq!(s.vcpu_stats(a).priority, Priority::Under);
    // A slice end reschedules a; it continues (nothing else runnable).
    s.tick(20 * MS, PcpuId(0));
    let t = s.tick(30 * MS, PcpuId(0));
    assert!(t.contains(PcpuId(0)));
    assert_eq!(s.schedule(30 * MS, PcpuId(0)).run, Some(a));
    // Ratelimit: a was dispatched at 0, long ago, so b preempts at once.
    let t = s.wake(35 * MS, b);
    assert_eq!(s.vcpu_stats(b).priority, Priority::Boost);
    assert!(t.contains(PcpuId(0)));
    assert_eq!(s.schedule(35 * MS, PcpuId(0)).run, Some(b));
    // b blocks; a comes back at 36 ms, then b wakes 500 us later: a has run
    // less than the 1 ms ratelimit and keeps the CPU until 37 ms.
    let t = s.block(36 * MS, b);
    assert_eq!(s.schedule(36 * MS, PcpuId(0)).run, Some(a));
    assert!(t.contains(PcpuId(0)));
    let t = s.wake(36 * MS + 500 * US, b);
    assert!(t.contains(PcpuId(0)));
    let d = s.schedule(36 * MS + 500 * US, PcpuId(0));
    assert_eq!((d.run, d.until_ns), (Some(a), 37 * MS));
    let t = s.tick(37 * MS, PcpuId(0));
    assert!(t.contains(PcpuId(0)));
    assert_eq!(s.schedule(37 * MS, PcpuId(0)).run, Some(b));
}

#[test]
fn yield_bypasses_ratelimit_and_goes_behind_equals() {
    let mut s = Scheduler::new(Params::default(), 1, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let [a, b, c] = [0, 1, 2].map(|_| s.add_vcpu(0, dom).unwrap());
    for v in [a, b, c] {
        s.wake(0, v);
    }
    assert_eq!(s.schedule(0, PcpuId(0)).run, Some(a));
    assert_eq!(s.runq(PcpuId(0)).collect::<Vec<_>>(), [b, c]);
    let t = s.yield_vcpu(100 * US, a);
    assert!(t.contains(PcpuId(0)));
    assert_eq!(s.schedule(100 * US, PcpuId(0)).run, Some(b));
    assert_eq!(s.runq(PcpuId(0)).collect::<Vec<_>>(), [c, a]);
}

#[test]
fn round_robin_within_a_priority() {
    let mut s = Scheduler::new(Params::default(), 1, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let vs = [0, 1, 2].map(|_| s.add_vcpu(0, dom).unwrap());
    for v in vs {
        s.wake(0, v);
    }
    let mut order = vec![s.schedule(0, PcpuId(0)).run.unwrap()];
    let mut now = 0;
    while order.len() < 6 {
        now = s.next_deadline(PcpuId(0));
        if s.tick(now, PcpuId(0)).contains(PcpuId(0)) {
            order.push(s.schedule(now, PcpuId(0)).run.unwrap());
        }
    }
    assert_eq!(now, 150 * MS);
    // Slice ends rotate a, b, c, a, b; then c, having run the whole slice
    // before the 90 ms accounting, is OVER (-300 + 100) and a runs again.
    assert_eq!(order, [vs[0], vs[1], vs[2], vs[0], vs[1], vs[0]]);
}

#[test]
fn idle_pcpu_steals_queued_vcpu() {
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let [a, b, c] = [0, 1, 2].map(|_| s.add_vcpu(0, dom).unwrap());
    // a -> p0 and b -> p1 (free pCPUs); c finds none free and nobody below
    // BOOST running, so it queues at its home p0 without a tickle.
    for v in [a, b] {
        let t = s.wake(0, v);
        settle(&mut s, 0, t);
    }
    assert_eq!(
        (s.current(PcpuId(0)), s.current(PcpuId(1))),
        (Some(a), Some(b))
    );
    assert!(s.wake(0, c).is_empty());
    assert_eq!(s.runq(PcpuId(0)).collect::<Vec<_>>(), [c]);
    // b blocks: p1's local queue is empty, it steals c from p0.
    let t = s.block(5 * MS, b);
    settle(&mut s, 5 * MS, t);
    assert_eq!(s.current(PcpuId(1)), Some(c));
    assert_eq!(s.vcpu_stats(c).pcpu, PcpuId(1));
}

#[test]
fn wake_prefers_an_idle_pcpu_then_the_lowest_priority_one() {
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let [a, b] = [0, 1].map(|_| s.add_vcpu(0, dom).unwrap());
    let t = s.wake(0, a);
    settle(&mut s, 0, t);
    // b's home is p1, idle: it goes there rather than preempting a.
    let t = s.wake(0, b);
    assert_eq!(t.iter().collect::<Vec<_>>(), [PcpuId(1)]);
}

#[test]
fn stealing_balances_three_busy_vcpus_on_two_pcpus() {
    let (mut sim, d) = sim(Params::default(), 2, &[(256, 0), (256, 0), (256, 0)]);
    let vs: Vec<_> = d.iter().map(|d| sim.add_vcpu(*d, Workload::Busy)).collect();
    sim.run_until(6_000 * MS, |_| {});
    // Without OVER-stealing the lone vCPU would keep a whole pCPU.
    for v in vs {
        let r = sim.run_ns(v) as i64;
        assert!((r - 4_000 * MS as i64).abs() <= 120 * MS as i64, "{v}: {r}");
    }
}

#[test]
fn migration_delay_keeps_cache_hot_vcpus() {
    let p = Params {
        migration_delay_ns: 10 * MS,
        ..Params::default()
    };
    let mut s = Scheduler::new(p, 2, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let [a, b, c] = [0, 1, 2].map(|_| s.add_vcpu(0, dom).unwrap());
    for v in [a, b, c] {
        let t = s.wake(0, v);
        settle(&mut s, 0, t);
    }
    // c was never descheduled: last left a pCPU at creation (t=0), so at
    // 5 ms it is cache-hot and p1 stays idle; at 12 ms it is stolen.
    let t = s.block(5 * MS, b);
    settle(&mut s, 5 * MS, t);
    assert_eq!(s.current(PcpuId(1)), None);
    let t = s.wake(12 * MS, b);
    settle(&mut s, 12 * MS, t);
    assert_eq!(s.current(PcpuId(1)), Some(b));
}

#[test]
fn parameter_validation_names_the_range() {
    let bad = |p: Params| p.validate().unwrap_err().to_string();
    let d = Params::default();
    assert_eq!(
        bad(Params {
            tslice_ns: 50 * US,
            ..d
        }),
        "tslice_ns = 50000: must be in 100000..=1000000000 (100 us to 1000 ms)"
    );
    assert!(
        bad(Params {
            tslice_ns: 1_001 * MS,
            ..d
        })
        .starts_with("tslice_ns = 1001000000")
    );
    assert_eq!(
        bad(Params {
            tick_ns: 40 * MS,
            ..d
        }),
        "tick_ns = 40000000: must be in 100000..=30000000 (100 us to tslice_ns)"
    );
    assert!(
        bad(Params {
            tick_ns: 99 * US,
            ..d
        })
        .starts_with("tick_ns = 99000")
    );
    assert_eq!(
        bad(Params {
            ratelimit_ns: 50 * US,
            ..d
        }),
        "ratelimit_ns = 50000: must be 0 (off) or in 100000..=500000000 (100 us to 500 ms) \
         and below tslice_ns = 30000000"
    );
    assert!(
        bad(Params {
            ratelimit_ns: 30 * MS,
            ..d
        })
        .starts_with("ratelimit_ns = 30000000")
    );
    assert_eq!(
        bad(Params {
            migration_delay_ns: 101 * MS,
            ..d
        }),
        "migration_delay_ns = 101000000: must be in 0..=100000000 (0 to 100 ms)"
    );
    assert_eq!(
        Scheduler::new(d, 0, 0).unwrap_err().to_string(),
        "pcpus = 0: must be in 1..=256"
    );
    let mut s = Scheduler::new(d, 2, 0).unwrap();
    assert_eq!(
        s.add_domain(0, 0).unwrap_err().to_string(),
        "weight = 0: must be in 1..=65535"
    );
    assert_eq!(
        s.add_domain(256, 201).unwrap_err().to_string(),
        "cap = 201: must be 0 (none) or in 1..=200 (% of one pCPU, 100 per pCPU)"
    );
    assert!(s.add_domain(65535, 200).is_ok());
    assert_eq!(
        s.set_params(0, Params { tick_ns: 0, ..d }),
        Err(ParamError::Tick {
            tick_ns: 0,
            tslice_ns: 30 * MS
        })
    );
    assert_eq!(s.params(), d);
}

#[test]
fn set_params_changes_tick_and_slice_at_run_time() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0), (256, 0)]);
    sim.add_vcpu(d[0], Workload::Busy);
    sim.add_vcpu(d[1], Workload::Busy);
    sim.run_until(100 * MS, |_| {});
    let p = Params {
        tslice_ns: MS,
        tick_ns: MS,
        ratelimit_ns: 0,
        ..Params::default()
    };
    sim.scheduler_mut().set_params(100 * MS, p).unwrap();
    let mut switches = 0;
    let mut last = sim.running(PcpuId(0));
    sim.run_until(200 * MS, |s| {
        if s.running(PcpuId(0)) != last {
            switches += 1;
            last = s.running(PcpuId(0));
        }
        assert!(s.scheduler().next_deadline(PcpuId(0)) <= s.now() + MS);
    });
    // 1 ms slices: far more switches than the 3 that 30 ms slices allow.
    assert!(switches >= 40, "{switches}");
}

#[test]
fn deterministic() {
    let run = || {
        let (mut sim, d) = sim(Params::default(), 3, &[(128, 0), (512, 50), (256, 0)]);
        for (i, d) in d.iter().enumerate() {
            sim.add_vcpu(*d, Workload::Busy);
            sim.add_vcpu(
                *d,
                Workload::Periodic {
                    run_ns: (i as u64 + 1) * 700 * US,
                    sleep_ns: 3 * MS,
                },
            );
        }
        let mut trace = Vec::new();
        sim.run_until(500 * MS, |s| {
            trace.push((
                s.now(),
                (0..3).map(|p| s.running(PcpuId(p))).collect::<Vec<_>>(),
            ))
        });
        trace
    };
    assert_eq!(run(), run());
}

#[test]
fn credit1_is_loose_with_unequal_weights() {
    // Pinned credit1 artefact (see tests/props.rs (a2)): the 402-weight vCPU
    // should get 68 % but is repeatedly halved and deactivated above one
    // slice of credit while waiting its round-robin turn among UNDER vCPUs.
    for tslice in [MS, 30 * MS] {
        let (mut sim, d) = sim(
            Params::with_tslice(tslice),
            1,
            &[(402, 0), (64, 0), (64, 0), (64, 0)],
        );
        let vs: Vec<_> = d.iter().map(|d| sim.add_vcpu(*d, Workload::Busy)).collect();
        sim.run_until(3_000 * tslice, |_| {});
        let pct: Vec<u64> = vs
            .iter()
            .map(|v| sim.run_ns(*v) * 100 / (3_000 * tslice))
            .collect();
        assert_eq!(pct, [40, 20, 20, 20]);
    }
}

#[test]
fn wake_before_reschedule_keeps_running() {
    let mut s = Scheduler::new(Params::default(), 1, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let a = s.add_vcpu(0, dom).unwrap();
    let t = s.wake(0, a);
    settle(&mut s, 0, t);
    // Halt and wake again before the pCPU reschedules: no double queueing.
    s.block(5 * MS, a);
    assert!(s.wake(5 * MS, a).is_empty());
    assert_eq!(s.runq_len(PcpuId(0)), 0);
    assert_eq!(s.schedule(5 * MS, PcpuId(0)).run, Some(a));
}

#[test]
fn removed_vcpus_stop_and_stop_earning() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0), (256, 0)]);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    let b = sim.add_vcpu(d[1], Workload::Busy);
    sim.run_until(100 * MS, |_| {});
    let t = sim.scheduler_mut().remove_domain(100 * MS, d[0]).unwrap();
    sim.reschedule(t);
    sim.run_until(200 * MS, |_| {});
    let s = sim.scheduler();
    assert_eq!(s.vcpu_stats(a).state, VcpuState::Removed);
    assert!(!s.vcpu_stats(a).active);
    assert_eq!(s.domain_stats(d[0]).active_vcpus, 0);
    assert_eq!(s.current(PcpuId(0)), Some(b));
    let ran = sim.run_ns(a);
    assert!(sim.scheduler_mut().wake(200 * MS, a).is_empty());
    sim.run_until(300 * MS, |_| {});
    assert_eq!(sim.run_ns(a), ran);
    assert_eq!(sim.run_ns(b) + ran, 300 * MS);
}

#[test]
fn invariant_checker_sees_pending_work() {
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    let dom = s.add_domain(256, 0).unwrap();
    let a = s.add_vcpu(0, dom).unwrap();
    assert_eq!(s.check_invariants(), Ok(()));
    // Woken but its pCPU has not rescheduled yet: not quiescent.
    let t = s.wake(0, a);
    assert_eq!(
        s.check_invariants(),
        Err("p0 idle while vCPUs wait".to_string())
    );
    settle(&mut s, 0, t);
    assert_eq!(s.check_invariants(), Ok(()));
}

#[test]
fn xen_accounting_lag_lets_a_cap_overrun() {
    // Xen-faithful accounting (credit as of each pCPU's last tick) with the
    // tick as long as the slice: over 60 slices a 6 % cap runs 7 ms, beyond
    // the cap plus 2 slices (5.6 ms) that exact accounting guarantees; with
    // exact accounting it runs 4 ms.
    for (sync, ran) in [(false, 7 * MS), (true, 4 * MS)] {
        let p = Params {
            sync_accounting: sync,
            ..Params::with_tslice(MS)
        };
        let (mut sim, d) = sim(p, 2, &[(256, 6), (64, 0), (64, 0)]);
        let v = sim.add_vcpu(d[0], Workload::Busy);
        sim.add_vcpu(d[1], Workload::Busy);
        sim.add_vcpu(d[2], Workload::Yielder { run_ns: 176 * US });
        sim.run_until(60 * MS, |_| {});
        assert_eq!(sim.run_ns(v), ran, "sync_accounting = {sync}");
    }
}

#[test]
fn tick_phase_locked_vcpu_escapes_accounting() {
    // As in Xen, only a tick that finds a vCPU running activates it and ends
    // its BOOST. Here a yielder (3.439 ms bursts) and an I/O vCPU (311 us
    // bursts) form a 3.75 ms cycle that divides the 15 ms tick, so every tick
    // finds the I/O vCPU finishing its burst: the yielder stays BOOSTed and
    // inactive for ever and the busy vCPU starves after its first slice.
    let p = Params {
        tick_ns: 15 * MS,
        ..Params::default()
    };
    let (mut sim, d) = sim(p, 1, &[(64, 0), (64, 0), (64, 0)]);
    let busy = sim.add_vcpu(d[0], Workload::Busy);
    let y = sim.add_vcpu(d[1], Workload::Yielder { run_ns: 3_439 * US });
    sim.add_vcpu(
        d[2],
        Workload::Periodic {
            run_ns: 311 * US,
            sleep_ns: 100 * US,
        },
    );
    sim.run_until(3_000 * MS, |_| {});
    let s = st(&sim, y);
    assert_eq!((s.priority, s.active), (Priority::Boost, false));
    assert_eq!(sim.run_ns(busy), 30 * MS);
}

/// Xen 3.4's tick accounting against exact accounting on the same trace, before the
/// first accounting (30 ms), so the numbers are the debits alone.
#[test]
fn tick_accounting_debits_whole_ticks_from_whoever_is_running() {
    let exact = Params {
        ratelimit_ns: 0,
        ..Params::default()
    };
    let tick = Params {
        accounting: Accounting::Tick,
        ..exact
    };
    // A busy vCPU pays the same either way: at 25 ms, exact has burned up to the tick
    // at 20 ms (-200) and tick debited the ticks at 10 and 20 ms (-200).
    for (params, want) in [(exact, -200), (tick, -200)] {
        let (mut sim, d) = sim(params, 1, &[(256, 0)]);
        let a = sim.add_vcpu(d[0], Workload::Busy);
        sim.run_until(25 * MS, |_| {});
        assert_eq!(st(&sim, a).credit, want, "{:?}", params.accounting);
        assert_eq!(sim.run_ns(a), 25 * MS);
    }
    // 2 ms runs every 9.5 ms ([0,2), [9.5,11.5), [19,21)): exact burns 6 ms (-60);
    // tick finds it running at 10 and 20 ms and debits two whole ticks (-200).
    for (params, want) in [(exact, -60), (tick, -200)] {
        let (mut sim, d) = sim(params, 1, &[(256, 0)]);
        let a = sim.add_vcpu(
            d[0],
            Workload::Periodic {
                run_ns: 2 * MS,
                sleep_ns: 7_500 * US,
            },
        );
        sim.run_until(25 * MS, |_| {});
        assert_eq!(st(&sim, a).credit, want, "{:?}", params.accounting);
    }
}

#[test]
fn tick_accounting_has_no_ratelimit() {
    let p = Params {
        accounting: Accounting::Tick,
        ..Params::default()
    };
    assert_eq!(p.validate(), Err(ParamError::TickAccountingRatelimit(MS)));
    assert_eq!(
        Params {
            ratelimit_ns: 0,
            ..p
        }
        .validate(),
        Ok(())
    );
    assert_eq!("tick".parse::<Accounting>(), Ok(Accounting::Tick));
    assert!("xen".parse::<Accounting>().is_err());
}

/// A half-speed pool (`set_speed_percent(50)`): every domain runs at half the rate it
/// would have on a full-speed pool, alone or sharing, and as domains arrive. A fixed
/// per-domain cap of 50 would let two domains sharing the pCPU run 50 % each.
#[test]
fn a_half_speed_pool_halves_every_domains_rate_however_many_share_it() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0), (256, 0)]);
    sim.scheduler_mut().set_speed_percent(50).unwrap();
    let a = sim.add_vcpu(d[0], Workload::Busy);
    // Alone: half the pCPU (a full-speed pool would give it all of it).
    sim.run_until(6_000 * MS, |_| {});
    let alone = sim.run_ns(a) as i64;
    assert!(
        (alone - 3_000 * MS as i64).abs() <= 60 * MS as i64,
        "{alone}"
    );
    // A second domain arrives: each gets a quarter (half of its full-speed half).
    let b = sim.add_vcpu(d[1], Workload::Busy);
    sim.run_until(12_000 * MS, |_| {});
    let ra = sim.run_ns(a) as i64 - alone;
    let rb = sim.run_ns(b) as i64;
    assert!((ra - 1_500 * MS as i64).abs() <= 90 * MS as i64, "{ra}");
    assert!((rb - 1_500 * MS as i64).abs() <= 90 * MS as i64, "{rb}");
}

#[test]
fn a_full_speed_pool_is_uncapped_and_a_speed_out_of_range_is_refused() {
    let (mut sim, d) = sim(Params::default(), 1, &[(256, 0)]);
    assert_eq!(sim.scheduler().speed_percent(), 100);
    let a = sim.add_vcpu(d[0], Workload::Busy);
    sim.run_until(3_000 * MS, |_| {});
    assert_eq!(sim.run_ns(a), 3_000 * MS);
    let s = sim.scheduler_mut();
    assert_eq!(s.set_speed_percent(0), Err(ParamError::Speed(0)));
    assert_eq!(s.set_speed_percent(101), Err(ParamError::Speed(101)));
}

/// The speed share is by weight: at 50 % a domain of weight 512 gets twice the
/// run time of one of 256, together half the pCPU.
#[test]
fn a_slow_pool_shares_its_speed_by_weight() {
    let (mut sim, d) = sim(Params::default(), 1, &[(512, 0), (256, 0)]);
    sim.scheduler_mut().set_speed_percent(50).unwrap();
    let a = sim.add_vcpu(d[0], Workload::Busy);
    let b = sim.add_vcpu(d[1], Workload::Busy);
    sim.run_until(9_000 * MS, |_| {});
    let (ra, rb) = (sim.run_ns(a) as i64, sim.run_ns(b) as i64);
    assert!((ra - 3_000 * MS as i64).abs() <= 90 * MS as i64, "{ra}");
    assert!((rb - 1_500 * MS as i64).abs() <= 90 * MS as i64, "{rb}");
}
