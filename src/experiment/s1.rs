//! S1 on real VMs (`../shared/research/SEEDS.md`): how the credit scheduler's slice,
//! tick, accounting and domain 0's weight change an MPI job whose ranks busy-wait,
//! with domain 0 (kumo's switch) carrying every message.
//!
//! The node: this host's first two CPUs (S1's nodes were dual-core), domain 0, and four
//! single-vCPU VMs, one MPI rank each: S1 ran four MPI processes per node on two
//! DomUs of one vCPU (two processes per guest, multiplexed by Linux); kumo's guest runs
//! one rank per vCPU, never two on one, so the four ranks are four VMs, and the host
//! CPUs are shared by four spinning vCPUs and domain 0 as S1's were by four spinning
//! processes and domain 0. Ranks spin-wait (`wait = "spin"`), as MPICH does.
//!
//! Each scenario runs the same job under different credit parameters; speed-ups are
//! over the scenario's baseline (Xen 3.4.2's 30/10 ms with tick accounting for the
//! paper's family, Xen 4's 30/10 ms with exact accounting and 1 ms ratelimit for
//! today's). Domain 0's cost per frame and per KiB is measured on the switch by two
//! ping-pong runs, and the simulator runs the same node with those costs beside the
//! real runs.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use npb::{Class, Kernel, Spec};
use serde::Serialize;

use super::plot;
use super::{Progress, Summary, interleaved, node_problems, run_node_text};
use crate::cli::ExperimentArgs;
use crate::ctl::Accounting;
use crate::node;

/// Ranks of the job: one per single-vCPU VM.
const RANKS: usize = 4;
/// Host CPUs of the node, as S1's dual-core nodes.
const NODE_CPUS: usize = 2;

/// One setting of the credit scheduler.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Scenario {
    pub name: &'static str,
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    pub accounting: Accounting,
    pub dom0_weight: u32,
    /// The scenario speed-ups are over (itself for a baseline).
    pub baseline: &'static str,
    /// Run with `--quick` too.
    #[serde(skip)]
    quick: bool,
    /// S1's published speed-up for CG and EP in percent, where it gives one.
    pub paper_cg: Option<f64>,
    pub paper_ep: Option<f64>,
}

const XEN4: &str = "xen4-30/10";
pub const XEN34: &str = "xen3.4-30/10";

const fn scenario(
    name: &'static str,
    (tslice_ms, tick_ms, ratelimit_us): (f64, f64, u64),
    accounting: Accounting,
    dom0_weight: u32,
    baseline: &'static str,
    quick: bool,
    paper: (Option<f64>, Option<f64>),
) -> Scenario {
    Scenario {
        name,
        tslice_ms,
        tick_ms,
        ratelimit_us,
        accounting,
        dom0_weight,
        baseline,
        quick,
        paper_cg: paper.0,
        paper_ep: paper.1,
    }
}

/// Xen 3.4.2 (S1's Xen: tick accounting, no ratelimit) first, then today's defaults.
/// S1 gives CG +45.3 % and EP no change at 1/1 ms, CG +51 % with domain 0 at 1024, and
/// "large slow-downs" (no number) with domain 0 at 64 and 128.
pub const SCENARIOS: &[Scenario] = &[
    scenario(
        XEN34,
        (30.0, 10.0, 0),
        Accounting::Tick,
        256,
        XEN34,
        true,
        (Some(0.0), Some(0.0)),
    ),
    scenario(
        "xen3.4-10/5",
        (10.0, 5.0, 0),
        Accounting::Tick,
        256,
        XEN34,
        false,
        (None, None),
    ),
    scenario(
        "xen3.4-1/1",
        (1.0, 1.0, 0),
        Accounting::Tick,
        256,
        XEN34,
        true,
        (Some(45.3), Some(0.0)),
    ),
    scenario(
        "xen3.4-1/1-dom0-1024",
        (1.0, 1.0, 0),
        Accounting::Tick,
        1024,
        XEN34,
        true,
        (Some(51.0), None),
    ),
    scenario(
        "xen3.4-30/10-dom0-64",
        (30.0, 10.0, 0),
        Accounting::Tick,
        64,
        XEN34,
        false,
        (None, None),
    ),
    scenario(
        "xen3.4-30/10-dom0-128",
        (30.0, 10.0, 0),
        Accounting::Tick,
        128,
        XEN34,
        false,
        (None, None),
    ),
    scenario(
        "xen3.4-30/10-dom0-512",
        (30.0, 10.0, 0),
        Accounting::Tick,
        512,
        XEN34,
        false,
        (None, None),
    ),
    scenario(
        "xen3.4-30/10-dom0-1024",
        (30.0, 10.0, 0),
        Accounting::Tick,
        1024,
        XEN34,
        false,
        (None, None),
    ),
    scenario(
        XEN4,
        (30.0, 10.0, 1000),
        Accounting::Exact,
        256,
        XEN4,
        false,
        (None, None),
    ),
    // A slice not above the ratelimit turns it off, as `xl sched-credit` must.
    scenario(
        "xen4-1/1",
        (1.0, 1.0, 0),
        Accounting::Exact,
        256,
        XEN4,
        false,
        (None, None),
    ),
];

