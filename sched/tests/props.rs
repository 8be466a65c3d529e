//! Property tests over long random runs of the deterministic driver.

use proptest::prelude::*;
use sched::drive::{Sim, Workload};
use sched::*;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

/// Slices worth testing: S1's 1/1 ms and 10 ms settings and Xen's 30 ms.
fn params() -> impl Strategy<Value = Params> {
    prop_oneof![
        Just(Params::with_tslice(MS)),
        Just(Params {
            tick_ns: 2 * MS,
            ..Params::with_tslice(10 * MS)
        }),
        Just(Params::with_tslice(10 * MS)),
        Just(Params::default()),
        Just(Params {
            tick_ns: 15 * MS,
            ..Params::default()
        }),
    ]
}

/// Burst lengths are drawn in nanoseconds so that workloads are not phase
/// locked to the tick: a vCPU whose bursts always end exactly when a tick
/// fires is never seen running by a tick, so it is never charged and keeps
/// BOOST forever, starving others (credit1's tick-sampling weakness, pinned
/// by the unit test `tick_phase_locked_vcpu_escapes_accounting`).
fn workload() -> impl Strategy<Value = Workload> {
    prop_oneof![
        2 => Just(Workload::Busy),
        2 => (50 * US..5 * MS, 100 * US..20 * MS)
            .prop_map(|(run_ns, sleep_ns)| Workload::Periodic { run_ns, sleep_ns }),
        1 => (50 * US..5 * MS).prop_map(|run_ns| Workload::Yielder { run_ns }),
    ]
}

/// Weight-proportional shares of always-busy vCPUs, each limited to one pCPU
/// (water filling: what is left by saturated vCPUs goes to the others).
fn expected_shares(weights: &[u64], pcpus: u64) -> Vec<f64> {
    let mut share = vec![0.0; weights.len()];
    let mut open: Vec<usize> = (0..weights.len()).collect();
    let mut capacity = pcpus as f64;
    loop {
        let w: u64 = open.iter().map(|i| weights[*i]).sum();
        let (full, rest): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|i| capacity * weights[**i] as f64 / w as f64 >= 1.0);
        if full.is_empty() {
            for i in open {
                share[i] = capacity * weights[i] as f64 / w as f64;
            }
            return share;
        }
        for i in &full {
            share[*i] = 1.0;
        }
        capacity -= full.len() as f64;
        open = rest;
    }
}

