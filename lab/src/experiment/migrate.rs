//! S1's migration experiment on real VMs (`../shared/research/SEEDS.md`, S1): a VM of
//! an MPI job whose ranks busy-wait is moved while the job runs, under Xen 3.4's
//! default credit parameters (30/10 ms, domain 0 at 256) and under the tuned ones
//! (1/1 ms, domain 0 at 1024); S1 reports the tuned run time 10.2 % better with one
//! stop-and-copy migration, 9.0 % with one live migration, 35.9 % and 30.7 % with two,
//! and a migration time (2.6–3.5 s) the slice did not change.
//!
//! S1's shape, scaled to this host's two CPUs (one per "host"; two credit schedulers
//! on the same CPUs would starve each other's real-time vCPU threads):
//! - **the node** (host CPU 0): S1's node, two DomUs of one vCPU running two ranks each
//!   (ranks 0-1 and 2-3) under the guest's tick, and domain 0 (the switch, the wire to
//!   the standby node), under kumo's credit scheduler with the scenario's parameters;
//! - **the standby node** (host CPU 1): a `kumo node` process under the same
//!   parameters with domain 0 and no DomU of its own, but one waiting for each DomU
//!   to move (`incoming`), joined to the node's switch by the wire.
//!
//! `kumo ctl migrate --domain` moves DomU `u1` (ranks 2-3) to the standby node, where
//! it runs on under that node's credit scheduler and switch; with two migrations `u0`
//! (rank 0's, which prints the job's results) follows it.
//!
//! Per round every scenario runs first without a migration; that run places the
//! migrations of the same round at 20 % of its span from the node's control socket
//! to the job's end (a second one as soon as the first is done), as S1 moved its DomU
//! ~10 s into SP.A. The span holds the guests' boot and the node's teardown,
//! whose length varies from run to run: fractions of the whole span keep the first
//! migration inside the job however the two vary.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use npb::{Class, Kernel, Spec};
use serde::Serialize;

use super::process::{Process, RunDir};
use super::s1::{self, Scenario};
use super::{Progress, Summary, node_problems, summary_cell};
use crate::experiment::ExperimentArgs;
use kumo_vmm::spec::job::Wait;

/// The node's host CPU and the standby node's.
const NODE_CPU: usize = 0;
const STANDBY_CPU: usize = 1;
/// S1's DomUs: single-vCPU VMs of two ranks each.
const DOMUS: usize = 2;
const RANKS_PER_VCPU: u32 = s1::RANKS_PER_VCPU;
/// The DomUs that move, in order: ranks 2-3's, then rank 0's.
const MOVING: [&str; 2] = ["u1", "u0"];
/// Where the migrations fall, as fractions of the round's run without one.
/// The second falls with the first, so it starts as soon as the first is done: once
/// `u1` moved the job has a CPU more and ends far sooner than its run without a
/// migration (SP.S at 30/10 ms: 37 s without, 13-15 s with one), and a second at
/// half that run's span came after the job's end.
const MOMENTS: [f64; 2] = [0.2, 0.2];
/// The longest wait for a process's control socket, and for the last rank process
/// to end after the node's ranks did.
const START_PATIENCE: Duration = Duration::from_secs(30);
const END_PATIENCE: Duration = Duration::from_secs(60);
/// The longest wait for the standby node to end the job once both DomUs moved there
/// (a hang guard: SP.A at 30/10 ms takes minutes).
const STANDBY_PATIENCE: Duration = Duration::from_secs(3600);

/// How the VM is moved in a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Mode {
    pub name: &'static str,
    pub migrations: usize,
    pub stop_and_copy: bool,
    /// Run with `--quick` too.
    #[serde(skip)]
    quick: bool,
    /// S1's improvement of the tuned run time over the defaults', in percent.
    pub paper_pct: Option<f64>,
}

