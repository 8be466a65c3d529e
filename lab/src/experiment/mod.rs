//! `kumo experiment NAME`: one command per seed experiment
//! (`../shared/research/SEEDS.md`). Each experiment is one module with its scenarios,
//! its runner (real VMs through the node machinery, and the simulator), the paper's
//! published numbers, its table and its plot; this module holds what they share:
//! the output directory, repeated runs interleaved so host drift hits every scenario
//! alike, summaries (median and range) and the progress bar.

pub mod migrate;
pub mod plot;
pub mod process;
pub mod s1;
pub mod s2;
pub mod s3;
pub mod s4;
pub mod s5;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

/// The experiments `kumo experiment` knows, with a line each for `--help` and errors.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "s1",
        "credit-scheduler slice, tick and domain-0 weight for an MPI job of busy-waiting ranks",
    ),
    (
        "s2",
        "one-way MPI latency and throughput: passthrough and emulated NICs beside bare metal",
    ),
    (
        "s3",
        "SIMULATED: S3's vCPU placements on 2 x 16 Bulldozer cores, and a module-aware credit scheduler",
    ),
    (
        "s4",
        "a passthrough NIC and its fast interrupt path against an emulated NIC and bare metal",
    ),
    (
        "s5",
        "VMs on a fast and a half-speed host, static against balanced by live migration from measured progress",
    ),
    (
        "migrate",
        "S1's migration: a VM of a running MPI job moved, under default and tuned credit slices",
    ),
];

pub fn run_experiment(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    // Checked before minutes of runs, not after.
    if let Some(dir) = &args.out {
        prepare_out(dir)?;
    }
    if args.wait.is_some() && !matches!(args.name.as_str(), "s1" | "migrate") {
        bail!("--wait is for s1 and migrate only");
    }
    if args.name != "s1" {
        if args.dom0.is_some() {
            bail!("--dom0 is for s1 only");
        }
        if !args.bench.is_empty() {
            bail!("--bench is for s1 only");
        }
    }
    match args.name.as_str() {
        "s1" => s1::run(args, epoch),
        "s2" => s2::run(args, epoch),
        "s3" => s3::run(args, epoch),
        "s4" => s4::run(args, epoch),
        "s5" => s5::run(args, epoch),
        "migrate" => migrate::run(args, epoch),
        other => {
            let known: Vec<&str> = EXPERIMENTS.iter().map(|(name, _)| *name).collect();
            bail!("unknown experiment '{other}' (known: {})", known.join(", "))
        }
    }
}