/// Runs always-busy vCPUs (`counts[i]` in a domain of `weights[i]`) for 300
/// slices; each must be within `tol` of the run (one pCPU's time) plus 2
/// slices of its water-filled weight share.
fn check_shares(
    params: Params,
    pcpus: u32,
    weights: &[u16],
    counts: &[usize],
    tol: f64,
) -> Result<(), TestCaseError> {
    let mut s = Scheduler::new(params, pcpus, 0).unwrap();
    let ids: Vec<_> = weights
        .iter()
        .map(|w| s.add_domain(*w, 0).unwrap())
        .collect();
    let mut sim = Sim::new(s, 0);
    let mut vs = Vec::new();
    let mut per_vcpu = Vec::new();
    for ((d, w), n) in ids.iter().zip(weights).zip(counts) {
        for _ in 0..*n {
            vs.push(sim.add_vcpu(*d, Workload::Busy));
            per_vcpu.push(u64::from(*w));
        }
    }
    let end = 300 * params.tslice_ns;
    sim.run_until(end, |_| {});
    let shares = expected_shares(&per_vcpu, u64::from(pcpus));
    for (v, share) in vs.iter().zip(shares) {
        let exp = share * end as f64;
        let got = sim.run_ns(*v) as f64;
        let slack = tol * end as f64 + 2.0 * params.tslice_ns as f64;
        prop_assert!(
            (got - exp).abs() <= slack,
            "{}: got {} expected {} slack {}",
            v,
            got,
            exp,
            slack
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// (a1) Equal weights (domains of 1-3 vCPUs; Xen shares by
    /// weight x active vCPUs): over 300 slices each always-busy vCPU's CPU
    /// time is within 5 % of the run of its share (capped at one pCPU) plus 2
    /// slices. Per-pCPU round robin with stealing only when OVER leaves pCPUs
    /// with 4 and 5 queued vCPUs unevenly loaded (worst seen: 3 %).
    #[test]
    fn busy_vcpus_share_equally(
        params in params(),
        pcpus in 1..=4u32,
        weight in 64..=1024u16,
        doms in prop::collection::vec(1..=3usize, 1..=6),
    ) {
        let weights: Vec<u16> = doms.iter().map(|_| weight).collect();
        check_shares(params, pcpus, &weights, &doms, 0.05)?;
    }

    /// (a2) Weights within a factor of 2 (256..=512): within 25 % of one
    /// pCPU's time over 300 slices, plus 2 slices (worst seen in 1500 random
    /// runs: 18 %; one pCPU: 2.5 %). Credit1 is this loose by design: round
    /// robin among UNDER vCPUs ignores credit, so a heavy vCPU sharing a pCPU
    /// with light ones can exceed one slice of credit, be halved and
    /// deactivated (Xen `csched_acct`), its weight then leaving the total;
    /// and stealing only happens when a pCPU's best is OVER or idle. With
    /// weights 64..=1024 errors reach 50 % of a pCPU (see the unit test
    /// `credit1_is_loose_with_unequal_weights`).
    #[test]
    fn busy_vcpus_share_by_close_weights(
        params in params(),
        pcpus in 1..=4u32,
        doms in prop::collection::vec((256..=512u16, 1..=2usize), 1..=6),
    ) {
        let weights: Vec<u16> = doms.iter().map(|(w, _)| *w).collect();
        let counts: Vec<usize> = doms.iter().map(|(_, n)| *n).collect();
        check_shares(params, pcpus, &weights, &counts, 0.25)?;
    }

    /// (b) A capped domain's run time over any span of whole accounting
    /// periods is at most cap % of the span plus 2 slices per vCPU: a capped
    /// vCPU earns at most its cap share per period and its credit after an
    /// accounting lies in [-slice, +slice], so it can run at most two slices
    /// ahead of its earnings; plus one tick per vCPU, because a vCPU only
    /// becomes active (earning, clampable, parkable) at the first tick that
    /// finds it running. The capped vCPUs run in bursts of at least two ticks:
    /// as in Xen, a vCPU that always stops just before the ticks is never
    /// activated and so escapes its cap (the tick-sampling weakness of credit1).
    /// Accounting burns running vCPUs first, so there is no accounting lag.
    #[test]
    fn cap_is_respected(
        params in params(),
        pcpus in 1..=3u32,
        nv in 1..=2u32,
        cap_frac in 1..=100u32,
        others in prop::collection::vec((64..=1024u16, workload()), 0..=4),
        yielder in any::<bool>(),
    ) {
        let capped_work =
            if yielder { Workload::Yielder { run_ns: 2 * params.tick_ns } } else { Workload::Busy };
        let cap = (cap_frac * nv).min(100 * pcpus);
        let mut s = Scheduler::new(params, pcpus, 0).unwrap();
        let capped = s.add_domain(256, cap).unwrap();
        let other_doms: Vec<_> = others.iter().map(|(w, _)| s.add_domain(*w, 0).unwrap()).collect();
        let mut sim = Sim::new(s, 0);
        let cvs: Vec<_> = (0..nv).map(|_| sim.add_vcpu(capped, capped_work)).collect();
        for (d, (_, w)) in other_doms.iter().zip(&others) {
            sim.add_vcpu(*d, *w);
        }
        let periods = 150u64;
        let mut samples = vec![0u64];
        for k in 1..=periods {
            sim.run_until(k * params.tslice_ns, |_| {});
            samples.push(cvs.iter().map(|v| sim.run_ns(*v)).sum());
        }
        let slack = u64::from(nv) * (2 * params.tslice_ns + params.tick_ns);
        for i in 0..samples.len() {
            for j in i + 1..samples.len() {
                let allowed = u64::from(cap) * (j - i) as u64 * params.tslice_ns / 100 + slack;
                let got = samples[j] - samples[i];
                prop_assert!(got <= allowed, "periods {i}..{j}: ran {got} > {allowed}");
            }
        }
    }

    /// (c) Work conservation: after every instant, no pCPU is idle while a
    /// runnable (queued, unparked) vCPU waits. (d) No starvation: no uncapped
    /// runnable vCPU waits longer than (2 x vCPUs + 2 + R) slices, where R is
    /// the number of accountings an OVER vCPU at the -1 slice clamp needs to
    /// climb back to UNDER with the smallest per-slice share; then it waits at
    /// most one round of the others' slices, plus BOOSTed wake-ups (each
    /// ending at the next tick that finds it running). Credit1 has no formal
    /// bound; this one is a sanity limit (worst seen: about 12 slices against
    /// a limit of 16, with 4 vCPUs on one pCPU). Workloads are not tick phase
    /// locked (see `workload`).
    #[test]
    fn work_conserving_and_starvation_free(
        params in params(),
        pcpus in 1..=4u32,
        vcpus in prop::collection::vec((64..=1024u16, prop::sample::select(vec![0u32, 0, 30, 90]), workload()), 1..=8),
    ) {
        let mut s = Scheduler::new(params, pcpus, 0).unwrap();
        let doms: Vec<_> = vcpus.iter().map(|(w, c, _)| s.add_domain(*w, *c).unwrap()).collect();
        let mut sim = Sim::new(s, 0);
        let vs: Vec<_> = doms.iter().zip(&vcpus).map(|(d, (_, _, w))| sim.add_vcpu(*d, *w)).collect();
        let mut violation = None;
        sim.run_until(200 * params.tslice_ns, |sim| {
            let sched = sim.scheduler();
            if violation.is_some() {
                return;
            }
            let idle = (0..pcpus).map(PcpuId).find(|p| sched.current(*p).is_none());
            let waiting = sched.vcpus().find(|v| sched.vcpu_stats(*v).state == VcpuState::Runnable);
            if let (Some(p), Some(v)) = (idle, waiting) {
                violation = Some((sim.now(), p, v));
            }
        });
        prop_assert_eq!(violation, None);

        let total_w: u64 = vcpus.iter().map(|(w, _, _)| u64::from(*w)).sum();
        let min_w = vcpus.iter().map(|(w, _, _)| u64::from(*w)).min().unwrap();
        let cpt = params.mcredits_per_tslice() as u64;
        let min_share = (cpt * u64::from(pcpus) * min_w / total_w).max(1);
        let climb = cpt.div_ceil(min_share);
        let bound = (2 * vs.len() as u64 + 2 + climb) * params.tslice_ns;
        for v in vs {
            let capped = vcpus[v.0 as usize].1 != 0;
            if !capped {
                prop_assert!(sim.max_wait_ns(v) <= bound, "{}: waited {} > {}", v, sim.max_wait_ns(v), bound);
            }
        }
    }

    /// (e) A vCPU waking UNDER is BOOSTed and, with every pCPU running
    /// UNDER/OVER vCPUs, runs within the ratelimit of its wake-up, unless an
    /// accounting demotes it first (Xen re-derives the priority of every
    /// active vCPU, queued BOOST ones included); those wake-ups are excluded.
    #[test]
    fn boosted_wakeup_preempts_within_ratelimit(
        params in params(),
        pcpus in 1..=4u32,
        busy in prop::collection::vec(64..=1024u16, 1..=8),
        waker_w in 64..=1024u16,
        run_us in 20..500u64,
        sleep_us in 200..20_000u64,
    ) {
        let mut s = Scheduler::new(params, pcpus, 0).unwrap();
        let doms: Vec<_> = busy.iter().map(|w| s.add_domain(*w, 0).unwrap()).collect();
        let wd = s.add_domain(waker_w, 0).unwrap();
        let mut sim = Sim::new(s, 0);
        for d in &doms {
            sim.add_vcpu(*d, Workload::Busy);
        }
        // Start the waker once the busy vCPUs' own wake-up BOOSTs are gone:
        // each loses it at the first tick that finds it running.
        sim.run_until((busy.len() as u64 + 2) * params.tslice_ns, |_| {});
        let w = sim.add_vcpu(wd, Workload::Periodic { run_ns: run_us * US, sleep_ns: sleep_us * US });
        sim.run_until(100 * params.tslice_ns, |_| {});
        let (latency, wakes) = sim.boosted_wake_latency(w);
        prop_assert!(wakes > 0);
        prop_assert!(latency <= params.ratelimit_ns, "latency {} > ratelimit {}", latency, params.ratelimit_ns);
    }
}

/// The first internal inconsistency at this instant: a broken invariant, or the driver
/// and the scheduler disagreeing on what a pCPU runs.
fn inconsistency(sim: &Sim) -> Option<String> {
    let s = sim.scheduler();
    if let Err(e) = s.check_invariants() {
        return Some(format!("t={}: {e}", sim.now()));
    }
    (0..s.pcpus())
        .find(|p| s.current(PcpuId(*p)) != sim.running(PcpuId(*p)))
        .map(|p| format!("t={}: driver and scheduler disagree on p{p}", sim.now()))
}

/// A control operation applied at run time.
#[derive(Clone, Debug)]
enum Op {
    SetDomain {
        dom: usize,
        weight: u16,
        cap_frac: u32,
    },
    SetParams(Params),
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..8usize, 1..=1024u16, prop::sample::select(vec![0u32, 0, 5, 50, 100]))
            .prop_map(|(dom, weight, cap_frac)| Op::SetDomain { dom, weight, cap_frac }),
        2 => params().prop_map(Op::SetParams),
        1 => (0..16usize).prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random workloads, caps and run-time control operations (weights, caps,
    /// slice/tick/ratelimit changes, removals), with exact or Xen-style
    /// accounting: the internal invariants and
    /// work conservation hold after every instant, and the driver's view of
    /// what runs matches the scheduler's.
    #[test]
    fn invariants_hold_under_random_control(
        params in params(),
        pcpus in 1..=4u32,
        vcpus in prop::collection::vec((1..=1024u16, prop::sample::select(vec![0u32, 0, 20, 60]), workload()), 1..=10),
        ops in prop::collection::vec((1..400u64, op()), 0..12),
        sync_accounting in any::<bool>(),
    ) {
        let params = Params { sync_accounting, ..params };
        let mut s = Scheduler::new(params, pcpus, 0).unwrap();
        let doms: Vec<_> = vcpus.iter().map(|(w, c, _)| s.add_domain(*w, (*c).min(100 * pcpus)).unwrap()).collect();
        let mut sim = Sim::new(s, 0);
        let vs: Vec<_> = doms.iter().zip(&vcpus).map(|(d, (_, _, w))| sim.add_vcpu(*d, *w)).collect();
        let mut ops = ops;
        ops.sort_by_key(|(t, _)| *t);
        let mut failure = None;
        let mut check = |sim: &Sim| {
            if failure.is_none() {
                failure = inconsistency(sim);
            }
        };
        for (at, op) in ops {
            sim.run_until(at * MS, &mut check);
            let now = sim.now();
            let s = sim.scheduler_mut();
            let t = match op {
                Op::SetDomain { dom, weight, cap_frac } => {
                    let d = doms[dom % doms.len()];
                    s.set_domain(d, weight, (cap_frac * s.domain_stats(d).vcpus).min(100 * pcpus)).unwrap()
                }
                Op::SetParams(p) => {
                    s.set_params(now, p).unwrap();
                    Tickles::new()
                }
                Op::Remove(i) => s.remove_vcpu(now, vs[i % vs.len()]),
            };
            sim.reschedule(t);
        }
        sim.run_until(500 * MS, &mut check);
        prop_assert_eq!(failure, None);
    }
}

/// A paravirtual hint at run time: vCPU `waiter` waits for `targets` (indices into the
/// run's vCPUs, some past the end: a guest can name anything).
#[derive(Clone, Debug)]
struct Hint {
    at_us: u64,
    waiter: u32,
    targets: Vec<u32>,
}

fn hint() -> impl Strategy<Value = Hint> {
    (
        1..300_000u64,
        0..12u32,
        prop::collection::vec(0..12u32, 0..6),
    )
        .prop_map(|(at_us, waiter, targets)| Hint {
            at_us,
            waiter,
            targets,
        })
}

/// Runs random workloads in domains of 1-4 vCPUs with `hints` delivered at their times
/// (in the order given, not sorted: hints arrive in any order relative to each
/// other's targets), checking after every instant that the invariants hold and the
/// driver agrees with the scheduler. Returns each vCPU's run time at the end.
fn run_with_hints(
    params: Params,
    pcpus: u32,
    doms: &[(u16, Vec<Workload>)],
    hints: &[Hint],
) -> Result<Vec<u64>, TestCaseError> {
    let mut s = Scheduler::new(params, pcpus, 0).unwrap();
    let ids: Vec<_> = doms
        .iter()
        .map(|(w, _)| s.add_domain(*w, 0).unwrap())
        .collect();
    let mut sim = Sim::new(s, 0);
    let mut vs = Vec::new();
    for (d, (_, works)) in ids.iter().zip(doms) {
        for w in works {
            vs.push(sim.add_vcpu(*d, *w));
        }
    }
    let mut failure = None;
    let mut check = |sim: &Sim| {
        if failure.is_none() {
            failure = inconsistency(sim);
        }
    };
    let mut at = 0;
    for h in hints {
        // Not sorted: a hint whose time has passed arrives now.
        at = at.max(h.at_us * 1_000);
        sim.run_until(at, &mut check);
        let now = sim.now();
        let targets: Vec<VcpuId> = h.targets.iter().map(|t| VcpuId(*t)).collect();
        let t = sim
            .scheduler_mut()
            .yield_to(now, VcpuId(h.waiter), &targets);
        sim.reschedule(t);
    }
    sim.run_until(400 * MS, &mut check);
    prop_assert_eq!(failure, None);
    Ok(vs.iter().map(|v| sim.run_ns(*v)).collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Directed yield: with hints naming any vCPUs (running, queued, blocked,
    /// other domains', the waiter itself, ids past the end) arriving in any order,
    /// the invariants hold after every instant; with `directed_yield` off the hints
    /// change nothing (every vCPU's run time equals a run without them).
    #[test]
    fn invariants_hold_with_hints_in_any_order(
        params in params(),
        pcpus in 1..=4u32,
        doms in prop::collection::vec((64..=1024u16, prop::collection::vec(workload(), 1..=4)), 1..=4),
        hints in prop::collection::vec(hint(), 0..40),
    ) {
        let on = Params { directed_yield: true, ..params };
        run_with_hints(on, pcpus, &doms, &hints)?;
        let off = Params { directed_yield: false, ..params };
        let with = run_with_hints(off, pcpus, &doms, &hints)?;
        let without = run_with_hints(off, pcpus, &doms, &[])?;
        prop_assert_eq!(with, without);
    }
}