pub const MODES: &[Mode] = &[
    Mode {
        name: "no migration",
        migrations: 0,
        stop_and_copy: false,
        quick: true,
        paper_pct: None,
    },
    Mode {
        name: "1 stop-and-copy",
        migrations: 1,
        stop_and_copy: true,
        quick: true,
        paper_pct: Some(10.2),
    },
    Mode {
        name: "1 live",
        migrations: 1,
        stop_and_copy: false,
        quick: false,
        paper_pct: Some(9.0),
    },
    Mode {
        name: "2 stop-and-copy",
        migrations: 2,
        stop_and_copy: true,
        quick: false,
        paper_pct: Some(35.9),
    },
    Mode {
        name: "2 live",
        migrations: 2,
        stop_and_copy: false,
        quick: false,
        paper_pct: Some(30.7),
    },
];

/// S1's two settings: Xen 3.4.2's defaults, and 1/1 ms with domain 0 at 1024.
const DEFAULT: &str = s1::XEN34;
const TUNED: &str = s1::XEN34_TUNED;

fn scenarios() -> Result<Vec<Scenario>> {
    [DEFAULT, TUNED]
        .iter()
        .map(|name| {
            s1::SCENARIOS
                .iter()
                .find(|s| s.name == *name)
                .copied()
                .with_context(|| format!("S1 has no scenario {name}"))
        })
        .collect()
}

pub fn modes(quick: bool) -> Vec<Mode> {
    MODES
        .iter()
        .filter(|m| m.quick || !quick)
        .copied()
        .collect()
}

/// SP, as S1 moved a DomU running SP.A; class S with `--quick` (in this shape SP's
/// time is its message count times the guest's tick, and S has a quarter of A's
/// steps), which moves by stop-and-copy only: a stop-and-copy stops the job for its
/// copy, so only the setup before its pause must fall inside the job.
pub fn benchmark(quick: bool) -> Spec {
    Spec {
        kernel: Kernel::Sp,
        class: if quick { Class::S } else { Class::A },
    }
}

/// One migration as `kumo ctl ... migrate --json` reported it.
#[derive(Debug, Clone, Serialize)]
pub struct Migration {
    /// Seconds after the moving VM's control socket appeared.
    pub at_s: f64,
    pub total_ms: f64,
    pub downtime_ms: f64,
    /// Of the downtime: stopping the vCPUs, and everything until the last pages and
    /// state were sent (the rest is the standby building and starting the VM).
    pub pause_ms: f64,
    pub sent_ms: f64,
    pub bytes: u64,
    pub rounds: usize,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub scenario: String,
    pub mode: String,
    pub round: u32,
    /// The job's time as rank 0 reports it.
    pub time_s: Option<f64>,
    /// The node's end less the job's time, in seconds after the moving VM's control
    /// socket appeared: the guests' boot plus the node's teardown (an upper bound on
    /// when the job started).
    pub job_start_s: Option<f64>,
    /// Rank 0 verified, every migration planned was made, every rank process ended
    /// cleanly.
    pub verified: bool,
    pub migrations: Vec<Migration>,
    pub wall_s: f64,
    pub problems: Vec<String>,
}

/// The node file: S1's node of two DomUs on the node's CPU, its ranks waiting as
/// `wait` says, its switch listening on `wire` for the standby node's.
pub fn node_toml(scenario: &Scenario, (spec, wait): (Spec, Wait), wire: &Path) -> String {
    s1::rank_node_toml(
        scenario,
        spec,
        &[NODE_CPU],
        (DOMUS, RANKS_PER_VCPU, wait),
        &format!(
            "wire = \"listen:unix:{}\"\nwire_wait_s = {}\n",
            wire.display(),
            START_PATIENCE.as_secs()
        ),
    )
}

