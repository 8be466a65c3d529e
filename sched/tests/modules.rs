//! The module-aware pick (`Scheduler::set_modules`): pCPUs declared as modules of two
//! cores sharing a front end (S3's Bulldozer), tested on any host.

use sched::*;

/// Calls `schedule` on every tickled pCPU until none is left.
fn settle(s: &mut Scheduler, now: u64, mut t: Tickles) {
    while let Some(p) = t.pop_first() {
        t.extend(s.schedule(now, p).tickles);
    }
}

/// A scheduler of `pcpus` pCPUs (modules of two if `aware`) with one domain of
/// `vcpus` vCPUs, all woken at time 0 in order.
fn woken(pcpus: u32, vcpus: u32, aware: bool) -> (Scheduler, Vec<VcpuId>) {
    let mut s = Scheduler::new(Params::default(), pcpus, 0).unwrap();
    if aware {
        s.set_modules(Some(Modules::uniform(pcpus, 2).unwrap()))
            .unwrap();
    }
    let d = s.add_domain(256, 0).unwrap();
    let vs: Vec<_> = (0..vcpus).map(|_| s.add_vcpu(0, d).unwrap()).collect();
    for v in &vs {
        let t = s.wake(0, *v);
        settle(&mut s, 0, t);
    }
    (s, vs)
}

fn running_on(s: &Scheduler) -> Vec<u32> {
    (0..s.pcpus())
        .filter(|p| s.current(PcpuId(*p)).is_some())
        .collect()
}

#[test]
fn without_modules_two_wakeups_share_a_module_with_them_they_do_not() {
    let (plain, _) = woken(8, 2, false);
    assert_eq!(running_on(&plain), [0, 1], "Xen's pick: the vCPUs' homes");
    let (aware, _) = woken(8, 2, true);
    assert_eq!(running_on(&aware), [0, 2], "one busy core per module");
    let m = aware.modules().unwrap();
    assert_eq!(m.contended(|p| aware.current(p).is_some()), 0);
    assert_eq!(m.contended(|p| plain.current(p).is_some()), 1);
}

#[test]
fn module_aware_fills_one_core_per_module_then_the_siblings() {
    let (s, _) = woken(8, 4, true);
    assert_eq!(running_on(&s), [0, 2, 4, 6]);
    let (s, vs) = woken(8, 6, true);
    assert_eq!(running_on(&s).len(), 6, "no free pCPU is left unused");
    assert!(
        vs.iter()
            .all(|v| s.vcpu_stats(*v).state == VcpuState::Running)
    );
    let m = s.modules().unwrap();
    assert_eq!(m.contended(|p| s.current(p).is_some()), 2);
}

#[test]
fn a_vcpu_that_wakes_again_prefers_an_idle_module() {
    let (mut s, vs) = woken(6, 2, true);
    assert_eq!(running_on(&s), [0, 2]);
    let t = s.block(1_000, vs[1]);
    settle(&mut s, 1_000, t);
    assert_eq!(running_on(&s), [0]);
    let t = s.wake(2_000, vs[1]);
    settle(&mut s, 2_000, t);
    assert_eq!(
        s.vcpu_stats(vs[1]).pcpu,
        PcpuId(2),
        "its home's module is idle"
    );
    // With no idle module left, the first free pCPU from its home, as without modules.
    let (s, _) = woken(4, 3, true);
    assert_eq!(running_on(&s), [0, 2, 3]);
}

#[test]
fn a_bad_topology_is_refused() {
    assert_eq!(
        Modules::uniform(6, 4),
        Err(ParamError::Modules {
            pcpus: 6,
            cores_per_module: 4
        })
    );
    assert!(Modules::uniform(6, 0).is_err());
    let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
    let err = s
        .set_modules(Some(Modules::uniform(4, 2).unwrap()))
        .unwrap_err();
    assert_eq!(err, ParamError::ModulesSize { given: 4, pcpus: 2 });
    assert!(s.modules().is_none());
    // This host's two CPUs as one module: accepted, and both still used.
    s.set_modules(Some(Modules::uniform(2, 2).unwrap()))
        .unwrap();
    let d = s.add_domain(256, 0).unwrap();
    for _ in 0..2 {
        let v = s.add_vcpu(0, d).unwrap();
        let t = s.wake(0, v);
        settle(&mut s, 0, t);
    }
    assert_eq!(running_on(&s), [0, 1]);
}

#[test]
fn modules_can_be_any_grouping() {
    let m = Modules::from_module_of(vec![7, 3, 7, 3]);
    assert_eq!(m.modules(), 2);
    assert_eq!(m.siblings(PcpuId(0)).collect::<Vec<_>>(), [PcpuId(2)]);
    assert_eq!(m.siblings(PcpuId(1)).collect::<Vec<_>>(), [PcpuId(3)]);
    assert_eq!(m.contended(|p| p.0 != 3), 1);
}
