//! Cost of one scheduling decision, one tick (with the auto slice off and on) and one
//! accounting pass.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sched::drive::{Sim, Workload};
use sched::{Params, PcpuId, Scheduler};

const PCPUS: u32 = 8;

/// `n` busy vCPUs, one per domain with varied weights, on 8 pCPUs, run for 20
/// slices so credits, priorities and queues are in a steady state.
/// Ratelimit is off so every `schedule` makes a full decision.
fn warmed(n: u32) -> (Scheduler, u64) {
    let params = Params {
        ratelimit_ns: 0,
        ..Params::default()
    };
    let mut s = Scheduler::new(params, PCPUS, 0).unwrap();
    let doms: Vec<_> = (0..n)
        .map(|i| s.add_domain(128 + (i % 7) as u16 * 64, 0).unwrap())
        .collect();
    let mut sim = Sim::new(s, 0);
    for d in doms {
        sim.add_vcpu(d, Workload::Busy);
    }
    let end = 20 * params.tslice_ns;
    sim.run_until(end, |_| {});
    (sim.into_scheduler(), end)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision");
    for n in [1u32, 8, 64, 512] {
        let (base, start) = warmed(n);
        g.bench_with_input(BenchmarkId::new("schedule", n), &n, |b, _| {
            let (mut s, mut now) = (base.clone(), start);
            b.iter(|| {
                now += 50_000;
                black_box(s.schedule(now, PcpuId(1)))
            });
        });
        g.bench_with_input(BenchmarkId::new("tick", n), &n, |b, _| {
            let (mut s, mut now) = (base.clone(), start);
            let tick = s.params().tick_ns;
            b.iter(|| {
                now += tick;
                black_box(s.tick(now, PcpuId(1)))
            });
        });
        // The same with the auto slice on: a comparison and a counter per tick, and
        // an epoch decision every 100 ms of scheduler time.
        g.bench_with_input(BenchmarkId::new("tick_auto", n), &n, |b, _| {
            let (mut s, mut now) = (base.clone(), start);
            s.set_auto(now, true);
            let tick = s.params().tick_ns;
            b.iter(|| {
                now += tick;
                black_box(s.tick(now, PcpuId(1)))
            });
        });
        g.bench_with_input(BenchmarkId::new("tick_with_accounting", n), &n, |b, _| {
            let (mut s, mut now) = (base.clone(), start);
            let tslice = s.params().tslice_ns;
            b.iter(|| {
                now += tslice;
                black_box(s.tick(now, PcpuId(0)))
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