/// The standby node's file: the same scheduler and domain 0 on the standby CPU, its
/// switch connected to the node's by `wire`, and a domain waiting at each of
/// `incoming` (name, `tcp:HOST:PORT`) for the DomU of that name. (A DomU that moves
/// brings its own ranks and their wait; `wait` keeps the file the node's twin.)
pub fn standby_toml(
    scenario: &Scenario,
    (spec, wait): (Spec, Wait),
    wire: &Path,
    token: &Path,
    incoming: &[(&str, String)],
) -> String {
    let mut text = s1::rank_node_toml(
        scenario,
        spec,
        &[STANDBY_CPU],
        (0, RANKS_PER_VCPU, wait),
        &format!(
            "job_size = {}\nwire = \"unix:{}\"\nwire_wait_s = {}\n",
            DOMUS as u32 * RANKS_PER_VCPU,
            wire.display(),
            START_PATIENCE.as_secs()
        ),
    );
    for (name, address) in incoming {
        text.push_str(&format!(
            "[[domain]]\nname = \"{name}\"\nincoming = \"{address}\"\ntoken_file = \"{}\"\n",
            token.display()
        ));
    }
    text
}

fn wait_for(path: &Path, until: Instant, stop: &AtomicBool) -> bool {
    while !path.exists() {
        if Instant::now() >= until || stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// What the standby side of a run saw.
struct StandbySide {
    /// When the node's control socket appeared.
    up: Instant,
    migrations: Vec<Migration>,
    problems: Vec<String>,
    /// The standby node's JSON lines, if it ran to its end (a DomU arrived).
    lines: Vec<serde_json::Value>,
    /// When it ended.
    ended: Option<Instant>,
}

/// The standby node of a run, on the standby CPU: its process (a domain waiting for
/// each DomU the mode moves, `u1` even without a migration, so that every mode runs
/// the same two nodes), the migrations from the node's socket `node_ctl` at
/// `moments` (seconds after that socket appeared), then the standby's end if a DomU
/// arrived (else it is stopped).
fn standby_side(
    dir: &Path,
    (scenario, job): (&Scenario, (Spec, Wait)),
    mode: &Mode,
    moments: &[f64],
    node_ctl: &Path,
    job_over: &AtomicBool,
) -> Result<StandbySide> {
    let token = dir.join("token");
    std::fs::write(
        &token,
        format!(
            "kumo-experiment-{}-{:?}",
            std::process::id(),
            Instant::now()
        ),
    )?;
    let text = |p: &Path| p.display().to_string();
    let words = |list: &[&str]| -> Vec<String> { list.iter().map(|w| w.to_string()).collect() };
    let incoming = MOVING[..mode.migrations.max(1)]
        .iter()
        .map(|name| {
            Ok((
                *name,
                format!("tcp:127.0.0.1:{}", super::process::free_port()?),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let config = dir.join("standby.toml");
    std::fs::write(
        &config,
        standby_toml(scenario, job, &dir.join("wire"), &token, &incoming),
    )?;
    let out = dir.join("standby.out");
    // The standby node sees the whole host (its file names its CPU); this thread and
    // the `kumo ctl` processes it starts then keep to the standby's CPU.
    let mut standby = Process::start_capturing(
        "the standby node",
        dir,
        &words(&[
            "node",
            "--config",
            &text(&config),
            "--api-socket",
            &text(&dir.join("standby.sock")),
            "--json",
        ]),
        &out,
    )?;
    hv::placement::confine_thread(0, &[STANDBY_CPU])?;
    let mut problems = Vec::new();
    let mut migrations = Vec::new();
    if !wait_for(node_ctl, Instant::now() + START_PATIENCE, job_over) {
        bail!(
            "the node's control socket did not appear; {}",
            standby.state()
        );
    }
    let up = Instant::now();
    for (k, (name, target)) in incoming.iter().enumerate().take(mode.migrations) {
        let at = up + Duration::from_secs_f64(moments[k]);
        while Instant::now() < at && !job_over.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if job_over.load(Ordering::SeqCst) {
            problems.push(format!("the job ended before migration {}", k + 1));
            break;
        }
        let at_s = up.elapsed().as_secs_f64();
        let mut args = words(&[
            "ctl",
            "--socket",
            &text(node_ctl),
            "--json",
            "migrate",
            "--domain",
            name,
            "--to",
            target,
            "--token-file",
            &text(&token),
        ]);
        if mode.stop_and_copy {
            args.push("--stop-and-copy".into());
        }
        match migrate(&args, at_s) {
            Ok(m) => migrations.push(m),
            Err(e) => {
                problems.push(format!(
                    "migration {}: {}",
                    k + 1,
                    kumo_vmm::output::error_chain(&e)
                ));
                break;
            }
        }
    }
    // The standby runs to its end once every DomU it waits for arrived; otherwise it
    // is stopped (the run is unverified then: a migration is missing).
    let (lines, ended) = if migrations.is_empty() || migrations.len() < mode.migrations {
        (Vec::new(), None)
    } else {
        // Once rank 0's DomU moved the job runs on the standby alone: the node's end
        // is not the job's.
        let rank_0_moved = migrations.len() == MOVING.len();
        let finished = match rank_0_moved {
            true => standby.finish(&AtomicBool::new(true), STANDBY_PATIENCE),
            false => standby.finish(job_over, END_PATIENCE),
        };
        problems.extend(finished);
        let ended = Instant::now();
        let lines = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (lines, Some(ended))
    };
    Ok(StandbySide {
        up,
        migrations,
        problems,
        lines,
        ended,
    })
}

/// One `kumo ctl ... migrate --json`, its reply read into a [`Migration`].
pub(super) fn migrate(args: &[String], at_s: f64) -> Result<Migration> {
    let exe = std::env::current_exe().context("finding kumo's own executable")?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kumo ctl")?;
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out)?;
    }
    if let Some(mut stderr) = child.stderr.take() {
        stderr.read_to_string(&mut err)?;
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{}", err.trim());
    }
    let reply: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("kumo ctl printed {out:?}"))?;
    let number = |key: &str| {
        reply[key]
            .as_f64()
            .with_context(|| format!("no {key} in {out}"))
    };
    Ok(Migration {
        at_s,
        total_ms: number("total_ms")?,
        downtime_ms: number("downtime_ms")?,
        pause_ms: number("pause_ms")?,
        sent_ms: number("sent_ms")?,
        bytes: number("total_bytes")? as u64,
        rounds: reply["rounds"].as_array().map_or(0, Vec::len),
    })
}

fn one_run(
    scenario: &Scenario,
    mode: &Mode,
    (spec, wait): (Spec, Wait),
    round: u32,
    moments: &[f64],
    kvm_device: &Path,
    epoch: Instant,
) -> Result<Run> {
    let dir = RunDir::new()?;
    let text = node_toml(scenario, (spec, wait), &dir.0.join("wire"));
    let node_ctl = dir.0.join("node.sock");
    let job_over = AtomicBool::new(false);
    let start = Instant::now();
    let (outcome, ended, standby) = std::thread::scope(|scope| {
        let standby = scope.spawn(|| {
            standby_side(
                &dir.0,
                (scenario, (spec, wait)),
                mode,
                moments,
                &node_ctl,
                &job_over,
            )
        });
        let outcome = kumo_vmm::spec::node::parse(&text)
            .context("the experiment's node")
            .and_then(|node| kumo_vmm::node::run(&node, kvm_device, Some(&node_ctl), epoch));
        let ended = Instant::now();
        job_over.store(true, Ordering::SeqCst);
        let standby = standby
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the standby side's thread panicked")));
        (outcome, ended, standby)
    });
    // A node that failed (its wire waits for the standby's) may fail because of the
    // standby: say what the standby side saw.
    let standby_said = match (&outcome, &standby) {
        (Err(_), Err(e)) => format!(" (the standby side: {e:#})"),
        _ => String::new(),
    };
    let outcome =
        outcome.with_context(|| format!("{} {}{standby_said}", scenario.name, mode.name))?;
    let standby = standby?;
    let (up, migrations, mut problems) = (standby.up, standby.migrations, standby.problems);
    problems.extend(node_problems(&outcome));
    // Rank 0's results: its DomU's, on the node or, once it moved, on the standby.
    let here = outcome.first_result().map(|r| (r.time_s, r.verified));
    let there = standby.lines.iter().find_map(|line| {
        let row = line["results"].as_array()?.first()?;
        Some((row["time_s"].as_f64()?, row["verified"] == true))
    });
    for line in &standby.lines {
        for problem in line["problems"].as_array().into_iter().flatten() {
            problems.push(format!(
                "standby {}: {}",
                line["domain"].as_str().unwrap_or("?"),
                problem.as_str().unwrap_or("?")
            ));
        }
    }
    let result = here.or(there);
    let verified = result.is_some_and(|(_, verified)| verified)
        && migrations.len() == mode.migrations
        && problems.is_empty();
    let time_s = result.map(|(time, _)| time);
    // The job ends where rank 0's DomU ends.
    let end = standby.ended.filter(|_| here.is_none()).unwrap_or(ended);
    Ok(Run {
        scenario: scenario.name.to_string(),
        mode: mode.name.to_string(),
        round,
        time_s,
        job_start_s: time_s.map(|t| (end.duration_since(up).as_secs_f64() - t).max(0.0)),
        verified,
        migrations,
        wall_s: start.elapsed().as_secs_f64(),
        problems,
    })
}

/// One row: a scenario and a mode.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub mode: String,
    pub time_s: Option<Summary>,
    /// The tuned scenario's rows: percent faster than the defaults' with the same
    /// migrations (S1's "improved by").
    pub speedup_pct: Option<f64>,
    pub paper_pct: Option<f64>,
    /// Medians over the runs' migrations.
    pub migration_ms: Option<f64>,
    pub downtime_ms: Option<f64>,
    pub migrated_mib: Option<f64>,
    pub verified: bool,
}

pub fn rows(scenarios: &[Scenario], modes: &[Mode], runs: &[Run]) -> Vec<Row> {
    let of = |scenario: &str, mode: &str| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.scenario == scenario && r.mode == mode)
            .collect()
    };
    let time = |mine: &[&Run]| {
        let times: Vec<f64> = mine.iter().filter_map(|r| r.time_s).collect();
        Summary::of(&times)
    };
    let mut out = Vec::new();
    for mode in modes {
        let base = time(&of(DEFAULT, mode.name)).map(|t| t.median);
        for s in scenarios {
            let mine = of(s.name, mode.name);
            let moves = || mine.iter().flat_map(|r| r.migrations.iter());
            let t = time(&mine);
            let tuned = s.name != DEFAULT;
            out.push(Row {
                scenario: s.name.to_string(),
                mode: mode.name.to_string(),
                time_s: t,
                speedup_pct: tuned
                    .then(|| s1::speedup_pct(base, t.map(|t| t.median)))
                    .flatten(),
                paper_pct: mode.paper_pct.filter(|_| tuned),
                migration_ms: kumo_vmm::stats::median_of(moves().map(|m| m.total_ms)),
                downtime_ms: kumo_vmm::stats::median_of(moves().map(|m| m.downtime_ms)),
                migrated_mib: kumo_vmm::stats::median_of(
                    moves().map(|m| m.bytes as f64 / (1 << 20) as f64),
                ),
                verified: !mine.is_empty() && mine.iter().all(|r| r.verified),
            });
        }
    }
    out
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub experiment: &'static str,
    pub quick: bool,
    pub benchmark: String,
    /// How the ranks wait for a message (`--wait`, default as `s1`'s).
    pub wait: Wait,
    pub runs_per_scenario: u32,
    pub rows: Vec<Row>,
    pub runs: Vec<Run>,
    pub ok: bool,
}