/// Creates `dir` if needed and proves it writable.
fn prepare_out(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--out {}: cannot create the directory", dir.display()))?;
    let probe = dir.join(format!(".kumo-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .with_context(|| format!("--out {}: cannot write there", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Writes `contents` to `dir/name`, naming the file on failure.
pub fn write_out(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// How every experiment ends: with `--out`, `NAME.json` (the report) and the figures
/// `figures` makes, each file named on stderr; the report on stdout (`--json`) or
/// `table`; a line on stderr per problem; the exit status (1 unless `ok`).
pub fn conclude<R: Serialize>(
    args: &ExperimentArgs,
    report: &R,
    table: impl FnOnce(&R) -> String,
    figures: impl FnOnce(&R) -> Result<Vec<(&'static str, String)>>,
    problems: &[String],
    ok: bool,
) -> Result<u8> {
    let json = serde_json::to_string(report)?;
    if let Some(dir) = &args.out {
        let mut files = vec![(format!("{}.json", args.name), json.clone())];
        files.extend(
            figures(report)?
                .into_iter()
                .map(|(name, text)| (name.to_string(), text)),
        );
        for (name, contents) in files {
            let path = write_out(dir, &name, contents.as_bytes())?;
            eprintln!("kumo: wrote {}", path.display());
        }
    }
    if args.json {
        kumo_vmm::outln!("{json}");
    } else {
        kumo_vmm::out!("{}", table(report));
    }
    for problem in problems {
        eprintln!("kumo: {problem}");
    }
    Ok(if ok {
        kumo_vmm::report::EXIT_OK
    } else {
        kumo_vmm::report::EXIT_UNVERIFIED
    })
}

/// Runs one node file (text) on real VMs: what the experiments' runs are made of.
pub fn run_node_text(
    text: &str,
    kvm_device: &Path,
    epoch: Instant,
) -> Result<kumo_vmm::node::NodeOutcome> {
    let node = kumo_vmm::spec::node::parse(text).context("the experiment's node")?;
    kumo_vmm::node::run(&node, kvm_device, None, epoch)
}

/// Every domain's problems in a node run, each named by its domain.
pub fn node_problems(outcome: &kumo_vmm::node::NodeOutcome) -> Vec<String> {
    outcome
        .reports
        .iter()
        .flat_map(|r| {
            r.verdict
                .problems
                .iter()
                .map(move |p| format!("{}: {p}", r.domain.name))
        })
        .collect()
}

/// Median and range of repeated measurements: the one summary of every figure
/// (`kumo_vmm::stats`).
pub use kumo_vmm::stats::Summary;

/// A table cell of times: the median, with the range when there were several runs.
pub fn summary_cell(summary: Option<Summary>) -> String {
    match summary {
        Some(t) if t.n > 1 => format!("{:.3} [{:.3}-{:.3}]", t.median, t.min, t.max),
        Some(t) => format!("{:.3}", t.median),
        None => "no result".into(),
    }
}

/// The order in which `runs` repetitions of `items` run: every item once per round,
/// rounds one after another, so slow drift of the host touches every item alike.
pub fn interleaved(items: usize, runs: u32) -> Vec<(u32, usize)> {
    (0..runs)
        .flat_map(|round| (0..items).map(move |item| (round, item)))
        .collect()
}

/// Runs `runs` repetitions of every configuration named in `names`, interleaved (see
/// [`interleaved`]), with a progress bar: `one(configuration, round)` is one run. Stops
/// early (returning what ran) if kumo was asked to stop.
pub fn run_interleaved<R>(
    names: &[&str],
    runs: u32,
    mut one: impl FnMut(usize, u32) -> Result<R>,
) -> Result<Vec<R>> {
    let plan = interleaved(names.len(), runs);
    let progress = Progress::new(plan.len());
    let mut results = Vec::new();
    for (round, item) in plan {
        if hv::stop::requested().is_some() {
            break;
        }
        progress.step(&format!("run {} of {runs}: {}", round + 1, names[item]));
        results.push(one(item, round)?);
        progress.done_one();
    }
    progress.finish();
    Ok(results)
}

/// A progress bar on stderr for the minutes an experiment runs (drawn only when
/// stderr is a terminal).
pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    pub fn new(steps: usize) -> Progress {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(steps as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress { bar }
    }

    /// Names the step about to run.
    pub fn step(&self, what: &str) {
        self.bar.set_message(what.to_string());
    }

    pub fn done_one(&self) {
        self.bar.inc(1);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[derive(Args, Debug)]
pub struct ExperimentArgs {
    /// The experiment: s1 (credit-scheduler slice, tick and domain-0 weight for MPI
    /// ranks that busy-wait), s2 (MPI latency and throughput through passthrough and
    /// emulated NICs), s3 (SIMULATED: vCPU placement on Bulldozer modules), s4 (a
    /// passthrough NIC and its fast interrupt path), s5 (VMs balanced by live migration
    /// across a fast and a half-speed host) or migrate
    /// (S1's migration of a VM of a running MPI job, default against tuned slice).
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Shorter: s1 runs its seven benchmarks at class W (BT, LU, SP at S; EP at A)
    /// instead of A, and only Xen 3.4.2's baseline and the settings the paper gives
    /// numbers for (in its loaded domain 0 family on BT, CG and SP only); s2 runs 3
    /// message sizes instead of 6; s3 simulates 8 worker counts instead of 16;
    /// s4 runs CG and IS at class S; s5 gives each VM 6 runs of EP.S instead of 10;
    /// migrate runs SP.S instead of SP.A, and no migration and one stop-and-copy one
    /// only.
    #[arg(long)]
    pub quick: bool,

    /// Runs of each scenario (interleaved: every scenario once per round).
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub runs: u32,

    /// Print the whole report as one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Write the JSON report, the simulation file and the SVG figure here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// s1 only: which domain 0 its scenarios run with: kumo's own (the switch), one
    /// loaded to S1's regime (a modelled backend cost per TCP segment), or both families
    /// (the default; kumo's first).
    #[arg(long, value_enum, value_name = "WHICH")]
    pub dom0: Option<s1::Dom0Families>,

    /// s1 only: run these benchmarks (e.g. `cg.A,ep.A`) in every family instead of
    /// the family's own list.
    #[arg(long, value_delimiter = ',', value_name = "SPECS")]
    pub bench: Vec<String>,

    /// s1 and migrate: how a rank waits for a message: yield (poll, handing the vCPU
    /// to the other rank: the default), spin (poll until the guest's tick switches
    /// ranks) or block (halt until the NIC interrupts).
    #[arg(long, value_enum, value_name = "HOW")]
    pub wait: Option<kumo_vmm::spec::job::Wait>,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_shows_the_range_of_several_runs() {
        assert_eq!(
            summary_cell(Summary::of(&[3.0, 1.0, 2.0])),
            "2.000 [1.000-3.000]"
        );
        assert_eq!(summary_cell(Summary::of(&[2.5])), "2.500");
        assert_eq!(summary_cell(None), "no result");
    }

    #[test]
    fn runs_are_interleaved_round_by_round() {
        assert_eq!(
            interleaved(2, 2),
            [(0, 0), (0, 1), (1, 0), (1, 1)],
            "every item once before any item twice"
        );
    }

    #[test]
    fn an_unwritable_out_directory_is_refused_before_running() {
        let file = std::env::temp_dir().join(format!("kumo-out-file-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let err = prepare_out(&file.join("sub")).unwrap_err();
        assert!(format!("{err:#}").contains("cannot create"), "{err:#}");
        let _ = std::fs::remove_file(&file);
    }
}