/// The scenarios a run covers.
pub fn scenarios(quick: bool) -> Vec<Scenario> {
    SCENARIOS
        .iter()
        .filter(|s| s.quick || !quick)
        .copied()
        .collect()
}

/// The benchmarks: CG (communicates every few milliseconds) and EP (three reductions
/// at the end), class A. `--quick` runs CG at class W: its time at 30 ms slices is the
/// experiment's cost (about a minute at W); EP stays at A, whose seconds of compute
/// make the end's wait for a descheduled rank (up to a slice or two) the small part
/// it was in S1.
pub fn benchmarks(quick: bool) -> Vec<Spec> {
    let cg = if quick { Class::W } else { Class::A };
    vec![
        Spec {
            kernel: Kernel::Cg,
            class: cg,
        },
        Spec {
            kernel: Kernel::Ep,
            class: Class::A,
        },
    ]
}

/// The node's CPUs: the host's first two (one on a single-CPU host).
fn node_cpus() -> Vec<usize> {
    let host = hv::placement::host_cpus();
    (0..host.min(NODE_CPUS)).collect()
}

fn cpus_toml(cpus: &[usize]) -> String {
    let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
    format!("pcpus = [{}]\n", list.join(", "))
}

fn domains_toml(count: usize) -> String {
    (0..count)
        .map(|i| format!("[[domain]]\nname = \"u{i}\"\nmpi = true\n"))
        .collect()
}

fn accounting_name(a: Accounting) -> &'static str {
    match a {
        Accounting::Exact => "exact",
        Accounting::Tick => "tick",
    }
}

/// The node file of one real run.
pub fn node_toml(scenario: &Scenario, spec: Spec, cpus: &[usize]) -> String {
    rank_node_toml(scenario, spec, cpus, RANKS, "")
}

/// A node of `domains` single-vCPU rank VMs of `spec` under `scenario`'s credit
/// parameters, with `network_extra` lines in its `[network]` (a wire to ranks
/// outside the node).
pub fn rank_node_toml(
    scenario: &Scenario,
    spec: Spec,
    cpus: &[usize],
    domains: usize,
    network_extra: &str,
) -> String {
    format!(
        "{}[scheduler]\nkind = \"credit\"\ntslice_ms = {}\ntick_ms = {}\nratelimit_us = {}\n\
         accounting = \"{}\"\n[dom0]\nweight = {}\n[network]\nnpb = \"{spec}\"\nwait = \"spin\"\n\
         {network_extra}{}",
        cpus_toml(cpus),
        scenario.tslice_ms,
        scenario.tick_ms,
        scenario.ratelimit_us,
        accounting_name(scenario.accounting),
        scenario.dom0_weight,
        domains_toml(domains),
    )
}

/// What one real run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RealRun {
    pub scenario: String,
    pub benchmark: String,
    pub round: u32,
    /// The job's time as rank 0 reports it (None: no result).
    pub time_s: Option<f64>,
    pub verified: bool,
    /// Host CPU time of each rank's VM, and the time each rank spent inside blocking
    /// MPI calls (S1's MPI_Wait time: spinning, or descheduled while waiting).
    pub rank_cpu_s: Vec<f64>,
    pub rank_wait_s: Vec<f64>,
    pub dom0_cpu_s: f64,
    pub frames: u64,
    pub bytes: u64,
    pub wall_s: f64,
    pub problems: Vec<String>,
}