/// Where a round's migrations fall, from its run without one: each of [`MOMENTS`] of
/// its span from the moving VM's control socket to the job's end (from 0 if that run
/// has no result, which already makes the experiment unverified).
fn moments_after(baseline: &Run) -> Vec<f64> {
    let span = baseline.job_start_s.unwrap_or(0.0) + baseline.time_s.unwrap_or(0.0);
    MOMENTS.iter().map(|f| f * span).collect()
}

pub fn run(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    let host = hv::placement::process_cpus();
    if !host.contains(&NODE_CPU) || !host.contains(&STANDBY_CPU) {
        bail!(
            "the migration experiment needs host CPUs {NODE_CPU} and {STANDBY_CPU} (kumo may use {host:?})"
        );
    }
    let scenarios = scenarios()?;
    let modes = modes(args.quick);
    let spec = benchmark(args.quick);
    let wait = args.wait.unwrap_or(s1::DEFAULT_WAIT);
    let progress = Progress::new(scenarios.len() * modes.len() * args.runs as usize);
    let mut runs: Vec<Run> = Vec::new();
    'rounds: for round in 0..args.runs {
        for scenario in &scenarios {
            // The first mode has no migration: its time places the others'.
            let mut moments = Vec::new();
            for mode in &modes {
                if hv::stop::requested().is_some() {
                    break 'rounds;
                }
                progress.step(&format!(
                    "run {} of {}: {} {}",
                    round + 1,
                    args.runs,
                    scenario.name,
                    mode.name
                ));
                let run = one_run(
                    scenario,
                    mode,
                    (spec, wait),
                    round,
                    &moments,
                    &args.kvm_device,
                    epoch,
                )?;
                if mode.migrations == 0 {
                    moments = moments_after(&run);
                }
                runs.push(run);
                progress.done_one();
            }
        }
    }
    progress.finish();
    let rows = rows(&scenarios, &modes, &runs);
    let complete = runs.len() == scenarios.len() * modes.len() * args.runs as usize;
    let ok = complete && rows.iter().all(|r| r.verified);
    let report = Report {
        experiment: "migrate",
        quick: args.quick,
        benchmark: spec.to_string(),
        wait,
        runs_per_scenario: args.runs,
        rows,
        runs,
        ok,
    };
    let problems: Vec<String> = report
        .runs
        .iter()
        .filter(|r| !r.verified)
        .map(|run| {
            format!(
                "{} {} (run {}) did not verify: {}",
                run.scenario,
                run.mode,
                run.round + 1,
                run.problems.join("; ")
            )
        })
        .collect();
    super::conclude(
        args,
        &report,
        text,
        |r| Ok(vec![("migrate-speedup.svg", figure(r)?)]),
        &problems,
        ok,
    )
}