fn field(fields: &std::collections::BTreeMap<String, String>, key: &str) -> Option<f64> {
    fields.get(key).and_then(|v| v.parse::<f64>().ok())
}

fn real_run(
    scenario: &Scenario,
    spec: Spec,
    round: u32,
    cpus: &[usize],
    kvm_device: &Path,
    epoch: Instant,
) -> Result<RealRun> {
    let outcome = run_node_text(&node_toml(scenario, spec, cpus), kvm_device, epoch)
        .with_context(|| format!("scenario {} {spec}", scenario.name))?;
    let result = outcome
        .reports
        .iter()
        .flat_map(|r| r.verdict.rows.iter())
        .find_map(|row| row.result.clone());
    let wait = |r: &node::DomainReport| {
        r.measurements
            .iter()
            .filter(|(kind, _)| kind == "mpistats")
            .find_map(|(_, f)| field(f, "wait_us"))
            .map_or(0.0, |us| us / 1e6)
    };
    let switch = outcome.switch.unwrap_or_default();
    Ok(RealRun {
        scenario: scenario.name.to_string(),
        benchmark: spec.to_string(),
        round,
        time_s: result.as_ref().map(|r| r.time_s),
        verified: result.as_ref().is_some_and(|r| r.verified),
        rank_cpu_s: outcome
            .reports
            .iter()
            .map(|r| r.cpu.as_secs_f64())
            .collect(),
        rank_wait_s: outcome.reports.iter().map(wait).collect(),
        dom0_cpu_s: outcome.overhead.dom0.as_secs_f64(),
        frames: switch.received,
        bytes: switch.received_bytes,
        wall_s: outcome.wall.as_secs_f64(),
        problems: node_problems(&outcome),
    })
}

/// Domain 0's CPU per frame and per KiB through the switch, fitted to two ping-pong
/// runs (small and large messages) of two VMs on the node's CPUs.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub per_frame_us: f64,
    pub per_kib_us: f64,
    pub points: Vec<CalibrationPoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CalibrationPoint {
    pub message_bytes: u64,
    pub frames: u64,
    pub kib: f64,
    pub dom0_cpu_s: f64,
}

/// Sizes of the two calibration runs: one frame of almost nothing, and messages of
/// many full jumbo frames.
const CALIBRATION_SIZES: [(u64, &str); 2] = [(8, "8"), (65536, "65536")];

fn calibrate(cpus: &[usize], kvm_device: &Path, epoch: Instant) -> Result<Calibration> {
    let mut points = Vec::new();
    for (bytes, text) in CALIBRATION_SIZES {
        let toml = format!(
            "{}[scheduler]\nkind = \"host\"\n[network]\nnet = \"pingpong:{text}\"\nwait = \"spin\"\n{}",
            cpus_toml(cpus),
            domains_toml(2),
        );
        let outcome = run_node_text(&toml, kvm_device, epoch)
            .with_context(|| format!("calibration ping-pong of {text} bytes"))?;
        if let Some(problem) = outcome
            .reports
            .iter()
            .flat_map(|r| &r.verdict.problems)
            .next()
        {
            bail!("calibration ping-pong of {text} bytes: {problem}");
        }
        let switch = outcome.switch.unwrap_or_default();
        points.push(CalibrationPoint {
            message_bytes: bytes,
            frames: switch.received,
            kib: switch.received_bytes as f64 / 1024.0,
            dom0_cpu_s: outcome.overhead.dom0.as_secs_f64(),
        });
    }
    let (per_frame_us, per_kib_us) = fit(&points);
    Ok(Calibration {
        per_frame_us,
        per_kib_us,
        points,
    })
}

/// Solves `cpu = a * frames + b * kib` through the small-message point (first) and
/// the large-message one, neither cost negative. Domain 0's cost is mostly its
/// wake-ups, and a stream of large frames is forwarded in batches with fewer of them,
/// so the large point can cost less per frame than the small one: then `a` comes from
/// the small point alone (the one that looks like CG's traffic) and `b` is 0.
pub fn fit(points: &[CalibrationPoint]) -> (f64, f64) {
    let us = |p: &CalibrationPoint| p.dom0_cpu_s * 1e6;
    let Some(small) = points.first().filter(|p| p.frames > 0) else {
        return (0.0, 0.0);
    };
    if let [p, q] = points {
        let (f1, k1, f2, k2) = (p.frames as f64, p.kib, q.frames as f64, q.kib);
        let det = f1 * k2 - f2 * k1;
        if det.abs() > f64::EPSILON {
            let a = (us(p) * k2 - us(q) * k1) / det;
            let b = (f1 * us(q) - f2 * us(p)) / det;
            if a >= 0.0 && b >= 0.0 {
                return (a, b);
            }
        }
    }
    (us(small) / small.frames as f64, 0.0)
}

/// A benchmark's serial CPU time on the host (this thread's CPU clock, not the wall
/// clock, so a busy host does not inflate it), for the simulator's compute phases.
fn serial_seconds(spec: Spec) -> f64 {
    let before = hv::placement::thread_cpu_time();
    let _ = npb::host::run(spec, 1);
    hv::placement::thread_cpu_time()
        .saturating_sub(before)
        .as_secs_f64()
}

/// The simulation file of the same node: four single-vCPU domains on the node's CPUs,
/// domain 0 with one vCPU, its costs from the calibration, and each benchmark as the
/// phases its MPI form runs (CG: per inner iteration a product, two 8-byte
/// allreduces and the allgather of `p`; EP: its share, then three reductions).
pub fn sim_toml(
    cpus: usize,
    calibration: &Calibration,
    compute: &[(Spec, f64)],
    scenarios: &[Scenario],
) -> String {
    // In the model domain 0 works on both sides of a message inside a node; kumo's
    // switch forwards a frame once: half the cost per side.
    let mut text = format!(
        "duration_s = 3600\n[scheduler]\ntslice_ms = 30\ntick_ms = 10\nratelimit_us = 1000\n\
         [costs]\nswitch_us = 29\nwake_us = 46\ntick_us = 0\nsend_us = 5\n\
         dom0_per_message_us = {:.3}\ndom0_per_kib_us = {:.3}\nnetwork_latency_us = 0\n\
         network_mb_s = 100000\n[[node]]\nname = \"node\"\npcpus = {cpus}\ndom0_vcpus = 1\n",
        calibration.per_frame_us / 2.0,
        calibration.per_kib_us / 2.0,
    );
    for i in 0..RANKS {
        text.push_str(&format!("[[node.domain]]\nname = \"u{i}\"\n"));
    }
    for &(spec, serial_s) in compute {
        let per_rank_ms = serial_s * 1e3 / RANKS as f64;
        match spec.kernel {
            Kernel::Cg => {
                let p = npb::cg::params(spec.class);
                // 25 inner iterations and a normalisation per outer iteration.
                let steps = p.niter * 26;
                let step_ms = per_rank_ms / steps as f64;
                let block = p.na.div_ceil(RANKS) * 8;
                text.push_str(&format!(
                    "[[program]]\nname = \"{spec}\"\niterations = {steps}\nwait = \"spin\"\n\
                     phases = [\"compute:{:.4}\", \"allreduce:8\", \"compute:{:.4}\", \
                     \"allreduce:8\", \"exchange:alltoall:{block}\"]\n",
                    step_ms * 0.9,
                    step_ms * 0.1,
                ));
            }
            _ => text.push_str(&format!(
                "[[program]]\nname = \"{spec}\"\niterations = 1\nwait = \"spin\"\n\
                 phases = [\"compute:{per_rank_ms:.3}\", \"allreduce:8\", \"allreduce:8\", \
                 \"allreduce:80\"]\n"
            )),
        }
    }
    for s in scenarios {
        text.push_str(&format!(
            "[[scenario]]\nname = \"{}\"\ntslice_ms = {}\ntick_ms = {}\nratelimit_us = {}\n\
             accounting = \"{}\"\ndom0_weight = {}\n",
            s.name,
            s.tslice_ms,
            s.tick_ms,
            s.ratelimit_us,
            accounting_name(s.accounting),
            s.dom0_weight
        ));
    }
    text
}