/// The tuned setting's speed-up over the defaults per mode, kumo's beside S1's.
fn figure(report: &Report) -> Result<String> {
    let tuned: Vec<&Row> = report.rows.iter().filter(|r| r.scenario == TUNED).collect();
    let labels: Vec<String> = tuned.iter().map(|r| r.mode.clone()).collect();
    let factor = |pct: Option<f64>| pct.map(|p| 1.0 + p / 100.0);
    let series = [
        super::plot::BarSeries {
            name: "kumo, real VMs".into(),
            values: tuned.iter().map(|r| factor(r.speedup_pct)).collect(),
        },
        super::plot::BarSeries {
            name: "S1 paper (Xen 3.4.2, SP.A)".into(),
            values: tuned.iter().map(|r| factor(r.paper_pct)).collect(),
        },
    ];
    super::plot::bars(
        &format!(
            "S1 migration: {} at 1/1 ms + dom0 1024 over 30/10 ms (log scale)",
            report.benchmark
        ),
        "speed-up (default time / tuned time)",
        &labels,
        &series,
    )
}

/// The table beside S1's figures.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "S1's migration experiment on real VMs: NPB-MPI {} on 4 ranks, {}, in S1's \
         node: 2 DomUs x 1 vCPU x 2 ranks and domain 0 under the credit scheduler on host CPU \
         {NODE_CPU}; DomU u1 (then u0) moves to a standby node (domain 0 and the same \
         scheduler) on host CPU {STANDBY_CPU}: this 2-CPU host gives each node one CPU; \
         {} run(s) per row, medians [min-max]\n\n",
        report.benchmark,
        s1::wait_phrase(report.wait),
        report.runs_per_scenario,
    );
    let mut table = vec![
        [
            "migrations",
            "scenario",
            "time (s)",
            "tuned speed-up",
            "S1 paper",
            "migration (ms)",
            "downtime (ms)",
            "sent (MiB)",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    for r in &report.rows {
        table.push(vec![
            r.mode.clone(),
            r.scenario.clone(),
            summary_cell(r.time_s),
            s1::pct(r.speedup_pct),
            s1::pct(r.paper_pct),
            ms(r.migration_ms),
            ms(r.downtime_ms),
            ms(r.migrated_mib),
        ]);
    }
    out.push_str(&kumo_vmm::output::table(&table, 2));
    out.push_str(&format!(
        "\ntuned speed-up: {TUNED} (1/1 ms, domain 0 at 1024) over {DEFAULT} with the same \
         migrations. S1 paper: Xen 3.4.2, SP.A on 2 nodes x 4 processes, a DomU moved ~10 s in \
         to a standby host; its migrations took 2.6-3.5 s (domain 0 at 256), 2.6-3.0 s (1024).\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `sleep` child standing in for a rank process.
    fn sleeper(seconds: &str) -> Process {
        let dir = std::env::temp_dir();
        let stderr = dir.join(format!(
            "kumo-finish-test-{}-{seconds}.err",
            std::process::id()
        ));
        let child = Command::new("sleep")
            .arg(seconds)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("sleep runs");
        Process {
            child,
            name: "the sleeper".into(),
            stderr,
        }
    }

    #[test]
    fn a_rank_process_may_run_as_long_as_the_job_does() {
        // No patience at all, but the job is not over: a process that ends is fine.
        let job_over = AtomicBool::new(false);
        let mut process = sleeper("0.3");
        assert_eq!(process.finish(&job_over, Duration::ZERO), None);
        let _ = std::fs::remove_file(&process.stderr);
    }

    #[test]
    fn a_rank_process_that_outlives_the_job_by_its_patience_is_a_problem() {
        let job_over = AtomicBool::new(true);
        let mut process = sleeper("30");
        let problem = process.finish(&job_over, Duration::from_millis(100));
        let _ = std::fs::remove_file(&process.stderr);
        assert!(
            problem
                .as_deref()
                .is_some_and(|p| p.contains("did not end within 0.1 s of the job's end")),
            "{problem:?}"
        );
    }

    fn run(scenario: &str, mode: &str, time: f64) -> Run {
        Run {
            scenario: scenario.into(),
            mode: mode.into(),
            round: 0,
            time_s: Some(time),
            job_start_s: Some(0.5),
            verified: true,
            migrations: vec![Migration {
                at_s: 1.0,
                total_ms: 900.0,
                downtime_ms: 5.0,
                pause_ms: 1.0,
                sent_ms: 4.0,
                bytes: 3 << 20,
                rounds: 2,
            }],
            wall_s: time,
            problems: vec![],
        }
    }

    #[test]
    fn the_node_files_are_s1s_node_and_a_standby_waiting_for_its_domus() {
        if kumo_vmm::guest::host_cpus() < 2 {
            return; // the standby node's CPU is host CPU 1
        }
        for s in scenarios().unwrap() {
            let text = node_toml(&s, (benchmark(true), Wait::Yield), Path::new("/tmp/w.sock"));
            let node =
                kumo_vmm::spec::node::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
            assert_eq!(node.domains.len(), DOMUS);
            assert_eq!(node.pcpus, [NODE_CPU]);
            let net = node.network.clone().unwrap();
            assert_eq!(net.job_size, None, "the whole job runs on the node");
            assert_eq!(
                net.wire,
                Some(kumo_vmm::spec::job::WireSpec::Listen(
                    kumo_vmm::spec::job::WireAddr::Unix("/tmp/w.sock".into())
                ))
            );
            assert!(node.domains[1].cmdline().contains("mpi=2:4:2"));
            assert_eq!(node.domains[1].name, MOVING[0]);
            // The domains it sends can move (S1's DomUs are NPB-MPI ranks).
            for d in &node.domains {
                assert!(kumo_vmm::node_move::app_of(&node, d).is_ok());
            }
            let incoming = [
                ("u1", "tcp:127.0.0.1:1".to_string()),
                ("u0", "tcp:127.0.0.1:2".to_string()),
            ];
            let text = standby_toml(
                &s,
                (benchmark(true), Wait::Yield),
                Path::new("/tmp/w.sock"),
                Path::new("/tmp/token"),
                &incoming,
            );
            let standby =
                kumo_vmm::spec::node::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
            assert_eq!(standby.pcpus, [STANDBY_CPU]);
            assert_eq!(standby.dom0_weight, node.dom0_weight);
            assert_eq!(standby.params, node.params);
            assert_eq!(standby.domains.len(), 2);
            assert!(standby.domains.iter().all(|d| d.incoming.is_some()));
        }
    }

    #[test]
    fn quick_keeps_a_run_without_and_with_a_stop_and_copy_migration() {
        let quick = modes(true);
        assert_eq!(quick[0].migrations, 0, "the first mode places the others");
        assert!(quick.iter().any(|m| m.migrations == 1 && m.stop_and_copy));
        // A live one need not fit the quick job (see `benchmark`).
        assert!(quick.iter().all(|m| m.stop_and_copy || m.migrations == 0));
        assert_eq!(modes(false).len(), MODES.len());
        assert_eq!(modes(false)[0].migrations, 0);
        assert!(MODES.iter().all(|m| m.migrations <= MOMENTS.len()));
    }

    #[test]
    fn the_tuned_rows_take_their_speed_up_over_the_defaults_with_the_same_migrations() {
        let runs = vec![
            run(DEFAULT, "1 live", 30.0),
            run(TUNED, "1 live", 3.0),
            run(DEFAULT, "no migration", 20.0),
            run(TUNED, "no migration", 4.0),
        ];
        let all = scenarios().unwrap();
        let chosen: Vec<Mode> = MODES
            .iter()
            .filter(|m| m.name == "1 live" || m.name == "no migration")
            .copied()
            .collect();
        let rows = rows(&all, &chosen, &runs);
        let get = |s: &str, m: &str| {
            rows.iter()
                .find(|r| r.scenario == s && r.mode == m)
                .unwrap()
        };
        assert_eq!(get(TUNED, "1 live").speedup_pct, Some(900.0));
        assert_eq!(get(TUNED, "no migration").speedup_pct, Some(400.0));
        assert_eq!(get(DEFAULT, "1 live").speedup_pct, None);
        assert_eq!(get(TUNED, "1 live").paper_pct, Some(9.0));
        assert_eq!(get(DEFAULT, "1 live").paper_pct, None);
        assert_eq!(get(TUNED, "1 live").migration_ms, Some(900.0));
        assert_eq!(get(TUNED, "1 live").migrated_mib, Some(3.0));
        assert!(rows.iter().all(|r| r.verified));
        let text = text(&Report {
            experiment: "migrate",
            quick: true,
            benchmark: "cg.W".into(),
            wait: Wait::Spin,
            runs_per_scenario: 1,
            rows: rows.clone(),
            runs: runs.clone(),
            ok: true,
        });
        assert!(text.contains("+900.0 %"), "{text}");
        assert!(text.contains("4 ranks, spin-waiting,"), "{text}");
    }

    #[test]
    fn migrations_fall_at_fractions_of_the_span_to_the_jobs_end() {
        let baseline = run(TUNED, "no migration", 3.5);
        assert_eq!(moments_after(&baseline), [0.8, 0.8]);
    }

    #[test]
    fn a_run_without_its_migration_is_not_verified() {
        let mut missed = run(TUNED, "1 live", 3.0);
        missed.verified = false;
        missed.migrations.clear();
        let all = scenarios().unwrap();
        let rows = rows(&all, &MODES[2..3], &[missed]);
        assert!(!rows.iter().any(|r| r.verified));
    }
}