/// One row of the table: a scenario and a benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: Scenario,
    pub benchmark: String,
    pub time_s: Option<Summary>,
    /// Percent faster than the baseline's median (50 = the baseline takes 1.5x as long).
    pub speedup_pct: Option<f64>,
    pub paper_pct: Option<f64>,
    pub sim_time_s: Option<f64>,
    pub sim_speedup_pct: Option<f64>,
    /// Medians over the runs, summed over ranks.
    pub wait_s: Option<f64>,
    pub rank_cpu_s: Option<f64>,
    pub dom0_cpu_s: Option<f64>,
    pub verified: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub experiment: &'static str,
    pub quick: bool,
    pub runs_per_scenario: u32,
    pub node_cpus: Vec<usize>,
    pub ranks: usize,
    pub calibration: Calibration,
    pub rows: Vec<Row>,
    pub real_runs: Vec<RealRun>,
    pub ok: bool,
}

pub(super) fn speedup_pct(base: Option<f64>, time: Option<f64>) -> Option<f64> {
    match (base, time) {
        (Some(b), Some(t)) if t > 0.0 => Some((b / t - 1.0) * 100.0),
        _ => None,
    }
}

pub(super) fn median_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    Summary::of(&values.collect::<Vec<_>>()).map(|s| s.median)
}

/// The table's rows from every real run and the simulation.
pub fn rows(
    scenarios: &[Scenario],
    specs: &[Spec],
    runs: &[RealRun],
    sim: &[(String, String, Option<f64>)],
) -> Vec<Row> {
    let time_of = |scenario: &str, bench: &str| {
        let times: Vec<f64> = runs
            .iter()
            .filter(|r| r.scenario == scenario && r.benchmark == bench)
            .filter_map(|r| r.time_s)
            .collect();
        Summary::of(&times)
    };
    let sim_of = |scenario: &str, bench: &str| {
        sim.iter()
            .find(|(s, b, _)| s == scenario && b == bench)
            .and_then(|(_, _, t)| *t)
    };
    let mut out = Vec::new();
    for spec in specs {
        let bench = spec.to_string();
        for s in scenarios {
            let mine: Vec<&RealRun> = runs
                .iter()
                .filter(|r| r.scenario == s.name && r.benchmark == bench)
                .collect();
            let time = time_of(s.name, &bench);
            let base = time_of(s.baseline, &bench).map(|b| b.median);
            out.push(Row {
                scenario: *s,
                benchmark: bench.clone(),
                time_s: time,
                speedup_pct: speedup_pct(base, time.map(|t| t.median)),
                paper_pct: match spec.kernel {
                    Kernel::Cg => s.paper_cg,
                    Kernel::Ep => s.paper_ep,
                    _ => None,
                },
                sim_time_s: sim_of(s.name, &bench),
                sim_speedup_pct: speedup_pct(sim_of(s.baseline, &bench), sim_of(s.name, &bench)),
                wait_s: median_of(mine.iter().map(|r| r.rank_wait_s.iter().sum())),
                rank_cpu_s: median_of(mine.iter().map(|r| r.rank_cpu_s.iter().sum())),
                dom0_cpu_s: median_of(mine.iter().map(|r| r.dom0_cpu_s)),
                verified: !mine.is_empty() && mine.iter().all(|r| r.verified),
            });
        }
    }
    out
}

pub fn run(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    let cpus = node_cpus();
    let scenarios = scenarios(args.quick);
    let specs = benchmarks(args.quick);
    let plan: Vec<(u32, usize)> = interleaved(scenarios.len() * specs.len(), args.runs);
    // Calibration (2 runs), the plan, the serial times and the simulation.
    let progress = Progress::new(plan.len() + 2 + specs.len() + 1);

    progress.step("calibrating domain 0 on the switch");
    let calibration = calibrate(&cpus, &args.kvm_device, epoch)?;
    progress.done_one();
    progress.done_one();

    let mut real_runs = Vec::new();
    for (round, item) in plan {
        if hv::stop::requested().is_some() {
            break;
        }
        let scenario = &scenarios[item / specs.len()];
        let spec = specs[item % specs.len()];
        progress.step(&format!(
            "run {} of {}: {} {spec}",
            round + 1,
            args.runs,
            scenario.name
        ));
        real_runs.push(real_run(
            scenario,
            spec,
            round,
            &cpus,
            &args.kvm_device,
            epoch,
        )?);
        progress.done_one();
    }

    let mut compute = Vec::new();
    for &spec in &specs {
        progress.step(&format!("serial {spec} on the host, for the simulator"));
        compute.push((spec, serial_seconds(spec)));
        progress.done_one();
    }
    progress.step("simulating the same node");
    let sim_text = sim_toml(cpus.len(), &calibration, &compute, &scenarios);
    let sim = crate::sim::config::parse(&sim_text).context("the experiment's simulation")?;
    let sim_report = crate::sim::run(&sim)?;
    progress.done_one();
    progress.finish();
    let sim_times: Vec<(String, String, Option<f64>)> = sim_report
        .runs
        .iter()
        .map(|r| (r.scenario.clone(), r.program.clone(), r.time_s))
        .collect();

    let rows = rows(&scenarios, &specs, &real_runs, &sim_times);
    let complete = real_runs.len() == scenarios.len() * specs.len() * args.runs as usize;
    let ok = complete && rows.iter().all(|r| r.verified);
    let report = Report {
        experiment: "s1",
        quick: args.quick,
        runs_per_scenario: args.runs,
        node_cpus: cpus,
        ranks: RANKS,
        calibration,
        rows,
        real_runs,
        ok,
    };
    let problems: Vec<String> = report
        .real_runs
        .iter()
        .filter(|r| !r.verified)
        .map(|run| {
            format!(
                "{} {} (run {}) did not verify: {}",
                run.scenario,
                run.benchmark,
                run.round + 1,
                run.problems.join("; ")
            )
        })
        .collect();
    super::conclude(
        args,
        &report,
        text,
        |r| {
            let svg = speedups(
                "S1: speed-up over each family's 30/10 ms baseline (log scale)",
                &r.rows,
            )?;
            Ok(vec![("s1-sim.toml", sim_text), ("s1-speedup.svg", svg)])
        },
        &problems,
        ok,
    )
}

pub(super) fn pct(v: Option<f64>) -> String {
    v.map_or("-".into(), |p| format!("{p:+.1} %"))
}

pub(super) fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.3}"))
}

/// The table beside S1's figures.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "S1 on real VMs: {} ranks (one per single-vCPU VM) spin-waiting on host CPUs {:?}, \
         domain 0 = kumo's switch; {} run(s) per scenario, medians [min-max]\n\
         domain 0 measured on the switch: {:.2} us per frame + {:.2} us per KiB\n\n",
        report.ranks,
        report.node_cpus,
        report.runs_per_scenario,
        report.calibration.per_frame_us,
        report.calibration.per_kib_us,
    );
    let mut table = vec![
        [
            "benchmark",
            "scenario",
            "slice/tick",
            "rl",
            "acct",
            "dom0 w",
            "time (s)",
            "speed-up",
            "S1 paper",
            "sim (s)",
            "sim speed-up",
            "MPI wait (s)",
            "dom0 cpu (s)",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &report.rows {
        let s = &r.scenario;
        table.push(vec![
            r.benchmark.clone(),
            s.name.to_string(),
            format!("{}/{} ms", s.tslice_ms, s.tick_ms),
            format!("{} us", s.ratelimit_us),
            accounting_name(s.accounting).to_string(),
            s.dom0_weight.to_string(),
            Summary::cell(r.time_s),
            pct(r.speedup_pct),
            pct(r.paper_pct),
            secs(r.sim_time_s),
            pct(r.sim_speedup_pct),
            secs(r.wait_s),
            secs(r.dom0_cpu_s),
        ]);
    }
    out.push_str(&crate::output::table(&table, 6));
    out.push_str(
        "\nspeed-up: over the scenario family's 30/10 ms baseline (xen3.4-* over xen3.4-30/10, \
         xen4-* over xen4-30/10). S1 paper: Xen 3.4.2, 2 nodes x 4 processes; it also gives \
         SP +33.4 % and BT +28.9 % at 1/1 ms (not in kumo's MPI yet).\n",
    );
    out
}

// S1's figure.
/// The series of the speed-up figure: what, and how to read it from a row.
type Series = (&'static str, fn(&Row) -> Option<f64>);

const SERIES: &[Series] = &[
    ("kumo, real VMs", |r| r.speedup_pct),
    ("kumo sim", |r| r.sim_speedup_pct),
    ("S1 paper (Xen 3.4.2)", |r| r.paper_pct),
];

/// Speed-up factor (baseline time / time) from a percentage.
fn factor(pct: f64) -> f64 {
    1.0 + pct / 100.0
}

/// S1's figure: one group per (benchmark, scenario) that is not a baseline, one bar per
/// series, heights as speed-up factors (1 = as fast as the baseline; bars go down for
/// slow-downs).
pub fn speedups(title: &str, rows: &[Row]) -> Result<String> {
    let groups: Vec<&Row> = rows
        .iter()
        .filter(|r| r.scenario.name != r.scenario.baseline)
        .collect();
    let labels: Vec<String> = groups
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r.benchmark,
                r.scenario.name.trim_start_matches("xen")
            )
        })
        .collect();
    let series: Vec<plot::BarSeries> = SERIES
        .iter()
        .map(|&(name, get)| plot::BarSeries {
            name: name.to_string(),
            values: groups.iter().map(|r| get(r).map(factor)).collect(),
        })
        .collect();
    plot::bars(title, "speed-up (baseline time / time)", &labels, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        text.parse().unwrap()
    }

    #[test]
    fn quick_keeps_both_baselines_and_the_papers_settings() {
        let quick: Vec<&str> = scenarios(true).iter().map(|s| s.name).collect();
        for needed in [XEN34, "xen3.4-1/1", "xen3.4-1/1-dom0-1024"] {
            assert!(quick.contains(&needed), "{needed} missing from {quick:?}");
        }
        assert!(scenarios(false).len() > quick.len());
        // Every baseline a scenario names runs whenever the scenario does.
        for q in [true, false] {
            let all = scenarios(q);
            for s in &all {
                assert!(all.iter().any(|b| b.name == s.baseline), "{}", s.name);
            }
        }
    }

    #[test]
    fn every_real_node_file_is_a_valid_node() {
        for s in SCENARIOS {
            let text = node_toml(s, spec("cg.W"), &[0]);
            let node = crate::spec::node::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
            assert_eq!(node.domains.len(), RANKS);
            assert_eq!(node.dom0_weight, s.dom0_weight);
            assert_eq!(node.params.accounting, s.accounting.into());
        }
    }

    #[test]
    fn the_fit_recovers_known_costs() {
        let point = |frames: u64, kib: f64| CalibrationPoint {
            message_bytes: 0,
            frames,
            kib,
            dom0_cpu_s: (frames as f64 * 3.0 + kib * 0.5) / 1e6,
        };
        let (a, b) = fit(&[point(1000, 50.0), point(800, 7000.0)]);
        assert!((a - 3.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9, "{a} {b}");
        // Large frames cheaper per frame than small ones (batched wake-ups): the small
        // point alone gives the per-frame cost.
        let mut batched = [point(1000, 50.0), point(800, 7000.0)];
        batched[1].dom0_cpu_s = 0.001;
        let (a, b) = fit(&batched);
        assert!((a - 3.025).abs() < 1e-9 && b == 0.0, "{a} {b}");
    }

    #[test]
    fn the_simulation_file_parses_and_runs_every_scenario() {
        let calibration = Calibration {
            per_frame_us: 4.0,
            per_kib_us: 0.3,
            points: vec![],
        };
        let all = scenarios(true);
        let text = sim_toml(
            2,
            &calibration,
            &[(spec("cg.S"), 0.05), (spec("ep.S"), 0.2)],
            &all,
        );
        let sim = crate::sim::config::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
        let report = crate::sim::run(&sim).unwrap();
        assert_eq!(report.runs.len(), 2 * all.len());
        assert!(report.runs.iter().all(|r| r.finished), "{}", report.text());
    }

    #[test]
    fn in_the_simulator_xen_3_4s_30_10_is_slower_than_1_1_on_cg() {
        // S1's direction, with S1's own mechanism (tick accounting, no ratelimit), on
        // this experiment's node; asserted only in the deterministic simulator.
        let calibration = Calibration {
            per_frame_us: 18.0,
            per_kib_us: 0.0,
            points: vec![],
        };
        let tick: Vec<Scenario> = scenarios(true)
            .into_iter()
            .filter(|s| s.accounting == Accounting::Tick && s.dom0_weight == 256)
            .collect();
        let text = sim_toml(2, &calibration, &[(spec("cg.S"), 0.05)], &tick);
        let report = crate::sim::run(&crate::sim::config::parse(&text).unwrap()).unwrap();
        let time = |name: &str| {
            report
                .runs
                .iter()
                .find(|r| r.scenario == name)
                .and_then(|r| r.time_s)
                .unwrap()
        };
        assert!(
            time(XEN34) > time("xen3.4-1/1"),
            "30/10 {} s, 1/1 {} s",
            time(XEN34),
            time("xen3.4-1/1")
        );
    }

    #[test]
    fn rows_take_speed_ups_over_their_own_baseline() {
        let run = |scenario: &str, time: f64| RealRun {
            scenario: scenario.into(),
            benchmark: "cg.W".into(),
            round: 0,
            time_s: Some(time),
            verified: true,
            rank_cpu_s: vec![1.0; 4],
            rank_wait_s: vec![0.5; 4],
            dom0_cpu_s: 0.1,
            frames: 1,
            bytes: 1,
            wall_s: time,
            problems: vec![],
        };
        let runs = vec![
            run(XEN34, 3.0),
            run("xen3.4-1/1", 2.0),
            run("xen3.4-1/1-dom0-1024", 1.5),
            run(XEN4, 4.0),
            run("xen4-1/1", 4.0),
        ];
        let all = scenarios(false);
        let rows = rows(&all, &[spec("cg.W")], &runs, &[]);
        let get = |name: &str| rows.iter().find(|r| r.scenario.name == name).unwrap();
        assert_eq!(get("xen3.4-1/1").speedup_pct, Some(50.0));
        assert_eq!(get("xen3.4-1/1-dom0-1024").speedup_pct, Some(100.0));
        assert_eq!(get("xen4-1/1").speedup_pct, Some(0.0));
        assert_eq!(get(XEN34).speedup_pct, Some(0.0));
        assert_eq!(get("xen3.4-1/1").paper_pct, Some(45.3));
        assert_eq!(get("xen3.4-1/1").wait_s, Some(2.0));
        assert!(
            rows.iter()
                .filter(|r| r.time_s.is_some())
                .all(|r| r.verified)
        );
        assert!(
            !get("xen3.4-10/5").verified,
            "a scenario without runs is not verified"
        );
    }

    fn row(name: &str, speedup: Option<f64>, paper: Option<f64>) -> Row {
        let scenario = *SCENARIOS.iter().find(|s| s.name == name).unwrap();
        Row {
            scenario,
            benchmark: "cg.W".into(),
            time_s: None,
            speedup_pct: speedup,
            paper_pct: paper,
            sim_time_s: None,
            sim_speedup_pct: Some(12.0),
            wait_s: None,
            rank_cpu_s: None,
            dom0_cpu_s: None,
            verified: true,
        }
    }

    #[test]
    fn the_figure_is_well_formed_svg_with_a_bar_per_known_value() {
        let rows = vec![
            row("xen3.4-30/10", Some(0.0), Some(0.0)),
            row("xen3.4-1/1", Some(900.0), Some(45.3)),
            row("xen3.4-1/1-dom0-1024", Some(-20.0), None),
        ];
        let svg = speedups("test", &rows).unwrap();
        let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let text: String = doc
            .descendants()
            .filter(|n| n.is_text())
            .filter_map(|n| n.text())
            .collect();
        assert!(text.contains("cg.W 3.4-1/1"), "group labels: {text}");
        assert!(text.contains("S1 paper"), "legend: {text}");
        assert!(
            !text.contains("cg.W 3.4-30/10"),
            "the baseline is not a group"
        );
        // Bars: 2 groups x (kumo, sim) + 1 paper value, plus the legend's 3 swatches.
        let filled = |colour: plotters::style::RGBColor| {
            let hex = format!("#{:02X}{:02X}{:02X}", colour.0, colour.1, colour.2);
            doc.descendants()
                .filter(|n| n.tag_name().name() == "rect")
                .filter(|n| {
                    n.attribute("fill")
                        .is_some_and(|f| f.eq_ignore_ascii_case(&hex))
                })
                .count()
        };
        assert_eq!(filled(plot::PALETTE[0]), 2 + 1);
        assert_eq!(filled(plot::PALETTE[1]), 2 + 1);
        assert_eq!(filled(plot::PALETTE[2]), 1 + 1);
    }
}
